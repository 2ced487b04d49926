//! The decision of the commonest check — one token-bucket, GCRA or leaky-bucket policy on a
//! key whose state is packed in its entry — on the packed words themselves: the words read
//! as a debt, decided by the buckets' one decision ([`debt::decide_debt`], which the
//! general evaluation calls too), and the debt after written back as words; no unpacking,
//! no general evaluation. The `fast_path_decides_as_the_algorithms_do` property test holds
//! the two paths together field for field.
//!
//! [`algorithm::eval`]: crate::algorithm::eval

use crate::algorithm::Packed;
use crate::debt::{self, Debts};
use crate::policy::{Algorithm, Policy};

/// Packed state kinds (see [`Packed`](crate::algorithm::Packed)).
const FRESH: u8 = 0;
const BUCKET: u8 = 1;
const GCRA: u8 = 2;

/// A fresh key's packed state.
pub(super) const FRESH_WORDS: Packed = Packed {
    kind: FRESH,
    a: 0,
    b: 0,
    c: 0,
};

/// One bucket policy's decision on packed state: the buckets' decision in debts (see
/// [`PolicyDecision::bucket`](crate::PolicyDecision)), and what to store.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Fast {
    /// The decision; its debt after is what `remaining` and `reset_after` follow from.
    pub(super) debts: Debts,
    /// The state to store when the request changes it (admitted with a positive cost).
    pub(super) write: Option<Packed>,
    /// The time decided at: the request's, or the state's last update if that is later.
    pub(super) now: u64,
}

/// Decides a request of `cost` units at `t_ms` on `state` under `p`, or `None` when `p` is
/// not a bucket (token bucket, GCRA, leaky bucket): the packed words read as a debt, then
/// the buckets' one decision, [`debt::decide_debt`].
#[inline(always)]
pub(super) fn decide(p: &Policy, state: Packed, t_ms: u64, cost: u64) -> Option<Fast> {
    let (kind, leaky) = match p.algorithm() {
        Algorithm::TokenBucket => (BUCKET, false),
        Algorithm::LeakyBucket => (BUCKET, true),
        Algorithm::Gcra => (GCRA, false),
        _ => return None,
    };
    let (period, cap) = (p.period_ms(), p.capacity());
    // A time before the last update is taken as the last update.
    let now = t_ms.max(state.a);
    // The debt at the last update (a GCRA's TAT·L − a·L), refilled to now; a state of
    // another shape reads as fresh.
    let debt = if state.kind == kind {
        debt::refilled(state.b, now - state.a, p.limit(), cap * period)
    } else {
        0
    };
    let debts = debt::decide_debt(period, cap, debt, cost, leaky);
    let write = (debts.allowed && cost > 0).then_some(Packed {
        kind,
        a: now,
        b: debts.after,
        c: 0,
    });
    Some(Fast { debts, write, now })
}

/// When a debt of `debt` (units of 1/L ms) at `now` is paid off: ms, rounded up.
#[inline]
pub(super) fn expires_at(now: u64, debt: u64, limit: u64) -> u64 {
    now.saturating_add(debt.div_ceil(limit.max(1)))
}

/// A lower bound of [`expires_at`] without a division: the debt divided by the power of two
/// at or above L.
#[inline]
pub(super) fn expires_no_earlier_than(now: u64, debt: u64, limit: u64) -> u64 {
    let shift = u64::BITS - limit.saturating_sub(1).leading_zeros();
    now.saturating_add(debt >> shift.min(63))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{eval, State};
    use crate::decision::PolicyDecision;
    use crate::shared::SharedPolicy;
    use proptest::prelude::*;

    fn words(s: &State, l: u64) -> Packed {
        s.pack(l).expect("bucket states pack")
    }

    fn state(w: Packed, l: u64) -> State {
        State::unpack(w, l)
    }

    /// The fast decision and the general one, request by request, from a fresh key.
    fn same_as_general(p: &Policy, requests: &[(u64, u64)]) {
        let l = p.limit();
        let mut s = State::new();
        for &(t, cost) in requests {
            let fast = decide(p, words(&s, l), t, cost).expect("a bucket");
            let e = eval(p, &s, t, cost);
            let shared = SharedPolicy::new(p.clone());
            let d = PolicyDecision::bucket(shared.clone(), fast.debts);
            assert_eq!(d, e.decision(shared), "{p} t={t} cost={cost}");
            assert_eq!(fast.write.is_some(), e.changes_state());
            let expires = expires_at(fast.now, fast.debts.after, l);
            assert_eq!(expires, e.expires_at_ms);
            assert!(expires_no_earlier_than(fast.now, fast.debts.after, l) <= expires);
            e.apply(&mut s);
            if let Some(w) = fast.write {
                assert_eq!(state(w, l), s, "{p} t={t} cost={cost}");
            }
        }
    }

    #[test]
    fn other_algorithms_take_the_general_path() {
        for p in [
            "fixed-window:limit=1,period=1s",
            "sliding-log:limit=1,period=1s",
        ] {
            assert!(decide(&p.parse().unwrap(), FRESH_WORDS, 0, 1).is_none());
        }
    }

    #[test]
    fn the_extremes_of_the_bounds() {
        for alg in ["token-bucket", "gcra", "leaky-bucket"] {
            // L = 2^32 − 1 per ms; a burst of 2^32 − 1 over 2^21 − 1 ms (B·P just below 2^53).
            let huge: Policy = format!("{alg}:limit=4294967295,period=1ms")
                .parse()
                .unwrap();
            let long: Policy = format!("{alg}:limit=1,period=2097151ms,burst=4294967295")
                .parse()
                .unwrap();
            let last = crate::policy::MAX_REQUEST_VALUE;
            for p in [&huge, &long] {
                same_as_general(
                    p,
                    &[
                        (0, u64::MAX),
                        (0, 4_294_967_295),
                        (1, 1),
                        (1, 0),
                        (last, 3),
                        (last - 5, 4_294_967_290),
                        (last, 0),
                    ],
                );
            }
        }
    }

    proptest! {
        #[test]
        fn fast_path_decides_as_the_algorithms_do(
            alg in prop::sample::select(vec!["token-bucket", "gcra", "leaky-bucket"]),
            limit in 1u64..2_000,
            period_ms in 1u64..5_000,
            burst in 1u64..3_000,
            steps in prop::collection::vec((0u64..3_000, 0u64..8), 1..60),
        ) {
            let p: Policy = format!("{alg}:limit={limit},period={period_ms}ms,burst={burst}")
                .parse()
                .unwrap();
            // Times mostly forward, sometimes back (a clock that steps back).
            let mut t = 1_700_000_000_000u64;
            let requests: Vec<(u64, u64)> = steps
                .iter()
                .map(|&(dt, cost)| {
                    t = if dt % 7 == 0 { t.saturating_sub(dt) } else { t + dt };
                    (t, cost)
                })
                .collect();
            same_as_general(&p, &requests);
        }
    }
}
