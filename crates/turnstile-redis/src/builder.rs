//! [`RedisBackendBuilder`]: URLs, prefix, key encoding, timeout, retry interval, TLS.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use turnstile_core::{Clock, SystemClock};

use crate::backend::{Counters, Inner, RedisBackend};
use crate::cluster::ClusterConn;
use crate::coalesce::Lanes;
use crate::conn::{NodeConn, Source};
use crate::error::InvalidRedisConfig;
use crate::health::{Health, HealthConfig};
use crate::keys::KeyEncoding;
use crate::library::{ScriptMode, Scripts};
use crate::sentinel;
use crate::target::Target;
use crate::tls::TlsFiles;

/// The default key prefix. The `v1` is the stored format's version, so two releases that
/// store state differently never misread each other's keys.
pub const DEFAULT_PREFIX: &str = "turnstile:v1";

/// The default per-call timeout: 100 ms, covering the wait for a connection (when there is
/// none yet) and the script's round trip.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(100);

/// The default time a node that counts as down is left alone before one request probes it:
/// 1 s.
pub const DEFAULT_RETRY_INTERVAL: Duration = Duration::from_secs(1);

/// The default most policy evaluations one Redis call of several coalesced checks may make
/// (checks × policies per check): 128. See [`RedisBackendBuilder::batch_evaluations`].
pub const DEFAULT_BATCH_EVALUATIONS: usize = 128;

/// The largest [`RedisBackendBuilder::batch_evaluations`] accepted: 100,000.
pub const MAX_BATCH_EVALUATIONS: usize = 100_000;

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
    pub(crate) health: HealthConfig,
    tls: TlsFiles,
    script_mode: ScriptMode,
    coalesce: bool,
    batch_evaluations: usize,
    clock: C,
}

impl RedisBackend<SystemClock> {
    /// A builder for Redis at `url`: `redis://[user:password@]host:port[/db]`
    /// (`rediss://` for TLS with the `tls` feature). Several comma-separated URLs are the seed
    /// nodes of a Redis Cluster. With the `sentinel` feature,
    /// `redis+sentinel://[user:password@]host[:port][,host[:port]...]/service[/db]` (or
    /// `redis-sentinel://`) names Redis Sentinels (port 26379 by default) and the service whose primary they report:
    /// the credentials and database are the primary's (the Sentinels are asked without
    /// credentials), and every new connection asks the Sentinels again, so a failover is
    /// followed.
    pub fn builder(url: impl Into<String>) -> RedisBackendBuilder<SystemClock> {
        RedisBackendBuilder {
            urls: url.into(),
            cluster: None,
            prefix: DEFAULT_PREFIX.to_owned(),
            keys: KeyEncoding::Hashed,
            timeout: DEFAULT_TIMEOUT,
            retry_interval: DEFAULT_RETRY_INTERVAL,
            health: HealthConfig::default(),
            tls: TlsFiles::default(),
            script_mode: ScriptMode::Auto,
            coalesce: true,
            batch_evaluations: DEFAULT_BATCH_EVALUATIONS,
            clock: SystemClock,
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

    /// How long a node that counts as down is left alone before one request probes it
    /// (default [`DEFAULT_RETRY_INTERVAL`]; see [`failure_threshold`](Self::failure_threshold)
    /// for when a node counts as down).
    pub fn retry_interval(mut self, interval: Duration) -> Self {
        self.retry_interval = interval;
        self
    }

    /// The certificate authority that verifies the server of a `rediss://` URL: a PEM file
    /// (RFC 7468) of one or more X.509 CA certificates (RFC 5280), such as the file given to
    /// `redis-server --tls-ca-cert-file`. It replaces the system trust store for this
    /// backend. The file is read and checked by [`build`](Self::build); the server's
    /// certificate must also name the URL's host (RFC 6125: a DNS name or IP address in its
    /// subject alternative names). Needs the `tls` feature; a single node or a Cluster (every
    /// node of the Cluster gets it), not Sentinel.
    ///
    /// # Errors
    /// [`build`](Self::build) returns [`InvalidRedisConfig::Tls`] when the file cannot be read
    /// or holds no usable certificate, or when no URL is `rediss://`.
    pub fn tls_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.tls.ca = Some(path.into());
        self
    }

    /// The client certificate for mutual TLS (Redis `tls-auth-clients yes`): `cert`, a PEM
    /// file (RFC 7468) of the certificate chain, the client's certificate first; `key`, a PEM
    /// file of its private key (PKCS #8 `PRIVATE KEY`, PKCS #1 `RSA PRIVATE KEY` or SEC1
    /// `EC PRIVATE KEY`, unencrypted). Both are read and checked by [`build`](Self::build),
    /// including that the key belongs to the certificate. Needs the `tls` feature and a
    /// `rediss://` URL (single node or Cluster, not Sentinel).
    ///
    /// # Errors
    /// [`build`](Self::build) returns [`InvalidRedisConfig::Tls`] when a file cannot be read,
    /// holds no certificate or no unencrypted key, or the key does not match.
    pub fn tls_client_cert(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.tls.client = Some((cert.into(), key.into()));
        self
    }

    /// How the Lua runs on Redis (default [`ScriptMode::Auto`]: Redis Functions, loaded once
    /// per node with `FUNCTION LOAD` and called with `FCALL`, where the node accepts them,
    /// else `EVALSHA`). [`ScriptMode::Eval`] forces `EVALSHA` everywhere. Both give the same
    /// decisions; Functions cost Redis less CPU per call.
    pub fn script_mode(mut self, mode: ScriptMode) -> Self {
        self.script_mode = mode;
        self
    }

    /// Whether concurrent checks of one client key share Redis calls (default `true`).
    ///
    /// While a check of a client key (with given limits and time) is in flight from this
    /// backend, further checks of the same key and limits wait for it and are then sent
    /// together as one call, which decides them in their order, each all-or-nothing over its
    /// policies, at one reading of the server's `TIME`: each gets exactly the decision it would
    /// have got sent alone, the checks one after the other at that time. There is no timer: a
    /// check with nothing in flight for its key goes at once, alone. A hot key — one API key
    /// a whole fleet shares, a global limit — then costs Redis a call per round trip rather
    /// than one per check. A longer queue goes in several calls, each within
    /// [`batch_evaluations`](Self::batch_evaluations).
    ///
    /// Each check keeps its own timeout, counted from its arrival (a check that waited behind
    /// a call does not get a second full timeout); a call that times out fails each of its
    /// checks by the caller's failure policy and counts once against the node; each admitted
    /// check of a call that ran after its caller gave up is refunded.
    /// [`RedisStats`](crate::RedisStats) counts calls and checks apart.
    pub fn coalesce(mut self, on: bool) -> Self {
        self.coalesce = on;
        self
    }

    /// The most policy evaluations one call of several coalesced checks may make: checks ×
    /// the policies each evaluates (default [`DEFAULT_BATCH_EVALUATIONS`], from 1 to
    /// [`MAX_BATCH_EVALUATIONS`]), so that no call holds Redis much longer than one large
    /// check. A call holds as many queued checks as fit, at least one; the script stops at the
    /// budget when a key's override has more policies than its limits' sets, and the checks
    /// left go in the next call, first.
    ///
    /// # Errors
    /// [`build`](Self::build) returns [`InvalidRedisConfig::BatchEvaluations`] for 0 or more
    /// than [`MAX_BATCH_EVALUATIONS`].
    pub fn batch_evaluations(mut self, max: usize) -> Self {
        self.batch_evaluations = max;
        self
    }

    /// The local clock: used only to time the retry interval. Decisions on Redis use the
    /// server's `TIME`.
    pub fn clock<C2: Clock>(self, clock: C2) -> RedisBackendBuilder<C2> {
        RedisBackendBuilder {
            urls: self.urls,
            cluster: self.cluster,
            prefix: self.prefix,
            keys: self.keys,
            timeout: self.timeout,
            retry_interval: self.retry_interval,
            health: self.health,
            tls: self.tls,
            script_mode: self.script_mode,
            coalesce: self.coalesce,
            batch_evaluations: self.batch_evaluations,
            clock,
        }
    }

    /// Builds the backend. It never waits for Redis, so a backend can be built while Redis
    /// is down. Built inside a Tokio runtime, it starts warming up at once in the
    /// background: it connects, checks the server and loads the Function library, so the
    /// first checks (a burst at start-up) find a connection ready rather than each waiting
    /// for one within its timeout; built outside one, the first check starts it. Checks that
    /// come before the warm-up ends wait for it within their timeout (and fail as timed out,
    /// or with the connection's error, when it takes longer). For `rediss://` URLs the TLS
    /// files and the system trust store are read now, and rustls's `ring` crypto provider is
    /// installed as the process default unless the application installed one before.
    ///
    /// # Errors
    /// [`InvalidRedisConfig::Url`] for a URL that does not parse (or a Sentinel URL without
    /// the `sentinel` feature, or with [`cluster(true)`](Self::cluster));
    /// [`InvalidRedisConfig::Prefix`] for an empty prefix or one holding `{` or `}`;
    /// [`InvalidRedisConfig::FailureThreshold`] for a failure threshold of 0;
    /// [`InvalidRedisConfig::BatchEvaluations`] for a
    /// [`batch_evaluations`](Self::batch_evaluations) of 0 or above
    /// [`MAX_BATCH_EVALUATIONS`];
    /// [`InvalidRedisConfig::Tls`] for TLS settings that cannot work (see there).
    pub fn build(self) -> Result<RedisBackend<C>, InvalidRedisConfig>
    where
        C: Clock,
    {
        if self.prefix.is_empty() || self.prefix.contains(['{', '}']) {
            return Err(InvalidRedisConfig::Prefix(self.prefix));
        }
        if self.health.failure_threshold == 0 {
            return Err(InvalidRedisConfig::FailureThreshold(0));
        }
        if !(1..=MAX_BATCH_EVALUATIONS).contains(&self.batch_evaluations) {
            return Err(InvalidRedisConfig::BatchEvaluations(self.batch_evaluations));
        }
        let health = self.health;
        // Our own timeout bounds every call; redis-rs's default 500 ms response timeout
        // would cut in first on a loaded machine and fail calls we are willing to wait for.
        let connect_timeout = self.timeout.max(Duration::from_secs(1));
        let scripts = Arc::new(Scripts::new(self.script_mode));
        let connection = redis::AsyncConnectionConfig::new()
            .set_response_timeout(None)
            .set_connection_timeout(Some(connect_timeout));
        let (target, node) = if sentinel::is_sentinel(&self.urls) {
            if self.cluster == Some(true) {
                return Err(InvalidRedisConfig::Url(
                    "a Sentinel URL names one primary, not a Cluster".into(),
                ));
            }
            let spec =
                sentinel::SentinelSpec::parse(&self.urls).map_err(InvalidRedisConfig::Url)?;
            crate::tls::refuse_for_sentinel(&self.tls)?;
            let name = spec.name();
            let target =
                sentinel_target(spec, name.clone(), connection, &scripts, connect_timeout)?;
            (target, name)
        } else {
            self.url_target(connection, &scripts, connect_timeout)?
        };
        target.warm();
        Ok(RedisBackend {
            inner: Arc::new(Inner {
                target,
                scripts,
                prefix: self.prefix,
                keys: self.keys,
                timeout: self.timeout,
                connect_wait: connect_timeout,
                retry_interval: self.retry_interval,
                node,
                clock: self.clock,
                health_config: health,
                single_health: std::sync::OnceLock::new(),
                health: Health::default(),
                stats: Counters::default(),
                lanes: self.coalesce.then(|| Lanes::new(self.batch_evaluations)),
            }),
        })
    }
}

impl<C> RedisBackendBuilder<C> {
    /// The target of `redis://` and `rediss://` URLs (one node, or a Cluster's seeds) and its
    /// name in logs and errors (the URLs without credentials).
    fn url_target(
        &self,
        connection: redis::AsyncConnectionConfig,
        scripts: &Arc<Scripts>,
        connect_timeout: Duration,
    ) -> Result<(Target, String), InvalidRedisConfig> {
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
        let connect = crate::tls::prepare(&urls, &self.tls)?;
        let cluster = self.cluster.unwrap_or(urls.len() > 1);
        let node = urls
            .iter()
            .map(|u| without_credentials(u))
            .collect::<Vec<_>>()
            .join(",");
        let target = if cluster {
            let limits = (connect_timeout, self.timeout);
            cluster_target(urls, connect, node.clone(), scripts, limits)?
        } else {
            let info = connect.connection_info(&urls[0])?;
            Target::Single(NodeConn::new(
                Source::Url(info),
                node.clone(),
                connection,
                Arc::clone(scripts),
                attempt_limit(connect_timeout),
            ))
        };
        Ok((target, node))
    }
}

// Node health (see `health.rs`).
impl<C> RedisBackendBuilder<C> {
    /// How many failed rounds in a row make a node count as down (default
    /// [`DEFAULT_FAILURE_THRESHOLD`](crate::DEFAULT_FAILURE_THRESHOLD), at least 1).
    ///
    /// A round is a failure (a refused or lost connection, a timeout, `READONLY`, `LOADING`,
    /// `MASTERDOWN`, `BUSY`, `OOM`, a Cluster error the Cluster client gave up on) of a call
    /// that began after the node's previous counted failure, so calls that stalled together
    /// count once, and any answer from the node ends the streak. A timeout fails only the
    /// request that timed out. While a node is down, checks of its keys fail fast with a
    /// [`BackendError::Connection`](turnstile_core::BackendError::Connection) holding
    /// [`NodeDown`](crate::NodeDown); after the retry interval ([`retry_interval`](Self::retry_interval)) one
    /// check goes through as a probe and brings the node back when it succeeds. On a Cluster
    /// health is kept per master: a dead master never fails the keys of the others.
    ///
    /// # Errors
    /// [`build`](Self::build) returns [`InvalidRedisConfig::FailureThreshold`] for 0.
    pub fn failure_threshold(mut self, rounds: u32) -> Self {
        self.health.failure_threshold = rounds;
        self
    }
}

/// A Cluster of seed `urls`, connected as `connect` says; `limits` are the connection
/// timeout and the per-call timeout.
fn cluster_target(
    urls: Vec<String>,
    connect: crate::tls::Connect,
    node: String,
    scripts: &Arc<Scripts>,
    (connect_timeout, timeout): (Duration, Duration),
) -> Result<Target, InvalidRedisConfig> {
    let make = move |seeds: Vec<String>| {
        connect
            .cluster_certificates(redis::cluster::ClusterClientBuilder::new(seeds))
            .connection_timeout(connect_timeout)
            .response_timeout(connect_timeout)
            .overall_response_timeout(None)
            .build()
    };
    let cluster = ClusterConn::new(
        urls,
        Box::new(make),
        node,
        Arc::clone(scripts),
        connect_timeout,
        // A master answers a read well within this, or counts as not answering.
        timeout.max(Duration::from_millis(250)),
    )
    .map_err(|e| InvalidRedisConfig::Url(e.to_string()))?;
    Ok(Target::Cluster(cluster))
}

/// The longest one attempt to connect to a single node may take: the connection with its
/// handshake (bounded by `connect_timeout` in redis-rs, after asking the Sentinels), then the
/// server checks and the library's load.
fn attempt_limit(connect_timeout: Duration) -> Duration {
    connect_timeout.saturating_mul(2)
}

#[cfg(feature = "sentinel")]
fn sentinel_target(
    spec: sentinel::SentinelSpec,
    name: String,
    connection: redis::AsyncConnectionConfig,
    scripts: &Arc<Scripts>,
    connect_timeout: Duration,
) -> Result<Target, InvalidRedisConfig> {
    Ok(Target::Single(NodeConn::new(
        Source::Sentinel(spec),
        name,
        connection,
        Arc::clone(scripts),
        // The Sentinels are asked first.
        attempt_limit(connect_timeout).saturating_add(connect_timeout),
    )))
}

#[cfg(not(feature = "sentinel"))]
fn sentinel_target(
    _: sentinel::SentinelSpec,
    _: String,
    _: redis::AsyncConnectionConfig,
    _: &Arc<Scripts>,
    _: Duration,
) -> Result<Target, InvalidRedisConfig> {
    Err(InvalidRedisConfig::Url(
        "redis+sentinel:// URLs need turnstile-redis's `sentinel` feature".into(),
    ))
}

/// `url` without its user and password: `redis://host:port/db`.
fn without_credentials(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}{}", &url[..scheme + 3], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::without_credentials;

    #[test]
    fn nodes_are_named_without_credentials() {
        assert_eq!(
            without_credentials("redis://user:secret@10.0.0.1:6379/2"),
            "redis://10.0.0.1:6379/2"
        );
        assert_eq!(
            without_credentials("redis://127.0.0.1:6379"),
            "redis://127.0.0.1:6379"
        );
    }
}
