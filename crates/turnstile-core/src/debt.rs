//! The buckets' decision on a debt — token bucket, leaky bucket, and the GCRA on its debt
//! D = (TAT − now)·L — written once (`SEMANTICS.md`'s "Exactness"; its Lua twin is
//! `lua/bucket.lua`). The general evaluation (`algorithm::bucket`, `algorithm::gcra`), the
//! in-memory backend's decision on its packed words (`memory::fast`) and a bucket decision's
//! fields (`decision::fields`, read on demand) all call it.
//!
//! A debt is (B − x)·P for x tokens held, or y·P for y units queued: an integer in units of
//! 1/L ms, at most B·P ≤ 2^53 − 1, so every intermediate fits a `u64`.

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

/// A bucket's decision (token bucket, GCRA, leaky bucket) as debts in units of 1/L ms: what
/// [`decide_debt`], the one copy of the buckets' arithmetic, answers. The decision's fields
/// follow from it: `remaining` = [`remaining`]`(after)`, `reset_after` = `after` / L ms,
/// `retry_after` per [`Retry`] (its debt / L ms), `delay` = `delay` / L ms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Debts {
    /// Whether the request is admitted.
    pub(crate) allowed: bool,
    /// The debt after the decision (the debt before it, when nothing is consumed).
    pub(crate) after: u64,
    /// The wait of a denial, as the debt it waits out.
    pub(crate) retry: Retry,
    /// A leaky bucket's queue ahead of an admitted request (its `delay`); 0 otherwise.
    pub(crate) delay: u64,
}

/// The debt at a bucket's last update, `stored`, refilled over `elapsed` ms at L = `l` per
/// ms of debt: not below empty, and capped at `max` (B·P of the policy deciding: a state
/// written under a larger capacity keeps its debt, capped at this one's). A refill Δ·L that
/// overflows saturates, which empties the debt as the exact product would.
#[inline(always)]
pub(crate) fn refilled(stored: u64, elapsed: u64, l: u64, max: u64) -> u64 {
    stored.saturating_sub(elapsed.saturating_mul(l)).min(max)
}

/// The one decision of every bucket — token bucket, leaky bucket (`leaky`), and the GCRA on
/// its debt D = (TAT − now)·L — on a debt `debt` ≤ B·P already refilled to now (units of 1/L
/// ms; `period` P in ms, `cap` B): admit iff D ≤ (B − c)·P, then D += c·P. A cost above the
/// capacity is denied before any arithmetic on it, so every intermediate stays at or below
/// B·P ≤ 2^53 − 1 and fits a `u64`.
#[inline(always)]
pub(crate) fn decide_debt(period: u64, cap: u64, debt: u64, cost: u64, leaky: bool) -> Debts {
    let queued = if leaky { debt } else { 0 };
    let (allowed, after, retry, delay) = if cost > cap {
        (false, debt, Retry::Never, 0)
    } else if cost == 0 {
        (true, debt, Retry::Zero, queued)
    } else {
        let room = (cap - cost) * period;
        if debt <= room {
            (true, debt + cost * period, Retry::Zero, queued)
        } else {
            (false, debt, Retry::After(debt - room), 0)
        }
    };
    Debts {
        allowed,
        after,
        retry,
        delay,
    }
}

/// A bucket's `remaining` at debt `debt`: floor(x) = B − ⌈D / P⌉ (`cap` B, `period` P).
#[inline]
pub(crate) fn remaining(cap: u64, period: u64, debt: u64) -> u64 {
    cap.saturating_sub(debt.div_ceil(period.max(1)))
}
