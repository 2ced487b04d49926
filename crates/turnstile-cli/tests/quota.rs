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

/// Runs one Redis command (any bytes in its arguments) against `redis`.
fn redis_cmd(redis: &TestRedis, args: &[&str]) {
    let client = turnstile_redis::redis::Client::open(redis.url()).expect("a Redis URL");
    let mut conn = client.get_connection().expect("Redis answers");
    let mut cmd = turnstile_redis::redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query::<turnstile_redis::redis::Value>(&mut conn)
        .expect("the command runs");
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn quota_reset_repairs_a_state_key_holding_garbage() {
    // Issue 13: garbage in a state key made `turnstile quota reset` fail with "stored
    // rate-limit state is invalid", so the client stayed refused until someone deleted the
    // key by hand. Values Lua's tonumber reads as numbers are garbage too.
    let redis = TestRedis::get();
    let prefix = format!("turnstile:cli-repair:{}", std::process::id());
    let policy = ["--policy", "token-bucket:limit=5,period=1m,name=api"];
    let run = |args: &[&str]| {
        let args = [&["--plain-keys"][..], args, &policy].concat();
        quota(&redis, &prefix, &args)
    };
    // Plain keys: the service's state string for "alice" (format f4: a header, then a line
    // "<state>\t<policy name>" per policy), here with the policy "api"'s state garbage, or
    // no state string at all.
    let state_key = format!("{prefix}:{{k:alice}}:f4");
    for garbage in [
        "banana",
        "1.5.60000.5|0x10|0",
        "1.5.60000.5| 1|0",
        "1.5.60000.5|1e3|0",
        "1.5.60000.5|1|-0",
        "1.5.60000.5|inf|0",
        "1.5.60000.5|1|1.0",
        "1.5.60000.5|1|300001",
    ] {
        for value in [garbage.to_owned(), format!("0\n{garbage}\tapi")] {
            let garbage = value.as_str();
            redis_cmd(&redis, &["SET", &state_key, garbage]);
            for op in ["peek", "refund"] {
                let args: &[&str] = if op == "refund" {
                    &["refund", "alice", "--cost", "1"]
                } else {
                    &["peek", "alice"]
                };
                let o = run(args);
                assert_eq!(o.status.code(), Some(1), "{garbage}: {op}");
                let err = stderr(&o);
                assert!(
                    err.contains("stored rate-limit state is invalid")
                        && err.contains("turnstile quota reset"),
                    "{garbage}: {op}: {err}"
                );
            }
            let v = json(&run(&["reset", "alice"]));
            assert_eq!(
                (v["remaining"].as_u64(), v["reset_after_ms"].as_u64()),
                (Some(5), Some(0)),
                "{garbage}: {v}"
            );
            let v = json(&run(&["peek", "alice"]));
            assert_eq!(v["remaining"], 5, "{garbage}: a fresh key's");
        }
    }
    // A key of another type is repaired the same way.
    redis_cmd(&redis, &["DEL", &state_key]);
    redis_cmd(&redis, &["RPUSH", &state_key, "x"]);
    assert_eq!(run(&["peek", "alice"]).status.code(), Some(1));
    assert_eq!(json(&run(&["reset", "alice"]))["remaining"], 5);
}

#[test]
fn quota_rm_repairs_a_garbage_configuration() {
    // Issue 13: `turnstile quota rm` forgets whatever the configuration holds. Until then
    // get, peek and reset say what is wrong and that `quota rm` removes it.
    let redis = TestRedis::get();
    let prefix = format!("turnstile:cli-rm:{}", std::process::id());
    let policy = ["--policy", "token-bucket:limit=5,period=1m,name=api"];
    let run = |args: &[&str]| quota(&redis, &prefix, &[&["--plain-keys"][..], args].concat());
    for (i, garbage) in [
        &["HSET", "o", "1 0 1000 5 t"][..],
        &["HSET", "o", "+1 5 1000 5 t"][..],
        &["HSET", "v", "0x10"][..],
        &["HSET", "t", "no spaces"][..],
        &["SET", "x"][..],
    ]
    .iter()
    .enumerate()
    {
        let client = format!("bob{i}");
        let cfg = format!("{prefix}:{{k:{client}}}~cfg");
        redis_cmd(&redis, &[&[garbage[0], &cfg][..], &garbage[1..]].concat());
        for args in [
            vec!["get", &client],
            [&["peek", &client][..], &policy].concat(),
            [&["reset", &client][..], &policy].concat(),
        ] {
            let o = run(&args);
            assert_eq!(o.status.code(), Some(1), "{garbage:?}: {args:?}");
            let err = stderr(&o);
            assert!(
                err.contains("invalid configuration") && err.contains("turnstile quota rm"),
                "{garbage:?}: {args:?}: {err}"
            );
        }
        let v = json(&run(&["rm", &client]));
        assert_eq!(
            (
                v["override"].is_null(),
                v["tier"].is_null(),
                v["version"].as_u64()
            ),
            (true, true, Some(1)),
            "{garbage:?}: {v}"
        );
        let v = json(&run(&["get", &client]));
        assert_eq!(v["version"], 1, "{garbage:?}");
        let v = json(&run(&[&["peek", &client][..], &policy].concat()));
        assert_eq!(
            (v["applied"].as_str(), v["remaining"].as_u64()),
            (Some("defaults"), Some(5)),
            "{garbage:?}"
        );
    }
}

#[test]
fn quota_over_tls_with_a_ca_and_a_client_certificate() {
    use turnstile_tests::redis_server::RedisServer;
    use turnstile_tests::tls::TestPki;

    let pki = TestPki::generate();
    let args = pki.server_args(true);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = RedisServer::start_tls(&args);
    let url = server.url();
    let ca = pki.path("ca.pem").display().to_string();
    let cert = pki.path("client.pem").display().to_string();
    let key = pki.path("client.key").display().to_string();
    let run = |tls: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_turnstile"))
            .args([
                "quota",
                "--redis-url",
                &url,
                "--prefix",
                "turnstile:cli-tls",
            ])
            .args(tls)
            .args([
                "peek",
                "alice",
                "--policy",
                "fixed-window:limit=3,period=1h",
            ])
            .output()
            .expect("the turnstile binary runs")
    };
    let stderr = |o: &Output| String::from_utf8_lossy(&o.stderr).into_owned();

    // The CA and the client certificate: the quota, as on a plain Redis.
    let v = json(&run(&[
        "--tls-ca",
        &ca,
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
    ]));
    assert_eq!(
        (v["applied"].as_str(), v["remaining"].as_u64()),
        (Some("defaults"), Some(3))
    );
    // Without the client certificate the server refuses the connection.
    // Each certificate failure says it is one, not that Redis is down (no "start one").
    let a_tls_failure = |o: &Output, reason: &str| {
        let e = stderr(o);
        assert_eq!(o.status.code(), Some(1), "{e}");
        assert!(
            e.contains("TLS handshake with Redis at") && e.contains(reason),
            "{e}"
        );
        assert!(e.contains("--tls-ca") && e.contains("--tls-cert"), "{e}");
        assert!(
            !e.contains("daemonize") && !e.contains("cannot reach"),
            "{e}"
        );
    };
    a_tls_failure(&run(&["--tls-ca", &ca]), "CertificateRequired");
    // Without the CA the server is not trusted (the system store does not hold it).
    a_tls_failure(
        &run(&["--tls-cert", &cert, "--tls-key", &key]),
        "UnknownIssuer",
    );
    // A key without its certificate is a usage error (exit 2), before anything runs.
    let o = run(&["--tls-ca", &ca, "--tls-key", &key]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--tls-cert"), "{}", stderr(&o));
    // A file that is not a CA certificate: a configuration error naming the file.
    let o = run(&["--tls-ca", &key, "--tls-cert", &cert, "--tls-key", &key]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("invalid Redis TLS settings")
            && stderr(&o).contains("holds no certificate")
            && stderr(&o).contains(&key),
        "{}",
        stderr(&o)
    );
    assert!(!stderr(&o).contains("panicked"));
}

/// Issue 24, trap 2: `--config` takes the services' `[backend]` URL and prefix (and their
/// rules and tiers); a write under a prefix where no other client's key exists is warned
/// about. Trap 1: a tier reaches the rules whose policies it names, and `peek` answers per
/// rule (the login guard keeps its own parameters).
#[test]
fn a_configuration_file_gives_the_services_redis_prefix_rules_and_tiers() {
    let redis = TestRedis::get();
    let prefix = format!("turnstile:cli-config:{}", std::process::id());
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/turnstile.toml");
    let text = std::fs::read_to_string(example)
        .unwrap()
        .replace(
            "url = \"redis://127.0.0.1:6379\"",
            &format!("url = \"{}\"", redis.url()),
        )
        .replace(
            "prefix = \"turnstile:v1\"",
            &format!("prefix = \"{prefix}\""),
        );
    let dir = std::env::temp_dir().join(format!("turnstile-quota-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("turnstile.toml");
    std::fs::write(&file, text).unwrap();
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_turnstile"))
            .args(["quota", "--config", file.to_str().unwrap()])
            .args(args)
            .output()
            .expect("the turnstile binary runs")
    };

    // The first write under the file's prefix, where no service has written yet: warned.
    let o = run(&["set", "127.0.0.1", "--tier", "pro"]);
    let v = json(&o);
    assert!(
        stderr(&o).contains("no key of any other client exists under prefix"),
        "{}",
        stderr(&o)
    );
    assert_eq!(v["reaches"]["per-ip"], serde_json::json!(["otherwise"]));
    assert_eq!(v["reaches"]["api-per-ip"].as_array().map(Vec::len), Some(1));
    // It landed under the file's prefix.
    let v = json(&quota(&redis, &prefix, &["get", "127.0.0.1"]));
    assert_eq!(v["tier"], "pro");

    // Per rule: the tier lifts per-ip, and the login guard keeps its own parameters.
    let v = json(&run(&["peek", "127.0.0.1"]));
    let rules = v["rules"].as_array().unwrap();
    let rule = |label: &str| rules.iter().find(|r| r["rule"] == label).unwrap();
    let login = &rule("login")["policies"][0];
    assert_eq!(
        (login["name"].as_str(), login["from"].as_str()),
        (Some("login-per-ip"), Some("defaults"))
    );
    assert_eq!(rule("login")["remaining"], 5);
    let general = &rule("otherwise")["policies"][0];
    assert_eq!(general["from"], "tier pro");
    assert_eq!(
        general["policy"],
        "token-bucket:limit=1000,period=1m,name=per-ip"
    );

    // An override naming a policy no rule has: warned; other clients' keys exist now.
    let o = run(&[
        "set",
        "10.1.1.1",
        "--policy",
        "gcra:limit=1,period=1s,name=nope",
    ]);
    let v = json(&o);
    assert!(
        stderr(&o).contains("no rule of the configuration has a policy named \"nope\""),
        "{}",
        stderr(&o)
    );
    assert!(!stderr(&o).contains("no key of any other client"));
    assert_eq!(v["reaches"]["nope"], serde_json::json!([]));
    std::fs::remove_dir_all(&dir).ok();
}

/// Issue 25, fault 4: an override over the cap is refused by `quota set`.
#[test]
fn an_override_over_the_policy_cap_is_refused() {
    let redis = TestRedis::get();
    let prefix = format!("turnstile:cli-cap:{}", std::process::id());
    let specs: Vec<String> = (0..1000)
        .map(|i| format!("fixed-window:limit=5,period=1m,name=p{i}"))
        .collect();
    let mut args = vec!["set", "k"];
    for s in &specs {
        args.extend(["--policy", s.as_str()]);
    }
    let o = quota(&redis, &prefix, &args);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("more than the 512"), "{}", stderr(&o));
}

/// `--config` takes the services' key cap too (`[backend] max_key_bytes`): a key the
/// services take, longer than the default 512 bytes, is reached; without the setting it is
/// refused as too long.
#[test]
fn a_configuration_files_key_cap_is_the_commands() {
    let redis = TestRedis::get();
    let prefix = format!("turnstile:cli-keycap:{}", std::process::id());
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/turnstile.toml");
    let base = std::fs::read_to_string(example)
        .unwrap()
        .replace(
            "url = \"redis://127.0.0.1:6379\"",
            &format!("url = \"{}\"", redis.url()),
        )
        .replace(
            "prefix = \"turnstile:v1\"",
            &format!("prefix = \"{prefix}\""),
        );
    let capped = base.replace(
        &format!("prefix = \"{prefix}\""),
        &format!("prefix = \"{prefix}\"\nmax_key_bytes = 1024"),
    );
    assert_ne!(base, capped);
    let dir = std::env::temp_dir().join(format!("turnstile-quota-keycap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let long = "k".repeat(700);
    let run = |name: &str, text: &str| {
        let file = dir.join(name);
        std::fs::write(&file, text).unwrap();
        Command::new(env!("CARGO_BIN_EXE_turnstile"))
            .args(["quota", "--config", file.to_str().unwrap(), "get", &long])
            .output()
            .expect("the turnstile binary runs")
    };
    let o = run("capped.toml", &capped);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run("default.toml", &base);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("512"), "{}", stderr(&o));
}
