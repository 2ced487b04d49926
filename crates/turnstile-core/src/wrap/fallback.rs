//! [`Fallback`]: decide locally when the backend cannot.

use std::fmt;
use std::future::{Future, Ready};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;

use super::learned::Learned;
use super::Wrapper;
use crate::backend::{Backend, BackendError, CheckResult};
use crate::clock::{Clock, SystemClock};
use crate::decision::Origin;
use crate::failure::{FailurePolicy, OnError};
use crate::memory::MemoryBackend;
#[cfg(feature = "metrics")]
use crate::metric_names as names;
use crate::quota::Limits;
use crate::wrap::incident::{key_hash, IncidentLog, Ticket};

/// A share of a policy's capacity, from 0 to 1, in millionths: what a key the backend never
/// answered for starts an outage with under a [`Fallback`] (rounded down to whole units).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Share(u32);

impl Share {
    /// The whole capacity (the default).
    pub const ALL: Share = Share(1_000_000);

    /// `share` of the capacity, 0 to 1.
    ///
    /// # Errors
    /// [`InvalidShare`] for a value outside 0 to 1, or not a number.
    pub fn new(share: f64) -> Result<Self, InvalidShare> {
        if (0.0..=1.0).contains(&share) {
            Ok(Share((share * 1_000_000.0).floor() as u32))
        } else {
            Err(InvalidShare(share.to_string()))
        }
    }

    /// The share in millionths.
    pub fn ppm(self) -> u64 {
        u64::from(self.0)
    }
}

impl Default for Share {
    fn default() -> Self {
        Share::ALL
    }
}

/// A share outside 0 to 1 (see [`Share::new`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidShare(pub String);

impl fmt::Display for InvalidShare {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a share of the capacity is 0 to 1, not {}", self.0)
    }
}

impl std::error::Error for InvalidShare {}

/// The default cap on keys a [`Fallback`] tracks in memory: 1,000,000. The same cap bounds
/// the backend answers it remembers.
pub const DEFAULT_FALLBACK_MAX_KEYS: usize = 1_000_000;

/// A [`Backend`] that follows a [`FailurePolicy`]: under [`FailurePolicy::Local`], a check
/// the wrapped backend cannot decide (see [`FailurePolicy::on_error`]) is decided by a local
/// [`MemoryBackend`] with the same policies; every other error, and every error under `Open`
/// or `Closed`, is returned for the caller to handle.
///
/// The fallback starts each key from what this process last learned from the backend: the
/// `remaining` r of each policy at the time of the backend's last answer for the key,
/// refilling from there at the policy's own rate (of answers to checks in flight together,
/// which this process may be told in another order than the backend decided them, each
/// policy's smallest `remaining`); a key the backend never answered for starts
/// with a share s of each policy's capacity ([`Fallback::with_local_share`], default 1:
/// the whole capacity). Per key and process, an outage so admits at most r + what the policy
/// refills over the outage (a known key) or s·capacity + the refill (an unknown key); a fleet
/// of N processes at most N times that. A key's outage lasts from its first check the
/// fallback decides to the wrapped backend's next answer for that key; answers for other
/// keys (another Cluster master's) do not start it over. The learned answers are bounded by
/// the local key cap. A wrapped backend that is itself local ([`Backend::is_local`]) is
/// never stood in for. Decisions made locally are marked [`Origin::Fallback`].
///
/// One incident logs one pair of lines (`tracing`): a warning when the first check sent
/// while the backend was healthy fails, and a recovery when the backend itself answers a
/// check sent during the incident — not a deny cache's answer, not a reply that was in
/// flight when the incident began ([`IncidentLog`]). One key's unreadable state
/// (`BackendError::InvalidState`) is decided locally too, but it is the key's fault, not the
/// backend's: it neither starts nor ends an incident, and is logged at most once per key per
/// minute, the key shown as its stable hash ([`key_hash`]). Quota operations
/// ([`Quotas`](crate::Quotas), through [`Wrapper`]) are forwarded, never decided locally.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use turnstile_core::{wrap::Fallback, Backend, FailurePolicy, MemoryBackend, Policy};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let backend = Fallback::new(MemoryBackend::new(), FailurePolicy::Local);
/// let per_second = [Policy::gcra(5, Duration::from_secs(1))?];
/// assert!(backend.check("alice", &per_second, 1).now_or_never().ok_or("pending")??.allowed());
/// assert_eq!(backend.local_decisions(), 0);
/// # Ok(()) }
/// ```
pub struct Fallback<B, C = SystemClock> {
    inner: B,
    shared: Arc<Shared<C>>,
}

struct Shared<C> {
    local: MemoryBackend<C>,
    policy: FailurePolicy,
    /// When an incident starts and ends; which bad keys to log.
    log: IncidentLog,
    decisions: AtomicU64,
    learned: Learned,
}

impl<B: Clone, C> Clone for Fallback<B, C> {
    fn clone(&self) -> Self {
        Fallback {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<B: fmt::Debug, C> fmt::Debug for Fallback<B, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fallback")
            .field("inner", &self.inner)
            .field("policy", &self.shared.policy)
            .field("local_keys", &self.shared.local.len())
            .finish()
    }
}

impl<B: Backend> Fallback<B> {
    /// Wraps `inner`, following `policy`; the local backend runs on the system clock, tracks
    /// at most [`DEFAULT_FALLBACK_MAX_KEYS`] keys (beyond that, as `Open`), takes keys as
    /// long as `inner` does ([`Backend::max_key_bytes`]) and, with the `tokio` feature, sweeps
    /// its expired keys every second on its own
    /// (`MemoryBackendBuilder::sweep_every`).
    pub fn new(inner: B, policy: FailurePolicy) -> Self {
        let local = local_backend(&inner, DEFAULT_FALLBACK_MAX_KEYS);
        Fallback::with_local(inner, policy, local)
    }
}

/// The in-memory backend a local fallback for `inner` uses: on the system clock, at most
/// `max_keys` keys, keys as long as `inner` takes, and (feature `tokio`) a sweeper of its own
/// every second, started by its first key.
fn local_backend<B: Backend>(inner: &B, max_keys: usize) -> MemoryBackend {
    let builder = MemoryBackend::builder()
        .max_keys(max_keys)
        .max_key_bytes(inner.max_key_bytes());
    #[cfg(feature = "tokio")]
    let builder = builder.sweep_every(std::time::Duration::from_secs(1));
    builder.build()
}

impl<B, C> Fallback<B, C> {
    /// Wraps `inner`, following `policy`, with `local` as the local backend (its clock, key
    /// cap and shards).
    pub fn with_local(inner: B, policy: FailurePolicy, local: MemoryBackend<C>) -> Self {
        Self::with_local_share(inner, policy, local, Share::ALL)
    }

    /// As [`Fallback::with_local`], where a key the backend never answered for starts an
    /// outage with `unknown` of each policy's capacity (see [`Share`]) instead of all of it.
    pub fn with_local_share(
        inner: B,
        policy: FailurePolicy,
        local: MemoryBackend<C>,
        unknown: Share,
    ) -> Self {
        let max_keys = local.max_keys().unwrap_or(DEFAULT_FALLBACK_MAX_KEYS);
        // Its checks are at its clock's readings: a timed sweep may drop them by the clock.
        local.sweep_explicit_times_by_clock();
        Fallback {
            inner,
            shared: Arc::new(Shared {
                local,
                policy,
                log: IncidentLog::new(),
                decisions: AtomicU64::new(0),
                learned: Learned::new(max_keys, unknown.ppm()),
            }),
        }
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &B {
        &self.inner
    }

    /// The local backend.
    pub fn local(&self) -> &MemoryBackend<C> {
        &self.shared.local
    }

    /// The failure policy followed.
    pub fn policy(&self) -> FailurePolicy {
        self.shared.policy
    }

    /// How many keys' last backend answers the fallback remembers (bounded by the local key
    /// cap).
    pub fn learned_keys(&self) -> usize {
        self.shared.learned.len()
    }

    /// Whether an incident is open: the backend failed and has not answered since.
    pub fn in_incident(&self) -> bool {
        self.shared.log.is_open()
    }

    /// Checks decided locally since the wrapper was built (all clones together).
    pub fn local_decisions(&self) -> u64 {
        self.shared.decisions.load(Ordering::Relaxed)
    }
}

impl<B: Backend, C: Clock> Backend for Fallback<B, C> {
    type Future = FallbackFuture<B::Future, C>;

    fn check_limits(
        &self,
        key: &str,
        limits: &Limits,
        cost: u64,
        now_ms: Option<u64>,
    ) -> Self::Future {
        let fut = self.inner.check_limits(key, limits, cost, now_ms);
        if self.shared.policy != FailurePolicy::Local || self.inner.is_local() {
            return FallbackFuture {
                state: State::Pass { fut },
            };
        }
        FallbackFuture {
            state: State::Watch {
                fut,
                retry: Some(Retry {
                    ticket: self.shared.log.ticket(),
                    learned: self.shared.learned.sent(),
                    shared: Arc::clone(&self.shared),
                    key: Box::from(key),
                    limits: limits.clone(),
                    cost,
                    now_ms,
                }),
            },
        }
    }

    #[inline]
    fn ready_now(fut: Self::Future) -> Result<CheckResult, Self::Future> {
        match fut.state {
            State::Pass { fut } => B::ready_now(fut).map_err(|fut| FallbackFuture {
                state: State::Pass { fut },
            }),
            State::Watch { fut, retry } => match B::ready_now(fut) {
                Ok(result) => Ok(match retry {
                    Some(r) => r.settle(result),
                    None => result,
                }),
                Err(fut) => Err(FallbackFuture {
                    state: State::Watch { fut, retry },
                }),
            },
        }
    }

    fn is_local(&self) -> bool {
        self.inner.is_local()
    }

    fn max_key_bytes(&self) -> usize {
        self.inner.max_key_bytes()
    }
}

/// What the local fallback needs to decide a check itself.
struct Retry<C> {
    /// When the check was sent, as far as incidents go.
    ticket: Ticket,
    /// When the check was sent, as far as learned answers go.
    learned: u64,
    shared: Arc<Shared<C>>,
    key: Box<str>,
    limits: Limits,
    cost: u64,
    now_ms: Option<u64>,
}

impl<C: Clock> Retry<C> {
    /// The answer for a check whose backend call ended with `result`.
    fn settle(self, result: CheckResult) -> CheckResult {
        let s = &*self.shared;
        let now = self.now_ms.unwrap_or_else(|| s.local.clock().now_ms());
        let error = match result {
            Ok(decision) => {
                if decision.origin() == Origin::Backend {
                    s.learned.record(&self.key, self.learned, now, &decision);
                }
                if decision.origin() == Origin::Backend && s.log.answered(self.ticket) {
                    tracing::info!("rate-limit backend answers again; the local fallback stops");
                }
                return Ok(decision);
            }
            Err(e) => e,
        };
        if s.policy.on_error(&error) != OnError::DecideLocally {
            return Err(error);
        }
        if matches!(error, BackendError::InvalidState(_)) {
            // One key's fault: logged per key, no incident.
            if s.log.bad_key(&self.key, s.local.clock().now_ms()) {
                tracing::warn!(
                    error = %error,
                    key_hash = %format_args!("{:016x}", key_hash(&self.key)),
                    "rate-limit backend cannot read this key's state; deciding it in memory on this process"
                );
            }
        } else if s.log.failed(self.ticket) {
            #[cfg(feature = "metrics")]
            metrics::counter!(names::FALLBACK_ACTIVATIONS_TOTAL, names::LABEL_KIND => error.kind())
                .increment(1);
            tracing::warn!(
                error = %error,
                kind = error.kind(),
                "rate-limit backend failed; deciding in memory on this process until it answers again"
            );
        }
        s.decisions.fetch_add(1, Ordering::Relaxed);
        s.learned.prime(&s.local, &self.key, &self.limits, now);
        #[cfg(feature = "metrics")]
        metrics::counter!(names::FALLBACK_DECISIONS_TOTAL).increment(1);
        let ready: Ready<CheckResult> =
            s.local
                .check_limits(&self.key, &self.limits, self.cost, Some(now));
        ready.into_inner().map(|d| d.with_origin(Origin::Fallback))
    }
}

pin_project! {
    /// The future of a [`Fallback`]'s check.
    #[must_use = "futures do nothing unless polled"]
    pub struct FallbackFuture<F, C> {
        #[pin]
        state: State<F, C>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, C> {
        // No local fallback: the backend's answer as it is.
        Pass { #[pin] fut: F },
        // The backend's answer, decided locally if it fails.
        Watch { #[pin] fut: F, retry: Option<Retry<C>> },
    }
}

impl<F, C> fmt::Debug for FallbackFuture<F, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FallbackFuture").finish_non_exhaustive()
    }
}

impl<F: Future<Output = CheckResult>, C: Clock> Future for FallbackFuture<F, C> {
    type Output = CheckResult;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<CheckResult> {
        match self.project().state.project() {
            StateProj::Pass { fut } => fut.poll(cx),
            StateProj::Watch { fut, retry } => {
                let result = ready!(fut.poll(cx));
                match retry.take() {
                    Some(r) => Poll::Ready(r.settle(result)),
                    None => Poll::Ready(result),
                }
            }
        }
    }
}

impl<B, C> Wrapper for Fallback<B, C> {
    type Inner = B;

    fn inner(&self) -> &B {
        &self.inner
    }
}
