//! Heap bytes per tracked key: turnstile's `MemoryBackend` and governor's keyed limiter, for
//! the same keys, measured the same way — live heap bytes (dhat's global allocator: the bytes
//! asked for, as `turnstile-core`'s `bytes_per_key` test counts them) after the keys are
//! checked once, minus before, over the number of keys.
//!
//! `cargo bench -p turnstile-benches --bench bytes_per_key` (also run by
//! `scripts/bench-memory.sh`). Keys: 20,000 strings of 12 bytes, `10.000.000.1` to
//! `10.019.999.1`, as in the `bytes_per_key` test; also 10,000 `10.0.x.y` keys (the
//! `vs_governor` set) and 20,000 IPv6 /64 keys (`2001:db8:x:y::/64`, 17 to 21 bytes).
//! turnstile: one token-bucket or GCRA policy (1 per second, burst 4·10⁹, as in
//! `vs_governor`), checked through `Backend::check` at an explicit time; governor:
//! `RateLimiter::keyed` (a `DashMap<String, _>`) with the same quota, keys passed as `String`.

use std::num::NonZeroU32;
use std::time::Duration;

use governor::{Quota, RateLimiter};
use turnstile_core::{Algorithm, Backend, MemoryBackend, Policy};

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

/// Burst of every quota, as in `vs_governor`.
const BURST: u32 = 4_000_000_000;

fn live_bytes() -> u64 {
    dhat::HeapStats::get().curr_bytes as u64
}

/// Heap bytes per key that `insert` leaves live after inserting every key of `keys` into a
/// store it builds itself (and keeps alive until measured).
fn per_key<S>(keys: &[String], build: impl Fn() -> S, insert: impl Fn(&S, &String)) -> f64 {
    let before = live_bytes();
    let store = build();
    for k in keys {
        insert(&store, k);
    }
    let after = live_bytes();
    drop(store);
    (after - before) as f64 / keys.len() as f64
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") && std::env::args().len() > 1 {
        eprintln!("usage: cargo bench -p turnstile-benches --bench bytes_per_key");
        std::process::exit(2);
    }
    let _profiler = dhat::Profiler::builder().testing().build();
    let quota =
        Quota::per_second(NonZeroU32::MIN).allow_burst(NonZeroU32::new(BURST).expect("non-zero"));
    let policy = |alg: Algorithm| {
        [Policy::new(alg, 1, Duration::from_secs(1))
            .and_then(|p| p.with_burst(u64::from(BURST)))
            .expect("a valid policy")]
    };
    let (tb, gcra) = (policy(Algorithm::TokenBucket), policy(Algorithm::Gcra));
    let sets: [(&str, Vec<String>); 3] = [
        (
            "20,000 keys of 12 bytes (10.000.000.1 ...)",
            (0..20_000)
                .map(|i| format!("10.{:03}.{:03}.1", i / 1000, i % 1000))
                .collect(),
        ),
        (
            "10,000 keys 10.0.x.y (7-10 bytes)",
            (0..10_000)
                .map(|i| format!("10.0.{}.{}", i / 256, i % 256))
                .collect(),
        ),
        (
            "20,000 IPv6 /64 keys (2001:db8:x:y::/64, 17-21 bytes)",
            (0..20_000)
                .map(|i| format!("2001:db8:{:x}:{:x}::/64", i / 300, i % 300))
                .collect(),
        ),
    ];
    println!("# heap bytes per key (dhat: live bytes asked for), one policy per key");
    println!(
        "{:<55} {:>16} {:>16} {:>16} {:>10} {:>10}",
        "keys", "turnstile tb", "turnstile gcra", "governor keyed", "tb/keyed", "gcra/keyed"
    );
    for (label, keys) in &sets {
        let memory = |p: &[Policy; 1]| {
            per_key(keys, MemoryBackend::new, |b, k| {
                let d = b.check_at(k, p, 1, 1_000).into_inner();
                assert!(d.is_ok_and(|d| d.allowed()));
            })
        };
        let t_tb = memory(&tb);
        let t_gcra = memory(&gcra);
        let g = per_key(
            keys,
            || RateLimiter::keyed(quota),
            |g, k| assert!(g.check_key(k).is_ok()),
        );
        println!(
            "{label:<55} {t_tb:>16.1} {t_gcra:>16.1} {g:>16.1} {:>10.2} {:>10.2}",
            t_tb / g,
            t_gcra / g
        );
    }
}
