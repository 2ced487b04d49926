//! Properties of `SEMANTICS.md` checked on random traces: small limits, periods and bursts,
//! costs from 0 to one above the capacity, non-decreasing times.
//!
//! 1. No algorithm ever admits more than its definition allows.
//! 2. token-bucket, gcra and leaky-bucket decide identically (leaky adds only the delay).
//! 3. `retry_after` is the smallest wait and `reset_after` the exact time to a fresh state.
//! 4. Denied requests and queries change nothing.
//! 5. Several policies on one request are all-or-nothing and aggregate as specified.

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;
use proptest::sample::select;
use turnstile_core::algorithm::{check, evaluate};
use turnstile_core::round::ceil_ms;
use turnstile_core::{Algorithm, Backend, Decision, MemoryBackend, Policy, PolicyDecision, State};

fn policy(algorithm: Algorithm, limit: u64, period_ms: u64, burst: Option<u64>) -> Policy {
    let burst = burst.filter(|_| algorithm.is_bucket());
    Policy::from_parts(algorithm, limit, period_ms, burst).expect("a valid small policy")
}

/// A small policy of any algorithm: L in 1..=4, P in 1..=20 ms (so T is often not whole),
/// B in 1..=5 or the default for buckets.
fn any_policy() -> impl Strategy<Value = Policy> {
    (
        select(Algorithm::ALL.to_vec()),
        1u64..=4,
        1u64..=20,
        proptest::option::of(1u64..=5),
    )
        .prop_map(|(a, l, p, b)| policy(a, l, p, b))
}

/// A trace of (t_ms, cost): times non-decreasing from a random start (often several
/// requests at one instant), costs 0..=max_cost.
fn trace(max_cost: u64, max_len: usize) -> impl Strategy<Value = Vec<(u64, u64)>> {
    let step = prop_oneof![
        3 => Just(0u64),
        4 => 0u64..=5,
        2 => 0u64..=30,
        1 => 0u64..=200,
    ];
    (
        0u64..=100,
        proptest::collection::vec((step, 0..=max_cost), 1..=max_len),
    )
        .prop_map(|(start, steps)| {
            let mut t = start;
            steps
                .into_iter()
                .map(|(dt, cost)| {
                    t += dt;
                    (t, cost)
                })
                .collect()
        })
}

/// A policy and a trace with costs up to one above its capacity.
fn policy_and_trace() -> impl Strategy<Value = (Policy, Vec<(u64, u64)>)> {
    any_policy().prop_flat_map(|p| {
        let cap = p.capacity();
        (Just(p), trace(cap + 1, 40))
    })
}

/// Replays `trace` on one fresh state; returns every decision.
fn replay(p: &Policy, trace: &[(u64, u64)]) -> Vec<PolicyDecision> {
    let mut s = State::new();
    trace.iter().map(|&(t, c)| check(p, &mut s, t, c)).collect()
}

fn same_fields(a: &PolicyDecision, b: &PolicyDecision) -> bool {
    a.allowed() == b.allowed()
        && a.remaining() == b.remaining()
        && a.retry_after() == b.retry_after()
        && a.reset_after() == b.reset_after()
}

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config(1024))]

    /// (1) What each definition allows, checked on the admitted requests alone.
    #[test]
    fn never_admits_more_than_the_definition_allows((p, trace) in policy_and_trace()) {
        let decisions = replay(&p, &trace);
        let admitted: Vec<(u64, u64)> = trace
            .iter()
            .zip(&decisions)
            .filter(|(&(_, c), d)| d.allowed() && c > 0)
            .map(|(r, _)| *r)
            .collect();
        let (l, period) = (p.limit(), p.period_ms());
        match p.algorithm() {
            Algorithm::FixedWindow => {
                // Every window [kP, (k+1)P) holds at most L units.
                let mut per_window: HashMap<u64, u64> = HashMap::new();
                for &(t, c) in &admitted {
                    *per_window.entry(t / period).or_default() += c;
                }
                for (w, n) in per_window {
                    prop_assert!(n <= l, "window {w} admitted {n} > {l}");
                }
            }
            Algorithm::SlidingLog => {
                // Every interval (t - P, t] holds at most L units; the worst ones end at an
                // admitted request.
                for &(t, _) in &admitted {
                    let used: u64 = admitted
                        .iter()
                        .filter(|&&(s, _)| s <= t && s + period > t)
                        .map(|&(_, c)| c)
                        .sum();
                    prop_assert!(used <= l, "({}, {t}] admitted {used} > {l}", t.saturating_sub(period));
                }
            }
            Algorithm::SlidingWindow => {
                // After each admission the estimate m·(P − e)/P + n is at most L, with n and m
                // recomputed from the admitted requests (so also n ≤ L in every window).
                for (i, &(t, _)) in admitted.iter().enumerate() {
                    let w = t / period;
                    let e = t - w * period;
                    let n: u64 = admitted[..=i]
                        .iter()
                        .filter(|&&(s, _)| s / period == w)
                        .map(|&(_, c)| c)
                        .sum();
                    let m: u64 = admitted[..=i]
                        .iter()
                        .filter(|&&(s, _)| s / period + 1 == w)
                        .map(|&(_, c)| c)
                        .sum();
                    prop_assert!(
                        m * (period - e) + n * period <= l * period,
                        "at {t}: m={m} n={n} e={e} exceed L={l}"
                    );
                }
            }
            _ => {
                // A bucket holds at most B tokens and gains L per P: the requests admitted in
                // [t_i, t_j] cost at most B + (t_j − t_i)·L/P (exactly: ·P on both sides).
                let b = p.capacity();
                for i in 0..admitted.len() {
                    let mut sum = 0;
                    for j in i..admitted.len() {
                        sum += admitted[j].1;
                        let span = admitted[j].0 - admitted[i].0;
                        prop_assert!(
                            sum * period <= b * period + span * l,
                            "[{}, {}] admitted {sum} > B + span·L/P", admitted[i].0, admitted[j].0
                        );
                    }
                }
            }
        }
    }

    /// (2) token-bucket, gcra and leaky-bucket with the same (L, P, B) admit the same
    /// requests and report the same remaining, retry_after and reset_after; leaky-bucket's
    /// delay is the queue ahead, y·T, which equals the token bucket's reset_after just
    /// before the request.
    #[test]
    fn buckets_decide_alike(
        (l, period, burst, trace) in (1u64..=4, 1u64..=20, proptest::option::of(1u64..=5))
            .prop_flat_map(|(l, p, b)| (Just(l), Just(p), Just(b), trace(b.unwrap_or(l) + 1, 40)))
    ) {
        let tb = policy(Algorithm::TokenBucket, l, period, burst);
        let gcra = policy(Algorithm::Gcra, l, period, burst);
        let leaky = policy(Algorithm::LeakyBucket, l, period, burst);
        let (mut s_tb, mut s_gcra, mut s_leaky) = (State::new(), State::new(), State::new());
        for (i, &(t, c)) in trace.iter().enumerate() {
            let queued = evaluate(&tb, &s_tb, t, 0).decision().reset_after();
            let a = check(&tb, &mut s_tb, t, c);
            let g = check(&gcra, &mut s_gcra, t, c);
            let y = check(&leaky, &mut s_leaky, t, c);
            prop_assert!(same_fields(&a, &g), "request {i} ({t}, {c}): token-bucket {a:?} gcra {g:?}");
            prop_assert!(same_fields(&a, &y), "request {i} ({t}, {c}): token-bucket {a:?} leaky {y:?}");
            prop_assert_eq!(a.delay(), Duration::ZERO);
            prop_assert_eq!(g.delay(), Duration::ZERO);
            let want_delay = if y.allowed() { queued } else { Duration::ZERO };
            prop_assert_eq!(y.delay(), want_delay, "request {} ({}, {})", i, t, c);
        }
    }

    /// (3) retry_after is the smallest wait: with nothing else arriving, the same request is
    /// denied at every whole ms before t + ceil(retry_after) and admitted then; "never"
    /// exactly when the cost exceeds the capacity. reset_after is exact too: at
    /// t + ceil(reset_after) the key behaves as a fresh one for every cost, one ms earlier it
    /// does not.
    #[test]
    fn retry_after_is_the_smallest_wait_and_reset_after_exact((p, trace) in policy_and_trace()) {
        let mut s = State::new();
        let fresh = State::new();
        for &(t, c) in &trace {
            let before = s.clone();
            let d = check(&p, &mut s, t, c);
            match d.retry_after() {
                None => prop_assert!(!d.allowed() && c > p.capacity(), "never for cost {c}"),
                Some(r) if d.allowed() => prop_assert_eq!(r, Duration::ZERO),
                Some(r) => {
                    prop_assert!(c <= p.capacity());
                    prop_assert!(r > Duration::ZERO);
                    let k = ceil_ms(r);
                    for wait in 0..k {
                        prop_assert!(
                            !evaluate(&p, &before, t + wait, c).decision().allowed(),
                            "({t}, {c}) admitted after {wait} ms < retry {r:?}"
                        );
                    }
                    prop_assert!(
                        evaluate(&p, &before, t + k, c).decision().allowed(),
                        "({t}, {c}) still denied after retry {r:?}"
                    );
                }
            }
            let k = ceil_ms(d.reset_after());
            for cost in 0..=p.capacity() + 1 {
                let later = evaluate(&p, &s, t + k, cost).into_decision();
                let as_fresh = evaluate(&p, &fresh, t + k, cost).into_decision();
                prop_assert_eq!(&later, &as_fresh, "not fresh {} ms after ({}, {})", k, t, c);
            }
            if k > 0 {
                let query = evaluate(&p, &s, t + k - 1, 0).into_decision();
                prop_assert!(query.reset_after() > Duration::ZERO, "fresh before reset_after");
            }
        }
    }

    /// (4) A denied request and a query (cost 0) change no state; so dropping every denied
    /// request from a trace changes none of the other decisions.
    #[test]
    fn denied_requests_and_queries_change_nothing((p, trace) in policy_and_trace()) {
        let mut s = State::new();
        let mut decisions = Vec::new();
        for &(t, c) in &trace {
            let before = s.clone();
            let d = check(&p, &mut s, t, c);
            if !d.allowed() || c == 0 {
                prop_assert_eq!(&s, &before, "({}, {}) changed the state", t, c);
            }
            decisions.push(d);
        }
        let kept: Vec<(u64, u64)> = trace
            .iter()
            .zip(&decisions)
            .filter(|(_, d)| d.allowed())
            .map(|(r, _)| *r)
            .collect();
        let admitted: Vec<&PolicyDecision> = decisions.iter().filter(|d| d.allowed()).collect();
        let replayed = replay(&p, &kept);
        prop_assert_eq!(replayed.iter().collect::<Vec<_>>(), admitted);
    }
}

/// Several small policies with distinct names, and a two-key trace with costs up to one
/// above the largest capacity.
fn policies_and_trace() -> impl Strategy<Value = (Vec<Policy>, Vec<(u64, bool, u64)>)> {
    proptest::collection::vec(any_policy(), 1..=3).prop_flat_map(|ps| {
        let ps: Vec<Policy> = ps
            .into_iter()
            .enumerate()
            .map(|(i, p)| p.with_name(format!("p{i}")).expect("a valid name"))
            .collect();
        let max_cap = ps.iter().map(Policy::capacity).max().unwrap_or(1);
        let keys = proptest::collection::vec(any::<bool>(), 40);
        (Just(ps), trace(max_cap + 1, 40), keys).prop_map(|(ps, trace, keys)| {
            let trace = trace
                .into_iter()
                .zip(keys)
                .map(|((t, c), k)| (t, k, c))
                .collect();
            (ps, trace)
        })
    })
}

/// The aggregate of `SEMANTICS.md`, computed independently of `Decision::from_policies`:
/// (allowed, remaining, retry_after, reset_after, delay).
type Aggregate = (bool, u64, Option<Duration>, Duration, Duration);

fn aggregate(results: &[PolicyDecision]) -> Aggregate {
    let allowed = results.iter().all(PolicyDecision::allowed);
    let retry = if allowed {
        Some(Duration::ZERO)
    } else {
        let denying: Vec<_> = results.iter().filter(|r| !r.allowed()).collect();
        if denying.iter().any(|r| r.retry_after().is_none()) {
            None
        } else {
            denying.iter().filter_map(|r| r.retry_after()).max()
        }
    };
    let delay = if allowed {
        results
            .iter()
            .map(PolicyDecision::delay)
            .max()
            .unwrap_or_default()
    } else {
        Duration::ZERO
    };
    let min_remaining = results
        .iter()
        .map(PolicyDecision::remaining)
        .min()
        .unwrap_or(0);
    let binding = results
        .iter()
        .filter(|r| r.remaining() == min_remaining)
        .map(PolicyDecision::reset_after)
        .max()
        .unwrap_or_default();
    (allowed, min_remaining, retry, binding, delay)
}

fn aggregate_of(d: &Decision) -> Aggregate {
    (
        d.allowed(),
        d.remaining(),
        d.retry_after(),
        d.reset_after(),
        d.delay(),
    )
}

proptest! {
    #![proptest_config(config(768))]

    /// (5) The memory backend with several policies admits iff every policy alone (on its
    /// own state, which only the requests admitted overall change) admits, consumes from
    /// none otherwise, reports each policy's own result (as if nothing were consumed when
    /// denied overall) and aggregates them as `SEMANTICS.md` says.
    #[test]
    fn several_policies_are_all_or_nothing((policies, trace) in policies_and_trace()) {
        let backend = MemoryBackend::new();
        let mut model: HashMap<(bool, usize), State> = HashMap::new();
        for (i, &(t, key, c)) in trace.iter().enumerate() {
            let name = if key { "alice" } else { "bob" };
            let got = backend.check_at(name, &policies, c, t).into_inner().expect("a decision");
            let alone: Vec<PolicyDecision> = policies
                .iter()
                .enumerate()
                .map(|(j, p)| {
                    let s = model.entry((key, j)).or_default();
                    evaluate(p, s, t, c).into_decision()
                })
                .collect();
            let all = alone.iter().all(PolicyDecision::allowed);
            prop_assert_eq!(got.allowed(), all, "request {}", i);
            prop_assert_eq!(got.policies().len(), policies.len());
            for (j, (p, (g, a))) in policies.iter().zip(got.policies().iter().zip(&alone)).enumerate() {
                prop_assert_eq!(g.name(), p.name());
                if all || !a.allowed() {
                    // Admitted overall, or denied by this policy itself: its own result.
                    prop_assert_eq!(g, a, "request {} policy {}", i, j);
                } else {
                    // Would admit alone, but nothing is consumed: the fields of now.
                    let now = evaluate(p, &model[&(key, j)], t, 0).into_decision();
                    prop_assert!(g.allowed());
                    prop_assert_eq!(g.retry_after(), Some(Duration::ZERO));
                    prop_assert_eq!(g.remaining(), now.remaining(), "request {} policy {}", i, j);
                    prop_assert_eq!(g.reset_after(), now.reset_after(), "request {} policy {}", i, j);
                    prop_assert_eq!(g.delay(), Duration::ZERO);
                }
            }
            prop_assert_eq!(aggregate_of(&got), aggregate(got.policies()), "request {}", i);
            if all {
                for (j, p) in policies.iter().enumerate() {
                    let s = model.get_mut(&(key, j)).expect("evaluated above");
                    check(p, s, t, c);
                }
            }
        }
    }
}
