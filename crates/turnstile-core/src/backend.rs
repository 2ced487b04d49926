//! The backend seam: where decisions are made and state is kept.

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::time::Duration;

use crate::decision::Decision;
use crate::policy::Policy;
use crate::quota::Limits;

/// A boxed error source, as carried by [`BackendError`].
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// Where rate-limit state lives: checks one client key against one or more policies with a
/// cost, all-or-nothing and atomically.
///
/// The trait is generic (an associated future type) rather than object-safe: the in-memory
/// backend answers with [`std::future::Ready`], so a check costs no allocation and no boxing,
/// while a network backend names its own future. Code that needs a trait object can box the
/// future in a wrapper.
///
/// Implementations must follow `SEMANTICS.md` field for field: the same requests at the
/// same times give the same decisions on every backend.
pub trait Backend: Clone + Send + Sync + 'static {
    /// The future a check returns. `'static`: it owns whatever it needs.
    type Future: Future<Output = Result<Decision, BackendError>> + Send + 'static;

    /// Checks `key` against every policy in `policies` with `cost` units, at the backend's
    /// own current time (the in-memory backend's clock; Redis's `TIME`).
    ///
    /// The request is admitted only if every policy admits it; a denied request consumes
    /// from none. A cost of 0 is a query: always admitted, changing nothing.
    ///
    /// # Errors
    /// [`BackendError`] when no decision could be made: the policy list is empty
    /// ([`BackendError::InvalidRequest`]), the backend is at its key cap, unreachable, timed
    /// out, or its stored state is unreadable. An error never changes state.
    fn check(&self, key: &str, policies: &[Policy], cost: u64) -> Self::Future;

    /// As [`Backend::check`], but at the explicit time `now_ms` (ms since the epoch the
    /// caller chose) instead of the backend's clock: for simulations and tests.
    ///
    /// # Errors
    /// As [`Backend::check`].
    fn check_at(&self, key: &str, policies: &[Policy], cost: u64, now_ms: u64) -> Self::Future;

    /// Checks `key` with `cost` units against the policies `limits` resolves for it — its
    /// override stored in the backend, else its tier's policies, else the [`Unconfigured`](crate::Unconfigured)
    /// behaviour — at `now_ms`, or at the backend's own time when `None`. The decision's
    /// [`Decision::applied`] says which configuration decided.
    ///
    /// [`Backend::check`] is this with [`Limits`] of the given policies and no tiers: a key's
    /// override applies there too.
    ///
    /// # Errors
    /// As [`Backend::check`]; also [`BackendError::InvalidState`] when the key's stored
    /// configuration cannot be read.
    fn check_limits(
        &self,
        key: &str,
        limits: &Limits,
        cost: u64,
        now_ms: Option<u64>,
    ) -> Self::Future;
}

/// Why a backend could not make a decision. Never a panic; an error changes no state.
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
    /// The backend could not be reached, or the connection failed mid-call.
    Connection(BoxError),
    /// The backend ran the check but reported an error (e.g. a Redis script error).
    Script(String),
    /// The stored state or configuration for the key could not be read (corrupt or written
    /// by something else).
    InvalidState(String),
    /// The request itself was invalid: no policies, or a cost or time beyond 2^53 − 1 where
    /// the backend cannot represent it exactly.
    InvalidRequest(String),
}

impl BackendError {
    /// A short, stable name of the error's kind, for logs and metric labels: one of
    /// `capacity_exceeded`, `timeout`, `connection`, `script`, `invalid_state`,
    /// `invalid_request`.
    pub fn kind(&self) -> &'static str {
        match self {
            BackendError::CapacityExceeded { .. } => "capacity_exceeded",
            BackendError::Timeout { .. } => "timeout",
            BackendError::Connection(_) => "connection",
            BackendError::Script(_) => "script",
            BackendError::InvalidState(_) => "invalid_state",
            BackendError::InvalidRequest(_) => "invalid_request",
        }
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
