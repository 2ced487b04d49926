//! The Redis backend against real `redis-server` processes these tests start themselves.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use turnstile_core::wrap::{DenyCache, Fallback};
use turnstile_core::{
    Algorithm, Backend, BackendError, Decision, Limits, ManualClock, MemoryBackend, Policy,
    Unconfigured,
};
use turnstile_core::{FailurePolicy, Quotas};
use turnstile_redis::{KeyEncoding, RedisBackend};
use turnstile_tests::redis_server::{command, RedisCluster, RedisServer, TestRedis};

fn prefix(test: &str) -> String {
    format!("turnstile:test:{test}:{}", std::process::id())
}

/// A backend that reports every Redis error and asks Redis every time (no deny cache: these
/// tests compare every field of every decision with the in-memory backend).
fn backend(url: &str, test: &str) -> RedisBackend {
    RedisBackend::builder(url)
        .prefix(prefix(test))
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

fn p(spec: &str) -> Policy {
    spec.parse().unwrap()
}

/// The vector folders: the repository's copies, its own cases, and the shared ones.
fn vector_files() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut files = Vec::new();
    for dir in ["tests/vectors", "tests/vectors-local", "../shared/vectors"] {
        if let Ok(entries) = std::fs::read_dir(root.join(dir)) {
            files.extend(
                entries
                    .map(|e| e.unwrap().path())
                    .filter(|p| p.extension().is_some_and(|e| e == "json")),
            );
        }
    }
    files.sort();
    files
}

fn vector_policy(v: &Value) -> Policy {
    let alg: Algorithm = v["algorithm"].as_str().unwrap().parse().unwrap();
    let mut pol = Policy::from_parts(
        alg,
        v["limit"].as_u64().unwrap(),
        v["period_ms"].as_u64().unwrap(),
        v.get("burst").and_then(Value::as_u64),
    )
    .unwrap();
    if let Some(name) = v.get("name").and_then(Value::as_str) {
        pol = pol.with_name(name).unwrap();
    }
    pol
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_vector_decides_on_redis_exactly_as_in_memory() {
    let redis = TestRedis::get();
    let files = vector_files();
    assert!(files.len() >= 31, "only {} vectors found", files.len());
    let mut requests = 0;
    for (i, path) in files.iter().enumerate() {
        let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let policies: Vec<Policy> = match v.get("policies") {
            Some(ps) => ps.as_array().unwrap().iter().map(vector_policy).collect(),
            None => vec![vector_policy(&v["policy"])],
        };
        let on_redis = backend(redis.url(), &format!("vec{i}"));
        let memory = MemoryBackend::new();
        for r in v["requests"].as_array().unwrap() {
            let t = r["t_ms"].as_u64().unwrap();
            let key = r.get("key").and_then(Value::as_str).unwrap_or("");
            let cost = r.get("cost").and_then(Value::as_u64).unwrap_or(1);
            let want = memory
                .check_at(key, &policies, cost, t)
                .into_inner()
                .unwrap();
            let got = on_redis.check_at(key, &policies, cost, t).await.unwrap();
            assert_eq!(
                got,
                want,
                "{} at t={t} key={key:?} cost={cost}",
                path.display()
            );
            requests += 1;
        }
        on_redis.delete_prefix().await.unwrap();
    }
    eprintln!(
        "{} vectors, {requests} requests: Redis == memory",
        files.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_traces_decide_on_redis_exactly_as_in_memory() {
    // One deterministic pseudo-random run mixing keys, costs (queries and costs above
    // capacity included), equal times and long idle gaps, several policies, redeploys that
    // change a policy's parameters or algorithm under the same name (carry-over), and the
    // live-quota operations: refund, reset, overrides and tiers. Every answer must be equal,
    // field for field, on both backends.
    let redis = TestRedis::get();
    let on_redis = backend(redis.url(), "random");
    let memory = MemoryBackend::new();
    // TURNSTILE_SEED=n runs another trace (the default one is fixed, so failures repeat).
    let mut seed: u64 = std::env::var("TURNSTILE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x9e37_79b9_7f4a_7c15)
        | 1;
    let mut next = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let sets: Vec<Vec<Policy>> = vec![
        vec![p("token-bucket:limit=3,period=1s,burst=5,name=a")],
        vec![p("gcra:limit=7,period=3s,burst=2,name=a")],
        vec![p("leaky-bucket:limit=3,period=1s,burst=4,name=a")],
        vec![p("fixed-window:limit=4,period=700ms,name=a")],
        vec![p("fixed-window:limit=2,period=2s,name=a")],
        vec![p("sliding-log:limit=5,period=1s,name=a")],
        vec![p("sliding-log:limit=3,period=2s,name=a")],
        vec![p("sliding-window:limit=6,period=900ms,name=a")],
        vec![p("sliding-window:limit=4,period=900ms,name=a")],
        vec![p("sliding-window:limit=5,period=2s,name=a")],
        vec![
            p("token-bucket:limit=5,period=1s,name=fast"),
            p("sliding-window:limit=12,period=10s,name=slow"),
            p("sliding-log:limit=8,period=3s,name=log"),
        ],
    ];
    let pick = |i: u64| sets[i as usize % sets.len()].clone();
    let mut limits = Limits::new(pick(0)).unwrap();
    let mut t = 1_700_000_000_000u64;
    let mut counts = [0u32; 9];
    for i in 0..3_000 {
        t += match next(10) {
            0 => 0,
            1..=7 => next(300),
            8 => next(3_000),
            _ => next(100_000),
        };
        let key = ["", "a", "b"][next(3) as usize];
        let cost = [0, 1, 1, 1, 2, 3, 13][next(7) as usize];
        let op = match next(100) {
            0..=74 => 0,
            75..=82 => 1,
            83..=86 => 2,
            87..=88 => 3,
            89..=91 => 4,
            92..=93 => 5,
            94..=96 => 6,
            97 => 7,
            _ => 8,
        };
        counts[op] += 1;
        let ctx = format!("request {i} op {op} at t={t} key={key:?} cost={cost}");
        let (got, want) = match op {
            0 => (
                on_redis
                    .check_limits(key, &limits, cost, Some(t))
                    .await
                    .unwrap(),
                memory
                    .check_limits(key, &limits, cost, Some(t))
                    .into_inner()
                    .unwrap(),
            ),
            1 => (
                on_redis.refund(key, &limits, cost, Some(t)).await.unwrap(),
                memory.refund(key, &limits, cost, Some(t)).await.unwrap(),
            ),
            2 => {
                // A peek changes nothing, which the next answers check.
                (
                    on_redis
                        .check_limits(key, &limits, 0, Some(t))
                        .await
                        .unwrap(),
                    memory
                        .check_limits(key, &limits, 0, Some(t))
                        .into_inner()
                        .unwrap(),
                )
            }
            3 => (
                on_redis.reset(key, &limits, Some(t)).await.unwrap(),
                memory.reset(key, &limits, Some(t)).await.unwrap(),
            ),
            4 => {
                let set = pick(next(100));
                let r = on_redis.set_override(key, &set).await.unwrap().version();
                let m = memory.set_override(key, &set).await.unwrap().version();
                assert_eq!(r, m, "{ctx}: override version");
                continue;
            }
            5 => {
                let r = on_redis.remove_override(key).await.unwrap().version();
                let m = memory.remove_override(key).await.unwrap().version();
                assert_eq!(r, m, "{ctx}: remove version");
                continue;
            }
            6 if next(8) == 0 => {
                let r = on_redis.clear_config(key).await.unwrap().version();
                let m = memory.clear_config(key).await.unwrap().version();
                assert_eq!(r, m, "{ctx}: clear version");
                continue;
            }
            6 => {
                let tier = ["pro", "gold", "free"][next(3) as usize];
                let tier = (next(4) > 0).then_some(tier);
                let r = on_redis.set_tier(key, tier).await.unwrap().version();
                let m = memory.set_tier(key, tier).await.unwrap().version();
                assert_eq!(r, m, "{ctx}: tier version");
                continue;
            }
            7 => {
                // A redeploy: new defaults and tiers, possibly another algorithm per name.
                let mode = [
                    Unconfigured::Defaults,
                    Unconfigured::Deny,
                    Unconfigured::Allow,
                ][next(3) as usize];
                limits = Limits::new(pick(next(100)))
                    .unwrap()
                    .with_tier("pro", pick(next(100)))
                    .unwrap()
                    .with_tier("free", pick(next(100)))
                    .unwrap()
                    .when_unconfigured(if next(4) == 0 {
                        mode
                    } else {
                        Unconfigured::Defaults
                    });
                continue;
            }
            _ => {
                let r = on_redis.config(key).await.unwrap();
                assert_eq!(r, memory.config(key).await.unwrap(), "{ctx}: config");
                continue;
            }
        };
        assert_eq!(got, want, "{ctx}");
    }
    eprintln!("operations by kind: {counts:?}");
    on_redis.delete_prefix().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deny_cache_answers_exactly_as_redis_would() {
    // Random traces (several keys, costs, policies) through a backend with the deny cache and
    // one without, at explicit times: identical decisions, field for field (at explicit times
    // a cached denial is the backend's own answer, not a bound on it); refunds through the
    // cached backend reach its cache at once.
    let redis = TestRedis::get();
    let sets: Vec<Vec<Policy>> = vec![
        vec![p("token-bucket:limit=3,period=1s,burst=5,name=a")],
        vec![p("gcra:limit=2,period=700ms,name=a")],
        vec![p("fixed-window:limit=4,period=700ms,name=a")],
        vec![p("sliding-log:limit=5,period=1s,name=a")],
        vec![p("sliding-window:limit=6,period=900ms,name=a")],
        vec![
            p("token-bucket:limit=5,period=1s,name=fast"),
            p("sliding-window:limit=12,period=10s,name=slow"),
        ],
        // The deny cache once answered a refilled B as violated (A's wait outlived B's).
        vec![
            p("token-bucket:limit=2,period=60s,name=A"),
            p("token-bucket:limit=1,period=1s,name=B"),
        ],
        vec![
            p("leaky-bucket:limit=2,period=500ms,burst=3,name=l"),
            p("fixed-window:limit=7,period=3s,name=f"),
        ],
    ];
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for (k, policies) in sets.iter().enumerate() {
        let limits = Limits::new(policies.clone()).unwrap();
        let cached = DenyCache::with_max(
            RedisBackend::builder(redis.url())
                .prefix(prefix(&format!("dc-on-{k}")))
                .timeout(Duration::from_secs(5))
                .build()
                .unwrap(),
            Duration::from_secs(3600),
        );
        let plain = RedisBackend::builder(redis.url())
            .prefix(prefix(&format!("dc-off-{k}")))
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        let mut t = 1_700_000_000_000u64;
        for i in 0..600 {
            t += [0, 0, 1, 7, 50, 333, 1000][next(7) as usize];
            let key = ["x", "y"][next(2) as usize];
            let cost = [1, 1, 1, 2, 3, 0][next(6) as usize];
            if next(40) == 0 {
                let a = cached.refund(key, &limits, 1, Some(t)).await.unwrap();
                let b = plain.refund(key, &limits, 1, Some(t)).await.unwrap();
                assert_eq!(a.remaining(), b.remaining(), "set {k} refund {i}");
                continue;
            }
            let a = cached
                .check_limits(key, &limits, cost, Some(t))
                .await
                .unwrap();
            let b = plain
                .check_limits(key, &limits, cost, Some(t))
                .await
                .unwrap();
            // Every field, the shown ones included: allowed, the violated set, each policy's
            // remaining, retry_after and reset_after, the aggregate and the binding policy.
            assert_eq!(a, b, "set {k} request {i} t={t} {key} cost {cost}");
            let shown = |d: &Decision| -> Vec<(String, bool, u64, Option<u64>, u64)> {
                d.policies()
                    .iter()
                    .map(|p| {
                        (
                            p.name().to_owned(),
                            p.allowed(),
                            p.remaining(),
                            p.retry_after().map(turnstile_core::round::ceil_secs),
                            turnstile_core::round::ceil_secs(p.reset_after()),
                        )
                    })
                    .collect()
            };
            assert_eq!(shown(&a), shown(&b), "set {k} request {i}");
        }
        assert!(cached.hits() > 0, "set {k}: the cache was never used");
        cached.inner().delete_prefix().await.unwrap();
        plain.delete_prefix().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deny_cache_cuts_redis_calls_in_a_flood_by_ten_times_or_more() {
    let redis = TestRedis::get();
    let pol = [p("gcra:limit=5,period=1h,name=flood")];
    let mut calls = Vec::new();
    for cached in [false, true] {
        let b = RedisBackend::builder(redis.url())
            .prefix(prefix(&format!("flood-{cached}")))
            .timeout(Duration::from_secs(5))
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
        let (mut admitted, mut denied, mut errors) = (0, 0, 0);
        for child in procs {
            let out = child.wait_with_output().unwrap();
            assert!(out.status.success());
            let line = String::from_utf8(out.stdout).unwrap();
            for part in line.split_whitespace() {
                let (k, v) = part.split_once('=').unwrap();
                let v: u64 = v.parse().unwrap();
                match k {
                    "admitted" => admitted += v,
                    "denied" => denied += v,
                    "errors" => errors += v,
                    _ => panic!("unexpected output {line}"),
                }
            }
        }
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
    let admin = RedisBackend::builder(redis.url())
        .prefix(pre.as_str())
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
            .set_override("}{", &[p("sliding-log:limit=1,period=1h,name=own")])
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
    let mut server = RedisServer::start();
    let clock = ManualClock::new(0);
    let b = RedisBackend::builder(server.url())
        .prefix(prefix("reload"))
        .timeout(Duration::from_secs(2))
        .clock(clock.clone())
        .build()
        .unwrap();
    let pol = [p("gcra:limit=10,period=1m,name=g")];
    assert_eq!(b.check("k", &pol, 1).await.unwrap().remaining(), 9);

    assert!(command(server.port(), "SCRIPT FLUSH")
        .unwrap()
        .starts_with("+OK"));
    assert_eq!(b.check("k", &pol, 1).await.unwrap().remaining(), 8);

    server.restart();
    // The pool's old connection died with the server; the next call that reaches Redis
    // reconnects and reloads the script. (A call may fail once while the pool notices the
    // dead connection; then the retry interval, timed on the local clock, passes.)
    let mut result = b.check("k", &pol, 1).await;
    if result.is_err() {
        clock.advance(Duration::from_secs(2));
        result = b.check("k", &pol, 1).await;
    }
    assert_eq!(
        result.unwrap().remaining(),
        9,
        "fresh state after the restart"
    );
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
async fn garbage_in_a_key_is_a_typed_error_never_a_panic() {
    let server = RedisServer::start();
    let b = backend(&server.url(), "garbage");
    let pol = [p("token-bucket:limit=5,period=1s,name=t")];
    let key = b.state_key("victim", &pol[0]);
    // The policy's parameters, then something that is not a number.
    let set = format!("SET {key} 1.5.1000.5|12|banana");
    assert!(command(server.port(), &set).unwrap().starts_with("+OK"));
    let err = b.check("victim", &pol, 1).await.unwrap_err();
    assert!(matches!(err, BackendError::InvalidState(_)), "{err}");
    for garbage in [
        "banana",
        "1.5.1000|1|2",
        "9.5.1000.5|1|2",
        "1.5.1000.5|1|2|3",
        "",
    ] {
        let set = format!("SET {key} \"{garbage}\"");
        assert!(command(server.port(), &set).unwrap().starts_with("+OK"));
        let err = b.check("victim", &pol, 1).await.unwrap_err();
        assert!(
            matches!(err, BackendError::InvalidState(_)),
            "{garbage}: {err}"
        );
    }
    // A garbage override is a typed error too, and the local fallback takes over.
    let cfg = format!("{}~cfg", key.rsplit_once(':').unwrap().0);
    let set = format!("HSET {cfg} o \"1 0 1000 5 t\"");
    assert!(command(server.port(), &set).unwrap().starts_with(":"));
    let err = b.check("victim", &pol, 1).await.unwrap_err();
    assert!(matches!(err, BackendError::InvalidState(_)), "{err}");
    let err = b.config("victim").await.unwrap_err();
    assert!(matches!(err, BackendError::InvalidState(_)), "{err}");
    let local = Fallback::new(
        RedisBackend::builder(server.url())
            .prefix(prefix("garbage"))
            .build()
            .unwrap(),
        FailurePolicy::Local,
    );
    assert!(local.check("victim", &pol, 1).await.unwrap().allowed());
    // State written under other parameters (a burst of 5) carries over: 1 unit in use.
    let other = p("token-bucket:limit=5,period=1s,name=t");
    b.check_on_redis("fresh", std::slice::from_ref(&other), 1, Some(0))
        .await
        .unwrap();
    let d = b.check_on_redis("fresh", &pol, 1, Some(0)).await.unwrap().1;
    assert_eq!(d.remaining(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_written_key_expires_with_its_reset_after() {
    let server = RedisServer::start();
    let b = backend(&server.url(), "ttl");
    let pol = [
        p("token-bucket:limit=10,period=10s,name=tb"),
        p("sliding-log:limit=5,period=30s,name=log"),
    ];
    b.check("k", &pol, 3).await.unwrap();
    let ttl = |key: &str| -> i64 {
        let r = command(server.port(), &format!("PTTL {key}")).unwrap();
        r.trim().trim_start_matches(':').parse().unwrap()
    };
    // Token bucket: 3 tokens owed at 1 per second → 3000 ms. Sliding log: 30 s.
    let tb = ttl(&b.state_key("k", &pol[0]));
    assert!((2_900..=3_000).contains(&tb), "{tb}");
    let log = ttl(&b.state_key("k", &pol[1]));
    assert!((29_900..=30_000).contains(&log), "{log}");
}
