//! Sliding window counter (`lua/sliding_window.lua`): windows as in fixed window, the counts
//! n of the current window w and m of window w − 1, and the estimate
//! est = m·(P − e)/P + n with e = now − w·P.

use super::{narrow, Exact, Kind, Outcome, State, Update};
use crate::policy::Policy;

/// Admit iff est + c ≤ L, then n += c; compared without rounding as
/// m·(P − e) ≤ (L − n − c)·P.
pub(super) fn decide(p: &Policy, s: &State, now: u64, cost: u64) -> Outcome {
    let (limit, period) = (u128::from(p.limit()), u128::from(p.period_ms()));
    let now128 = u128::from(now);
    let window = now / p.period_ms();
    let start = u128::from(window) * period;
    let e = now128 - start;
    let (n, m) = counts(&s.kind, window).unwrap_or((0, 0));
    let (n, m) = (u128::from(n), u128::from(m));
    // est = m·(P − e)/P + n; remaining = max(0, floor(L − est)) = floor(((L − n)·P − m·(P − e)) / P).
    let weighted = m * (period - e);
    let remaining =
        |n: u128| narrow((limit.saturating_sub(n) * period).saturating_sub(weighted) / period);
    let reset = |n: u128| {
        if n > 0 {
            Exact::ms(start + 2 * period - now128)
        } else if m > 0 {
            Exact::ms(start + period - now128)
        } else {
            Exact::ZERO
        }
    };
    let c = u128::from(cost);
    if c > limit {
        return Outcome::deny(remaining(n), None, reset(n));
    }
    if c == 0 {
        return Outcome::query(remaining(n), reset(n), Exact::ZERO);
    }
    if n + c > limit {
        // Wait for the next window, where m' = n and n' = 0: d = (P − e) + P·(n + c − L)/n.
        let retry = Exact::ratio((period - e) * n + period * (n + c - limit), n);
        return Outcome::deny(remaining(n), Some(retry), reset(n));
    }
    if weighted <= (limit - n - c) * period {
        let current = n + c;
        Outcome::admit(
            remaining(current),
            reset(current),
            Exact::ZERO,
            Update::Sliding {
                window,
                current: narrow(current),
                previous: narrow(m),
            },
        )
    } else {
        // The previous window's weight must decay: d = P − (L − n − c)·P/m − e.
        let retry = Exact::ratio(weighted - (limit - n - c) * period, m);
        Outcome::deny(remaining(n), Some(retry), reset(n))
    }
}

/// The counts (n, m) of window `window` and of the one before it, as the sliding state
/// `kind` (written in its own window) gives them; `None` when it is no sliding state or
/// older than the window before.
fn counts(kind: &Kind, window: u64) -> Option<(u64, u64)> {
    let Kind::Sliding {
        window: w,
        current,
        previous,
    } = *kind
    else {
        return None;
    };
    if w == window {
        Some((current, previous))
    } else if w.checked_add(1) == Some(window) {
        Some((0, current))
    } else {
        None
    }
}

/// Carry-over from sliding window to sliding window: with the same period, both windows'
/// counts carry over, capped at the new limit; with another period, their sum (capped)
/// becomes the count of the new window in which the state was last written, if that is the
/// current or the previous one, else the key starts fresh.
pub(super) fn carry_over(from: &Policy, to: &Policy, state: &State, now: u64) -> State {
    let fresh = State::fresh_at(now);
    if !matches!(state.kind, Kind::Sliding { .. }) {
        return fresh;
    }
    let (n, m) = counts(&state.kind, now / from.period_ms()).unwrap_or((0, 0));
    let cap = to.limit();
    let w = now / to.period_ms();
    let kind = if from.period_ms() == to.period_ms() {
        if n == 0 && m == 0 {
            return fresh;
        }
        Kind::Sliding {
            window: w,
            current: n.min(cap),
            previous: m.min(cap),
        }
    } else {
        let total = n.saturating_add(m).min(cap);
        let written = state.updated_ms / to.period_ms();
        if total == 0 {
            return fresh;
        } else if written == w {
            Kind::Sliding {
                window: w,
                current: total,
                previous: 0,
            }
        } else if written.checked_add(1) == Some(w) {
            Kind::Sliding {
                window: w,
                current: 0,
                previous: total,
            }
        } else {
            return fresh;
        }
    };
    State {
        updated_ms: now,
        kind,
    }
}

/// Refund of a sliding window state: the current window's count shrinks first, then the
/// previous one's.
pub(super) fn refund(policy: &Policy, state: &mut State, now: u64, cost: u64) {
    let w = now / policy.period_ms();
    let Some((n, m)) = counts(&state.kind, w) else {
        return;
    };
    let take = cost.min(n);
    let rest = cost - take;
    state.kind = Kind::Sliding {
        window: w,
        current: n - take,
        previous: m.saturating_sub(rest),
    };
    state.updated_ms = now;
}
