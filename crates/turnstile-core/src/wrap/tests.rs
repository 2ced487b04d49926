//! The wrappers, on the in-memory backend alone.

use std::future::{ready, Ready};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{DenyCache, Fallback, Share};
use crate::backend::{Backend, BackendError, CheckResult, Quotas};
use crate::clock::ManualClock;
use crate::failure::FailurePolicy;
use crate::memory::MemoryBackend;
use crate::policy::Policy;
use crate::quota::Limits;
use crate::test_util::now;

/// A remote-looking backend over memory whose keys `fails` picks (all of them, unless told)
/// fail with `error` while `down` is set.
#[derive(Clone)]
struct Flaky {
    inner: MemoryBackend<ManualClock>,
    down: Arc<AtomicBool>,
    error: fn() -> BackendError,
    fails: fn(&str) -> bool,
}

impl Flaky {
    fn new(clock: &ManualClock, error: fn() -> BackendError) -> Self {
        Flaky {
            inner: MemoryBackend::builder().clock(clock.clone()).build(),
            down: Arc::default(),
            error,
            fails: |_| true,
        }
    }
}

impl Backend for Flaky {
    type Future = Ready<CheckResult>;

    fn check_limits(
        &self,
        key: &str,
        limits: &Limits,
        cost: u64,
        now_ms: Option<u64>,
    ) -> Self::Future {
        if (self.fails)(key) && self.down.load(Ordering::Relaxed) {
            return ready(Err((self.error)()));
        }
        self.inner.check_limits(key, limits, cost, now_ms)
    }
}

fn unreachable_redis() -> BackendError {
    BackendError::Connection("connection refused".into())
}

fn limits(s: &str) -> Limits {
    Limits::new([s.parse::<Policy>().unwrap()]).unwrap()
}

#[test]
fn fallback_decides_locally_only_under_local_and_only_what_the_table_says() {
    let clock = ManualClock::new(0);
    let l = limits("fixed-window:limit=2,period=1m");
    let remote = Flaky::new(&clock, unreachable_redis);
    let local = MemoryBackend::builder().clock(clock.clone()).build();
    let fb = Fallback::with_local(remote.clone(), FailurePolicy::Local, local);

    assert!(now(fb.check_limits("k", &l, 1, None)).unwrap().allowed());
    assert_eq!(fb.local_decisions(), 0);
    remote.down.store(true, Ordering::Relaxed);
    // The local state starts from what the backend last said (1 of 2 left), not afresh.
    let got: Vec<bool> = (0..3)
        .map(|_| now(fb.check_limits("k", &l, 1, None)).unwrap().allowed())
        .collect();
    assert_eq!(got, [true, false, false]);
    assert_eq!(fb.local_decisions(), 3);
    remote.down.store(false, Ordering::Relaxed);
    // Back: the backend's own state (1 used) decides again.
    assert_eq!(
        now(fb.check_limits("k", &l, 1, None)).unwrap().remaining(),
        0
    );
    assert_eq!(fb.local_decisions(), 4 - 1);

    for policy in [FailurePolicy::Open, FailurePolicy::Closed] {
        let fb = Fallback::new(remote.clone(), policy);
        remote.down.store(true, Ordering::Relaxed);
        assert!(matches!(
            now(fb.check_limits("k", &l, 1, None)),
            Err(BackendError::Connection(_))
        ));
        assert_eq!(fb.local_decisions(), 0);
        remote.down.store(false, Ordering::Relaxed);
    }
}

#[test]
fn fallback_returns_what_it_does_not_stand_in_for() {
    let clock = ManualClock::new(0);
    let l = limits("fixed-window:limit=2,period=1m");
    let full = Flaky::new(&clock, || BackendError::CapacityExceeded { max_keys: 1 });
    full.down.store(true, Ordering::Relaxed);
    let fb = Fallback::new(full, FailurePolicy::Local);
    assert!(matches!(
        now(fb.check_limits("k", &l, 1, None)),
        Err(BackendError::CapacityExceeded { .. })
    ));
    // A failure of the fallback itself reaches the caller (who handles it as open).
    let clock = ManualClock::new(0);
    let remote = Flaky::new(&clock, unreachable_redis);
    remote.down.store(true, Ordering::Relaxed);
    let tiny = MemoryBackend::builder()
        .clock(clock.clone())
        .max_keys(1)
        .build();
    let fb = Fallback::with_local(remote, FailurePolicy::Local, tiny);
    assert!(now(fb.check_limits("a", &l, 1, None)).unwrap().allowed());
    assert!(matches!(
        now(fb.check_limits("b", &l, 1, None)),
        Err(BackendError::CapacityExceeded { max_keys: 1 })
    ));
}

#[test]
fn fallback_never_stands_in_for_a_local_backend() {
    let memory = MemoryBackend::builder().max_keys(1).build();
    let fb = Fallback::new(memory, FailurePolicy::Local);
    let l = limits("gcra:limit=5,period=1s");
    assert!(now(fb.check_limits("a", &l, 1, Some(0))).is_ok());
    assert!(matches!(
        now(fb.check_limits("b", &l, 1, Some(0))),
        Err(BackendError::CapacityExceeded { .. })
    ));
    assert_eq!(fb.local_decisions(), 0);
    assert!(fb.local().is_empty());
}

#[test]
fn deny_cache_answers_as_the_backend_and_forgets_on_give_back() {
    let memory = MemoryBackend::new();
    let cached = DenyCache::with_max(memory.clone(), Duration::from_secs(3600));
    let plain = MemoryBackend::new();
    let l = limits("token-bucket:limit=2,period=1s");
    // Same requests at the same explicit times: identical admissions and waits.
    for t in [0, 0, 10, 20, 400, 499, 500, 900, 1000, 1001] {
        let a = now(cached.check_limits("k", &l, 1, Some(t))).unwrap();
        let b = now(plain.check_limits("k", &l, 1, Some(t))).unwrap();
        assert_eq!(a.allowed(), b.allowed(), "t={t}");
        assert_eq!(a.retry_after(), b.retry_after(), "t={t}");
    }
    assert!(cached.hits() > 0);
    // A refund through the wrapper reaches the cache at once.
    assert!(!now(cached.check_limits("k", &l, 1, Some(1001)))
        .unwrap()
        .allowed());
    let hits = cached.hits();
    now(cached.refund("k", &l, 1, Some(1001))).unwrap();
    assert!(now(cached.check_limits("k", &l, 1, Some(1001)))
        .unwrap()
        .allowed());
    assert_eq!(cached.hits(), hits);
}

#[test]
fn deny_cache_spares_the_backend_a_flood() {
    let clock = ManualClock::new(0);
    let remote = Flaky::new(&clock, unreachable_redis);
    let cached = DenyCache::new(remote.clone());
    let l = limits("fixed-window:limit=1,period=1m");
    assert!(now(cached.check_limits("k", &l, 1, None))
        .unwrap()
        .allowed());
    assert!(!now(cached.check_limits("k", &l, 1, None))
        .unwrap()
        .allowed());
    // Redis down: the cached denial still answers, so the flood never asks.
    remote.down.store(true, Ordering::Relaxed);
    for _ in 0..100 {
        assert!(!now(cached.check_limits("k", &l, 1, None))
            .unwrap()
            .allowed());
    }
    assert_eq!(cached.hits(), 100);
}

#[test]
fn the_fallback_does_not_hand_out_a_fresh_quota_at_every_incident() {
    // Issue 12, fault 4: a node Redis had just told "0 left" admitted the whole limit again.
    let clock = ManualClock::new(1_000);
    let bucket = limits("token-bucket:limit=10,period=10s");
    let remote = Flaky::new(&clock, unreachable_redis);
    let local = MemoryBackend::builder().clock(clock.clone()).build();
    let fb = Fallback::with_local(remote.clone(), FailurePolicy::Local, local);
    for _ in 0..10 {
        assert!(now(fb.check_limits("k", &bucket, 1, None))
            .unwrap()
            .allowed());
    }
    assert!(!now(fb.check_limits("k", &bucket, 1, None))
        .unwrap()
        .allowed());

    // An outage 2.5 s later: what refilled since the last answer (2 tokens), no more.
    clock.advance(Duration::from_millis(2_500));
    remote.down.store(true, Ordering::Relaxed);
    let admitted = (0..10)
        .filter(|_| {
            now(fb.check_limits("k", &bucket, 1, None))
                .unwrap()
                .allowed()
        })
        .count();
    assert_eq!(admitted, 2);
    // It refills at the policy's rate during the outage.
    clock.advance(Duration::from_secs(1));
    let admitted = (0..10)
        .filter(|_| {
            now(fb.check_limits("k", &bucket, 1, None))
                .unwrap()
                .allowed()
        })
        .count();
    assert_eq!(admitted, 1);

    // The backend answers again (its state: 0 left at the last answer, refilled since), then
    // fails again: the second incident starts from the backend's newest answer, not from
    // what the first incident left locally.
    remote.down.store(false, Ordering::Relaxed);
    clock.advance(Duration::from_secs(5));
    let d = now(fb.check_limits("k", &bucket, 1, None)).unwrap();
    // The backend saw none of the outage: 8.5 tokens refilled since its last admission at 1 s.
    assert_eq!(d.remaining(), 7, "{d:?}");
    remote.down.store(true, Ordering::Relaxed);
    let admitted = (0..20)
        .filter(|_| {
            now(fb.check_limits("k", &bucket, 1, None))
                .unwrap()
                .allowed()
        })
        .count();
    assert_eq!(u64::try_from(admitted).unwrap(), d.remaining());
}

#[test]
fn a_key_never_seen_starts_with_the_configured_share() {
    let clock = ManualClock::new(0);
    let window = limits("fixed-window:limit=10,period=1h");
    let remote = Flaky::new(&clock, unreachable_redis);
    remote.down.store(true, Ordering::Relaxed);
    for (share, expected) in [(1.0, 10), (0.25, 2), (0.0, 0)] {
        let local = MemoryBackend::builder().clock(clock.clone()).build();
        let fb = Fallback::with_local_share(
            remote.clone(),
            FailurePolicy::Local,
            local,
            Share::new(share).unwrap(),
        );
        let admitted = (0..20)
            .filter(|_| {
                now(fb.check_limits("new", &window, 1, None))
                    .unwrap()
                    .allowed()
            })
            .count();
        assert_eq!(admitted, expected, "share {share}");
    }
    assert!(Share::new(1.5).is_err());
    assert!(Share::new(f64::NAN).is_err());
    assert!(Share::new(-0.1).is_err());
}

#[test]
fn answers_told_out_of_order_leave_the_fallback_the_least_remaining() {
    // A coalesced Redis call decides its checks in order and tells them at once; their
    // callers run in any order. Learned from the one told last (an earlier decision, more
    // remaining), an outage started with units the backend had already given away.
    let clock = ManualClock::new(0);
    let l = limits("fixed-window:limit=5,period=1h");
    let remote = Flaky::new(&clock, unreachable_redis);
    let local = MemoryBackend::builder().clock(clock.clone()).build();
    let fb = Fallback::with_local(remote.clone(), FailurePolicy::Local, local);
    let admitted_in_outage = || {
        remote.down.store(true, Ordering::Relaxed);
        let n = (0..6)
            .filter(|_| now(fb.check_limits("k", &l, 1, None)).unwrap().allowed())
            .count();
        remote.down.store(false, Ordering::Relaxed);
        n
    };
    // Both decided (2 left after the second), told second first.
    let first = fb.check_limits("k", &l, 1, None);
    let second = fb.check_limits("k", &l, 1, None);
    assert_eq!(now(second).unwrap().remaining(), 3);
    assert_eq!(now(first).unwrap().remaining(), 4);
    assert_eq!(admitted_in_outage(), 3);
    // A check sent after the last answer arrived is the latest: its larger remaining (a new
    // window) replaces the smaller one.
    clock.advance(Duration::from_secs(3_600));
    assert_eq!(
        now(fb.check_limits("k", &l, 1, None)).unwrap().remaining(),
        4
    );
    assert_eq!(admitted_in_outage(), 4);
}

#[test]
fn learned_answers_are_bounded_by_the_local_key_cap() {
    let clock = ManualClock::new(0);
    let window = limits("fixed-window:limit=3,period=1h");
    let remote = Flaky::new(&clock, unreachable_redis);
    let local = MemoryBackend::builder()
        .clock(clock.clone())
        .max_keys(32)
        .build();
    let fb = Fallback::with_local(remote.clone(), FailurePolicy::Local, local);
    for i in 0..1_000 {
        now(fb.check_limits(&format!("k{i}"), &window, 1, None)).unwrap();
    }
    assert!(fb.learned_keys() <= 32 + 16, "{}", fb.learned_keys());
}

fn policies(specs: &[&str]) -> Limits {
    Limits::new(specs.iter().map(|s| s.parse::<Policy>().unwrap())).unwrap()
}

/// The fields a client is shown of one decision: per policy, its name, its `remaining` and a
/// wait (seconds, rounded up, of `retry_after` when it denies, else of `reset_after`).
fn shown(d: &crate::Decision) -> Vec<(String, u64, Option<u64>)> {
    d.policies()
        .iter()
        .map(|p| {
            let t = if p.allowed() {
                Some(p.reset_after())
            } else {
                p.retry_after()
            };
            (
                p.name().to_owned(),
                p.remaining(),
                t.map(crate::round::ceil_secs),
            )
        })
        .collect()
}

#[test]
fn deny_cache_reported_a_refilled_policy_as_violated() {
    // A = 2 per 60 s, B = 1 per 1 s; requests at 0, 100, 1000, 1100 and 2050 ms. At 2050 ms
    // B has refilled: only A denies. The cache used to answer from the 1100 ms denial
    // (violated A and B, "B";r=0;t=1).
    let l = policies(&[
        "token-bucket:limit=2,period=60s,name=A",
        "token-bucket:limit=1,period=1s,name=B",
    ]);
    let cached = DenyCache::new(MemoryBackend::new());
    let plain = MemoryBackend::new();
    let mut last = None;
    for t in [0, 100, 1000, 1100, 2050] {
        let a = now(cached.check_limits("k", &l, 1, Some(t))).unwrap();
        let b = now(plain.check_limits("k", &l, 1, Some(t))).unwrap();
        assert_eq!(a, b, "t={t}");
        last = Some(a);
    }
    let d = last.unwrap();
    assert!(!d.allowed());
    let violated: Vec<&str> = d.violated().map(|p| p.name()).collect();
    assert_eq!(violated, ["A"]);
    assert_eq!(
        shown(&d),
        [("A".to_owned(), 0, Some(28)), ("B".to_owned(), 1, Some(0))]
    );
    // Asked again within the 1100 ms denial's life, the cache answers, exactly.
    let again = now(cached.check_limits("k", &l, 1, Some(2050))).unwrap();
    assert_eq!(again, d);
    assert_eq!(cached.hits(), 1);
}

#[test]
fn deny_cache_holds_a_denial_only_while_every_shown_field_does() {
    let cached = DenyCache::with_max(MemoryBackend::new(), Duration::from_secs(3600));
    // Fixed window, 3 per second, costs 2 after one unit: denied with remaining 1 until
    // the window ends at 1000 ms.
    let l = policies(&["fixed-window:limit=3,period=1s,name=w"]);
    assert!(now(cached.check_limits("w", &l, 2, Some(0)))
        .unwrap()
        .allowed());
    let d = now(cached.check_limits("w", &l, 2, Some(10))).unwrap();
    assert_eq!(d.unchanged_for(2), Duration::from_millis(990));
    assert_eq!(
        now(cached.check_limits("w", &l, 2, Some(999))).unwrap(),
        d.elapsed_by(Duration::from_millis(989))
    );
    assert_eq!(cached.hits(), 1);
    assert!(now(cached.check_limits("w", &l, 2, Some(1000)))
        .unwrap()
        .allowed());
    // Token bucket of burst 3, 1 per second, cost 3 with 1 left: `remaining` rises at
    // 1000 ms, before the admission at 2000 ms, so the entry ends there.
    let l = policies(&["token-bucket:limit=1,period=1s,burst=3,name=b"]);
    assert!(now(cached.check_limits("b", &l, 2, Some(0)))
        .unwrap()
        .allowed());
    let d = now(cached.check_limits("b", &l, 3, Some(0))).unwrap();
    assert_eq!(d.remaining(), 1);
    assert_eq!(d.retry_after(), Some(Duration::from_secs(2)));
    assert!(d.unchanged_for(3) < Duration::from_secs(1));
    let at_1000 = now(cached.check_limits("b", &l, 3, Some(1000))).unwrap();
    assert_eq!(at_1000.remaining(), 2);
    assert_eq!(at_1000.retry_after(), Some(Duration::from_secs(1)));
    // A sliding log missing two units: its oldest entry (unknown to the cache) may expire
    // first, so only the same instant is answered from the cache.
    let l = policies(&["sliding-log:limit=2,period=1s,name=s"]);
    assert!(now(cached.check_limits("s", &l, 1, Some(0)))
        .unwrap()
        .allowed());
    assert!(now(cached.check_limits("s", &l, 1, Some(500)))
        .unwrap()
        .allowed());
    let d = now(cached.check_limits("s", &l, 2, Some(600))).unwrap();
    assert_eq!(d.unchanged_for(2), Duration::from_nanos(1));
    // Missing one unit, its first rise is its admission.
    assert_eq!(
        now(cached.check_limits("s", &l, 1, Some(600)))
            .unwrap()
            .unchanged_for(1),
        Duration::from_millis(400)
    );
}

/// One deterministic pseudo-random generator per run (xorshift), so failures repeat.
fn xorshift(mut seed: u64) -> impl FnMut(u64) -> u64 {
    move |n| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    }
}

#[test]
fn deny_cache_answers_random_multi_policy_traces_field_for_field_as_the_backend() {
    let sets: Vec<Limits> = vec![
        policies(&["token-bucket:limit=3,period=1s,burst=5,name=a"]),
        policies(&["gcra:limit=2,period=700ms,name=a"]),
        policies(&["leaky-bucket:limit=4,period=1s,burst=6,name=a"]),
        policies(&["fixed-window:limit=4,period=700ms,name=a"]),
        policies(&["sliding-log:limit=5,period=1s,name=a"]),
        policies(&["sliding-window:limit=6,period=900ms,name=a"]),
        policies(&[
            "token-bucket:limit=2,period=60s,name=A",
            "token-bucket:limit=1,period=1s,name=B",
        ]),
        policies(&[
            "token-bucket:limit=5,period=1s,name=fast",
            "sliding-window:limit=12,period=10s,name=slow",
        ]),
        policies(&[
            "gcra:limit=3,period=1s,burst=4,name=g",
            "fixed-window:limit=7,period=3s,name=f",
            "leaky-bucket:limit=2,period=500ms,name=l",
        ]),
        policies(&[
            "sliding-log:limit=4,period=2s,name=log",
            "token-bucket:limit=10,period=1m,name=minute",
        ]),
    ];
    let mut compared = 0;
    for seed in [0x2545_f491_4f6c_dd1d_u64, 0x9e37_79b9_7f4a_7c15, 7] {
        let mut next = xorshift(seed);
        for (k, l) in sets.iter().enumerate() {
            let cached = DenyCache::with_max(MemoryBackend::new(), Duration::from_secs(3600));
            let plain = MemoryBackend::new();
            let mut t = 1_700_000_000_000u64;
            for i in 0..1500 {
                t += [0, 0, 0, 1, 7, 50, 123, 333, 1000][next(9) as usize];
                let key = ["x", "y"][next(2) as usize];
                let cost = [1, 1, 1, 1, 2, 3, 0, 9][next(8) as usize];
                let ctx = format!("seed {seed:#x} set {k} request {i} t={t} {key} cost {cost}");
                match next(60) {
                    0 => {
                        let a = now(cached.refund(key, l, 1, Some(t))).unwrap();
                        let b = now(plain.refund(key, l, 1, Some(t))).unwrap();
                        assert_eq!(a, b, "{ctx}: refund");
                        continue;
                    }
                    1 => {
                        let a = now(cached.reset(key, l, Some(t))).unwrap();
                        let b = now(plain.reset(key, l, Some(t))).unwrap();
                        assert_eq!(a, b, "{ctx}: reset");
                        continue;
                    }
                    _ => {}
                }
                let a = now(cached.check_limits(key, l, cost, Some(t))).unwrap();
                let b = now(plain.check_limits(key, l, cost, Some(t))).unwrap();
                assert_eq!(a, b, "{ctx}");
                assert_eq!(shown(&a), shown(&b), "{ctx}");
                compared += 1;
            }
            assert!(cached.hits() > 20, "set {k}: {} hits", cached.hits());
        }
    }
    assert!(compared > 40_000);
}

#[test]
fn fallback_keeps_counting_a_dead_masters_keys_while_other_masters_answer() {
    // Chaos run, Cluster master kill under `local`: every answer for a key of a live master
    // ended the incident and the next failure began a new one, which primed the dead
    // master's keys afresh from the backend's last answer: they were admitted without limit
    // (each process took every request, 50 a second against a limit of 30).
    let clock = ManualClock::new(0);
    let window = limits("fixed-window:limit=3,period=1h");
    // The keys of one dead Cluster master fail while the other masters answer.
    let remote = Flaky {
        fails: |key| key.starts_with("dead"),
        ..Flaky::new(&clock, unreachable_redis)
    };
    let local = MemoryBackend::builder().clock(clock.clone()).build();
    let fb = Fallback::with_local(remote.clone(), FailurePolicy::Local, local);
    // Learned: 1 used, 2 left for the known key; the unknown one starts with all 3.
    assert!(now(fb.check_limits("dead-known", &window, 1, None))
        .unwrap()
        .allowed());
    remote.down.store(true, Ordering::Relaxed);
    let (mut known, mut unknown) = (0, 0);
    for _ in 0..10 {
        known += usize::from(
            now(fb.check_limits("dead-known", &window, 1, None))
                .unwrap()
                .allowed(),
        );
        unknown += usize::from(
            now(fb.check_limits("dead-unknown", &window, 1, None))
                .unwrap()
                .allowed(),
        );
        // A live master's key answers: the incident ends, the next failure opens another.
        assert!(now(fb.check_limits("alive", &window, 0, None))
            .unwrap()
            .allowed());
    }
    assert_eq!((known, unknown), (2, 3));
    assert_eq!(fb.local_decisions(), 20);

    // The dead master's replica takes over with the state it replicated (1 used): an
    // answer for the key ends its outage; a later outage starts from that answer.
    remote.down.store(false, Ordering::Relaxed);
    let d = now(fb.check_limits("dead-known", &window, 1, None)).unwrap();
    assert!(d.allowed());
    assert_eq!(d.remaining(), 1);
    remote.down.store(true, Ordering::Relaxed);
    let admitted = (0..10)
        .filter(|_| {
            let a = now(fb.check_limits("dead-known", &window, 1, None))
                .unwrap()
                .allowed();
            now(fb.check_limits("alive", &window, 0, None)).unwrap();
            a
        })
        .count();
    assert_eq!(admitted, 1);
}

/// `B::ready_now` of one of `backend`'s futures.
fn at_once<B: Backend>(_backend: &B, fut: B::Future) -> Result<CheckResult, B::Future> {
    B::ready_now(fut)
}

#[test]
fn ready_now_gives_what_polling_gives_or_the_future_back() {
    let clock = ManualClock::new(0);
    let l = limits("fixed-window:limit=2,period=1m");
    let memory = || MemoryBackend::builder().clock(clock.clone()).build();
    // In memory, alone, behind a fallback and behind a deny cache: decided at once, exactly as
    // a twin whose futures are polled.
    let polled = memory();
    let direct = memory();
    let fb = Fallback::with_local(memory(), FailurePolicy::Local, memory());
    let dc = DenyCache::new(memory());
    for _ in 0..4 {
        let want = now(polled.check_limits("k", &l, 1, None)).unwrap();
        let got = at_once(&direct, direct.check_limits("k", &l, 1, None));
        assert_eq!(got.ok().map(Result::unwrap), Some(want.clone()));
        let got = at_once(&fb, fb.check_limits("k", &l, 1, None));
        assert_eq!(got.ok().map(Result::unwrap), Some(want.clone()));
        // (A cached denial counts its wait down on the real clock: compared field by field.)
        let got = at_once(&dc, dc.check_limits("k", &l, 1, None))
            .ok()
            .map(Result::unwrap)
            .unwrap();
        assert_eq!(
            (got.allowed(), got.remaining()),
            (want.allowed(), want.remaining())
        );
    }
    // The third check's denial was learned, the fourth answered from the cache.
    assert_eq!(dc.hits(), 1);

    // A backend that cannot tell: the future comes back unpolled, and polling it decides
    // (here through the fallback's local decision while the backend is down).
    let remote = Flaky::new(&clock, unreachable_redis);
    let fb = Fallback::with_local(remote.clone(), FailurePolicy::Local, memory());
    remote.down.store(true, Ordering::Relaxed);
    let Err(fut) = at_once(&fb, fb.check_limits("k", &l, 1, None)) else {
        panic!("Flaky keeps the default ready_now");
    };
    assert_eq!(fb.local_decisions(), 0);
    assert!(now(fut).unwrap().allowed());
    assert_eq!(fb.local_decisions(), 1);
}
