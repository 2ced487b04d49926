//! Sliding log (`lua/sliding_log.lua`): a log of admitted (time, cost), one entry per
//! distinct millisecond; an entry logged at s expires at exactly s + P.

use std::collections::VecDeque;

use super::{Exact, Kind, Outcome, State, Update};
use crate::policy::Policy;

/// A sliding log's state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Log {
    /// (time in ms, total cost admitted at that millisecond), oldest first, times distinct.
    entries: VecDeque<(u64, u64)>,
    /// Sum of every entry's cost (expired entries not yet pruned included).
    total: u64,
}

impl Log {
    /// How many entries the log holds (expired ones not yet pruned included).
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }
}

/// used = the live entries' cost; admit iff used + c ≤ L, then log (now, c).
pub(super) fn decide(p: &Policy, s: &State, now: u64, cost: u64) -> Outcome {
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

/// The state `kind` (a log, or anything else, taken as an empty log) after logging `cost` at
/// `now` under period `period_ms`: expired entries are pruned, and the cost joins the entry
/// of `now` if there is one.
pub(super) fn append(kind: Kind, now: u64, period_ms: u64, cost: u64) -> Kind {
    let mut log = match kind {
        Kind::Log(log) => log,
        _ => Box::default(),
    };
    while let Some(&(at, c)) = log.entries.front() {
        if at.saturating_add(period_ms) > now {
            break;
        }
        log.entries.pop_front();
        log.total -= c;
    }
    match log.entries.back_mut() {
        Some((at, c)) if *at == now => *c += cost,
        _ => log.entries.push_back((now, cost)),
    }
    log.total += cost;
    Kind::Log(log)
}

/// Carry-over from sliding log to sliding log: the log carries over as it is; the new limit
/// and period apply to it. A log whose every entry expired under the old period `from_ms`
/// (its `reset_after` elapsed) is a fresh key's, whether or not it was dropped yet: a longer
/// new period never revives it.
pub(super) fn carry_over(from_ms: u64, state: &State, now: u64) -> State {
    let Kind::Log(log) = &state.kind else {
        return State::fresh_at(now);
    };
    match log.entries.back() {
        Some(&(at, _)) if u128::from(at) + u128::from(from_ms) > u128::from(now) => state.clone(),
        _ => State::fresh_at(now),
    }
}

/// Refund of a sliding log state: the newest live entries shrink first (and go when they
/// reach 0).
pub(super) fn refund(policy: &Policy, state: &mut State, now: u64, cost: u64) {
    let Kind::Log(log) = &mut state.kind else {
        return;
    };
    let period = u128::from(policy.period_ms());
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
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::{check, State};
    use crate::policy::Policy;

    fn policy(s: &str) -> Policy {
        s.parse().unwrap()
    }

    #[test]
    fn a_log_whose_entries_all_expired_is_not_revived_by_a_longer_period() {
        // Found by the Redis parity trace at the bounds: a log written under a short period,
        // all expired, came back to life under a longer one where the key had not been
        // dropped yet, though its reset_after had elapsed (a fresh key, by definition).
        let short = policy("sliding-log:limit=1,period=1s");
        let long = policy("sliding-log:limit=1,period=10s");
        let mut s = State::new();
        assert!(check(&short, &mut s, 0, 1).allowed());
        // At 999 ms the entry is live under either period: it carries over.
        let mut carried = super::super::carry_over(&short, &long, &s, 999);
        let d = check(&long, &mut carried, 999, 1);
        assert_eq!(
            (d.allowed(), d.retry_after()),
            (false, Some(Duration::from_millis(9_001)))
        );
        // At 1000 ms it expired under the old period: the key is fresh.
        let mut fresh = super::super::carry_over(&short, &long, &s, 1_000);
        let d = check(&long, &mut fresh, 1_000, 1);
        assert_eq!(
            (d.allowed(), d.remaining(), d.reset_after()),
            (true, 0, Duration::from_secs(10))
        );
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
