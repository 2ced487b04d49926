//! Decisions: what a check answers, per policy ([`PolicyDecision`]) and in aggregate
//! ([`Decision`]).
//!
//! A policy's answer keeps its values packed (`fields.rs`: exact durations, or a bucket's
//! debts read on demand); this module holds the aggregate of `SEMANTICS.md`'s "several
//! policies on one request".

mod fields;
mod policy;

use std::time::Duration;

use crate::few::Few;
use crate::quota::{Applied, Source};
pub use fields::exact_ms;
pub(crate) use fields::{span_ratio, Span};
pub use policy::PolicyDecision;

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
    policies: Few<PolicyDecision>,
    applied: Applied,
    /// Where each policy took its parameters from, when they differ (`None`: every
    /// policy's is `applied`'s [`Applied::source`]).
    /// (A thin pointer: a decision stays small.)
    sources: Option<std::sync::Arc<Vec<Source>>>,
    version: u64,
    /// The binding policy's index.
    binding: u32,
    allowed: bool,
    origin: Origin,
}

impl PartialEq for Decision {
    fn eq(&self, other: &Self) -> bool {
        // The aggregate `retry_after` and `delay` follow from these.
        self.allowed == other.allowed
            && self.binding == other.binding
            && self.policies == other.policies
            && self.applied == other.applied
            && self.version == other.version
            && self.sources().eq(other.sources())
    }
}

impl Eq for Decision {}

/// [`Decision::from_policies`] of the results in policy order, without a list for a single
/// result (most checks have one policy).
impl FromIterator<PolicyDecision> for Decision {
    fn from_iter<I: IntoIterator<Item = PolicyDecision>>(iter: I) -> Self {
        Self::from_few(iter.into_iter().collect())
    }
}

impl Decision {
    /// Aggregates per-policy results (in policy order) as `SEMANTICS.md` says.
    ///
    /// `policies` must not be empty; an empty list yields a decision that allows with
    /// `remaining` `u64::MAX`, as [`Decision::unlimited`] (backends refuse empty policy lists
    /// before getting here).
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
        let allowed = list.iter().all(|p| p.allowed());
        let mut binding = 0;
        for (i, p) in list.iter().enumerate().skip(1) {
            let b = &list[binding];
            let (r, rb) = (p.remaining(), b.remaining());
            if r < rb || (r == rb && p.reset_span() > b.reset_span()) {
                binding = i;
            }
        }
        Decision {
            allowed,
            binding: binding as u32,
            policies,
            applied,
            sources: None,
            version,
            origin: Origin::Backend,
        }
    }

    /// The decision of one policy's result, with the configuration that applied and the key's
    /// version: [`Decision::from_few_with`] without a list to walk.
    #[inline]
    pub(crate) fn one(policy: PolicyDecision, applied: Applied, version: u64) -> Self {
        Decision {
            allowed: policy.allowed(),
            binding: 0,
            policies: Few::One(policy),
            applied,
            sources: None,
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
            binding: 0,
            policies: Few::none(),
            applied: Applied::Denied,
            sources: None,
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
            binding: 0,
            policies: Few::none(),
            applied: Applied::Unlimited,
            sources: None,
            version,
            origin: Origin::Backend,
        }
    }

    /// The same decision, saying which configuration applied and the key's configuration
    /// version.
    pub fn with_applied(mut self, applied: Applied, version: u64) -> Self {
        self.applied = applied;
        self.sources = None;
        self.version = version;
        self
    }

    /// The same decision, saying where each policy (in order) took its parameters from,
    /// and summing them up in [`Decision::applied`]: [`Applied::Override`] if some policy's
    /// came from the key's override, else [`Applied::Tier`] of the first policy's tier that
    /// supplied some, else [`Applied::Defaults`]. A decision without policies
    /// ([`Applied::Denied`], [`Applied::Unlimited`]) is returned as it is; missing sources
    /// count as [`Source::Defaults`], extra ones are ignored.
    pub fn with_sources(mut self, sources: impl IntoIterator<Item = Source>) -> Self {
        let n = self.policies.as_slice().len();
        if n == 0 {
            return self;
        }
        let mut list: Vec<Source> = sources.into_iter().take(n).collect();
        list.resize(n, Source::Defaults);
        let summary = if list.contains(&Source::Override) {
            Source::Override
        } else {
            list.iter()
                .find(|s| matches!(s, Source::Tier(_)))
                .cloned()
                .unwrap_or(Source::Defaults)
        };
        self.applied = summary.applied();
        self.sources = match list.iter().all(|s| *s == summary) {
            true => None,
            false => Some(std::sync::Arc::new(list)),
        };
        self
    }

    /// Where each policy (in [`Decision::policies`]' order) took its parameters from: the
    /// key's override, a tier (the key's stored one or the request's), or the defaults (in
    /// the tower layer, the rule's own). Empty when no policy was checked.
    pub fn sources(&self) -> impl Iterator<Item = Source> + '_ {
        (0..self.policies.as_slice().len()).map(move |i| self.source(i).unwrap_or_default())
    }

    /// Where policy `i` (in [`Decision::policies`]' order) took its parameters from; `None`
    /// beyond the last policy.
    pub fn source(&self, i: usize) -> Option<Source> {
        if i >= self.policies.as_slice().len() {
            return None;
        }
        match &self.sources {
            Some(list) => list.get(i).cloned(),
            None => Some(self.applied.source().unwrap_or_default()),
        }
    }

    /// The same decision seen `elapsed` later with nothing else happening: every
    /// `retry_after`, `reset_after` and `delay` shortened by `elapsed` (not below zero; a
    /// denial's `retry_after` stays positive, at least 1 ns). `remaining` is kept as it was:
    /// a lower bound. For caches of decisions.
    pub fn elapsed_by(&self, elapsed: Duration) -> Decision {
        let less = |d: Duration| Span::from_duration(d.saturating_sub(elapsed));
        Decision {
            allowed: self.allowed,
            binding: self.binding,
            policies: self
                .policies
                .as_slice()
                .iter()
                .map(|p| {
                    let retry = p.retry_after().map(|d| {
                        if p.allowed() {
                            Span::ZERO
                        } else {
                            less(d).max(Span { ms: 0, ns: 1 })
                        }
                    });
                    PolicyDecision::from_spans(
                        p.policy.clone(),
                        p.allowed(),
                        p.remaining(),
                        retry,
                        less(p.reset_after()),
                        less(p.delay()),
                    )
                })
                .collect(),
            applied: self.applied.clone(),
            sources: self.sources.clone(),
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
    #[inline]
    pub fn allowed(&self) -> bool {
        self.allowed
    }

    /// The binding policy's `remaining` (units); `u64::MAX` when no policy applied and the
    /// key is admitted without limit, 0 when it is denied without one.
    pub fn remaining(&self) -> u64 {
        match self.binding() {
            Some(p) => p.remaining(),
            None if self.allowed => u64::MAX,
            None => 0,
        }
    }

    /// `Some(Duration::ZERO)` when admitted; when denied, the largest `retry_after` of the
    /// denying policies, or `None` if any of them can never admit the request.
    pub fn retry_after(&self) -> Option<Duration> {
        if self.allowed {
            return Some(Duration::ZERO);
        }
        let list = self.policies.as_slice();
        if list.is_empty() {
            // Denied without a policy: no wait can help.
            return None;
        }
        list.iter()
            .filter(|p| !p.allowed())
            .try_fold(Span::ZERO, |acc, p| p.retry_span().map(|r| acc.max(r)))
            .map(Span::duration)
    }

    /// The binding policy's `reset_after`.
    pub fn reset_after(&self) -> Duration {
        self.binding()
            .map_or(Duration::ZERO, PolicyDecision::reset_after)
    }

    /// The largest `delay` among the policies (leaky bucket only; zero when denied).
    pub fn delay(&self) -> Duration {
        if !self.allowed {
            return Duration::ZERO;
        }
        let list = self.policies.as_slice();
        list.iter()
            .map(PolicyDecision::delay_span)
            .max()
            .unwrap_or(Span::ZERO)
            .duration()
    }

    /// The binding policy's own result: the one with the smallest `remaining`, ties broken by
    /// the largest `reset_after`.
    pub fn binding(&self) -> Option<&PolicyDecision> {
        self.policies.as_slice().get(self.binding as usize)
    }

    /// Each policy's own result, in the order the policies were given.
    pub fn policies(&self) -> &[PolicyDecision] {
        self.policies.as_slice()
    }

    /// The policies that deny the request, in policy order (empty when admitted).
    pub fn violated(&self) -> impl Iterator<Item = &PolicyDecision> {
        self.policies.as_slice().iter().filter(|p| !p.allowed())
    }
}

#[cfg(test)]
mod tests {
    use super::fields::ms_ratio;
    use super::*;

    fn pd(
        name: &str,
        allowed: bool,
        remaining: u64,
        retry: Option<u64>,
        reset: u64,
    ) -> PolicyDecision {
        PolicyDecision::new(
            format!("gcra:limit=1,period=1s,name={name}")
                .parse()
                .unwrap(),
            allowed,
            remaining,
            retry.map(Duration::from_millis),
            Duration::from_millis(reset),
            Duration::ZERO,
        )
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
    fn collecting_results_is_from_policies() {
        let lists = [
            vec![pd("a", true, 4, Some(0), 50)],
            vec![
                pd("a", false, 0, Some(100), 500),
                pd("b", true, 3, Some(0), 900),
            ],
            vec![
                pd("a", false, 0, Some(100), 500),
                pd("b", false, 0, Some(300), 900),
                pd("c", true, 4, Some(0), 50),
            ],
        ];
        for list in lists {
            let collected: Decision = list.iter().cloned().collect();
            assert_eq!(collected, Decision::from_policies(list));
        }
    }

    #[test]
    fn spans_are_the_durations_they_stand_for() {
        for d in [
            Duration::ZERO,
            Duration::from_nanos(1),
            Duration::from_nanos(999_999),
            Duration::from_millis(1),
            Duration::new(3, 333_333_334),
            Duration::from_millis(u64::from(u32::MAX) * 1_000),
        ] {
            assert_eq!(Span::from_duration(d).duration(), d);
        }
        for (num, den) in [
            (1, 3),
            (3000, 3),
            (0, 7),
            (u128::from(crate::policy::MAX_EXACT), 1),
        ] {
            assert_eq!(
                span_ratio(num, den).duration(),
                ms_ratio(num, den),
                "{num}/{den}"
            );
            assert_eq!(span_ratio(num, den).ceil_ms(), num.div_ceil(den) as u64);
        }
        assert!(std::mem::size_of::<PolicyDecision>() <= 64);
        assert!(std::mem::size_of::<Decision>() <= 112); // 104 before per-policy sources (one thin pointer)
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
