//! `turnstile quota` against a `redis-server` this test starts (or `REDIS_URL`).

use std::process::{Command, Output};

use serde_json::Value;
use turnstile_tests::redis_server::TestRedis;

fn quota(redis: &TestRedis, prefix: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_turnstile"))
        .args(["quota", "--redis-url", redis.url(), "--prefix", prefix])
        .args(args)
        .output()
        .expect("the turnstile binary runs")
}

fn json(o: &Output) -> Value {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("one JSON object")
}

#[test]
fn set_peek_refund_reset_get_rm() {
    let redis = TestRedis::get();
    let prefix = format!("turnstile:cli-quota:{}", std::process::id());
    let defaults = ["--policy", "fixed-window:limit=3,period=1h,name=api"];

    // A key without configuration needs the service's policies.
    let o = quota(&redis, &prefix, &["peek", "alice"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--policy"));
    let v = json(&quota(
        &redis,
        &prefix,
        &[&["peek", "alice"][..], &defaults].concat(),
    ));
    assert_eq!(
        (v["applied"].as_str(), v["remaining"].as_u64()),
        (Some("defaults"), Some(3))
    );

    let v = json(&quota(
        &redis,
        &prefix,
        &[
            "set",
            "alice",
            "--policy",
            "fixed-window:limit=10,period=1h,name=api",
        ],
    ));
    assert_eq!(v["override"][0], "fixed-window:limit=10,period=1h,name=api");
    assert_eq!(v["version"], 1);
    // With an override, no other policy is needed.
    let v = json(&quota(&redis, &prefix, &["peek", "alice"]));
    assert_eq!(
        (v["applied"].as_str(), v["remaining"].as_u64()),
        (Some("override"), Some(10))
    );

    let v = json(&quota(&redis, &prefix, &["refund", "alice", "--cost", "2"]));
    assert_eq!(
        (v["remaining"].as_u64(), v["version"].as_u64()),
        (Some(10), Some(2))
    );
    let v = json(&quota(&redis, &prefix, &["reset", "alice"]));
    assert_eq!(v["version"], 3);

    let v = json(&quota(&redis, &prefix, &["set", "bob", "--tier", "pro"]));
    assert_eq!(v["tier"], "pro");
    let v = json(&quota(
        &redis,
        &prefix,
        &[
            "peek",
            "bob",
            "--tier-policy",
            "pro=gcra:limit=50,period=1m,name=api",
        ],
    ));
    assert_eq!(
        (v["applied"].as_str(), v["tier"].as_str()),
        (Some("tier"), Some("pro"))
    );
    assert_eq!(v["policies"][0]["remaining"], 50);

    let v = json(&quota(&redis, &prefix, &["rm", "alice"]));
    assert_eq!((v["override"].is_null(), v["tier"].is_null()), (true, true));
    assert_eq!(v["version"], 4, "one change, one version");
    let v = json(&quota(&redis, &prefix, &["get", "bob"]));
    assert_eq!(v["tier"], "pro");

    // Bad input: a clear message and a non-zero exit, never a panic.
    for bad in [
        &["set", "x", "--tier", "no spaces"][..],
        &["set", "x"][..],
        &["set", "x", "--policy", "gcra:limit=0,period=1s"][..],
        &["refund", "x", "--cost", "-1"][..],
    ] {
        let o = quota(&redis, &prefix, bad);
        assert!(!o.status.success(), "{bad:?}");
        assert!(
            !String::from_utf8_lossy(&o.stderr).contains("panicked"),
            "{bad:?}"
        );
    }
}

/// Regression: against an unreachable Redis, `turnstile quota` said only "connection
/// refused"; it names the URL it tried and the flag that changes it.
#[test]
fn an_unreachable_redis_is_named_with_the_flag_to_change_it() {
    // A port nothing listens on: bound, then released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("redis://127.0.0.1:{port}");
    let o = Command::new(env!("CARGO_BIN_EXE_turnstile"))
        .args(["quota", "--redis-url", &url, "get", "alice"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(o.stdout.is_empty());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!("cannot reach Redis at {url}")),
        "{err}"
    );
    assert!(err.contains("--redis-url URL"), "{err}");
}
