//! Decisions: what a check answers, per policy and in aggregate.

use std::time::Duration;

use crate::few::Few;
use crate::policy::{Algorithm, Policy};
use crate::quota::Applied;

/// One policy's answer to a check, as `SEMANTICS.md` defines its fields.
///
/// Durations are exact values rounded **up** to whole nanoseconds, so rounding them up again
/// to milliseconds or seconds gives exactly the exact value rounded up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyDecision {
    pub(crate) policy: Policy,
    pub(crate) allowed: bool,
    pub(crate) remaining: u64,
    pub(crate) retry_after: Option<Duration>,
    pub(crate) reset_after: Duration,
    pub(crate) delay: Duration,
}

impl PolicyDecision {
    /// A policy's result from its parts, for backends that compute decisions elsewhere (the
    /// Redis scripts). Durations should be exact values rounded up to nanoseconds, as
    /// [`exact_ms`] gives; `retry_after` is `Some(Duration::ZERO)` when `allowed`.
    pub fn new(
        policy: Policy,
        allowed: bool,
        remaining: u64,
        retry_after: Option<Duration>,
        reset_after: Duration,
        delay: Duration,
    ) -> Self {
        PolicyDecision {
            policy,
            allowed,
            remaining,
            retry_after,
            reset_after,
            delay,
        }
    }

    /// The policy's name.
    pub fn name(&self) -> &str {
        self.policy.name()
    }

    /// The policy this result is for (with an override, the key's own policy).
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Whether this policy, on its own, admits the request.
    pub fn allowed(&self) -> bool {
        self.allowed
    }

    /// Units still available under this policy after the decision (see `SEMANTICS.md` for
    /// each algorithm's definition). When the request is denied overall, nothing was
    /// consumed and this is the count before it.
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// `Some(Duration::ZERO)` when this policy admits; when it denies, `Some(d)` with d the
    /// smallest wait after which the same request would be admitted if nothing else arrived;
    /// `None` when no wait can help (the cost exceeds the policy's capacity).
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// How long until this policy's state for the key equals a fresh key's, if nothing else
    /// arrives.
    pub fn reset_after(&self) -> Duration {
        self.reset_after
    }

    /// Leaky bucket only: how long the admitted request waits for the queue ahead of it to
    /// drain. Zero for every other algorithm and for denied requests.
    pub fn delay(&self) -> Duration {
        self.delay
    }

    /// For a policy's result on a denied request of `cost` units: how long, with nothing else
    /// arriving, until this policy's `remaining` could rise or (if it denies) it could admit;
    /// `None` when neither can happen (the policy is at full capacity). A lower bound where
    /// the exact moment depends on state a decision does not carry (a sliding log's oldest
    /// entry, a sliding window's previous count): zero.
    fn unchanged_for(&self, cost: u64) -> Option<Duration> {
        let p = &self.policy;
        let cap = p.capacity();
        if self.remaining >= cap {
            return None;
        }
        // Every algorithm admits `cost` exactly when `remaining` ≥ `cost`, so when one more
        // unit is missing, the first rise is the admission itself.
        if !self.allowed && cost == self.remaining + 1 {
            return Some(self.retry_after.unwrap_or(Duration::ZERO));
        }
        match p.algorithm() {
            // remaining = B − ceil(D / P) rises when the debt D / L ms (`reset_after`) falls to
            // (B − r − 1)·P / L ms. Both durations are rounded up to ns: one ns less keeps
            // the bound below the exact instant.
            Algorithm::TokenBucket | Algorithm::Gcra | Algorithm::LeakyBucket => {
                let units = u128::from(cap - self.remaining - 1);
                let rest = ms_ratio(units * u128::from(p.period_ms()), u128::from(p.limit()));
                Some(
                    self.reset_after
                        .saturating_sub(rest.saturating_add(Duration::from_nanos(1))),
                )
            }
            // A count in the current window (remaining < L) ends with the window, when the
            // key resets.
            Algorithm::FixedWindow => Some(self.reset_after),
            Algorithm::SlidingLog | Algorithm::SlidingWindow => Some(Duration::ZERO),
        }
    }
}

/// Who answered a check: the backend itself, or a wrapper in its stead. Only an answer of
/// the backend is evidence that it works (an incident ends on one).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Origin {
    /// The backend decided (the default).
    #[default]
    Backend,
    /// A deny cache repeated a denial the backend gave earlier (`wrap::DenyCache`).
    DenyCache,
    /// A local fallback decided because the backend could not (`wrap::Fallback`).
    Fallback,
}

/// The answer to one check of a key against one or more policies.
///
/// The request is admitted only if every policy admits it, and a denied request consumes
/// from none of them. The aggregate fields follow `SEMANTICS.md`: the largest `retry_after`
/// among the denying policies (`None`, "never", if any says never), the largest `delay`, and
/// the `remaining` and `reset_after` of the *binding* policy — the one with the smallest
/// `remaining`, ties broken by the largest `reset_after` (the first such in policy order).
///
/// Two decisions are equal when every field of the answer is; who answered
/// ([`Decision::origin`]) is not compared.
#[derive(Clone, Debug)]
pub struct Decision {
    allowed: bool,
    retry_after: Option<Duration>,
    delay: Duration,
    binding: usize,
    policies: Few<PolicyDecision>,
    applied: Applied,
    version: u64,
    origin: Origin,
}

impl PartialEq for Decision {
    fn eq(&self, other: &Self) -> bool {
        self.allowed == other.allowed
            && self.retry_after == other.retry_after
            && self.delay == other.delay
            && self.binding == other.binding
            && self.policies == other.policies
            && self.applied == other.applied
            && self.version == other.version
    }
}

impl Eq for Decision {}

impl Decision {
    /// Aggregates per-policy results (in policy order) as `SEMANTICS.md` says.
    ///
    /// `policies` must not be empty; an empty list yields a decision that allows with
    /// `remaining` 0 (backends refuse empty policy lists before getting here).
    pub fn from_policies(policies: Vec<PolicyDecision>) -> Self {
        Self::from_few(Few::from_vec(policies))
    }

    pub(crate) fn from_few(policies: Few<PolicyDecision>) -> Self {
        Self::from_few_with(policies, Applied::Defaults, 0)
    }

    /// [`Decision::from_few`] with the configuration that applied and the key's version.
    pub(crate) fn from_few_with(
        policies: Few<PolicyDecision>,
        applied: Applied,
        version: u64,
    ) -> Self {
        let list = policies.as_slice();
        let allowed = list.iter().all(|p| p.allowed);
        let retry_after = if allowed {
            Some(Duration::ZERO)
        } else {
            list.iter()
                .filter(|p| !p.allowed)
                .try_fold(Duration::ZERO, |acc, p| p.retry_after.map(|r| acc.max(r)))
        };
        let delay = if allowed {
            list.iter().map(|p| p.delay).max().unwrap_or(Duration::ZERO)
        } else {
            Duration::ZERO
        };
        let mut binding = 0;
        for (i, p) in list.iter().enumerate().skip(1) {
            let b = &list[binding];
            if p.remaining < b.remaining
                || (p.remaining == b.remaining && p.reset_after > b.reset_after)
            {
                binding = i;
            }
        }
        Decision {
            allowed,
            retry_after,
            delay,
            binding,
            policies,
            applied,
            version,
            origin: Origin::Backend,
        }
    }

    /// The decision on a key with no configuration when the backend is told to deny such
    /// keys ([`Unconfigured::Deny`](crate::Unconfigured::Deny)): denied, `remaining` 0, and
    /// no wait can help (`retry_after` is `None`).
    pub fn unconfigured_denied(version: u64) -> Self {
        Decision {
            allowed: false,
            retry_after: None,
            delay: Duration::ZERO,
            binding: 0,
            policies: Few::None,
            applied: Applied::Denied,
            version,
            origin: Origin::Backend,
        }
    }

    /// The decision on a key with no configuration when the backend is told to admit such
    /// keys without limit ([`Unconfigured::Allow`](crate::Unconfigured::Allow)): admitted,
    /// `remaining` `u64::MAX`, no policy checked.
    pub fn unlimited(version: u64) -> Self {
        Decision {
            allowed: true,
            retry_after: Some(Duration::ZERO),
            delay: Duration::ZERO,
            binding: 0,
            policies: Few::None,
            applied: Applied::Unlimited,
            version,
            origin: Origin::Backend,
        }
    }

    /// The same decision, saying which configuration applied and the key's configuration
    /// version.
    pub fn with_applied(mut self, applied: Applied, version: u64) -> Self {
        self.applied = applied;
        self.version = version;
        self
    }

    /// The same decision seen `elapsed` later with nothing else happening: every
    /// `retry_after`, `reset_after` and `delay` shortened by `elapsed` (not below zero; a
    /// denial's `retry_after` stays positive, at least 1 ns). `remaining` is kept as it was:
    /// a lower bound. For caches of decisions.
    pub fn elapsed_by(&self, elapsed: Duration) -> Decision {
        let less = |d: Duration| d.saturating_sub(elapsed);
        let retry = |allowed: bool, r: Option<Duration>| {
            r.map(|d| {
                if allowed {
                    Duration::ZERO
                } else {
                    less(d).max(Duration::from_nanos(1))
                }
            })
        };
        Decision {
            allowed: self.allowed,
            retry_after: retry(self.allowed, self.retry_after),
            delay: less(self.delay),
            binding: self.binding,
            policies: self
                .policies
                .as_slice()
                .iter()
                .map(|p| PolicyDecision {
                    policy: p.policy.clone(),
                    allowed: p.allowed,
                    remaining: p.remaining,
                    retry_after: retry(p.allowed, p.retry_after),
                    reset_after: less(p.reset_after),
                    delay: less(p.delay),
                })
                .collect(),
            applied: self.applied.clone(),
            version: self.version,
            origin: self.origin,
        }
    }

    /// For a denial of a request of `cost` units: how long the same request, with nothing
    /// else reaching the key, keeps getting this decision aged by the time passed. For every
    /// `d` below the returned duration the decision at `d` later equals
    /// [`self.elapsed_by(d)`](Decision::elapsed_by) field for field: the same violated
    /// policies, the same `remaining` everywhere, every duration shortened by `d`.
    ///
    /// It ends no later than the first moment a field could change otherwise: when the first
    /// violated policy could admit (its `retry_after`), or when any policy's `remaining` could
    /// rise (a bucket refilling a whole unit, a fixed window ending). Where that moment
    /// depends on state a decision does not carry — a sliding log's oldest entry, a sliding
    /// window's previous count — it is taken as now, unless the policy misses exactly one
    /// unit, in which case its first rise is its admission. At least 1 ns for a denial (the
    /// same instant always gets the same answer); `Duration::MAX` when nothing can change;
    /// zero for an admitted decision, which changed the state.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile_core::{Backend, MemoryBackend, Policy};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let b = MemoryBackend::new();
    /// // A = 2 per 60 s, B = 1 per 1 s: at 1100 ms both deny; B admits again at 2000 ms.
    /// let ps = [
    ///     "token-bucket:limit=2,period=60s,name=A".parse::<Policy>()?,
    ///     "token-bucket:limit=1,period=1s,name=B".parse()?,
    /// ];
    /// for t in [0, 1000] {
    ///     assert!(b.check_at("k", &ps, 1, t).into_inner()?.allowed());
    /// }
    /// let denied = b.check_at("k", &ps, 1, 1100).into_inner()?;
    /// assert_eq!(denied.violated().count(), 2);
    /// assert_eq!(denied.unchanged_for(1), Duration::from_millis(900));
    /// # Ok(()) }
    /// ```
    pub fn unchanged_for(&self, cost: u64) -> Duration {
        if self.allowed {
            return Duration::ZERO;
        }
        self.policies
            .as_slice()
            .iter()
            .filter_map(|p| p.unchanged_for(cost))
            .min()
            .map_or(Duration::MAX, |d| d.max(Duration::from_nanos(1)))
    }

    /// Who answered: the backend, or a wrapper in its stead ([`Origin`]).
    pub fn origin(&self) -> Origin {
        self.origin
    }

    /// The same decision, answered by `origin` (for wrappers that answer in a backend's
    /// stead).
    pub fn with_origin(mut self, origin: Origin) -> Self {
        self.origin = origin;
        self
    }

    /// Which configuration decided: the default policies, the key's override, its tier, or
    /// (for a key without configuration) a blanket deny or allow.
    pub fn applied(&self) -> &Applied {
        &self.applied
    }

    /// The key's configuration version: it changes whenever something gives the key quota
    /// back or changes its policies (reset, refund, override, tier), so a cache of denials
    /// can tell that a denial may no longer hold. 0 for a key never configured.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Whether the request is admitted (by every policy).
    pub fn allowed(&self) -> bool {
        self.allowed
    }

    /// The binding policy's `remaining` (units); `u64::MAX` when no policy applied and the
    /// key is admitted without limit, 0 when it is denied without one.
    pub fn remaining(&self) -> u64 {
        match self.binding() {
            Some(p) => p.remaining,
            None if self.allowed => u64::MAX,
            None => 0,
        }
    }

    /// `Some(Duration::ZERO)` when admitted; when denied, the largest `retry_after` of the
    /// denying policies, or `None` if any of them can never admit the request.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// The binding policy's `reset_after`.
    pub fn reset_after(&self) -> Duration {
        self.binding().map_or(Duration::ZERO, |p| p.reset_after)
    }

    /// The largest `delay` among the policies (leaky bucket only; zero when denied).
    pub fn delay(&self) -> Duration {
        self.delay
    }

    /// The binding policy's own result: the one with the smallest `remaining`, ties broken by
    /// the largest `reset_after`.
    pub fn binding(&self) -> Option<&PolicyDecision> {
        self.policies.as_slice().get(self.binding)
    }

    /// Each policy's own result, in the order the policies were given.
    pub fn policies(&self) -> &[PolicyDecision] {
        self.policies.as_slice()
    }

    /// The policies that deny the request, in policy order (empty when admitted).
    pub fn violated(&self) -> impl Iterator<Item = &PolicyDecision> {
        self.policies.as_slice().iter().filter(|p| !p.allowed)
    }
}

/// The exact duration `num / den` milliseconds, rounded up to whole nanoseconds, so that
/// rounding it up again to milliseconds or seconds rounds the exact value. A `den` of 0 is
/// taken as 1; a value beyond `Duration::MAX` saturates (no policy within `SEMANTICS.md`'s
/// bounds comes near).
pub fn exact_ms(num: u128, den: u128) -> Duration {
    ms_ratio(num, den)
}

pub(crate) fn ms_ratio(num: u128, den: u128) -> Duration {
    let den = den.max(1);
    if num == 0 {
        return Duration::ZERO;
    }
    // The common case in 64-bit arithmetic: 128-bit division costs several times more.
    if let (Ok(n), Ok(d)) = (u64::try_from(num), u64::try_from(den)) {
        if let Some(scaled) = n.checked_mul(1_000_000) {
            let ns = scaled.div_ceil(d);
            return Duration::new(ns / 1_000_000_000, (ns % 1_000_000_000) as u32);
        }
    }
    let Some(scaled) = num.checked_mul(1_000_000) else {
        return Duration::MAX;
    };
    let ns = scaled.div_ceil(den);
    let Ok(secs) = u64::try_from(ns / 1_000_000_000) else {
        return Duration::MAX;
    };
    let nanos = (ns % 1_000_000_000) as u32;
    Duration::new(secs, nanos)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pd(
        name: &str,
        allowed: bool,
        remaining: u64,
        retry: Option<u64>,
        reset: u64,
    ) -> PolicyDecision {
        PolicyDecision {
            policy: format!("gcra:limit=1,period=1s,name={name}")
                .parse()
                .unwrap(),
            allowed,
            remaining,
            retry_after: retry.map(Duration::from_millis),
            reset_after: Duration::from_millis(reset),
            delay: Duration::ZERO,
        }
    }

    #[test]
    fn aggregate_takes_binding_policy_and_largest_retry() {
        let d = Decision::from_policies(vec![
            pd("a", false, 0, Some(100), 500),
            pd("b", false, 0, Some(300), 900),
            pd("c", true, 4, Some(0), 50),
        ]);
        assert!(!d.allowed());
        assert_eq!(d.retry_after(), Some(Duration::from_millis(300)));
        assert_eq!(d.binding().unwrap().name(), "b");
        assert_eq!(d.reset_after(), Duration::from_millis(900));
        assert_eq!(d.violated().count(), 2);

        let never = Decision::from_policies(vec![
            pd("a", false, 0, Some(100), 500),
            pd("b", false, 3, None, 900),
        ]);
        assert_eq!(never.retry_after(), None);
        assert_eq!(never.binding().unwrap().name(), "a");
    }

    #[test]
    fn ms_ratio_rounds_up_to_nanoseconds() {
        assert_eq!(ms_ratio(1, 3), Duration::from_nanos(333_334));
        assert_eq!(ms_ratio(3000, 3), Duration::from_secs(1));
        assert_eq!(ms_ratio(0, 7), Duration::ZERO);
        let big = ms_ratio(u128::from(crate::policy::MAX_EXACT), 1);
        assert_eq!(big.as_millis(), u128::from(crate::policy::MAX_EXACT));
    }
}
