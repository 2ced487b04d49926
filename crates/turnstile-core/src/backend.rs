//! The backend seam: where decisions are made and state is kept.
//!
//! [`Backend`] checks a key (one required method); [`Quotas`] adds the operators' live-quota
//! operations with the same signatures on every backend. Both are implemented by the
//! in-memory backend, by `turnstile-redis`, and forwarded by the wrappers in
//! `wrap`.

use std::error::Error as StdError;
use std::fmt;
use std::future::{Future, Ready};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;

use crate::decision::Decision;
use crate::policy::Policy;
use crate::quota::{KeyConfig, Limits};

/// A boxed error source, as carried by [`BackendError`].
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// What a check or quota operation resolves to.
pub type CheckResult = Result<Decision, BackendError>;

/// The longest client key a backend takes by default, in bytes: 512. Keys are what a client
/// sends (an API key, a header, a route joined with an address); a longer one is refused with
/// [`BackendError::KeyTooLong`] before anything is stored or hashed, so that each tracked key
/// costs bounded memory (in memory: keys × (key bytes + the entry's own), see
/// [`MemoryBackend`](crate::MemoryBackend)). Every IP key (at most 43 bytes), a route
/// pattern and most API keys fit. Each backend's builder changes it (`max_key_bytes`).
pub const DEFAULT_MAX_KEY_BYTES: usize = 512;

/// `Ok` when `key` fits in `max` bytes, else [`BackendError::KeyTooLong`]: the one test every
/// backend makes of a key before using it.
///
/// # Errors
/// [`BackendError::KeyTooLong`] when `key` is longer than `max` bytes.
#[inline]
pub fn check_key_len(key: &str, max: usize) -> Result<(), BackendError> {
    if key.len() <= max {
        Ok(())
    } else {
        Err(key_too_long(key.len(), max))
    }
}

#[cold]
#[inline(never)]
fn key_too_long(len: usize, max: usize) -> BackendError {
    BackendError::KeyTooLong { len, max }
}

/// Where rate-limit state lives: checks one client key against one or more policies with a
/// cost, all-or-nothing and atomically.
///
/// One method is required, [`Backend::check_limits`]; the others are provided on top of it.
/// The trait is generic (an associated future type) rather than object-safe: the in-memory
/// backend answers with [`std::future::Ready`], so a check costs no allocation and no boxing,
/// while a network backend names its own future. Code that needs a trait object can box the
/// future in a wrapper.
///
/// Implementations must follow `SEMANTICS.md` field for field: the same requests at the
/// same times give the same decisions on every backend.
pub trait Backend: Clone + Send + Sync + 'static {
    /// The future a check returns. `'static`: it owns whatever it needs.
    type Future: Future<Output = CheckResult> + Send + 'static;

    /// Checks `key` with `cost` units against the policies `limits` resolves for it — each
    /// default policy with the parameters of its override's policy of the same name, else
    /// its tier's, else its own (see [`quota`](crate::quota)); for a key with neither, the
    /// [`Unconfigured`](crate::Unconfigured) behaviour — at `now_ms` (ms since the epoch the
    /// caller chose: simulations and tests), or at the backend's own time when `None` (the
    /// in-memory backend's clock; Redis's `TIME`). The decision's [`Decision::sources`] say
    /// where each policy's parameters came from ([`Decision::applied`] sums them up).
    ///
    /// The request is admitted only if every policy admits it; a denied request consumes
    /// from none. A cost of 0 is a query: always admitted, changing nothing.
    ///
    /// # Errors
    /// [`BackendError`] when no decision could be made: `key` is longer than
    /// [`Backend::max_key_bytes`], the backend is at its key cap, unreachable, timed out, its stored state or configuration for the key is unreadable,
    /// or the request cannot be represented exactly (a time beyond 2^53 − 1 ms). An error
    /// never changes state.
    fn check_limits(
        &self,
        key: &str,
        limits: &Limits,
        cost: u64,
        now_ms: Option<u64>,
    ) -> Self::Future;

    /// Checks `key` against every policy in `policies` with `cost` units, at the backend's
    /// own current time: [`Backend::check_limits`] with [`Limits`] of these policies and no
    /// tiers (a key's stored override applies here too).
    ///
    /// # Errors
    /// As [`Backend::check_limits`]; [`BackendError::InvalidRequest`] when `policies` is
    /// empty or two of them share a name (they would share one state).
    fn check(&self, key: &str, policies: &[Policy], cost: u64) -> Checked<Self::Future> {
        check_policies(self, key, policies, cost, None)
    }

    /// As [`Backend::check`], but at the explicit time `now_ms` (ms since the epoch the
    /// caller chose) instead of the backend's clock: for simulations and tests.
    ///
    /// # Errors
    /// As [`Backend::check`].
    fn check_at(
        &self,
        key: &str,
        policies: &[Policy],
        cost: u64,
        now_ms: u64,
    ) -> Checked<Self::Future> {
        check_policies(self, key, policies, cost, Some(now_ms))
    }

    /// The result of `fut`, a future this backend's [`Backend::check_limits`] just returned,
    /// when it is known without polling (`Ok`: a backend that decides inside the call, as the
    /// in-memory one does), else `fut` back, unpolled (`Err`). `Ok(r)` is exactly what polling
    /// `fut` would have given, with the same side effects: callers that can use an answer at
    /// once (and go on with the request straight away) skip a future. The default knows
    /// nothing (`Err(fut)`).
    ///
    /// # Errors
    /// `Err(fut)` is not a failure: the check has not finished and `fut` must be polled.
    fn ready_now(fut: Self::Future) -> Result<CheckResult, Self::Future> {
        Err(fut)
    }

    /// Whether the state lives in this process (the in-memory backend: `true`). A local
    /// fallback (`wrap::Fallback`) never stands in for a local
    /// backend: it would be one more memory store for the same failure.
    fn is_local(&self) -> bool {
        false
    }

    /// The longest key this backend takes, in bytes (default [`DEFAULT_MAX_KEY_BYTES`]): a
    /// longer one gets [`BackendError::KeyTooLong`] from every check and quota operation,
    /// before anything is stored or sent. Front ends refuse such keys themselves (the tower
    /// layer answers `400` / `INVALID_ARGUMENT`); wrappers report their inner backend's.
    fn max_key_bytes(&self) -> usize {
        DEFAULT_MAX_KEY_BYTES
    }
}

fn check_policies<B: Backend>(
    backend: &B,
    key: &str,
    policies: &[Policy],
    cost: u64,
    now_ms: Option<u64>,
) -> Checked<B::Future> {
    match Limits::new(policies.iter().cloned()) {
        Ok(limits) => Checked::pending(backend.check_limits(key, &limits, cost, now_ms)),
        Err(e) => Checked::ready(Err(BackendError::InvalidRequest(e.to_string()))),
    }
}

pin_project! {
    /// The future of [`Backend::check`] and [`Backend::check_at`]: the backend's own future,
    /// or an error found before asking the backend (an invalid policy list).
    #[must_use = "futures do nothing unless polled"]
    #[derive(Debug)]
    pub struct Checked<F> {
        #[pin]
        inner: CheckedInner<F>,
    }
}

pin_project! {
    #[project = CheckedProj]
    #[project_replace = CheckedReplace]
    #[derive(Debug)]
    enum CheckedInner<F> {
        Pending { #[pin] fut: F },
        Ready { result: CheckResult },
        // Polled to completion.
        Taken,
    }
}

impl<F> Checked<F> {
    /// A check answered by the backend's future `fut`.
    pub fn pending(fut: F) -> Self {
        Checked {
            inner: CheckedInner::Pending { fut },
        }
    }

    /// A check answered at once with `result`.
    #[inline(always)]
    pub fn ready(result: CheckResult) -> Self {
        Checked {
            inner: CheckedInner::Ready { result },
        }
    }
}

impl Checked<Ready<CheckResult>> {
    /// The result of a check whose backend answers at once (the in-memory backend), without
    /// polling: `backend.check(..).into_inner()`.
    #[inline(always)]
    pub fn into_inner(self) -> CheckResult {
        // One comparison for the answer a check gives; the other states out of line.
        match self.inner {
            CheckedInner::Ready { result } => result,
            inner => Self::not_ready(inner),
        }
    }

    /// [`Checked::into_inner`] of a check whose result is not held as ready.
    #[cold]
    #[inline(never)]
    fn not_ready(inner: CheckedInner<Ready<CheckResult>>) -> CheckResult {
        match inner {
            CheckedInner::Ready { result } => result,
            CheckedInner::Pending { fut } => fut.into_inner(),
            CheckedInner::Taken => Err(BackendError::InvalidRequest(
                "the check was already taken".into(),
            )),
        }
    }
}

impl<F: Future<Output = CheckResult>> Checked<F> {
    /// Polls the check once, without a runtime: its result if the backend answered at once
    /// (the in-memory backend and the wrappers around it always do), else `None` (the check
    /// is dropped, which changes no state if it never reached the backend).
    pub fn now_or_never(self) -> Option<CheckResult> {
        let mut fut = std::pin::pin!(self);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match fut.as_mut().poll(&mut cx) {
            Poll::Ready(r) => Some(r),
            Poll::Pending => None,
        }
    }
}

impl<F: Future<Output = CheckResult>> Future for Checked<F> {
    type Output = CheckResult;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<CheckResult> {
        let mut inner = self.project().inner;
        match inner.as_mut().project() {
            CheckedProj::Pending { fut } => {
                let result = std::task::ready!(fut.poll(cx));
                // `into_inner` after this finds the check taken, rather than polling again.
                inner.project_replace(CheckedInner::Taken);
                Poll::Ready(result)
            }
            CheckedProj::Ready { .. } => match inner.project_replace(CheckedInner::Taken) {
                CheckedReplace::Ready { result } => Poll::Ready(result),
                _ => Poll::Pending,
            },
            // Polled after completion: stay pending rather than panic.
            CheckedProj::Taken => Poll::Pending,
        }
    }
}

/// The operators' live-quota operations: inspect, reset, refund and configure one key. Every
/// backend has the same signatures and return types, so tools (`turnstile quota`) and
/// services work against either.
///
/// Operations that give quota back or change a key's policies bump the key's version
/// ([`KeyConfig::version`], [`Decision::version`]). Times are ms since the epoch the caller
/// chose, or the backend's own time when `None`, as in [`Backend::check_limits`].
pub trait Quotas: Backend {
    /// Every policy's `remaining` and `reset_after` for `key` without consuming anything (a
    /// check of cost 0): never changes state.
    ///
    /// # Errors
    /// As [`Backend::check_limits`].
    fn peek(
        &self,
        key: &str,
        limits: &Limits,
        now_ms: Option<u64>,
    ) -> impl Future<Output = CheckResult> + Send {
        self.check_limits(key, limits, 0, now_ms)
    }

    /// Forgets the state of every policy that applies to `key` (it is fresh again), keeping
    /// its configuration, bumps its version, and returns its state afterwards as
    /// [`Quotas::peek`] would.
    ///
    /// # Errors
    /// As [`Backend::check_limits`].
    fn reset(
        &self,
        key: &str,
        limits: &Limits,
        now_ms: Option<u64>,
    ) -> impl Future<Output = CheckResult> + Send;

    /// Gives `cost` units back to `key` under every policy that applies to it, as
    /// [`algorithm::refund`](crate::algorithm::refund) defines per algorithm (never beyond a
    /// fresh key's capacity), bumps its version, and returns its state afterwards as
    /// [`Quotas::peek`] would.
    ///
    /// # Errors
    /// As [`Backend::check_limits`].
    fn refund(
        &self,
        key: &str,
        limits: &Limits,
        cost: u64,
        now_ms: Option<u64>,
    ) -> impl Future<Output = CheckResult> + Send;

    /// The stored configuration of `key`: its override, its tier, its version (empty, version
    /// 0, for a key never configured).
    ///
    /// # Errors
    /// [`BackendError::InvalidState`] when the stored configuration cannot be read; otherwise
    /// as [`Backend::check_limits`].
    fn config(&self, key: &str) -> impl Future<Output = Result<KeyConfig, BackendError>> + Send;

    /// Stores `policies` as `key`'s override: from the next check on they replace the
    /// defaults and the key's tier. State of a policy of the same name carries over (see
    /// [`algorithm::carry_over`](crate::algorithm::carry_over)). Returns the new
    /// configuration.
    ///
    /// # Errors
    /// [`BackendError::InvalidRequest`] for an empty set or two policies of one name;
    /// otherwise as [`Quotas::config`].
    fn set_override(
        &self,
        key: &str,
        policies: &[Policy],
    ) -> impl Future<Output = Result<KeyConfig, BackendError>> + Send;

    /// Removes `key`'s override (its tier, if any, applies again). Returns the new
    /// configuration.
    ///
    /// # Errors
    /// As [`Quotas::config`].
    fn remove_override(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<KeyConfig, BackendError>> + Send;

    /// Maps `key` to the tier `tier` (`None`: no tier). Returns the new configuration.
    ///
    /// # Errors
    /// [`BackendError::InvalidRequest`] for an invalid tier name; otherwise as
    /// [`Quotas::config`].
    fn set_tier(
        &self,
        key: &str,
        tier: Option<&str>,
    ) -> impl Future<Output = Result<KeyConfig, BackendError>> + Send;

    /// Removes `key`'s whole configuration, its override and its tier, in one change (one
    /// version). Returns the new configuration.
    ///
    /// # Errors
    /// As [`Quotas::config`].
    fn clear_config(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<KeyConfig, BackendError>> + Send;
}

/// Why a backend could not make a decision. Never a panic; an error changes no state.
///
/// [`FailurePolicy`](crate::FailurePolicy) says what a request gets for each kind.
#[derive(Debug)]
#[non_exhaustive]
pub enum BackendError {
    /// The in-memory backend tracks its configured maximum of keys and this check would add
    /// another. Existing keys keep working; state is never evicted early (that would
    /// over-admit).
    CapacityExceeded {
        /// The configured maximum of tracked keys.
        max_keys: usize,
    },
    /// The backend did not answer within the configured timeout.
    Timeout {
        /// The timeout that elapsed.
        after: Duration,
    },
    /// The backend could not be reached, the connection failed mid-call, or the backend is
    /// known to be down and was not asked (the message names the node).
    Connection(BoxError),
    /// The backend ran the check but reported an error (e.g. a Redis script error).
    Script(String),
    /// The stored state or configuration for the key could not be read (corrupt or written
    /// by something else).
    InvalidState(String),
    /// The request itself was invalid: no policies, two policies of one name, or a cost or
    /// time beyond 2^53 − 1 where the backend cannot represent it exactly.
    InvalidRequest(String),
    /// The client key is longer than the backend takes ([`Backend::max_key_bytes`]): nothing
    /// was stored, hashed or sent.
    KeyTooLong {
        /// The key's length in bytes.
        len: usize,
        /// The backend's cap in bytes.
        max: usize,
    },
}

impl BackendError {
    /// A short, stable name of the error's kind, for logs and metric labels: one of
    /// `capacity_exceeded`, `timeout`, `connection`, `script`, `invalid_state`,
    /// `invalid_request`, `key_too_long`.
    pub fn kind(&self) -> &'static str {
        match self {
            BackendError::CapacityExceeded { .. } => "capacity_exceeded",
            BackendError::Timeout { .. } => "timeout",
            BackendError::Connection(_) => "connection",
            BackendError::Script(_) => "script",
            BackendError::InvalidState(_) => "invalid_state",
            BackendError::InvalidRequest(_) => "invalid_request",
            BackendError::KeyTooLong { .. } => "key_too_long",
        }
    }

    /// Whether the backend could not serve the request at all (unreachable, timed out, or it
    /// failed running the check): the errors a local fallback stands in for, and the only
    /// ones that can count as evidence that a node is down.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            BackendError::Timeout { .. } | BackendError::Connection(_) | BackendError::Script(_)
        )
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendError::CapacityExceeded { max_keys } => write!(
                f,
                "in-memory backend is tracking its maximum of {max_keys} keys; a new key cannot be added until idle keys expire"
            ),
            BackendError::Timeout { after } => {
                write!(f, "backend did not answer within {} ms", after.as_millis())
            }
            BackendError::Connection(e) => write!(f, "backend connection failed: {e}"),
            BackendError::Script(m) => write!(f, "backend script failed: {m}"),
            BackendError::InvalidState(m) => write!(f, "stored rate-limit state is invalid: {m}"),
            BackendError::InvalidRequest(m) => write!(f, "invalid rate-limit check: {m}"),
            BackendError::KeyTooLong { len, max } => write!(
                f,
                "the rate-limit key is {len} bytes, longer than the backend's cap of {max} bytes (max_key_bytes)"
            ),
        }
    }
}

impl StdError for BackendError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            BackendError::Connection(e) => Some(e.as_ref()),
            _ => None,
        }
    }
}
