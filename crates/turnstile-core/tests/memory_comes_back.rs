//! Heap bytes of the in-memory backend before, during and after a flood of one-off keys,
//! counted by dhat's global allocator (one test in this binary, so nothing else allocates
//! while it counts), on a manual clock.

use std::time::Duration;

use turnstile_core::{Backend, ManualClock, MemoryBackend, Policy};

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

fn live_bytes() -> u64 {
    dhat::HeapStats::get().curr_bytes as u64
}

#[test]
fn the_memory_of_a_flood_comes_back_once_its_keys_expire() {
    let _profiler = dhat::Profiler::builder().testing().build();
    // 50,000 client IPs once each, on a 60 s sliding log (the reported flood: 330,000 IPs
    // left the process at 121 MB, 18 MB before, long after every key expired).
    let n = 50_000u64;
    let keys: Vec<String> = (0..n)
        .map(|i| format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255))
        .collect();
    let policies = [Policy::sliding_log(100, Duration::from_secs(60)).unwrap()];
    let clock = ManualClock::new(1_700_000_000_000);

    // Without traffic: the sweep on a timer calls this.
    let swept = MemoryBackend::builder().clock(clock.clone()).build();
    let before = live_bytes();
    for k in &keys {
        assert!(swept.check(k, &policies, 1).into_inner().unwrap().allowed());
    }
    let during = live_bytes() - before;
    assert_eq!(swept.len(), n as usize);
    clock.advance(Duration::from_secs(60));
    assert_eq!(swept.sweep_expired(), n as usize);
    assert_eq!(swept.len(), 0);
    let after = live_bytes().saturating_sub(before);
    println!("without traffic: {during} bytes during, {after} after");
    assert!(during > n * 100, "the flood took only {during} bytes");
    assert!(
        after <= 16 * 1024,
        "{after} bytes kept after every key expired"
    );

    // With traffic from one other client only: its checks sweep every shard.
    let traffic = MemoryBackend::builder().clock(clock.clone()).build();
    let before = live_bytes();
    for k in &keys {
        assert!(traffic
            .check(k, &policies, 1)
            .into_inner()
            .unwrap()
            .allowed());
    }
    clock.advance(Duration::from_secs(60));
    let mut checks = 0;
    while traffic.len() > 1 && checks < 200_000 {
        assert!(
            traffic
                .check("regular", &policies, 1)
                .into_inner()
                .unwrap()
                .allowed()
                || checks >= 100
        );
        checks += 1;
    }
    assert_eq!(traffic.len(), 1, "after {checks} checks");
    let after = live_bytes().saturating_sub(before);
    println!(
        "one client's traffic: every key gone after {checks} checks ({} per key), {after} bytes kept",
        checks as f64 / n as f64
    );
    assert!(
        after <= 16 * 1024,
        "{after} bytes kept after every key expired"
    );
}
