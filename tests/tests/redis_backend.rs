//! The Redis backend against real `redis-server` processes these tests start themselves.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use turnstile_core::wrap::{DenyCache, Fallback};
use turnstile_core::{
    Algorithm, Backend, BackendError, Decision, KeyConfig, Limits, ManualClock, MemoryBackend,
    Policy, Unconfigured,
};
use turnstile_core::{FailurePolicy, Quotas};
use turnstile_redis::{redis, KeyEncoding, RedisBackend, ScriptMode};
use turnstile_tests::redis_server::{command, command_calls, RedisCluster, RedisServer, TestRedis};

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
    // Through both paths: Redis Functions (FCALL, the default on Redis 7) and EVALSHA
    // (forced), each on a server of its own so its command counts show which path ran.
    for mode in [ScriptMode::Auto, ScriptMode::Eval] {
        let server = RedisServer::start();
        let requests = run_every_vector(&server.url(), mode).await;
        let (fcall, evalsha) = (
            command_calls(server.port(), "fcall"),
            command_calls(server.port(), "evalsha"),
        );
        match mode {
            ScriptMode::Auto => assert_eq!((fcall, evalsha), (requests, 0), "{mode:?}"),
            _ => {
                assert_eq!(fcall, 0, "{mode:?}");
                assert!(evalsha >= requests, "{mode:?}: {evalsha} EVALSHA");
            }
        }
    }
}

/// Runs every vector on Redis at `url` with `mode` and on the in-memory backend, comparing
/// every decision; returns the number of requests.
async fn run_every_vector(url: &str, mode: ScriptMode) -> u64 {
    let files = vector_files();
    assert!(files.len() >= 31, "only {} vectors found", files.len());
    let mut requests = 0;
    for (i, path) in files.iter().enumerate() {
        let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let policies: Vec<Policy> = match v.get("policies") {
            Some(ps) => ps.as_array().unwrap().iter().map(vector_policy).collect(),
            None => vec![vector_policy(&v["policy"])],
        };
        let on_redis = RedisBackend::builder(url)
            .prefix(prefix(&format!("vec{i}")))
            .timeout(Duration::from_secs(5))
            .script_mode(mode)
            .build()
            .unwrap();
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
                "{mode:?}: {} at t={t} key={key:?} cost={cost}",
                path.display()
            );
            requests += 1;
        }
        on_redis.delete_prefix().await.unwrap();
    }
    eprintln!(
        "{mode:?}: {} vectors, {requests} requests: Redis == memory",
        files.len()
    );
    requests
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_traces_decide_on_redis_exactly_as_in_memory() {
    // One deterministic pseudo-random run mixing keys, costs (queries and costs above
    // capacity included), equal times and long idle gaps, several policies, redeploys that
    // change a policy's parameters or algorithm under the same name (carry-over), and the
    // live-quota operations: refund, reset, overrides and tiers. Every answer must be equal,
    // field for field, on both backends.
    let redis = TestRedis::get();
    // TURNSTILE_SEED=n runs another trace (the default one is fixed, so failures repeat).
    let seed: u64 = std::env::var("TURNSTILE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x9e37_79b9_7f4a_7c15);
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
    let trace = Trace {
        start_ms: 1_700_000_000_000,
        sets,
        steps_ms: &[300, 3_000, 100_000],
        bounds: false,
    };
    trace
        .run(&backend(redis.url(), "random"), seed | 1, 3_000)
        .await;

    // The same at the contract's bounds (SEMANTICS.md "Inputs" and "Exactness"): times up to
    // 2^53 − 1 ms (the last stretch of the trace at exactly 2^53 − 1), policies with
    // max(L, B)·P = 2^53 − 1 (2^53 − 1 = 441,650,591 × 20,394,401) or near it, the longest
    // period, the largest limit, and costs around each capacity and up to 2^53 − 1.
    let sets: Vec<Vec<Policy>> = vec![
        vec![p("token-bucket:limit=441650591,period=20394401ms,name=a")],
        vec![p(
            "token-bucket:limit=3,period=20394401ms,burst=441650591,name=a",
        )],
        vec![p("gcra:limit=3,period=999999999ms,burst=4,name=a")],
        vec![p("gcra:limit=3,period=20394401ms,burst=441650591,name=a")],
        vec![p("gcra:limit=4294967295,period=2097152ms,name=a")],
        vec![p("leaky-bucket:limit=20394401,period=441650591ms,name=a")],
        vec![p("leaky-bucket:limit=7,period=365d,burst=285616,name=a")],
        vec![p("fixed-window:limit=441650591,period=20394401ms,name=a")],
        vec![p("fixed-window:limit=285616,period=365d,name=a")],
        vec![p("sliding-log:limit=20394401,period=441650591ms,name=a")],
        vec![p("sliding-log:limit=1,period=365d,name=a")],
        vec![p("sliding-log:limit=5,period=1000ms,name=a")],
        vec![p("sliding-window:limit=441650591,period=20394401ms,name=a")],
        vec![p("sliding-window:limit=285616,period=365d,name=a")],
        vec![p("sliding-window:limit=4,period=1000ms,name=a")],
        vec![
            p("gcra:limit=441650591,period=20394401ms,name=fast"),
            p("sliding-window:limit=20394401,period=441650591ms,name=slow"),
            p("sliding-log:limit=3,period=365d,name=log"),
        ],
    ];
    let trace = Trace {
        // Gaps of up to 2.9 days (longer than most periods here): 3,000 steps end at 2^53 − 1.
        start_ms: MAX_EXACT - 35_000_000_000,
        sets,
        steps_ms: &[1_000, 3_000_000, 250_000_000],
        bounds: true,
    };
    trace
        .run(
            &backend(redis.url(), "random-bounds"),
            seed.rotate_left(17) | 1,
            3_000,
        )
        .await;
}

/// 2^53 − 1: the largest time, cost and max(L, B)·P the contract accepts.
const MAX_EXACT: u64 = (1 << 53) - 1;

/// A pseudo-random trace of checks and live-quota operations, replayed on Redis and in memory.
struct Trace<'a> {
    /// The first request's time.
    start_ms: u64,
    /// The policy sets the defaults, tiers and overrides are picked from.
    sets: Vec<Vec<Policy>>,
    /// Three sizes of gap between requests, from short to idle.
    steps_ms: &'a [u64; 3],
    /// Bounds mode: times stop at 2^53 − 1; costs are drawn around
    /// the capacity of the first policy that applies by default, and up to 2^53 − 1. Key
    /// versions are not compared: a version held alone is forgotten after a day, which the
    /// memory backend times on the trace's clock and Redis on its own (`PEXPIRE`), so they
    /// part once a trace spans days, as this one does. The first trace compares them.
    bounds: bool,
}

impl Trace<'_> {
    /// The same configuration on both backends: equal, or (in bounds mode) equal but for
    /// the version.
    fn same_config(&self, redis: &KeyConfig, memory: &KeyConfig, ctx: &str) {
        if self.bounds {
            assert_eq!(
                (redis.policies(), redis.tier()),
                (memory.policies(), memory.tier()),
                "{ctx}"
            );
        } else {
            assert_eq!(redis, memory, "{ctx}");
        }
    }

    /// Replays `steps` pseudo-random operations from `seed`; every answer must be equal, field
    /// for field, on both backends.
    async fn run(&self, on_redis: &RedisBackend, mut seed: u64, steps: usize) {
        let memory = MemoryBackend::new();
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let pick = |i: u64| self.sets[i as usize % self.sets.len()].clone();
        let mut limits = Limits::new(pick(0)).unwrap();
        let mut t = self.start_ms;
        let mut counts = [0u32; 9];
        for i in 0..steps {
            let step = match next(10) {
                0 => 0,
                1..=7 => next(self.steps_ms[0]),
                8 => next(self.steps_ms[1]),
                _ => next(self.steps_ms[2]),
            };
            t = t.saturating_add(step).min(MAX_EXACT);
            let key = ["", "a", "b"][next(3) as usize];
            let cost = if self.bounds {
                let cap = limits.defaults()[0].capacity();
                [0, 1, 1, 2, 3, cap / 2, cap - 1, cap, cap + 1, MAX_EXACT][next(10) as usize]
            } else {
                [0, 1, 1, 1, 2, 3, 13][next(7) as usize]
            };
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
                        .unwrap_or_else(|e| panic!("{ctx}: {e}")),
                    memory
                        .check_limits(key, &limits, cost, Some(t))
                        .into_inner()
                        .unwrap(),
                ),
                1 => (
                    on_redis
                        .refund(key, &limits, cost, Some(t))
                        .await
                        .unwrap_or_else(|e| panic!("{ctx}: {e}")),
                    memory.refund(key, &limits, cost, Some(t)).await.unwrap(),
                ),
                2 => {
                    // A peek changes nothing, which the next answers check.
                    (
                        on_redis
                            .check_limits(key, &limits, 0, Some(t))
                            .await
                            .unwrap_or_else(|e| panic!("{ctx}: {e}")),
                        memory
                            .check_limits(key, &limits, 0, Some(t))
                            .into_inner()
                            .unwrap(),
                    )
                }
                3 => (
                    on_redis
                        .reset(key, &limits, Some(t))
                        .await
                        .unwrap_or_else(|e| panic!("{ctx}: {e}")),
                    memory.reset(key, &limits, Some(t)).await.unwrap(),
                ),
                4 => {
                    let set = pick(next(100));
                    let r = on_redis.set_override(key, &set).await.unwrap();
                    let m = memory.set_override(key, &set).await.unwrap();
                    self.same_config(&r, &m, &format!("{ctx}: override"));
                    continue;
                }
                5 => {
                    let r = on_redis.remove_override(key).await.unwrap();
                    let m = memory.remove_override(key).await.unwrap();
                    self.same_config(&r, &m, &format!("{ctx}: remove"));
                    continue;
                }
                6 if next(8) == 0 => {
                    let r = on_redis.clear_config(key).await.unwrap();
                    let m = memory.clear_config(key).await.unwrap();
                    self.same_config(&r, &m, &format!("{ctx}: clear"));
                    continue;
                }
                6 => {
                    let tier = ["pro", "gold", "free"][next(3) as usize];
                    let tier = (next(4) > 0).then_some(tier);
                    let r = on_redis.set_tier(key, tier).await.unwrap();
                    let m = memory.set_tier(key, tier).await.unwrap();
                    self.same_config(&r, &m, &format!("{ctx}: tier"));
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
                    let m = memory.config(key).await.unwrap();
                    self.same_config(&r, &m, &format!("{ctx}: config"));
                    continue;
                }
            };
            if self.bounds {
                let version_free = |d: Decision| {
                    let applied = d.applied().clone();
                    d.with_applied(applied, 0)
                };
                assert_eq!(version_free(got), version_free(want), "{ctx}");
            } else {
                assert_eq!(got, want, "{ctx}");
            }
        }
        eprintln!("operations by kind: {counts:?}");
        on_redis.delete_prefix().await.unwrap();
    }
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

/// Regression (issue 15): GCRA's stored state changed format (its TAT became relative to the
/// last update) at the same keys, without a version: a state an older release wrote was
/// read as the new format (a misread TAT, or an invalid-state error). The format version is
/// now part of every state key, whatever the prefix: a format-1 state at the unversioned key,
/// a format-2 state (`f2`: one key per policy) and a format-3 string (`f3`: one string per
/// client, GCRA's state as updated, ahead, frac) are never read by format 4 (the same one
/// string, GCRA's state the token bucket's), the new release starts that client fresh, and
/// the old keys are left to the older releases (and to their TTLs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn states_of_older_formats_are_never_read_as_format_4() {
    let server = RedisServer::start();
    let b = backend(&server.url(), "format1");
    let pol = [p("gcra:limit=10,period=1s,name=g")];
    let key = b.state_key("c", &pol[0]);
    assert!(key.ends_with("}:f4"), "{key}");
    let base = key.rsplit_once("}:").unwrap().0;
    let old = format!("{base}}}:g");
    let f2 = format!("{base}}}:f2:g");
    let f3 = format!("{base}}}:f3");
    // Format 1: "alg.L.P.B|updated_ms|tat_ms|tat_frac", the TAT absolute (far ahead here:
    // read as format 2, "ahead" would be 2 * 10^12 ms, an invalid state).
    let now_ms = 1_000_000_000_000u64;
    let v1 = format!("2.10.1000.10|{now_ms}|{}|0", 2 * now_ms);
    let set = format!("SET {old} {v1}");
    assert!(command(server.port(), &set).unwrap().starts_with("+OK"));
    // Format 2, at its key: the bucket exhausted for the next ten seconds (10 units ahead).
    let later = 4_000_000_000_000u64;
    let v2 = format!("2.10.1000.10|{later}|10000|0");
    let set = format!("SET {f2} {v2}");
    assert!(command(server.port(), &set).unwrap().starts_with("+OK"));
    // Format 3, at its key: the header, then the same exhausted state as a line (read as
    // format 4 it would be three numbers where two belong: an invalid state).
    let v3 = format!("0\n2.10.1000.10|{later}|10000|0\tg");
    set_raw(&server.url(), &f3, v3.as_bytes()).await;
    // Ten requests: the new release's state is fresh, so all ten are admitted, counting down.
    for i in 0..10u64 {
        let d = b.check("c", &pol, 1).await.unwrap();
        assert!(d.allowed(), "request {i}");
        assert_eq!(d.remaining(), 9 - i, "request {i}");
    }
    assert!(!b.check("c", &pol, 1).await.unwrap().allowed());
    // The older releases' states are untouched.
    let get = format!("GET {old}");
    assert!(command(server.port(), &get).unwrap().contains(&v1));
    let get = format!("GET {f2}");
    assert!(command(server.port(), &get).unwrap().contains(&v2));
    let got = raw(&server.url(), redis::cmd("GET").arg(&f3))
        .await
        .unwrap();
    assert_eq!(got, redis::Value::BulkString(v3.into_bytes()));
}

/// Issue 15: the check script's key and arguments (see `lua/check.lua`'s header) are read
/// strictly, through `FCALL` and `EVALSHA` alike: a malformed policy set or flags argument is
/// a TURNSTILE_ARGS error reply that changes nothing, never a guess, and a well-formed one
/// decides (here: admitted, retry 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_check_arguments_are_refused_by_the_script() {
    let server = RedisServer::start();
    let url = server.url();
    let lib = turnstile_redis::library();
    raw(&url, redis::cmd("FUNCTION").arg("LOAD").arg(lib.source()))
        .await
        .unwrap();
    let good = "\n1.5.1000.5 p\n4.3.60000.3 q w";
    let cases: [(&str, &str, bool); 20] = [
        ("check defaults 0 1", good, true),
        ("check defaults 0 1", "\n5.3.1000.3 log\n1.5.1000.5 p", true),
        ("check defaults 0 1", "\n01.5.1000.5 p", true),
        ("check defaults 0 1 1700000000000", good, true),
        ("check defaults 600000 0 5", good, true),
        ("check defaults 0 1", "\n1.5.1000 p", false),
        ("check defaults 0 1", "x\n1.5.1000.5 p", false),
        ("check defaults 0 1", "\n1.5.1000.5 p\n1.5.1000.5 p", false),
        ("check defaults 0 1", "\nbad\n1.5.1000.5 p", false),
        ("check defaults 0 1", "\n1.5.1000.5 ", false),
        ("check defaults 0 1", "\n1.0.1000.5 p", false),
        ("check nope 0 1", good, false),
        ("check defaults -1 1", good, false),
        ("check defaults 0x10 1", good, false),
        ("peek defaults 0 1", good, false),
        ("check defaults 0", good, false),
        ("check defaults 0 1 ", good, false),
        ("check defaults 0 1e3", good, false),
        ("check defaults 0 1 17e11", good, false),
        ("check defaults 0 9007199254740992", good, false),
    ];
    // The check called through FCALL or EVAL with one key and its two arguments.
    let call = |command: &str, key: &str, flags: &str, set: &str| {
        let mut c = redis::cmd(command);
        if command == "FCALL" {
            c.arg(lib.check_function());
        } else {
            c.arg(turnstile_redis::CHECK_SCRIPT);
        }
        c.arg(1).arg(key).arg(flags).arg(set);
        c
    };
    for (i, (flags, set, ok)) in cases.into_iter().enumerate() {
        for command in ["FCALL", "EVAL"] {
            let c = call(command, &format!("args:{{c{i}}}:f4"), flags, set);
            let what = format!("{command} {flags:?} {set:?}");
            match raw(&url, &c).await {
                Ok(redis::Value::Array(v)) if ok => {
                    // The first policy's retry: after now, version and applied, or after the
                    // compact reply's -1 - now.
                    let at = match v.first() {
                        Some(redis::Value::Int(head)) if *head < 0 => 1,
                        _ => 3,
                    };
                    assert_eq!(v.get(at), Some(&redis::Value::Int(0)), "{what}: {v:?}");
                }
                Err(e) if !ok => {
                    assert!(e.to_string().contains("TURNSTILE_ARGS"), "{what}: {e}");
                }
                other => panic!("{what}: {other:?}"),
            }
        }
    }
    // A key that is not a state string's (another format's, no format, no base) is refused
    // too, a fresh one included, whatever the policies; nothing is written.
    for (i, key) in ["args:{k}:f3", "args:{k}", ":f4", "args:{k}:f4x"]
        .into_iter()
        .enumerate()
    {
        for set in [good, "\n5.3.1000.3 log"] {
            for command in ["FCALL", "EVAL"] {
                let c = call(command, key, "check defaults 0 1", set);
                let e = raw(&url, &c).await.unwrap_err();
                assert!(
                    e.to_string().contains("malformed key"),
                    "{command} key {i} {key:?} {set:?}: {e}"
                );
            }
        }
    }
    let keys = raw(&url, redis::cmd("KEYS").arg("args:{k}*"))
        .await
        .unwrap();
    assert_eq!(keys, redis::Value::Array(vec![]), "nothing written");
}

/// Issue 15: a key's configuration (its override, its tier) is never tied to its state's
/// lifetime: checks, refunds and resets write state keys with a TTL (their reset_after) but
/// leave the configuration hash without one, so the override still applies once every state
/// key has expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configuration_overrides_never_expire_with_a_keys_state() {
    let server = RedisServer::start();
    let b = backend(&server.url(), "cfg-ttl");
    let defaults = [p("token-bucket:limit=10,period=1s,name=d")];
    let limits = Limits::new(defaults.to_vec()).unwrap();
    let over = [p("fixed-window:limit=3,period=1s,name=o")];
    b.set_override("c", &over).await.unwrap();
    b.set_tier("t", Some("pro")).await.unwrap();
    let pttl = |key: &str| -> i64 {
        let r = command(server.port(), &format!("PTTL {key}")).unwrap();
        r.trim().trim_start_matches(':').parse().unwrap()
    };
    let cfg = |client: &str| {
        let state = b.state_key(client, &defaults[0]);
        format!("{}}}~cfg", state.rsplit_once("}:").unwrap().0)
    };
    for round in 0..3 {
        let d = b.check("c", &defaults, 1).await.unwrap();
        assert!(
            matches!(d.applied(), turnstile_core::Applied::Override),
            "{round}"
        );
        assert_eq!(d.remaining(), 2, "{round}");
        // The state key expires with its reset_after; the configuration does not expire.
        let state = b.state_key("c", &over[0]);
        assert!(
            (1..=1000).contains(&pttl(&state)),
            "{round}: {}",
            pttl(&state)
        );
        assert_eq!(pttl(&cfg("c")), -1, "{round}: after a check");
        b.refund("c", &limits, 1, None).await.unwrap();
        assert_eq!(pttl(&cfg("c")), -1, "{round}: after a refund");
        b.check("t", &defaults, 1).await.unwrap();
        b.reset("t", &limits, None).await.unwrap();
        assert_eq!(pttl(&cfg("t")), -1, "{round}: a tier after a reset");
        b.reset("c", &limits, None).await.unwrap();
        assert_eq!(pttl(&cfg("c")), -1, "{round}: after a reset");
        // Every state key gone (as once its TTL elapsed): the override still applies.
        command(server.port(), &format!("DEL {state}")).unwrap();
    }
    assert_eq!(b.config("c").await.unwrap().policies(), Some(&over[..]));
    assert_eq!(b.config("t").await.unwrap().tier(), Some("pro"));
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
    let cfg = format!("{}}}~cfg", key.rsplit_once("}:").unwrap().0);
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

/// Every written key expires, and never before any state it holds is past its reset_after:
/// the client's state string (format f4: every policy's state in one string) gets the largest
/// TTL any of its policies needs, and a sliding log's list the string's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_written_key_expires_with_its_reset_after() {
    let server = RedisServer::start();
    let b = backend(&server.url(), "ttl");
    let pol = [
        p("token-bucket:limit=10,period=10s,name=tb"),
        p("sliding-log:limit=5,period=30s,name=log"),
    ];
    let ttl = |key: &str| -> i64 {
        let r = command(server.port(), &format!("PTTL {key}")).unwrap();
        r.trim().trim_start_matches(':').parse().unwrap()
    };
    let states = b.state_key("k", &pol[0]);
    assert_eq!(states, b.state_key("k", &pol[1]));
    let log = format!("{}:log", states.replacen("}:", "}~log:", 1));
    // Token bucket alone: 3 tokens owed at 1 per second → 3000 ms.
    b.check("k", &pol[..1], 3).await.unwrap();
    let tb = ttl(&states);
    assert!((2_900..=3_000).contains(&tb), "{tb}");
    // Both: the token bucket's 3000 ms (now 6 tokens owed: 6000 ms) and the sliding log's
    // 30 s; the string keeps the longer, the log as long.
    b.check("k", &pol, 3).await.unwrap();
    let both = ttl(&states);
    assert!((29_900..=30_000).contains(&both), "{both}");
    let l = ttl(&log);
    assert!((29_900..=30_000).contains(&l), "{l}");
    // Again, now from the string alone (the fast path): the log gets the string's TTL anew
    // (shortened by hand first, so a log left as it was would show).
    command(server.port(), &format!("PEXPIRE {log} 1000")).unwrap();
    b.check("k", &pol, 1).await.unwrap();
    let (both, l) = (ttl(&states), ttl(&log));
    assert!((29_900..=30_000).contains(&both), "{both}");
    assert!((29_900..=30_000).contains(&l), "{l}");
    // A sliding log alone, on a fresh key and then on its own string.
    for _ in 0..2 {
        b.check("n", &pol[1..], 1).await.unwrap();
        let n = b.state_key("n", &pol[1]);
        let l = ttl(&format!("{}:log", n.replacen("}:", "}~log:", 1)));
        assert!((29_900..=30_000).contains(&l), "{l}");
        assert!((29_900..=30_000).contains(&ttl(&n)), "{n}");
    }
    // Three policies of which the longest (60 s for one token) is neither first nor last.
    let three = [
        p("token-bucket:limit=10,period=10s,name=tb"),
        p("token-bucket:limit=1,period=60s,name=slow"),
        p("gcra:limit=10,period=1s,name=g"),
    ];
    b.check("m", &three, 1).await.unwrap();
    let m = ttl(&b.state_key("m", &three[0]));
    assert!((59_900..=60_000).contains(&m), "{m}");
}

/// A sliding log's list left without its state string (it may outlive the string by a
/// moment: each gets its TTL on its own) is a fresh key's: the first admitted request drops
/// it, and every answer after is the memory backend's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sliding_log_left_without_its_state_is_dropped_by_the_next_request() {
    let server = RedisServer::start();
    let url = server.url();
    let b = backend(&url, "orphan");
    let t: u64 = 1_700_000_000_000;
    for (i, pol) in [
        vec![p("sliding-log:limit=3,period=10s,name=log")],
        vec![
            p("token-bucket:limit=5,period=1s,name=tb"),
            p("sliding-log:limit=3,period=10s,name=log"),
        ],
    ]
    .into_iter()
    .enumerate()
    {
        let client = format!("orphan{i}");
        let states = b.state_key(&client, &pol[0]);
        let log = format!("{}:log", states.replacen("}:", "}~log:", 1));
        // Live entries using the whole limit, as a string that just expired left them.
        for entry in [format!("{}:2", t - 300), format!("{}:1", t - 100)] {
            raw(&url, redis::cmd("RPUSH").arg(&log).arg(entry))
                .await
                .unwrap();
        }
        let memory = MemoryBackend::new();
        for (dt, cost) in [(0, 1), (0, 1), (5, 1), (5, 2), (20, 1), (10_001, 3)] {
            let got = b.check_at(&client, &pol, cost, t + dt).await.unwrap();
            let want = memory
                .check_at(&client, &pol, cost, t + dt)
                .into_inner()
                .unwrap();
            assert_eq!(got, want, "set {i} at +{dt} ms, cost {cost}");
            if dt == 0 && cost == 1 {
                let entries = raw(&url, redis::cmd("LRANGE").arg(&log).arg(0).arg(-1))
                    .await
                    .unwrap();
                assert_eq!(
                    entries,
                    redis::Value::Array(vec![redis::Value::BulkString(
                        format!("{t}:{}", 1 + u64::from(got.remaining() == 1)).into_bytes()
                    )]),
                    "set {i}: the leftover entries are gone"
                );
            }
        }
    }
}

/// Sends one command to the Redis at `url` and returns its reply.
async fn raw(url: &str, cmd: &redis::Cmd) -> redis::RedisResult<redis::Value> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    cmd.query_async(&mut conn).await
}

/// `SET key value` (any bytes), then the key holds nothing else.
async fn set_raw(url: &str, key: &str, value: &[u8]) {
    raw(url, redis::cmd("DEL").arg(key)).await.unwrap();
    raw(url, redis::cmd("SET").arg(key).arg(value))
        .await
        .unwrap();
}

fn assert_invalid_state<T: std::fmt::Debug>(r: Result<T, BackendError>, what: &str) {
    match r {
        Err(BackendError::InvalidState(_)) => {}
        other => panic!("{what}: want InvalidState, got {other:?}"),
    }
}

/// Values Lua's `tonumber` reads as numbers (or nearly) that are no stored integer: hex,
/// spaces, exponents, infinities, signs, fractions, 2^53 and beyond, and plain garbage.
const NOT_INTEGERS: [&str; 18] = [
    "0x10",
    " 1",
    "1 ",
    "1e20",
    "1e3",
    "inf",
    "-inf",
    "nan",
    "-1",
    "-0",
    "1.5",
    "1.0",
    "+1",
    "",
    "9007199254740992",
    "99999999999999999999999",
    "1_000",
    "banana",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_repairs_a_state_key_holding_garbage_of_any_kind() {
    // Issue 13: a state key holding garbage (`SET <state key> garbage`, a hand edit) made
    // every check *and* `Quotas::reset` fail with InvalidState, so the client stayed refused
    // until someone deleted the key by hand. Now every such value is a typed InvalidState for
    // checks, refunds and peeks (changing nothing), and a reset forgets it: the next answers
    // are a fresh key's, as in memory.
    let server = RedisServer::start();
    let url = server.url();
    let on_redis = backend(&url, "repair");
    let memory = MemoryBackend::new();
    let t: u64 = 1_700_000_000_500;
    // Per algorithm: a state the scripts could have written at t (one unit in use), and the
    // log it needs.
    let valid: [(&str, String, Option<String>); 6] = [
        ("token-bucket", format!("1.5.1000.5|{t}|1000"), None),
        ("gcra", format!("2.5.1000.5|{t}|1000"), None),
        ("leaky-bucket", format!("3.5.1000.5|{t}|1000"), None),
        ("fixed-window", format!("4.5.1000.5|{t}|1"), None),
        (
            "sliding-log",
            format!("5.5.1000.5|{t}|1"),
            Some(format!("{t}:1")),
        ),
        ("sliding-window", format!("6.5.1000.5|{t}|1|0"), None),
    ];
    let mut cases = 0;
    for (k, (alg, state, log)) in valid.iter().enumerate() {
        let pol = [p(&format!("{alg}:limit=5,period=1s,name=p"))];
        let limits = Limits::new(pol.to_vec()).unwrap();
        let state_key = |client: &str| on_redis.state_key(client, &pol[0]);
        let log_key = |client: &str| format!("{}:p", state_key(client).replacen("}:", "}~log:", 1));
        // The client's state string (format f4): the header '0', then the line of policy p.
        let store = |client: String, state: String, log: Option<String>| {
            let url = url.clone();
            let (sk, lk) = (state_key(&client), log_key(&client));
            let state = match state.strip_prefix('!') {
                Some(as_is) => as_is.to_owned(),
                None => format!("0\n{state}\tp"),
            };
            async move {
                set_raw(&url, &sk, state.as_bytes()).await;
                raw(&url, redis::cmd("DEL").arg(&lk)).await.unwrap();
                if let Some(entry) = log {
                    raw(&url, redis::cmd("RPUSH").arg(&lk).arg(entry))
                        .await
                        .unwrap();
                }
            }
        };

        // The valid state reads as one unit in use: the cases below break only what they say.
        let client = format!("valid-{k}");
        store(client.clone(), state.clone(), log.clone()).await;
        let d = on_redis.check_at(&client, &pol, 0, t).await.unwrap();
        assert_eq!(d.remaining(), 4, "{alg}: {state}");

        // Every part of the state replaced by each non-integer, and states no requests leave.
        let parts: Vec<&str> = state.split(['|', '.']).collect();
        let mut garbage: Vec<(String, Option<String>)> = Vec::new();
        for i in 0..parts.len() {
            for bad in NOT_INTEGERS {
                let mut ps: Vec<String> = parts.iter().map(|s| (*s).to_owned()).collect();
                ps[i] = bad.to_owned();
                let text = format!("{}|{}", ps[..4].join("."), ps[4..].join("|"));
                garbage.push((text, log.clone()));
            }
        }
        let tail = state.split_once('|').unwrap().1;
        let id = &state[..1];
        for text in [
            "banana".to_owned(),
            String::new(),
            format!("{id}.5.1000.5"),
            format!("{id}.5.1000.5|"),
            format!("{state}|1"),
            format!("{state}|"),
            state.replacen('|', "||", 1),
            format!("{id}.5.1000|{tail}"),
            format!("{id}.5.1000.5.5|{tail}"),
            // parameters no policy has
            format!("0.5.1000.5|{tail}"),
            format!("7.5.1000.5|{tail}"),
            format!("{id}.0.1000.5|{tail}"),
            format!("{id}.5.0.5|{tail}"),
            format!("{id}.5.1000.0|{tail}"),
            format!("{id}.4294967296.1000.5|{tail}"),
            format!("{id}.5.31536000001.5|{tail}"),
            format!("{id}.4294967295.31536000000.4294967295|{tail}"),
        ] {
            garbage.push((text, log.clone()));
        }
        // States of valid shape that no sequence of requests leaves.
        let out_of_range: Vec<(String, Option<String>)> = match *alg {
            "token-bucket" | "gcra" | "leaky-bucket" => {
                vec![(format!("{id}.5.1000.5|{t}|5001"), None)]
            }
            "fixed-window" => vec![
                (format!("4.5.1000.5|{t}|6"), None),
                (format!("4.5.1000.6|{t}|1"), None),
            ],
            "sliding-window" => vec![
                (format!("6.5.1000.5|{t}|6|0"), None),
                (format!("6.5.1000.5|{t}|0|6"), None),
                (format!("6.5.1000.6|{t}|1|0"), None),
            ],
            _ => vec![
                // no log, a log that is not one, entries that are not entries
                (state.clone(), None),
                (state.clone(), Some("banana".into())),
                (state.clone(), Some(format!("{t}:0"))),
                (state.clone(), Some(format!("{}:1", t + 1))),
                (state.clone(), Some(format!("{t}:1:1"))),
                (state.clone(), Some(format!("0x{t}:1"))),
                (state.clone(), Some(format!("{t}:1e0"))),
                (state.clone(), Some(format!(" {t}:1"))),
                (format!("5.5.1000.5|{t}|0"), Some(format!("{}:1", t - 2000))),
            ],
        };
        garbage.extend(out_of_range);
        // The state string itself malformed ('!': stored as it is, not as p's line): no
        // header, another header, no line, an empty line, a line without its name, a name
        // twice, a name no policy has.
        for text in [
            format!("!{state}\tp"),
            format!("!x\n{state}\tp"),
            format!("!1\n{state}\tp"),
            "!0".to_owned(),
            "!0\n".to_owned(),
            format!("!0\n{state}\tp\n"),
            format!("!0\n\n{state}\tp"),
            format!("!0\n{state}"),
            format!("!0\n{state}\t"),
            format!("!0\n{state} p"),
            format!("!0{state}\tp"),
            format!("!0\n{state}\tp\n{state}\tp"),
            format!("!c\n{state}\tp\n{state}\tp"),
            format!("!0\n{state}\tp\t"),
            format!("!0\n{state}\tp\n{state}\tq\u{1}"),
            format!("!0\n{state}\tp\nbanana\tq"),
        ] {
            garbage.push((text, log.clone()));
        }

        for (i, (text, log)) in garbage.into_iter().enumerate() {
            let client = format!("g{k}-{i}");
            let what = format!("{alg} {text:?} log {log:?}");
            store(client.clone(), text, log).await;
            assert_invalid_state(on_redis.check_at(&client, &pol, 1, t).await, &what);
            assert_invalid_state(on_redis.check_at(&client, &pol, 0, t).await, &what);
            assert_invalid_state(on_redis.refund(&client, &limits, 1, Some(t)).await, &what);
            // An error changes nothing: no version was bumped.
            assert_eq!(
                on_redis.config(&client).await.unwrap().version(),
                0,
                "{what}"
            );
            let got = on_redis.reset(&client, &limits, Some(t)).await.unwrap();
            let want = memory.reset(&client, &limits, Some(t)).await.unwrap();
            assert_eq!(got, want, "{what}: reset");
            for cost in [1, 0, 4, 1] {
                let got = on_redis.check_at(&client, &pol, cost, t).await.unwrap();
                let want = memory
                    .check_at(&client, &pol, cost, t)
                    .into_inner()
                    .unwrap();
                assert_eq!(got, want, "{what}: after the reset, cost {cost}");
            }
            cases += 1;
        }

        // A key of another type is invalid state too (never a script error, which would
        // count the node as down), and a reset forgets it.
        for (i, cmd) in ["HSET", "RPUSH", "SADD"].into_iter().enumerate() {
            let client = format!("type{k}-{i}");
            let mut c = redis::cmd(cmd);
            c.arg(state_key(&client)).arg("x");
            if cmd == "HSET" {
                c.arg("y");
            }
            raw(&url, &c).await.unwrap();
            let what = format!("{alg}: state key made by {cmd}");
            assert_invalid_state(on_redis.check_at(&client, &pol, 1, t).await, &what);
            let got = on_redis.reset(&client, &limits, Some(t)).await.unwrap();
            let want = memory.reset(&client, &limits, Some(t)).await.unwrap();
            assert_eq!(got, want, "{what}: reset");
            let got = on_redis.check_at(&client, &pol, 1, t).await.unwrap();
            let want = memory.check_at(&client, &pol, 1, t).into_inner().unwrap();
            assert_eq!(got, want, "{what}: after the reset");
            cases += 1;
        }
        if *alg == "sliding-log" {
            let client = format!("logtype{k}");
            store(client.clone(), state.clone(), None).await;
            raw(
                &url,
                redis::cmd("HSET").arg(log_key(&client)).arg("x").arg("y"),
            )
            .await
            .unwrap();
            let what = "sliding-log: log key made by HSET";
            assert_invalid_state(on_redis.check_at(&client, &pol, 1, t).await, what);
            let got = on_redis.reset(&client, &limits, Some(t)).await.unwrap();
            let want = memory.reset(&client, &limits, Some(t)).await.unwrap();
            assert_eq!(got, want, "{what}: reset");
            let got = on_redis.check_at(&client, &pol, 1, t).await.unwrap();
            let want = memory.check_at(&client, &pol, 1, t).into_inner().unwrap();
            assert_eq!(got, want, "{what}: after the reset");
            cases += 1;
        }
    }
    eprintln!("{cases} kinds of garbage, each refused and repaired by a reset");
    assert!(cases > 600, "{cases}");
}

/// Replays `(t, cost)` for one key on Redis and in memory; every decision must be equal.
async fn same_on_both(on_redis: &RedisBackend, policies: &[Policy], trace: &[(u64, u64)]) {
    let memory = MemoryBackend::new();
    for &(t, cost) in trace {
        let want = memory
            .check_at("k", policies, cost, t)
            .into_inner()
            .unwrap();
        let got = on_redis
            .check_at("k", policies, cost, t)
            .await
            .unwrap_or_else(|e| panic!("{policies:?} at t={t} cost={cost}: {e}"));
        assert_eq!(got, want, "{policies:?} at t={t} cost={cost}");
    }
    on_redis.delete_prefix().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcra_near_the_end_of_time_is_not_invalid_state() {
    // Issue 13: at t = 9,007,199,000,000,000 ms (2^53 − 254,740,992) the GCRA stored its
    // theoretical arrival time t + 3·T = 9,007,199,999,999,999 ms, beyond 2^53, and read it
    // back as invalid state where memory admitted. The TAT is now kept relative to the last
    // update. The same trace on every bucket, and on to 2^53 − 1.
    let redis = TestRedis::get();
    let b = backend(redis.url(), "gcra-end");
    let trace = [
        (9_007_199_000_000_000, 3),
        (9_007_199_000_000_000, 1),
        (9_007_199_000_000_000, 1),
        (9_007_199_000_000_000, 0),
        (9_007_199_254_740_000, 1),
        (MAX_EXACT, 1),
        (MAX_EXACT, 0),
        (MAX_EXACT, 5),
    ];
    for alg in ["gcra", "token-bucket", "leaky-bucket"] {
        let pol = [p(&format!("{alg}:limit=3,period=999999999ms,burst=4"))];
        same_on_both(&b, &pol, &trace).await;
    }
    // The reported decisions, as SEMANTICS.md defines them (T = 333,333,333 ms).
    let pol = [p("gcra:limit=3,period=999999999ms,burst=4")];
    let d = b
        .check_at("k", &pol, 3, 9_007_199_000_000_000)
        .await
        .unwrap();
    assert_eq!(
        (d.allowed(), d.remaining(), d.reset_after()),
        (true, 1, Duration::from_millis(999_999_999))
    );
    let d = b
        .check_at("k", &pol, 1, 9_007_199_000_000_000)
        .await
        .unwrap();
    assert_eq!(
        (d.allowed(), d.remaining(), d.reset_after()),
        (true, 0, Duration::from_millis(1_333_333_332))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_log_reset_after_near_the_end_of_time_is_exact() {
    // Issue 13: an entry logged at s near 2^53 expires at s + P, which is beyond 2^53 and
    // was rounded before the time was subtracted: reset_after came out 1 ms off. Live-ness,
    // expiry, retry_after and refunds now subtract times first.
    let redis = TestRedis::get();
    let b = backend(redis.url(), "log-end");
    let pol = [p("sliding-log:limit=2,period=1000ms")];
    let d = b.check_at("k", &pol, 1, MAX_EXACT).await.unwrap();
    assert_eq!(d.reset_after(), Duration::from_millis(1000));
    b.delete_prefix().await.unwrap();
    for spec in [
        "sliding-log:limit=2,period=1000ms",
        "sliding-log:limit=3,period=365d",
        "sliding-log:limit=20394401,period=441650591ms",
    ] {
        let pol = [p(spec)];
        let period = pol[0].period_ms();
        same_on_both(
            &b,
            &pol,
            &[
                (MAX_EXACT - period - 3, 1),
                (MAX_EXACT - period, 1),
                (MAX_EXACT - 1, 1),
                (MAX_EXACT - 1, 0),
                (MAX_EXACT, 1),
                (MAX_EXACT, 2),
                (MAX_EXACT, 0),
            ],
        )
        .await;
        // Refunds walk the newest live entries, near the end of time too.
        let memory = MemoryBackend::new();
        let limits = Limits::new(pol.to_vec()).unwrap();
        for (t, cost) in [(MAX_EXACT - period, 1), (MAX_EXACT - 1, 1), (MAX_EXACT, 1)] {
            let got = b.check_at("r", &pol, cost, t).await.unwrap();
            let want = memory.check_at("r", &pol, cost, t).into_inner().unwrap();
            assert_eq!(got, want, "{spec} at {t}");
        }
        let got = b.refund("r", &limits, 1, Some(MAX_EXACT)).await.unwrap();
        let want = memory
            .refund("r", &limits, 1, Some(MAX_EXACT))
            .await
            .unwrap();
        assert_eq!(got, want, "{spec}: refund");
        b.delete_prefix().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_and_carry_over_store_what_memory_stores() {
    // Found by the parity trace at the bounds (issue 13), each a way the two backends
    // parted after a policy change:
    // - a refund of nothing (cost 0) rewrote a window's state at the refund's time on Redis,
    //   so a later carry-over into another period counted it where memory started fresh;
    // - a refund under another algorithm stored nothing on Redis, so the old algorithm's
    //   state came back when the policy did, where memory had replaced it;
    // - a sliding log whose entries had all expired came back to life under a longer period.
    let redis = TestRedis::get();
    let b = backend(redis.url(), "refund-carry");
    let memory = MemoryBackend::new();
    let check = |key: &'static str, limits: Limits, cost: u64, t: u64| {
        let b = b.clone();
        let memory = memory.clone();
        async move {
            let got = b.check_limits(key, &limits, cost, Some(t)).await.unwrap();
            let want = memory
                .check_limits(key, &limits, cost, Some(t))
                .into_inner()
                .unwrap();
            assert_eq!(got, want, "{key} at {t} cost {cost}");
            got
        }
    };
    let refund = |key: &'static str, limits: Limits, cost: u64, t: u64| {
        let b = b.clone();
        let memory = memory.clone();
        async move {
            let got = b.refund(key, &limits, cost, Some(t)).await.unwrap();
            let want = memory.refund(key, &limits, cost, Some(t)).await.unwrap();
            assert_eq!(got, want, "{key}: refund at {t} cost {cost}");
        }
    };
    let limits = |spec: &str| Limits::new([p(spec)]).unwrap();

    // A cost-0 refund changes no state: the window written at 100 is not the current one
    // when the period shrinks at 5000.
    let long = limits("sliding-window:limit=10,period=1h,name=a");
    let short = limits("sliding-window:limit=10,period=1s,name=a");
    check("w", long.clone(), 2, 100).await;
    refund("w", long.clone(), 0, 4_000).await;
    let d = check("w", short.clone(), 1, 5_000).await;
    assert_eq!(
        d.remaining(),
        9,
        "a fresh window: the two units of 100 ms are gone"
    );

    // A refund under another algorithm replaces the old state, as a carry-over does.
    let bucket = limits("token-bucket:limit=5,period=1h,name=a");
    let log = limits("sliding-log:limit=5,period=1h,name=a");
    check("x", bucket.clone(), 5, 0).await;
    refund("x", log.clone(), 1, 10).await;
    let d = check("x", bucket.clone(), 0, 20).await;
    assert_eq!(
        d.remaining(),
        5,
        "the bucket's units went with the refund under the log"
    );

    // An expired log stays expired under a longer period.
    let short = limits("sliding-log:limit=1,period=1s,name=a");
    let long = limits("sliding-log:limit=1,period=1h,name=a");
    check("y", short.clone(), 1, 0).await;
    let d = check("y", long.clone(), 1, 1_000).await;
    assert!(
        d.allowed(),
        "the entry of 0 ms expired at 1000 ms under 1 s"
    );
    check("z", short.clone(), 1, 0).await;
    let d = check("z", long.clone(), 1, 999).await;
    assert!(!d.allowed(), "at 999 ms it is live under either period");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clearing_the_configuration_repairs_a_garbage_configuration_hash() {
    // Issue 13: `turnstile quota rm` (Quotas::clear_config) must forget whatever a key's
    // configuration holds. Until then, every operation that reads it is a typed InvalidState
    // (never a script error, which would count the node as down): the scripts and the Rust
    // reader refuse the same overrides (digits only, valid policies and names, no empty
    // line, no name twice).
    let server = RedisServer::start();
    let url = server.url();
    let b = backend(&url, "cfg-repair");
    let memory = MemoryBackend::new();
    let pol = [p("token-bucket:limit=5,period=1s,name=t")];
    let limits = Limits::new(pol.to_vec()).unwrap();
    let t = 1_700_000_000_000;
    let cfg_key = |client: &str| {
        let state = b.state_key(client, &pol[0]);
        format!("{}}}~cfg", state.rsplit_once("}:").unwrap().0)
    };
    let fields: Vec<(&str, Vec<u8>)> = [
        ("o", "1 0 1000 5 t"),
        ("o", "+1 5 1000 5 t"),
        ("o", "1 +5 1000 5 t"),
        ("o", "1 5 0x10 5 t"),
        ("o", "1 5 1000 5"),
        ("o", "1 5 1000 5 "),
        ("o", ""),
        ("o", "1 5 1000 5 t\n"),
        ("o", "1 5 1000 5 t\n\n1 5 1000 5 u"),
        ("o", "1 5 1000 5 t\n1 5 1000 5 t"),
        ("o", "1 5 1000 5 a\"b"),
        ("o", "1 5 1000 5 a\\b"),
        ("o", "1 5 1000 5 a\tb"),
        ("o", "1 5 1000 5 a\u{7f}b"),
        ("o", "1 5 1000 5 é"),
        ("o", "4 5 1000 6 w"),
        ("o", "7 5 1000 5 t"),
        ("o", "1 4294967295 31536000000 4294967295 t"),
        ("t", ""),
        ("t", "no spaces"),
        ("v", "0x10"),
        ("v", " 1"),
        ("v", "-1"),
        ("v", "1.5"),
        ("v", "9007199254740992"),
    ]
    .into_iter()
    .map(|(f, v)| (f, v.as_bytes().to_vec()))
    .chain([("t", vec![0xff, 0xfe]), ("t", vec![b'x'; 65])])
    .collect();
    let mut cases = 0;
    for (i, (field, value)) in fields.iter().enumerate() {
        let client = format!("c{i}");
        raw(
            &url,
            redis::cmd("HSET")
                .arg(cfg_key(&client))
                .arg(*field)
                .arg(value),
        )
        .await
        .unwrap();
        let what = format!("{field} = {:?}", String::from_utf8_lossy(value));
        repaired_by_clear(&b, &memory, &client, &limits, t, &what).await;
        cases += 1;
    }
    // A configuration key of another type.
    for (i, cmd) in ["SET", "RPUSH", "SADD"].into_iter().enumerate() {
        let client = format!("type{i}");
        raw(&url, redis::cmd(cmd).arg(cfg_key(&client)).arg("x"))
            .await
            .unwrap();
        repaired_by_clear(&b, &memory, &client, &limits, t, cmd).await;
        cases += 1;
    }
    // A readable version survives the repair: it goes on counting.
    raw(
        &url,
        redis::cmd("HSET")
            .arg(cfg_key("kept"))
            .arg("v")
            .arg("41")
            .arg("o")
            .arg("garbage"),
    )
    .await
    .unwrap();
    assert_invalid_state(b.config("kept").await, "kept");
    assert_eq!(b.clear_config("kept").await.unwrap().version(), 42);
    assert_eq!(cases, fields.len() + 3);
}

/// A client whose configuration holds garbage: every operation that reads it is
/// InvalidState and changes nothing; `clear_config` repairs it, and the client is then a fresh
/// key with an empty configuration.
async fn repaired_by_clear(
    b: &RedisBackend,
    memory: &MemoryBackend,
    client: &str,
    limits: &Limits,
    t: u64,
    what: &str,
) {
    assert_invalid_state(b.check_limits(client, limits, 1, Some(t)).await, what);
    assert_invalid_state(b.config(client).await, what);
    assert_invalid_state(b.reset(client, limits, Some(t)).await, what);
    assert_invalid_state(b.refund(client, limits, 1, Some(t)).await, what);
    assert_invalid_state(b.set_tier(client, Some("pro")).await, what);
    assert_invalid_state(b.remove_override(client).await, what);
    let err = b
        .check_limits(client, limits, 1, Some(t))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("quota rm"), "{what}: {err}");
    let cleared = b.clear_config(client).await.unwrap();
    assert_eq!(
        cleared,
        memory.clear_config(client).await.unwrap(),
        "{what}"
    );
    assert_eq!(b.config(client).await.unwrap(), cleared, "{what}");
    let got = b.check_limits(client, limits, 1, Some(t)).await.unwrap();
    let want = memory
        .check_limits(client, limits, 1, Some(t))
        .into_inner()
        .unwrap();
    assert_eq!(got, want, "{what}: after the repair");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_unreadable_state_among_several_policies_is_invalid_state_and_writes_nothing() {
    // Issue 15's fast path decides several policies before it stores any: a state it cannot
    // read (garbage, another type, a number Lua's tonumber would take) at any one of them must
    // still be InvalidState, with no other policy's state written, through FCALL and EVALSHA;
    // after a reset the key decides as in memory.
    let server = RedisServer::start();
    let url = server.url();
    let memory = MemoryBackend::new();
    let t: u64 = 1_700_000_000_500;
    let pol = [
        p("token-bucket:limit=5,period=1s,name=a"),
        p("sliding-window:limit=5,period=1s,name=b"),
        p("fixed-window:limit=5,period=1s,name=c"),
        p("gcra:limit=5,period=1s,name=d"),
    ];
    let limits = Limits::new(pol.to_vec()).unwrap();
    let bad: [&[u8]; 5] = [
        b"banana",
        b"1.5.1000.5|1e3|0",
        b"6.5.1000.5| 5|0|0|0",
        b"4.5.1000.5|0x10|0|0",
        b"2.5.1000.5|-0|0|0",
    ];
    for mode in [ScriptMode::Auto, ScriptMode::Eval] {
        let on_redis = RedisBackend::builder(&url)
            .prefix(prefix(&format!("several-{mode:?}")))
            .timeout(Duration::from_secs(5))
            .script_mode(mode)
            .build()
            .unwrap();
        for (i, broken) in pol.iter().enumerate() {
            for (j, value) in bad.iter().enumerate() {
                let client = format!("{mode:?}-c{i}-{j}");
                let what = format!("{mode:?}: {} holds {:?}", broken.name(), value);
                // Every policy's state is in one string (format f4): the broken policy's
                // line holds the value, the others' lines what a check at t left.
                let key = on_redis.state_key(&client, broken);
                if j == 0 {
                    // another type at the key
                    raw(&url, redis::cmd("RPUSH").arg(&key).arg("x"))
                        .await
                        .unwrap();
                } else {
                    on_redis.check_at(&client, &pol, 1, t).await.unwrap();
                    memory.check_at(&client, &pol, 1, t).into_inner().unwrap();
                    let got = raw(&url, redis::cmd("GET").arg(&key)).await.unwrap();
                    let redis::Value::BulkString(text) = got else {
                        panic!("{what}: {got:?}")
                    };
                    let mut lines: Vec<Vec<u8>> =
                        text.split(|&b| b == b'\n').map(<[u8]>::to_vec).collect();
                    let suffix = format!("\t{}", broken.name());
                    let line = lines
                        .iter_mut()
                        .find(|l| l.ends_with(suffix.as_bytes()))
                        .unwrap();
                    *line = [*value, suffix.as_bytes()].concat();
                    set_raw(&url, &key, &lines.join(&b'\n')).await;
                }
                let dump = || async {
                    let mut c = redis::cmd("DUMP");
                    c.arg(&key);
                    raw(&url, &c).await.unwrap()
                };
                let before = dump().await;
                assert_invalid_state(on_redis.check_at(&client, &pol, 1, t).await, &what);
                assert_invalid_state(on_redis.check_at(&client, &pol, 0, t).await, &what);
                // Reported, never overwritten: no policy's state written.
                assert_eq!(dump().await, before, "{what}: the key was written");
                on_redis.reset(&client, &limits, Some(t)).await.unwrap();
                memory.reset(&client, &limits, Some(t)).await.unwrap();
                for cost in [1, 3, 2, 0] {
                    let got = on_redis.check_at(&client, &pol, cost, t).await.unwrap();
                    let want = memory
                        .check_at(&client, &pol, cost, t)
                        .into_inner()
                        .unwrap();
                    assert_eq!(got, want, "{what}: after the reset, cost {cost}");
                }
            }
        }
    }
}
