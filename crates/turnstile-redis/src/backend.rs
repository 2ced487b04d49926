//! [`RedisBackend`]: one atomic script call per decision, with a timeout and a failure policy.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::redis::{self, RedisError, Script};
use deadpool_redis::{cluster, Runtime};
use turnstile_core::{
    Backend, BackendError, Clock, Decision, KeyConfig, Limits, MemoryBackend, Policy, SystemClock,
    Unconfigured, MAX_EXACT,
};

use crate::deny_cache::{limits_fingerprint, DenyCache, DEFAULT_DENY_CACHE_MAX};
use crate::keys::{config_key, key_base, state_key, KeyEncoding};
use crate::script::{
    check_args, check_script, config_script, encode_override, parse_config, parse_reply, Op, Sets,
};

/// The default key prefix. The `v1` is the stored format's version, so two releases that
/// store state differently never misread each other's keys.
pub const DEFAULT_PREFIX: &str = "turnstile:v1";

/// The default per-call timeout: 100 ms, covering taking a connection from the pool and the
/// script's round trip.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(100);

/// The default time Redis is left alone after a failure before it is tried again: 1 s.
pub const DEFAULT_RETRY_INTERVAL: Duration = Duration::from_secs(1);

/// The least TTL of a key written with an explicit (simulation) time: 10 minutes. Trace
/// times are not the server's time, so a TTL derived from them could expire state mid-run.
pub const SIMULATION_MIN_TTL: Duration = Duration::from_secs(600);

/// What [`RedisBackend`] does when Redis fails (an error, a refused connection, a timeout).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnFailure {
    /// Decide locally with an in-memory backend and the same policies (the default), until
    /// Redis answers again. It keeps protecting each node while Redis is away — but each
    /// node limits on its own, so a fleet of N nodes then admits up to N times the limit.
    #[default]
    LocalFallback,
    /// Return the [`BackendError`], so the caller (the tower layer's failure policy: fail
    /// open or fail closed) decides.
    ReturnError,
}

/// Why a [`RedisBackend`] could not be built.
#[derive(Debug)]
#[non_exhaustive]
pub enum InvalidRedisConfig {
    /// The URL did not parse (`redis://[user:password@]host:port[/db]`, `rediss://` for TLS,
    /// several comma-separated URLs for a Cluster).
    Url(String),
    /// The prefix was empty or held `{` or `}` (it must not start a Cluster hash tag).
    Prefix(String),
}

impl fmt::Display for InvalidRedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InvalidRedisConfig::Url(e) => write!(f, "invalid Redis URL: {e}"),
            InvalidRedisConfig::Prefix(p) => write!(
                f,
                "invalid key prefix {p:?}: it must be non-empty and hold no '{{' or '}}'"
            ),
        }
    }
}

impl std::error::Error for InvalidRedisConfig {}

enum Pool {
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
/// Every call is bounded by a timeout ([`DEFAULT_TIMEOUT`]); on an error or a timeout the
/// backend follows its [`OnFailure`] policy, logs once per incident with `tracing`, leaves
/// Redis alone for a retry interval, then tries it again.
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
    inner: Arc<Inner<C>>,
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
            .field("on_failure", &self.inner.on_failure)
            .finish_non_exhaustive()
    }
}

struct Inner<C> {
    pool: Pool,
    script: Script,
    config_script: Script,
    prefix: String,
    keys: KeyEncoding,
    timeout: Duration,
    retry_interval: Duration,
    on_failure: OnFailure,
    fallback: MemoryBackend<C>,
    /// Local time (ms) before which Redis is not tried again after a failure.
    down_until_ms: AtomicU64,
    incident: AtomicBool,
    deny_cache: Option<DenyCache>,
    /// The monotonic time base of the deny cache for checks at the backend's own time.
    epoch: std::time::Instant,
    stats: Counters,
}

#[derive(Debug, Default)]
struct Counters {
    redis_calls: AtomicU64,
    deny_cache_hits: AtomicU64,
    fallback_decisions: AtomicU64,
}

/// What a [`RedisBackend`] has done since it was built (all clones together).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisStats {
    /// Check-script calls sent to Redis (checks, refunds, resets).
    pub redis_calls: u64,
    /// Checks answered by the local deny cache without asking Redis.
    pub deny_cache_hits: u64,
    /// Checks decided by the local fallback because Redis failed.
    pub fallback_decisions: u64,
}

/// Configures a [`RedisBackend`].
#[derive(Debug)]
#[must_use]
pub struct RedisBackendBuilder<C = SystemClock> {
    urls: String,
    cluster: Option<bool>,
    prefix: String,
    keys: KeyEncoding,
    timeout: Duration,
    retry_interval: Duration,
    on_failure: OnFailure,
    pool_size: Option<usize>,
    clock: C,
    fallback_max_keys: Option<usize>,
    deny_cache: Option<Duration>,
}

impl RedisBackend<SystemClock> {
    /// A builder for Redis at `url`: `redis://[user:password@]host:port[/db]`
    /// (`rediss://` for TLS with the `tls` feature). Several comma-separated URLs are the seed
    /// nodes of a Redis Cluster.
    pub fn builder(url: impl Into<String>) -> RedisBackendBuilder<SystemClock> {
        RedisBackendBuilder {
            urls: url.into(),
            cluster: None,
            prefix: DEFAULT_PREFIX.to_owned(),
            keys: KeyEncoding::Hashed,
            timeout: DEFAULT_TIMEOUT,
            retry_interval: DEFAULT_RETRY_INTERVAL,
            on_failure: OnFailure::LocalFallback,
            pool_size: None,
            clock: SystemClock,
            fallback_max_keys: Some(1_000_000),
            deny_cache: Some(DEFAULT_DENY_CACHE_MAX),
        }
    }
}

impl<C> RedisBackendBuilder<C> {
    /// Treats the URL(s) as a Redis Cluster (`true`) or a single node (`false`). By default a
    /// comma-separated list is a Cluster and one URL a single node.
    pub fn cluster(mut self, cluster: bool) -> Self {
        self.cluster = Some(cluster);
        self
    }

    /// The key prefix (default [`DEFAULT_PREFIX`]); no `{` or `}`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How client keys appear in key names (default [`KeyEncoding::Hashed`]).
    pub fn key_encoding(mut self, keys: KeyEncoding) -> Self {
        self.keys = keys;
        self
    }

    /// The per-call timeout (default [`DEFAULT_TIMEOUT`]): no check waits longer for Redis.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How long Redis is left alone after a failure before it is tried again (default
    /// [`DEFAULT_RETRY_INTERVAL`]).
    pub fn retry_interval(mut self, interval: Duration) -> Self {
        self.retry_interval = interval;
        self
    }

    /// What to do when Redis fails (default [`OnFailure::LocalFallback`]).
    pub fn on_failure(mut self, on_failure: OnFailure) -> Self {
        self.on_failure = on_failure;
        self
    }

    /// The connection pool's maximum size (default: deadpool's, 4 × the CPU count). On a single
    /// node every call shares one multiplexed (pipelined) connection taken from the pool,
    /// replaced when it breaks; a Cluster uses the pool per call.
    pub fn pool_size(mut self, size: usize) -> Self {
        self.pool_size = Some(size.max(1));
        self
    }

    /// The cap on keys the local fallback tracks (default 1,000,000; `None` for no cap).
    pub fn fallback_max_keys(mut self, max_keys: impl Into<Option<usize>>) -> Self {
        self.fallback_max_keys = max_keys.into();
        self
    }

    /// The local clock: used only by the local fallback and to time the retry interval.
    /// Decisions on Redis use the server's `TIME`.
    pub fn clock<C2: Clock>(self, clock: C2) -> RedisBackendBuilder<C2> {
        RedisBackendBuilder {
            urls: self.urls,
            cluster: self.cluster,
            prefix: self.prefix,
            keys: self.keys,
            timeout: self.timeout,
            retry_interval: self.retry_interval,
            on_failure: self.on_failure,
            pool_size: self.pool_size,
            clock,
            fallback_max_keys: self.fallback_max_keys,
            deny_cache: self.deny_cache,
        }
    }

    /// The local deny cache (on by default): a denial Redis gave is repeated locally for the
    /// same request (key, policies, cost), without asking Redis, until it could end —
    /// timed from the request's send, so it never denies what Redis would admit — but never
    /// longer than `max` (default [`DEFAULT_DENY_CACHE_MAX`], 1 s), the bound on how late a
    /// refund, reset or raised quota made through **another** node reaches this one (through
    /// this backend it applies at once). `None` turns the cache off.
    pub fn deny_cache(mut self, max: impl Into<Option<Duration>>) -> Self {
        self.deny_cache = max.into();
        self
    }

    /// Builds the backend. No connection is made yet: the first check connects, so a
    /// backend can be built while Redis is down.
    ///
    /// # Errors
    /// [`InvalidRedisConfig::Url`] for a URL that does not parse; [`InvalidRedisConfig::Prefix`] for an
    /// empty prefix or one holding `{` or `}`.
    pub fn build(self) -> Result<RedisBackend<C>, InvalidRedisConfig>
    where
        C: Clock,
    {
        if self.prefix.is_empty() || self.prefix.contains(['{', '}']) {
            return Err(InvalidRedisConfig::Prefix(self.prefix));
        }
        let urls: Vec<String> = self
            .urls
            .split(',')
            .map(|u| u.trim().to_owned())
            .filter(|u| !u.is_empty())
            .collect();
        if urls.is_empty() {
            return Err(InvalidRedisConfig::Url("no URL given".into()));
        }
        for u in &urls {
            redis::parse_redis_url(u).ok_or_else(|| InvalidRedisConfig::Url(u.clone()))?;
        }
        let cluster = self.cluster.unwrap_or(urls.len() > 1);
        let pool = if cluster {
            let mut cfg = cluster::Config::from_urls(urls);
            if let Some(n) = self.pool_size {
                cfg.pool = Some(cluster::PoolConfig::new(n));
            }
            Pool::Cluster(
                cfg.create_pool(Some(Runtime::Tokio1))
                    .map_err(|e| InvalidRedisConfig::Url(e.to_string()))?,
            )
        } else {
            // Our own timeout bounds every call; redis-rs's default 500 ms response timeout
            // would cut in first on a loaded machine and fail calls we are willing to wait for.
            let connection = redis::AsyncConnectionConfig::new()
                .set_response_timeout(None)
                .set_connection_timeout(Some(self.timeout.max(Duration::from_secs(1))));
            let manager = deadpool_redis::Manager::new_with_config(urls[0].as_str(), connection)
                .map_err(|e| InvalidRedisConfig::Url(e.to_string()))?;
            let mut builder = deadpool_redis::Pool::builder(manager).runtime(Runtime::Tokio1);
            if let Some(n) = self.pool_size {
                builder = builder.max_size(n);
            }
            Pool::Single {
                pool: builder
                    .build()
                    .map_err(|e| InvalidRedisConfig::Url(e.to_string()))?,
                shared: std::sync::Mutex::new(None),
            }
        };
        Ok(RedisBackend {
            inner: Arc::new(Inner {
                pool,
                script: check_script(),
                config_script: config_script(),
                prefix: self.prefix,
                keys: self.keys,
                timeout: self.timeout,
                retry_interval: self.retry_interval,
                on_failure: self.on_failure,
                fallback: MemoryBackend::builder()
                    .clock(self.clock)
                    .max_keys(self.fallback_max_keys)
                    .build(),
                down_until_ms: AtomicU64::new(0),
                incident: AtomicBool::new(false),
                deny_cache: self.deny_cache.map(DenyCache::new),
                epoch: std::time::Instant::now(),
                stats: Counters::default(),
            }),
        })
    }
}

impl<C: Clock> RedisBackend<C> {
    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// The Redis key holding `policy`'s state for `client_key`.
    pub fn state_key(&self, client_key: &str, policy: &Policy) -> String {
        state_key(
            &self.inner.prefix,
            &self.inner.keys.tag(client_key),
            policy.name(),
        )
    }

    /// The local fallback backend (for inspection and tests).
    pub fn fallback(&self) -> &MemoryBackend<C> {
        &self.inner.fallback
    }

    /// Runs one call of the check script on Redis only: no timeout, no failure policy.
    /// Returns the time the script used and the decision.
    async fn call(
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
        );
        self.inner.stats.redis_calls.fetch_add(1, Ordering::Relaxed);
        let reply: Vec<redis::Value> = self.invoke(&inv).await?;
        parse_reply(&reply, sets)
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
                        let c =
                            deadpool_redis::Connection::take(pool.get().await.map_err(pool_error)?);
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
                    redis_error(e)
                })
            }
            Pool::Cluster(pool) => {
                let mut conn = pool.get().await.map_err(pool_error)?;
                inv.invoke_async(&mut conn).await.map_err(redis_error)
            }
        }
    }

    /// Bounds `fut` by the per-call timeout.
    async fn timed<T>(
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
    /// [`BackendError::InvalidRequest`] for an empty policy list, duplicate policy names or
    /// a time beyond 2^53 − 1; [`BackendError::Connection`] when Redis cannot be reached;
    /// [`BackendError::Script`] for an error reply; [`BackendError::InvalidState`] when a key
    /// holds something the script cannot read.
    pub async fn check_on_redis(
        &self,
        key: &str,
        policies: &[Policy],
        cost: u64,
        now_ms: Option<u64>,
    ) -> Result<(u64, Decision), BackendError> {
        turnstile_core::validate_policy_set(policies)
            .map_err(|e| BackendError::InvalidRequest(e.to_string()))?;
        self.call(key, plain_sets(policies), Op::Check, cost, now_ms)
            .await
    }

    /// Every policy's `remaining` and `reset_after` for `key` without consuming anything (a
    /// check of cost 0): never changes state.
    ///
    /// # Errors
    /// As [`RedisBackend::check_on_redis`], bounded by the per-call timeout; no fallback.
    pub async fn peek(&self, key: &str, limits: &Limits) -> Result<Decision, BackendError> {
        let tiers = tier_list(limits);
        let fut = self.call(key, sets(limits, &tiers), Op::Check, 0, None);
        Ok(self.timed(fut).await?.1)
    }

    /// Gives `cost` units back to `key` under every policy that applies to it, as
    /// `turnstile_core::algorithm::refund` defines per algorithm (never beyond a fresh key's
    /// capacity), bumps its version, and returns its state afterwards as [`Self::peek`] would.
    /// Identical to [`MemoryBackend::refund_at`].
    ///
    /// # Errors
    /// As [`RedisBackend::peek`].
    pub async fn refund(
        &self,
        key: &str,
        limits: &Limits,
        cost: u64,
    ) -> Result<Decision, BackendError> {
        let tiers = tier_list(limits);
        let fut = self.call(key, sets(limits, &tiers), Op::Refund, cost, None);
        self.forget_denials(key);
        Ok(self.timed(fut).await?.1)
    }

    /// As [`RedisBackend::refund`], at an explicit time (simulations and tests).
    ///
    /// # Errors
    /// As [`RedisBackend::peek`].
    pub async fn refund_at(
        &self,
        key: &str,
        limits: &Limits,
        cost: u64,
        now_ms: u64,
    ) -> Result<Decision, BackendError> {
        let tiers = tier_list(limits);
        let fut = self.call(key, sets(limits, &tiers), Op::Refund, cost, Some(now_ms));
        self.forget_denials(key);
        Ok(self.timed(fut).await?.1)
    }

    /// Forgets the state of every policy that applies to `key` (it is fresh again), keeping
    /// its configuration, and bumps its version. Returns the fresh state as [`Self::peek`].
    ///
    /// # Errors
    /// As [`RedisBackend::peek`].
    pub async fn reset(&self, key: &str, limits: &Limits) -> Result<Decision, BackendError> {
        let tiers = tier_list(limits);
        let fut = self.call(key, sets(limits, &tiers), Op::Reset, 0, None);
        self.forget_denials(key);
        Ok(self.timed(fut).await?.1)
    }

    /// As [`RedisBackend::reset`], answering as a query at an explicit time (simulations
    /// and tests).
    ///
    /// # Errors
    /// As [`RedisBackend::peek`].
    pub async fn reset_at(
        &self,
        key: &str,
        limits: &Limits,
        now_ms: u64,
    ) -> Result<Decision, BackendError> {
        let tiers = tier_list(limits);
        let fut = self.call(key, sets(limits, &tiers), Op::Reset, 0, Some(now_ms));
        self.forget_denials(key);
        Ok(self.timed(fut).await?.1)
    }

    async fn configure(&self, key: &str, args: &[&str]) -> Result<KeyConfig, BackendError> {
        let inner = &*self.inner;
        let tag = inner.keys.tag(key);
        let mut inv = inner.config_script.prepare_invoke();
        inv.key(config_key(&inner.prefix, &tag));
        for a in args {
            inv.arg(*a);
        }
        let reply: Vec<redis::Value> = self.timed(self.invoke(&inv)).await?;
        if matches!(args.first(), Some(&"set" | &"clear")) {
            self.forget_denials(key);
        }
        parse_config(&reply, key)
    }

    /// Forgets this node's cached denials of `key`.
    fn forget_denials(&self, key: &str) {
        if let Some(cache) = &self.inner.deny_cache {
            cache.invalidate(key);
        }
    }

    /// What this backend has done since it was built: Redis calls, deny-cache hits, local
    /// fallback decisions.
    pub fn stats(&self) -> RedisStats {
        let s = &self.inner.stats;
        RedisStats {
            redis_calls: s.redis_calls.load(Ordering::Relaxed),
            deny_cache_hits: s.deny_cache_hits.load(Ordering::Relaxed),
            fallback_decisions: s.fallback_decisions.load(Ordering::Relaxed),
        }
    }

    /// The deny cache's time in ns: the explicit time of a simulation, else monotonic time.
    fn cache_now_ns(&self, now_ms: Option<u64>) -> u128 {
        match now_ms {
            Some(t) => u128::from(t) * 1_000_000,
            None => self.inner.epoch.elapsed().as_nanos(),
        }
    }

    /// The stored configuration of `key`: its override, its tier, its version.
    ///
    /// # Errors
    /// [`BackendError::InvalidState`] when the stored override cannot be read; otherwise as
    /// [`RedisBackend::peek`].
    pub async fn config(&self, key: &str) -> Result<KeyConfig, BackendError> {
        self.configure(key, &["get"]).await
    }

    /// Stores `policies` as `key`'s override: from the next check on every node, they
    /// replace the defaults and the key's tier. A policy of the same name as before keeps
    /// its state by the carry-over rule. Returns the new configuration.
    ///
    /// # Errors
    /// [`BackendError::InvalidRequest`] for an empty set or two policies of one name;
    /// otherwise as [`RedisBackend::peek`].
    pub async fn set_override(
        &self,
        key: &str,
        policies: &[Policy],
    ) -> Result<KeyConfig, BackendError> {
        turnstile_core::validate_policy_set(policies)
            .map_err(|e| BackendError::InvalidRequest(e.to_string()))?;
        self.configure(key, &["set", "o", &encode_override(policies)])
            .await
    }

    /// Removes `key`'s override. Returns the new configuration.
    ///
    /// # Errors
    /// As [`RedisBackend::config`].
    pub async fn remove_override(&self, key: &str) -> Result<KeyConfig, BackendError> {
        self.configure(key, &["set", "o", ""]).await
    }

    /// Removes `key`'s whole configuration, its override and its tier, in one change (one
    /// version). Returns the new configuration.
    ///
    /// # Errors
    /// As [`RedisBackend::config`].
    pub async fn clear_config(&self, key: &str) -> Result<KeyConfig, BackendError> {
        self.configure(key, &["clear"]).await
    }

    /// Maps `key` to tier `tier` (`None`: no tier). Returns the new configuration.
    ///
    /// # Errors
    /// [`BackendError::InvalidRequest`] for an invalid tier name; otherwise as
    /// [`RedisBackend::config`].
    pub async fn set_tier(&self, key: &str, tier: Option<&str>) -> Result<KeyConfig, BackendError> {
        if let Some(t) = tier {
            turnstile_core::validate_tier_name(t)
                .map_err(|e| BackendError::InvalidRequest(e.to_string()))?;
        }
        self.configure(key, &["set", "t", tier.unwrap_or("")]).await
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
        let mut conn = pool.get().await.map_err(pool_error)?;
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
                .map_err(redis_error)?;
            if !keys.is_empty() {
                let n: u64 = redis::cmd("UNLINK")
                    .arg(&keys)
                    .query_async(&mut conn)
                    .await
                    .map_err(redis_error)?;
                deleted += n;
            }
            if next == 0 {
                return Ok(deleted);
            }
            cursor = next;
        }
    }

    async fn run(
        self,
        key: String,
        limits: Result<Limits, BackendError>,
        cost: u64,
        now_ms: Option<u64>,
    ) -> Result<Decision, BackendError> {
        let limits = limits?;
        let inner = &*self.inner;
        let local_now = inner.fallback.clock().now_ms();
        let down_until = inner.down_until_ms.load(Ordering::Relaxed);
        let cached = inner
            .deny_cache
            .as_ref()
            .filter(|_| cost > 0)
            .map(|cache| (cache, limits_fingerprint(&limits, now_ms.is_some())));
        let sent_ns = self.cache_now_ns(now_ms);
        if let Some((cache, fp)) = cached {
            if let Some(decision) = cache.lookup(&key, fp, cost, sent_ns) {
                inner.stats.deny_cache_hits.fetch_add(1, Ordering::Relaxed);
                #[cfg(feature = "metrics")]
                metrics::counter!("turnstile_deny_cache_hits_total").increment(1);
                return Ok(decision);
            }
        }
        let error = if local_now < down_until {
            BackendError::Connection(
                "Redis failed recently; not retried until the retry interval passes".into(),
            )
        } else {
            let tiers = tier_list(&limits);
            let call = self.call(&key, sets(&limits, &tiers), Op::Check, cost, now_ms);
            match self.timed(call).await {
                Ok((_, decision)) => {
                    if inner.incident.swap(false, Ordering::Relaxed) {
                        tracing::info!("Redis rate-limit backend recovered");
                    }
                    if let Some((cache, fp)) = cached {
                        if decision.allowed() {
                            // This node consumed: its cached waits for the key grew.
                            cache.invalidate(&key);
                        } else {
                            let reply_ns = self.cache_now_ns(now_ms);
                            cache.insert(&key, fp, cost, sent_ns, reply_ns, &decision);
                        }
                    }
                    return Ok(decision);
                }
                Err(e) => e,
            }
        };
        // Only an unreachable or unresponsive Redis is left alone for a while; an error
        // about one key's state says nothing about the others.
        let unreachable = matches!(
            error,
            BackendError::Connection(_) | BackendError::Timeout { .. }
        );
        if unreachable && local_now >= down_until {
            let retry_ms = u64::try_from(inner.retry_interval.as_millis()).unwrap_or(u64::MAX);
            inner
                .down_until_ms
                .store(local_now.saturating_add(retry_ms), Ordering::Relaxed);
        }
        if local_now >= down_until && !inner.incident.swap(true, Ordering::Relaxed) {
            #[cfg(feature = "metrics")]
            if inner.on_failure == OnFailure::LocalFallback {
                metrics::counter!("turnstile_fallback_activations_total", "kind" => error.kind())
                    .increment(1);
            }
            tracing::warn!(
                error = %error,
                kind = error.kind(),
                on_failure = ?inner.on_failure,
                "Redis rate-limit backend failed; applying the failure policy until it answers again"
            );
        }
        match inner.on_failure {
            OnFailure::LocalFallback => {
                inner
                    .stats
                    .fallback_decisions
                    .fetch_add(1, Ordering::Relaxed);
                #[cfg(feature = "metrics")]
                metrics::counter!("turnstile_fallback_decisions_total").increment(1);
                let now = now_ms.unwrap_or_else(|| inner.fallback.clock().now_ms());
                inner.fallback.decide_limits_at(&key, &limits, cost, now)
            }
            OnFailure::ReturnError => Err(error),
        }
    }
}

/// The tiers of `limits` as the scripts take them.
fn tier_list(limits: &Limits) -> Vec<(&str, &[Policy])> {
    limits.tiers().collect()
}

fn sets<'a>(limits: &'a Limits, tiers: &'a [(&'a str, &'a [Policy])]) -> Sets<'a> {
    Sets {
        defaults: limits.defaults(),
        tiers,
        unconfigured: limits.unconfigured(),
    }
}

fn plain_sets(policies: &[Policy]) -> Sets<'_> {
    Sets {
        defaults: policies,
        tiers: &[],
        unconfigured: Unconfigured::Defaults,
    }
}

fn limits_of(policies: &[Policy]) -> Result<Limits, BackendError> {
    Limits::new(policies.iter().cloned()).map_err(|e| BackendError::InvalidRequest(e.to_string()))
}

fn pool_error(e: deadpool_redis::PoolError) -> BackendError {
    match e {
        deadpool_redis::PoolError::Backend(e) => redis_error(e),
        deadpool_redis::PoolError::Timeout(_) => BackendError::Timeout {
            after: Duration::ZERO,
        },
        other => BackendError::Connection(Box::new(other)),
    }
}

fn redis_error(e: RedisError) -> BackendError {
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
pub type CheckFuture = Pin<Box<dyn Future<Output = Result<Decision, BackendError>> + Send>>;

impl<C: Clock> Backend for RedisBackend<C> {
    type Future = CheckFuture;

    fn check(&self, key: &str, policies: &[Policy], cost: u64) -> Self::Future {
        Box::pin(
            self.clone()
                .run(key.to_owned(), limits_of(policies), cost, None),
        )
    }

    fn check_at(&self, key: &str, policies: &[Policy], cost: u64, now_ms: u64) -> Self::Future {
        Box::pin(
            self.clone()
                .run(key.to_owned(), limits_of(policies), cost, Some(now_ms)),
        )
    }

    fn check_limits(
        &self,
        key: &str,
        limits: &Limits,
        cost: u64,
        now_ms: Option<u64>,
    ) -> Self::Future {
        Box::pin(
            self.clone()
                .run(key.to_owned(), Ok(limits.clone()), cost, now_ms),
        )
    }
}
