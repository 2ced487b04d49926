//! Issue 25, fault 1: a connection that stops answering without being closed — a lost NAT or
//! conntrack entry (a TCP proxy holding every byte of the connections it carries, while new
//! connections pass), a host or VM frozen (`SIGSTOP` on a real `redis-server`) — is replaced,
//! on a single node, through Sentinel and on a Cluster. Each test runs steady load and
//! asserts what every request got in each phase of the fault.

use std::time::{Duration, Instant};

use turnstile_core::{Backend, BackendError, ManualClock, Policy};
use turnstile_redis::{redis, NodeDown, RedisBackend};
use turnstile_tests::load::{sent_between, Counts, Got, Load, Seen};
use turnstile_tests::proxy::Proxy;
use turnstile_tests::redis_server::{
    query, start_replica, wait_for, RedisCluster, RedisSentinel, RedisServer,
};

/// Every wait for the load or the deployment to reach a point.
const WITHIN: Duration = Duration::from_secs(20);
/// "Within a few seconds": the most a recovery may take, counted from the moment it became
/// possible (the silence, or the replica's promotion). Measured: well under a second on a
/// single node, one to two seconds after a failover (see RELIABILITY.md).
const RECOVERY: Duration = Duration::from_secs(5);
/// A Cluster that fails a master over within about 2 s and serves the other masters' slots
/// meanwhile.
const FAST_FAILOVER: [&str; 4] = [
    "--cluster-node-timeout",
    "1000",
    "--cluster-require-full-coverage",
    "no",
];
/// The pause between two requests of one load task.
const PAUSE: Duration = Duration::from_millis(2);

fn prefix(test: &str) -> String {
    format!("turnstile:silent:{test}:{}", std::process::id())
}

fn p(spec: &str) -> Policy {
    spec.parse().unwrap()
}

/// Nothing is denied within a test: every decision is an admission.
fn policy(name: &str) -> Vec<Policy> {
    vec![p(&format!(
        "fixed-window:limit=1000000,period=100d,name={name}"
    ))]
}

/// When the first request sent at or after `t` that was decided got its answer: the node
/// served again. (Requests sent while that one was in flight, the probe of a node that counts
/// as down, may still fail fast.)
fn served_again(seen: &[Seen], t: Instant) -> Option<Instant> {
    seen.iter()
        .filter(|s| s.sent >= t && s.got != Got::Failed)
        .map(|s| s.sent + s.took)
        .min()
}

/// A backend at `url` with the services' 100 ms timeout, and steady load on `keys` keys,
/// returned once every key was decided a few times.
async fn loaded(url: &str, test: &str, keys: usize) -> (RedisBackend, Vec<String>, Load) {
    let backend = RedisBackend::builder(url)
        .prefix(prefix(test))
        .timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let keys: Vec<String> = (0..keys).map(|i| format!("k{i}")).collect();
    let load = Load::start(&backend, &keys, &policy(test), PAUSE);
    load.wait_each_decided(30, WITHIN).await;
    (backend, keys, load)
}

/// Every failure is one the fault explains: a timeout, or a connection error (a node that
/// counts as down, or a connection attempt that failed).
fn assert_failures_explained(seen: &[Seen]) {
    for s in seen.iter().filter(|s| s.got == Got::Failed) {
        let e = s.error.as_deref().unwrap_or_default();
        assert!(
            e.contains("did not answer within") || e.contains("connection failed"),
            "an unexplained failure: {e}"
        );
    }
}

/// What the requests of a fault injected from `injecting` to `injected` got: every request
/// answered before it was decided, every failure is explained, the fault failed some requests
/// of `faulted` (the ones it reaches), and once the node served them again, none failed.
struct Phases {
    /// When the first request of `faulted` sent after the fault was answered.
    back: Instant,
    /// The requests of `faulted` sent from the fault until then.
    during: Counts,
    /// The requests of `faulted` sent after it.
    after: Counts,
}

impl Phases {
    fn of(seen: &[Seen], faulted: &[Seen], injecting: Instant, injected: Instant) -> Self {
        assert_failures_explained(seen);
        let before = Counts::of(seen.iter().filter(|s| s.sent + s.took < injecting));
        assert_eq!((before.failed, before.denied), (0, 0), "before: {before:?}");
        let back = served_again(faulted, injected).expect("checks resumed");
        let during = Counts::of(sent_between(faulted, injected, back));
        assert!(during.failed > 0, "the fault never bit");
        let after = Counts::of(faulted.iter().filter(|s| s.sent >= back));
        assert_eq!((after.failed, after.denied), (0, 0), "after: {after:?}");
        Phases {
            back,
            during,
            after,
        }
    }
}

/// Polls `cond` off the runtime's threads until it holds; panics after [`WITHIN`].
async fn wait_until(what: &'static str, cond: impl FnMut() -> bool + Send + 'static) -> Instant {
    tokio::task::spawn_blocking(move || {
        wait_for(WITHIN, what, cond);
        Instant::now()
    })
    .await
    .unwrap()
}

fn is_master(port: u16) -> bool {
    query(port, "INFO replication").is_ok_and(|i| i.contains("role:master"))
}

/// The port of the primary the Sentinel on `port` names for `service`.
fn named_primary(port: u16, service: &str) -> Option<u16> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
    let mut conn = client
        .get_connection_with_timeout(Duration::from_secs(2))
        .ok()?;
    let addr: Vec<String> = redis::cmd("SENTINEL")
        .arg("GET-MASTER-ADDR-BY-NAME")
        .arg(service)
        .query(&mut conn)
        .ok()?;
    addr.get(1)?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_gone_silent_is_replaced_and_checks_resume() {
    // Before: the backend kept the silent connection for good — every check timed out (a
    // 503 under `closed`) while new connections to the same address answered.
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let (backend, keys, load) = loaded(&proxy.url(), "single", 6).await;
    let pol = policy("single");
    assert_eq!(proxy.carried(), 1, "one connection before the fault");

    let injecting = Instant::now();
    proxy.silence();
    let injected = Instant::now();
    load.wait_each_decided(100, WITHIN).await;
    let seen = load.stop().await;

    let Phases {
        back,
        during,
        after,
    } = Phases::of(&seen, &seen, injecting, injected);
    let failed = during.failed;
    let recovery = back - injected;
    assert!(
        recovery < RECOVERY,
        "checks resumed {recovery:?} after the silence"
    );
    // One new connection, made through the same address.
    assert_eq!((backend.stats().connects, proxy.carried()), (2, 2));

    // Redis charged every admission once; what it charged beyond them is checks whose
    // answers the silence swallowed after Redis ran them (failed, never admitted).
    let direct = RedisBackend::builder(server.url())
        .prefix(prefix("single"))
        .build()
        .unwrap();
    let mut charged = 0;
    for k in &keys {
        let d = direct.check(k, &pol, 0).await.unwrap();
        charged += 1_000_000 - d.remaining();
    }
    let admitted = u64::try_from(Counts::of(&seen).admitted).unwrap();
    assert!(
        charged >= admitted && charged - admitted <= u64::try_from(failed).unwrap(),
        "charged {charged}, admitted {admitted}, failed {failed}"
    );
    eprintln!(
        "silent connection: checks served again {recovery:?} after it went silent; \
         {failed} of {} requests sent meanwhile failed; {} after, none failed",
        during.total(),
        after.total()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_counted_down_on_timeouts_is_probed_on_a_new_connection() {
    // Before: the probe went out on the connection that had gone silent, timed out, and the
    // node stayed down for good.
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let clock = ManualClock::new(1_000_000);
    let backend = RedisBackend::builder(proxy.url())
        .prefix(prefix("probe"))
        .timeout(Duration::from_millis(200))
        .retry_interval(Duration::from_secs(5))
        .failure_threshold(1)
        .clock(clock.clone())
        .build()
        .unwrap();
    let pol = policy("probe");
    assert!(backend.check("k", &pol, 1).await.unwrap().allowed());
    proxy.silence();
    let e = backend.check("k", &pol, 1).await.unwrap_err();
    assert!(matches!(e, BackendError::Timeout { .. }), "{e}");
    assert_eq!(backend.nodes_down(), [proxy.url()]);
    // The node counts as down, and its connection is replaced at once, in the background —
    // before any probe.
    let stats = backend.clone();
    wait_until("a new connection", move || stats.stats().connects == 2).await;
    assert_eq!(proxy.carried(), 2);
    // A timeout: the node rests for the retry interval (5 s on this clock, which has not
    // moved), whatever the new connection says.
    let e = backend.check("k", &pol, 1).await.unwrap_err();
    let down = match &e {
        BackendError::Connection(src) => src.downcast_ref::<NodeDown>(),
        _ => None,
    }
    .unwrap_or_else(|| panic!("{e}"));
    assert_eq!(
        (down.failures(), down.retry_in()),
        (1, Duration::from_secs(5))
    );
    clock.advance(Duration::from_secs(5));
    // The probe goes out on the new connection and brings the node back.
    for _ in 0..3 {
        assert!(backend.check("k", &pol, 1).await.unwrap().allowed());
    }
    assert!(backend.nodes_down().is_empty());
    assert_eq!((backend.stats().connects, proxy.carried()), (2, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_a_frozen_primary_is_left_for_its_promoted_replica() {
    // Before: the primary, frozen with SIGSTOP, was replaced by its replica within 2 s, yet
    // every check after it failed (the connection to the frozen primary was never dropped).
    let primary = RedisServer::start();
    let replica = start_replica(primary.port(), &[]);
    let sentinel = RedisSentinel::start(primary.port(), "frozen", 500, 2000);
    let (sp, rp) = (sentinel.port(), replica.port());
    wait_until("the Sentinel to know the replica", move || {
        query(sp, "SENTINEL REPLICAS frozen").is_ok_and(|r| r.starts_with('*') && r != "*0\r\n")
    })
    .await;
    let url = format!("redis+sentinel://127.0.0.1:{sp}/frozen");
    let (_backend, _keys, load) = loaded(&url, "sentinel", 4).await;

    let freezing = Instant::now();
    primary.freeze();
    let frozen = Instant::now();
    // Promoted: the Sentinel names the replica, which answers as a primary (what a client
    // that asks the Sentinels can follow from then on).
    let promoted = wait_until("the Sentinel to name the promoted replica", move || {
        named_primary(sp, "frozen") == Some(rp) && is_master(rp)
    })
    .await;
    load.wait_each_decided(100, WITHIN).await;
    let seen = load.stop().await;

    let Phases {
        back,
        during,
        after,
    } = Phases::of(&seen, &seen, freezing, frozen);
    let late = back.saturating_duration_since(promoted);
    assert!(
        late < RECOVERY,
        "checks resumed {late:?} after the promotion"
    );
    eprintln!(
        "Sentinel, primary frozen: replica promoted {:?} after the freeze, checks served \
         again {late:?} after the promotion; {} requests failed meanwhile, none of {} after",
        promoted - frozen,
        during.failed,
        after.total()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_a_frozen_masters_keys_go_to_its_promoted_replica() {
    // Before: a frozen master's keys kept failing 23 s after its replica's promotion: the
    // Cluster client learns a new layout only from what its nodes answer, and a frozen node
    // answers nothing.
    let cluster = RedisCluster::start_with_replicas(3, &FAST_FAILOVER);
    let backend = RedisBackend::builder(cluster.urls())
        .prefix(prefix("cluster"))
        .timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let pol = policy("cluster");
    // Two client keys per master.
    let mut keys: Vec<(String, usize)> = Vec::new();
    for i in 0.. {
        let key = format!("client-{i}");
        let master = cluster.node_of_key(&backend.state_key(&key));
        if keys.iter().filter(|(_, m)| *m == master).count() < 2 {
            keys.push((key, master));
        }
        if keys.len() == 6 {
            break;
        }
    }
    let victim = keys[0].1;
    let heir = cluster.replica_of(victim);
    let names: Vec<String> = keys.iter().map(|(k, _)| k.clone()).collect();
    let load = Load::start(&backend, &names, &pol, PAUSE);
    load.wait_each_decided(30, WITHIN).await;

    let freezing = Instant::now();
    cluster.nodes()[victim].freeze();
    let frozen = Instant::now();
    let hp = cluster.nodes()[heir].port();
    let promoted = wait_until("the replica promoted", move || is_master(hp)).await;
    // Every key, the frozen master's included, decided again for a while.
    load.wait_each_decided(100, WITHIN).await;
    let seen = load.stop().await;

    let on_victim = |s: &&Seen| keys.iter().any(|(k, m)| *k == s.key && *m == victim);
    let victims: Vec<Seen> = seen.iter().filter(on_victim).cloned().collect();
    let healthy: Vec<Seen> = seen.iter().filter(|s| !on_victim(s)).cloned().collect();
    // The frozen master's keys: served again within moments of the promotion, then always.
    let Phases { back, during, .. } = Phases::of(&seen, &victims, freezing, frozen);
    let late = back.saturating_duration_since(promoted);
    assert!(
        late < RECOVERY,
        "checks resumed {late:?} after the promotion"
    );
    // The healthy masters' keys lose at most one round: one failed request per load task.
    for (key, master) in keys.iter().filter(|(_, m)| *m != victim) {
        let c = Counts::of(healthy.iter().filter(|s| s.key == *key));
        assert!(c.failed <= 1, "{key} on healthy master {master}: {c:?}");
    }
    eprintln!(
        "Cluster, master frozen: replica promoted {:?} after the freeze, its keys served \
         again {late:?} after the promotion ({} requests failed meanwhile); healthy masters' \
         keys: {:?}",
        promoted - frozen,
        during.failed,
        Counts::of(&healthy)
    );
}
