//! Redis in production (issue 12): failover by repoint, restarts, one slow call, a dead
//! Cluster master, Sentinel failover, overload, old servers and evicting servers — each fault
//! injected into real `redis-server` processes, asserting what every request got.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use turnstile_core::{Backend, BackendError, ManualClock, Policy};
use turnstile_redis::{NodeDown, RedisBackend, UnsupportedRedisVersion};
use turnstile_tests::proxy::Proxy;
use turnstile_tests::redis_server::{
    command, query, start_replica, wait_for, wait_replicated, RedisCluster, RedisSentinel,
    RedisServer,
};

fn prefix(test: &str) -> String {
    format!("turnstile:faults:{test}:{}", std::process::id())
}

fn p(spec: &str) -> Policy {
    spec.parse().unwrap()
}

/// `remaining` of each check, or the error's text.
fn outcome(r: &Result<turnstile_core::Decision, BackendError>) -> Result<u64, String> {
    r.as_ref().map(|d| d.remaining()).map_err(|e| e.to_string())
}

/// The typed source of a `BackendError::Connection`.
fn source<T: std::error::Error + 'static>(e: &BackendError) -> Option<&T> {
    match e {
        BackendError::Connection(src) => src.downcast_ref::<T>(),
        _ => None,
    }
}

fn ok(reply: std::io::Result<String>) {
    let r = reply.unwrap();
    assert!(r.starts_with('+'), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_by_repoint_never_leaves_checks_on_a_readonly_replica() {
    // Regression: after the address the app uses was repointed at the new primary, the app
    // kept its connection to the demoted one and got READONLY forever.
    let a = RedisServer::start();
    let b = start_replica(a.port(), &[]);
    let proxy = Proxy::start(a.port());
    let backend = RedisBackend::builder(proxy.url())
        .prefix(prefix("repoint"))
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let pol = [p("token-bucket:limit=100,period=1h,name=repoint")];
    let mut before = Vec::new();
    for _ in 0..5 {
        before.push(outcome(&backend.check("k", &pol, 1).await));
    }
    assert_eq!(before, [Ok(99), Ok(98), Ok(97), Ok(96), Ok(95)]);
    // Every write is on the replica before the failover.
    wait_replicated(a.port(), b.port(), Duration::from_secs(10));

    // The failover: B is promoted, A demoted to B's replica, the address now leads to B.
    ok(command(b.port(), "REPLICAOF NO ONE"));
    ok(command(
        a.port(),
        &format!("REPLICAOF 127.0.0.1 {}", b.port()),
    ));
    proxy.repoint(b.port());
    // A refuses writes now: what the app's old connection would get.
    wait_for(Duration::from_secs(10), "A to refuse writes", || {
        command(a.port(), "SET x 1").is_ok_and(|r| r.starts_with("-READONLY"))
    });

    let mut after = Vec::new();
    for _ in 0..10 {
        after.push(outcome(&backend.check("k", &pol, 1).await));
    }
    // Not one error: the first check met READONLY on the old connection, which was dropped,
    // and ran once more on a fresh one, to B — with the state B replicated from A.
    assert_eq!(
        after,
        (85..=94).rev().map(Ok).collect::<Vec<_>>(),
        "after the repoint"
    );
    assert_eq!(backend.stats().connects, 2, "one reconnect");
    assert!(backend.nodes_down().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_costs_no_failed_check_once_redis_answers_ping() {
    // Regression: the first check after a restart was written on the dead connection
    // (broken pipe) and opened the 1 s retry interval: a fail-closed server answered 503 for
    // about a second while Redis answered PING.
    let mut server = RedisServer::start();
    let backend = RedisBackend::builder(server.url())
        .prefix(prefix("restart"))
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let pol = [p("fixed-window:limit=1000,period=1h,name=restart")];
    assert_eq!(outcome(&backend.check("k", &pol, 1).await), Ok(999));
    for round in 0..3 {
        // kill -9 and start again; `restart` returns once the new process answers PING.
        server.restart();
        let mut got = Vec::new();
        for _ in 0..5 {
            got.push(outcome(&backend.check("k", &pol, 1).await));
        }
        // Nothing was persisted: each restart starts the window afresh.
        assert_eq!(
            got,
            [Ok(999), Ok(998), Ok(997), Ok(996), Ok(995)],
            "round {round}"
        );
        assert_eq!(backend.stats().connects, 2 + round, "round {round}");
    }
    assert!(backend.nodes_down().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_counts_as_down_only_after_three_failed_rounds_and_one_probe_brings_it_back() {
    let mut server = RedisServer::start();
    let clock = ManualClock::new(1_000_000);
    let backend = RedisBackend::builder(server.url())
        .prefix(prefix("probe"))
        .timeout(Duration::from_millis(500))
        .retry_interval(Duration::from_secs(5))
        .clock(clock.clone())
        .build()
        .unwrap();
    let pol = [p("token-bucket:limit=10,period=1h,name=probe")];
    assert_eq!(outcome(&backend.check("k", &pol, 1).await), Ok(9));
    server.kill();
    // Three failed rounds (refused connections: each check waits its timeout for Redis to
    // come back), then fail fast.
    for i in 0..3 {
        let e = backend.check("k", &pol, 1).await.unwrap_err();
        assert!(matches!(e, BackendError::Connection(_)), "{i}: {e}");
        assert!(source::<NodeDown>(&e).is_none(), "{i}: {e}");
    }
    assert_eq!(backend.nodes_down(), [server.url()]);
    let e = backend.check("other", &pol, 1).await.unwrap_err();
    let down = source::<NodeDown>(&e).unwrap_or_else(|| panic!("{e}"));
    // Refused connections say Redis is away for a moment (a restart): nothing timed out, so
    // it is probed again soon — 5 ms on this clock, which has not moved — not after the
    // 5 s retry interval (issue 25, fault 2; the interval after timeouts is tested in
    // redis_silent.rs).
    assert_eq!(
        (down.failures(), down.retry_in()),
        (3, Duration::from_millis(5))
    );

    server.restart();
    clock.advance(down.retry_in());
    // Checks fail fast until the connection is made again (it is retried in the
    // background meanwhile), then the probe goes through.
    let back = Instant::now();
    while let Err(e) = backend.check("k", &pol, 0).await {
        assert!(source::<NodeDown>(&e).is_some(), "{e}");
        assert!(
            back.elapsed() < Duration::from_secs(10),
            "not back within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The node is up again for every check.
    let mut got = Vec::new();
    for _ in 0..4 {
        got.push(outcome(&backend.check("k", &pol, 1).await));
    }
    assert_eq!(got, [Ok(9), Ok(8), Ok(7), Ok(6)]);
    assert!(backend.nodes_down().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_slow_call_fails_only_the_request_that_timed_out() {
    // Regression: one check over the timeout (no fault at all) sent every key of every client
    // to the failure policy for the retry interval.
    let server = RedisServer::start();
    let timeout = Duration::from_millis(400);
    let backend = RedisBackend::builder(server.url())
        .prefix(prefix("slow"))
        .timeout(timeout)
        .retry_interval(Duration::from_secs(60))
        .build()
        .unwrap();
    let pol = [p("gcra:limit=100,period=1h,name=slow")];
    assert_eq!(outcome(&backend.check("a", &pol, 1).await), Ok(99));
    // Redis holds every write (scripts included): the next check times out.
    ok(command(server.port(), "CLIENT PAUSE 30000 WRITE"));
    let start = Instant::now();
    let slow = backend.check("a", &pol, 1).await;
    assert!(
        matches!(slow, Err(BackendError::Timeout { .. })),
        "{slow:?}"
    );
    assert!(start.elapsed() >= timeout);
    ok(command(server.port(), "CLIENT UNPAUSE"));
    // The next checks, on other keys, go to Redis and are answered: nothing fails fast.
    let mut rest = Vec::new();
    for key in ["b", "c", "d", "b"] {
        rest.push(outcome(&backend.check(key, &pol, 1).await));
    }
    assert_eq!(rest, [Ok(99), Ok(99), Ok(99), Ok(98)]);
    assert!(backend.nodes_down().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_that_times_out_together_counts_as_one_failed_round() {
    // 64 checks in flight when Redis stalls (a burst at a window edge) all time out: that is
    // one failed round, not 64 failures, so the node does not count as down.
    let server = RedisServer::start();
    let backend = RedisBackend::builder(server.url())
        .prefix(prefix("burst"))
        .timeout(Duration::from_millis(300))
        .retry_interval(Duration::from_secs(60))
        .build()
        .unwrap();
    let pol = [p("sliding-window:limit=1000,period=1m,name=burst")];
    assert_eq!(outcome(&backend.check("warm", &pol, 1).await), Ok(999));
    ok(command(server.port(), "CLIENT PAUSE 30000 WRITE"));
    let burst: Vec<_> = (0..64)
        .map(|i| {
            let b = backend.clone();
            let pol = pol.clone();
            tokio::spawn(async move { b.check(&format!("k{i}"), &pol, 1).await })
        })
        .collect();
    for (i, t) in burst.into_iter().enumerate() {
        let r = t.await.unwrap();
        assert!(matches!(r, Err(BackendError::Timeout { .. })), "{i}: {r:?}");
    }
    assert!(backend.nodes_down().is_empty());
    ok(command(server.port(), "CLIENT UNPAUSE"));
    let mut after = Vec::new();
    for _ in 0..3 {
        after.push(
            backend
                .check("after", &pol, 1)
                .await
                .map(|d| d.allowed())
                .map_err(|e| e.to_string()),
        );
    }
    assert_eq!(after, [Ok(true), Ok(true), Ok(true)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_and_oom_fail_the_request_but_keep_the_connection() {
    let server = RedisServer::start_with(&["--busy-reply-threshold", "50"]);
    let backend = RedisBackend::builder(server.url())
        .prefix(prefix("busy"))
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let pol = [p("fixed-window:limit=100,period=1h,name=busy")];
    assert_eq!(outcome(&backend.check("k", &pol, 1).await), Ok(99));

    // OOM: Redis refuses the script's writes; nothing is charged.
    ok(command(server.port(), "CONFIG SET maxmemory 1"));
    let e = backend.check("k", &pol, 1).await.unwrap_err();
    assert!(
        matches!(&e, BackendError::Script(m) if m.contains("OOM")),
        "{e}"
    );
    ok(command(server.port(), "CONFIG SET maxmemory 0"));
    assert_eq!(outcome(&backend.check("k", &pol, 1).await), Ok(98));

    // BUSY: a script runs beyond busy-reply-threshold; our check is answered BUSY.
    let mut busy = TcpStream::connect(("127.0.0.1", server.port())).unwrap();
    busy.write_all(b"EVAL \"while true do end\" 0\r\n").unwrap();
    wait_for(Duration::from_secs(5), "Redis to answer BUSY", || {
        command(server.port(), "PING").is_ok_and(|r| r.starts_with("-BUSY"))
    });
    let e = backend.check("k", &pol, 1).await.unwrap_err();
    assert!(
        matches!(&e, BackendError::Script(m) if m.contains("BUSY")),
        "{e}"
    );
    ok(command(server.port(), "SCRIPT KILL"));
    wait_for(Duration::from_secs(5), "the script to end", || {
        command(server.port(), "PING").is_ok_and(|r| r.starts_with("+PONG"))
    });
    assert_eq!(outcome(&backend.check("k", &pol, 1).await), Ok(97));

    // Two failures far apart, each ended by an answer: the node never counted as down, and
    // the connection was kept throughout.
    assert!(backend.nodes_down().is_empty());
    assert_eq!(backend.stats().connects, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_cluster_master_never_fails_the_other_masters_keys() {
    // Regression: with one Cluster master down, keys on the healthy masters got seconds of
    // errors too (the whole backend was marked down; the pool's recycling PING went to every
    // master).
    let mut cluster = RedisCluster::start_with(
        3,
        &[
            "--cluster-node-timeout",
            "1000",
            "--cluster-require-full-coverage",
            "no",
        ],
    );
    let backend = RedisBackend::builder(cluster.urls())
        .prefix(prefix("cluster"))
        .timeout(Duration::from_secs(1))
        .retry_interval(Duration::from_secs(60))
        .build()
        .unwrap();
    // Refills one token in 315 s: nothing comes back during the test.
    let pol = [p("token-bucket:limit=100000,period=365d,name=cl")];
    let victim = 2;
    let (mut dead, mut live) = (Vec::new(), Vec::new());
    for i in 0..60 {
        let key = format!("client-{i}");
        let node = cluster.node_of_key(&backend.state_key(&key));
        if node == victim {
            dead.push(key);
        } else {
            live.push((key, node));
        }
    }
    assert!(!dead.is_empty() && (0..2).all(|n| live.iter().any(|(_, m)| *m == n)));
    // Every key once: each master has loaded the library.
    for k in dead.iter().chain(live.iter().map(|(k, _)| k)) {
        backend.check(k, &pol, 1).await.unwrap();
    }
    let victim_addr = format!("127.0.0.1:{}", cluster.nodes()[victim].port());
    cluster.nodes_mut()[victim].kill();
    // A healthy master that lost its scripts (and its Function library) must reload them
    // without the dead one.
    ok(command(cluster.nodes()[0].port(), "SCRIPT FLUSH"));
    ok(command(cluster.nodes()[0].port(), "FUNCTION FLUSH"));

    // 5 s: past the Cluster's own failure detection (node timeout 1 s) and three failed
    // rounds of the dead master's keys (1 s timeout each).
    let start = Instant::now();
    let (mut live_ok, mut dead_errors, mut fail_fast) = (0, 0, 0);
    let mut expected: std::collections::HashMap<String, u64> =
        live.iter().map(|(k, _)| (k.clone(), 99_998)).collect();
    while start.elapsed() < Duration::from_secs(5) {
        for k in &dead {
            let e = backend.check(k, &pol, 1).await.unwrap_err();
            dead_errors += 1;
            if source::<NodeDown>(&e).is_some() {
                fail_fast += 1;
            }
        }
        for (k, node) in &live {
            let want = expected[k];
            let got = backend.check(k, &pol, 1).await;
            assert_eq!(outcome(&got), Ok(want), "key {k} on master {node}");
            expected.insert(k.clone(), want - 1);
            live_ok += 1;
        }
    }
    assert!(live_ok > 0 && dead_errors > 0);
    assert!(fail_fast > 0, "the dead master never counted as down");
    assert_eq!(backend.nodes_down(), [victim_addr]);
    eprintln!("{live_ok} checks on healthy masters, all admitted; {dead_errors} on the dead one failed ({fail_fast} fast)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_moves_checks_to_the_new_primary() {
    let mut primary = RedisServer::start();
    let replica = start_replica(primary.port(), &[]);
    let sentinel = RedisSentinel::start(primary.port(), "mymaster", 500, 5000);
    wait_for(
        Duration::from_secs(15),
        "the Sentinel to know the replica",
        || {
            query(sentinel.port(), "SENTINEL REPLICAS mymaster")
                .is_ok_and(|r| r.starts_with('*') && !r.starts_with("*0"))
        },
    );
    let url = format!("redis+sentinel://127.0.0.1:{}/mymaster", sentinel.port());
    let backend = RedisBackend::builder(url.as_str())
        .prefix(prefix("sentinel"))
        .timeout(Duration::from_secs(1))
        .retry_interval(Duration::from_millis(200))
        .build()
        .unwrap();
    assert_eq!(backend.node(), url);
    let pol = [p("token-bucket:limit=100,period=1h,name=sentinel")];
    let mut before = Vec::new();
    for _ in 0..3 {
        before.push(outcome(&backend.check("k", &pol, 1).await));
    }
    assert_eq!(before, [Ok(99), Ok(98), Ok(97)]);
    wait_replicated(primary.port(), replica.port(), Duration::from_secs(10));

    primary.kill();
    let killed = Instant::now();
    let mut errors = 0;
    let first = loop {
        match backend.check("k", &pol, 1).await {
            Ok(d) => break d,
            Err(_) => errors += 1,
        }
        assert!(
            killed.elapsed() < Duration::from_secs(20),
            "no check succeeded within 20 s of the failover"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let resumed = killed.elapsed();
    // Within the Sentinel's own bound: down-after-milliseconds + failover-timeout.
    assert!(
        resumed < Duration::from_millis(5500),
        "resumed after {resumed:?}"
    );
    // The replica became the primary, with the state it replicated.
    assert_eq!(first.remaining(), 96);
    assert!(query(replica.port(), "INFO replication")
        .unwrap()
        .contains("role:master"));
    let mut after = Vec::new();
    for _ in 0..5 {
        after.push(outcome(&backend.check("k", &pol, 1).await));
    }
    assert_eq!(after, [Ok(95), Ok(94), Ok(93), Ok(92), Ok(91)]);
    eprintln!(
        "checks resumed on the new primary {resumed:?} after the kill ({errors} failed meanwhile)"
    );
}

/// Log lines written while the guard lives, on this thread.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn capture() -> (Self, tracing::subscriber::DefaultGuard) {
        let logs = Logs::default();
        let w = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || w.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish();
        (logs, tracing::subscriber::set_default(subscriber))
    }

    fn lines_with(&self, needle: &str) -> usize {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .filter(|l| l.contains(needle))
            .count()
    }
}

/// A fake Redis on a free port that answers like an old server: no `HELLO` (RESP2 only),
/// `INFO` with `redis_version:<version>`, `+OK` to anything else.
fn old_redis(version: &'static str) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut r = BufReader::new(conn.try_clone().unwrap());
                let mut w = conn;
                let mut line = String::new();
                loop {
                    line.clear();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let n: usize = line.trim().trim_start_matches('*').parse().unwrap_or(0);
                    let mut args = Vec::new();
                    for _ in 0..n {
                        line.clear();
                        r.read_line(&mut line).unwrap();
                        let len: usize = line.trim().trim_start_matches('$').parse().unwrap();
                        let mut buf = vec![0u8; len + 2];
                        r.read_exact(&mut buf).unwrap();
                        args.push(String::from_utf8_lossy(&buf[..len]).to_ascii_uppercase());
                    }
                    let reply = match args.first().map(String::as_str) {
                        Some("HELLO") => {
                            "-ERR unknown command `HELLO`, with args beginning with: `3`, \r\n"
                                .to_owned()
                        }
                        Some("INFO") => {
                            let body = format!("# Server\r\nredis_version:{version}\r\n");
                            format!("${}\r\n{body}\r\n", body.len())
                        }
                        _ => "+OK\r\n".to_owned(),
                    };
                    if w.write_all(reply.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

// Multi-threaded, as services run: redis-rs's connection tasks see a closed connection
// while the test thread waits for a restart. The logs are those of this thread, which polls
// every check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_redis_is_refused_with_a_typed_error_naming_its_version_logged_once() {
    let (logs, _guard) = Logs::capture();
    let port = old_redis("4.0.14");
    let url = format!("redis://127.0.0.1:{port}");
    let backend = RedisBackend::builder(url.as_str())
        .prefix(prefix("old"))
        .timeout(Duration::from_secs(2))
        .failure_threshold(10)
        .build()
        .unwrap();
    let pol = [p("gcra:limit=5,period=1s,name=old")];
    for i in 0..3 {
        let e = backend.check("k", &pol, 1).await.unwrap_err();
        let old = source::<UnsupportedRedisVersion>(&e).unwrap_or_else(|| panic!("{i}: {e}"));
        assert_eq!((old.found(), old.node()), ("4.0.14", url.as_str()));
        assert!(e.to_string().contains("need Redis 5.0.0 or later"), "{e}");
    }
    assert_eq!(logs.lines_with("is version 4.0.14"), 1);
    assert_eq!(backend.stats().connects, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicting_maxmemory_policy_is_warned_about_once_and_only_when_readable() {
    let (logs, _guard) = Logs::capture();
    let pol = [p("gcra:limit=5,period=1s,name=evict")];
    let needle = "maxmemory-policy is";

    let mut lru = RedisServer::start_with(&["--maxmemory-policy", "allkeys-lru"]);
    let backend = RedisBackend::builder(lru.url())
        .prefix(prefix("evict"))
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    for _ in 0..3 {
        assert!(backend.check("k", &pol, 1).await.unwrap().allowed());
    }
    lru.restart();
    assert!(backend.check("k", &pol, 1).await.unwrap().allowed());
    assert_eq!(backend.stats().connects, 2);
    assert_eq!(logs.lines_with(needle), 1, "once per backend");
    assert_eq!(logs.lines_with("allkeys-lru"), 1);

    // noeviction keeps our keys: nothing to say.
    let quiet = RedisServer::start();
    let b = RedisBackend::builder(quiet.url())
        .prefix(prefix("evict"))
        .build()
        .unwrap();
    assert!(b.check("k", &pol, 1).await.unwrap().allowed());
    assert_eq!(logs.lines_with(needle), 1);

    // An ACL that refuses CONFIG: nothing is said, and checks work.
    let acl = RedisServer::start_with(&["--maxmemory-policy", "volatile-ttl"]);
    ok(command(
        acl.port(),
        "ACL SETUSER limited on >pw ~* &* +@all -@admin -config",
    ));
    let b = RedisBackend::builder(format!("redis://limited:pw@127.0.0.1:{}", acl.port()))
        .prefix(prefix("evict"))
        .build()
        .unwrap();
    assert!(b.check("k", &pol, 1).await.unwrap().allowed());
    assert_eq!(logs.lines_with("volatile-ttl"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_refused_for_a_timeout_is_never_left_charged() {
    // Issue 12, fault 5: the script was already written when the client gave up; Redis ran it
    // afterwards (limit 1, a pause: 503, then the next request 429 and `quota peek` showed 0
    // left). The late reply's charge is refunded.
    let server = RedisServer::start();
    let backend = RedisBackend::builder(server.url())
        .prefix(prefix("late"))
        .timeout(Duration::from_millis(200))
        .retry_interval(Duration::from_secs(60))
        .build()
        .unwrap();
    let pol = [p("fixed-window:limit=1,period=1h,name=late")];
    // A warm connection (its library loaded): the check's script is written before the
    // pause holds it. (A cold one's call is never sent once its timeout has passed.)
    assert!(backend.check("warm", &pol, 1).await.unwrap().allowed());
    ok(command(server.port(), "CLIENT PAUSE 30000 WRITE"));
    let refused = backend.check("k", &pol, 1).await;
    assert!(
        matches!(refused, Err(BackendError::Timeout { .. })),
        "{refused:?}"
    );
    ok(command(server.port(), "CLIENT UNPAUSE"));
    let stats = backend.clone();
    tokio::task::spawn_blocking(move || {
        wait_for(Duration::from_secs(10), "the late charge refunded", || {
            stats.stats().late_refunds == 1
        })
    })
    .await
    .unwrap();
    // The one unit is there for the next request, and only one.
    assert_eq!(outcome(&backend.check("k", &pol, 1).await), Ok(0));
    assert_eq!(
        backend
            .check("k", &pol, 1)
            .await
            .map(|d| d.allowed())
            .map_err(|e| e.to_string()),
        Ok(false)
    );
    // A timed-out query or denial charged nothing: nothing to refund.
    ok(command(server.port(), "CLIENT PAUSE 30000 WRITE"));
    assert!(backend.check("k", &pol, 1).await.is_err());
    ok(command(server.port(), "CLIENT UNPAUSE"));
    let calls = backend.stats().redis_calls;
    assert_eq!(outcome(&backend.check("other", &pol, 1).await), Ok(0));
    assert_eq!(backend.stats().redis_calls, calls + 1);
    assert_eq!(backend.stats().late_refunds, 1);
}
