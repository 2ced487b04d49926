//! One policy's answer to a check.

use std::time::Duration;

use super::fields::ms_ratio;
use super::fields::{Fields, Span};
use crate::debt::Debts;
use crate::policy::{Algorithm, Policy};
use crate::shared::SharedPolicy;

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
    fields: Fields,
}

impl PartialEq for PolicyDecision {
    fn eq(&self, other: &Self) -> bool {
        self.policy == other.policy
            && self.allowed() == other.allowed()
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
    /// [`exact_ms`](super::exact_ms) gives; `retry_after` is `Some(Duration::ZERO)` when
    /// `allowed`.
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
        PolicyDecision {
            policy,
            fields: Fields::spans(allowed, remaining, retry, reset, delay),
        }
    }

    /// A bucket policy's result from its decision in debts (units of 1/L ms, see [`Debts`]).
    #[inline]
    pub(crate) fn bucket(policy: SharedPolicy, d: Debts) -> Self {
        PolicyDecision {
            policy,
            fields: Fields::bucket(d),
        }
    }

    pub(crate) fn retry_span(&self) -> Option<Span> {
        self.fields.retry_span(&self.policy)
    }

    pub(crate) fn reset_span(&self) -> Span {
        self.fields.reset_span(&self.policy)
    }

    pub(crate) fn delay_span(&self) -> Span {
        self.fields.delay_span(&self.policy)
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
    #[inline]
    pub fn allowed(&self) -> bool {
        self.fields.allowed
    }

    /// Units still available under this policy after the decision (see `SEMANTICS.md` for
    /// each algorithm's definition). When the request is denied overall, nothing was
    /// consumed and this is the count before it.
    pub fn remaining(&self) -> u64 {
        self.fields.remaining(&self.policy)
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
    pub(super) fn unchanged_for(&self, cost: u64) -> Option<Duration> {
        let p = &self.policy;
        let remaining = self.remaining();
        if remaining >= p.capacity() {
            return None;
        }
        // Every algorithm admits `cost` exactly when `remaining` ≥ `cost`, so when one more
        // unit is missing, the first rise is the admission itself.
        if !self.allowed() && cost == remaining + 1 {
            return Some(self.retry_after().unwrap_or(Duration::ZERO));
        }
        Some(match p.algorithm() {
            // remaining = B − ceil(D / P) rises when the debt D / L ms (`reset_after`) falls to
            // (B − r − 1)·P / L ms. Both durations are rounded up to ns: one ns less keeps
            // the bound below the exact instant.
            Algorithm::TokenBucket | Algorithm::Gcra | Algorithm::LeakyBucket => {
                let units = u128::from(p.capacity() - remaining - 1);
                let rest = ms_ratio(units * u128::from(p.period_ms()), u128::from(p.limit()));
                let reset = self.reset_after();
                reset.saturating_sub(rest.saturating_add(Duration::from_nanos(1)))
            }
            // A count in the current window (remaining < L) ends with the window, when the
            // key resets.
            Algorithm::FixedWindow => self.reset_after(),
            Algorithm::SlidingLog | Algorithm::SlidingWindow => Duration::ZERO,
        })
    }
}
