//! Heap bytes per tracked key in the in-memory backend, counted by dhat's global allocator
//! (one test in this binary, so nothing else allocates while it counts). The figures are the
//! ones MemoryBackend's docs state; the test keeps them from growing.

use std::time::Duration;

use turnstile_core::{Backend, MemoryBackend, Policy};

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

fn live_bytes() -> u64 {
    dhat::HeapStats::get().curr_bytes as u64
}

#[test]
fn bytes_per_key() {
    let _profiler = dhat::Profiler::builder().testing().build();
    let n: u64 = 20_000;
    // Keys of 12 bytes, like IPv4 addresses ("10.0.12.34" and such).
    let keys: Vec<String> = (0..n)
        .map(|i| format!("10.{:03}.{:03}.1", i / 1000, i % 1000))
        .collect();
    let measure = |policy: Policy, cost: u64| {
        let b = MemoryBackend::new();
        let policies = [policy];
        let before = live_bytes();
        for k in &keys {
            b.check_at(k, &policies, cost, 1_000).into_inner().unwrap();
        }
        let per_key = (live_bytes() - before) as f64 / n as f64;
        drop(b);
        per_key
    };
    let hour = Duration::from_secs(3600);
    let bucket = measure(Policy::token_bucket(100, hour).unwrap(), 1);
    let window = measure(Policy::sliding_window(100, hour).unwrap(), 1);
    let log = measure(Policy::sliding_log(100, hour).unwrap(), 1);
    println!("bytes per key (12-byte keys): token bucket {bucket:.0}, sliding window {window:.0}, sliding log with one entry {log:.0}");
    // MemoryBackend's docs: about 245 bytes; a sliding log about 100 more for its log.
    assert!(bucket <= 260.0, "token bucket: {bucket} bytes per key");
    assert!(window <= 260.0, "sliding window: {window} bytes per key");
    assert!(log <= 360.0, "sliding log: {log} bytes per key");
}
