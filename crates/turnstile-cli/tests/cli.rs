//! End-to-end tests of the `turnstile` binary: vectors, malformed traces, line endings,
//! `--summary` and usage errors.

mod common;

use common::{repository_vectors, run, stderr, stdout, usage_error, workspace_root};

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

const TB: &[&str] = &[
    "simulate",
    "--algorithm",
    "token-bucket",
    "--limit",
    "2",
    "--period",
    "1s",
];

/// The expected output line of a vector's expected object, in the exact field order and
/// spelling of `SEMANTICS.md`.
fn expected_line(e: &Map<String, Value>) -> String {
    let f = |k: &str| e.get(k).unwrap_or_else(|| panic!("expected field {k}"));
    format!(
        r#"{{"t_ms":{},"key":{},"cost":{},"allowed":{},"remaining":{},"retry_after_ms":{},"reset_after_ms":{},"delay_ms":{}}}"#,
        f("t_ms"),
        f("key"),
        f("cost"),
        f("allowed"),
        f("remaining"),
        f("retry_after_ms"),
        f("reset_after_ms"),
        f("delay_ms"),
    )
}

/// The command-line arguments for a vector's policy or policies.
fn policy_args(v: &Map<String, Value>) -> Vec<String> {
    let mut args = vec!["simulate".to_owned()];
    let spec = |p: &Value| {
        let mut s = format!(
            "{}:limit={},period={}ms",
            p["algorithm"].as_str().expect("algorithm"),
            p["limit"],
            p["period_ms"]
        );
        if let Some(b) = p.get("burst").filter(|b| !b.is_null()) {
            s.push_str(&format!(",burst={b}"));
        }
        if let Some(n) = p.get("name").and_then(Value::as_str) {
            s.push_str(&format!(",name={n}"));
        }
        s
    };
    match (v.get("policy"), v.get("policies")) {
        (Some(p), _) => {
            args.extend([
                "--algorithm".into(),
                p["algorithm"].as_str().unwrap().into(),
            ]);
            args.extend(["--limit".into(), p["limit"].to_string()]);
            args.extend(["--period".into(), format!("{}ms", p["period_ms"])]);
            if let Some(b) = p.get("burst").filter(|b| !b.is_null()) {
                args.extend(["--burst".into(), b.to_string()]);
            }
        }
        (None, Some(Value::Array(ps))) => {
            for p in ps {
                args.extend(["--policy".into(), spec(p)]);
            }
        }
        _ => panic!("a vector without policies"),
    }
    args
}

/// Runs one vector file through the binary; the output must equal the expected lines
/// byte for byte.
fn check_vector(path: &Path) {
    check_vector_with(path, &[]);
}

/// As [`check_vector`], with extra arguments (e.g. another backend).
fn check_vector_with(path: &Path, extra: &[&str]) {
    let v: Map<String, Value> =
        serde_json::from_str(&fs::read_to_string(path).expect("readable vector")).expect("JSON");
    let mut trace = String::new();
    for r in v["requests"].as_array().expect("requests") {
        trace.push_str(&r.to_string());
        trace.push('\n');
    }
    let args = policy_args(&v);
    let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
    args.extend_from_slice(extra);
    let out = run(&args, trace.as_bytes());
    assert!(out.status.success(), "{}: {}", path.display(), stderr(&out));
    let want: Vec<String> = v["expected"]
        .as_array()
        .expect("expected")
        .iter()
        .map(|e| expected_line(e.as_object().expect("an object")))
        .collect();
    let got: Vec<&str> = stdout(&out).lines().collect();
    assert_eq!(got.len(), want.len(), "{}", path.display());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "{} line {}", path.display(), i + 1);
    }
}

#[test]
fn every_repository_vector_end_to_end() {
    let vectors = repository_vectors();
    for f in &vectors {
        check_vector(f);
    }
    assert!(vectors.len() >= 34, "only {} vectors", vectors.len());
}

/// Every vector through `--backend redis` on a `redis-server` this test starts (or
/// `REDIS_URL`): the same bytes as the expected output, and no key left behind.
#[test]
fn every_repository_vector_on_redis() {
    let redis = turnstile_tests::redis_server::TestRedis::get();
    let vectors = repository_vectors();
    for f in &vectors {
        check_vector_with(f, &["--backend", "redis", "--redis-url", redis.url()]);
    }
    assert!(vectors.len() >= 34, "only {} vectors", vectors.len());
}

#[test]
fn unreachable_redis_is_a_clear_error() {
    let out = run(
        &[
            "simulate",
            "--algorithm",
            "gcra",
            "--limit",
            "1",
            "--period",
            "1s",
            "--backend",
            "redis",
            "--redis-url",
            "redis://127.0.0.1:1",
        ],
        b"{\"t_ms\": 0}\n",
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("backend failed on trace line 1"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn output_format_is_exact() {
    let out = run(
        TB,
        b"{\"t_ms\":0,\"key\":\"a\\\"b\"}\n{\"t_ms\":0,\"key\":\"a\\\"b\",\"cost\":2}\n{\"t_ms\":250,\"key\":\"a\\\"b\",\"cost\":3}\n",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        concat!(
            r#"{"t_ms":0,"key":"a\"b","cost":1,"allowed":true,"remaining":1,"retry_after_ms":0,"reset_after_ms":500,"delay_ms":0}"#,
            "\n",
            r#"{"t_ms":0,"key":"a\"b","cost":2,"allowed":false,"remaining":1,"retry_after_ms":500,"reset_after_ms":500,"delay_ms":0}"#,
            "\n",
            r#"{"t_ms":250,"key":"a\"b","cost":3,"allowed":false,"remaining":1,"retry_after_ms":null,"reset_after_ms":250,"delay_ms":0}"#,
            "\n",
        )
    );
}

#[test]
fn crlf_and_missing_final_newline_give_the_same_output() {
    let lf = run(
        TB,
        b"{\"t_ms\":0}\n{\"t_ms\":1,\"key\":\"k\"}\n{\"t_ms\":2}\n",
    );
    assert!(lf.status.success());
    assert_eq!(stdout(&lf).lines().count(), 3);
    for input in [
        &b"{\"t_ms\":0}\r\n{\"t_ms\":1,\"key\":\"k\"}\r\n{\"t_ms\":2}\r\n"[..],
        b"{\"t_ms\":0}\r\n{\"t_ms\":1,\"key\":\"k\"}\n{\"t_ms\":2}",
        b"{\"t_ms\":0}\n{\"t_ms\":1,\"key\":\"k\"}\n{\"t_ms\":2}",
        b"{\"t_ms\":0}\r\n{\"t_ms\":1,\"key\":\"k\"}\r\n{\"t_ms\":2}",
    ] {
        let out = run(TB, input);
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(stdout(&out), stdout(&lf), "{input:?}");
    }
}

#[test]
fn empty_input_is_an_empty_trace() {
    let out = run(TB, b"");
    assert!(out.status.success());
    assert_eq!(stdout(&out), "");
}

#[test]
fn malformed_lines_stop_the_run_keeping_earlier_decisions() {
    let good = "{\"t_ms\":10,\"key\":\"a\"}\n{\"t_ms\":20,\"key\":\"b\",\"cost\":0}\n";
    for (bad, needle) in [
        ("", "empty line"),
        ("\r", "empty line"),
        (r#"{"t_ms":1500.0}"#, "integer literal"),
        (r#"{"t_ms":1e3}"#, "integer literal"),
        (r#"{"t_ms":true}"#, "boolean"),
        (r#"{"t_ms":-1}"#, "negative"),
        (r#"{"t_ms":9007199254740992}"#, "9007199254740991"),
        (r#"{"t_ms":30,"cost":9007199254740992}"#, "9007199254740991"),
        (r#"{"t_ms":30,"cost":1.0}"#, "cost"),
        (r#"{"t_ms":30,"user":"a"}"#, "unknown field `user`"),
        (r#"{"t_ms":30,"t_ms":31}"#, "duplicate field `t_ms`"),
        (r#"{"t_ms":30,"key":7}"#, "key"),
        (r#"{"key":"a"}"#, "missing field `t_ms`"),
        (r#"[30,"a",1]"#, "JSON object"),
        (r#""t_ms""#, "JSON object"),
        (r#"{"t_ms":19}"#, "earlier"),
        (r#"{"t_ms":30}x"#, "trailing"),
        ("{\"t_ms\":30,\"key\":\"\u{0}\"}", "control character"),
    ] {
        let input = format!("{good}{bad}\n{{\"t_ms\":40}}\n");
        let out = run(TB, input.as_bytes());
        assert_eq!(out.status.code(), Some(1), "{bad:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains("line 3"), "{bad:?}: {err}");
        assert!(err.contains(needle), "{bad:?}: {err} lacks {needle:?}");
        assert!(!err.contains("panicked"), "{err}");
        let lines: Vec<&str> = stdout(&out).lines().collect();
        assert_eq!(lines.len(), 2, "{bad:?}: {}", stdout(&out));
        assert!(lines[0].starts_with(r#"{"t_ms":10,"key":"a","cost":1,"allowed":true"#));
        assert!(lines[1].starts_with(r#"{"t_ms":20,"key":"b","cost":0,"allowed":true"#));
    }
    // Not UTF-8.
    let out = run(TB, b"{\"t_ms\":1}\n{\"t_ms\":2,\"key\":\"\xff\"}\n");
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("line 2"), "{}", stderr(&out));
    assert_eq!(stdout(&out).lines().count(), 1);
}

#[test]
fn input_file_and_its_errors() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let path = dir.join("turnstile-cli-input.jsonl");
    fs::write(&path, "{\"t_ms\":0}\n{\"t_ms\":0}\n{\"t_ms\":0}\n").expect("writable tmp");
    let mut args = TB.to_vec();
    let p = path.to_str().expect("UTF-8 path");
    args.extend(["--input", p]);
    let out = run(&args, b"{\"t_ms\":0}\n");
    assert!(out.status.success(), "{}", stderr(&out));
    let allowed: Vec<bool> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["allowed"] == true)
        .collect();
    assert_eq!(allowed, [true, true, false]);

    let missing = dir.join("turnstile-cli-no-such-file.jsonl");
    let mut args = TB.to_vec();
    args.extend(["--input", missing.to_str().unwrap()]);
    let out = run(&args, b"");
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("cannot open"), "{}", stderr(&out));
}

#[test]
fn summary_table() {
    let trace = concat!(
        "{\"t_ms\":0,\"key\":\"bob\"}\n",
        "{\"t_ms\":0,\"key\":\"alice\"}\n",
        "{\"t_ms\":0,\"key\":\"alice\"}\n",
        "{\"t_ms\":0,\"key\":\"alice\"}\n",
        "{\"t_ms\":100,\"key\":\"alice\",\"cost\":5}\n",
        "{\"t_ms\":200,\"key\":\"alice\"}\n",
        "{\"t_ms\":300}\n",
    );
    let mut args = TB.to_vec();
    args.push("--summary");
    let out = run(&args, trace.as_bytes());
    assert!(out.status.success(), "{}", stderr(&out));
    // alice: admitted at 0, 0; denied at 0 (retry 500), 100 (never), 200 (retry 300).
    let want = "\
key    requests  admitted  denied  denied %  longest retry ms  never
\"\"            1         1       0      0.0%                 -      0
alice         5         2       3     60.0%               500      1
bob           1         1       0      0.0%                 -      0
-----  --------  --------  ------  --------  ----------------  -----
TOTAL         7         4       3     42.9%               500      1
";
    assert_eq!(stdout(&out), want);

    // A malformed line: no table, the problem on stderr.
    let out = run(&args, b"{\"t_ms\":0}\n{\"t_ms\":x}\n");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stdout(&out), "");
    assert!(stderr(&out).contains("line 2"));
}

#[test]
fn usage_errors_exit_2_without_panicking() {
    for args in [
        &["simulate"][..],
        &["simulate", "--algorithm", "token-bucket", "--limit", "1"],
        &[
            "simulate",
            "--algorithm",
            "token-bucket",
            "--limit",
            "0",
            "--period",
            "1s",
        ],
        &[
            "simulate",
            "--algorithm",
            "fixed-window",
            "--limit",
            "1",
            "--period",
            "1s",
            "--burst",
            "2",
        ],
        &[
            "simulate",
            "--algorithm",
            "gcra",
            "--limit",
            "1",
            "--period",
            "1.5s",
        ],
        &[
            "simulate",
            "--algorithm",
            "gcra",
            "--limit",
            "1",
            "--period",
            "1500",
        ],
        &[
            "simulate",
            "--algorithm",
            "gcra",
            "--limit",
            "1",
            "--period",
            "366d",
        ],
        &[
            "simulate",
            "--algorithm",
            "gcra",
            "--limit",
            "4294967296",
            "--period",
            "1s",
        ],
        &[
            "simulate",
            "--algorithm",
            "gcra",
            "--limit",
            "4294967295",
            "--period",
            "365d",
        ],
        &[
            "simulate",
            "--algorithm",
            "gcra",
            "--limit",
            "1.5",
            "--period",
            "1s",
        ],
        &[
            "simulate",
            "--algorithm",
            "bucket",
            "--limit",
            "1",
            "--period",
            "1s",
        ],
        &[
            "simulate",
            "--algorithm",
            "gcra",
            "--limit",
            "1",
            "--period",
            "1s",
            "--policy",
            "gcra:limit=1,period=1s",
        ],
        &[
            "simulate",
            "--burst",
            "3",
            "--policy",
            "gcra:limit=1,period=1s",
        ],
        &["simulate", "--policy", "gcra:limit=1"],
        &[
            "simulate",
            "--policy",
            "sliding-log:limit=1,period=1s,burst=1",
        ],
        &[
            "simulate",
            "--policy",
            "gcra:limit=1,period=1s",
            "--backend",
            "postgres",
        ],
        &[
            "simulate",
            "--policy",
            "gcra:limit=1,period=1s",
            "--frobnicate",
        ],
        &["frobnicate"],
        &[
            "simulate",
            "--policy",
            "gcra:limit=1,period=1s",
            "--policy",
            "gcra:limit=1,period=1s",
        ],
        &[
            "simulate",
            "--policy",
            "gcra:limit=1,period=1s,name=x",
            "--policy",
            "fixed-window:limit=5,period=1s,name=x",
        ],
    ] {
        let out = usage_error(args);
        assert!(stderr(&out).contains("error"), "{args:?}: {}", stderr(&out));
    }
}

#[test]
fn several_policies_are_all_or_nothing() {
    // fixed-window 2/s and token-bucket 1/500ms: at t=100 the bucket denies, so the window
    // consumes nothing and still has room at t=500.
    let out = run(
        &[
            "simulate",
            "--policy",
            "fixed-window:limit=2,period=1s",
            "--policy",
            "token-bucket:limit=1,period=500ms",
            "--backend",
            "memory",
        ],
        b"{\"t_ms\":0}\n{\"t_ms\":100}\n{\"t_ms\":500}\n{\"t_ms\":600}\n",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let allowed: Vec<Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["allowed"].clone())
        .collect();
    assert_eq!(allowed, [true, false, true, false]);
}

/// The access-log replay of `docs/cli.md` runs as written on the sample log in the repository.
#[test]
fn the_sample_access_log_replays_as_the_cli_page_shows() {
    let log = workspace_root().join("examples/traces/access.log");
    let o = run(
        &[
            "simulate",
            "--format",
            "nginx",
            "--input",
            log.to_str().unwrap(),
            "--policy",
            "sliding-window:limit=20,period=1m",
            "--summary",
        ],
        b"",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let total = stdout(&o)
        .lines()
        .find(|l| l.starts_with("TOTAL"))
        .expect("a TOTAL line");
    let fields: Vec<&str> = total.split_whitespace().collect();
    assert_eq!(fields[..5], ["TOTAL", "169", "132", "37", "21.9%"]);
    assert!(stdout(&o).contains("2001:db8:1:2::/64        36        36       0"));
}
