//! Issue 25, fault 4: a huge policy set. At most `MAX_POLICIES` policies per check,
//! refused everywhere a set is made (build, configuration files, `set_override`, and the
//! check script itself, for a set sent by hand: a typed error, never a blocked Redis); a
//! large set within the cap decides as the in-memory backend does, in time linear in its
//! size.

use turnstile_core::{Backend, BackendError, Limits, MemoryBackend, Policy, Quotas, MAX_POLICIES};
use turnstile_redis::{redis, RedisBackend, ScriptMode, CHECK_SCRIPT};
use turnstile_tests::redis_server::RedisServer;

/// `n` fixed-window policies, `limit` per minute each, named p0, p1, …
fn many(n: usize, limit: u64) -> Vec<Policy> {
    (0..n)
        .map(|i| {
            format!("fixed-window:limit={limit},period=1m,name=p{i}")
                .parse()
                .unwrap()
        })
        .collect()
}

fn backend(url: &str, test: &str, mode: ScriptMode) -> RedisBackend {
    RedisBackend::builder(url)
        .prefix(format!(
            "turnstile:test:{test}-{mode:?}:{}",
            std::process::id()
        ))
        .script_mode(mode)
        .build()
        .unwrap()
}

/// A policy set's argument as the check script takes it (see `lua/check.lua`'s header):
/// `n` fixed windows of `limit` per minute.
fn set_argument(n: usize, limit: u64) -> String {
    (0..n)
        .map(|i| format!("\n4.{limit}.60000.{limit} p{i}"))
        .collect()
}

async fn connection(url: &str) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(url).unwrap();
    client.get_multiplexed_async_connection().await.unwrap()
}

/// Loads the check script for `EVALSHA`: its SHA.
async fn load(conn: &mut redis::aio::MultiplexedConnection) -> String {
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(CHECK_SCRIPT)
        .query_async(conn)
        .await
        .unwrap()
}

/// One check of `n` policies sent by hand with `EVALSHA` (no cap on the Rust side).
async fn evalsha(
    conn: &mut redis::aio::MultiplexedConnection,
    sha: &str,
    key: &str,
    set: &str,
) -> redis::RedisResult<redis::Value> {
    redis::cmd("EVALSHA")
        .arg(sha)
        .arg(1)
        .arg(key)
        .arg("check defaults 0 1")
        .arg(set)
        .query_async(conn)
        .await
}

#[tokio::test(flavor = "current_thread")]
async fn a_large_set_within_the_cap_decides_as_in_memory() {
    let server = RedisServer::start();
    let n = 300;
    assert!(n <= MAX_POLICIES);
    let policies = many(n, 3);
    // The last policy is the strictest: it binds.
    let mut policies = policies;
    policies[n - 1] = "fixed-window:limit=2,period=1m,name=strict"
        .parse()
        .unwrap();
    let limits = Limits::new(policies.clone()).unwrap();
    let memory = MemoryBackend::new();
    let t0 = 1_700_000_040_000;
    for mode in [ScriptMode::Auto, ScriptMode::Eval] {
        let redis = backend(&server.url(), "large", mode);
        for (i, cost) in [1, 1, 1, 0].into_iter().enumerate() {
            let key = format!("client-{mode:?}");
            let now = Some(t0 + i as u64);
            let r = redis.check_limits(&key, &limits, cost, now).await.unwrap();
            let m = memory.check_limits(&key, &limits, cost, now).await.unwrap();
            assert_eq!(r, m, "check {i} ({mode:?})");
            assert_eq!(r.policies().len(), n);
            assert_eq!(r.allowed(), i != 2, "check {i} ({mode:?})");
        }
        // An override of one policy among 300: the others stay in force.
        let key = format!("vip-{mode:?}");
        let lifted: Policy = "fixed-window:limit=9,period=1m,name=strict"
            .parse()
            .unwrap();
        redis
            .set_override(&key, std::slice::from_ref(&lifted))
            .await
            .unwrap();
        memory
            .set_override(&key, std::slice::from_ref(&lifted))
            .await
            .unwrap();
        for i in 0..4u64 {
            let now = Some(t0 + i);
            let r = redis.check_limits(&key, &limits, 1, now).await.unwrap();
            let m = memory.check_limits(&key, &limits, 1, now).await.unwrap();
            assert_eq!(r, m, "override check {i} ({mode:?})");
            assert_eq!(r.allowed(), i < 3, "the 3-per-minute policies still bind");
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_set_over_the_cap_is_refused_with_a_typed_error() {
    let server = RedisServer::start();
    let redis = backend(&server.url(), "over", ScriptMode::Auto);
    let over = many(1000, 5);
    // A check (through the Backend trait, which takes any list) and an override.
    let err = redis.check("k", &over, 1).await.unwrap_err();
    assert!(matches!(err, BackendError::InvalidRequest(_)), "{err:?}");
    let err = redis.set_override("k", &over).await.unwrap_err();
    assert!(matches!(err, BackendError::InvalidRequest(_)), "{err:?}");
    let err = MemoryBackend::new()
        .set_override("k", &over)
        .await
        .unwrap_err();
    assert!(matches!(err, BackendError::InvalidRequest(_)), "{err:?}");
    assert!(Limits::new(over).is_err());

    // The script's cap is the crate's.
    assert!(CHECK_SCRIPT.contains(&format!("local MAX_POLICIES = {MAX_POLICIES}\n")));
    // The script itself refuses a set over the cap sent by hand, and Redis keeps answering.
    let mut conn = connection(&server.url()).await;
    let sha = load(&mut conn).await;
    let err = evalsha(
        &mut conn,
        &sha,
        "turnstile:hand:{k}:f4",
        &set_argument(1000, 5),
    )
    .await
    .unwrap_err();
    assert!(
        err.to_string().contains("TURNSTILE_TOO_MANY_POLICIES"),
        "{err}"
    );
    let pong: String = redis::cmd("PING").query_async(&mut conn).await.unwrap();
    assert_eq!(pong, "PONG");
    let ok = evalsha(
        &mut conn,
        &sha,
        "turnstile:hand:{k}:f4",
        &set_argument(MAX_POLICIES, 5),
    )
    .await;
    assert!(ok.is_ok(), "{ok:?}");
}
