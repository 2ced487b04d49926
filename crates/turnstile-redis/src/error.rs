//! [`InvalidRedisConfig`]: why a Redis backend could not be built.

use std::fmt;

/// Why a [`RedisBackend`](crate::RedisBackend) could not be built.
#[derive(Debug)]
#[non_exhaustive]
pub enum InvalidRedisConfig {
    /// The URL did not parse (`redis://[user:password@]host:port[/db]`, `rediss://` for TLS,
    /// several comma-separated URLs for a Cluster,
    /// `redis+sentinel://[user:password@]host[:port][,host[:port]...]/service[/db]` for
    /// Sentinel, with the `sentinel` feature).
    Url(String),
    /// The prefix was empty or held `{` or `}` (it must not start a Cluster hash tag).
    Prefix(String),
    /// The failure threshold was 0 (see [`RedisBackendBuilder::failure_threshold`](crate::RedisBackendBuilder::failure_threshold)).
    FailureThreshold(u32),
    /// The most policy evaluations per call of coalesced checks was 0 or above
    /// [`MAX_BATCH_EVALUATIONS`](crate::MAX_BATCH_EVALUATIONS) (see
    /// [`RedisBackendBuilder::batch_evaluations`](crate::RedisBackendBuilder::batch_evaluations)).
    BatchEvaluations(usize),
    /// The TLS settings cannot work: a `rediss://` URL without the `tls` feature; a CA file
    /// or client certificate without a `rediss://` URL (Sentinel URLs included: TLS through
    /// Sentinel is not supported); `rediss://` and `redis://` nodes mixed; a CA file with
    /// `#insecure`; a file that cannot be read, holds no certificate (or no private key), is
    /// not valid PEM (RFC 7468) or DER (RFC 5280); a key that does not belong to its
    /// certificate; a system trust store that cannot be read, or is empty when no CA file is
    /// given.
    Tls(String),
}

impl fmt::Display for InvalidRedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InvalidRedisConfig::Url(e) => write!(f, "invalid Redis URL: {e}"),
            InvalidRedisConfig::Prefix(p) => write!(
                f,
                "invalid key prefix {p:?}: it must be non-empty and hold no '{{' or '}}'"
            ),
            InvalidRedisConfig::FailureThreshold(n) => write!(
                f,
                "invalid failure threshold {n}: a node counts as down after at least 1 failed round"
            ),
            InvalidRedisConfig::BatchEvaluations(n) => write!(
                f,
                "invalid batch evaluations {n}: a call of coalesced checks makes from 1 to {} policy evaluations",
                crate::MAX_BATCH_EVALUATIONS
            ),
            InvalidRedisConfig::Tls(e) => write!(f, "invalid Redis TLS settings: {e}"),
        }
    }
}

impl std::error::Error for InvalidRedisConfig {}

/// A TLS handshake with a Redis node failed (RFC 8446): the server's certificate is not
/// trusted by the configured CA or trust store, has expired, or names another host; or the
/// server refused our client certificate. Carried as the source of
/// [`BackendError::Connection`](turnstile_core::BackendError::Connection), so callers can tell
/// it apart from a Redis that is down (`error.downcast_ref::<TlsHandshakeError>()`): no retry
/// fixes it, the TLS settings or the certificates must change.
#[derive(Clone, Debug)]
pub struct TlsHandshakeError {
    node: String,
    reason: String,
}

impl TlsHandshakeError {
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    pub(crate) fn new(node: &str, reason: String) -> Self {
        TlsHandshakeError {
            node: node.to_owned(),
            reason,
        }
    }

    /// The node, as [`RedisBackend::node`](crate::RedisBackend::node) names it (no credentials).
    pub fn node(&self) -> &str {
        &self.node
    }

    /// What the TLS library said failed (for example `invalid peer certificate: UnknownIssuer`).
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for TlsHandshakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the TLS handshake with Redis at {} failed: {}",
            self.node, self.reason
        )
    }
}

impl std::error::Error for TlsHandshakeError {}
