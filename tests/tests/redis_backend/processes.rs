//! Processes, nodes and failures: several processes on one key, a Cluster, a killed, restarted
//! or paused Redis, skewed clocks, ACLs, an endpoint that is not Redis.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deny_cache_cuts_redis_calls_in_a_flood_by_ten_times_or_more() {
    let redis = TestRedis::get();
    let pol = [p("gcra:limit=5,period=1h,name=flood")];
    let mut calls = Vec::new();
    for cached in [false, true] {
        // One call per check without the cache: what the cache cuts (coalescing, which cuts
        // calls too, is measured in coalesce.rs).
        let b = RedisBackend::builder(redis.url())
            .prefix(prefix(&format!("flood-{cached}")))
            .timeout(Duration::from_secs(5))
            .coalesce(false)
            .build()
            .unwrap();
        let admitted = if cached {
            flood(DenyCache::new(b.clone()), &pol).await
        } else {
            flood(b.clone(), &pol).await
        };
        assert_eq!(admitted, 5, "exactly the limit, cached: {cached}");
        calls.push(b.stats().redis_calls);
        b.delete_prefix().await.unwrap();
    }
    eprintln!(
        "Redis calls for 3200 decisions: {} without the cache, {} with",
        calls[0], calls[1]
    );
    assert_eq!(calls[0], 3200);
    assert!(calls[1] * 10 <= calls[0], "{calls:?}");
}

/// 64 tasks of 50 requests each on one key: how many were admitted.
async fn flood<B: Backend>(b: B, pol: &[Policy]) -> usize {
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let b = b.clone();
            let pol = pol.to_vec();
            tokio::spawn(async move {
                let mut admitted = 0;
                for _ in 0..50 {
                    if b.check("flooder", &pol, 1).await.unwrap().allowed() {
                        admitted += 1;
                    }
                }
                admitted
            })
        })
        .collect();
    let mut admitted = 0;
    for t in tasks {
        admitted += t.await.unwrap();
    }
    admitted
}

#[test]
fn four_processes_of_fifty_tasks_admit_exactly_the_limit() {
    let redis = TestRedis::get();
    for alg in Algorithm::ALL {
        let spec = format!("{alg}:limit=100,period=1h,name=flood");
        let pre = prefix(&format!("hammer-{alg}"));
        let procs: Vec<_> = (0..4)
            .map(|_| {
                Command::new(env!("CARGO_BIN_EXE_hammer"))
                    .args([redis.url(), &pre, "one-key", &spec, "50", "2", "10000"])
                    .stdout(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let (admitted, denied, errors) = hammer_totals(procs);
        assert_eq!(errors, 0, "{alg}: backend errors");
        assert_eq!(admitted, 100, "{alg}: admitted {admitted}, denied {denied}");
        assert_eq!(denied, 300, "{alg}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_set_while_four_processes_hammer_a_key_applies_to_every_next_request() {
    let redis = TestRedis::get();
    let pre = prefix("override-flood");
    // Generous at first: everything is admitted.
    let spec = "fixed-window:limit=1000000,period=1h,name=flood";
    let procs: Vec<_> = (0..4)
        .map(|_| {
            Command::new(env!("CARGO_BIN_EXE_hammer"))
                .args([redis.url(), &pre, "one-key", spec, "8", "0", "10000"])
                .env("HAMMER_FOR_MS", "1500")
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    // An operator lowers this key's quota to 1 per hour (the count so far carries over, so
    // nothing more fits).
    // (A timeout far above the default: four processes flood the one node, and on a loaded
    // two-core machine one call may wait past 100 ms; what is tested is the next request.)
    let admin = RedisBackend::builder(redis.url())
        .prefix(pre.as_str())
        .timeout(Duration::from_secs(10))
        .build()
        .map(DenyCache::new)
        .unwrap();
    admin
        .set_override("one-key", &[p("fixed-window:limit=1,period=1h,name=flood")])
        .await
        .unwrap();
    let set_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let (mut before, mut after, mut admitted_after) = (0, 0, 0);
    for child in procs {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(
            text.contains("errors=0"),
            "{}",
            text.lines().last().unwrap_or("")
        );
        for line in text.lines().filter(|l| l.starts_with("decision ")) {
            let mut f = line.split(' ').skip(1);
            let sent: u128 = f.next().unwrap().parse().unwrap();
            let allowed = f.next() == Some("1");
            if sent > set_at {
                after += 1;
                admitted_after += u32::from(allowed);
            } else {
                before += 1;
            }
        }
    }
    assert!(before > 0 && after > 0, "{before} before, {after} after");
    assert_eq!(
        admitted_after, 0,
        "{admitted_after} of {after} requests sent after the override were admitted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_master_cluster_keeps_each_clients_policies_in_one_slot() {
    let cluster = RedisCluster::start(3);
    let policies = [
        p("token-bucket:limit=2,period=1m,name=burst"),
        p("sliding-log:limit=3,period=1h,name=hourly"),
        p("sliding-window:limit=4,period=1d,name=daily"),
    ];
    for encoding in [KeyEncoding::Hashed, KeyEncoding::Plain] {
        let on_cluster = RedisBackend::builder(cluster.urls())
            .prefix(prefix("cluster"))
            .key_encoding(encoding)
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        let memory = MemoryBackend::new();
        let mut t = 1_700_000_000_000;
        for key in ["", "{", "}", "a{b}c", "}{", "{}", "client-42", "%7D"] {
            for cost in [1, 1, 0, 1, 5] {
                t += 17;
                let want = memory
                    .check_at(key, &policies, cost, t)
                    .into_inner()
                    .unwrap();
                let got = on_cluster
                    .check_at(key, &policies, cost, t)
                    .await
                    .unwrap_or_else(|e| panic!("{encoding:?} key {key:?}: {e}"));
                assert_eq!(got, want, "{encoding:?} key {key:?} cost {cost}");
            }
        }
        // Production time (the server's TIME) works on the cluster too.
        let d = on_cluster.check("now-key", &policies, 1).await.unwrap();
        assert!(d.allowed());
        // So do overrides: the configuration and the override's own keys share the slot.
        on_cluster
            .set_override("}{", &[p("sliding-log:limit=1,period=1h,name=hourly")])
            .await
            .unwrap();
        let d = on_cluster.check("}{", &policies, 1).await.unwrap();
        assert_eq!(
            (d.applied(), d.remaining()),
            (&turnstile_core::Applied::Override, 0)
        );
        assert!(!on_cluster
            .check("}{", &policies, 1)
            .await
            .unwrap()
            .allowed());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_mid_run_follows_each_failure_policy_within_the_timeout() {
    let mut server = RedisServer::start();
    let timeout = Duration::from_millis(300);
    let pol = [p("fixed-window:limit=2,period=1h,name=per-key")];
    let make = || {
        RedisBackend::builder(server.url())
            .prefix(prefix("kill"))
            .timeout(timeout)
            .build()
            .unwrap()
    };
    let local = Fallback::new(DenyCache::new(make()), FailurePolicy::Local);
    let erroring = make();
    assert!(local.check("k", &pol, 1).await.unwrap().allowed());
    assert!(erroring.check("k", &pol, 1).await.unwrap().allowed());
    assert!(!local.check("k", &pol, 1).await.unwrap().allowed());

    server.kill();

    let start = Instant::now();
    let err = erroring.check("k", &pol, 1).await.unwrap_err();
    assert!(start.elapsed() < timeout + Duration::from_millis(200));
    assert!(
        matches!(
            err,
            BackendError::Connection(_) | BackendError::Timeout { .. }
        ),
        "{err}"
    );

    // A denial Redis gave a moment ago still holds (the deny cache answers without Redis).
    assert!(!local.check("k", &pol, 1).await.unwrap().allowed());
    // The local fallback decides with the same policies, on this node's state alone.
    let start = Instant::now();
    let fallback: Vec<bool> = [
        local.check("k2", &pol, 1).await.unwrap(),
        local.check("k2", &pol, 1).await.unwrap(),
        local.check("k2", &pol, 1).await.unwrap(),
    ]
    .iter()
    .map(Decision::allowed)
    .collect();
    assert!(start.elapsed() < 3 * timeout + Duration::from_millis(300));
    assert_eq!(fallback, [true, true, false]);

    // Redis is back: after the retry interval the backend uses it again (its state was lost
    // with the process: nothing was persisted).
    server.restart();
    let recovered = RedisBackend::builder(server.url())
        .prefix(prefix("kill"))
        .timeout(timeout)
        .retry_interval(Duration::ZERO)
        .build()
        .unwrap();
    let d = recovered.check("k", &pol, 1).await.unwrap();
    assert_eq!(d.remaining(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_and_script_flush_reload_the_script_on_the_next_call() {
    // Both paths: the Function library (FUNCTION FLUSH) and the EVALSHA script (SCRIPT FLUSH).
    for (mode, flush) in [
        (ScriptMode::Auto, "FUNCTION FLUSH"),
        (ScriptMode::Eval, "SCRIPT FLUSH"),
    ] {
        let mut server = RedisServer::start();
        let clock = ManualClock::new(0);
        let b = RedisBackend::builder(server.url())
            .prefix(prefix("reload"))
            .timeout(Duration::from_secs(2))
            .clock(clock.clone())
            .script_mode(mode)
            .build()
            .unwrap();
        let pol = [p("gcra:limit=10,period=1m,name=g")];
        assert_eq!(b.check("k", &pol, 1).await.unwrap().remaining(), 9);
        let loads = b.stats().script_loads;

        assert!(command(server.port(), flush).unwrap().starts_with("+OK"));
        assert_eq!(b.check("k", &pol, 1).await.unwrap().remaining(), 8);
        assert_eq!(b.stats().script_loads, loads + 1, "{mode:?}: reloaded once");

        server.restart();
        // The pool's old connection died with the server; the next call that reaches Redis
        // reconnects and reloads the script. (A call may fail once while the pool notices
        // the dead connection; then the retry interval, timed on the local clock, passes.)
        let mut result = b.check("k", &pol, 1).await;
        if result.is_err() {
            clock.advance(Duration::from_secs(2));
            result = b.check("k", &pol, 1).await;
        }
        assert_eq!(
            result.unwrap().remaining(),
            9,
            "{mode:?}: fresh state after the restart"
        );
        let (fcall, evalsha) = (
            command_calls(server.port(), "fcall"),
            command_calls(server.port(), "evalsha"),
        );
        match mode {
            ScriptMode::Auto => assert_eq!((fcall, evalsha), (1, 0), "{mode:?}"),
            _ => assert_eq!(fcall, 0, "{mode:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_redis_takes_the_timeout_path_and_nothing_hangs() {
    let server = RedisServer::start();
    let timeout = Duration::from_millis(200);
    let b = RedisBackend::builder(server.url())
        .prefix(prefix("pause"))
        .timeout(timeout)
        .retry_interval(Duration::ZERO)
        .build()
        .unwrap();
    let pol = [p("token-bucket:limit=5,period=1s,name=t")];
    assert!(b.check("k", &pol, 1).await.unwrap().allowed());
    assert!(command(server.port(), "CLIENT PAUSE 3000 ALL")
        .unwrap()
        .starts_with("+OK"));
    let start = Instant::now();
    let err = b.check("k", &pol, 1).await.unwrap_err();
    let waited = start.elapsed();
    assert!(matches!(err, BackendError::Timeout { .. }), "{err}");
    assert!(
        waited >= timeout && waited < timeout + Duration::from_millis(500),
        "{waited:?}"
    );

    let local = Fallback::new(
        RedisBackend::builder(server.url())
            .prefix(prefix("pause"))
            .timeout(timeout)
            .build()
            .unwrap(),
        FailurePolicy::Local,
    );
    let start = Instant::now();
    assert!(local.check("k", &pol, 1).await.unwrap().allowed());
    assert!(start.elapsed() < timeout + Duration::from_millis(500));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_with_clocks_skewed_by_minutes_decide_as_one() {
    let redis = TestRedis::get();
    let make = |clock: ManualClock| {
        RedisBackend::builder(redis.url())
            .prefix(prefix("skew"))
            .timeout(Duration::from_secs(5))
            .clock(clock)
            .build()
            .unwrap()
    };
    // One node 7 minutes behind the other: decisions use the server's TIME, not theirs.
    let a = make(ManualClock::new(1_700_000_000_000));
    let b = make(ManualClock::new(1_700_000_000_000 - 7 * 60 * 1000));
    let pol = [p("token-bucket:limit=5,period=1h,name=shared")];
    let mut remaining = Vec::new();
    for i in 0..8 {
        let node = if i % 2 == 0 { &a } else { &b };
        let d = node.check("user", &pol, 1).await.unwrap();
        remaining.push((d.allowed(), d.remaining()));
    }
    assert_eq!(
        remaining,
        [
            (true, 4),
            (true, 3),
            (true, 2),
            (true, 1),
            (true, 0),
            (false, 0),
            (false, 0),
            (false, 0)
        ]
    );
    // And a denial's wait is the same seen from either node (one token per 720 s).
    let da = a.check("user", &pol, 1).await.unwrap();
    let db = b.check("user", &pol, 1).await.unwrap();
    let (ra, rb) = (da.retry_after().unwrap(), db.retry_after().unwrap());
    assert!(ra.abs_diff(rb) < Duration::from_secs(1), "{ra:?} vs {rb:?}");
    assert!(ra > Duration::from_secs(700));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_user_and_password_come_from_the_url() {
    // A server whose default user is off: only `limiter` with its password may run scripts.
    let server = RedisServer::start_with(&[
        "--user", "default", "off", "--user", "limiter", "on", ">s3cret", "~*", "+@all",
    ]);
    let pol = [p("token-bucket:limit=2,period=1m,name=acl")];
    let with = |auth: &str| {
        RedisBackend::builder(format!("redis://{auth}127.0.0.1:{}", server.port()))
            .prefix(prefix("acl"))
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap()
    };
    let d = with("limiter:s3cret@").check("k", &pol, 1).await.unwrap();
    assert_eq!(d.remaining(), 1);
    for wrong in ["limiter:nope@", ""] {
        let err = with(wrong).check("k", &pol, 1).await.unwrap_err();
        assert!(
            matches!(err, BackendError::Connection(_) | BackendError::Script(_)),
            "{wrong:?}: {err}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_redis_endpoint_is_a_connection_error_that_says_so() {
    // Issue 13: an HTTP server on the Redis URL gave "backend script failed: Unexpected
    // `33`". It is a connection error naming the node ("not a Redis server at ..."): Redis
    // cannot be reached there, so the failure policy treats it as a Redis that is down.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let _ = sock.read(&mut buf).await;
                let body = "not found";
                let reply = format!(
                    "HTTP/1.1 404 Not Found\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                let _ = sock.write_all(reply.as_bytes()).await;
                let _ = sock.shutdown().await;
            });
        }
    });
    let url = format!("redis://127.0.0.1:{port}");
    let b = RedisBackend::builder(url.as_str())
        .prefix(prefix("http"))
        .timeout(Duration::from_secs(5))
        .retry_interval(Duration::ZERO)
        .build()
        .unwrap();
    let pol = [p("token-bucket:limit=5,period=1s,name=t")];
    let want = format!("not a Redis server at {url}");
    for attempt in 0..3 {
        let err = b.check("k", &pol, 1).await.unwrap_err();
        assert!(
            matches!(err, BackendError::Connection(_)),
            "attempt {attempt}: {err:?}"
        );
        let message = err.to_string();
        assert!(message.contains(&want), "attempt {attempt}: {message}");
        assert!(
            !message.contains('\n'),
            "one line for the logs: {message:?}"
        );
        assert!(err.is_unavailable());
    }
    let err = b.config("k").await.unwrap_err();
    assert!(
        matches!(err, BackendError::Connection(_)) && err.to_string().contains(&want),
        "{err}"
    );
    // The same for a Cluster whose seed node is not Redis.
    let cluster = RedisBackend::builder(url.as_str())
        .cluster(true)
        .prefix(prefix("http"))
        .timeout(Duration::from_secs(5))
        .retry_interval(Duration::ZERO)
        .build()
        .unwrap();
    let err = cluster.check("k", &pol, 1).await.unwrap_err();
    assert!(
        matches!(err, BackendError::Connection(_)) && err.to_string().contains(&want),
        "{err}"
    );
    // Under the default failure policy the local fallback decides meanwhile.
    let local = Fallback::new(b.clone(), FailurePolicy::Local);
    let d = local.check("k", &pol, 1).await.unwrap();
    assert_eq!((d.allowed(), d.remaining()), (true, 4));
}
