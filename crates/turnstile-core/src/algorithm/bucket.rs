//! Token bucket and leaky bucket (`lua/bucket.lua`), and what every bucket shares with the
//! GCRA: the decision on a debt, the carry-over between buckets and the refund.
//!
//! State is a debt D = (B − x)·P (token bucket, x tokens held) or D = y·P (leaky bucket, y
//! units queued): an integer in units of 1/L ms, relative to the state's last update. A
//! refill over Δ ms subtracts Δ·L. Admit iff D ≤ (B − c)·P, then D += c·P.

use super::{div_ceil, narrow, params, Exact, Kind, Outcome, State, Update};
use crate::policy::{Algorithm, Policy};

/// Token bucket (`leaky = false`) and leaky bucket (`leaky = true`), which admit the same
/// requests: with debt D = (B − x)·P = y·P, admit iff D ≤ (B − c)·P.
pub(super) fn decide(p: &Policy, s: &State, now: u64, cost: u64, leaky: bool) -> Outcome {
    let (l, period, cap) = params(p);
    let debt = match s.kind {
        Kind::Bucket { debt } => {
            let refill = u128::from(now - s.updated_ms) * l;
            u128::from(debt).saturating_sub(refill)
        }
        _ => 0,
    }
    // A state from a policy with a larger capacity keeps its debt, capped at this one's.
    .min(cap * period);
    decide_debt(l, period, cap, debt, cost, leaky, |d| Update::Bucket {
        debt: narrow(d),
    })
}

/// The shared decision of the debt-based buckets, the GCRA's included (on D = TAT − now).
/// `debt` is in units of 1/L ms, ≤ B·P.
pub(super) fn decide_debt(
    l: u128,
    period: u128,
    cap: u128,
    debt: u128,
    cost: u64,
    leaky: bool,
    update: impl FnOnce(u128) -> Update,
) -> Outcome {
    // remaining = floor(x) = B − ceil(D / P).
    let remaining = |d: u128| narrow(cap - div_ceil(d, period));
    let queued = |d: u128| {
        if leaky {
            Exact::ratio(d, l)
        } else {
            Exact::ZERO
        }
    };
    let cost = u128::from(cost);
    if cost > cap {
        return Outcome::deny(remaining(debt), None, Exact::ratio(debt, l));
    }
    if cost == 0 {
        return Outcome::query(remaining(debt), Exact::ratio(debt, l), queued(debt));
    }
    let room = (cap - cost) * period;
    if debt <= room {
        let after = debt + cost * period;
        Outcome::admit(
            remaining(after),
            Exact::ratio(after, l),
            queued(debt),
            update(after),
        )
    } else {
        Outcome::deny(
            remaining(debt),
            Some(Exact::ratio(debt - room, l)),
            Exact::ratio(debt, l),
        )
    }
}

/// The units in use of a bucket state (token, leaky or GCRA) at `now`, as a debt in units of
/// 1/L ms (L and P of `policy`, the policy the state was written under). 0 for non-bucket
/// states.
fn debt_at(policy: &Policy, state: &State, now: u64) -> u128 {
    let (l, period, cap) = params(policy);
    let max = cap * period;
    match state.kind {
        Kind::Bucket { debt } => {
            let refill = u128::from(now.saturating_sub(state.updated_ms)) * l;
            u128::from(debt).saturating_sub(refill).min(max)
        }
        Kind::Gcra { tat_ms, tat_frac } => {
            let tat = u128::from(tat_ms) * l + u128::from(tat_frac);
            tat.saturating_sub(u128::from(now) * l).min(max)
        }
        _ => 0,
    }
}

/// A bucket state of `algorithm` (L = `l`) holding `debt` at `now`: a debt for the token and
/// leaky buckets, a TAT = now + debt / L for the GCRA.
fn debt_kind(algorithm: Algorithm, l: u128, debt: u128, now: u64) -> Kind {
    match algorithm {
        Algorithm::Gcra => {
            let tat = u128::from(now) * l + debt;
            Kind::Gcra {
                tat_ms: narrow(tat / l),
                tat_frac: u32::try_from(tat % l).unwrap_or(0),
            }
        }
        _ => Kind::Bucket { debt: narrow(debt) },
    }
}

/// Carry-over between buckets (token bucket, GCRA, leaky bucket, in any combination): the
/// units in use at `now`, rounded up to a whole unit and capped at the new burst, carry over.
pub(super) fn carry_over(from: &Policy, to: &Policy, state: &State, now: u64) -> State {
    let (_, old_p, _) = params(from);
    let (l, p, cap) = params(to);
    let units = debt_at(from, state, now).div_ceil(old_p).min(cap);
    let debt = units * p;
    if debt == 0 {
        return State::fresh_at(now);
    }
    State {
        updated_ms: now,
        kind: debt_kind(to.algorithm(), l, debt, now),
    }
}

/// Refund of a bucket state (token, leaky or GCRA): the debt shrinks by `cost` units, not
/// below empty.
pub(super) fn refund(policy: &Policy, state: &mut State, now: u64, cost: u64) {
    let (l, period, cap) = params(policy);
    let debt = debt_at(policy, state, now);
    let give = u128::from(cost).min(cap) * period;
    let debt = debt.saturating_sub(give);
    state.kind = debt_kind(policy.algorithm(), l, debt, now);
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
