//! The GCRA (`lua/gcra.lua`): the generic cell rate algorithm with emission interval
//! T = P / L and tolerance τ = (B − 1)·T.
//!
//! State is one theoretical arrival time (TAT), kept exactly as whole milliseconds plus a
//! fraction in units of 1/L ms. It is compared with now relative to now, as a debt
//! D = (TAT − now)·L ≤ B·P, and decided by the token bucket's decision on that debt: a
//! request of cost c conforms iff TAT − (B − c)·T ≤ now, i.e. D ≤ (B − c)·P; it then moves
//! the TAT to max(TAT, now) + c·T. Carry-over and refund are the buckets' (see
//! [`bucket`](super::bucket)); only the stored state differs.

use super::{bucket, narrow, params, Kind, Outcome, State, Update};
use crate::policy::Policy;

/// GCRA with emission interval T = P/L and tolerance τ = (B − 1)·T, on a TAT kept exactly
/// in units of 1/L ms: the bucket decision on the debt D = TAT − now (scaled).
pub(super) fn decide(p: &Policy, s: &State, now: u64, cost: u64) -> Outcome {
    let (l, period, cap) = params(p);
    let now_scaled = u128::from(now) * l;
    let tat = match s.kind {
        Kind::Gcra { tat_ms, tat_frac } => u128::from(tat_ms) * l + u128::from(tat_frac),
        _ => now_scaled,
    }
    .clamp(now_scaled, now_scaled + cap * period);
    bucket::decide_debt(l, period, cap, tat - now_scaled, cost, false, |after| {
        let new_tat = now_scaled + after;
        Update::Gcra {
            tat_ms: narrow(new_tat / l),
            tat_frac: u32::try_from(new_tat % l).unwrap_or(0),
        }
    })
}
