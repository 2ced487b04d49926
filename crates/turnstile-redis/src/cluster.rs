//! The connection to a Redis Cluster: one redis-rs Cluster connection shared by every call
//! (it routes by slot, follows `MOVED`/`ASK` and reconnects to nodes itself), and the map from
//! slot to master that lets health be kept per master.
//!
//! No pool: a pool's recycling `PING` goes to every master, so with one master down every
//! call to any key would fail its recycling and build a new Cluster connection.
//!
//! The Cluster client learns a new layout only from what its nodes answer (`MOVED`, a closed
//! connection). A master that stops answering without closing its connections (frozen, or
//! its host gone without a reset) tells it nothing, so its keys would keep going to it after
//! its replica took over. The backend replaces the Cluster connection then (see
//! `RedisBackend::run`): a new one is made in the background — seeds, layout, checks, the
//! library on each master — while the current one keeps serving every other master, and it
//! takes over once ready. Calls in flight finish on the connection they began on.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, FromRedisValue, RedisError, RedisResult, Value};

use crate::call::Call;
use crate::connector::{self, Connect, Held, Slot};
use crate::fault::{Failed, Fault, NoConnection};
use crate::library::{Path, Scripts};
use crate::server::{Query, Refused, ServerChecks};

/// Cluster hash slots.
const SLOTS: u16 = 16384;

/// How old the slot map may grow before a call refreshes it in the background.
const SLOT_MAP_MAX_AGE: Duration = Duration::from_secs(10);

/// The hash slot of `key`: CRC16 (XMODEM) of its hash tag — the part between the first `{`
/// and the next `}`, when not empty — or of the whole key, modulo 16384 (Redis Cluster
/// specification, "Keys distribution model").
pub(crate) fn slot_of(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(key)) % SLOTS
}

/// The masters of the slots, as the Cluster last described them (`CLUSTER SLOTS`).
#[derive(Debug)]
pub(crate) struct SlotMap {
    ranges: RwLock<Vec<(u16, u16, Arc<str>)>>,
    refreshing: AtomicBool,
    born: Instant,
    /// Milliseconds after `born` of the last refresh (`u64::MAX`: never).
    refreshed: AtomicU64,
}

impl SlotMap {
    fn new() -> Self {
        SlotMap {
            ranges: RwLock::new(Vec::new()),
            refreshing: AtomicBool::new(false),
            born: Instant::now(),
            refreshed: AtomicU64::new(u64::MAX),
        }
    }

    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The master of `slot` (`host:port`), if known.
    pub(crate) fn master(&self, slot: u16) -> Option<Arc<str>> {
        let ranges = self.ranges.read().unwrap_or_else(|e| e.into_inner());
        let i = ranges.partition_point(|(_, end, _)| *end < slot);
        ranges
            .get(i)
            .filter(|(start, _, _)| *start <= slot)
            .map(|(_, _, n)| Arc::clone(n))
    }

    /// Each master, with the first slot it serves.
    fn masters(&self) -> Vec<(Arc<str>, u16)> {
        masters_of(&self.ranges.read().unwrap_or_else(|e| e.into_inner()))
    }

    fn is_stale(&self) -> bool {
        let at = self.refreshed.load(Ordering::Relaxed);
        at == u64::MAX || self.elapsed_ms().saturating_sub(at) > SLOT_MAP_MAX_AGE.as_millis() as u64
    }

    async fn refresh(&self, conn: &mut ClusterConnection) -> Result<(), RedisError> {
        self.set(layout(conn).await?);
        Ok(())
    }

    /// Takes `ranges` (sorted) as the layout, unless empty.
    fn set(&self, ranges: Ranges) {
        if !ranges.is_empty() {
            *self.ranges.write().unwrap_or_else(|e| e.into_inner()) = ranges;
        }
        self.refreshed.store(self.elapsed_ms(), Ordering::Relaxed);
    }
}

/// Slot ranges and their masters: `(first slot, last slot, host:port)`.
type Ranges = Vec<(u16, u16, Arc<str>)>;

/// The layout as `conn`'s Cluster describes it now (`CLUSTER SLOTS` of any node), sorted.
async fn layout(conn: &mut ClusterConnection) -> Result<Ranges, RedisError> {
    let mut cmd = redis::cmd("CLUSTER");
    cmd.arg("SLOTS");
    let reply = conn
        .route_command(cmd, RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random))
        .await?;
    let mut ranges = parse_slots(&reply);
    ranges.sort_by_key(|r| r.0);
    Ok(ranges)
}

/// Each master of `ranges`, with the first slot it serves.
fn masters_of(ranges: &Ranges) -> Vec<(Arc<str>, u16)> {
    let mut masters: Vec<(Arc<str>, u16)> = Vec::new();
    for (start, _, m) in ranges {
        if !masters.iter().any(|(n, _)| n == m) {
            masters.push((Arc::clone(m), *start));
        }
    }
    masters
}

/// `host:port` of a seed URL (port 6379 when it names none).
fn seed_addr(url: &str) -> Option<String> {
    let url = redis::parse_redis_url(url)?;
    Some(format!(
        "{}:{}",
        url.host_str()?,
        url.port().unwrap_or(6379)
    ))
}

/// A key in `slot`: its hash tag is the first number whose slot is `slot`.
fn key_in_slot(slot: u16) -> String {
    let tag = (0u32..)
        .find(|n| slot_of(n.to_string().as_bytes()) == slot)
        .unwrap_or_default();
    format!("turnstile:slot-probe:{{{tag}}}")
}

/// The slot ranges and masters of a `CLUSTER SLOTS` reply: `[start, end, [host, port, id],
/// replicas...]` per range.
fn parse_slots(reply: &Value) -> Vec<(u16, u16, Arc<str>)> {
    let Value::Array(ranges) = reply else {
        return Vec::new();
    };
    ranges
        .iter()
        .filter_map(|r| {
            let Value::Array(r) = r else { return None };
            let start = u16::from_redis_value(r.first()?.clone()).ok()?;
            let end = u16::from_redis_value(r.get(1)?.clone()).ok()?;
            let Value::Array(master) = r.get(2)? else {
                return None;
            };
            let host = String::from_redis_value(master.first()?.clone()).ok()?;
            let port = u16::from_redis_value(master.get(1)?.clone()).ok()?;
            Some((start, end, Arc::from(format!("{host}:{port}"))))
        })
        .collect()
}

/// Makes a Cluster client from seed URLs, with the backend's settings (TLS, timeouts).
pub(crate) type MakeClient = Box<dyn Fn(Vec<String>) -> RedisResult<ClusterClient> + Send + Sync>;

/// The shared connection to a Cluster.
pub(crate) struct ClusterConn(Arc<Cluster>);

struct Cluster {
    /// The client of every seed URL.
    client: ClusterClient,
    /// The seed URLs, and how to make a client of some of them.
    seeds: Vec<String>,
    make: MakeClient,
    /// The nodes (`host:port`) a replacement leaves out of its seeds: they count as down,
    /// and a seed that answers nothing costs a connection timeout.
    avoid: Mutex<Vec<String>>,
    /// Bounds the read that tells whether a master answers through a replacement.
    answer_limit: Duration,
    name: String,
    slot: Slot<ClusterConnection>,
    slots: Arc<SlotMap>,
    connects: AtomicU64,
    checks: ServerChecks,
    /// Per master (`host:port`, as the slot map names it): the path its calls take. A
    /// master not in the map (a new one, a promoted replica) loads the library first.
    paths: Mutex<HashMap<Arc<str>, Path>>,
    scripts: Arc<Scripts>,
    /// Bounds each step of making a connection ready: the checks, the layout, the library's
    /// loads (the Cluster client bounds its own connections).
    step_limit: Duration,
}

impl Connect for Cluster {
    type Conn = ClusterConnection;

    fn slot(&self) -> &Slot<ClusterConnection> {
        &self.slot
    }

    fn open(
        &self,
    ) -> impl std::future::Future<Output = Result<ClusterConnection, NoConnection>> + Send {
        Box::pin(self.open_cluster())
    }

    fn attempt_limit(&self) -> Duration {
        // The seeds and then the layout's nodes (each up to a connection timeout), and the
        // steps after.
        self.step_limit.saturating_mul(5)
    }
}

impl ClusterConn {
    /// The connection to the Cluster of `seeds` (URLs), whose clients `make` makes; `client`
    /// is the one of every seed. `step_limit` bounds each step of making a connection
    /// ready, `answer_limit` the read that tells whether a master answers.
    pub(crate) fn new(
        seeds: Vec<String>,
        make: MakeClient,
        name: String,
        scripts: Arc<Scripts>,
        step_limit: Duration,
        answer_limit: Duration,
    ) -> RedisResult<Self> {
        let client = make(seeds.clone())?;
        Ok(ClusterConn(Arc::new(Cluster {
            client,
            seeds,
            make,
            avoid: Mutex::new(Vec::new()),
            answer_limit,
            name,
            slot: Slot::new(),
            slots: Arc::new(SlotMap::new()),
            connects: AtomicU64::new(0),
            checks: ServerChecks::default(),
            paths: Mutex::new(HashMap::new()),
            scripts,
            step_limit,
        })))
    }

    /// Cluster connections made so far.
    pub(crate) fn connects(&self) -> u64 {
        self.0.connects.load(Ordering::Relaxed)
    }

    /// See [`Slot::generation`].
    pub(crate) fn generation(&self) -> u64 {
        self.0.slot.generation()
    }

    /// See [`connector::probe_ready`].
    pub(crate) fn probe_ready(&self) -> bool {
        connector::probe_ready(&self.0)
    }

    /// Makes a new Cluster connection in the background, unless one newer than a call that
    /// began at `started` serves already; the current one serves until it is ready. Its seeds
    /// leave out the nodes of `down` (`host:port`), unless that leaves none.
    pub(crate) fn replace(&self, started: u64, down: Vec<String>) {
        *self
            .0
            .avoid
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = down;
        connector::replace(&self.0, started, false);
    }

    /// Makes the first Cluster connection in the background.
    pub(crate) fn warm(&self) {
        connector::warm(&self.0);
    }

    /// Why there is no connection, when an attempt failed (see [`connector::unconnected`]).
    pub(crate) fn unconnected(&self) -> Option<Failed> {
        connector::unconnected(&*self.0)
    }

    /// The master of `slot` as health names it: `host:port`, or the seed list while the
    /// Cluster's layout is not known yet. Refreshes a stale map in the background.
    pub(crate) fn node_of(&self, slot: u16) -> Arc<str> {
        let c = &*self.0;
        if c.slots.is_stale() {
            self.refresh_in_background();
        }
        c.slots
            .master(slot)
            .unwrap_or_else(|| Arc::from(c.name.as_str()))
    }

    /// Asks the Cluster for its layout again, without making any call wait for it (a
    /// master went down, or is about to be probed: a replica may have taken its slots).
    pub(crate) fn refresh_in_background(&self) {
        let Some(Held { mut conn, .. }) = connector::current(&*self.0) else {
            return;
        };
        let slots = &self.0.slots;
        if slots.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let slots = Arc::clone(slots);
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            slots.refreshing.store(false, Ordering::Release);
            return;
        };
        rt.spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(2), slots.refresh(&mut conn)).await;
            slots.refreshing.store(false, Ordering::Release);
        });
    }

    /// Runs `call`, whose keys are all in `slot`. The Cluster client follows redirections,
    /// reconnects and retries by itself; here only a connection that could not be made and
    /// `NOSCRIPT` are retried, once, before `deadline`. Every command of the call — the
    /// library's or script's load included — goes to the slot's master only (redis-rs would
    /// send `FUNCTION LOAD` and `SCRIPT LOAD` to every node and fail while any is down), so
    /// each master loads the library when a connection is made ready or at its first call
    /// (see [`Scripts::invoke`]).
    ///
    /// # Errors
    /// The last failure, with what it says about the node.
    pub(crate) async fn invoke(
        &self,
        call: &Call,
        slot: u16,
        deadline: tokio::time::Instant,
    ) -> Result<Value, Failed> {
        let c = &*self.0;
        let mut retried = false;
        loop {
            let failed = match connector::get(&self.0, deadline).await {
                Ok(Held { conn, .. }) => {
                    let master = c.slots.master(slot);
                    // A master the map does not know yet: FCALL at once (a missing library
                    // is loaded on "Function not found"), the first load comes once it is.
                    let known = match &master {
                        Some(m) => c.path_of(m),
                        None => Path::Functions,
                    };
                    let mut on = OnSlot { conn, slot };
                    let (result, path) = c.scripts.invoke(&mut on, call, known, &c.name).await;
                    if let (Some(m), true) = (master, path != known) {
                        c.lock_paths().insert(m, path);
                    }
                    match result {
                        Ok(v) => return Ok(v),
                        Err(e) => Failed::call(e, &c.name),
                    }
                }
                Err(f) => f,
            };
            let again = matches!(
                failed.fault,
                Fault::Unreachable | Fault::Rejected | Fault::NoScript
            );
            if retried || !again || tokio::time::Instant::now() >= deadline {
                return Err(failed);
            }
            retried = true;
        }
    }
}

impl Cluster {
    fn lock_paths(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, Path>> {
        self.paths
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn path_of(&self, master: &Arc<str>) -> Path {
        self.lock_paths()
            .get(master)
            .copied()
            .unwrap_or(Path::Unknown)
    }

    /// A client of the seeds that do not count as down, when that leaves some out and some
    /// in.
    fn client_avoiding_down(&self) -> Option<ClusterClient> {
        let avoid = self
            .avoid
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let seeds: Vec<String> = self
            .seeds
            .iter()
            .filter(|u| !seed_addr(u).is_some_and(|a| avoid.contains(&a)))
            .cloned()
            .collect();
        if seeds.is_empty() || seeds.len() == self.seeds.len() {
            return None;
        }
        (self.make)(seeds).ok()
    }

    /// One Cluster connection, checked, with the layout it routes by and the library on
    /// each master.
    async fn open_cluster(&self) -> Result<ClusterConnection, NoConnection> {
        let replacing = connector::current(self).is_some();
        let fewer = replacing.then(|| self.client_avoiding_down()).flatten();
        let mut conn = fewer
            .as_ref()
            .unwrap_or(&self.client)
            .get_async_connection()
            .await
            .map_err(|e| NoConnection::connect(e, &self.name))?;
        // One node's version and eviction policy. A node that cannot tell in time (a frozen
        // one may be among the nodes) is not judged: only a server too old refuses.
        let mut any = RandomNode(&mut conn);
        let checks = self.checks.run(&mut any, &self.name);
        if let Ok(Err(old @ Refused::Version(_))) =
            tokio::time::timeout(self.step_limit, checks).await
        {
            return Err(NoConnection::refused(old, &self.name));
        }
        // The layout, for health per master; the last one known when it cannot be had.
        let ranges = tokio::time::timeout(self.step_limit, layout(&mut conn))
            .await
            .ok()
            .and_then(Result::ok);
        if replacing {
            // A replacement takes over only when it serves every master of its layout.
            self.every_master_answers(&conn, ranges.as_ref()).await?;
        }
        if let Some(ranges) = ranges {
            self.slots.set(ranges);
        }
        self.load_library(&conn).await;
        self.connects.fetch_add(1, Ordering::Relaxed);
        Ok(conn)
    }

    /// Whether every master of `ranges` answers a read of one of its keys through `conn`,
    /// each within the step limit. A master in the layout that answers nothing (frozen, its
    /// host gone, before its replica is promoted) has no connection in a new Cluster
    /// connection, and its keys' calls make the Cluster client ask for the layout again and
    /// reconnect to it while holding up every other master's calls; on the connection being
    /// replaced they only time out. Such a replacement is not taken.
    ///
    /// # Errors
    /// [`NoConnection::Unanswered`] when a master did not answer, or the layout is unknown.
    async fn every_master_answers(
        &self,
        conn: &ClusterConnection,
        ranges: Option<&Ranges>,
    ) -> Result<(), NoConnection> {
        let unanswered = NoConnection::Unanswered(self.answer_limit);
        let ranges = ranges.ok_or_else(|| unanswered.clone())?;
        let mut reads = tokio::task::JoinSet::new();
        for (_, slot) in masters_of(ranges) {
            let mut on = OnSlot {
                conn: conn.clone(),
                slot,
            };
            let limit = self.answer_limit;
            reads.spawn(async move {
                let mut exists = redis::cmd("EXISTS");
                exists.arg(key_in_slot(slot));
                matches!(
                    tokio::time::timeout(limit, on.query(&exists)).await,
                    Ok(Ok(Value::Int(_)))
                )
            });
        }
        while let Some(answered) = reads.join_next().await {
            if !answered.unwrap_or(false) {
                return Err(unanswered);
            }
        }
        Ok(())
    }

    /// Loads the library on every master whose path is not known yet, all at once, each
    /// bounded by the step limit (a master that does not answer in time loads it at its
    /// first call).
    async fn load_library(&self, conn: &ClusterConnection) {
        if self.scripts.path(Path::Unknown) != Path::Unknown {
            return;
        }
        let mut loads = tokio::task::JoinSet::new();
        for (master, slot) in self.slots.masters() {
            if self.path_of(&master) != Path::Unknown {
                continue;
            }
            let scripts = Arc::clone(&self.scripts);
            let (conn, name, limit) = (conn.clone(), self.name.clone(), self.step_limit);
            loads.spawn(async move {
                let mut on = OnSlot { conn, slot };
                let loaded = tokio::time::timeout(limit, scripts.first_load(&mut on, &name)).await;
                (master, loaded)
            });
        }
        while let Some(done) = loads.join_next().await {
            if let Ok((master, Ok(Ok(path)))) = done {
                self.lock_paths().insert(master, path);
            }
        }
    }
}

/// Sends every command of a call to the master of its slot.
struct OnSlot {
    conn: ClusterConnection,
    slot: u16,
}

impl Query for OnSlot {
    fn query(
        &mut self,
        cmd: &Cmd,
    ) -> impl std::future::Future<Output = Result<Value, RedisError>> + Send {
        let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::new(
            self.slot,
            SlotAddr::Master,
        )));
        self.conn.route_command(cmd.clone(), route)
    }
}

/// Sends the server checks' commands to one node of the Cluster.
struct RandomNode<'a>(&'a mut ClusterConnection);

impl Query for RandomNode<'_> {
    fn query(
        &mut self,
        cmd: &Cmd,
    ) -> impl std::future::Future<Output = Result<Value, RedisError>> + Send {
        self.0.route_command(
            cmd.clone(),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_cluster_specification() {
        // Values of CLUSTER KEYSLOT.
        assert_eq!(slot_of(b"123456789"), 12739);
        assert_eq!(slot_of(b"foo"), 12182);
        assert_eq!(slot_of(b"{user1000}.following"), slot_of(b"user1000"));
        assert_ne!(slot_of(b"foo{}{bar}"), slot_of(b"bar"));
        assert_eq!(slot_of(b"foo{{bar}}zap"), slot_of(b"{bar"));
        assert_eq!(slot_of(b"t:v1:{abc}:p"), slot_of(b"t:v1:{abc}~cfg"));
    }

    #[test]
    fn seeds_are_named_as_the_layout_names_nodes() {
        assert_eq!(
            seed_addr("redis://127.0.0.1:7000").as_deref(),
            Some("127.0.0.1:7000")
        );
        assert_eq!(
            seed_addr("rediss://user:pw@10.0.0.2/3").as_deref(),
            Some("10.0.0.2:6379")
        );
        assert_eq!(seed_addr("not a url"), None);
    }

    #[test]
    fn a_key_is_found_for_every_slot() {
        for slot in [0, 1, 5460, 12182, 16383] {
            assert_eq!(slot_of(key_in_slot(slot).as_bytes()), slot);
        }
    }

    #[test]
    fn the_slot_map_finds_each_slots_master() {
        let s = |v: &str| Value::BulkString(v.as_bytes().to_vec());
        let range = |a: i64, b: i64, port: i64| {
            Value::Array(vec![
                Value::Int(a),
                Value::Int(b),
                Value::Array(vec![s("127.0.0.1"), Value::Int(port), s("id")]),
            ])
        };
        let reply = Value::Array(vec![
            range(10923, 16383, 7002),
            range(0, 5460, 7000),
            range(5461, 10922, 7001),
        ]);
        let map = SlotMap::new();
        let mut parsed = parse_slots(&reply);
        parsed.sort_by_key(|r| r.0);
        *map.ranges.write().unwrap() = parsed;
        assert_eq!(map.master(0).as_deref(), Some("127.0.0.1:7000"));
        assert_eq!(map.master(5460).as_deref(), Some("127.0.0.1:7000"));
        assert_eq!(map.master(5461).as_deref(), Some("127.0.0.1:7001"));
        assert_eq!(map.master(16383).as_deref(), Some("127.0.0.1:7002"));
        assert_eq!(SlotMap::new().master(1), None);
    }
}
