//! The six algorithms as pure state transitions: `(state, now, cost) → (state, decision)`.
//!
//! Everything here is integer arithmetic on exact rationals; the emission interval
//! T = P / L is never rounded. Bucket state is kept as a *debt* `D = (B − x)·P` (token bucket:
//! x tokens held; leaky bucket: `D = y·P` with y units queued), an integer in units of
//! 1/L ms, relative to the state's last update. A refill over Δ ms subtracts Δ·L. The GCRA
//! keeps one theoretical arrival time (TAT), exactly, as whole milliseconds plus a fraction
//! in units of 1/L ms.
//!
//! Time is passed in; nothing here reads a clock. A time earlier than the state's last
//! update is taken as that update's time (no panic, no underflow, no quota given back).

use std::collections::VecDeque;
use std::time::Duration;

use crate::decision::{ms_ratio, PolicyDecision};
use crate::few::Few;
use crate::policy::{Algorithm, Policy};

/// One policy's state for one key. A fresh key's state is [`State::default`].
///
/// The state is opaque: it is only ever changed by [`Evaluation::apply`] (or [`check`]),
/// and only for admitted requests with a positive cost.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct State {
    updated_ms: u64,
    kind: Kind,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
enum Kind {
    #[default]
    Fresh,
    /// Token bucket and leaky bucket: debt D in units of 1/L ms at `updated_ms`.
    Bucket { debt: u64 },
    /// GCRA: TAT = tat_ms + tat_frac / L milliseconds since the epoch.
    Gcra { tat_ms: u64, tat_frac: u32 },
    /// Fixed window: count of window index `window`.
    Window { window: u64, count: u64 },
    /// Sliding window counter: counts of window `window` and of the one before it.
    Sliding {
        window: u64,
        current: u64,
        previous: u64,
    },
    /// Sliding log.
    Log(Box<Log>),
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Log {
    /// (time in ms, total cost admitted at that millisecond), oldest first, times distinct.
    entries: VecDeque<(u64, u64)>,
    /// Sum of every entry's cost (expired entries not yet pruned included).
    total: u64,
}

impl State {
    /// A fresh key's state (at full capacity).
    pub fn new() -> Self {
        Self::default()
    }

    /// The time in ms of the last admitted request that changed this state (0 for a fresh
    /// state).
    pub fn updated_ms(&self) -> u64 {
        self.updated_ms
    }

    /// How many sliding-log entries the state holds (0 for other algorithms); at most
    /// min(limit, period in ms) live ones.
    pub fn log_len(&self) -> usize {
        match &self.kind {
            Kind::Log(log) => log.entries.len(),
            _ => 0,
        }
    }
}

/// What applying an admitted request does to the state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Update {
    None,
    Bucket {
        debt: u64,
    },
    Gcra {
        tat_ms: u64,
        tat_frac: u32,
    },
    Window {
        window: u64,
        count: u64,
    },
    Sliding {
        window: u64,
        current: u64,
        previous: u64,
    },
    Log {
        cost: u64,
    },
}

/// The outcome of evaluating one request against one policy's state, not yet applied.
///
/// Holds the decision and the state change it implies; [`Evaluation::apply`] performs the
/// change. Evaluating several policies first and applying all of them only when every one
/// admits gives the all-or-nothing semantics of several policies on one request.
#[derive(Clone, Debug)]
#[must_use = "an evaluation changes nothing until it is applied"]
pub struct Evaluation {
    decision: PolicyDecision,
    update: Update,
    now_ms: u64,
    period_ms: u64,
    expires_at_ms: u64,
}

impl Evaluation {
    /// The policy's decision.
    pub fn decision(&self) -> &PolicyDecision {
        &self.decision
    }

    /// Consumes the evaluation, returning the decision without applying anything.
    pub fn into_decision(self) -> PolicyDecision {
        self.decision
    }

    /// The time the evaluation used: the request's time, or the state's last update if the
    /// request's time was earlier.
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// Whether applying changes the state (an admitted request with a positive cost).
    pub fn changes_state(&self) -> bool {
        self.update != Update::None
    }

    /// The time in ms (same epoch as the request's) from which the state is equivalent to a
    /// fresh one if nothing else arrives: `now + reset_after`, rounded up. Refers to the state
    /// after [`Evaluation::apply`] when [`Evaluation::changes_state`], else to the state as
    /// it was.
    pub fn expires_at_ms(&self) -> u64 {
        self.expires_at_ms
    }

    /// Applies the state change (nothing for a denied request or a query) and returns the
    /// decision. `state` must be the state the evaluation was made from.
    pub fn apply(self, state: &mut State) -> PolicyDecision {
        let kind = match self.update {
            Update::None => return self.decision,
            Update::Bucket { debt } => Kind::Bucket { debt },
            Update::Gcra { tat_ms, tat_frac } => Kind::Gcra { tat_ms, tat_frac },
            Update::Window { window, count } => Kind::Window { window, count },
            Update::Sliding {
                window,
                current,
                previous,
            } => Kind::Sliding {
                window,
                current,
                previous,
            },
            Update::Log { cost } => {
                let mut log = match std::mem::take(&mut state.kind) {
                    Kind::Log(log) => log,
                    _ => Box::default(),
                };
                while let Some(&(at, c)) = log.entries.front() {
                    if at.saturating_add(self.period_ms) > self.now_ms {
                        break;
                    }
                    log.entries.pop_front();
                    log.total -= c;
                }
                match log.entries.back_mut() {
                    Some((at, c)) if *at == self.now_ms => *c += cost,
                    _ => log.entries.push_back((self.now_ms, cost)),
                }
                log.total += cost;
                Kind::Log(log)
            }
        };
        state.kind = kind;
        state.updated_ms = self.now_ms;
        self.decision
    }
}

/// Checks one request of `cost` units at `t_ms` against `policy`, updating `state` if the
/// request is admitted with a positive cost. Never panics, for any inputs.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use turnstile_core::{algorithm, Policy, State};
///
/// # fn main() -> Result<(), turnstile_core::InvalidPolicy> {
/// let p = Policy::token_bucket(3, Duration::from_secs(1))?;
/// let mut s = State::new();
/// for _ in 0..3 {
///     assert!(algorithm::check(&p, &mut s, 0, 1).allowed());
/// }
/// let denied = algorithm::check(&p, &mut s, 0, 1);
/// assert!(!denied.allowed());
/// assert_eq!(denied.retry_after(), Some(Duration::from_nanos(333_333_334)));
/// # Ok(()) }
/// ```
pub fn check(policy: &Policy, state: &mut State, t_ms: u64, cost: u64) -> PolicyDecision {
    evaluate(policy, state, t_ms, cost).apply(state)
}

/// Evaluates one request of `cost` units at `t_ms` against `policy` and `state` without
/// changing anything. Never panics, for any inputs.
///
/// A state of another algorithm's shape (the policy changed) is treated as fresh.
pub fn evaluate(policy: &Policy, state: &State, t_ms: u64, cost: u64) -> Evaluation {
    let now = t_ms.max(state.updated_ms);
    let out = match policy.algorithm() {
        Algorithm::TokenBucket => bucket(policy, state, now, cost, false),
        Algorithm::LeakyBucket => bucket(policy, state, now, cost, true),
        Algorithm::Gcra => gcra(policy, state, now, cost),
        Algorithm::FixedWindow => fixed_window(policy, state, now, cost),
        Algorithm::SlidingWindow => sliding_window(policy, state, now, cost),
        Algorithm::SlidingLog => sliding_log(policy, state, now, cost),
    };
    let reset_ms = out.reset.ceil_ms();
    Evaluation {
        decision: PolicyDecision {
            policy: policy.clone(),
            allowed: out.allowed,
            remaining: out.remaining,
            retry_after: out.retry.map(Exact::duration),
            reset_after: out.reset.duration(),
            delay: out.delay.duration(),
        },
        update: out.update,
        now_ms: now,
        period_ms: policy.period_ms(),
        expires_at_ms: u64::try_from(u128::from(now) + reset_ms).unwrap_or(u64::MAX),
    }
}

/// Evaluates one request of `cost` units at `t_ms` against every policy at once, with the
/// all-or-nothing semantics of `SEMANTICS.md`: `state_of(i)` is policy `i`'s state. If any
/// policy denies, nothing is to be consumed, so each policy that would have admitted reports
/// its fields as if nothing were consumed (its current `remaining` and `reset_after`, no
/// `delay`) and no evaluation changes state. Apply every returned evaluation to its state
/// (denied ones change nothing) and aggregate with [`Decision::from_policies`](crate::Decision::from_policies).
pub fn evaluate_all<'s>(
    policies: &[Policy],
    state_of: impl Fn(usize) -> &'s State,
    t_ms: u64,
    cost: u64,
) -> Vec<Evaluation> {
    evaluate_few(policies, state_of, t_ms, cost).into_vec()
}

/// [`evaluate_all`] without a heap allocation for a single policy.
pub(crate) fn evaluate_few<'s>(
    policies: &[Policy],
    state_of: impl Fn(usize) -> &'s State,
    t_ms: u64,
    cost: u64,
) -> Few<Evaluation> {
    let mut evals: Few<Evaluation> = policies
        .iter()
        .enumerate()
        .map(|(i, p)| evaluate(p, state_of(i), t_ms, cost))
        .collect();
    if evals.as_slice().iter().all(|e| e.decision.allowed) {
        return evals;
    }
    for (i, e) in evals.as_mut_slice().iter_mut().enumerate() {
        if e.decision.allowed && e.update != Update::None {
            let mut query = evaluate(&policies[i], state_of(i), t_ms, 0);
            query.decision.delay = Duration::ZERO;
            *e = query;
        }
    }
    evals
}

/// Converts `state`, last written under `from`, for use under `to`: the carry-over rule when a
/// policy of one name changes its parameters (a redeploy, or an override set at run time).
/// A pure function of its inputs; backends apply it lazily, at each evaluation, and store its
/// result only with the next admitted request, so queries and denials still change nothing.
///
/// The rule, per algorithm (nothing is ever given back that was not, and nothing goes
/// negative):
/// - between buckets (token bucket, GCRA, leaky bucket, in any combination): the units in use
///   at `t_ms` (B − x tokens taken, or y units queued), rounded **up** to a whole unit and
///   capped at the new burst, carry over; they then drain at the new rate;
/// - fixed window → fixed window: with the same period, the current window's count carries
///   over, capped at the new limit; with another period, it carries into the new current
///   window if the state was last written inside it, else the key starts fresh;
/// - sliding window → sliding window: with the same period, both windows' counts carry over,
///   capped at the new limit; with another period, their sum (capped) becomes the count of
///   the new window in which the state was last written, if that is the current or the
///   previous one, else the key starts fresh;
/// - sliding log → sliding log: the log carries over as it is; the new limit and period
///   apply to it (a count above a lowered limit reports `remaining` 0 until entries expire);
/// - anything else (another kind of algorithm): the key starts fresh.
pub fn carry_over(from: &Policy, to: &Policy, state: &State, t_ms: u64) -> State {
    let now = t_ms.max(state.updated_ms);
    let fresh = State {
        updated_ms: now,
        kind: Kind::Fresh,
    };
    let kind = match (from.algorithm(), to.algorithm()) {
        (a, b) if a.is_bucket() && b.is_bucket() => {
            let (_, old_p, _) = params(from);
            let (l, p, cap) = params(to);
            let units = debt_at(from, state, now).div_ceil(old_p).min(cap);
            let debt = units * p;
            if debt == 0 {
                return fresh;
            }
            match b {
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
        (Algorithm::FixedWindow, Algorithm::FixedWindow) => {
            let Kind::Window { window, count } = state.kind else {
                return fresh;
            };
            let count = if window == now / from.period_ms() {
                count
            } else {
                0
            };
            let w = now / to.period_ms();
            if count == 0 || state.updated_ms / to.period_ms() != w {
                return fresh;
            }
            Kind::Window {
                window: w,
                count: count.min(to.limit()),
            }
        }
        (Algorithm::SlidingWindow, Algorithm::SlidingWindow) => {
            let Kind::Sliding {
                window,
                current,
                previous,
            } = state.kind
            else {
                return fresh;
            };
            let w_old = now / from.period_ms();
            let (n, m) = if window == w_old {
                (current, previous)
            } else if window.checked_add(1) == Some(w_old) {
                (0, current)
            } else {
                (0, 0)
            };
            let cap = to.limit();
            let w = now / to.period_ms();
            if from.period_ms() == to.period_ms() {
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
            }
        }
        (Algorithm::SlidingLog, Algorithm::SlidingLog) => return state.clone(),
        _ => return fresh,
    };
    State {
        updated_ms: now,
        kind,
    }
}

/// The units in use of a bucket state at `now`, as a debt in units of 1/L ms (L and P of
/// `policy`, the policy the state was written under). 0 for non-bucket states.
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

/// Gives back `cost` units to `state` at `t_ms` under `policy` (whose parameters the state
/// must already have; see [`carry_over`]): quota used by a request that, after the fact,
/// should not count. Never beyond a fresh key's capacity. Per algorithm:
/// - buckets: the debt shrinks by `cost` units (a token bucket gets `cost` tokens back, a
///   leaky bucket's queue shrinks by `cost` units), not below empty;
/// - fixed window: the current window's count shrinks by `cost`, not below 0 (a past
///   window's count no longer matters);
/// - sliding window: the current window's count shrinks first, then the previous one's;
/// - sliding log: the newest live entries shrink first (and go when they reach 0).
pub fn refund(policy: &Policy, state: &mut State, t_ms: u64, cost: u64) {
    let now = t_ms.max(state.updated_ms);
    if cost == 0 {
        return;
    }
    let (l, period, cap) = params(policy);
    let kind = match &mut state.kind {
        Kind::Fresh => return,
        Kind::Bucket { .. } | Kind::Gcra { .. } => {
            let debt = debt_at(policy, state, now);
            let give = u128::from(cost).min(cap) * period;
            let debt = debt.saturating_sub(give);
            if policy.algorithm() == Algorithm::Gcra {
                let tat = u128::from(now) * l + debt;
                Kind::Gcra {
                    tat_ms: narrow(tat / l),
                    tat_frac: u32::try_from(tat % l).unwrap_or(0),
                }
            } else {
                Kind::Bucket { debt: narrow(debt) }
            }
        }
        Kind::Window { window, count } => {
            if *window != now / policy.period_ms() {
                return;
            }
            Kind::Window {
                window: *window,
                count: count.saturating_sub(cost),
            }
        }
        Kind::Sliding {
            window,
            current,
            previous,
        } => {
            let w = now / policy.period_ms();
            let (n, m) = if *window == w {
                (*current, *previous)
            } else if window.checked_add(1) == Some(w) {
                (0, *current)
            } else {
                return;
            };
            let take = cost.min(n);
            let rest = cost - take;
            Kind::Sliding {
                window: w,
                current: n - take,
                previous: m.saturating_sub(rest),
            }
        }
        Kind::Log(log) => {
            let mut rest = cost;
            while rest > 0 {
                let Some((at, c)) = log.entries.back_mut() else {
                    break;
                };
                if u128::from(*at) + period <= u128::from(now) {
                    break; // expired entries no longer count
                }
                let take = rest.min(*c);
                *c -= take;
                log.total -= take;
                rest -= take;
                if *c == 0 {
                    log.entries.pop_back();
                }
            }
            state.updated_ms = now;
            return;
        }
    };
    state.kind = kind;
    state.updated_ms = now;
}

/// An exact duration of `num / den` milliseconds.
#[derive(Clone, Copy, Debug)]
struct Exact {
    num: u128,
    den: u128,
}

impl Exact {
    const ZERO: Exact = Exact { num: 0, den: 1 };

    fn ms(ms: u128) -> Self {
        Exact { num: ms, den: 1 }
    }

    fn ratio(num: u128, den: u128) -> Self {
        Exact { num, den }
    }

    fn duration(self) -> Duration {
        ms_ratio(self.num, self.den)
    }

    fn ceil_ms(self) -> u128 {
        match (u64::try_from(self.num), u64::try_from(self.den)) {
            (Ok(n), Ok(d)) => u128::from(n.div_ceil(d.max(1))),
            _ => self.num.div_ceil(self.den.max(1)),
        }
    }
}

struct Outcome {
    allowed: bool,
    remaining: u64,
    retry: Option<Exact>,
    reset: Exact,
    delay: Exact,
    update: Update,
}

impl Outcome {
    /// Admitted, with no state change (a query, cost 0).
    fn query(remaining: u64, reset: Exact, delay: Exact) -> Self {
        Outcome {
            allowed: true,
            remaining,
            retry: Some(Exact::ZERO),
            reset,
            delay,
            update: Update::None,
        }
    }

    /// Denied: changes nothing. `retry` is `None` when no wait can help.
    fn deny(remaining: u64, retry: Option<Exact>, reset: Exact) -> Self {
        Outcome {
            allowed: false,
            remaining,
            retry,
            reset,
            delay: Exact::ZERO,
            update: Update::None,
        }
    }

    fn admit(remaining: u64, reset: Exact, delay: Exact, update: Update) -> Self {
        Outcome {
            allowed: true,
            remaining,
            retry: Some(Exact::ZERO),
            reset,
            delay,
            update,
        }
    }
}

fn narrow(v: u128) -> u64 {
    // Every value narrowed here is bounded by max(L, B)·P ≤ 2^53 − 1 or by a u64 input.
    u64::try_from(v).unwrap_or(u64::MAX)
}

/// Token bucket (`leaky = false`) and leaky bucket (`leaky = true`), which admit the same
/// requests: with debt D = (B − x)·P = y·P, admit iff D ≤ (B − c)·P.
fn bucket(p: &Policy, s: &State, now: u64, cost: u64, leaky: bool) -> Outcome {
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
    bucket_decide(l, period, cap, debt, cost, leaky, |d| Update::Bucket {
        debt: narrow(d),
    })
}

/// The shared decision of the debt-based buckets. `debt` is in units of 1/L ms, ≤ B·P.
fn bucket_decide(
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

/// GCRA with emission interval T = P/L and tolerance τ = (B − 1)·T, on a TAT kept exactly
/// in units of 1/L ms. A request of cost c conforms iff TAT − (B − c)·T ≤ now; it then moves
/// the TAT to max(TAT, now) + c·T.
fn gcra(p: &Policy, s: &State, now: u64, cost: u64) -> Outcome {
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

fn fixed_window(p: &Policy, s: &State, now: u64, cost: u64) -> Outcome {
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

fn sliding_window(p: &Policy, s: &State, now: u64, cost: u64) -> Outcome {
    let (limit, period) = (u128::from(p.limit()), u128::from(p.period_ms()));
    let now128 = u128::from(now);
    let window = now / p.period_ms();
    let start = u128::from(window) * period;
    let e = now128 - start;
    let (n, m) = match s.kind {
        Kind::Sliding {
            window: w,
            current,
            previous,
        } if w == window => (u128::from(current), u128::from(previous)),
        Kind::Sliding {
            window: w, current, ..
        } if w.checked_add(1) == Some(window) => (0, u128::from(current)),
        _ => (0, 0),
    };
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

fn sliding_log(p: &Policy, s: &State, now: u64, cost: u64) -> Outcome {
    let (limit, period) = (p.limit(), p.period_ms());
    let empty = Log::default();
    let log = match &s.kind {
        Kind::Log(log) => log.as_ref(),
        _ => &empty,
    };
    // An entry logged at s expires at exactly s + P: live iff s + P > now.
    let live = |&&(at, _): &&(u64, u64)| u128::from(at) + u128::from(period) > u128::from(now);
    let expired: u64 = log
        .entries
        .iter()
        .take_while(|e| !live(e))
        .map(|e| e.1)
        .sum();
    let used = log.total - expired;
    let newest = log.entries.back().filter(|e| live(e)).map(|e| e.0);
    let until_expiry = |at: u64| Exact::ms(u128::from(at) + u128::from(period) - u128::from(now));
    let reset = newest.map_or(Exact::ZERO, until_expiry);
    if cost > limit {
        return Outcome::deny(limit.saturating_sub(used), None, reset);
    }
    if cost == 0 {
        return Outcome::query(limit.saturating_sub(used), reset, Exact::ZERO);
    }
    if used <= limit - cost {
        return Outcome::admit(
            limit - used - cost,
            until_expiry(now),
            Exact::ZERO,
            Update::Log { cost },
        );
    }
    let need = used + cost - limit;
    let mut freed = 0;
    let mut retry = reset;
    for &(at, c) in log.entries.iter().skip_while(|e| !live(e)) {
        freed += c;
        if freed >= need {
            retry = until_expiry(at);
            break;
        }
    }
    Outcome::deny(limit.saturating_sub(used), Some(retry), reset)
}

/// ⌈a / b⌉ for b ≥ 1, in 64-bit arithmetic when both fit (128-bit division is slow).
fn div_ceil(a: u128, b: u128) -> u128 {
    match (u64::try_from(a), u64::try_from(b)) {
        (Ok(a), Ok(b)) => u128::from(a.div_ceil(b.max(1))),
        _ => a.div_ceil(b.max(1)),
    }
}

/// (L, P, capacity) as u128.
fn params(p: &Policy) -> (u128, u128, u128) {
    (
        u128::from(p.limit()),
        u128::from(p.period_ms()),
        u128::from(p.capacity()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn clock_stepping_back_uses_last_update_and_gives_nothing_back() {
        for alg in Algorithm::ALL {
            let p = Policy::new(alg, 2, Duration::from_secs(1)).unwrap();
            let mut s = State::new();
            assert!(check(&p, &mut s, 10_000, 1).allowed());
            assert!(check(&p, &mut s, 10_000, 1).allowed());
            // The clock reads 5 s earlier: no underflow, no extra quota.
            let back = check(&p, &mut s, 5_000, 1);
            assert!(!back.allowed(), "{alg}");
            assert_eq!(s.updated_ms(), 10_000);
        }
    }

    #[test]
    fn cost_above_capacity_is_never_and_extreme_inputs_do_not_panic() {
        for alg in Algorithm::ALL {
            let p = Policy::new(alg, 5, Duration::from_millis(7)).unwrap();
            let mut s = State::new();
            let d = check(&p, &mut s, 0, u64::MAX);
            assert!(!d.allowed());
            assert_eq!(d.retry_after(), None);
            assert_eq!(s, State::new());
            let last = crate::MAX_REQUEST_VALUE;
            let d = check(&p, &mut s, last, 5);
            assert!(d.allowed(), "{alg}");
            let d = check(&p, &mut s, last, 1);
            assert!(!d.allowed(), "{alg}");
            let big = Policy::new(alg, u32::MAX.into(), Duration::from_millis(1)).unwrap();
            let mut s = State::new();
            assert!(check(&big, &mut s, 1 << 53, u32::MAX.into()).allowed());
        }
    }

    #[test]
    fn sliding_log_keeps_one_entry_per_millisecond() {
        let p = policy("sliding-log:limit=1000,period=10ms");
        let mut s = State::new();
        for t in 0..100 {
            for _ in 0..5 {
                check(&p, &mut s, t, 1);
            }
            assert!(s.log_len() <= 10);
        }
    }
}
