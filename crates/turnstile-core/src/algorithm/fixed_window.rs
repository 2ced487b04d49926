//! Fixed window (`lua/fixed_window.lua`): window index w = floor(now / P) from the epoch, and
//! the count of units admitted in window w.

use super::{Exact, Kind, Outcome, State, Update};
use crate::policy::Policy;

/// Admit iff n + c ≤ L, then n += c, n counting the current window only.
pub(super) fn decide(p: &Policy, s: &State, now: u64, cost: u64) -> Outcome {
    let (limit, period) = (p.limit(), p.period_ms());
    let window = now / period;
    let n = match s.kind {
        Kind::Window { window: w, count } if w == window => count,
        _ => 0,
    };
    let to_end = Exact::ms(u128::from(window + 1) * u128::from(period) - u128::from(now));
    let reset = |n: u64| if n > 0 { to_end } else { Exact::ZERO };
    if cost > limit {
        return Outcome::deny(limit.saturating_sub(n), None, reset(n));
    }
    if cost == 0 {
        return Outcome::query(limit.saturating_sub(n), reset(n), Exact::ZERO);
    }
    if n <= limit - cost {
        let count = n + cost;
        Outcome::admit(
            limit - count,
            reset(count),
            Exact::ZERO,
            Update::Window { window, count },
        )
    } else {
        Outcome::deny(limit.saturating_sub(n), Some(to_end), reset(n))
    }
}

/// Carry-over from fixed window to fixed window: with the same period, the current window's
/// count carries over, capped at the new limit; with another period, it carries into the new
/// current window if the state was last written inside it, else the key starts fresh.
pub(super) fn carry_over(from: &Policy, to: &Policy, state: &State, now: u64) -> State {
    let Kind::Window { window, count } = state.kind else {
        return State::fresh_at(now);
    };
    let count = if window == now / from.period_ms() {
        count
    } else {
        0
    };
    let w = now / to.period_ms();
    if count == 0 || state.updated_ms / to.period_ms() != w {
        return State::fresh_at(now);
    }
    State {
        updated_ms: now,
        kind: Kind::Window {
            window: w,
            count: count.min(to.limit()),
        },
    }
}

/// Refund of a fixed window state: the current window's count shrinks by `cost`, not below
/// 0 (a past window's count no longer matters).
pub(super) fn refund(policy: &Policy, state: &mut State, now: u64, cost: u64) {
    let Kind::Window { window, count } = state.kind else {
        return;
    };
    if window != now / policy.period_ms() {
        return;
    }
    state.kind = Kind::Window {
        window,
        count: count.saturating_sub(cost),
    };
    state.updated_ms = now;
}
