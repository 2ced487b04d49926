//! Issue 15, state format `f3` (now `f4`): every policy state of a client in one Redis string, whose
//! header tells the check script whether it may decide without reading the configuration.
//! These tests pin the invariants that make that safe, through `FCALL` and `EVALSHA` alike:
//! every change of the configuration (an override or a tier set or removed, a clear, the
//! version bump of a refund or a reset) is seen by the very next check of a key that already
//! has state, and each decision is the in-memory backend's.

use std::time::Duration;

use turnstile_core::{Applied, Backend, Limits, MemoryBackend, Policy, Quotas};
use turnstile_redis::{redis, RedisBackend, ScriptMode};
use turnstile_tests::redis_server::RedisServer;

fn p(spec: &str) -> Policy {
    spec.parse().unwrap()
}

fn backend(url: &str, test: &str, mode: ScriptMode) -> RedisBackend {
    RedisBackend::builder(url)
        .prefix(format!(
            "turnstile:test:{test}-{mode:?}:{}",
            std::process::id()
        ))
        .timeout(Duration::from_secs(5))
        .script_mode(mode)
        .build()
        .unwrap()
}

async fn get(url: &str, key: &str) -> redis::Value {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    redis::cmd("GET")
        .arg(key)
        .query_async(&mut conn)
        .await
        .unwrap()
}

/// The header of the state string at `key` ('0': written without configuration, 'c': with
/// one), or None when there is none.
async fn header(url: &str, key: &str) -> Option<u8> {
    match get(url, key).await {
        redis::Value::BulkString(b) => b.first().copied(),
        redis::Value::Nil => None,
        other => panic!("{key}: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_configuration_change_is_seen_by_the_very_next_check_of_a_key_with_state() {
    let server = RedisServer::start();
    let url = server.url();
    let t: u64 = 1_700_000_000_000;
    let defaults = [
        p("token-bucket:limit=10,period=1s,name=a"),
        p("fixed-window:limit=5,period=1m,name=b"),
    ];
    let over = [p("token-bucket:limit=3,period=1s,name=a")];
    let pro = [p("sliding-window:limit=7,period=1m,name=b")];
    let limits = Limits::new(defaults.to_vec())
        .unwrap()
        .with_tier("pro", pro.to_vec())
        .unwrap();
    for mode in [ScriptMode::Auto, ScriptMode::Eval] {
        let r = backend(&url, "cfg-seen", mode);
        let m = MemoryBackend::new();
        // Each step: a configuration change (or none), then checks at the same time on both
        // backends; every decision (applied, version, every field) must be equal.
        for step in 0..12u64 {
            let key = "k";
            let what = format!("{mode:?} step {step}");
            match step {
                0 | 1 => {}
                2 => {
                    r.set_override(key, &over).await.unwrap();
                    m.set_override(key, &over).await.unwrap();
                }
                3 => {
                    r.remove_override(key).await.unwrap();
                    m.remove_override(key).await.unwrap();
                }
                4 => {
                    r.set_tier(key, Some("pro")).await.unwrap();
                    m.set_tier(key, Some("pro")).await.unwrap();
                }
                5 => {
                    r.set_tier(key, None).await.unwrap();
                    m.set_tier(key, None).await.unwrap();
                }
                6 => {
                    r.clear_config(key).await.unwrap();
                    m.clear_config(key).await.unwrap();
                }
                7 | 9 => {
                    let a = r.refund(key, &limits, 1, Some(t)).await.unwrap();
                    let b = m.refund(key, &limits, 1, Some(t)).await.unwrap();
                    assert_eq!(a, b, "{what}: refund");
                }
                8 | 10 => {
                    let a = r.reset(key, &limits, Some(t)).await.unwrap();
                    let b = m.reset(key, &limits, Some(t)).await.unwrap();
                    assert_eq!(a, b, "{what}: reset");
                }
                _ => {}
            }
            for i in 0..3 {
                let a = r.check_limits(key, &limits, 1, Some(t)).await.unwrap();
                let b = m
                    .check_limits(key, &limits, 1, Some(t))
                    .into_inner()
                    .unwrap();
                assert_eq!(a, b, "{what}: check {i}");
            }
        }
        // On a fresh client the checks take the fast path and write the header '0'; an
        // override marks the string at once, before any check.
        let states = r.state_key("fresh");
        r.check_limits("fresh", &limits, 1, Some(t)).await.unwrap();
        assert_eq!(header(&url, &states).await, Some(b'0'), "{mode:?}");
        r.set_override("fresh", &over).await.unwrap();
        assert_eq!(header(&url, &states).await, Some(b'c'), "{mode:?}");
        let d = r.check_limits("fresh", &limits, 1, Some(t)).await.unwrap();
        assert!(matches!(d.applied(), Applied::Override), "{mode:?}");
        assert_eq!(d.version(), 1, "{mode:?}");
        // A refund's version bump marks it too, on a client that never had a configuration.
        let other = r.state_key("refunded");
        r.check_limits("refunded", &limits, 1, Some(t))
            .await
            .unwrap();
        assert_eq!(header(&url, &other).await, Some(b'0'), "{mode:?}");
        let d = r.refund("refunded", &limits, 1, Some(t)).await.unwrap();
        assert_eq!(d.version(), 1, "{mode:?}");
        let d = r
            .check_limits("refunded", &limits, 1, Some(t))
            .await
            .unwrap();
        assert_eq!(d.version(), 1, "{mode:?}: the next check sees the bump");
        assert_eq!(header(&url, &other).await, Some(b'c'), "{mode:?}");
    }
}

/// A policy that does not apply to this call (another rule's set) keeps its state in the string
/// while it is in use, with the TTL it needs, and is read again when it applies again: as in
/// memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_of_another_tier_keeps_its_state_in_the_string() {
    let server = RedisServer::start();
    let url = server.url();
    let t: u64 = 1_700_000_000_000;
    let defaults = [p("fixed-window:limit=5,period=1h,name=day")];
    // A tier changes only the policies it names: a policy of another set is one another
    // rule checks on the same key.
    let other = Limits::new([p("token-bucket:limit=10,period=1s,name=burst")]).unwrap();
    let limits = Limits::new(defaults.to_vec()).unwrap();
    for mode in [ScriptMode::Auto, ScriptMode::Eval] {
        let r = backend(&url, "other-tier", mode);
        let m = MemoryBackend::new();
        let same = |a: turnstile_core::Decision, b: turnstile_core::Decision, what: &str| {
            assert_eq!(a, b, "{mode:?}: {what}");
        };
        for round in 0..3 {
            for cost in [2, 1] {
                let a = r.check_limits("c", &limits, cost, Some(t)).await.unwrap();
                let b = m
                    .check_limits("c", &limits, cost, Some(t))
                    .into_inner()
                    .unwrap();
                same(a, b, &format!("round {round}, defaults, cost {cost}"));
            }
            r.set_tier("c", Some("pro")).await.unwrap();
            m.set_tier("c", Some("pro")).await.unwrap();
            let a = r.check_limits("c", &other, 4, Some(t)).await.unwrap();
            let b = m
                .check_limits("c", &other, 4, Some(t))
                .into_inner()
                .unwrap();
            same(a, b, &format!("round {round}, the other set"));
            r.set_tier("c", None).await.unwrap();
            m.set_tier("c", None).await.unwrap();
        }
        // Both states are in the one string, the hour's window the longest TTL.
        let states = r.state_key("c");
        let redis::Value::BulkString(text) = get(&url, &states).await else {
            panic!("{mode:?}: no state string")
        };
        let text = String::from_utf8(text).unwrap();
        assert!(
            text.starts_with("c\n") && text.contains("\tday") && text.contains("\tburst"),
            "{mode:?}: {text:?}"
        );
    }
}
