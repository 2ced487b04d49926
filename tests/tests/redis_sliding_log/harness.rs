//! The harness of the sliding-log traces (see main.rs).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use turnstile_core::{Backend, Decision, Limits, MemoryBackend, Policy, Quotas, Unconfigured};
use turnstile_redis::{redis, RedisBackend, ScriptMode};
use turnstile_tests::redis_server::{RedisCluster, RedisServer};
use turnstile_tests::state_string::f4_problem;

/// 2^53 − 1: the largest time and cost the contract accepts.
pub(crate) const MAX_EXACT: u64 = (1 << 53) - 1;

/// Every policy name the traces use (each may be a sliding log in some set).
pub(crate) const NAMES: [&str; 4] = ["a", "b", "c", ODD];

/// A policy name of every kind of character a Lua pattern or format treats specially.
pub(crate) const ODD: &str = "d %1|x.-+*?[^$]()%% 0";

pub(crate) fn p(spec: &str) -> Policy {
    spec.parse().unwrap()
}

pub(crate) fn backend(url: &str, test: &str, mode: ScriptMode, cluster: bool) -> RedisBackend {
    RedisBackend::builder(url)
        .prefix(format!(
            "turnstile:test:slr:{test}:{:?}:{}",
            mode,
            std::process::id()
        ))
        .cluster(cluster)
        .script_mode(mode)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// A decision without its configuration's version (the fast key's configuration hash is
/// dropped, as it expires, so its version restarts).
pub(crate) fn nv(d: Decision) -> Decision {
    let applied = d.applied().clone();
    d.with_applied(applied, 0)
}

/// Where a client key's Redis keys live, and one connection per node.
pub(crate) struct Raw {
    /// The single server's URL, or each Cluster node's.
    urls: Vec<String>,
    cluster: Option<RedisCluster>,
    conns: HashMap<usize, redis::aio::MultiplexedConnection>,
}

/// Reads a client key's state string, its expiry, and each name's log key (type, entries,
/// expiry) in one call (all keys share the client's hash tag).
pub(crate) const SNAPSHOT: &str = r"
local out = {}
local s = redis.pcall('GET', KEYS[1])
if type(s) == 'string' then out[1] = s else out[1] = '' end
out[2] = string.format('%d', redis.call('PEXPIRETIME', KEYS[1]))
for i = 2, #KEYS do
  local k = KEYS[i]
  local ty = redis.call('TYPE', k).ok
  local e = ''
  if ty == 'list' then e = table.concat(redis.call('LRANGE', k, 0, -1), ',') end
  out[#out + 1] = ty
  out[#out + 1] = e
  out[#out + 1] = string.format('%d', redis.call('PEXPIRETIME', k))
end
return out
";

/// What Redis holds for one client key.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Stored {
    /// The state string, '' when there is none.
    pub(crate) string: String,
    /// Its PEXPIRETIME (-2: no key, -1: no expiry).
    pub(crate) expires: i64,
    /// Per name of NAMES: the log key's type, its entries joined by ',', its PEXPIRETIME.
    pub(crate) logs: Vec<(String, String, i64)>,
}

impl Raw {
    pub(crate) fn single(server: &RedisServer) -> Raw {
        Raw {
            urls: vec![server.url()],
            cluster: None,
            conns: HashMap::new(),
        }
    }

    pub(crate) fn cluster(cluster: RedisCluster) -> Raw {
        Raw {
            urls: cluster.nodes().iter().map(|n| n.url()).collect(),
            cluster: Some(cluster),
            conns: HashMap::new(),
        }
    }

    pub(crate) fn seed_url(&self) -> String {
        self.urls.join(",")
    }

    pub(crate) async fn conn(&mut self, key: &str) -> &mut redis::aio::MultiplexedConnection {
        let i = match &self.cluster {
            // By the key's hash tag alone (a policy name may hold spaces).
            Some(c) => {
                let from = key.find('{').unwrap();
                let to = from + key[from..].find('}').unwrap();
                c.node_of_key(&key[from..=to])
            }
            None => 0,
        };
        if !self.conns.contains_key(&i) {
            let client = redis::Client::open(self.urls[i].as_str()).unwrap();
            let conn = client.get_multiplexed_async_connection().await.unwrap();
            self.conns.insert(i, conn);
        }
        self.conns.get_mut(&i).unwrap()
    }

    pub(crate) async fn cmd(
        &mut self,
        key: &str,
        cmd: &redis::Cmd,
    ) -> redis::RedisResult<redis::Value> {
        cmd.query_async(self.conn(key).await).await
    }

    pub(crate) async fn snapshot(&mut self, keys: &Keys) -> Stored {
        let mut c = redis::cmd("EVAL");
        c.arg(SNAPSHOT).arg(1 + NAMES.len()).arg(&keys.string);
        for l in &keys.logs {
            c.arg(l);
        }
        let v: Vec<String> = c.query_async(self.conn(&keys.string).await).await.unwrap();
        let logs = v[2..]
            .chunks(3)
            .map(|c| (c[0].clone(), c[1].clone(), c[2].parse().unwrap()))
            .collect();
        Stored {
            string: v[0].clone(),
            expires: v[1].parse().unwrap(),
            logs,
        }
    }
}

/// A client key's Redis keys.
pub(crate) struct Keys {
    pub(crate) string: String,
    pub(crate) cfg: String,
    pub(crate) logs: Vec<String>,
}

pub(crate) fn keys_of(b: &RedisBackend, client: &str) -> Keys {
    let string = b.state_key(client);
    let base = string.strip_suffix(":f4").unwrap().to_string();
    let logs = NAMES.iter().map(|n| format!("{base}~log:f4:{n}")).collect();
    Keys {
        cfg: format!("{base}~cfg"),
        string,
        logs,
    }
}

/// What is wrong with one key's stored state as the scripts must leave it, or None: a
/// well-formed string; every sliding log with a line in it a list expiring with the string,
/// its entries "time:cost" strictly increasing in time, none after the line's update, each
/// cost at least 1, adding up to the line's total.
pub(crate) fn stored_problem(s: &Stored, slack: i64) -> Option<String> {
    if s.string.is_empty() {
        return None;
    }
    if let Some(p) = f4_problem(s.string.as_bytes()) {
        return Some(p);
    }
    for line in s.string.split('\n').skip(1) {
        let (state, name) = line.split_once('\t').unwrap();
        if !state.starts_with("5.") {
            continue;
        }
        let nums: Vec<u64> = state
            .split('|')
            .skip(1)
            .map(|n| n.parse().unwrap())
            .collect();
        let (updated, total) = (nums[0], nums[1]);
        let i = NAMES.iter().position(|n| *n == name).unwrap();
        let (ty, entries, expires) = &s.logs[i];
        if total == 0 && ty == "none" {
            // Emptied by a refund made before the clock reached the state's update: kept
            // (with its time) until the clock passes it, its list gone with its entries.
            continue;
        }
        if ty != "list" {
            return Some(format!("{name}: the log is a {ty}"));
        }
        // Given the string's TTL right after the string (Redis 7.0 reads its clock per
        // command, so a millisecond may pass in between): never before the string.
        if *expires < s.expires || *expires > s.expires + slack {
            return Some(format!(
                "{name}: the log expires at {expires}, the string at {}",
                s.expires
            ));
        }
        let mut sum = 0;
        let mut last = None;
        for e in entries.split(',') {
            let (t, c) = e.split_once(':').unwrap();
            let (t, c): (u64, u64) = (t.parse().unwrap(), c.parse().unwrap());
            if c == 0 || t > updated || last.is_some_and(|l| l >= t) {
                return Some(format!("{name}: entry {e} (update {updated}) in {entries}"));
            }
            last = Some(t);
            sum += c;
        }
        if sum != total {
            return Some(format!(
                "{name}: entries {entries} add up to {sum}, not {total}"
            ));
        }
    }
    None
}

/// The policy sets of the traces: sliding logs alone, first, in the middle and last among
/// buckets and windows that deny while the log admits and the reverse, two logs in a set,
/// logs whose period is above the least TTL (600 s with explicit times: their TTL shows),
/// and the same names under other parameters and other algorithms (carry-over).
pub(crate) fn sets() -> Vec<Vec<Policy>> {
    vec![
        vec![p("sliding-log:limit=5,period=1s,name=a")],
        vec![p("sliding-log:limit=3,period=20m,name=a")],
        vec![
            p("token-bucket:limit=2,period=1s,burst=3,name=b"),
            p("sliding-log:limit=6,period=2s,name=a"),
        ],
        vec![
            p("sliding-log:limit=4,period=1s,name=a"),
            p("fixed-window:limit=3,period=700ms,name=b"),
            p("sliding-window:limit=5,period=900ms,name=c"),
        ],
        vec![
            p("gcra:limit=5,period=1s,burst=2,name=b"),
            p("sliding-log:limit=8,period=15m,name=a"),
            p("leaky-bucket:limit=3,period=1s,burst=4,name=c"),
        ],
        vec![p("sliding-log:limit=1,period=500ms,name=a")],
        vec![
            p("sliding-log:limit=2,period=1s,name=a"),
            p("sliding-log:limit=5,period=3s,name=c"),
        ],
        vec![p("token-bucket:limit=3,period=1s,burst=5,name=a")],
        vec![p("sliding-log:limit=5,period=2s,name=a")],
        vec![p("sliding-log:limit=10,period=1s,name=a")],
        vec![
            p("fixed-window:limit=4,period=1s,name=a"),
            p("sliding-log:limit=3,period=12m,name=b"),
        ],
        vec![
            p("sliding-log:limit=285616,period=365d,name=a"),
            p("sliding-log:limit=7,period=1500ms,name=b"),
        ],
        vec![
            p("token-bucket:limit=4,period=1s,name=a"),
            p("sliding-log:limit=3,period=1s").with_name(ODD).unwrap(),
            p("sliding-log:limit=5,period=14m").with_name("b").unwrap(),
        ],
        vec![
            p("sliding-window:limit=3,period=1s,name=a"),
            p("sliding-log:limit=2,period=11m,name=c"),
            p("sliding-log:limit=4,period=800ms,name=b"),
        ],
    ]
}

/// The periods of the sliding logs of a policy set.
pub(crate) fn log_periods(set: &[Policy]) -> Vec<u64> {
    set.iter()
        .filter(|p| p.to_string().starts_with("sliding-log"))
        .map(|p| p.period_ms())
        .collect()
}

/// One run of a pseudo-random trace (see the module's comment).
pub(crate) struct Trace {
    pub(crate) b: RedisBackend,
    pub(crate) raw: Raw,
    pub(crate) memory: MemoryBackend,
    pub(crate) seed: u64,
    /// The largest real time one step's two Redis calls took, in ms.
    pub(crate) slack: i64,
}

impl Trace {
    pub(crate) fn next(&mut self, n: u64) -> u64 {
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        self.seed % n
    }

    /// Compares what Redis holds at the fast key and at the general key of `client`.
    pub(crate) async fn compare_stored(&mut self, client: &str, ctx: &str) -> Stored {
        let (ka, kb) = (
            keys_of(&self.b, &format!("A-{client}")),
            keys_of(&self.b, &format!("B-{client}")),
        );
        let a = self.raw.snapshot(&ka).await;
        let b = self.raw.snapshot(&kb).await;
        if let Some(e) = stored_problem(&a, self.slack) {
            panic!("{ctx}: fast key: {e}\n{a:?}");
        }
        if let Some(e) = stored_problem(&b, self.slack) {
            panic!("{ctx}: general key: {e}\n{b:?}");
        }
        assert_eq!(
            a.string.get(1..),
            b.string.get(1..),
            "{ctx}: the state strings"
        );
        if !b.string.is_empty() {
            assert!(b.string.starts_with('c'), "{ctx}: {b:?}");
        }
        let close =
            |x: i64, y: i64| (x < 0 && x == y) || (x >= 0 && y >= 0 && (x - y).abs() <= self.slack);
        assert!(
            close(a.expires, b.expires),
            "{ctx}: expiry {} vs {} (slack {})",
            a.expires,
            b.expires,
            self.slack
        );
        for (i, (la, lb)) in a.logs.iter().zip(&b.logs).enumerate() {
            assert_eq!((&la.0, &la.1), (&lb.0, &lb.1), "{ctx}: log {}", NAMES[i]);
            assert!(
                close(la.2, lb.2),
                "{ctx}: log {} expiry {} vs {} (slack {})",
                NAMES[i],
                la.2,
                lb.2,
                self.slack
            );
        }
        a
    }

    pub(crate) async fn run(mut self, steps: usize) {
        let sets = sets();
        let clients = ["x", "y"];
        let mut limits = Limits::new(sets[0].clone()).unwrap();
        let mut t: u64 = 1_700_000_000_000;
        // Per client: configured (an override or a tier), its recent admissions' times, the
        // remaining of its last decision.
        let mut configured: HashMap<&str, (bool, bool)> = HashMap::new();
        let mut admitted: HashMap<&str, Vec<u64>> = HashMap::new();
        let mut remaining: HashMap<&str, u64> = HashMap::new();
        let mut history: HashMap<&str, Vec<String>> = HashMap::new();
        // The general key gets a version (a refund of nothing), and so do the others.
        for c in clients {
            let (a, b) = (format!("A-{c}"), format!("B-{c}"));
            self.b.refund(&a, &limits, 0, Some(t)).await.unwrap();
            self.b.refund(&b, &limits, 0, Some(t)).await.unwrap();
            self.memory.refund(c, &limits, 0, Some(t)).await.unwrap();
        }
        let (mut fast_eligible, mut admissions, mut counts) = (0u32, 0u32, [0u32; 10]);
        for i in 0..steps {
            // Time: mostly the same millisecond, sometimes a few ms or a period on, an
            // entry's exact expiry (now - t = P, or a ms either side), or back.
            let client = clients[self.next(2) as usize];
            let periods = log_periods(limits.defaults());
            match self.next(100) {
                0..=54 => {}
                55..=74 => t += self.next(4),
                75..=86 => t += self.next(400),
                87..=90 => t += self.next(3_000),
                91..=96 => {
                    let times = admitted.get(client).cloned().unwrap_or_default();
                    if let (Some(&s), false) = (
                        times.get(self.next(times.len().max(1) as u64) as usize),
                        periods.is_empty(),
                    ) {
                        let period = periods[self.next(periods.len() as u64) as usize];
                        let target = s + period + self.next(3) - 1;
                        t = t.max(target);
                    }
                }
                _ => t = t.saturating_sub(self.next(1_500)),
            }
            let cap = limits.defaults()[0].capacity();
            let rem = remaining.get(client).copied().unwrap_or(1);
            let cost = [
                0,
                1,
                1,
                1,
                1,
                1,
                1,
                1,
                2,
                2,
                3,
                rem,
                rem,
                rem,
                rem + 1,
                cap,
                cap + 1,
                MAX_EXACT,
            ][self.next(18) as usize];
            let op = match self.next(200) {
                0..=139 => 0,
                140..=157 => 1,
                158..=167 => 2,
                168..=171 => 3,
                172 => 4,
                173..=178 => 5,
                179..=182 => 6,
                183..=186 => 7,
                187..=189 => 8,
                _ => 9,
            };
            counts[op] += 1;
            let ctx = format!("step {i} op {op} client {client} t={t} cost={cost}");
            let (a, b) = (format!("A-{client}"), format!("B-{client}"));
            let ka = keys_of(&self.b, &a);
            let conf = configured.entry(client).or_default();
            if !conf.0 && !conf.1 {
                // Nothing configured: the fast key's version-only hash is dropped, as it
                // expires (after a day), so the fast path may decide it again.
                self.raw
                    .cmd(&ka.cfg, redis::cmd("DEL").arg(&ka.cfg))
                    .await
                    .unwrap();
            }
            let before = self.raw.snapshot(&ka).await;
            let started = Instant::now();
            let decisions: Option<(Decision, Decision, Decision)> = match op {
                0 | 2 | 9 => {
                    let cost = if op == 2 { 0 } else { cost };
                    if op == 0
                        && cost > 0
                        && (before.string.starts_with('0') || before.string.is_empty())
                        && !conf.0
                        && !conf.1
                    {
                        fast_eligible += 1;
                    }
                    let ga = self.b.check_limits(&a, &limits, cost, Some(t)).await;
                    let gb = self.b.check_limits(&b, &limits, cost, Some(t)).await;
                    let want = self
                        .memory
                        .check_limits(client, &limits, cost, Some(t))
                        .into_inner()
                        .unwrap();
                    Some((
                        ga.unwrap_or_else(|e| panic!("{ctx}: fast key: {e}")),
                        gb.unwrap_or_else(|e| panic!("{ctx}: general key: {e}")),
                        want,
                    ))
                }
                1 => {
                    let ga = self.b.refund(&a, &limits, cost, Some(t)).await;
                    let gb = self.b.refund(&b, &limits, cost, Some(t)).await;
                    let want = self
                        .memory
                        .refund(client, &limits, cost, Some(t))
                        .await
                        .unwrap();
                    Some((ga.unwrap(), gb.unwrap(), want))
                }
                3 => {
                    let ga = self.b.reset(&a, &limits, Some(t)).await;
                    let gb = self.b.reset(&b, &limits, Some(t)).await;
                    let want = self.memory.reset(client, &limits, Some(t)).await.unwrap();
                    Some((ga.unwrap(), gb.unwrap(), want))
                }
                4 => {
                    let set = sets[self.next(sets.len() as u64) as usize].clone();
                    self.b.set_override(&a, &set).await.unwrap();
                    self.b.set_override(&b, &set).await.unwrap();
                    self.memory.set_override(client, &set).await.unwrap();
                    conf.0 = true;
                    None
                }
                5 => {
                    // The override removed, and the tier too.
                    self.b.remove_override(&a).await.unwrap();
                    self.b.remove_override(&b).await.unwrap();
                    self.memory.remove_override(client).await.unwrap();
                    self.b.set_tier(&a, None).await.unwrap();
                    self.b.set_tier(&b, None).await.unwrap();
                    self.memory.set_tier(client, None).await.unwrap();
                    *conf = (false, false);
                    None
                }
                6 => {
                    let tier = ["pro", "free", "gold"][self.next(3) as usize];
                    let tier = (self.next(3) == 0).then_some(tier);
                    self.b.set_tier(&a, tier).await.unwrap();
                    self.b.set_tier(&b, tier).await.unwrap();
                    self.memory.set_tier(client, tier).await.unwrap();
                    conf.1 = tier.is_some();
                    None
                }
                7 => {
                    // A redeploy: other parameters or algorithms under the same names.
                    let n = sets.len() as u64;
                    let d = sets[self.next(n) as usize].clone();
                    limits = Limits::new(d)
                        .unwrap()
                        .with_tier("pro", sets[self.next(n) as usize].clone())
                        .unwrap()
                        .with_tier("free", sets[self.next(n) as usize].clone())
                        .unwrap()
                        .when_unconfigured(Unconfigured::Defaults);
                    None
                }
                _ => {
                    // A log left without its line (a policy dropped from the set, its state
                    // no longer in use) expires: deleted on both keys.
                    let kb = keys_of(&self.b, &b);
                    for (k, s) in [(&ka, &before), (&kb, &self.raw.snapshot(&kb).await)] {
                        for (j, name) in NAMES.iter().enumerate() {
                            let lined = s.string.contains(&format!("\t{name}\n"))
                                || s.string.ends_with(&format!("\t{name}"));
                            if !lined {
                                let log = k.logs[j].clone();
                                self.raw
                                    .cmd(&log, redis::cmd("DEL").arg(&log))
                                    .await
                                    .unwrap();
                            }
                        }
                    }
                    None
                }
            };
            history.entry(client).or_default().push(format!(
                "{ctx} limits {:?} conf {conf:?} -> {:?}",
                limits
                    .defaults()
                    .iter()
                    .map(|p| p.to_string())
                    .collect::<Vec<_>>(),
                decisions.as_ref().map(|d| (d.2.allowed(), d.2.remaining()))
            ));
            let took = started.elapsed().as_millis() as i64 + 2;
            self.slack = self.slack.max(took);
            if let Some((ga, gb, want)) = decisions {
                if nv(ga.clone()) != nv(want.clone()) || nv(gb.clone()) != nv(want.clone()) {
                    let h = history.get(client).cloned().unwrap_or_default();
                    panic!(
                        "{ctx}: history:\n{}\nfast key {:?}\ngeneral key {:?}\nmemory {:?}\nstored {before:?}",
                        h.join("\n"), nv(ga), nv(gb), nv(want)
                    );
                }
                remaining.insert(client, want.remaining());
                if op != 1 && op != 3 && cost > 0 && want.allowed() {
                    admissions += 1;
                    let v = admitted.entry(client).or_default();
                    v.push(t);
                    if v.len() > 12 {
                        v.remove(0);
                    }
                }
            }
            self.compare_stored(client, &ctx).await;
        }
        eprintln!(
            "operations by kind {counts:?}; {admissions} admissions; {fast_eligible} checks the \
             fast path could decide; slack {} ms",
            self.slack
        );
        assert!(fast_eligible as usize > steps / 5, "{fast_eligible}");
        self.b.delete_prefix().await.unwrap();
    }
}
