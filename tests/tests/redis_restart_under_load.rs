//! Issue 15, "a Redis restarted and flushed under load": `kill -9` and a restart, `FLUSHALL`
//! (the data gone, the library kept), `FLUSHALL` with `FUNCTION FLUSH` and `SCRIPT FLUSH`
//! (data and library gone) and the library flushes alone (the data kept) — each while tasks
//! keep checking and reading a configuration, through the Functions path and the `EVALSHA`
//! path, against `redis-server` processes these tests start themselves.
//!
//! What every request got is asserted: a decision, or a typed error of the kind the fault
//! explains (a restart: `Connection`, `Timeout`; a flush: none at all), never later than the
//! timeout. Decisions stay consistent: per task and key the counts only go down, except once
//! where the fault dropped the data; an override set before the fault is either intact for
//! every request or gone for every request after the first that saw it gone, never
//! half-applied. Afterwards decisions are exact again (a fresh key of limit N admits exactly
//! N of many concurrent requests, each `remaining` once), and every key under the prefix is a
//! valid `f4` state string or configuration hash.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use turnstile_core::{Applied, Backend, BackendError, Decision, KeyConfig, Policy, Quotas};
use turnstile_redis::{library, redis, RedisBackend, ScriptMode};
use turnstile_tests::redis_server::{command_calls, RedisCluster, RedisServer};
use turnstile_tests::state_string::f4_problem;

/// Every request's bound.
const TIMEOUT: Duration = Duration::from_secs(1);
/// What a request may take beyond [`TIMEOUT`]: the scheduler of a loaded 2-core machine.
const SLACK: Duration = Duration::from_millis(500);
/// Every wait for the load to reach a point.
const WITHIN: Duration = Duration::from_secs(10);
/// Concurrent checking tasks.
const TASKS: usize = 8;
/// The client keys the load checks; `cfg` has an override.
const KEYS: [&str; 4] = ["k0", "k1", "k2", "cfg"];

fn p(spec: &str) -> Policy {
    spec.parse().unwrap()
}

/// The defaults: three policies, so each state string holds three lines. Nothing is denied
/// and the windows' counts only go down within the test (100-day windows).
fn defaults() -> Vec<Policy> {
    vec![
        p("fixed-window:limit=1000000,period=100d,name=w"),
        p("sliding-window:limit=1000000,period=100d,name=s"),
        p("token-bucket:limit=100000,period=1d,name=t"),
    ]
}

/// `cfg`'s override, set before the load starts: it changes the parameters of `w` and `t`;
/// `s` stays the default's.
fn over() -> Vec<Policy> {
    vec![
        p("fixed-window:limit=500000,period=100d,name=w"),
        p("token-bucket:limit=50000,period=1d,name=t"),
    ]
}

/// The policies `cfg` is checked under while its override holds: each default, with the
/// override's parameters where it names it.
fn overridden() -> Vec<Policy> {
    let over = over();
    defaults()
        .into_iter()
        .map(|d| {
            over.iter()
                .find(|o| o.name() == d.name())
                .cloned()
                .unwrap_or(d)
        })
        .collect()
}

/// The fault injected while the load runs.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// `kill -9` of the server, then a restart (no persistence: data and library gone).
    Restart,
    /// These commands in one `MULTI`/`EXEC`.
    Flush(&'static [&'static str]),
}

impl Fault {
    fn loses_data(self) -> bool {
        match self {
            Fault::Restart => true,
            Fault::Flush(cmds) => cmds.contains(&"FLUSHALL"),
        }
    }

    /// Whether the Lua this mode runs is gone from the server.
    fn loses_code(self, mode: ScriptMode) -> bool {
        match self {
            Fault::Restart => true,
            Fault::Flush(cmds) => cmds.contains(&match mode {
                ScriptMode::Eval => "SCRIPT FLUSH",
                _ => "FUNCTION FLUSH",
            }),
        }
    }
}

/// The Redis the load runs against.
enum Deployment {
    Single(RedisServer),
    /// Three masters, no replicas.
    Cluster(RedisCluster),
}

impl Deployment {
    fn url(&self) -> String {
        match self {
            Deployment::Single(s) => s.url(),
            Deployment::Cluster(c) => c.urls(),
        }
    }

    /// The masters' ports.
    fn masters(&self) -> Vec<u16> {
        match self {
            Deployment::Single(s) => vec![s.port()],
            Deployment::Cluster(c) => c.nodes().iter().map(RedisServer::port).collect(),
        }
    }

    /// The port of the master serving `client`'s keys.
    fn master_of(&self, b: &RedisBackend, client: &str) -> u16 {
        match self {
            Deployment::Single(s) => s.port(),
            Deployment::Cluster(c) => c.nodes()[c.node_of_key(&b.state_key(client))].port(),
        }
    }
}

/// One request of the load.
#[derive(Debug)]
enum Got {
    Check(&'static str, Result<Decision, BackendError>),
    Config(Result<KeyConfig, BackendError>),
}

#[derive(Debug)]
struct Seen {
    task: usize,
    took: Duration,
    got: Got,
}

/// Tasks checking [`KEYS`] in turn (cost 1), and one reading `cfg`'s configuration, until
/// stopped; `decided` and `failed` count the checks answered and the requests failed.
struct Load {
    stop: Arc<AtomicBool>,
    decided: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    tasks: Vec<JoinHandle<Vec<Seen>>>,
}

impl Load {
    fn start(b: &RedisBackend) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let decided = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let pol: Arc<[Policy]> = defaults().into();
        let mut tasks = Vec::new();
        for task in 0..=TASKS {
            let (b, pol) = (b.clone(), Arc::clone(&pol));
            let (stop, decided, failed) =
                (Arc::clone(&stop), Arc::clone(&decided), Arc::clone(&failed));
            tasks.push(tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut i = task;
                while !stop.load(Ordering::Acquire) {
                    let start = Instant::now();
                    let got = if task == TASKS {
                        Got::Config(b.config("cfg").await)
                    } else {
                        let key = KEYS[i % KEYS.len()];
                        i += 1;
                        Got::Check(key, b.check(key, &pol, 1).await)
                    };
                    // The counters are the checks' (the configuration reads, made without
                    // node health, answer as soon as the server does).
                    let ok = match &got {
                        Got::Check(_, r) => Some(r.is_ok()),
                        Got::Config(r) => r.as_ref().err().map(|_| false),
                    };
                    match ok {
                        Some(true) => decided.fetch_add(1, Ordering::AcqRel),
                        Some(false) => failed.fetch_add(1, Ordering::AcqRel),
                        None => 0,
                    };
                    let took = start.elapsed();
                    seen.push(Seen { task, took, got });
                    if ok == Some(false) {
                        // A failing node fails fast: no busy loop meanwhile.
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                }
                seen
            }));
        }
        Load {
            stop,
            decided,
            failed,
            tasks,
        }
    }

    /// Waits until `counter` has grown by `more` from `from`; panics after [`WITHIN`].
    async fn wait(counter: &AtomicU64, from: u64, more: u64, what: &str) {
        let deadline = Instant::now() + WITHIN;
        while counter.load(Ordering::Acquire) < from + more {
            assert!(Instant::now() < deadline, "{what}: not within {WITHIN:?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn decided(&self, more: u64, what: &str) {
        let from = self.decided.load(Ordering::Acquire);
        Self::wait(&self.decided, from, more, what).await;
    }

    async fn stop(self) -> Vec<Seen> {
        self.stop.store(true, Ordering::Release);
        let mut all = Vec::new();
        for t in self.tasks {
            all.extend(t.await.unwrap());
        }
        all
    }
}

fn backend(url: &str, mode: ScriptMode, test: &str) -> RedisBackend {
    RedisBackend::builder(url)
        .prefix(format!(
            "turnstile:test:load:{test}-{mode:?}:{}",
            std::process::id()
        ))
        .timeout(TIMEOUT)
        .retry_interval(Duration::from_millis(100))
        .script_mode(mode)
        .build()
        .unwrap()
}

/// Runs the load, injects `fault` in the middle, and asserts what every request got, then
/// that decisions are exact again and every key valid.
async fn fault_under_load(mut redis: Deployment, mode: ScriptMode, fault: Fault, test: &str) {
    let cluster = matches!(redis, Deployment::Cluster(_));
    let what = format!(
        "{mode:?} {fault:?}{}",
        if cluster { " (Cluster)" } else { "" }
    );
    let b = backend(&redis.url(), mode, test);
    let set = b.set_override("cfg", &over()).await.unwrap();
    let version = set.version();
    let load = Load::start(&b);
    load.decided(200, &format!("{what}: decisions before the fault"))
        .await;
    let loads = b.stats().script_loads;
    match fault {
        Fault::Restart => {
            let Deployment::Single(mut server) = redis else {
                panic!("{what}: restarts are of a single server")
            };
            server.kill();
            // Every request now fails: wait until the load has met the dead server.
            let failed = load.failed.load(Ordering::Acquire);
            Load::wait(&load.failed, failed, 20, &format!("{what}: failures")).await;
            let server = tokio::task::spawn_blocking(move || {
                server.restart();
                server
            })
            .await
            .unwrap();
            redis = Deployment::Single(server);
        }
        Fault::Flush(cmds) => {
            // On each master in turn (a Cluster's data and library are per master).
            for port in redis.masters() {
                let mut conn = redis::Client::open(format!("redis://127.0.0.1:{port}"))
                    .unwrap()
                    .get_multiplexed_async_connection()
                    .await
                    .unwrap();
                let mut pipe = redis::pipe();
                pipe.atomic();
                for c in cmds {
                    let mut words = c.split(' ');
                    let mut cmd = redis::cmd(words.next().unwrap());
                    cmd.arg(words.collect::<Vec<_>>());
                    pipe.add_command(cmd).ignore();
                }
                let () = pipe.query_async(&mut conn).await.unwrap();
            }
        }
    }
    // The load goes on after the fault, until enough decisions were made on the server as
    // it is now.
    load.decided(400, &format!("{what}: decisions after the fault"))
        .await;
    let seen = load.stop().await;
    assert_requests(&seen, fault, version, &what);

    // The Lua was loaded again exactly when the fault took it.
    let reloaded = b.stats().script_loads > loads;
    assert_eq!(reloaded, fault.loses_code(mode), "{what}: reloads");
    let masters = redis.masters();
    let calls = |cmd| masters.iter().map(|p| command_calls(*p, cmd)).sum::<u64>();
    let (fcall, evalsha) = (calls("fcall"), calls("evalsha"));
    let eval = mode == ScriptMode::Eval;
    assert!(
        (fcall > 0, evalsha > 0) == (!eval, eval),
        "{what}: {fcall} {evalsha}"
    );
    // Every master that serves a key of the load has the library (EVALSHA: none), and none
    // has another.
    let serving: HashSet<u16> = KEYS
        .into_iter()
        .chain(["fresh"])
        .map(|k| redis.master_of(&b, k))
        .collect();
    let ours = library().name().to_owned();
    for port in &masters {
        let libs = library_names(*port);
        let want = if !eval && serving.contains(port) {
            vec![ours.clone()]
        } else {
            Vec::new()
        };
        assert_eq!(libs, want, "{what}: the master on {port}");
    }

    // The override: gone or intact, as the fault says.
    let config = b.config("cfg").await.unwrap();
    if fault.loses_data() {
        assert_eq!(config, KeyConfig::new(None, None, 0), "{what}");
    } else {
        assert_eq!(config, set, "{what}");
    }
    assert_exact_again(&b, &what).await;
    assert_keys_valid(&b, &masters, &what).await;
}

/// The policies a decision was made under, as (name, limit) pairs.
fn under(d: &Decision) -> Vec<(String, u64)> {
    d.policies()
        .iter()
        .map(|p| (p.name().to_owned(), p.policy().limit()))
        .collect()
}

fn named(ps: &[Policy]) -> Vec<(String, u64)> {
    ps.iter()
        .map(|p| (p.name().to_owned(), p.limit()))
        .collect()
}

/// Asserts what every request of the load got (see the file's header).
fn assert_requests(seen: &[Seen], fault: Fault, version: u64, what: &str) {
    let (dflt, ovr, applied) = (named(&defaults()), named(&over()), named(&overridden()));
    // Per task and key: the last `remaining` of each window policy, and whether the data
    // was seen dropped (a count that went up; `cfg` under the defaults again).
    let mut last: HashMap<(usize, &str, String), u64> = HashMap::new();
    let mut rises: HashMap<(usize, &str, String), u32> = HashMap::new();
    let mut override_gone: HashSet<usize> = HashSet::new();
    let (mut decisions, mut errors) = (0, 0);
    for s in seen {
        assert!(
            s.took <= TIMEOUT + SLACK,
            "{what}: a request took {:?}: {:?}",
            s.took,
            s.got
        );
        match &s.got {
            Got::Check(_, Err(e)) | Got::Config(Err(e)) => {
                errors += 1;
                let typed = matches!(
                    e,
                    BackendError::Connection(_) | BackendError::Timeout { .. }
                );
                assert!(
                    matches!(fault, Fault::Restart) && typed,
                    "{what}: task {} got {e:?}",
                    s.task
                );
            }
            Got::Check(key, Ok(d)) => {
                decisions += 1;
                assert!(d.allowed(), "{what}: {key} denied: {d:?}");
                if *key == "cfg" && *d.applied() == Applied::Override {
                    assert!(
                        !override_gone.contains(&s.task),
                        "{what}: task {}: the override came back: {d:?}",
                        s.task
                    );
                    assert_eq!(
                        (d.version(), under(d)),
                        (version, applied.clone()),
                        "{what}"
                    );
                } else {
                    assert_eq!(*d.applied(), Applied::Defaults, "{what}: {key}: {d:?}");
                    assert_eq!((d.version(), under(d)), (0, dflt.clone()), "{what}: {key}");
                    if *key == "cfg" {
                        assert!(fault.loses_data(), "{what}: cfg's override lost: {d:?}");
                        override_gone.insert(s.task);
                    }
                }
                for pd in d.policies() {
                    if pd.policy().algorithm().is_bucket() {
                        continue;
                    }
                    let at = (s.task, *key, pd.name().to_owned());
                    if let Some(before) = last.insert(at.clone(), pd.remaining()) {
                        if pd.remaining() >= before {
                            *rises.entry(at).or_default() += 1;
                        }
                    }
                }
            }
            Got::Config(Ok(c)) => {
                decisions += 1;
                if c.policies().is_some() {
                    assert!(!override_gone.contains(&s.task), "{what}: {c:?}");
                    assert_eq!(
                        (c.policies().map(named), c.tier(), c.version()),
                        (Some(ovr.clone()), None, version),
                        "{what}"
                    );
                } else {
                    assert!(fault.loses_data(), "{what}: the override lost: {c:?}");
                    assert_eq!(*c, KeyConfig::new(None, None, 0), "{what}");
                    override_gone.insert(s.task);
                }
            }
        }
    }
    // Counts never go up where the data was kept; at most once (per task, key and policy)
    // where the fault dropped it.
    let most = u32::from(fault.loses_data());
    for (at, n) in &rises {
        assert!(*n <= most, "{what}: {at:?} went up {n} times");
    }
    if matches!(fault, Fault::Restart) {
        assert!(errors > 0, "{what}: the restart failed nothing");
    }
    // Where the data was dropped, the load saw it: counts started over, the override went.
    if fault.loses_data() {
        assert!(!rises.is_empty(), "{what}: no count started over");
        assert!(!override_gone.is_empty(), "{what}: the override never went");
    }
    eprintln!("{what}: {decisions} answered, {errors} failed");
}

/// A fresh key of limit 20, checked 48 times at once: exactly 20 admitted, each `remaining`
/// from 19 down to 0 once, and no error.
async fn assert_exact_again(b: &RedisBackend, what: &str) {
    let pol: Arc<[Policy]> = Arc::from([p("fixed-window:limit=20,period=100d,name=fresh")]);
    let checks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (b, pol) = (b.clone(), Arc::clone(&pol));
            tokio::spawn(async move {
                let mut out = Vec::new();
                for _ in 0..6 {
                    out.push(b.check("fresh", &pol, 1).await);
                }
                out
            })
        })
        .collect();
    let mut admitted = Vec::new();
    let mut denied = 0;
    for c in checks {
        for r in c.await.unwrap() {
            let d = r.unwrap_or_else(|e| panic!("{what}: after the fault: {e:?}"));
            if d.allowed() {
                admitted.push(d.remaining());
            } else {
                denied += 1;
            }
        }
    }
    admitted.sort_unstable();
    assert_eq!(admitted, (0..20).collect::<Vec<u64>>(), "{what}");
    assert_eq!(denied, 6 * TASKS - 20, "{what}");
}

/// Every key under `b`'s prefix is a valid `f4` state string or a configuration hash
/// (fields `o`, `t`, `v` only), a configured key's string says so (header `c`), and every
/// client key of the load is checked again without error.
async fn assert_keys_valid(b: &RedisBackend, masters: &[u16], what: &str) {
    let mut configured = HashSet::new();
    let mut headers = HashMap::new();
    for port in masters {
        let mut conn = redis::Client::open(format!("redis://127.0.0.1:{port}"))
            .unwrap()
            .get_connection()
            .unwrap();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}:*", b.prefix()))
            .query(&mut conn)
            .unwrap();
        for key in &keys {
            let kind: String = redis::cmd("TYPE").arg(key).query(&mut conn).unwrap();
            if let Some(base) = key.strip_suffix("~cfg") {
                assert_eq!(kind, "hash", "{what}: {key}");
                let fields: HashMap<String, String> =
                    redis::cmd("HGETALL").arg(key).query(&mut conn).unwrap();
                assert!(
                    fields.keys().all(|f| ["o", "t", "v"].contains(&f.as_str())),
                    "{what}: {key}: {fields:?}"
                );
                configured.insert(format!("{base}:f4"));
            } else if key.ends_with(":f4") {
                assert_eq!(kind, "string", "{what}: {key}");
                let v: Vec<u8> = redis::cmd("GET").arg(key).query(&mut conn).unwrap();
                if let Some(why) = f4_problem(&v) {
                    panic!(
                        "{what}: {key} holds {:?}: {why}",
                        String::from_utf8_lossy(&v)
                    );
                }
                headers.insert(key.clone(), v[0]);
            } else {
                panic!("{what}: an unexpected key {key} ({kind})");
            }
        }
    }
    for key in &configured {
        if let Some(h) = headers.get(key) {
            assert_eq!(
                *h, b'c',
                "{what}: {key} is configured but its string says not"
            );
        }
    }
    for key in KEYS.into_iter().chain(["fresh"]) {
        let peek = b.check(key, &defaults(), 0).await;
        assert!(peek.is_ok(), "{what}: {key}: {peek:?}");
    }
}

/// The names of the server's Function libraries, sorted.
fn library_names(port: u16) -> Vec<String> {
    let mut conn = redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .get_connection()
        .unwrap();
    let reply: Vec<Vec<redis::Value>> =
        redis::cmd("FUNCTION").arg("LIST").query(&mut conn).unwrap();
    let mut names: Vec<String> = reply
        .iter()
        .map(|kv| redis::from_redis_value(kv[1].clone()).unwrap())
        .collect();
    names.sort();
    names
}

fn single() -> Deployment {
    Deployment::Single(RedisServer::start())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_and_restart_under_load_through_functions() {
    fault_under_load(single(), ScriptMode::Auto, Fault::Restart, "restart").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_and_restart_under_load_through_evalsha() {
    fault_under_load(single(), ScriptMode::Eval, Fault::Restart, "restart").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushall_under_load_drops_the_data_and_keeps_the_code() {
    for mode in [ScriptMode::Auto, ScriptMode::Eval] {
        fault_under_load(single(), mode, Fault::Flush(&["FLUSHALL"]), "flushall").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushall_with_the_library_and_scripts_under_load() {
    let all = Fault::Flush(&["FLUSHALL", "FUNCTION FLUSH", "SCRIPT FLUSH"]);
    for mode in [ScriptMode::Auto, ScriptMode::Eval] {
        fault_under_load(single(), mode, all, "flushall-code").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn function_and_script_flush_under_load_keep_every_state_and_override() {
    let code = Fault::Flush(&["FUNCTION FLUSH", "SCRIPT FLUSH"]);
    for mode in [ScriptMode::Auto, ScriptMode::Eval] {
        fault_under_load(single(), mode, code, "code").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_cluster_master_flushed_under_load() {
    // Data and code gone on every master, one master after the other: a Cluster of its own
    // for each path.
    let all = Fault::Flush(&["FLUSHALL", "FUNCTION FLUSH", "SCRIPT FLUSH"]);
    for mode in [ScriptMode::Auto, ScriptMode::Eval] {
        let cluster = Deployment::Cluster(RedisCluster::start(3));
        fault_under_load(cluster, mode, all, "cluster").await;
    }
}
