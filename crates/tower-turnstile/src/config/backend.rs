//! [`BackendConfig`]: the file's `[backend]` table.

use std::path::{Path, PathBuf};
use std::time::Duration;

use turnstile_core::FailurePolicy;

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
/// | `failure` | `local`, `open` or `closed` ([`FailurePolicy`]) | `local` |
/// | `max_keys` | the in-memory backend's cap on tracked keys | none |
/// | `max_key_bytes` | the longest client key, in bytes: longer ones get `400` / `INVALID_ARGUMENT` ([`RateLimitLayerBuilder::max_key_bytes`](crate::RateLimitLayerBuilder::max_key_bytes)); a Redis backend must take keys this long (`RedisBackendBuilder::max_key_bytes`) | 512 |
/// | `tls_ca` | with a `rediss://` url: a PEM file of the CA certificate(s) that verify the server, in place of the system trust store | the system trust store |
/// | `tls_cert`, `tls_key` | with a `rediss://` url: PEM files of the client certificate (chain) and its private key, for mutual TLS; one needs the other | none |
///
/// File paths are used as written: a relative path is relative to the service's working
/// directory. The files are read when the Redis backend is built
/// (`RedisBackendBuilder::tls_ca_file`, `tls_client_cert`), not here.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BackendConfig {
    pub(super) url: Option<String>,
    pub(super) prefix: Option<String>,
    pub(super) timeout: Option<Duration>,
    pub(super) failure: Option<FailurePolicy>,
    pub(super) max_keys: Option<usize>,
    pub(super) max_key_bytes: Option<usize>,
    pub(super) tls_ca: Option<PathBuf>,
    pub(super) tls_client: Option<(PathBuf, PathBuf)>,
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
    pub fn failure_setting(&self) -> Option<FailurePolicy> {
        self.failure
    }

    /// The failure behaviour (default [`FailurePolicy::Local`]).
    pub fn failure(&self) -> FailurePolicy {
        self.failure.unwrap_or_default()
    }

    /// The in-memory backend's key cap, if the file sets one.
    pub fn max_keys(&self) -> Option<usize> {
        self.max_keys
    }

    /// The longest client key in bytes, if the file sets one (`max_key_bytes`): the layer's
    /// cap ([`LayerConfig::builder`](super::LayerConfig::builder) sets it), which a Redis
    /// backend built from these settings must take too.
    pub fn max_key_bytes(&self) -> Option<usize> {
        self.max_key_bytes
    }

    /// The PEM file of the CA certificate(s) that verify a `rediss://` server, if the file
    /// sets one (`tls_ca`).
    pub fn tls_ca(&self) -> Option<&Path> {
        self.tls_ca.as_deref()
    }

    /// The PEM files of the client certificate and its private key for mutual TLS, if the
    /// file sets them (`tls_cert` and `tls_key`, always together).
    pub fn tls_client_cert(&self) -> Option<(&Path, &Path)> {
        self.tls_client
            .as_ref()
            .map(|(cert, key)| (cert.as_path(), key.as_path()))
    }
}
