//! The one place where a simulation's backend is chosen.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use clap::{Args, ValueEnum};
use turnstile_core::{Backend, BackendError, Decision, MemoryBackend, Policy};
use turnstile_redis::{RedisBackend, RedisBackendBuilder};

/// TLS for a `rediss://` Redis URL (`turnstile quota`, `turnstile simulate --backend redis`).
#[derive(Clone, Debug, Default, Args)]
pub(crate) struct TlsArgs {
    /// With a rediss:// URL: a PEM file of the CA certificate(s) that verify the server, in
    /// place of the system trust store (which SSL_CERT_FILE and SSL_CERT_DIR can name).
    #[arg(long, value_name = "FILE", global = true)]
    pub(crate) tls_ca: Option<PathBuf>,

    /// With a rediss:// URL: a PEM file of the client certificate (chain), for mutual TLS;
    /// needs --tls-key.
    #[arg(long, value_name = "FILE", requires = "tls_key", global = true)]
    pub(crate) tls_cert: Option<PathBuf>,

    /// The PEM file of --tls-cert's private key (PKCS #8, PKCS #1 or SEC1); needs --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert", global = true)]
    pub(crate) tls_key: Option<PathBuf>,
}

impl TlsArgs {
    /// Whether no TLS file was given.
    pub(crate) fn is_empty(&self) -> bool {
        self.tls_ca.is_none() && self.tls_cert.is_none() && self.tls_key.is_none()
    }

    /// `builder` with these files (read when it is built).
    pub(crate) fn apply(&self, mut builder: RedisBackendBuilder) -> RedisBackendBuilder {
        if let Some(ca) = &self.tls_ca {
            builder = builder.tls_ca_file(ca);
        }
        if let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) {
            builder = builder.tls_client_cert(cert, key);
        }
        builder
    }
}

/// Which backend decides the simulated requests (`--backend`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum BackendKind {
    /// The in-memory backend of `turnstile-core`, with no cap on tracked keys.
    Memory,
    /// Redis at `--redis-url` (a fresh random key prefix per run, deleted at the end).
    Redis,
}

/// A backend as the simulation uses it: one synchronous check at an explicit time.
pub(crate) trait SimBackend {
    /// Checks `key` against every policy with `cost` units at `t_ms` (ms since the trace's
    /// epoch), all-or-nothing.
    fn decide(
        &self,
        key: &str,
        policies: &[Policy],
        cost: u64,
        t_ms: u64,
    ) -> Result<Decision, BackendError>;

    /// Cleans up after the run (Redis: deletes the run's keys).
    fn finish(&self) -> Result<(), BackendError> {
        Ok(())
    }
}

impl SimBackend for MemoryBackend {
    fn decide(
        &self,
        key: &str,
        policies: &[Policy],
        cost: u64,
        t_ms: u64,
    ) -> Result<Decision, BackendError> {
        self.check_at(key, policies, cost, t_ms).into_inner()
    }
}

/// Redis driven from the synchronous simulation loop through a single-threaded runtime.
struct RedisSim {
    runtime: tokio::runtime::Runtime,
    backend: RedisBackend,
}

impl SimBackend for RedisSim {
    fn decide(
        &self,
        key: &str,
        policies: &[Policy],
        cost: u64,
        t_ms: u64,
    ) -> Result<Decision, BackendError> {
        self.runtime
            .block_on(self.backend.check_at(key, policies, cost, t_ms))
    }

    fn finish(&self) -> Result<(), BackendError> {
        self.runtime
            .block_on(self.backend.delete_prefix())
            .map(drop)
    }
}

/// A key prefix no other run and no other backend of this run uses: the time in ns, the
/// process id and a count of the backends this process opened (`--compare` opens one per
/// candidate, possibly within one tick of the clock).
fn fresh_prefix() -> String {
    static OPENED: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let n = OPENED.fetch_add(1, Ordering::Relaxed);
    format!("turnstile:sim:{nanos:x}{:x}-{n}", std::process::id())
}

/// Opens the backend `kind` names, fresh (no key has any state yet).
///
/// # Errors
/// A message when Redis cannot be set up (a malformed URL, TLS settings that cannot work, no
/// runtime).
pub(crate) fn open(
    kind: BackendKind,
    redis_url: &str,
    tls: &TlsArgs,
) -> Result<Box<dyn SimBackend>, String> {
    match kind {
        // Unbounded: a simulation must never refuse a key for lack of room.
        BackendKind::Memory => Ok(Box::new(MemoryBackend::builder().max_keys(None).build())),
        BackendKind::Redis => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("cannot start a runtime: {e}"))?;
            // A simulation reports Redis failures (it never falls back to local decisions),
            // and every request asks Redis (no deny cache): exact output.
            let backend = tls
                .apply(RedisBackend::builder(redis_url))
                .prefix(fresh_prefix())
                .timeout(Duration::from_secs(10))
                .build()
                .map_err(|e| e.to_string())?;
            Ok(Box::new(RedisSim { runtime, backend }))
        }
    }
}
