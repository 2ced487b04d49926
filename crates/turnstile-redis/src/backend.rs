//! [`RedisBackend`]: one atomic script call per decision, with a timeout and node health.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::cluster;
use deadpool_redis::redis::{self, RedisError, Script};
use turnstile_core::policy::MAX_EXACT;
use turnstile_core::{
    Backend, BackendError, CheckResult, Clock, Decision, KeyConfig, Limits, Policy, SystemClock,
    Unconfigured,
};

use crate::keys::{config_key, key_base, state_key, KeyEncoding};
use crate::script::{array, check_args, parse_config, parse_reply, Op, Sets};

/// The least TTL of a key written with an explicit (simulation) time: 10 minutes. Trace
/// times are not the server's time, so a TTL derived from them could expire state mid-run.
pub const SIMULATION_MIN_TTL: Duration = Duration::from_secs(600);

pub(crate) enum Pool {
    /// A single node: deadpool makes the connections; one multiplexed connection taken out
    /// of it serves every call (pipelined), so no call pays the pool's recycling `PING`.
    Single {
        pool: deadpool_redis::Pool,
        shared: std::sync::Mutex<Option<redis::aio::MultiplexedConnection>>,
    },
    Cluster(cluster::Pool),
}

/// A [`Backend`] in Redis — a single node or a Cluster — so every process of a fleet
/// enforces one limit.
///
/// Each check is **one** `EVALSHA` of the check script (composed from the files in `lua/`)
/// with one key per policy, all in one Cluster slot: all-or-nothing and atomic across every
/// process. Time comes from the Redis server's `TIME`, so nodes with skewed clocks agree.
/// [`redis::Script`] reloads the script after `NOSCRIPT` (a restart, a failover,
/// `SCRIPT FLUSH`).
///
/// Keys are `<prefix>:{<client key>}:<policy name>` (see [`KeyEncoding`]); each carries a TTL
/// equal to its `reset_after` rounded up, so idle keys cost no memory. The stored state
/// records a fingerprint of the policy's parameters: when a policy changes, its keys start
/// fresh.
///
/// Every call is bounded by a timeout ([`DEFAULT_TIMEOUT`](crate::DEFAULT_TIMEOUT)). When
/// Redis is unreachable or times out, the backend leaves it alone for a retry interval
/// ([`DEFAULT_RETRY_INTERVAL`](crate::DEFAULT_RETRY_INTERVAL)), failing fast with a
/// [`BackendError::Connection`] naming the node, then tries it again. What a request gets
/// then is the caller's failure policy (`turnstile_core::FailurePolicy`: the tower layer
/// falls back to a local limiter by default); the local deny cache is
/// `turnstile_core::wrap::DenyCache`. An endpoint that answers something other than the
/// Redis protocol (an HTTP server on the Redis port) is a [`BackendError::Connection`]
/// saying "not a Redis server at `<node>`".
///
/// Everything read from Redis is parsed strictly (see `lua/prelude.lua`): a key holding
/// anything the scripts do not write — a hand edit, `0x10`, `1e3`, a key of another type —
/// is a [`BackendError::InvalidState`] naming it. `Quotas::reset` forgets whatever a key's
/// policies' state holds, and `Quotas::clear_config` whatever its configuration holds (a
/// configuration that cannot be read fails every other operation, a reset included, since
/// which policies apply is unknown).
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
            .field("cluster", &matches!(self.inner.pool, Pool::Cluster(_)))
            .field("prefix", &self.inner.prefix)
            .field("keys", &self.inner.keys)
            .field("timeout", &self.inner.timeout)
            .finish_non_exhaustive()
    }
}

pub(crate) struct Inner<C> {
    pub(crate) pool: Pool,
    pub(crate) script: Script,
    pub(crate) config_script: Script,
    pub(crate) prefix: String,
    pub(crate) keys: KeyEncoding,
    /// The node(s) as logs and errors name them: the URLs without credentials.
    pub(crate) node: String,
    pub(crate) timeout: Duration,
    pub(crate) retry_interval: Duration,
    /// Times the retry interval.
    pub(crate) clock: C,
    /// Local time (ms) before which Redis is not tried again after it was found unreachable.
    pub(crate) down_until_ms: AtomicU64,
    pub(crate) stats: Counters,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    redis_calls: AtomicU64,
}

/// What a [`RedisBackend`] has done since it was built (all clones together).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisStats {
    /// Check-script calls sent to Redis (checks, refunds, resets).
    pub redis_calls: u64,
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

    /// The Redis key holding `policy`'s state for `client_key`.
    pub fn state_key(&self, client_key: &str, policy: &Policy) -> String {
        state_key(
            &self.inner.prefix,
            &self.inner.keys.tag(client_key),
            policy.name(),
        )
    }

    /// What this backend has done since it was built: Redis calls.
    pub fn stats(&self) -> RedisStats {
        RedisStats {
            redis_calls: self.inner.stats.redis_calls.load(Ordering::Relaxed),
        }
    }

    /// Runs one call of the check script on Redis only: no timeout, no failure policy.
    /// Returns the time the script used and the decision.
    pub(crate) async fn call(
        &self,
        key: &str,
        sets: Sets<'_>,
        op: Op,
        cost: u64,
        now_ms: Option<u64>,
    ) -> Result<(u64, Decision), BackendError> {
        if now_ms.is_some_and(|t| t > MAX_EXACT) {
            return Err(BackendError::InvalidRequest(
                "the time must be at most 2^53 − 1 ms".into(),
            ));
        }
        let inner = &*self.inner;
        let tag = inner.keys.tag(key);
        let mut inv = inner.script.prepare_invoke();
        inv.key(config_key(&inner.prefix, &tag));
        let min_ttl = if now_ms.is_some() {
            SIMULATION_MIN_TTL.as_millis() as u64
        } else {
            0
        };
        check_args(
            &mut inv,
            &key_base(&inner.prefix, &tag),
            sets,
            op,
            cost,
            now_ms,
            min_ttl,
        )?;
        self.inner.stats.redis_calls.fetch_add(1, Ordering::Relaxed);
        let reply: redis::Value = self.invoke(&inv).await?;
        parse_reply(&array(reply, "check")?, sets)
    }

    async fn invoke<T: redis::FromRedisValue>(
        &self,
        inv: &redis::ScriptInvocation<'_>,
    ) -> Result<T, BackendError> {
        match &self.inner.pool {
            Pool::Single { pool, shared } => {
                let lock = || {
                    shared
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                };
                let cached = lock().clone();
                let mut conn = match cached {
                    Some(c) => c,
                    None => {
                        let c = deadpool_redis::Connection::take(
                            pool.get()
                                .await
                                .map_err(|e| pool_error(e, &self.inner.node))?,
                        );
                        *lock() = Some(c.clone());
                        c
                    }
                };
                inv.invoke_async(&mut conn).await.map_err(|e| {
                    if e.is_io_error()
                        || e.is_connection_dropped()
                        || e.is_connection_refusal()
                        || e.is_unrecoverable_error()
                    {
                        // A broken connection: the next call makes a new one.
                        *lock() = None;
                    }
                    redis_error(e, &self.inner.node)
                })
            }
            Pool::Cluster(pool) => {
                let mut conn = pool
                    .get()
                    .await
                    .map_err(|e| pool_error(e, &self.inner.node))?;
                inv.invoke_async(&mut conn)
                    .await
                    .map_err(|e| redis_error(e, &self.inner.node))
            }
        }
    }

    /// Bounds `fut` by the per-call timeout.
    pub(crate) async fn timed<T>(
        &self,
        fut: impl Future<Output = Result<T, BackendError>>,
    ) -> Result<T, BackendError> {
        tokio::time::timeout(self.inner.timeout, fut)
            .await
            .unwrap_or(Err(BackendError::Timeout {
                after: self.inner.timeout,
            }))
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
        let tag = inner.keys.tag(key);
        let mut inv = inner.config_script.prepare_invoke();
        inv.key(config_key(&inner.prefix, &tag));
        for a in args {
            inv.arg(*a);
        }
        let reply: redis::Value = self.timed(self.invoke(&inv)).await?;
        parse_config(&array(reply, "configuration")?, key)
    }

    /// Deletes every key under this backend's prefix (`SCAN` + `UNLINK`, single node only;
    /// on a Cluster the keys are left to their TTL). Returns how many keys were deleted. For
    /// simulations and tests, which use a prefix of their own.
    ///
    /// # Errors
    /// [`BackendError::Connection`] when Redis cannot be reached.
    pub async fn delete_prefix(&self) -> Result<u64, BackendError> {
        let Pool::Single { pool, .. } = &self.inner.pool else {
            return Ok(0);
        };
        let mut conn = pool
            .get()
            .await
            .map_err(|e| pool_error(e, &self.inner.node))?;
        let pattern = format!("{}:*", self.inner.prefix);
        let mut cursor: u64 = 0;
        let mut deleted = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await
                .map_err(|e| redis_error(e, &self.inner.node))?;
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

    async fn run(self, key: String, limits: Limits, cost: u64, now_ms: Option<u64>) -> CheckResult {
        let inner = &*self.inner;
        let local_now = inner.clock.now_ms();
        if local_now < inner.down_until_ms.load(Ordering::Relaxed) {
            return Err(BackendError::Connection(
                format!(
                    "Redis at {} was unreachable moments ago; it is asked again once its retry interval of {} ms has passed",
                    inner.node,
                    inner.retry_interval.as_millis()
                )
                .into(),
            ));
        }
        let tiers = tier_list(&limits);
        let call = self.call(&key, sets(&limits, &tiers), Op::Check, cost, now_ms);
        let error = match self.timed(call).await {
            Ok((_, decision)) => return Ok(decision),
            Err(e) => e,
        };
        // Only an unreachable or unresponsive Redis is left alone for a while; an error
        // about one key's state says nothing about the others.
        if matches!(
            error,
            BackendError::Connection(_) | BackendError::Timeout { .. }
        ) {
            let retry_ms = u64::try_from(inner.retry_interval.as_millis()).unwrap_or(u64::MAX);
            inner
                .down_until_ms
                .store(local_now.saturating_add(retry_ms), Ordering::Relaxed);
        }
        Err(error)
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
    }
}

pub(crate) fn plain_sets(policies: &[Policy]) -> Sets<'_> {
    Sets {
        defaults: policies,
        tiers: &[],
        unconfigured: Unconfigured::Defaults,
    }
}

/// The error of taking a connection to `node` from the pool.
pub(crate) fn pool_error(e: deadpool_redis::PoolError, node: &str) -> BackendError {
    match e {
        deadpool_redis::PoolError::Backend(e) => redis_error(e, node),
        deadpool_redis::PoolError::Timeout(_) => BackendError::Timeout {
            after: Duration::ZERO,
        },
        other => BackendError::Connection(Box::new(other)),
    }
}

/// Whether `e` says the reply was not the Redis protocol (RESP). Scripts' replies are taken
/// as [`redis::Value`], so no conversion of a reply raises a parse error of its own. A
/// Cluster's seed connections report their errors as text only (an I/O error "Failed to
/// create initial connections" whose detail is the last node's error): there, the decoder's
/// "Parse error at" is the sign.
fn is_not_redis(e: &RedisError) -> bool {
    e.kind() == redis::ErrorKind::Parse
        || (e.kind() == redis::ErrorKind::Io
            && e.detail().is_some_and(|d| d.contains("Parse error at")))
}

/// The error of a call to `node` (as [`RedisBackend::node`] names it).
///
/// A reply that is not the Redis protocol (RESP) means something else listens there (an HTTP
/// server on the Redis port, say): a [`BackendError::Connection`] saying so, since no Redis
/// can be reached there.
pub(crate) fn redis_error(e: RedisError, node: &str) -> BackendError {
    if is_not_redis(&e) {
        // redis-rs's parse errors span lines: keep the message on one.
        let why = e.to_string();
        let why: Vec<&str> = why
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        return BackendError::Connection(
            format!(
                "not a Redis server at {node}: its reply is not the Redis protocol ({})",
                why.join("; ")
            )
            .into(),
        );
    }
    if e.is_io_error() || e.is_connection_refusal() || e.is_connection_dropped() {
        return BackendError::Connection(Box::new(e));
    }
    if e.is_timeout() {
        return BackendError::Timeout {
            after: Duration::ZERO,
        };
    }
    if e.code() == Some("TURNSTILE_INVALID_STATE") {
        BackendError::InvalidState(e.detail().unwrap_or_default().to_owned())
    } else {
        BackendError::Script(e.to_string())
    }
}

/// The future of [`RedisBackend`]'s checks.
pub type CheckFuture = Pin<Box<dyn Future<Output = CheckResult> + Send>>;

impl<C: Clock> Backend for RedisBackend<C> {
    type Future = CheckFuture;

    fn check_limits(
        &self,
        key: &str,
        limits: &Limits,
        cost: u64,
        now_ms: Option<u64>,
    ) -> Self::Future {
        Box::pin(
            self.clone()
                .run(key.to_owned(), limits.clone(), cost, now_ms),
        )
    }
}
