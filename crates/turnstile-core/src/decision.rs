//! Decisions: what a check answers, per policy and in aggregate.

use std::collections::HashSet;
use std::fmt;
use std::ops::Deref;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::algorithm::bucket::{self, Debts};
use crate::few::Few;
use crate::policy::Policy;
use crate::quota::Applied;

/// A policy that decisions share instead of each holding a copy: moving one moves a
/// pointer. Policies the in-memory backend decides by are interned for the life of the
/// process ([`SharedPolicy::interned`]), so its decisions carry them without counting
/// references (no atomic operation per decision); other decisions (the Redis backend's, the
/// pure `algorithm` functions') hold a reference-counted copy.
#[derive(Clone)]
pub(crate) enum SharedPolicy {
    Interned(&'static Policy),
    Counted(Arc<Policy>),
}

/// How many distinct policies (name and parameters) [`SharedPolicy::interned`] keeps for
/// the life of the process: a few MB at most (a policy with its name is at most about
/// 300 bytes), far more than any configuration holds. Beyond it, policies are shared by
/// reference count instead.
const MAX_INTERNED: usize = 16_384;

impl SharedPolicy {
    /// A reference-counted copy of `policy`.
    pub(crate) fn new(policy: Policy) -> Self {
        SharedPolicy::Counted(Arc::new(policy))
    }

    /// `policy` interned: every call with an equal policy (name and parameters) gives the
    /// same copy, kept for the life of the process — up to [`MAX_INTERNED`] distinct ones,
    /// then a reference-counted copy. Takes a process-wide lock: call it when a policy is
    /// first seen (the in-memory backend does once per shard), not per decision.
    pub(crate) fn interned(policy: &Policy) -> Self {
        static INTERNED: Mutex<Option<HashSet<&'static Policy>>> = Mutex::new(None);
        let mut set = INTERNED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let set = set.get_or_insert_with(HashSet::new);
        if let Some(&p) = set.get(policy) {
            return SharedPolicy::Interned(p);
        }
        if set.len() >= MAX_INTERNED {
            return SharedPolicy::new(policy.clone());
        }
        let p: &'static Policy = Box::leak(Box::new(policy.clone()));
        set.insert(p);
        SharedPolicy::Interned(p)
    }
}

impl SharedPolicy {
    /// [`Policy::identity`] of the policy.
    pub(crate) fn identity(&self) -> (usize, [u64; 2]) {
        (**self).identity()
    }
}

impl Deref for SharedPolicy {
    type Target = Policy;

    #[inline]
    fn deref(&self) -> &Policy {
        match self {
            SharedPolicy::Interned(p) => p,
            SharedPolicy::Counted(p) => p,
        }
    }
}

impl PartialEq for SharedPolicy {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for SharedPolicy {}

impl fmt::Debug for SharedPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        (**self).fmt(f)
    }
}

/// An exact duration rounded up to whole ns, as whole ms and the ns beyond them (below
/// 10⁶): how decisions store durations, three of them in 36 bytes of a [`PolicyDecision`]
/// (a [`Duration`] takes 16 with its padding).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Span {
    pub(crate) ms: u64,
    pub(crate) ns: u32,
}

impl Span {
    pub(crate) const ZERO: Span = Span { ms: 0, ns: 0 };

    /// `ns` nanoseconds.
    pub(crate) fn from_ns(ns: u64) -> Span {
        Span {
            ms: ns / 1_000_000,
            ns: (ns % 1_000_000) as u32,
        }
    }

    /// `d`, saturating at `u64::MAX` ms (585 million years).
    pub(crate) fn from_duration(d: Duration) -> Span {
        Span {
            ms: d
                .as_secs()
                .saturating_mul(1_000)
                .saturating_add(u64::from(d.subsec_millis())),
            ns: d.subsec_nanos() % 1_000_000,
        }
    }

    pub(crate) fn duration(self) -> Duration {
        Duration::new(
            self.ms / 1_000,
            (self.ms % 1_000) as u32 * 1_000_000 + self.ns % 1_000_000,
        )
    }

    /// The span in whole ms, rounded up.
    pub(crate) fn ceil_ms(self) -> u64 {
        self.ms.saturating_add(u64::from(self.ns != 0))
    }
}

/// One policy's answer to a check, as `SEMANTICS.md` defines its fields.
///
/// Durations are exact values rounded **up** to whole nanoseconds, so rounding them up again
/// to milliseconds or seconds gives exactly the exact value rounded up. The policy is shared
/// with the backend, not copied. A bucket's result (token bucket, GCRA, leaky bucket) from
/// the in-memory backend keeps the bucket's debt and works its fields out when they are
/// read, so a caller that only asks whether the request is admitted pays no division.
#[derive(Clone, Debug)]
pub struct PolicyDecision {
    pub(crate) policy: SharedPolicy,
    /// [`Layout::Spans`]: `remaining`, then the ms of `reset_after`, `retry_after` and
    /// `delay`. [`Layout::Bucket`]: the debt after the decision, the debt `retry_after`
    /// waits out and the leaky bucket's queue (`delay`), in units of 1/L ms of the policy's
    /// L: `remaining` = B − ⌈debt / P⌉, each duration its debt / L.
    words: [u64; 4],
    /// [`Layout::Spans`]: the ns beyond those ms, `retry_after`'s [`NEVER`] when no wait can
    /// help. [`Layout::Bucket`]: `retry_after`'s [`NEVER`], [`ZERO`] or [`AFTER`] in the
    /// middle.
    nanos: [u32; 3],
    layout: Layout,
    pub(crate) allowed: bool,
}

/// How a [`PolicyDecision`] keeps its fields (in 64 bytes, policy included).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    Spans,
    Bucket,
}

/// `nanos[1]`: no wait can help.
const NEVER: u32 = u32::MAX;
/// `nanos[1]` of a bucket: `retry_after` is zero.
const ZERO: u32 = 0;
/// `nanos[1]` of a bucket: `retry_after` is `words[1]` / L.
const AFTER: u32 = 1;

/// A bucket's `retry_after`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Retry {
    /// Zero (admitted).
    Zero,
    /// No wait can help.
    Never,
    /// This debt / L ms.
    After(u64),
}

impl PartialEq for PolicyDecision {
    fn eq(&self, other: &Self) -> bool {
        self.policy == other.policy
            && self.allowed == other.allowed
            && self.remaining() == other.remaining()
            && self.retry_span() == other.retry_span()
            && self.reset_span() == other.reset_span()
            && self.delay_span() == other.delay_span()
    }
}

impl Eq for PolicyDecision {}

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
        PolicyDecision::from_spans(
            SharedPolicy::new(policy),
            allowed,
            remaining,
            retry_after.map(Span::from_duration),
            Span::from_duration(reset_after),
            Span::from_duration(delay),
        )
    }

    /// A policy's result from durations as [`Span`]s.
    pub(crate) fn from_spans(
        policy: SharedPolicy,
        allowed: bool,
        remaining: u64,
        retry: Option<Span>,
        reset: Span,
        delay: Span,
    ) -> Self {
        let retry = retry.unwrap_or(Span { ms: 0, ns: NEVER });
        PolicyDecision {
            policy,
            words: [remaining, reset.ms, retry.ms, delay.ms],
            nanos: [reset.ns, retry.ns, delay.ns],
            layout: Layout::Spans,
            allowed,
        }
    }

    /// A bucket policy's result from its decision in debts (units of 1/L ms, see
    /// [`Debts`]): the debt after the decision, the debt a denial waits out, the leaky
    /// bucket's queue ahead of the request.
    #[inline]
    pub(crate) fn bucket(policy: SharedPolicy, d: Debts) -> Self {
        let (retry_debt, marker) = match d.retry {
            Retry::Zero => (0, ZERO),
            Retry::Never => (0, NEVER),
            Retry::After(debt) => (debt, AFTER),
        };
        PolicyDecision {
            policy,
            words: [d.after, retry_debt, d.delay, 0],
            nanos: [0, marker, 0],
            layout: Layout::Bucket,
            allowed: d.allowed,
        }
    }

    /// `debt` / L ms of this policy.
    fn per_limit(&self, debt: u64) -> Span {
        span_ratio(u128::from(debt), u128::from(self.policy.limit()))
    }

    pub(crate) fn retry_span(&self) -> Option<Span> {
        match (self.layout, self.nanos[1]) {
            (_, NEVER) => None,
            (Layout::Spans, ns) => Some(Span {
                ms: self.words[2],
                ns,
            }),
            (Layout::Bucket, ZERO) => Some(Span::ZERO),
            (Layout::Bucket, _) => Some(self.per_limit(self.words[1])),
        }
    }

    pub(crate) fn reset_span(&self) -> Span {
        match self.layout {
            Layout::Spans => Span {
                ms: self.words[1],
                ns: self.nanos[0],
            },
            Layout::Bucket => self.per_limit(self.words[0]),
        }
    }

    pub(crate) fn delay_span(&self) -> Span {
        match self.layout {
            Layout::Spans => Span {
                ms: self.words[3],
                ns: self.nanos[2],
            },
            Layout::Bucket => self.per_limit(self.words[2]),
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
        match self.layout {
            Layout::Spans => self.words[0],
            Layout::Bucket => {
                let p = &*self.policy;
                bucket::remaining(p.capacity(), p.period_ms(), self.words[0])
            }
        }
    }

    /// `Some(Duration::ZERO)` when this policy admits; when it denies, `Some(d)` with d the
    /// smallest wait after which the same request would be admitted if nothing else arrived;
    /// `None` when no wait can help (the cost exceeds the policy's capacity).
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_span().map(Span::duration)
    }

    /// How long until this policy's state for the key equals a fresh key's, if nothing else
    /// arrives.
    pub fn reset_after(&self) -> Duration {
        self.reset_span().duration()
    }

    /// Leaky bucket only: how long the admitted request waits for the queue ahead of it to
    /// drain. Zero for every other algorithm and for denied requests.
    pub fn delay(&self) -> Duration {
        self.delay_span().duration()
    }

    /// For a policy's result on a denied request of `cost` units: how long, with nothing else
    /// arriving, until this policy's `remaining` could rise or (if it denies) it could admit;
    /// `None` when neither can happen (the policy is at full capacity). A lower bound where
    /// the exact moment depends on state a decision does not carry (a sliding log's oldest
    /// entry, a sliding window's previous count): zero.
    fn unchanged_for(&self, cost: u64) -> Option<Duration> {
        let p = &self.policy;
        let cap = p.capacity();
        let remaining = self.remaining();
        if remaining >= cap {
            return None;
        }
        // Every algorithm admits `cost` exactly when `remaining` ≥ `cost`, so when one more
        // unit is missing, the first rise is the admission itself.
        if !self.allowed && cost == remaining + 1 {
            return Some(self.retry_after().unwrap_or(Duration::ZERO));
        }
        Some(crate::algorithm::first_rise(
            p,
            remaining,
            self.reset_after(),
        ))
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
    policies: Few<PolicyDecision>,
    applied: Applied,
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
        let allowed = list.iter().all(|p| p.allowed);
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
            version,
            origin: Origin::Backend,
        }
    }

    /// The decision of one policy's result, with the configuration that applied and the key's
    /// version: [`Decision::from_few_with`] without a list to walk.
    #[inline]
    pub(crate) fn one(policy: PolicyDecision, applied: Applied, version: u64) -> Self {
        Decision {
            allowed: policy.allowed,
            binding: 0,
            policies: Few::One(policy),
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
            binding: 0,
            policies: Few::none(),
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
            binding: 0,
            policies: Few::none(),
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
                        if p.allowed {
                            Span::ZERO
                        } else {
                            less(d).max(Span { ms: 0, ns: 1 })
                        }
                    });
                    PolicyDecision::from_spans(
                        p.policy.clone(),
                        p.allowed,
                        p.remaining(),
                        retry,
                        less(p.reset_after()),
                        less(p.delay()),
                    )
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
            .filter(|p| !p.allowed)
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

/// [`ms_ratio`] as a [`Span`]: the exact `num / den` ms rounded up to whole ns (saturating
/// at `u64::MAX` ms, which no policy within `SEMANTICS.md`'s bounds comes near).
pub(crate) fn span_ratio(num: u128, den: u128) -> Span {
    let den = den.max(1);
    if num == 0 {
        return Span::ZERO;
    }
    if let (Ok(n), Ok(d)) = (u64::try_from(num), u64::try_from(den)) {
        if let Some(scaled) = n.checked_mul(1_000_000) {
            return Span::from_ns(scaled.div_ceil(d));
        }
    }
    let Some(scaled) = num.checked_mul(1_000_000) else {
        return Span {
            ms: u64::MAX,
            ns: 0,
        };
    };
    let ns = scaled.div_ceil(den);
    match u64::try_from(ns / 1_000_000) {
        Ok(ms) => Span {
            ms,
            ns: (ns % 1_000_000) as u32,
        },
        Err(_) => Span {
            ms: u64::MAX,
            ns: 0,
        },
    }
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
        assert!(std::mem::size_of::<Decision>() <= 104);
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
