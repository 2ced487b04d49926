//! Issue 25, fault 3: a freshly built backend hit by a burst. Before, the burst's first calls
//! each waited to connect and each loaded the Function library, timed out, and were decided
//! by each process's local fallback: two processes admitted 10–14 against a limit of 5 with
//! no fault at all. The backend now warms up in the background as it is built (connect,
//! check the server, load the library), so the first burst finds it warm; a burst that comes
//! while it warms up waits for that one warm-up.

use std::time::Duration;

use turnstile_core::wrap::Fallback;
use turnstile_core::{Backend, FailurePolicy, Policy};
use turnstile_redis::RedisBackend;
use turnstile_tests::redis_server::{command_calls, wait_for, RedisServer};

/// Every wait for a backend to warm up.
const WITHIN: Duration = Duration::from_secs(20);
/// The burst: concurrent requests per process, on one key.
const BURST: usize = 40;
/// The limit of the burst's key.
const LIMIT: u64 = 5;

fn p(spec: &str) -> Policy {
    spec.parse().unwrap()
}

fn policy() -> [Policy; 1] {
    [p(&format!(
        "fixed-window:limit={LIMIT},period=1h,name=cold"
    ))]
}

/// A process's backend as a service runs it: Redis behind the local fallback (the layer's
/// default failure policy), with the service's default 100 ms timeout unless told.
fn process(url: &str, prefix: &str, timeout: Duration) -> (RedisBackend, Fallback<RedisBackend>) {
    let redis = RedisBackend::builder(url)
        .prefix(prefix)
        .timeout(timeout)
        .build()
        .unwrap();
    let fallback = Fallback::new(redis.clone(), FailurePolicy::Local);
    (redis, fallback)
}

/// Waits, off the runtime's threads, until `redis` has made its first connection.
async fn warmed(redis: &RedisBackend) {
    let r = redis.clone();
    tokio::task::spawn_blocking(move || {
        wait_for(WITHIN, "the backend to warm up", || r.stats().connects == 1)
    })
    .await
    .unwrap();
}

/// `BURST` concurrent checks of `key` on each backend; returns (admitted, denied, failed).
async fn burst(backends: &[Fallback<RedisBackend>], key: &str) -> (u64, u64, u64) {
    let pol = policy();
    let mut tasks = Vec::new();
    for b in backends {
        for _ in 0..BURST {
            let (b, pol, key) = (b.clone(), pol.clone(), key.to_owned());
            tasks.push(tokio::spawn(async move { b.check(&key, &pol, 1).await }));
        }
    }
    let (mut admitted, mut denied, mut failed) = (0, 0, 0);
    for t in tasks {
        match t.await.unwrap() {
            Ok(d) if d.allowed() => admitted += 1,
            Ok(_) => denied += 1,
            Err(_) => failed += 1,
        }
    }
    (admitted, denied, failed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_cold_processes_under_a_burst_admit_exactly_the_limit() {
    let server = RedisServer::start();
    let prefix = format!("turnstile:cold:{}", std::process::id());
    let timeout = Duration::from_millis(100);
    let (a, fa) = process(&server.url(), &prefix, timeout);
    let (b, fb) = process(&server.url(), &prefix, timeout);
    // No request yet: each warms up on its own as it is built.
    warmed(&a).await;
    warmed(&b).await;
    assert_eq!(a.stats().redis_calls + b.stats().redis_calls, 0);
    // The library is there before the first check.
    assert!(command_calls(server.port(), "function|load") >= 1);

    let (admitted, denied, failed) = burst(&[fa.clone(), fb.clone()], "client").await;
    assert_eq!(
        (admitted, denied, failed),
        (LIMIT, 2 * BURST as u64 - LIMIT, 0),
        "the burst of two cold processes"
    );
    // Every request was decided by Redis, none by a process alone.
    assert_eq!(fa.local_decisions() + fb.local_decisions(), 0);
    // One connection each; the burst loaded nothing.
    assert_eq!((a.stats().connects, b.stats().connects), (1, 1));
    assert!(a.stats().script_loads + b.stats().script_loads <= 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_while_the_backend_warms_up_waits_for_that_one_warm_up() {
    // The burst comes as the backends are built, before their warm-up ends. Each of its
    // requests waits for the one connection being made, whose library is loaded once,
    // rather than each connecting or loading the library itself. (A timeout that covers the
    // warm-up on a loaded machine: with 100 ms, requests of a burst that comes sooner than
    // the warm-up ends fail, and the fallback decides them; RELIABILITY.md says so.)
    let server = RedisServer::start();
    let prefix = format!("turnstile:cold-burst:{}", std::process::id());
    let timeout = Duration::from_secs(2);
    let (a, fa) = process(&server.url(), &prefix, timeout);
    let (b, fb) = process(&server.url(), &prefix, timeout);
    let (admitted, denied, failed) = burst(&[fa.clone(), fb.clone()], "client").await;
    assert_eq!(
        (admitted, denied, failed),
        (LIMIT, 2 * BURST as u64 - LIMIT, 0)
    );
    assert_eq!(fa.local_decisions() + fb.local_decisions(), 0);
    assert_eq!((a.stats().connects, b.stats().connects), (1, 1));
    // One look for the library per process, not one per request.
    assert_eq!(command_calls(server.port(), "function|list"), 2);
    assert!(a.stats().script_loads <= 1 && b.stats().script_loads <= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_built_while_redis_is_down_warms_up_once_redis_is_there() {
    let mut server = RedisServer::start();
    server.kill();
    // build() never waits for Redis, and works while it is down.
    let prefix = format!("turnstile:cold-down:{}", std::process::id());
    let (redis, fallback) = process(&server.url(), &prefix, Duration::from_millis(100));
    let e = redis.check("client", &policy(), 1).await.unwrap_err();
    assert!(e.to_string().contains("connection failed"), "{e}");
    server.restart();
    // Connected without a request: it kept trying in the background.
    warmed(&redis).await;
    let (admitted, denied, failed) = burst(std::slice::from_ref(&fallback), "client").await;
    assert_eq!((admitted, denied, failed), (LIMIT, BURST as u64 - LIMIT, 0));
    assert_eq!(fallback.local_decisions(), 0);
}
