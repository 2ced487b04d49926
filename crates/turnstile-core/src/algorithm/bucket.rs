//! Token bucket and leaky bucket (`lua/bucket.lua`), and what every bucket shares with the
//! GCRA: the decision on a debt, the carry-over between buckets and the refund.
//!
//! State is a debt D = (B − x)·P (token bucket, x tokens held) or D = y·P (leaky bucket, y
//! units queued): an integer in units of 1/L ms, relative to the state's last update. A
//! refill over Δ ms subtracts Δ·L. Admit iff D ≤ (B − c)·P, then D += c·P.
//!
//! The decision itself, on a debt, is [`crate::debt`]: written once, and called by the
//! evaluation here and in `gcra.rs`, by the in-memory backend's decision on its packed words
//! (`memory/fast.rs`) and by a bucket decision's fields when they are read.

use super::gcra;
use super::{Exact, Kind, Outcome, State, Update};
use crate::debt::{decide_debt, refilled, remaining, Debts, Retry};
use crate::policy::{Algorithm, Policy};

/// A decision in debts as the general evaluation's [`Outcome`]; `update` makes the state to
/// store from the debt after an admission with a positive cost.
pub(super) fn outcome(
    p: &Policy,
    d: Debts,
    cost: u64,
    update: impl FnOnce(u64) -> Update,
) -> Outcome {
    let l = u128::from(p.limit());
    let per_limit = |debt: u64| Exact::ratio(u128::from(debt), l);
    Outcome {
        allowed: d.allowed,
        remaining: remaining(p.capacity(), p.period_ms(), d.after),
        retry: match d.retry {
            Retry::Zero => Some(Exact::ZERO),
            Retry::Never => None,
            Retry::After(debt) => Some(per_limit(debt)),
        },
        reset: per_limit(d.after),
        delay: per_limit(d.delay),
        update: if d.allowed && cost > 0 {
            update(d.after)
        } else {
            Update::None
        },
    }
}

/// Token bucket (`leaky = false`) and leaky bucket (`leaky = true`), which admit the same
/// requests: with debt D = (B − x)·P = y·P, [`decide_debt`].
pub(super) fn decide(p: &Policy, s: &State, now: u64, cost: u64, leaky: bool) -> Outcome {
    let debt = match s.kind {
        Kind::Bucket { debt } => refilled(debt, now - s.updated_ms, p.limit(), max_debt(p)),
        _ => 0,
    };
    let d = decide_debt(p.period_ms(), p.capacity(), debt, cost, leaky);
    outcome(p, d, cost, |debt| Update::Bucket { debt })
}

/// B·P of `p`: the most debt a state holds under it.
pub(super) fn max_debt(p: &Policy) -> u64 {
    p.capacity() * p.period_ms()
}

/// The units in use of a bucket state (token, leaky or GCRA) at `now`, as a debt in units of
/// 1/L ms (L and P of `policy`, the policy the state was written under). 0 for non-bucket
/// states.
fn debt_at(policy: &Policy, state: &State, now: u64) -> u64 {
    let (l, max) = (policy.limit(), max_debt(policy));
    match state.kind {
        Kind::Bucket { debt } => refilled(debt, now.saturating_sub(state.updated_ms), l, max),
        Kind::Gcra { tat_ms, tat_frac } => gcra::debt_at(tat_ms, tat_frac, now, l, max),
        _ => 0,
    }
}

/// A bucket state of `algorithm` (L = `l`) holding `debt` at `now`: a debt for the token and
/// leaky buckets, a TAT = now + debt / L for the GCRA.
fn debt_kind(algorithm: Algorithm, l: u64, debt: u64, now: u64) -> Kind {
    match algorithm {
        Algorithm::Gcra => gcra::tat_kind(now, debt, l),
        _ => Kind::Bucket { debt },
    }
}

/// Carry-over between buckets (token bucket, GCRA, leaky bucket, in any combination): the
/// units in use at `now`, rounded up to a whole unit and capped at the new burst, carry over.
pub(super) fn carry_over(from: &Policy, to: &Policy, state: &State, now: u64) -> State {
    let units = debt_at(from, state, now)
        .div_ceil(from.period_ms())
        .min(to.capacity());
    let debt = units * to.period_ms();
    if debt == 0 {
        return State::fresh_at(now);
    }
    State {
        updated_ms: now,
        kind: debt_kind(to.algorithm(), to.limit(), debt, now),
    }
}

/// Refund of a bucket state (token, leaky or GCRA): the debt shrinks by `cost` units, not
/// below empty.
pub(super) fn refund(policy: &Policy, state: &mut State, now: u64, cost: u64) {
    let debt = debt_at(policy, state, now);
    let give = cost.min(policy.capacity()) * policy.period_ms();
    let debt = debt.saturating_sub(give);
    state.kind = debt_kind(policy.algorithm(), policy.limit(), debt, now);
    state.updated_ms = now;
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::{check, State};
    use crate::policy::Policy;

    fn policy(s: &str) -> Policy {
        s.parse().unwrap()
    }

    /// Replays one request every `step` ms for `duration` ms; returns the admitted count.
    fn replay(p: &Policy, step: u64, duration: u64) -> u64 {
        let mut s = State::new();
        (0..duration)
            .step_by(step as usize)
            .filter(|t| check(p, &mut s, *t, 1).allowed())
            .count() as u64
    }

    #[test]
    fn token_bucket_has_no_drift_over_a_simulated_hour() {
        // L = 3 per 1000 ms, T = 333.33.. ms, one request every 250 ms for an hour (t = 0 ..
        // 3,599,750). The bucket starts full (3) and refills 3 per 1000 ms: by the last
        // request it has refilled floor(3 · 3,599,750 / 1000) = 10,799 whole tokens, and a
        // request arrives faster than tokens, so every token is taken: 3 + 10,799.
        for alg in ["token-bucket", "gcra", "leaky-bucket"] {
            let p = policy(&format!("{alg}:limit=3,period=1s"));
            assert_eq!(replay(&p, 250, 3_600_000), 3 + 10_799, "{alg}");
        }
    }

    #[test]
    fn exact_instant_of_refill_with_non_integral_interval() {
        let p = policy("token-bucket:limit=3,period=1s");
        let mut s = State::new();
        for _ in 0..3 {
            assert!(check(&p, &mut s, 0, 1).allowed());
        }
        let d = check(&p, &mut s, 333, 1);
        assert!(!d.allowed());
        assert_eq!(d.retry_after(), Some(Duration::from_nanos(333_334)));
        assert!(check(&p, &mut s, 334, 1).allowed());
    }
}
