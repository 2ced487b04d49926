//! Issue 25, fault 2: a fast restart (`kill -9`, the server back on the same port within
//! about 100 ms) under steady load fails only the requests in flight during it, and no check
//! sent once Redis answers `PING` again. Before: the refused connections of the gap counted as
//! three failed rounds within milliseconds, and the node stayed "down" until its probe a
//! second later.

use std::time::{Duration, Instant};

use turnstile_core::Policy;
use turnstile_redis::RedisBackend;
use turnstile_tests::load::{Counts, Got, Load, Seen};
use turnstile_tests::redis_server::RedisServer;

/// Every wait for the load to reach a point.
const WITHIN: Duration = Duration::from_secs(20);

fn p(spec: &str) -> Policy {
    spec.parse().unwrap()
}

/// One restart: when the kill began, and when the new server answered `PING`.
struct Restart {
    killing: Instant,
    back: Instant,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_restart_fails_only_the_requests_in_flight() {
    let mut server = RedisServer::start();
    // The defaults a service runs with: a node counts as down after 3 failed rounds, and is
    // probed once a second after timeouts.
    let backend = RedisBackend::builder(server.url())
        .prefix(format!("turnstile:restart-fast:{}", std::process::id()))
        .timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let pol = [p("fixed-window:limit=1000000,period=100d,name=fast")];
    let keys: Vec<String> = (0..6).map(|i| format!("k{i}")).collect();
    let load = Load::start(&backend, &keys, &pol, Duration::from_millis(2));
    load.wait_each_decided(30, WITHIN).await;
    let mut restarts = Vec::new();
    // Restarts of about 25, 75 and 115 ms on this machine (the server's own start-up
    // takes about 25 ms).
    for pause in [0, 50, 90] {
        let killing = Instant::now();
        // kill -9, then the same port again; returns once the new server answers PING.
        tokio::task::block_in_place(|| server.restart_after(Duration::from_millis(pause)));
        let back = Instant::now();
        restarts.push(Restart { killing, back });
        load.wait_each_decided(50, WITHIN).await;
    }
    let seen = load.stop().await;

    for (i, r) in restarts.iter().enumerate() {
        let next = restarts.get(i + 1).map_or(Instant::now(), |n| n.killing);
        // In flight during the restart: sent before PING was answered, answered after the kill.
        let in_flight = |s: &&Seen| s.sent < r.back && s.sent + s.took > r.killing;
        let during = Counts::of(seen.iter().filter(in_flight));
        // Sent once Redis answered PING, answered before the next kill.
        let after = Counts::of(
            seen.iter()
                .filter(|s| s.sent >= r.back && s.sent + s.took < next),
        );
        assert_eq!(
            (after.failed, after.denied),
            (0, 0),
            "restart {i}: a check sent after Redis answered PING again failed: {after:?}"
        );
        assert!(after.admitted > 0, "restart {i}: nothing sent after it");
        eprintln!(
            "restart {i}: Redis answered PING again {:?} after the kill; of {} requests in \
             flight meanwhile {} failed; {} after, none failed",
            r.back - r.killing,
            during.total(),
            during.failed,
            after.total()
        );
    }
    // Every failure was in flight during a restart; none was the node counting as down.
    for s in seen.iter().filter(|s| s.got == Got::Failed) {
        assert!(
            restarts
                .iter()
                .any(|r| s.sent < r.back && s.sent + s.took > r.killing),
            "a failure outside any restart: {:?}",
            s.error
        );
        let e = s.error.as_deref().unwrap_or_default();
        assert!(!e.contains("counts as down"), "{e}");
    }
    assert!(backend.nodes_down().is_empty());
    // One connection per server: the first, then one after each restart.
    assert_eq!(backend.stats().connects, 4);
}
