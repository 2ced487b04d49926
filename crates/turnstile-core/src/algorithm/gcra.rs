//! The GCRA (`lua/gcra.lua`): the generic cell rate algorithm with emission interval
//! T = P / L and tolerance τ = (B − 1)·T.
//!
//! State is one theoretical arrival time (TAT), kept exactly as whole milliseconds plus a
//! fraction in units of 1/L ms. It is compared with now relative to now, as a debt
//! D = (TAT − now)·L ≤ B·P, and decided by the token bucket's decision on that debt: a
//! request of cost c conforms iff TAT − (B − c)·T ≤ now, i.e. D ≤ (B − c)·P; it then moves
//! the TAT to max(TAT, now) + c·T. Carry-over and refund are the buckets' (see
//! [`bucket`](super::bucket)); only the stored state differs.

use super::{bucket, narrow, Kind, Outcome, State, Update};
use crate::debt::decide_debt;
use crate::policy::Policy;

/// GCRA with emission interval T = P/L and tolerance τ = (B − 1)·T, on a TAT kept exactly
/// in units of 1/L ms: the buckets' decision ([`bucket::decide_debt`]) on the debt
/// D = (TAT − now)·L.
pub(super) fn decide(p: &Policy, s: &State, now: u64, cost: u64) -> Outcome {
    let l = p.limit();
    let debt = match s.kind {
        Kind::Gcra { tat_ms, tat_frac } => debt_at(tat_ms, tat_frac, now, l, bucket::max_debt(p)),
        _ => 0,
    };
    let d = decide_debt(p.period_ms(), p.capacity(), debt, cost, false);
    bucket::outcome(p, d, cost, |after| tat_kind_update(now, after, l))
}

/// The debt (TAT − now)·L at `now` of the TAT `tat_ms` + `tat_frac` / L ms (L = `l`): 0 when
/// the TAT is not after now, capped at `max` (B·P).
pub(super) fn debt_at(tat_ms: u64, tat_frac: u32, now: u64, l: u64, max: u64) -> u64 {
    let tat = u128::from(tat_ms) * u128::from(l) + u128::from(tat_frac);
    narrow(tat.saturating_sub(u128::from(now) * u128::from(l))).min(max)
}

/// The TAT of a debt `debt` (units of 1/L ms, L = `l`) at `now`: now + debt / L ms, as whole
/// ms and the fraction in units of 1/L ms.
fn tat_of(now: u64, debt: u64, l: u64) -> (u64, u32) {
    let l = u128::from(l.max(1));
    let tat = u128::from(now) * l + u128::from(debt);
    (narrow(tat / l), u32::try_from(tat % l).unwrap_or(0))
}

/// The GCRA state holding `debt` at `now`.
pub(super) fn tat_kind(now: u64, debt: u64, l: u64) -> Kind {
    let (tat_ms, tat_frac) = tat_of(now, debt, l);
    Kind::Gcra { tat_ms, tat_frac }
}

/// The update of an admission that leaves the debt `after` at `now`.
fn tat_kind_update(now: u64, after: u64, l: u64) -> Update {
    let (tat_ms, tat_frac) = tat_of(now, after, l);
    Update::Gcra { tat_ms, tat_frac }
}
