//! [`Wrapper`]: a backend around another, to which the [`Quotas`] operations are forwarded.

use std::future::Future;

use crate::backend::{Backend, BackendError, CheckResult, Quotas};
use crate::policy::Policy;
use crate::quota::{KeyConfig, Limits};

/// A [`Backend`] that wraps another ([`DenyCache`](super::DenyCache),
/// [`Fallback`](super::Fallback)): it checks its own way, and forwards the operators'
/// [`Quotas`] operations to the backend it wraps. Implementing this trait is all a wrapper
/// writes for them: every `Wrapper` whose wrapped backend has [`Quotas`] has them too,
/// forwarded, with [`Wrapper::giving_back`] around the operations that may give quota back.
///
/// # Examples
/// ```
/// use turnstile_core::wrap::{Fallback, Wrapper};
/// use turnstile_core::{FailurePolicy, MemoryBackend, Quotas};
///
/// fn operate<Q: Quotas>(_: &Q) {}
///
/// let backend = Fallback::new(MemoryBackend::new(), FailurePolicy::Local);
/// operate(&backend); // the in-memory backend's quota operations, forwarded
/// assert!(Wrapper::inner(&backend).is_empty());
/// ```
pub trait Wrapper {
    /// The wrapped backend's type.
    type Inner;

    /// The wrapped backend.
    fn inner(&self) -> &Self::Inner;

    /// Runs `op`, the wrapped backend's operation on `key` that may give quota back or change
    /// the key's policies (a reset, a refund, an override or tier set or removed): what the
    /// wrapper keeps of the key may no longer hold. By default `op` as it is.
    fn giving_back<T: Send>(
        &self,
        key: &str,
        op: impl Future<Output = T> + Send,
    ) -> impl Future<Output = T> + Send {
        let _ = key;
        op
    }
}

impl<W> Quotas for W
where
    W: Wrapper + Backend,
    W::Inner: Quotas,
{
    fn peek(
        &self,
        key: &str,
        limits: &Limits,
        now_ms: Option<u64>,
    ) -> impl Future<Output = CheckResult> + Send {
        self.inner().peek(key, limits, now_ms)
    }

    fn reset(
        &self,
        key: &str,
        limits: &Limits,
        now_ms: Option<u64>,
    ) -> impl Future<Output = CheckResult> + Send {
        self.giving_back(key, self.inner().reset(key, limits, now_ms))
    }

    fn refund(
        &self,
        key: &str,
        limits: &Limits,
        cost: u64,
        now_ms: Option<u64>,
    ) -> impl Future<Output = CheckResult> + Send {
        self.giving_back(key, self.inner().refund(key, limits, cost, now_ms))
    }

    fn config(&self, key: &str) -> impl Future<Output = Result<KeyConfig, BackendError>> + Send {
        self.inner().config(key)
    }

    fn set_override(
        &self,
        key: &str,
        policies: &[Policy],
    ) -> impl Future<Output = Result<KeyConfig, BackendError>> + Send {
        self.giving_back(key, self.inner().set_override(key, policies))
    }

    fn remove_override(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<KeyConfig, BackendError>> + Send {
        self.giving_back(key, self.inner().remove_override(key))
    }

    fn set_tier(
        &self,
        key: &str,
        tier: Option<&str>,
    ) -> impl Future<Output = Result<KeyConfig, BackendError>> + Send {
        self.giving_back(key, self.inner().set_tier(key, tier))
    }

    fn clear_config(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<KeyConfig, BackendError>> + Send {
        self.giving_back(key, self.inner().clear_config(key))
    }
}
