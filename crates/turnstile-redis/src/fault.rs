//! What a failed call says about the node and about the call: reconnect or keep the
//! connection, retry once or never, count against the node or not.

use std::sync::Arc;
use std::time::Duration;

use redis::{ErrorKind, RedisError, ServerErrorKind};
use turnstile_core::BackendError;

use crate::error::TlsHandshakeError;
use crate::server::{Refused, UnsupportedRedisVersion};

/// How the backend treats one failed call (see [`classify`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    /// No connection could be made, and nothing answered that it will not be (refused, reset
    /// or closed in the handshake, no primary named by the Sentinels): the node is away for
    /// now, as during a restart or a failover. Nothing was sent. Retried once on a fresh
    /// connection; counts against the node; cheap to try again soon.
    Unreachable,
    /// A connection was answered with a refusal (wrong credentials, an ACL, not the Redis
    /// protocol): nothing was sent. Retried once on a fresh connection; counts against the
    /// node.
    Rejected,
    /// The node answered that it cannot serve us, and the script did not run: `READONLY` (a
    /// primary demoted to a replica, or an address that now leads to a replica), `LOADING`,
    /// `MASTERDOWN`. The connection is dropped and the call retried once on a fresh one;
    /// counts against the node when the retry fails too.
    CannotServe,
    /// `NOSCRIPT`, or `FCALL`'s "Function not found", reached us (a `SCRIPT FLUSH` or
    /// `FUNCTION FLUSH` raced the reload): the script did not run. Retried once; does not
    /// count against the node.
    NoScript,
    /// The connection broke while the call was on it: the script may have run. Never retried
    /// (it could charge twice); the connection is replaced; counts against the node.
    Dropped,
    /// The node is overloaded or refuses writes for now: `BUSY` (a long script), `OOM`,
    /// `NOREPLICAS`. The connection is kept; never retried; counts against the node.
    Overloaded,
    /// A Cluster condition the Cluster client handles itself (`CLUSTERDOWN`, `TRYAGAIN`,
    /// `MOVED`, `ASK`, no connection to the slot's node) and gave up on: counts against the
    /// node.
    Cluster,
    /// The call timed out, or a connection attempt did (no answer at all): it fails; it
    /// counts against the node as one failed round.
    Timeout,
    /// The node answered with an error about this request (a script error, a key's state):
    /// the node is alive.
    Request,
    /// The request was refused before anything was sent (an invalid request): says nothing
    /// about the node.
    Local,
    /// The server's version is older than the scripts need: counts against the node, so it
    /// is only probed now and then.
    Unsupported,
}

impl Fault {
    /// Whether the connection the call used must be replaced.
    pub(crate) fn reconnects(self) -> bool {
        matches!(self, Fault::CannotServe | Fault::Dropped)
    }

    /// Whether the call provably did not run the script, so one retry cannot charge twice.
    pub(crate) fn retries(self) -> bool {
        matches!(
            self,
            Fault::Unreachable | Fault::Rejected | Fault::CannotServe | Fault::NoScript
        )
    }

    /// Whether the failure was told at once and says the node is away for a moment (a
    /// restart, a failover): nothing timed out, so finding out whether it is back costs
    /// little, and a node that counts as down for such failures only is probed again soon
    /// rather than after the retry interval.
    pub(crate) fn quick(self) -> bool {
        matches!(
            self,
            Fault::Unreachable | Fault::Dropped | Fault::CannotServe
        )
    }

    /// Whether the failure is evidence that the node cannot serve.
    pub(crate) fn counts_against_node(self) -> bool {
        matches!(
            self,
            Fault::Unreachable
                | Fault::Rejected
                | Fault::CannotServe
                | Fault::Dropped
                | Fault::Overloaded
                | Fault::Cluster
                | Fault::Timeout
                | Fault::Unsupported
        )
    }
}

/// What `e`, the error of a call on an established connection, says.
pub(crate) fn classify(e: &RedisError) -> Fault {
    if is_function_not_found(e) {
        return Fault::NoScript;
    }
    match e.kind() {
        ErrorKind::Io => Fault::Dropped,
        ErrorKind::Parse => Fault::Dropped,
        ErrorKind::ClusterConnectionNotFound => Fault::Cluster,
        ErrorKind::Server(kind) => match kind {
            ServerErrorKind::ReadOnly
            | ServerErrorKind::BusyLoading
            | ServerErrorKind::MasterDown => Fault::CannotServe,
            ServerErrorKind::NoScript => Fault::NoScript,
            ServerErrorKind::Moved
            | ServerErrorKind::Ask
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown => Fault::Cluster,
            _ => Fault::Request,
        },
        ErrorKind::Extension => match e.code() {
            Some("BUSY" | "OOM" | "NOREPLICAS") => Fault::Overloaded,
            _ => Fault::Request,
        },
        _ => Fault::Request,
    }
}

/// Whether `e` is `FCALL`'s "Function not found" (a restart without persistence, `FUNCTION
/// FLUSH`, a library deleted by another release): nothing ran.
pub(crate) fn is_function_not_found(e: &RedisError) -> bool {
    e.code() == Some("ERR")
        && e.detail()
            .is_some_and(|d| d.starts_with("Function not found"))
}

/// A failed call: the error the caller gets and what it says about the node.
#[derive(Debug)]
pub(crate) struct Failed {
    pub(crate) error: BackendError,
    pub(crate) fault: Fault,
}

impl Failed {
    /// A failure of a call to `node` on an established connection.
    pub(crate) fn call(e: RedisError, node: &str) -> Self {
        Failed {
            fault: classify(&e),
            error: redis_error(e, node),
        }
    }

    /// An error raised before anything was sent.
    pub(crate) fn local(error: BackendError) -> Self {
        Failed {
            error,
            fault: Fault::Local,
        }
    }

    /// The per-call timeout elapsed.
    pub(crate) fn timeout(after: Duration) -> Self {
        Failed {
            error: BackendError::Timeout { after },
            fault: Fault::Timeout,
        }
    }
}

/// A connection attempt that failed, kept to be told to every call that waited for it (a
/// [`BackendError`] cannot be cloned).
#[derive(Clone, Debug)]
pub(crate) enum NoConnection {
    /// Connecting to `node` failed with `error`.
    Connect { error: RedisError, node: Arc<str> },
    /// The server is too old.
    Version(UnsupportedRedisVersion),
    /// Nothing answered within this time.
    Unanswered(Duration),
}

impl NoConnection {
    /// The failure of connecting to `node` with `e`.
    pub(crate) fn connect(e: RedisError, node: &str) -> Self {
        NoConnection::Connect {
            error: e,
            node: Arc::from(node),
        }
    }

    /// A connection to `node` the server checks refused.
    pub(crate) fn refused(r: Refused, node: &str) -> Self {
        match r {
            Refused::Connection(e) => NoConnection::connect(e, node),
            Refused::Version(v) => NoConnection::Version(v),
        }
    }

    /// How the failure is treated.
    pub(crate) fn fault(&self) -> Fault {
        match self {
            NoConnection::Connect { error, .. } if error.is_timeout() => Fault::Timeout,
            NoConnection::Connect { error, .. } if is_away(error) => Fault::Unreachable,
            NoConnection::Connect { .. } => Fault::Rejected,
            NoConnection::Version(_) => Fault::Unsupported,
            NoConnection::Unanswered(_) => Fault::Timeout,
        }
    }

    /// The failure a call gets.
    pub(crate) fn failed(&self) -> Failed {
        let error = match self {
            NoConnection::Connect { error, node } if is_not_redis(error) => not_redis(error, node),
            NoConnection::Connect { error, node } => match tls_failure(error, node) {
                Some(tls) => BackendError::Connection(Box::new(tls)),
                None => BackendError::Connection(Box::new(error.clone())),
            },
            NoConnection::Version(v) => BackendError::Connection(Box::new(v.clone())),
            NoConnection::Unanswered(after) => BackendError::Timeout { after: *after },
        };
        Failed {
            error,
            fault: self.fault(),
        }
    }
}

/// Whether a failed connection attempt says the node is away for now rather than refusing
/// us: refused, reset or closed before the handshake ended (a server stopping or restarting),
/// or no primary named by the Sentinels (a failover in progress).
fn is_away(e: &RedisError) -> bool {
    !is_not_redis(e)
        && (e.is_connection_refusal()
            || e.is_connection_dropped()
            || e.kind() == ErrorKind::MasterNameNotFoundBySentinel)
}

/// Whether `e` says the reply was not the Redis protocol (RESP). Scripts' replies are taken
/// as `redis::Value`, so no conversion of a reply raises a parse error of its own. A
/// Cluster's seed connections report their errors as text only (an I/O error "Failed to
/// create initial connections" whose detail is the last node's error): there, the decoder's
/// "Parse error at" is the sign.
fn is_not_redis(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Parse
        || (e.kind() == ErrorKind::Io && e.detail().is_some_and(|d| d.contains("Parse error at")))
}

/// Something other than Redis answered at `node` (an HTTP server on the Redis port, say): no
/// Redis can be reached there.
fn not_redis(e: &RedisError, node: &str) -> BackendError {
    // redis-rs's parse errors span lines: keep the message on one.
    let why = e.to_string();
    let why: Vec<&str> = why
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    BackendError::Connection(
        format!(
            "not a Redis server at {node}: its reply is not the Redis protocol ({})",
            why.join("; ")
        )
        .into(),
    )
}

/// The failed TLS handshake under `e`, if that is what failed: redis-rs keeps the I/O error
/// of a connection attempt as its source (behind an `Arc`), and tokio-rustls puts rustls's
/// error in that.
#[cfg(feature = "tls")]
fn tls_failure(e: &RedisError, node: &str) -> Option<TlsHandshakeError> {
    type Shared = Arc<dyn std::error::Error + Send + Sync>;
    let mut cause = std::error::Error::source(e);
    while let Some(mut c) = cause {
        if let Some(shared) = c.downcast_ref::<Shared>() {
            c = &**shared;
        }
        if let Some(inner) = c
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
        {
            c = inner;
        }
        if let Some(tls) = c.downcast_ref::<rustls::Error>() {
            return Some(TlsHandshakeError::new(node, tls.to_string()));
        }
        cause = c.source();
    }
    None
}

/// Without the `tls` feature no connection uses TLS.
#[cfg(not(feature = "tls"))]
fn tls_failure(_: &RedisError, _: &str) -> Option<TlsHandshakeError> {
    None
}

/// The [`BackendError`] of a Redis error from `node` (as `RedisBackend::node` names it).
pub(crate) fn redis_error(e: RedisError, node: &str) -> BackendError {
    if is_not_redis(&e) {
        return not_redis(&e, node);
    }
    if let Some(tls) = tls_failure(&e, node) {
        return BackendError::Connection(Box::new(tls));
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
    } else if e.code() == Some("TURNSTILE_TOO_MANY_POLICIES") {
        // A set over the cap (turnstile_core::MAX_POLICIES), refused by the script itself.
        BackendError::InvalidRequest(format!(
            "too many policies: {}",
            e.detail().unwrap_or_default()
        ))
    } else {
        BackendError::Script(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::{parse_redis_value, Value};

    /// The error of a server reply such as `-READONLY You can't write ...`.
    fn reply(line: &str) -> RedisError {
        match parse_redis_value(format!("{line}\r\n").as_bytes()).unwrap() {
            v @ Value::ServerError(_) => v.extract_error().unwrap_err(),
            other => panic!("not an error reply: {other:?}"),
        }
    }

    #[test]
    fn replies_that_mean_this_node_cannot_serve_reconnect_and_retry_once() {
        for line in [
            "-READONLY You can't write against a read only replica.",
            "-LOADING Redis is loading the dataset in memory",
            "-MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
        ] {
            let f = classify(&reply(line));
            assert_eq!(f, Fault::CannotServe, "{line}");
            assert!(f.reconnects() && f.retries() && f.counts_against_node());
        }
    }

    #[test]
    fn busy_and_oom_count_against_the_node_but_keep_the_connection() {
        for line in [
            "-BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.",
            "-OOM command not allowed when used memory > 'maxmemory'.",
            "-NOREPLICAS Not enough good replicas to write.",
        ] {
            let f = classify(&reply(line));
            assert_eq!(f, Fault::Overloaded, "{line}");
            assert!(!f.reconnects() && !f.retries() && f.counts_against_node());
        }
    }

    #[test]
    fn cluster_conditions_stay_the_cluster_clients_and_are_never_retried_here() {
        for line in [
            "-CLUSTERDOWN The cluster is down",
            "-TRYAGAIN Multiple keys request during rehashing of slot",
            "-MOVED 3999 127.0.0.1:6381",
        ] {
            let f = classify(&reply(line));
            assert_eq!(f, Fault::Cluster, "{line}");
            assert!(!f.reconnects() && !f.retries() && f.counts_against_node());
        }
    }

    #[test]
    fn noscript_is_retried_without_blaming_the_node() {
        for line in [
            "-NOSCRIPT No matching script. Please use EVAL.",
            "-ERR Function not found",
        ] {
            let f = classify(&reply(line));
            assert_eq!(f, Fault::NoScript, "{line}");
            assert!(f.retries() && !f.reconnects() && !f.counts_against_node());
        }
    }

    #[test]
    fn failed_connections_tell_a_node_away_from_one_refusing_us_or_not_answering() {
        use std::io::{Error, ErrorKind as Io};
        let fault = |e: RedisError| NoConnection::connect(e, "redis://n").fault();
        for away in [
            RedisError::from(Error::from(Io::ConnectionRefused)),
            RedisError::from(Error::from(Io::ConnectionReset)),
            RedisError::from(Error::from(Io::UnexpectedEof)),
            RedisError::from((ErrorKind::MasterNameNotFoundBySentinel, "no primary")),
        ] {
            assert_eq!(fault(away.clone()), Fault::Unreachable, "{away}");
        }
        assert_eq!(fault(Error::from(Io::TimedOut).into()), Fault::Timeout);
        for rejected in [
            RedisError::from((ErrorKind::AuthenticationFailed, "WRONGPASS")),
            RedisError::from((ErrorKind::Parse, "not RESP")),
            RedisError::from(Error::from(Io::InvalidData)),
        ] {
            assert_eq!(fault(rejected.clone()), Fault::Rejected, "{rejected}");
        }
        let not_redis = NoConnection::connect((ErrorKind::Parse, "bad").into(), "redis://n");
        assert!(not_redis
            .failed()
            .error
            .to_string()
            .contains("not a Redis server at redis://n"));
        let late = NoConnection::Unanswered(Duration::from_millis(250)).failed();
        assert_eq!(late.fault, Fault::Timeout);
        assert!(matches!(late.error, BackendError::Timeout { after } if after.as_millis() == 250));
        // Only a node away for a moment is probed again soon.
        for f in [Fault::Unreachable, Fault::Dropped, Fault::CannotServe] {
            assert!(f.quick() && f.counts_against_node(), "{f:?}");
        }
        for f in [
            Fault::Timeout,
            Fault::Rejected,
            Fault::Overloaded,
            Fault::Cluster,
            Fault::Unsupported,
        ] {
            assert!(!f.quick() && f.counts_against_node(), "{f:?}");
        }
    }

    #[test]
    fn a_lost_connection_or_a_timeout_is_never_retried() {
        let dropped = RedisError::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        let f = classify(&dropped);
        assert_eq!(f, Fault::Dropped);
        assert!(!f.retries() && f.reconnects() && f.counts_against_node());
        let t = Failed::timeout(Duration::from_millis(100));
        assert!(!t.fault.retries() && t.fault.counts_against_node());
        assert!(matches!(t.error, BackendError::Timeout { .. }));
    }

    #[test]
    fn errors_about_the_request_say_the_node_is_alive() {
        for line in [
            "-ERR Error running script (call to f_1234): @user_script:1: bad",
            "-TURNSTILE_INVALID_STATE key k holds a list",
            "-NOPERM this user has no permissions to run the 'evalsha' command",
        ] {
            let f = classify(&reply(line));
            assert_eq!(f, Fault::Request, "{line}");
            assert!(!f.counts_against_node() && !f.retries() && !f.reconnects());
        }
        let e = Failed::call(
            reply("-TURNSTILE_INVALID_STATE key k holds a list"),
            "redis://n",
        );
        assert!(
            matches!(e.error, BackendError::InvalidState(_)),
            "{:?}",
            e.error
        );
    }
}
