//! [`Action`]: what the layer does with a denied request, and the build-time check that a
//! leaky bucket's delay fits [`Action::Delay`]'s maximum wait.

use std::time::Duration;

use turnstile_core::{Algorithm, Policy};

use crate::error::InvalidLayer;
use crate::rule::CompiledRule;

/// What the layer does with a request its policies deny.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Action {
    /// Answer the denial at once (the default): `429` with `Retry-After`, or gRPC
    /// `RESOURCE_EXHAUSTED`. A leaky bucket's admitted requests still wait their `delay`.
    #[default]
    Reject,
    /// Hold a denied request for its `retry_after`, then check it again (as often as it
    /// takes) — but never hold any request longer than `max_wait` in all (waits plus a leaky
    /// bucket's delay). A request is waited for only while the wait, plus the longest delay a
    /// leaky bucket of its rule could then give it, still ends within `max_wait`; otherwise
    /// it is rejected then and there (at once if its first check already cannot make it, or
    /// when no wait can help). A layer whose leaky bucket could ask for more than `max_wait`
    /// ((B − 1)·T) is refused when it is built.
    Delay {
        /// The longest a request is held before it reaches the inner service.
        max_wait: Duration,
    },
    /// Dry run: admit every request, without waiting and without rate-limit headers, but
    /// count ([`RateLimitLayer::shadow_denied`](crate::RateLimitLayer::shadow_denied)) and log (`tracing`, target
    /// `turnstile::shadow`, level INFO) each request that would have been denied. Denied
    /// requests consume nothing, so the counts are what enforcing would have done.
    Shadow,
}

impl Action {
    /// [`Action::Delay`] with `max_wait`.
    pub fn delay(max_wait: Duration) -> Self {
        Action::Delay { max_wait }
    }
}

/// (B − 1)·T = (B − 1)·P / L, rounded up to whole nanoseconds: the longest `delay` a leaky
/// bucket gives a request costing at least 1.
pub(crate) fn max_leaky_delay(p: &Policy) -> Duration {
    let b = u128::from(p.capacity().saturating_sub(1));
    let ns = (b * u128::from(p.period_ms()) * 1_000_000).div_ceil(u128::from(p.limit().max(1)));
    Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
}

pub(crate) fn check_action(rules: &[CompiledRule], action: Action) -> Result<(), InvalidLayer> {
    for r in rules {
        check_action_policies(&r.policies, action)?;
    }
    Ok(())
}

pub(crate) fn check_action_policies(
    policies: &[Policy],
    action: Action,
) -> Result<(), InvalidLayer> {
    if let Action::Delay { max_wait } = action {
        for p in policies {
            if p.algorithm() == Algorithm::LeakyBucket {
                let max_delay = max_leaky_delay(p);
                if max_delay > max_wait {
                    return Err(InvalidLayer::DelayExceedsMaxWait {
                        policy: p.name().to_owned(),
                        max_delay,
                        max_wait,
                    });
                }
            }
        }
    }
    Ok(())
}
