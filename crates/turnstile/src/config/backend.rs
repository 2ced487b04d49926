//! [`BackendConfig`]: the file's `[backend]` table.

use std::time::Duration;

use crate::layer::FailurePolicy;

/// What the layer and the backend do when the backend fails (`[backend] failure`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendFailure {
    /// `local` (the default): a Redis backend decides with its local in-memory fallback
    /// (`OnFailure::LocalFallback`); whatever error still reaches the layer admits the request
    /// ([`FailurePolicy::Open`]).
    #[default]
    Local,
    /// `open`: the backend returns its errors (`OnFailure::ReturnError`) and the layer admits
    /// the request ([`FailurePolicy::Open`]).
    Open,
    /// `closed`: the backend returns its errors and the layer answers `503` / gRPC
    /// `UNAVAILABLE` ([`FailurePolicy::Closed`]).
    Closed,
}

impl BackendFailure {
    /// The layer's failure policy: [`FailurePolicy::Closed`] for `closed`, else `Open`.
    pub fn failure_policy(self) -> FailurePolicy {
        match self {
            BackendFailure::Closed => FailurePolicy::Closed,
            BackendFailure::Local | BackendFailure::Open => FailurePolicy::Open,
        }
    }

    /// Whether a Redis backend should fall back to deciding locally (`local`).
    pub fn local_fallback(self) -> bool {
        self == BackendFailure::Local
    }

    pub(super) fn as_str(self) -> &'static str {
        match self {
            BackendFailure::Local => "local",
            BackendFailure::Open => "open",
            BackendFailure::Closed => "closed",
        }
    }
}

/// The `[backend]` table: where rate-limit state lives. turnstile builds the in-memory
/// backend itself ([`LayerConfig::builder`](super::LayerConfig::builder)); for Redis the application builds a
/// `turnstile_redis::RedisBackend` from these settings (see `examples/axum_redis.rs`) and
/// passes it to [`RateLimitLayerBuilder::backend`](crate::RateLimitLayerBuilder::backend).
///
/// | field | meaning | default |
/// | --- | --- | --- |
/// | `url` | Redis (`redis://host:port`, `rediss://` for TLS, several comma-separated for a Cluster) | none: in memory |
/// | `prefix` | the Redis key prefix | the Redis backend's, `turnstile:v1` |
/// | `timeout` | the Redis call timeout, a duration | the Redis backend's, `100ms` |
/// | `failure` | `local`, `open` or `closed` ([`BackendFailure`]) | `local` |
/// | `max_keys` | the in-memory backend's cap on tracked keys | none |
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BackendConfig {
    pub(super) url: Option<String>,
    pub(super) prefix: Option<String>,
    pub(super) timeout: Option<Duration>,
    pub(super) failure: Option<BackendFailure>,
    pub(super) max_keys: Option<usize>,
}

impl BackendConfig {
    /// The Redis URL; `None` for in memory.
    pub fn url(&self) -> Option<&str> {
        self.url.as_deref()
    }

    /// The Redis key prefix, if the file sets one.
    pub fn prefix(&self) -> Option<&str> {
        self.prefix.as_deref()
    }

    /// The Redis call timeout, if the file sets one.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// The failure behaviour, if the file sets one.
    pub fn failure_setting(&self) -> Option<BackendFailure> {
        self.failure
    }

    /// The failure behaviour (default [`BackendFailure::Local`]).
    pub fn failure(&self) -> BackendFailure {
        self.failure.unwrap_or_default()
    }

    /// The in-memory backend's key cap, if the file sets one.
    pub fn max_keys(&self) -> Option<usize> {
        self.max_keys
    }
}
