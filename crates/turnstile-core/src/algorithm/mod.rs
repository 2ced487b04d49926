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
//!
//! One file per algorithm family, each beside its twin in `lua/`: `bucket` (token bucket
//! and leaky bucket), `gcra`, `fixed_window`, `sliding_window` and `sliding_log`.
//! Each holds the family's decision and its branch of carry-over and refund (the GCRA's are
//! the buckets'); this module holds the state, the evaluation and the dispatch.

mod bucket;
mod fixed_window;
mod gcra;
mod sliding_log;
mod sliding_window;

use crate::decision::{span_ratio, PolicyDecision, Span};
use crate::few::Few;
use crate::policy::{Algorithm, Policy};
use crate::shared::SharedPolicy;
use sliding_log::Log;

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
            Kind::Log(log) => log.len(),
            _ => 0,
        }
    }

    /// A fresh state last updated at `now`: what carry-over gives a key that starts fresh.
    fn fresh_at(now: u64) -> Self {
        State {
            updated_ms: now,
            kind: Kind::Fresh,
        }
    }
}

/// A state in a few words, for the in-memory backend's entries that hold one policy without
/// a heap allocation: `kind` says which shape (0 fresh, 1 bucket, 2 GCRA, 3 fixed window),
/// `a` is the last update's time in ms, `b` and `c` the shape's fields. A GCRA's TAT is
/// packed as the debt it stands for at its last update, (TAT − a)·L in units of 1/L ms —
/// the token bucket's form, so both decide on the packed words alike. The sliding window
/// and the sliding log do not pack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Packed {
    pub(crate) kind: u8,
    pub(crate) a: u64,
    pub(crate) b: u64,
    pub(crate) c: u32,
}

impl State {
    /// The state packed, if its shape packs (see [`Packed`]); `limit` is L of the policy the
    /// state belongs to.
    pub(crate) fn pack(&self, limit: u64) -> Option<Packed> {
        let a = self.updated_ms;
        Some(match self.kind {
            Kind::Fresh => Packed {
                kind: 0,
                a,
                b: 0,
                c: 0,
            },
            Kind::Bucket { debt } => Packed {
                kind: 1,
                a,
                b: debt,
                c: 0,
            },
            Kind::Gcra { tat_ms, tat_frac } => Packed {
                kind: 2,
                a,
                // TAT·L − a·L; a TAT before the last update (never written) does not pack.
                b: tat_ms
                    .checked_sub(a)?
                    .checked_mul(limit)?
                    .checked_add(u64::from(tat_frac))?,
                c: 0,
            },
            Kind::Window { window, count } => Packed {
                kind: 3,
                a,
                b: window,
                c: u32::try_from(count).ok()?,
            },
            Kind::Sliding { .. } | Kind::Log(_) => return None,
        })
    }

    /// The state [`State::pack`] packed with the same `limit` (an unknown kind reads as
    /// fresh).
    pub(crate) fn unpack(p: Packed, limit: u64) -> State {
        let l = limit.max(1);
        let kind = match p.kind {
            1 => Kind::Bucket { debt: p.b },
            2 => Kind::Gcra {
                tat_ms: p.a.saturating_add(p.b / l),
                tat_frac: (p.b % l) as u32,
            },
            3 => Kind::Window {
                window: p.b,
                count: u64::from(p.c),
            },
            _ => Kind::Fresh,
        };
        State {
            updated_ms: p.a,
            kind,
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
    eval: Eval,
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
        self.eval.now_ms
    }

    /// Whether applying changes the state (an admitted request with a positive cost).
    pub fn changes_state(&self) -> bool {
        self.eval.changes_state()
    }

    /// The time in ms (same epoch as the request's) from which the state is equivalent to a
    /// fresh one if nothing else arrives: `now + reset_after`, rounded up. Refers to the state
    /// after [`Evaluation::apply`] when [`Evaluation::changes_state`], else to the state as
    /// it was.
    pub fn expires_at_ms(&self) -> u64 {
        self.eval.expires_at_ms
    }

    /// Applies the state change (nothing for a denied request or a query) and returns the
    /// decision. `state` must be the state the evaluation was made from.
    pub fn apply(self, state: &mut State) -> PolicyDecision {
        self.eval.apply(state);
        self.decision
    }
}

/// An evaluation without its policy: what the backends work with, turning it into a
/// [`PolicyDecision`] with the policy they share ([`Eval::decision`]).
#[derive(Clone, Debug)]
pub(crate) struct Eval {
    pub(crate) allowed: bool,
    pub(crate) remaining: u64,
    pub(crate) retry_after: Option<Span>,
    pub(crate) reset_after: Span,
    pub(crate) delay: Span,
    update: Update,
    pub(crate) now_ms: u64,
    period_ms: u64,
    pub(crate) expires_at_ms: u64,
}

impl Eval {
    /// Whether applying changes the state (an admitted request with a positive cost).
    pub(crate) fn changes_state(&self) -> bool {
        self.update != Update::None
    }

    /// The policy's decision, for `policy` (the one evaluated).
    pub(crate) fn decision(&self, policy: SharedPolicy) -> PolicyDecision {
        PolicyDecision::from_spans(
            policy,
            self.allowed,
            self.remaining,
            self.retry_after,
            self.reset_after,
            self.delay,
        )
    }

    /// Applies the state change (nothing for a denied request or a query). `state` must be
    /// the state the evaluation was made from.
    pub(crate) fn apply(&self, state: &mut State) {
        let kind = match self.update {
            Update::None => return,
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
            Update::Log { cost } => sliding_log::append(
                std::mem::take(&mut state.kind),
                self.now_ms,
                self.period_ms,
                cost,
            ),
        };
        state.kind = kind;
        state.updated_ms = self.now_ms;
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
    let eval = eval(policy, state, t_ms, cost);
    Evaluation {
        decision: eval.decision(SharedPolicy::new(policy.clone())),
        eval,
    }
}

/// [`evaluate`] without the policy in the result.
pub(crate) fn eval(policy: &Policy, state: &State, t_ms: u64, cost: u64) -> Eval {
    let now = t_ms.max(state.updated_ms);
    let out = match policy.algorithm() {
        Algorithm::TokenBucket => bucket::decide(policy, state, now, cost, false),
        Algorithm::LeakyBucket => bucket::decide(policy, state, now, cost, true),
        Algorithm::Gcra => gcra::decide(policy, state, now, cost),
        Algorithm::FixedWindow => fixed_window::decide(policy, state, now, cost),
        Algorithm::SlidingWindow => sliding_window::decide(policy, state, now, cost),
        Algorithm::SlidingLog => sliding_log::decide(policy, state, now, cost),
    };
    let reset_after = out.reset.span();
    Eval {
        allowed: out.allowed,
        remaining: out.remaining,
        retry_after: out.retry.map(Exact::span),
        reset_after,
        delay: out.delay.span(),
        update: out.update,
        now_ms: now,
        period_ms: policy.period_ms(),
        // ⌈reset⌉ in ms from the span rounded up to ns: ⌈⌈x·10⁶⌉ / 10⁶⌉ = ⌈x⌉, without a
        // second division by the policy's limit.
        expires_at_ms: now.saturating_add(reset_after.ceil_ms()),
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
    eval_all(policies, state_of, t_ms, cost)
        .into_iter()
        .zip(policies)
        .map(|(eval, p)| Evaluation {
            decision: eval.decision(SharedPolicy::new(p.clone())),
            eval,
        })
        .collect()
}

/// [`evaluate_all`] without the policies in the results, and without a heap allocation for a
/// single policy.
pub(crate) fn eval_all<'s>(
    policies: &[Policy],
    state_of: impl Fn(usize) -> &'s State,
    t_ms: u64,
    cost: u64,
) -> Few<Eval> {
    let mut evals: Few<Eval> = policies
        .iter()
        .enumerate()
        .map(|(i, p)| eval(p, state_of(i), t_ms, cost))
        .collect();
    if evals.as_slice().iter().all(|e| e.allowed) {
        return evals;
    }
    for (i, e) in evals.as_mut_slice().iter_mut().enumerate() {
        if e.allowed && e.update != Update::None {
            let mut query = eval(&policies[i], state_of(i), t_ms, 0);
            query.delay = Span::ZERO;
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
///   a log whose entries all expired under the old period is a fresh key's (its
///   `reset_after` elapsed), even where a longer new period would make them live again;
/// - anything else (another kind of algorithm): the key starts fresh.
pub fn carry_over(from: &Policy, to: &Policy, state: &State, t_ms: u64) -> State {
    let now = t_ms.max(state.updated_ms);
    match (from.algorithm(), to.algorithm()) {
        (a, b) if a.is_bucket() && b.is_bucket() => bucket::carry_over(from, to, state, now),
        (Algorithm::FixedWindow, Algorithm::FixedWindow) => {
            fixed_window::carry_over(from, to, state, now)
        }
        (Algorithm::SlidingWindow, Algorithm::SlidingWindow) => {
            sliding_window::carry_over(from, to, state, now)
        }
        (Algorithm::SlidingLog, Algorithm::SlidingLog) => {
            sliding_log::carry_over(from.period_ms(), state, now)
        }
        _ => State::fresh_at(now),
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
///
/// The branch is chosen by the shape of the stored state (each shape belongs to one family);
/// a fresh state has nothing to give back.
pub fn refund(policy: &Policy, state: &mut State, t_ms: u64, cost: u64) {
    let now = t_ms.max(state.updated_ms);
    if cost == 0 {
        return;
    }
    match state.kind {
        Kind::Fresh => {}
        Kind::Bucket { .. } | Kind::Gcra { .. } => bucket::refund(policy, state, now, cost),
        Kind::Window { .. } => fixed_window::refund(policy, state, now, cost),
        Kind::Sliding { .. } => sliding_window::refund(policy, state, now, cost),
        Kind::Log(_) => sliding_log::refund(policy, state, now, cost),
    }
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

    fn span(self) -> Span {
        span_ratio(self.num, self.den)
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn states_pack_and_unpack_unchanged() {
        // Every shape but the sliding ones, after a few admitted requests of every algorithm.
        for alg in Algorithm::ALL {
            let p = Policy::new(alg, 7, Duration::from_millis(1_300)).unwrap();
            let mut s = State::new();
            assert_eq!(State::unpack(s.pack(7).unwrap(), 7), s);
            for t in [5, 5, 900, 2_000, 2_001] {
                check(&p, &mut s, t, 2);
                match s.pack(7) {
                    Some(packed) => assert_eq!(State::unpack(packed, 7), s, "{alg}"),
                    None => assert!(
                        matches!(alg, Algorithm::SlidingLog | Algorithm::SlidingWindow),
                        "{alg}"
                    ),
                }
            }
        }
        let carried = State::fresh_at(77);
        assert_eq!(State::unpack(carried.pack(7).unwrap(), 7), carried);
        // A GCRA state whose TAT lies before its last update does not pack.
        let early = State {
            updated_ms: 10,
            kind: Kind::Gcra {
                tat_ms: 9,
                tat_frac: 3,
            },
        };
        assert_eq!(early.pack(7), None);
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
            let last = crate::policy::MAX_REQUEST_VALUE;
            let d = check(&p, &mut s, last, 5);
            assert!(d.allowed(), "{alg}");
            let d = check(&p, &mut s, last, 1);
            assert!(!d.allowed(), "{alg}");
            let big = Policy::new(alg, u32::MAX.into(), Duration::from_millis(1)).unwrap();
            let mut s = State::new();
            assert!(check(&big, &mut s, 1 << 53, u32::MAX.into()).allowed());
        }
    }
}
