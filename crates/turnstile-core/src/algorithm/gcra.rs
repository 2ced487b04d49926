//! The GCRA (`lua/gcra.lua`): the generic cell rate algorithm with emission interval
//! T = P / L and tolerance τ = (B − 1)·T.
//!
//! State is one theoretical arrival time (TAT), kept exactly as whole milliseconds plus a
//! fraction in units of 1/L ms. Carry-over and refund are the buckets' (see
//! [`bucket`](super::bucket)); only the stored state differs.

use super::{div_ceil, narrow, params, Exact, Kind, Outcome, State, Update};
use crate::policy::Policy;

/// GCRA with emission interval T = P/L and tolerance τ = (B − 1)·T, on a TAT kept exactly
/// in units of 1/L ms. A request of cost c conforms iff TAT − (B − c)·T ≤ now; it then moves
/// the TAT to max(TAT, now) + c·T.
pub(super) fn decide(p: &Policy, s: &State, now: u64, cost: u64) -> Outcome {
    let (l, period, cap) = params(p);
    let now_scaled = u128::from(now) * l;
    let tat = match s.kind {
        Kind::Gcra { tat_ms, tat_frac } => u128::from(tat_ms) * l + u128::from(tat_frac),
        _ => now_scaled,
    }
    .clamp(now_scaled, now_scaled + cap * period);
    let remaining = |tat: u128| narrow(cap - div_ceil(tat - now_scaled, period));
    let until = |tat: u128| Exact::ratio(tat - now_scaled, l);
    let c = u128::from(cost);
    if c > cap {
        return Outcome::deny(remaining(tat), None, until(tat));
    }
    if c == 0 {
        return Outcome::query(remaining(tat), until(tat), Exact::ZERO);
    }
    // The earliest time this request conforms, scaled: TAT − (B − c)·T.
    let allow_at = tat.saturating_sub((cap - c) * period);
    if allow_at <= now_scaled {
        let new_tat = tat + c * period;
        Outcome::admit(
            remaining(new_tat),
            until(new_tat),
            Exact::ZERO,
            Update::Gcra {
                tat_ms: narrow(new_tat / l),
                tat_frac: u32::try_from(new_tat % l).unwrap_or(0),
            },
        )
    } else {
        Outcome::deny(
            remaining(tat),
            Some(Exact::ratio(allow_at - now_scaled, l)),
            until(tat),
        )
    }
}
