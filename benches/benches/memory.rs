//! One in-memory decision per algorithm: a hot key and 10,000 keys, on 1 and 2 threads.
//!
//! `cargo bench -p turnstile-benches --bench memory`. Every policy admits everything (a
//! limit far above the request rate), so the measured path is the one that writes state.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use turnstile_core::{Algorithm, Backend, MemoryBackend, Policy};

const KEYS: usize = 10_000;

fn policy(alg: Algorithm) -> Policy {
    // 4e9 per 1 s: nothing is ever denied, and max(L, B)·P stays below 2^53.
    Policy::new(alg, 4_000_000_000, Duration::from_secs(1)).expect("a valid policy")
}

fn keys() -> Vec<String> {
    (0..KEYS)
        .map(|i| format!("10.0.{}.{}", i / 256, i % 256))
        .collect()
}

/// Runs `iters` decisions split over `threads` threads; returns the wall time.
fn run(
    backend: &MemoryBackend,
    policies: &[Policy],
    keys: &[String],
    threads: usize,
    iters: u64,
) -> Duration {
    let per_thread = iters / threads as u64;
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || {
                let mut now = 1_700_000_000_000u64;
                for i in 0..per_thread {
                    let key = &keys[(i as usize * 7 + t * 13) % keys.len()];
                    now += i & 1;
                    black_box(backend.check_at(key, policies, 1, now).into_inner().ok());
                }
            });
        }
    });
    start.elapsed()
}

fn decisions(c: &mut Criterion) {
    let many = keys();
    let hot = vec!["10.0.0.1".to_owned()];
    for alg in Algorithm::ALL {
        let mut group = c.benchmark_group(format!("memory/{alg}"));
        group.throughput(Throughput::Elements(1));
        let policies = [policy(alg)];
        for (label, keys) in [("hot-key", &hot), ("10k-keys", &many)] {
            for threads in [1, 2] {
                let backend = MemoryBackend::new();
                group.bench_function(BenchmarkId::new(label, format!("{threads}-thread")), |b| {
                    b.iter_custom(|iters| {
                        run(
                            &backend,
                            &policies,
                            keys,
                            threads,
                            iters.max(threads as u64),
                        )
                    });
                });
            }
        }
        group.finish();
    }
}

criterion_group!(benches, decisions);
criterion_main!(benches);
