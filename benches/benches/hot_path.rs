//! A fixed number of in-memory decisions of one contender, for instruction-level profiles:
//! callgrind counts instructions repeatably even on a busy machine, where the timed
//! `vs_governor` bench cannot. `scripts/profile-memory.sh` runs it under callgrind twice per
//! case and prints instructions per decision (the difference of the two runs, so set-up and
//! warm-up cancel out).
//!
//! ```text
//! hot_path CONTENDER KEYS THREADS COUNT
//! ```
//!
//! - CONTENDER: `tb` or `gcra` (turnstile's `MemoryBackend` with one token-bucket or GCRA
//!   policy, checked through `Backend::check` on the backend's default clock, as
//!   `vs_governor` checks), `keyed` (governor's keyed limiter, a `DashMap` of `String` keys) or
//!   `direct` (governor's direct limiter, one atomic);
//! - KEYS: `hot` (one key) or `10k` (10,000 keys `10.0.x.y`, walked as `vs_governor` walks
//!   them);
//! - THREADS: threads deciding at once (each makes COUNT decisions);
//! - COUNT: decisions per thread, after one warm-up pass over the keys.
//!
//! The quotas are `vs_governor`'s: 1 per second with a burst of 4·10⁹, so every decision
//! admits and writes state. It prints how many decisions admitted (all of them).

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use governor::{Quota, RateLimiter};
use turnstile_core::{Algorithm, Backend, MemoryBackend, Policy};

/// Burst of every quota (refilled at one per second), as in `vs_governor`.
const BURST: u32 = 4_000_000_000;

fn usage() -> ! {
    eprintln!("usage: hot_path tb|gcra|keyed|direct hot|10k THREADS COUNT");
    std::process::exit(2)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // `cargo bench` passes `--bench`: nothing to do then.
    if args.len() != 4 {
        if args.iter().any(|a| a == "--bench") {
            return;
        }
        usage();
    }
    let contender = args[0].as_str();
    let keys: Vec<String> = match args[1].as_str() {
        "hot" => vec!["10.0.0.1".to_owned()],
        "10k" => (0..10_000)
            .map(|i| format!("10.0.{}.{}", i / 256, i % 256))
            .collect(),
        _ => usage(),
    };
    let threads: usize = args[2].parse().unwrap_or_else(|_| usage());
    let count: u64 = args[3].parse().unwrap_or_else(|_| usage());

    let quota =
        Quota::per_second(NonZeroU32::MIN).allow_burst(NonZeroU32::new(BURST).expect("non-zero"));
    let policy = |alg: Algorithm, name: &str| {
        [Policy::new(alg, 1, Duration::from_secs(1))
            .and_then(|p| p.with_burst(u64::from(BURST)))
            .and_then(|p| p.with_name(name))
            .expect("a valid policy")]
    };
    let tb = policy(Algorithm::TokenBucket, "tb");
    let tb_limits = turnstile_core::Limits::new(tb.clone()).expect("one policy");
    let gcra = policy(Algorithm::Gcra, "gcra");
    let backend = MemoryBackend::new();
    let keyed = RateLimiter::keyed(quota);
    let direct = RateLimiter::direct(quota);
    let decide = |k: &String| -> bool {
        match contender {
            "tb" => backend
                .check(k, &tb, 1)
                .into_inner()
                .is_ok_and(|d| d.allowed()),
            "gcra" => backend
                .check(k, &gcra, 1)
                .into_inner()
                .is_ok_and(|d| d.allowed()),
            "tb-limits" => backend
                .check_limits(k, &tb_limits, 1, None)
                .into_inner()
                .is_ok_and(|d| d.allowed()),
            "keyed" => keyed.check_key(k).is_ok(),
            "direct" => direct.check().is_ok(),
            _ => usage(),
        }
    };
    for k in &keys {
        decide(k);
    }
    let admitted = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..threads {
            let (keys, decide, admitted) = (&keys, &decide, &admitted);
            s.spawn(move || {
                let mut i = t * 13;
                let mut n = 0;
                for _ in 0..count {
                    n += u64::from(black_box(decide(&keys[i % keys.len()])));
                    i = i.wrapping_add(7);
                }
                admitted.fetch_add(n, Ordering::Relaxed);
            });
        }
    });
    println!(
        "{contender} {} threads {threads}: {} of {} admitted",
        args[1],
        admitted.load(Ordering::Relaxed),
        count * threads as u64
    );
}
