//! End-to-end tests of replaying real traffic: `--format nginx` access logs (re-sorting,
//! malformed lines, offsets from UTC), `--compare` (output, order, summary columns, Redis),
//! `--plot` (a valid SVG with the expected series) and the plot command of `docs/algorithms.md`.

mod common;

use common::{run, stderr, stdout, usage_error, workspace_root};

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;

fn lines(o: &Output) -> Vec<Value> {
    stdout(o)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

fn tmp(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name)
}

/// 2024-03-12 09:15:00 UTC in Unix ms.
const T0: u64 = 1_710_234_900_000;

/// A real-looking combined log: IPv4 and IPv6 clients, a user, escaped quotes (Apache's
/// `\"`, nginx's `\x16`), a request line that is not HTTP, and line 4 two seconds out of
/// order.
const ACCESS_LOG: &str = concat!(
    r#"192.0.2.10 - - [12/Mar/2024:09:15:02 +0000] "GET / HTTP/1.1" 200 612 "-" "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/122.0 Safari/537.36""#,
    "\n",
    r#"192.0.2.10 - - [12/Mar/2024:09:15:02 +0000] "GET /static/app.css HTTP/1.1" 200 4096 "https://shop.example/" "Mozilla/5.0 (X11; Linux x86_64)""#,
    "\n",
    r#"198.51.100.7 - alice [12/Mar/2024:09:15:03 +0000] "POST /api/login HTTP/2.0" 401 53 "https://shop.example/login" "curl/8.5.0""#,
    "\n",
    r#"2001:db8::42 - - [12/Mar/2024:09:15:01 +0000] "GET /robots.txt HTTP/1.1" 404 153 "-" "Googlebot/2.1 (+http://www.google.com/bot.html)""#,
    "\n",
    r#"192.0.2.10 - - [12/Mar/2024:09:15:04 +0000] "GET /api/cart?q=\"7\" HTTP/1.1" 200 88 "https://shop.example/" "Mozilla/5.0""#,
    "\r\n",
    r#"203.0.113.9 - - [12/Mar/2024:09:15:04 +0000] "\x16\x03\x01\x02\x00" 400 157 "-" "-""#,
    "\n",
    r#"192.0.2.10 - - [12/Mar/2024:09:15:05 +0000] "GET /favicon.ico HTTP/1.1" 200 318 "https://shop.example/" "Mozilla/5.0""#,
);

const GCRA_2_PER_10S: &[&str] = &[
    "simulate",
    "--format",
    "nginx",
    "--policy",
    "gcra:limit=2,period=10s",
];

#[test]
fn an_access_log_is_replayed_in_time_order() {
    let out = run(GCRA_2_PER_10S, ACCESS_LOG.as_bytes());
    assert!(out.status.success(), "{}", stderr(&out));
    let got: Vec<(u64, String, u64, bool)> = lines(&out)
        .iter()
        .map(|l| {
            (
                (l["t_ms"].as_u64().unwrap() - T0) / 1000,
                l["key"].as_str().unwrap().to_owned(),
                l["cost"].as_u64().unwrap(),
                l["allowed"].as_bool().unwrap(),
            )
        })
        .collect();
    // IPv6 clients are keyed by their /64 network, as the middleware keys them.
    let want = [
        (1, "2001:db8::/64", 1, true),
        (2, "192.0.2.10", 1, true),
        (2, "192.0.2.10", 1, true),
        (3, "198.51.100.7", 1, true),
        (4, "192.0.2.10", 1, false),
        (4, "203.0.113.9", 1, true),
        (5, "192.0.2.10", 1, false),
    ]
    .map(|(s, k, c, a)| (s, k.to_owned(), c, a));
    assert_eq!(got, want);
    // The decision line is the JSON trace's, byte for byte.
    assert_eq!(
        stdout(&out).lines().next(),
        Some(
            r#"{"t_ms":1710234901000,"key":"2001:db8::/64","cost":1,"allowed":true,"remaining":1,"retry_after_ms":0,"reset_after_ms":5000,"delay_ms":0}"#
        )
    );
}

#[test]
fn offsets_from_utc_are_applied() {
    // One instant, 2000-10-10 20:55:36 UTC, written at four offsets, then one second later.
    let log = concat!(
        "127.0.0.1 - frank [10/Oct/2000:13:55:36 -0700] \"GET /apache_pb.gif HTTP/1.0\" 200 2326 \"http://www.example.com/start.html\" \"Mozilla/4.08 [en] (Win98; I ;Nav)\"\n",
        "127.0.0.1 - - [10/Oct/2000:20:55:36 +0000] \"GET / HTTP/1.0\" 200 1\n",
        "127.0.0.1 - - [11/Oct/2000:02:25:36 +0530] \"GET / HTTP/1.0\" 200 1\n",
        "127.0.0.1 - - [10/Oct/2000:10:55:37 -1000] \"GET / HTTP/1.0\" 200 1\n",
    );
    let out = run(GCRA_2_PER_10S, log.as_bytes());
    assert!(out.status.success(), "{}", stderr(&out));
    let times: Vec<u64> = lines(&out)
        .iter()
        .map(|l| l["t_ms"].as_u64().unwrap())
        .collect();
    assert_eq!(
        times,
        [
            971_211_336_000,
            971_211_336_000,
            971_211_336_000,
            971_211_337_000
        ]
    );
}

/// A log of `n` lines at 09:15:SS for each second SS given.
fn log_at(seconds: &[u32]) -> String {
    seconds
        .iter()
        .map(|s| {
            format!("192.0.2.1 - - [12/Mar/2024:09:15:{s:02} +0000] \"GET / HTTP/1.1\" 200 5 \"-\" \"t\"\n")
        })
        .collect()
}

#[test]
fn lines_out_of_order_beyond_the_window_are_an_error() {
    // Line 4 is 6 s before line 3: within a 10 s window, beyond the default 5 s.
    let log = log_at(&[10, 12, 16, 10, 17]);
    let out = run(GCRA_2_PER_10S, log.as_bytes());
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("access-log line 4"), "{err}");
    assert!(err.contains("6000 ms before line 3"), "{err}");
    assert!(err.contains("--reorder-window"), "{err}");
    // The three lines before it are decided and written, in time order.
    let seconds: Vec<u64> = lines(&out)
        .iter()
        .map(|l| (l["t_ms"].as_u64().unwrap() - T0) / 1000)
        .collect();
    assert_eq!(seconds, [10, 12, 16]);

    let mut args = GCRA_2_PER_10S.to_vec();
    args.extend(["--reorder-window", "10s"]);
    let out = run(&args, log.as_bytes());
    assert!(out.status.success(), "{}", stderr(&out));
    let seconds: Vec<u64> = lines(&out)
        .iter()
        .map(|l| (l["t_ms"].as_u64().unwrap() - T0) / 1000)
        .collect();
    assert_eq!(seconds, [10, 10, 12, 16, 17]);

    // Exactly the window is still fine.
    let mut args = GCRA_2_PER_10S.to_vec();
    args.extend(["--reorder-window", "6000ms"]);
    assert!(run(&args, log.as_bytes()).status.success());
}

#[test]
fn malformed_access_log_lines_stop_the_run_keeping_earlier_decisions() {
    let good = log_at(&[1, 2]);
    for (bad, needle) in [
        ("", "empty line"),
        (r#"{"t_ms": 3000}"#, "column"),
        (
            r#"192.0.2.1 - - [12/Mar/2024:09:15:03] "GET / HTTP/1.1" 200 5 "-" "t""#,
            "offset",
        ),
        (
            r#"192.0.2.1 - - [12/Mar/2024:09:15:03 +0000] "GET / HTTP/1.1 200 5"#,
            "no closing",
        ),
        (
            r#"192.0.2.1 - - [31/Feb/2024:09:15:03 +0000] "GET /" 200 5 "-" "t""#,
            "no such day",
        ),
        (
            r#"192.0.2.1 - - [12/03/2024:09:15:03 +0000] "GET /" 200 5 "-" "t""#,
            "month",
        ),
        (
            r#"192.0.2.1 - - [12/Mar/2024:09:15:03 +0000] "GET /" - 5 "-" "t""#,
            "status code",
        ),
        (
            r#"192.0.2.1 - - [01/Jan/1970:00:59:59 +0100] "GET /" 200 5"#,
            "before the Unix epoch",
        ),
    ] {
        let input = format!("{good}{bad}\n{}", log_at(&[4]));
        let out = run(GCRA_2_PER_10S, input.as_bytes());
        assert_eq!(out.status.code(), Some(1), "{bad:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains("access-log line 3"), "{bad:?}: {err}");
        assert!(err.contains(needle), "{bad:?}: {err} lacks {needle:?}");
        assert!(!err.contains("panicked"), "{err}");
        assert_eq!(lines(&out).len(), 2, "{bad:?}: {}", stdout(&out));
    }
}

#[test]
fn the_json_trace_stays_strict_and_the_new_flags_check_their_use() {
    // --format jsonl is the default and still refuses what it always refused.
    let out = run(
        &[
            "simulate",
            "--format",
            "jsonl",
            "--policy",
            "gcra:limit=1,period=1s",
        ],
        b"{\"t_ms\":5}\n{\"t_ms\":4}\n",
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("malformed trace line 2"));
    // An access log is not a JSON trace.
    let out = run(
        &["simulate", "--policy", "gcra:limit=1,period=1s"],
        log_at(&[1]).as_bytes(),
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("malformed trace line 1"));

    for args in [
        &[
            "simulate",
            "--policy",
            "gcra:limit=1,period=1s",
            "--reorder-window",
            "5s",
        ][..],
        &[
            "simulate",
            "--format",
            "nginx",
            "--policy",
            "gcra:limit=1,period=1s",
            "--reorder-window",
            "5",
        ],
        &[
            "simulate",
            "--format",
            "apache",
            "--policy",
            "gcra:limit=1,period=1s",
        ],
        &[
            "simulate",
            "--policy",
            "gcra:limit=1,period=1s",
            "--bucket",
            "1s",
        ],
        &[
            "simulate",
            "--policy",
            "gcra:limit=1,period=1s",
            "--plot",
            "x.svg",
            "--bucket",
            "0s",
        ],
        &[
            "simulate",
            "--policy",
            "gcra:limit=1,period=1s",
            "--plot",
            "x.svg",
            "--bucket",
            "366d",
        ],
        &["simulate", "--compare"],
        &[
            "simulate",
            "--compare",
            "gcra:limit=1,period=1s",
            "gcra:limit=1,period=1s",
        ],
        &[
            "simulate",
            "--compare",
            "gcra:limit=1,period=1s,name=a",
            "sliding-log:limit=1,period=1s,name=a",
        ],
        &[
            "simulate",
            "--compare",
            "gcra:limit=1",
            "gcra:limit=2,period=1s",
        ],
        &[
            "simulate",
            "--policy",
            "gcra:limit=1,period=1s",
            "--compare",
            "gcra:limit=2,period=1s",
        ],
        &[
            "simulate",
            "--algorithm",
            "gcra",
            "--limit",
            "1",
            "--period",
            "1s",
            "--compare",
            "gcra:limit=2,period=1s",
        ],
    ] {
        usage_error(args);
    }
}

const TRACE: &str = concat!(
    "{\"t_ms\":0,\"key\":\"alice\"}\n",
    "{\"t_ms\":0,\"key\":\"alice\"}\n",
    "{\"t_ms\":100,\"key\":\"bob\"}\n",
    "{\"t_ms\":400,\"key\":\"alice\"}\n",
    "{\"t_ms\":999,\"key\":\"alice\"}\n",
    "{\"t_ms\":1000,\"key\":\"alice\",\"cost\":2}\n",
);

const CANDIDATES: [&str; 3] = [
    "fixed-window:limit=2,period=1s",
    "token-bucket:limit=2,period=1s,name=tb",
    "sliding-log:limit=3,period=1s",
];

#[test]
fn compare_writes_one_line_per_request_per_candidate_in_order() {
    let mut args = vec!["simulate", "--compare"];
    args.extend(CANDIDATES);
    let out = run(&args, TRACE.as_bytes());
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let all: Vec<&str> = text.lines().collect();
    assert_eq!(all.len(), 6 * 3);
    let names = [
        "fixed-window:limit=2,period=1s",
        "tb",
        "sliding-log:limit=3,period=1s",
    ];
    for (i, line) in all.iter().enumerate() {
        // For each request, the candidates in the order given; "policy" ends the line.
        let suffix = format!(",\"policy\":\"{}\"}}", names[i % 3]);
        assert!(line.ends_with(&suffix), "{line}");
    }
    // Each candidate decides alone, on a fresh backend of its own: its lines, without the
    // "policy" field, are exactly a run of that policy alone.
    for (spec, name) in CANDIDATES.iter().zip(names) {
        let alone = run(&["simulate", "--policy", spec], TRACE.as_bytes());
        assert!(alone.status.success());
        let suffix = format!(",\"policy\":\"{name}\"}}");
        let mine: String = all
            .iter()
            .filter_map(|l| l.strip_suffix(&suffix))
            .map(|l| format!("{l}}}\n"))
            .collect();
        assert_eq!(mine, stdout(&alone), "{spec}");
    }
    // Not all-or-nothing: at t=400 fixed-window denies alice, sliding-log still admits her.
    let at_400: Vec<bool> = all[9..12]
        .iter()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["allowed"] == true)
        .collect();
    assert_eq!(at_400, [false, false, true]);
}

#[test]
fn compare_summary_has_a_column_per_candidate() {
    let mut args = vec!["simulate", "--summary", "--compare"];
    args.extend(CANDIDATES);
    let out = run(&args, TRACE.as_bytes());
    assert!(out.status.success(), "{}", stderr(&out));
    // alice (t = 0, 0, 400, 999, 1000 with cost 2): fixed-window denies 400 and 999 (its
    // window is full), then admits the cost 2 in a fresh window; tb denies 400 (0.8 tokens)
    // and 1000 (1.0 token after 999 took one); sliding-log denies only 999 (at 1000 the
    // entries of t = 0 have expired).
    let want = "\
requests denied (share of the key's requests) by each candidate:
key    requests  fixed-window:limit=2,period=1s         tb  sliding-log:limit=3,period=1s
alice         5                       2 (40.0%)  2 (40.0%)                      1 (20.0%)
bob           1                        0 (0.0%)   0 (0.0%)                       0 (0.0%)
-----  --------  ------------------------------  ---------  -----------------------------
TOTAL         6                       2 (33.3%)  2 (33.3%)                      1 (16.7%)
";
    assert_eq!(stdout(&out), want);
}

/// `--compare` on Redis: the same bytes as in memory, and every candidate's keys deleted.
#[test]
fn compare_on_redis_matches_memory_and_cleans_up() {
    let redis = turnstile_tests::redis_server::RedisServer::start();
    let url = redis.url();
    let mut args = vec!["simulate", "--compare"];
    args.extend(CANDIDATES);
    let memory = run(&args, TRACE.as_bytes());
    args.extend(["--backend", "redis", "--redis-url", &url]);
    let on_redis = run(&args, TRACE.as_bytes());
    assert!(on_redis.status.success(), "{}", stderr(&on_redis));
    assert_eq!(stdout(&on_redis), stdout(&memory));
    let size = turnstile_tests::redis_server::command(redis.port(), "DBSIZE").expect("DBSIZE");
    assert_eq!(size.trim(), ":0");
}

/// `--compare` on Redis over mutual TLS (`--tls-ca`, `--tls-cert`, `--tls-key`): the same
/// bytes as in memory.
#[test]
fn compare_on_redis_over_tls_matches_memory() {
    let pki = turnstile_tests::tls::TestPki::generate();
    let server_args = pki.server_args(true);
    let server_args: Vec<&str> = server_args.iter().map(String::as_str).collect();
    let redis = turnstile_tests::redis_server::RedisServer::start_tls(&server_args);
    let url = redis.url();
    let (ca, cert, key) = (
        pki.path("ca.pem").display().to_string(),
        pki.path("client.pem").display().to_string(),
        pki.path("client.key").display().to_string(),
    );
    let mut args = vec!["simulate", "--compare"];
    args.extend(CANDIDATES);
    let memory = run(&args, TRACE.as_bytes());
    args.extend(["--backend", "redis", "--redis-url", &url, "--tls-ca", &ca]);
    // Without the client certificate the server hangs up: a setup failure, no decision.
    let refused = run(&args, TRACE.as_bytes());
    assert!(!refused.status.success());
    assert!(stdout(&refused).is_empty(), "{}", stdout(&refused));
    assert!(
        stderr(&refused).contains("CertificateRequired"),
        "{}",
        stderr(&refused)
    );
    args.extend(["--tls-cert", &cert, "--tls-key", &key]);
    let on_redis = run(&args, TRACE.as_bytes());
    assert!(on_redis.status.success(), "{}", stderr(&on_redis));
    assert_eq!(stdout(&on_redis), stdout(&memory));
}

/// Parses `path` as XML and returns the texts of its `<text>` elements.
fn svg_texts(path: &Path) -> Vec<String> {
    let svg = fs::read_to_string(path).expect("the plot is written");
    let doc = roxmltree::Document::parse(&svg).expect("the plot is well-formed XML");
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "svg");
    assert!(root.attribute("width").is_some() && root.attribute("height").is_some());
    doc.descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text())
        .map(|t| t.trim().to_owned())
        .collect()
}

#[test]
fn plot_is_an_svg_with_a_panel_and_series_per_candidate() {
    let path = tmp("turnstile-compare.svg");
    let _ = fs::remove_file(&path);
    let mut args = vec!["simulate", "--plot", path.to_str().unwrap(), "--compare"];
    args.extend(CANDIDATES);
    let out = run(&args, TRACE.as_bytes());
    assert!(out.status.success(), "{}", stderr(&out));
    // The decisions are written as without --plot.
    assert_eq!(stdout(&out).lines().count(), 18);
    let texts = svg_texts(&path);
    let count = |s: &str| texts.iter().filter(|t| *t == s).count();
    for name in [
        "fixed-window:limit=2,period=1s",
        "tb",
        "sliding-log:limit=3,period=1s",
    ] {
        assert_eq!(count(name), 1, "{name}: {texts:?}");
    }
    // One admitted and one denied series per candidate.
    assert_eq!(count("admitted"), 3, "{texts:?}");
    assert_eq!(count("denied"), 3, "{texts:?}");
    // 1 s of trace: 10 ms buckets, axes with units.
    assert_eq!(count("requests per 10 ms"), 3, "{texts:?}");
    assert_eq!(count("trace time t_ms (s)"), 1, "{texts:?}");
    assert!(texts.iter().any(|t| t == "0.5"), "{texts:?}");

    // --bucket, and one panel named by its policies without --compare.
    let out = run(
        &[
            "simulate",
            "--policy",
            "gcra:limit=2,period=1s",
            "--policy",
            "fixed-window:limit=3,period=1s,name=fw",
            "--plot",
            path.to_str().unwrap(),
            "--bucket",
            "250ms",
            "--summary",
        ],
        TRACE.as_bytes(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let texts = svg_texts(&path);
    assert!(
        texts.iter().any(|t| t == "gcra:limit=2,period=1s + fw"),
        "{texts:?}"
    );
    assert!(
        texts.iter().any(|t| t == "requests per 250 ms"),
        "{texts:?}"
    );
}

#[test]
fn plot_of_an_access_log_has_a_wall_clock_axis() {
    let path = tmp("turnstile-nginx.svg");
    let mut args = GCRA_2_PER_10S.to_vec();
    args.extend(["--plot", path.to_str().unwrap(), "--summary"]);
    let out = run(&args, ACCESS_LOG.as_bytes());
    assert!(out.status.success(), "{}", stderr(&out));
    let texts = svg_texts(&path);
    assert!(
        texts.iter().any(|t| t == "time on 12 Mar 2024 (UTC+00:00)"),
        "{texts:?}"
    );
    assert!(texts.iter().any(|t| t == "09:15:02"), "{texts:?}");
    assert!(texts.iter().any(|t| t == "requests per 1 s"), "{texts:?}");
}

#[test]
fn plot_failures_exit_1_after_the_decisions() {
    // A folder that does not exist.
    let path = tmp("no-such-dir/plot.svg");
    let out = run(
        &[
            "simulate",
            "--policy",
            "gcra:limit=1,period=1s",
            "--plot",
            path.to_str().unwrap(),
        ],
        TRACE.as_bytes(),
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("cannot write the plot"),
        "{}",
        stderr(&out)
    );
    assert_eq!(stdout(&out).lines().count(), 6);
    // Too many buckets for a plot.
    let path = tmp("too-many.svg");
    let out = run(
        &[
            "simulate",
            "--policy",
            "gcra:limit=1,period=1s",
            "--plot",
            path.to_str().unwrap(),
            "--bucket",
            "1ms",
        ],
        b"{\"t_ms\":0}\n{\"t_ms\":3600000}\n",
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("wider --bucket"), "{}", stderr(&out));
    // A malformed trace: no plot.
    let path = tmp("not-written.svg");
    let _ = fs::remove_file(&path);
    let out = run(
        &[
            "simulate",
            "--policy",
            "gcra:limit=1,period=1s",
            "--plot",
            path.to_str().unwrap(),
        ],
        b"{\"t_ms\":0}\n{\"t_ms\":x}\n",
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(!path.exists());
}

#[test]
fn an_empty_trace_still_plots_axes() {
    let path = tmp("turnstile-empty.svg");
    let out = run(
        &[
            "simulate",
            "--policy",
            "gcra:limit=1,period=1s",
            "--plot",
            path.to_str().unwrap(),
        ],
        b"",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(svg_texts(&path).iter().any(|t| t == "admitted"));
}

/// The plot of `docs/algorithms.md`: its command is on the page, and running it gives the
/// committed SVG byte for byte.
#[test]
fn the_algorithms_page_plot_is_what_its_command_draws() {
    let root = workspace_root();
    let compare = [
        "token-bucket:limit=20,period=10s",
        "gcra:limit=20,period=10s",
        "leaky-bucket:limit=20,period=10s",
        "fixed-window:limit=20,period=10s",
        "sliding-log:limit=20,period=10s",
        "sliding-window:limit=20,period=10s",
    ];
    let command = format!(
        "cargo run -p turnstile-cli -- simulate --input examples/traces/bursty.jsonl --summary --plot docs/algorithms.svg --bucket 1s --compare {}",
        compare.join(" ")
    );
    let page = fs::read_to_string(root.join("docs/algorithms.md")).expect("docs/algorithms.md");
    let flat = page.replace("\\\n", " ");
    let flat = flat.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        flat.contains(&command),
        "docs/algorithms.md lacks {command}"
    );

    let path = tmp("algorithms.svg");
    let input = root.join("examples/traces/bursty.jsonl");
    let mut args = vec![
        "simulate",
        "--input",
        input.to_str().unwrap(),
        "--summary",
        "--plot",
        path.to_str().unwrap(),
        "--bucket",
        "1s",
        "--compare",
    ];
    args.extend(compare);
    let out = run(&args, b"");
    assert!(out.status.success(), "{}", stderr(&out));
    // The table the page shows.
    for row in stdout(&out).lines().skip(1) {
        assert!(
            page.contains(row),
            "docs/algorithms.md lacks the summary row {row:?}"
        );
    }
    let want = fs::read(root.join("docs/algorithms.svg")).expect("docs/algorithms.svg");
    let got = fs::read(&path).expect("the plot");
    assert!(
        got == want,
        "docs/algorithms.svg is not what the page's command draws"
    );
}
