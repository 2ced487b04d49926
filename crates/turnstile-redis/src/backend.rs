//! [`RedisBackend`]: one atomic script call per decision, with a timeout and node health.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::time::Instant;
use turnstile_core::policy::MAX_EXACT;
use turnstile_core::{
    check_key_len, Backend, BackendError, CheckResult, Clock, Decision, KeyConfig, Limits, Policy,
    SystemClock, Unconfigured,
};

use crate::call::{Call, Which};
use crate::cluster::{slot_of, ClusterConn};
use crate::coalesce::{Lanes, Pair};
use crate::fault::{redis_error, Failed, Fault};
use crate::health::{Attempt, Change, Health, HealthConfig, NodeDown, NodeHealth};
use crate::keys::{config_key, KeyEncoding};
use crate::library::Scripts;
use crate::target::Target;
use crate::wire::{array, check_args, parse_config, parse_reply, Op, Sets};

/// The least TTL of a key written with an explicit (simulation) time: 10 minutes. Trace
/// times are not the server's time, so a TTL derived from them could expire state mid-run.
pub const SIMULATION_MIN_TTL: Duration = Duration::from_secs(600);

/// How long a check that timed out is still awaited for its late reply, to refund what the
/// script charged after its caller gave up: 30 s. A reply later than that (a server frozen
/// longer) is not waited for, and its charge stays: the connection it was on is let go
/// rather than held open for a reply that may never come (a connection gone silent).
pub(crate) const LATE_REPLY_WAIT: Duration = Duration::from_secs(30);

/// A [`Backend`] in Redis — a single node, a Cluster, or the primary Redis Sentinel names
/// (feature `sentinel`) — so every process of a fleet enforces one limit.
///
/// Each check is **one** call of the check function (composed from the files in `lua/`) whose
/// keys are all in one Cluster slot: all-or-nothing and atomic across every process. On Redis
/// 7 the call is an `FCALL` of turnstile's Redis Function library
/// ([`library`](crate::library())), loaded with `FUNCTION LOAD` once per node, so the Lua's
/// definitions run once, not on every call; where Functions are refused (Redis before 7.0,
/// an ACL, a proxy) it is an `EVALSHA` of the same Lua (see [`ScriptMode`](crate::ScriptMode)).
/// A library or script lost to a restart, a failover or a flush (`FUNCTION FLUSH`, `SCRIPT
/// FLUSH`) is loaded again and the call made once more. At its first load on a node the
/// backend deletes the libraries of older releases, never a newer one's, so a rolling deploy
/// works both ways. Time comes from the Redis server's `TIME`, so nodes with skewed clocks
/// agree.
///
/// Keys are `<prefix>:{<client key>}:<policy name>` (see [`KeyEncoding`]); each carries a TTL
/// equal to its `reset_after` rounded up, so idle keys cost no memory. The stored state
/// records a fingerprint of the policy's parameters: when a policy changes, its keys start
/// fresh.
///
/// Every call is bounded by a timeout ([`DEFAULT_TIMEOUT`](crate::DEFAULT_TIMEOUT)); a
/// timeout fails only the request that timed out. A call that provably did not run the script
/// (no connection could be made; the node answered `READONLY`, `LOADING` or `MASTERDOWN`, as a
/// demoted primary does) is retried once on a fresh connection within the same timeout; one
/// that may have run (a timeout, a connection lost after the write) never is, so nothing is
/// charged twice. A node counts as down only on evidence — several failed rounds in a row
/// ([`failure_threshold`](crate::RedisBackendBuilder::failure_threshold)), per master on a
/// Cluster — and then its checks fail fast with a [`BackendError::Connection`] holding
/// [`NodeDown`] until, after the retry interval
/// ([`DEFAULT_RETRY_INTERVAL`](crate::DEFAULT_RETRY_INTERVAL)), one check probes it back —
/// on a connection made since, never on the one that failed it; a node whose failures only
/// said it is away for a moment (refused or closed connections, `READONLY`, `LOADING`) is
/// probed again within 5 to 100 ms instead. A connection that stops answering without being
/// closed (a lost NAT entry, a frozen host) is replaced once calls on it time out round after
/// round, and on a Cluster the new connection takes over only when every master answers
/// through it. Connections are made in the background, one attempt at a time, and the
/// backend starts warming up (connect, check, load the library) as it is built inside a
/// Tokio runtime, so a first burst finds it ready.
/// What a request gets then is the caller's failure policy (`turnstile_core::FailurePolicy`:
/// the tower layer falls back to a local limiter by default); the local deny cache is
/// `turnstile_core::wrap::DenyCache`.
/// An endpoint that answers something other than the Redis protocol (an HTTP server on the
/// Redis port) is a [`BackendError::Connection`] saying "not a Redis server at `<node>`".
///
/// Everything read from Redis is parsed strictly (see `lua/prelude.lua`): a key holding
/// anything the scripts do not write — a hand edit, `0x10`, `1e3`, a key of another type —
/// is a [`BackendError::InvalidState`] naming it. `Quotas::reset` forgets whatever a key's
/// policies' state holds, and `Quotas::clear_config` whatever its configuration holds (a
/// configuration that cannot be read fails every other operation, a reset included, since
/// which policies apply is unknown).
///
/// Each new connection checks the server: one older than
/// [`MIN_REDIS_VERSION`](crate::MIN_REDIS_VERSION) is refused with
/// [`UnsupportedRedisVersion`](crate::UnsupportedRedisVersion) (logged once), and a
/// `maxmemory-policy` other than `noeviction`, which would silently evict limiter state, is
/// warned about once (when the server lets us read it).
///
/// # Examples
/// ```no_run
/// use std::time::Duration;
/// use turnstile_core::{Backend, Policy};
/// use turnstile_redis::RedisBackend;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let redis = RedisBackend::builder("redis://127.0.0.1:6379")
///     .timeout(Duration::from_millis(50))
///     .build()?;
/// let per_key = Policy::gcra(100, Duration::from_secs(60))?.with_name("per-key")?;
/// let decision = redis.check("api-key-123", &[per_key], 1).await?;
/// println!("allowed: {}, remaining: {}", decision.allowed(), decision.remaining());
/// # Ok(()) }
/// ```
pub struct RedisBackend<C = SystemClock> {
    pub(crate) inner: Arc<Inner<C>>,
}

impl<C> Clone for RedisBackend<C> {
    fn clone(&self) -> Self {
        RedisBackend {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<C> fmt::Debug for RedisBackend<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("cluster", &matches!(self.inner.target, Target::Cluster(_)))
            .field("prefix", &self.inner.prefix)
            .field("keys", &self.inner.keys)
            .field("timeout", &self.inner.timeout)
            .finish_non_exhaustive()
    }
}

pub(crate) struct Inner<C> {
    pub(crate) target: Target,
    /// The library and scripts, and how they run.
    pub(crate) scripts: Arc<Scripts>,
    pub(crate) prefix: String,
    pub(crate) keys: KeyEncoding,
    /// The longest client key taken, in bytes.
    pub(crate) max_key_bytes: usize,
    /// The node(s) as logs and errors name them: the URLs without credentials.
    pub(crate) node: String,
    pub(crate) timeout: Duration,
    /// How long a call with no timeout of its own waits for a connection: the longer of
    /// the timeout and the connection timeout.
    pub(crate) connect_wait: Duration,
    pub(crate) retry_interval: Duration,
    /// Times the retry interval.
    pub(crate) clock: C,
    pub(crate) health_config: HealthConfig,
    /// Per node: whether it counts as down.
    pub(crate) health: Health,
    /// A single node's entry in `health`, looked up once.
    pub(crate) single_health: OnceLock<Arc<NodeHealth>>,
    pub(crate) stats: Counters,
    /// The lanes of coalesced checks (`None`: coalescing is off).
    pub(crate) lanes: Option<Lanes>,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) redis_calls: AtomicU64,
    pub(crate) checks: AtomicU64,
    pub(crate) batches: AtomicU64,
    late_refunds: AtomicU64,
}

/// What a [`RedisBackend`] has done since it was built (all clones together).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisStats {
    /// Script calls sent to Redis: checks (alone or several in one call), refunds, resets.
    pub redis_calls: u64,
    /// Checks sent to Redis, each check of a call that carried several counted once (see
    /// [`coalesce`](crate::RedisBackendBuilder::coalesce)), and again when a call left it
    /// undecided and the next one carried it: with `redis_calls`, how many decisions one
    /// call made.
    pub checks: u64,
    /// Calls that carried several checks of one client key (see
    /// [`coalesce`](crate::RedisBackendBuilder::coalesce)).
    pub batches: u64,
    /// `FUNCTION LOAD`s of the Function library and `SCRIPT LOAD`s of the `EVALSHA` scripts
    /// sent: the first call on each node (or each new connection to a single node) and each
    /// reload after a restart, a failover or a flush (see
    /// [`ScriptMode`](crate::ScriptMode)).
    pub script_loads: u64,
    /// Connections made (single node or Sentinel: multiplexed connections, each replacing a
    /// closed one or one to a node that could not serve; Cluster: Cluster connections).
    pub connects: u64,
    /// Checks that timed out, whose script Redis ran after all and charged, refunded when
    /// the late reply arrived (the caller had already given up on them).
    pub late_refunds: u64,
}

impl<C: Clock> RedisBackend<C> {
    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// The Redis node(s) this backend talks to, as errors and logs name them (the URLs
    /// without credentials).
    pub fn node(&self) -> &str {
        &self.inner.node
    }

    /// The Redis key of `client_key`'s state string, `<prefix>:{<tag>}:f4`: one string
    /// holding the state of every policy of the client key (see the README's "Keys").
    pub fn state_key(&self, client_key: &str) -> String {
        self.inner
            .keys
            .states_key_of(&self.inner.prefix, client_key)
    }

    /// The Redis key of the list that holds `policy`'s log for `client_key`,
    /// `<prefix>:{<tag>}~log:f4:<policy name>`, when `policy` is a
    /// [`SlidingLog`](turnstile_core::Algorithm::SlidingLog); `None` for any other algorithm
    /// (its state is all in the state string, see [`state_key`](Self::state_key)).
    pub fn sliding_log_key(&self, client_key: &str, policy: &Policy) -> Option<String> {
        (policy.algorithm() == turnstile_core::Algorithm::SlidingLog).then(|| {
            self.inner
                .keys
                .log_key_of(&self.inner.prefix, client_key, policy.name())
        })
    }

    /// What this backend has done since it was built: Redis calls, connections made.
    pub fn stats(&self) -> RedisStats {
        RedisStats {
            redis_calls: self.inner.stats.redis_calls.load(Ordering::Relaxed),
            checks: self.inner.stats.checks.load(Ordering::Relaxed),
            batches: self.inner.stats.batches.load(Ordering::Relaxed),
            late_refunds: self.inner.stats.late_refunds.load(Ordering::Relaxed),
            script_loads: self.inner.scripts.loads(),
            connects: self.inner.target.connects(),
        }
    }

    /// The nodes that count as down now (see
    /// [`failure_threshold`](crate::RedisBackendBuilder::failure_threshold)), sorted: the
    /// node's name on a single node, `host:port` of each master on a Cluster.
    pub fn nodes_down(&self) -> Vec<String> {
        self.inner.health.down()
    }

    /// Runs one call of the check script on Redis only: no timeout, no node health.
    /// Returns the time the script used and the decision.
    pub(crate) async fn call(
        &self,
        key: &str,
        sets: Sets<'_>,
        op: Op,
        cost: u64,
        now_ms: Option<u64>,
    ) -> Result<(u64, Decision), BackendError> {
        check_key_len(key, self.inner.max_key_bytes)?;
        let state_key = self.inner.keys.states_key_of(&self.inner.prefix, key);
        let deadline = Instant::now() + self.inner.connect_wait;
        self.call_on_node(&state_key, sets, op, cost, now_ms, deadline)
            .await
            .map_err(|f| f.error)
    }

    /// [`Self::call`] for the client whose state string is `state_key`, telling what a
    /// failure says about the node; nothing is sent after `deadline`.
    pub(crate) async fn call_on_node(
        &self,
        state_key: &str,
        sets: Sets<'_>,
        op: Op,
        cost: u64,
        now_ms: Option<u64>,
        deadline: Instant,
    ) -> Result<(u64, Decision), Failed> {
        if now_ms.is_some_and(|t| t > MAX_EXACT) {
            return Err(Failed::local(BackendError::InvalidRequest(
                "the time must be at most 2^53 − 1 ms".into(),
            )));
        }
        let mut inv = Call::new(Which::Check, self.inner.scripts.function(Which::Check), 1);
        // One key: the client's state string (its configuration hash, in the same slot, is
        // derived from it by the script when it must be read).
        inv.key(state_key);
        check_args(&mut inv, sets, op, cost, now_ms, min_ttl(now_ms));
        self.inner.stats.redis_calls.fetch_add(1, Ordering::Relaxed);
        if op == Op::Check {
            self.inner.stats.checks.fetch_add(1, Ordering::Relaxed);
        }
        let reply: redis::Value = self.inner.target.invoke(&inv, state_key, deadline).await?;
        let request = |error| Failed {
            error,
            fault: Fault::Request,
        };
        parse_reply(&array(reply, "check").map_err(request)?, sets).map_err(request)
    }

    /// Bounds `fut` by the per-call timeout. A call that timed out waiting for a connection
    /// fails with what the last attempt to make one said (a refused connection, say).
    pub(crate) async fn timed<T>(
        &self,
        fut: impl Future<Output = Result<T, BackendError>>,
    ) -> Result<T, BackendError> {
        match tokio::time::timeout(self.inner.timeout, fut).await {
            Ok(result) => result,
            Err(_) => Err(self.timed_out().error),
        }
    }

    /// The failure of a call that timed out: what the last attempt to connect said, when the
    /// call was still waiting for a connection, else a timeout.
    pub(crate) fn timed_out(&self) -> Failed {
        let inner = &*self.inner;
        inner
            .target
            .unconnected()
            .unwrap_or_else(|| Failed::timeout(inner.timeout))
    }

    /// Checks on Redis only — no failure policy, no retry interval, no timeout — with the
    /// server's `TIME` (`now_ms` `None`) or an explicit time. Returns the time the script
    /// used and the decision. For tests and tools; services use [`Backend::check`].
    ///
    /// # Errors
    /// [`BackendError::InvalidRequest`] for an empty policy list, duplicate policy names, an
    /// algorithm the Redis scripts do not implement or a time beyond 2^53 − 1;
    /// [`BackendError::Connection`] when Redis cannot be reached (or the endpoint is not
    /// Redis);
    /// [`BackendError::Script`] for an error reply; [`BackendError::InvalidState`] when a key
    /// holds something the script cannot read (`Quotas::reset` forgets it).
    pub async fn check_on_redis(
        &self,
        key: &str,
        policies: &[Policy],
        cost: u64,
        now_ms: Option<u64>,
    ) -> Result<(u64, Decision), BackendError> {
        turnstile_core::quota::validate_policy_set(policies)
            .map_err(|e| BackendError::InvalidRequest(e.to_string()))?;
        self.call(key, plain_sets(policies), Op::Check, cost, now_ms)
            .await
    }

    pub(crate) async fn configure(
        &self,
        key: &str,
        args: &[&str],
    ) -> Result<KeyConfig, BackendError> {
        let inner = &*self.inner;
        check_key_len(key, inner.max_key_bytes)?;
        let tag = inner.keys.tag(key);
        let mut inv = Call::new(Which::Config, inner.scripts.function(Which::Config), 1);
        let first_key = config_key(&inner.prefix, &tag);
        inv.key(&first_key);
        for a in args {
            inv.arg(*a);
        }
        let deadline = Instant::now() + inner.connect_wait;
        let call = async {
            let reply = inner.target.invoke(&inv, &first_key, deadline).await;
            reply.map_err(|f| f.error)
        };
        let reply: redis::Value = self.timed(call).await?;
        parse_config(&array(reply, "configuration")?, key)
    }

    /// Deletes every key under this backend's prefix (`SCAN` + `UNLINK`, single node only;
    /// on a Cluster the keys are left to their TTL). Returns how many keys were deleted. For
    /// simulations and tests, which use a prefix of their own.
    ///
    /// # Errors
    /// [`BackendError::Connection`] when Redis cannot be reached.
    pub async fn delete_prefix(&self) -> Result<u64, BackendError> {
        let Target::Single(node) = &self.inner.target else {
            return Ok(0);
        };
        let deadline = Instant::now() + self.inner.connect_wait;
        let mut conn = node.connection(deadline).await.map_err(|f| f.error)?;
        let mut cursor: u64 = 0;
        let mut deleted = 0;
        loop {
            let (next, keys) = self.scan_prefix(&mut conn, cursor).await?;
            if !keys.is_empty() {
                let n: u64 = redis::cmd("UNLINK")
                    .arg(&keys)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| redis_error(e, &self.inner.node))?;
                deleted += n;
            }
            if next == 0 {
                return Ok(deleted);
            }
            cursor = next;
        }
    }

    /// Whether a key under this backend's prefix belongs to a client other than
    /// `client_key` (`SCAN`, single node only: `None` on a Cluster). For tools that write a
    /// client's configuration (`turnstile quota`): a prefix where no service has written
    /// anything is likely not the services' prefix.
    ///
    /// # Errors
    /// [`BackendError::Connection`] when Redis cannot be reached.
    pub async fn holds_other_clients(
        &self,
        client_key: &str,
    ) -> Result<Option<bool>, BackendError> {
        let Target::Single(node) = &self.inner.target else {
            return Ok(None);
        };
        let deadline = Instant::now() + self.inner.connect_wait;
        let mut conn = node.connection(deadline).await.map_err(|f| f.error)?;
        // Every key of a client begins with its state key up to the hash tag's end.
        let state = self.state_key(client_key);
        let own = state
            .rsplit_once("}:")
            .map_or(state.as_str(), |(base, _)| base);
        let mut cursor: u64 = 0;
        loop {
            let (next, keys) = self.scan_prefix(&mut conn, cursor).await?;
            if keys.iter().any(|k| !k.starts_with(own)) {
                return Ok(Some(true));
            }
            if next == 0 {
                return Ok(Some(false));
            }
            cursor = next;
        }
    }

    /// One page of `SCAN` over this backend's prefix from `cursor`: the next cursor (0: the
    /// end) and the keys.
    async fn scan_prefix(
        &self,
        conn: &mut impl redis::aio::ConnectionLike,
        cursor: u64,
    ) -> Result<(u64, Vec<String>), BackendError> {
        redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{}:*", self.inner.prefix))
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await
            .map_err(|e| redis_error(e, &self.inner.node))
    }

    /// A single node's health entry, looked up once.
    fn single_node(&self) -> &Arc<NodeHealth> {
        let inner = &*self.inner;
        inner
            .single_health
            .get_or_init(|| inner.health.node(&inner.node))
    }

    /// Lets a call for the client whose state string is `key` begin on its node (see
    /// `health.rs`), and returns the attempt and the node's Cluster, if any.
    ///
    /// # Errors
    /// [`NodeDown`] (as a [`BackendError::Connection`]) while the node counts as down and the
    /// call is not its probe, or when the probe must wait for a new connection.
    pub(crate) fn begin(&self, key: &str) -> Result<(Attempt, Option<&ClusterConn>), BackendError> {
        let inner = &*self.inner;
        let master;
        let (node, cluster) = match &inner.target {
            Target::Single(_) => (self.single_node(), None),
            Target::Cluster(c) => {
                // Every key of a client is in the slot of its hash tag.
                master = inner.health.node(&c.node_of(slot_of(key.as_bytes())));
                (&master, Some(c))
            }
        };
        let attempt = node
            .begin_at(|| inner.clock.now_ms())
            .map_err(|down: NodeDown| BackendError::Connection(Box::new(down)))?;
        if attempt.is_probe() {
            // A node counted down is probed on a connection made since, not on the one that
            // failed it, and never waits within its own timeout for one to be made.
            if !inner.target.probe_ready() {
                return Err(BackendError::Connection(Box::new(attempt.defer())));
            }
            if let Some(c) = cluster {
                // A replica may have taken the slots of the master being probed.
                c.refresh_in_background();
            }
        }
        Ok((attempt, cluster))
    }

    /// What a call that began at connection generation `started` and failed with `fault`
    /// tells about its node: its health, and whether its connection is replaced.
    pub(crate) fn settle(
        &self,
        attempt: Attempt,
        fault: Fault,
        started: u64,
        cluster: Option<&ClusterConn>,
    ) {
        let inner = &*self.inner;
        if fault.counts_against_node() {
            let change = attempt.failed(
                inner.clock.now_ms(),
                inner.health_config.failure_threshold,
                inner.retry_interval,
                fault,
            );
            if replaces(change, fault) {
                inner.target.replace(started, || inner.health.down());
            }
            if let (Change::WentDown, Some(c)) = (change, cluster) {
                c.refresh_in_background();
            }
        } else if fault == Fault::Local {
            attempt.release();
        } else {
            attempt.answered();
        }
    }
}

/// Whether a failed round that changed a node's health as `change` says, for `fault`, calls
/// for a new connection to the node: when it has just come to count as down (so it is probed
/// on a fresh connection), when its probe timed out, and when calls time out in a second round
/// in a row (a connection that stopped answering without being closed answers nothing again;
/// one slow round alone — a burst, a slow script — keeps it).
fn replaces(change: Change, fault: Fault) -> bool {
    match change {
        Change::WentDown => true,
        Change::ProbeFailed => !fault.quick(),
        Change::Counted(rounds) => rounds >= 2 && fault == Fault::Timeout,
        Change::None => false,
    }
}

impl<C: Clock> RedisBackend<C> {
    /// Gives back `cost` units a check of `pair` charged after its caller gave up (it timed
    /// out, or its caller stopped waiting).
    pub(crate) async fn refund_late(&self, pair: &Pair, cost: u64) {
        let (key, limits, now_ms) = (&pair.key, &pair.limits, pair.now_ms);
        let tiers = tier_list(limits);
        // Generous: the refund is the only thing left to do for this request.
        let deadline = Instant::now() + self.inner.timeout.saturating_mul(10);
        let refund = async {
            self.call_on_node(
                key,
                sets(limits, &tiers),
                Op::Refund,
                cost,
                now_ms,
                deadline,
            )
            .await
            .map_err(|f| f.error)
        };
        match tokio::time::timeout_at(deadline, refund).await {
            Ok(Ok(_)) => {
                self.inner
                    .stats
                    .late_refunds
                    .fetch_add(1, Ordering::Relaxed);
            }
            Ok(Err(e)) => tracing::warn!(
                error = %e,
                "a timed-out check was charged by Redis after all and could not be refunded"
            ),
            Err(_) => tracing::warn!(
                "a timed-out check was charged by Redis after all; its refund timed out too"
            ),
        }
    }
}

/// The least TTL (ms) of a key a call writes: 0 at the server's time, [`SIMULATION_MIN_TTL`]
/// with an explicit time (`now_ms`).
pub(crate) fn min_ttl(now_ms: Option<u64>) -> u64 {
    if now_ms.is_some() {
        SIMULATION_MIN_TTL.as_millis() as u64
    } else {
        0
    }
}

/// The tiers of `limits` as the scripts take them.
pub(crate) fn tier_list(limits: &Limits) -> Vec<(&str, &[Policy])> {
    limits.tiers().collect()
}

pub(crate) fn sets<'a>(limits: &'a Limits, tiers: &'a [(&'a str, &'a [Policy])]) -> Sets<'a> {
    Sets {
        defaults: limits.defaults(),
        tiers,
        unconfigured: limits.unconfigured(),
        stored_only: limits.is_stored_only(),
    }
}

pub(crate) fn plain_sets(policies: &[Policy]) -> Sets<'_> {
    Sets {
        defaults: policies,
        tiers: &[],
        unconfigured: Unconfigured::Defaults,
        stored_only: false,
    }
}

/// The future of [`RedisBackend`]'s checks.
pub type CheckFuture = Pin<Box<dyn Future<Output = CheckResult> + Send>>;

impl<C: Clock> Backend for RedisBackend<C> {
    type Future = CheckFuture;

    fn max_key_bytes(&self) -> usize {
        self.inner.max_key_bytes
    }

    fn check_limits(
        &self,
        key: &str,
        limits: &Limits,
        cost: u64,
        now_ms: Option<u64>,
    ) -> Self::Future {
        if let Err(e) = check_key_len(key, self.inner.max_key_bytes) {
            return Box::pin(std::future::ready(Err(e)));
        }
        // The client's state key, built at once: the call needs nothing else of `key`.
        let pair = Pair {
            key: self.inner.keys.states_key_of(&self.inner.prefix, key),
            limits: limits.clone(),
            now_ms,
        };
        Box::pin(self.clone().run(Arc::new(pair), cost))
    }
}
