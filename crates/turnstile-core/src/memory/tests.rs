//! The in-memory backend's own tests: sweeping, the key cap, carry-over, configuration,
//! concurrency, and the shards' expiry bounds.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::MemoryBackend;
use crate::backend::Quotas;
use crate::backend::{Backend, BackendError};
use crate::policy::Policy;
use crate::quota::{Applied, Limits, Unconfigured};
use crate::test_util::now;

use crate::clock::{Clock, ManualClock};
use std::time::Duration;

fn p(s: &str) -> Policy {
    s.parse().unwrap()
}

#[test]
fn idle_keys_are_dropped_incrementally() {
    let b = MemoryBackend::builder().shards(1).build();
    let pol = [p("fixed-window:limit=5,period=1s")];
    for i in 0..100 {
        b.check_at(&format!("k{i}"), &pol, 1, 0)
            .into_inner()
            .unwrap();
    }
    assert_eq!(b.len(), 100);
    // A day later, traffic on one key sweeps the idle ones a few at a time.
    for _ in 0..60 {
        b.check_at("hot", &pol, 0, 86_400_000).into_inner().unwrap();
    }
    assert!(b.len() <= 1, "{} keys left", b.len());
}

/// The room the shards' maps hold, in entries.
fn capacity<C>(b: &MemoryBackend<C>) -> usize {
    b.inner
        .shards
        .iter()
        .map(|s| s.shard.lock().table.capacity())
        .sum()
}

#[test]
fn one_off_clients_were_still_counted_after_they_expired() {
    // 1,000 clients come once; afterwards one client keeps coming. Its checks used to
    // sweep only its own shard, so the others stayed counted (and in memory) for good.
    let clock = ManualClock::new(0);
    let b = MemoryBackend::builder().clock(clock.clone()).build();
    let pol = [p("token-bucket:limit=10,period=60s")];
    for i in 0..1000 {
        assert!(b
            .check(&format!("10.0.{}.{}", i / 256, i % 256), &pol, 1)
            .into_inner()
            .unwrap()
            .allowed());
    }
    assert_eq!(b.len(), 1000);
    // Each key's reset_after is 6 s (one token of 10 per 60 s).
    clock.advance(Duration::from_millis(6_000));
    for _ in 0..2_000 {
        assert!(b.check("regular", &pol, 0).into_inner().unwrap().allowed());
    }
    assert_eq!(b.len(), 0, "{} one-off clients still counted", b.len());
    assert!(b.check("regular", &pol, 1).into_inner().unwrap().allowed());
    assert_eq!(b.len(), 1);
}

#[test]
fn expired_keys_go_without_traffic_and_the_maps_give_memory_back() {
    let clock = ManualClock::new(1_000);
    let b = MemoryBackend::builder().clock(clock.clone()).build();
    let pol = [p("sliding-log:limit=5,period=60s")];
    let empty = capacity(&b);
    for i in 0..20_000 {
        b.check(&format!("k{i}"), &pol, 1).into_inner().unwrap();
    }
    let full = capacity(&b);
    assert!(full >= 20_000);
    // Not yet expired: the sweep keeps everything.
    clock.advance(Duration::from_millis(59_999));
    assert_eq!(b.sweep_expired(), 0);
    assert_eq!(b.len(), 20_000);
    clock.advance(Duration::from_millis(1));
    assert_eq!(b.sweep_expired(), 20_000);
    assert_eq!(b.len(), 0);
    assert!(
        capacity(&b) <= empty,
        "room for {} entries left of {full}",
        capacity(&b)
    );
}

/// Regression (issue 25, fault 7): after a flood, a backend nobody swept kept its keys and
/// its maps' room until traffic came. With `sweep_every` its own task drops them, in virtual
/// time and with no check at all, the maps shrink, and the task ends with the backend.
#[cfg(feature = "tokio")]
#[tokio::test(start_paused = true)]
async fn a_backend_that_sweeps_every_second_gives_a_floods_memory_back_without_traffic() {
    let tasks = || {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    };
    let settle = || async {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    };
    let clock = ManualClock::new(1_000);
    let b = MemoryBackend::builder()
        .clock(clock.clone())
        .sweep_every(Duration::from_secs(1))
        .build();
    let pol = [p("sliding-log:limit=5,period=60s")];
    let empty = capacity(&b);
    let before = tasks();
    for i in 0..20_000 {
        b.check(
            &format!("10.{}.{}.{}", i / 65_536, i / 256 % 256, i % 256),
            &pol,
            1,
        )
        .await
        .unwrap();
    }
    let full = capacity(&b);
    assert!(full >= 20_000);
    assert_eq!(tasks(), before + 1, "the first key started the sweeper");
    // Ticks before the keys expire keep them all.
    clock.advance(Duration::from_millis(59_999));
    tokio::time::advance(Duration::from_secs(1)).await;
    settle().await;
    assert_eq!(b.len(), 20_000);
    // Expired: the next tick drops them all, and the maps give their room back.
    clock.advance(Duration::from_millis(1));
    tokio::time::advance(Duration::from_secs(1)).await;
    settle().await;
    assert_eq!(b.len(), 0);
    assert!(
        capacity(&b) <= empty,
        "room for {} entries left of {full}",
        capacity(&b)
    );
    // Dropping the backend ends its sweeper at its next tick: no task is left behind.
    drop(b);
    tokio::time::advance(Duration::from_secs(1)).await;
    settle().await;
    assert_eq!(tasks(), before);
}

#[test]
fn keys_checked_at_explicit_times_are_never_swept_by_the_clock() {
    // A simulation's trace times are not the clock's: a trace from 1970 must not look
    // expired to the wall clock.
    let clock = ManualClock::new(1_700_000_000_000);
    let b = MemoryBackend::builder().clock(clock.clone()).build();
    let pol = [p("fixed-window:limit=1,period=1h")];
    for i in 0..100 {
        b.check_at(&format!("sim{i}"), &pol, 1, 5_000)
            .into_inner()
            .unwrap();
    }
    b.check("live", &pol, 1).into_inner().unwrap();
    clock.advance(Duration::from_secs(3600));
    // The clock's sweep and the clock's checks drop the live key only.
    assert_eq!(b.sweep_expired(), 1);
    for _ in 0..2_000 {
        b.check("other", &pol, 0).into_inner().unwrap();
    }
    assert_eq!(b.len(), 100);
    // Still denied at trace time 6,000: the state is there.
    assert!(!b
        .check_at("sim7", &pol, 1, 6_000)
        .into_inner()
        .unwrap()
        .allowed());
    // Checks at explicit times sweep them once the trace passes their expiry.
    for _ in 0..2_000 {
        b.check_at("sim0", &pol, 0, 3_600_000).into_inner().unwrap();
    }
    assert_eq!(b.len(), 0);
}

#[test]
fn key_cap_is_a_typed_error_and_never_evicts_live_state() {
    let clock = ManualClock::new(0);
    let b = MemoryBackend::builder()
        .clock(clock.clone())
        .max_keys(2)
        .build();
    let pol = [p("token-bucket:limit=1,period=1m")];
    assert!(b.check("a", &pol, 1).into_inner().unwrap().allowed());
    assert!(b.check("b", &pol, 1).into_inner().unwrap().allowed());
    assert!(matches!(
        b.check("c", &pol, 1).into_inner(),
        Err(BackendError::CapacityExceeded { max_keys: 2 })
    ));
    // Existing keys still decide, and stay denied: nothing was evicted.
    assert!(!b.check("a", &pol, 1).into_inner().unwrap().allowed());
    // Queries and denials on a new key need no room.
    assert!(b.check("c", &pol, 0).into_inner().unwrap().allowed());
    // Once the old keys expire, there is room again. (Which expired keys are dropped on
    // the way depends on the shards the keys hash to: at least one, at most both.)
    clock.advance(Duration::from_secs(60));
    assert!(b.check("c", &pol, 1).into_inner().unwrap().allowed());
    assert!(b.len() <= 2);
    b.purge_expired(clock.now_ms());
    assert_eq!(b.len(), 1);
}

#[test]
fn a_new_key_keeps_its_policy_when_the_cap_sweeps_its_shard_empty() {
    // At the cap, a new key's check sweeps its whole shard first. When that leaves the
    // shard empty, the shard drops the policies nothing refers to: never the new key's.
    for q in [
        "token-bucket:limit=1,period=1h",
        "fixed-window:limit=1,period=1h",
    ] {
        let b = MemoryBackend::builder().shards(1).max_keys(4).build();
        let short = [p("gcra:limit=10,period=1s")];
        for k in ["a1", "a2", "a3"] {
            assert!(b.check_at(k, &short, 1, 0).into_inner().unwrap().allowed());
        }
        // Keys of other threads, in other shards, fill the cap meanwhile (counted only).
        b.inner.keys.fetch_add(3, Ordering::Relaxed);
        // The check's own sweep drops two expired keys, the cap's sweep the third.
        let q = [p(q)];
        assert!(b
            .check_at("b", &q, 1, 10_000)
            .into_inner()
            .unwrap()
            .allowed());
        assert_eq!(b.len(), 4);
        let again = b.check_at("b", &q, 1, 10_000).into_inner().unwrap();
        assert!(!again.allowed(), "{q:?}: the key's state was lost");
    }
}

#[test]
fn changed_policy_parameters_carry_over_the_units_in_use() {
    let b = MemoryBackend::new();
    let small = p("token-bucket:limit=1,period=1m,name=x");
    let big = p("token-bucket:limit=5,period=1m,name=x");
    assert!(b
        .check_at("k", std::slice::from_ref(&small), 1, 0)
        .into_inner()
        .unwrap()
        .allowed());
    assert!(!b
        .check_at("k", &[small], 1, 0)
        .into_inner()
        .unwrap()
        .allowed());
    // One unit in use carries over to the bigger bucket: 5 − 1 − 1 left.
    assert_eq!(
        b.check_at("k", &[big], 1, 0)
            .into_inner()
            .unwrap()
            .remaining(),
        3
    );
}

#[test]
fn overrides_tiers_and_unconfigured_keys() {
    let b = MemoryBackend::new();
    let limits = Limits::new([p("fixed-window:limit=2,period=1h,name=api")])
        .unwrap()
        .with_tier("pro", [p("fixed-window:limit=5,period=1h,name=api")])
        .unwrap();
    let d = b
        .check_limits("free", &limits, 1, Some(0))
        .into_inner()
        .unwrap();
    assert_eq!((d.applied(), d.remaining()), (&Applied::Defaults, 1));

    let v1 = now(b.set_tier("paying", Some("pro"))).unwrap().version();
    let d = b
        .check_limits("paying", &limits, 1, Some(0))
        .into_inner()
        .unwrap();
    assert_eq!(d.applied(), &Applied::Tier(Arc::from("pro")));
    assert_eq!((d.remaining(), d.version()), (4, v1));

    // An override beats the tier; the count of "api" carries over (same window, 1 used).
    let v2 = now(b.set_override("paying", &[p("fixed-window:limit=3,period=1h,name=api")]))
        .unwrap()
        .version();
    assert!(v2 > v1);
    let d = b
        .check_limits("paying", &limits, 1, Some(0))
        .into_inner()
        .unwrap();
    assert_eq!((d.applied(), d.remaining()), (&Applied::Override, 1));
    assert_eq!(now(b.config("paying")).unwrap().tier(), Some("pro"));
    now(b.remove_override("paying")).unwrap();
    assert_eq!(
        b.check_limits("paying", &limits, 0, Some(0))
            .into_inner()
            .unwrap()
            .applied(),
        &Applied::Tier(Arc::from("pro"))
    );

    // An unknown tier is no configuration.
    now(b.set_tier("odd", Some("gold"))).unwrap().version();
    let deny = limits.clone().when_unconfigured(Unconfigured::Deny);
    let d = b
        .check_limits("odd", &deny, 1, Some(0))
        .into_inner()
        .unwrap();
    assert!(!d.allowed());
    assert_eq!((d.applied(), d.retry_after()), (&Applied::Denied, None));
    let allow = limits.when_unconfigured(Unconfigured::Allow);
    let d = b
        .check_limits("odd", &allow, 1_000_000, Some(0))
        .into_inner()
        .unwrap();
    assert!(d.allowed());
    assert_eq!(d.applied(), &Applied::Unlimited);
    // Configured keys never expire; unconfigured ones do.
    assert_eq!(b.purge_expired(u64::MAX - 1), 1, "only `free` goes");
    assert_eq!(b.len(), 2);
}

#[test]
fn refund_and_reset_give_quota_back_and_bump_the_version() {
    let b = MemoryBackend::new();
    let limits = Limits::new([
        p("token-bucket:limit=4,period=4s,name=tb"),
        p("sliding-log:limit=4,period=4s,name=log"),
    ])
    .unwrap();
    for _ in 0..4 {
        assert!(b
            .check_limits("k", &limits, 1, Some(0))
            .into_inner()
            .unwrap()
            .allowed());
    }
    assert!(!b
        .check_limits("k", &limits, 1, Some(0))
        .into_inner()
        .unwrap()
        .allowed());
    let d = now(b.refund("k", &limits, 2, Some(0))).unwrap();
    assert_eq!((d.remaining(), d.version()), (2, 1));
    // Never beyond a fresh key's capacity.
    let d = now(b.refund("k", &limits, 100, Some(0))).unwrap();
    assert_eq!(d.remaining(), 4);
    b.check_limits("k", &limits, 3, Some(0))
        .into_inner()
        .unwrap();
    let d = now(b.reset("k", &limits, Some(0))).unwrap();
    assert_eq!((d.remaining(), d.version()), (4, 3));
    // A version alone is kept a day, then the key is forgotten.
    assert_eq!(b.purge_expired(86_400_000 - 1), 0);
    assert_eq!(b.purge_expired(86_400_000), 1);
}

#[test]
fn many_threads_on_one_key_never_overshoot() {
    for alg in crate::Algorithm::ALL {
        let b = MemoryBackend::new();
        let pol = [Policy::new(alg, 100, Duration::from_secs(3600)).unwrap()];
        let admitted = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..50 {
                        if b.check_at("k", &pol, 1, 1_000)
                            .into_inner()
                            .unwrap()
                            .allowed()
                        {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(admitted.load(Ordering::Relaxed), 100, "{alg}");
    }
}

/// Every shard's expiry bounds are at most the expiry of each of its entries, on the
/// entry's time base: the sweep never skips a shard holding an expired key.
fn assert_bounds_hold<C>(b: &MemoryBackend<C>) {
    for cell in b.inner.shards.iter() {
        let shard = cell.shard.lock();
        for e in shard.table.entries() {
            let base = usize::from(e.head.explicit());
            let expires_ms = e.head.expires_ms(&shard.policies);
            assert_eq!(expires_ms, e.head.expires_ms_general(&shard.policies));
            assert!(shard.bound[base] <= expires_ms, "{base}: {expires_ms}");
            assert!(cell.bound[base].load(Ordering::Relaxed) <= expires_ms);
        }
    }
}

proptest::proptest! {
    #[test]
    fn expiry_bounds_stay_below_every_entry(
        steps in proptest::collection::vec(
            (0u8..6, 0u64..3_000, 0u64..4, proptest::bool::ANY, 0usize..4),
            1..150,
        ),
    ) {
        let pols = [
            p("token-bucket:limit=3,period=1s"),
            p("gcra:limit=5,period=2s,burst=2"),
            p("leaky-bucket:limit=2,period=500ms"),
            p("fixed-window:limit=4,period=1s"),
        ];
        let clock = ManualClock::new(1_000_000);
        let b = MemoryBackend::builder().clock(clock.clone()).shards(2).build();
        let mut t = 1_000_000u64;
        for (key, dt, cost, explicit, pol) in steps {
            // Mostly forward, sometimes back (a clock that steps back).
            t = if dt % 5 == 0 { t - dt } else { t + dt };
            clock.set_ms(t);
            let key = format!("k{key}");
            let one = std::slice::from_ref(&pols[pol]);
            let d = if explicit {
                b.check_at(&key, one, cost, t).into_inner()
            } else {
                b.check(&key, one, cost).into_inner()
            };
            proptest::prop_assert!(d.is_ok());
            assert_bounds_hold(&b);
        }
    }
}

#[test]
fn empty_policy_list_is_an_error() {
    assert!(matches!(
        MemoryBackend::new().check_at("k", &[], 1, 0).into_inner(),
        Err(BackendError::InvalidRequest(_))
    ));
}

#[test]
fn duplicate_policy_names_are_an_error() {
    // Sharing one state slot, they would overwrite each other's state on every check.
    let b = MemoryBackend::new();
    let pol = [
        p("gcra:limit=2,period=1s,name=x"),
        p("fixed-window:limit=5,period=1s,name=x"),
    ];
    for _ in 0..3 {
        assert!(matches!(
            b.check_at("k", &pol, 1, 0).into_inner(),
            Err(BackendError::InvalidRequest(_))
        ));
    }
    assert!(b.is_empty());
}

#[test]
fn look_alike_keys_each_have_a_quota_of_their_own() {
    // Keys of 0 to 26 bytes in one shard: runs of one character, with the first or last
    // changed, one longer, and non-ASCII ones (é is 2 bytes, 日 3, 🦀 4).
    let mut keys: Vec<String> = Vec::new();
    for n in 0..=26 {
        for unit in ["a", "é", "日", "🦀", "ab"] {
            let run: String = unit.chars().cycle().take(n).collect();
            keys.push(run.clone());
            keys.push(format!("{run}b"));
            keys.push(format!("b{run}"));
            keys.push(format!("{run}\u{0}"));
            if let Some(last) = run.chars().last() {
                let mut changed = run.clone();
                changed.pop();
                changed.push(if last == 'z' { 'y' } else { 'z' });
                keys.push(changed);
            }
        }
    }
    keys.sort();
    keys.dedup();
    let b = MemoryBackend::builder().shards(1).build();
    let pol = [p("fixed-window:limit=1,period=1h")];
    for k in &keys {
        let d = b.check_at(k, &pol, 1, 0).into_inner().unwrap();
        assert!(d.allowed(), "{k:?}");
    }
    for k in &keys {
        let d = b.check_at(k, &pol, 1, 0).into_inner().unwrap();
        assert!(!d.allowed(), "{k:?}");
    }
    assert_eq!(b.len(), keys.len());
}

#[test]
fn a_checks_sweep_leaves_the_checked_keys_expired_entry_in_place() {
    use super::shard::Lookup;
    use super::sweep::Now;
    let clock = ManualClock::new(0);
    let b = MemoryBackend::builder()
        .clock(clock.clone())
        .shards(1)
        .build();
    let pol = [p("token-bucket:limit=10,period=1s")];
    for key in ["a", "b", "c", "d"] {
        assert!(b.check(key, &pol, 1).into_inner().unwrap().allowed());
    }
    // Every key has refilled: each entry has expired.
    clock.advance(Duration::from_secs(2));
    let cell = &b.inner.shards[0];
    let mut shard = cell.shard.lock();
    let at = Lookup::new(&b.inner.hasher, "d");
    let d = shard.table.find(at.hash, &at.probe);
    assert_eq!(d, Some(3), "the last entry");
    let now = Now {
        ms: clock.now_ms(),
        explicit: false,
    };
    // The other three go; the last entry took the place of the first dropped, and the
    // spared index follows it there.
    let swept = shard.sweep_sparing(&b.inner.hasher, cell, now, 4, d);
    assert_eq!(swept.dropped, 3);
    assert_eq!(shard.table.len(), 1);
    assert_eq!(swept.spare, Some(0));
    assert!(swept.passed);
    assert_eq!(
        shard.table.get(0).map(|e| e.key.as_bytes()),
        Some(&b"d"[..])
    );
    assert_eq!(shard.table.find(at.hash, &at.probe), Some(0));
    shard.note_entry(cell, swept.spare);
    drop(shard);
    b.dropped(swept.dropped);
    assert_eq!(b.len(), 1);
    // Its check then decides on the entry in place; once nothing checks it, it goes too.
    assert!(b.check("d", &pol, 1).into_inner().unwrap().allowed());
    clock.advance(Duration::from_secs(2));
    assert_bounds_hold(&b);
    for _ in 0..4 {
        assert!(b.check("e", &pol, 0).into_inner().unwrap().allowed());
    }
    assert_eq!(
        b.len(),
        0,
        "a query (cost 0) stores nothing, and `d` was swept"
    );
}
