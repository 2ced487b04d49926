//! What Redis holds: older state formats, the scripts' strict reading of arguments, state and
//! configuration, expiry, and the repairs of garbage (reset, clear).

use super::*;

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
    let key = b.state_key("c");
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
    let over = [p("fixed-window:limit=3,period=1s,name=d")];
    b.set_override("c", &over).await.unwrap();
    b.set_tier("t", Some("pro")).await.unwrap();
    let pttl = |key: &str| -> i64 {
        let r = command(server.port(), &format!("PTTL {key}")).unwrap();
        r.trim().trim_start_matches(':').parse().unwrap()
    };
    let cfg = |client: &str| {
        let state = b.state_key(client);
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
        let state = b.state_key("c");
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
    let key = b.state_key("victim");
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
    let states = b.state_key("k");
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
        let n = b.state_key("n");
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
    let m = ttl(&b.state_key("m"));
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
        let states = b.state_key(&client);
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
        let state_key = |client: &str| on_redis.state_key(client);
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
        let state = b.state_key(client);
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
                let key = on_redis.state_key(&client);
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
