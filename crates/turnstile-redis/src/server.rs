//! What every new connection checks on the server: its version (typed error when too old)
//! and its eviction policy (one warning when it would evict limiter state).

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};

use redis::{aio::MultiplexedConnection, ErrorKind, RedisError, Value};

/// The oldest Redis the scripts run on: 5.0.0. They call `TIME` and then write, which needs
/// effects replication, the default since Redis 5 (older servers refuse such scripts);
/// everything else they use (`EVALSHA`, `SET .. PX`, `PSETEX`, `PEXPIRE`, hashes, lists) is older.
/// Redis Functions (`FUNCTION LOAD`, `FCALL`) need Redis 7.0; before it the backend runs the
/// scripts with `EVALSHA` (see [`ScriptMode`](crate::ScriptMode)).
pub const MIN_REDIS_VERSION: (u32, u32, u32) = (5, 0, 0);

/// The server's `redis_version` (from `INFO server`) is older than [`MIN_REDIS_VERSION`].
///
/// Carried as the source of a
/// [`BackendError::Connection`](turnstile_core::BackendError::Connection); logged once per
/// backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnsupportedRedisVersion {
    node: String,
    found: String,
}

impl UnsupportedRedisVersion {
    /// The node, as logs name it.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The version the server reported (`redis_version`).
    pub fn found(&self) -> &str {
        &self.found
    }
}

impl fmt::Display for UnsupportedRedisVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (a, b, c) = MIN_REDIS_VERSION;
        write!(
            f,
            "Redis at {} is version {}; turnstile's scripts need Redis {a}.{b}.{c} or later",
            self.node, self.found
        )
    }
}

impl std::error::Error for UnsupportedRedisVersion {}

/// `major.minor.patch` of a version string such as `7.0.15` or `5.0.14-rc1`.
pub(crate) fn parse_version(v: &str) -> Option<(u32, u32, u32)> {
    let mut parts = v.trim().split('.').map(|p| {
        let digits: String = p.chars().take_while(char::is_ascii_digit).collect();
        digits.parse::<u32>().ok()
    });
    let major = parts.next()??;
    let minor = parts.next().flatten().unwrap_or(0);
    let patch = parts.next().flatten().unwrap_or(0);
    Some((major, minor, patch))
}

/// The value of `field` in an `INFO` reply.
pub(crate) fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        line.strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(str::trim)
    })
}

/// Whether `maxmemory-policy` may evict turnstile's keys. Every key has a TTL, so the
/// `volatile-*` policies evict them as readily as the `allkeys-*` ones: only `noeviction`
/// keeps them (Redis then refuses writes with `OOM` instead).
pub(crate) fn evicts_our_keys(policy: &str) -> bool {
    !policy.eq_ignore_ascii_case("noeviction")
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

/// The second element of a `CONFIG GET name` reply (an array in RESP2, a map in RESP3).
fn config_value(v: &Value) -> Option<String> {
    match v {
        Value::Array(items) => items.get(1).and_then(text),
        Value::Map(pairs) => pairs.first().and_then(|(_, v)| text(v)),
        _ => None,
    }
}

/// What a backend has already said about its servers, so each thing is said once.
#[derive(Debug, Default)]
pub(crate) struct ServerChecks {
    version_logged: AtomicBool,
    eviction_logged: AtomicBool,
}

/// Where a check's command goes: a plain connection, or a Cluster's routing.
pub(crate) trait Query: Send {
    fn query(&mut self, cmd: &redis::Cmd)
        -> impl Future<Output = Result<Value, RedisError>> + Send;
}

/// A node's multiplexed connection: its own `send_packed_command`, what `ConnectionLike`'s
/// `req_packed_command` runs after boxing its future (one allocation per call saved).
impl Query for MultiplexedConnection {
    async fn query(&mut self, cmd: &redis::Cmd) -> Result<Value, RedisError> {
        self.send_packed_command(cmd).await
    }
}

/// Whether a failure of a check's command means the connection is unusable (rather than the
/// command refused, e.g. by an ACL).
pub(crate) fn is_connection_failure(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Io || e.is_connection_dropped() || e.is_unrecoverable_error()
}

/// Why a new connection is not to be used.
#[derive(Clone, Debug)]
pub(crate) enum Refused {
    /// A check's command failed on the connection itself.
    Connection(RedisError),
    /// The server is too old.
    Version(UnsupportedRedisVersion),
}

impl ServerChecks {
    /// Checks the server behind `conn` (named `node` in logs): its version must be at least
    /// [`MIN_REDIS_VERSION`], and its eviction policy is warned about once when it would
    /// evict our keys. A server that refuses `INFO` or `CONFIG GET` (an ACL) is not judged.
    ///
    /// # Errors
    /// [`Refused::Version`] for a server that is too old (logged once per backend);
    /// [`Refused::Connection`] when the connection failed under the checks.
    pub(crate) async fn run(&self, conn: &mut impl Query, node: &str) -> Result<(), Refused> {
        let mut info = redis::cmd("INFO");
        info.arg("server");
        match conn.query(&info).await {
            Ok(v) => {
                let found = text(&v)
                    .as_deref()
                    .and_then(|i| info_field(i, "redis_version"))
                    .map(str::to_owned);
                if let Some(found) = found {
                    if parse_version(&found).is_some_and(|v| v < MIN_REDIS_VERSION) {
                        let e = UnsupportedRedisVersion {
                            node: node.to_owned(),
                            found,
                        };
                        if !self.version_logged.swap(true, Ordering::Relaxed) {
                            tracing::error!(node, version = %e.found, "{e}");
                        }
                        return Err(Refused::Version(e));
                    }
                }
            }
            Err(e) if is_connection_failure(&e) => return Err(Refused::Connection(e)),
            Err(_) => {}
        }
        if self.eviction_logged.load(Ordering::Relaxed) {
            return Ok(());
        }
        let mut get = redis::cmd("CONFIG");
        get.arg("GET").arg("maxmemory-policy");
        match conn.query(&get).await {
            Ok(v) => {
                if let Some(policy) = config_value(&v) {
                    if evicts_our_keys(&policy)
                        && !self.eviction_logged.swap(true, Ordering::Relaxed)
                    {
                        tracing::warn!(
                            node,
                            policy = %policy,
                            "Redis maxmemory-policy is {policy}: when memory runs short Redis evicts keys with a TTL, and every rate-limit key has one, so quotas reset silently; set maxmemory-policy noeviction (Redis then refuses writes with OOM, which the failure policy handles)"
                        );
                    }
                }
            }
            Err(e) if is_connection_failure(&e) => return Err(Refused::Connection(e)),
            Err(_) => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_and_compare() {
        assert_eq!(parse_version("7.0.15"), Some((7, 0, 15)));
        assert_eq!(parse_version("5.0.14-rc1"), Some((5, 0, 14)));
        assert_eq!(parse_version("6.2"), Some((6, 2, 0)));
        assert_eq!(parse_version("x"), None);
        assert!(parse_version("4.0.14").unwrap() < MIN_REDIS_VERSION);
        assert!(parse_version("5.0.0").unwrap() >= MIN_REDIS_VERSION);
        let info = "# Server\r\nredis_version:4.0.14\r\nredis_git_sha1:00000000\r\n";
        assert_eq!(info_field(info, "redis_version"), Some("4.0.14"));
        assert_eq!(info_field(info, "redis_mode"), None);
    }

    #[test]
    fn only_noeviction_keeps_limiter_state() {
        for p in [
            "allkeys-lru",
            "allkeys-lfu",
            "allkeys-random",
            "volatile-lru",
            "volatile-lfu",
            "volatile-random",
            "volatile-ttl",
        ] {
            assert!(evicts_our_keys(p), "{p}");
        }
        assert!(!evicts_our_keys("noeviction"));
    }

    #[test]
    fn config_get_replies_parse_in_both_protocols() {
        let s = |v: &str| Value::BulkString(v.as_bytes().to_vec());
        let resp2 = Value::Array(vec![s("maxmemory-policy"), s("allkeys-lru")]);
        let resp3 = Value::Map(vec![(s("maxmemory-policy"), s("volatile-ttl"))]);
        assert_eq!(config_value(&resp2).as_deref(), Some("allkeys-lru"));
        assert_eq!(config_value(&resp3).as_deref(), Some("volatile-ttl"));
        let e = UnsupportedRedisVersion {
            node: "redis://127.0.0.1:6379".into(),
            found: "4.0.14".into(),
        };
        assert_eq!(
            e.to_string(),
            "Redis at redis://127.0.0.1:6379 is version 4.0.14; turnstile's scripts need Redis 5.0.0 or later"
        );
    }
}
