//! [`RateLimitLayer`]: configuration, shared by every service it builds.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use http::HeaderValue;
use tower_layer::Layer;
use turnstile_core::{BackendError, MemoryBackend, Policy};

use crate::headers::policy_value;
use crate::key::{KeyExtractor, PeerIp};
use crate::service::RateLimit;

/// What the layer does when the backend cannot decide (an error or a timeout).
///
/// The Redis backend has its own, richer failure policy (including a local in-memory
/// fallback); this one applies to whatever error still reaches the layer, such as
/// [`BackendError::CapacityExceeded`] from a capped [`MemoryBackend`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Admit the request without rate-limit headers (the default): a limiter failure does
    /// not take the service down. The error is logged once per incident.
    #[default]
    Open,
    /// Answer `503 Service Unavailable` without calling the inner service.
    Closed,
}

/// Why a layer could not be built.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// No policy was given.
    NoPolicies,
    /// Two policies share a name, so they would share state.
    DuplicatePolicyName(String),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::NoPolicies => f.write_str("a rate-limit layer needs at least one policy"),
            ConfigError::DuplicatePolicyName(n) => write!(
                f,
                "two policies are named {n:?}; names must be unique within a layer"
            ),
        }
    }
}

impl std::error::Error for ConfigError {}

/// A [`tower_layer::Layer`] that rate-limits every request of the service it wraps.
///
/// Each request is keyed (by default by the client's peer IP, see [`PeerIp`]), checked
/// against every policy at once (all-or-nothing) in the backend (by default a
/// [`MemoryBackend`]), and then:
///
/// - **admitted**: passed to the inner service; the response gets `RateLimit-Policy` and
///   `RateLimit` headers (draft-ietf-httpapi-ratelimit-headers-10). A leaky-bucket policy's
///   `delay` is waited out first (shaping).
/// - **denied**: answered `429 Too Many Requests` with `Retry-After` (RFC 9110; whole seconds
///   rounded up, at least 1; absent when no wait can help), both headers, and an RFC 9457
///   problem body. The inner service is never called.
///
/// The layer is cheap to clone (one `Arc`); every service it builds shares one state.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use axum::{routing::get, Router};
/// use turnstile::{Policy, RateLimitLayer};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let per_ip = Policy::token_bucket(10, Duration::from_secs(60))?.with_name("per-ip")?;
/// let app: Router = Router::new()
///     .route("/", get(|| async { "hello" }))
///     .layer(RateLimitLayer::new(per_ip));
/// // serve with `app.into_make_service_with_connect_info::<std::net::SocketAddr>()`
/// # let _ = app; Ok(()) }
/// ```
pub struct RateLimitLayer<B = MemoryBackend, K = PeerIp> {
    pub(crate) config: Arc<Config<B, K>>,
}

pub(crate) struct Config<B, K> {
    pub(crate) backend: B,
    pub(crate) policies: Arc<[Policy]>,
    pub(crate) key: K,
    pub(crate) shared: Arc<Shared>,
}

/// What a response future needs after the check, independent of the backend and key types.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) policy_header: HeaderValue,
    pub(crate) failure: FailurePolicy,
    /// Whether a backend incident is in progress (logged once when it starts).
    incident: AtomicBool,
    /// Whether the missing-peer-address misconfiguration was logged already.
    warned_key: AtomicBool,
}

impl Shared {
    pub(crate) fn backend_failed(&self, e: &BackendError) {
        if !self.incident.swap(true, Ordering::Relaxed) {
            tracing::warn!(error = %e, kind = e.kind(), failure_policy = ?self.failure, "rate-limit backend failed; applying the failure policy until it recovers");
        }
    }

    pub(crate) fn backend_ok(&self) {
        if self.incident.load(Ordering::Relaxed) && self.incident.swap(false, Ordering::Relaxed) {
            tracing::info!("rate-limit backend recovered");
        }
    }

    pub(crate) fn key_failed(&self, e: &crate::KeyError) {
        if !self.warned_key.swap(true, Ordering::Relaxed) {
            tracing::error!("{e}");
        }
    }
}

impl<B: Clone, K: Clone> Clone for Config<B, K> {
    fn clone(&self) -> Self {
        Config {
            backend: self.backend.clone(),
            policies: Arc::clone(&self.policies),
            key: self.key.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<B, K> Clone for RateLimitLayer<B, K> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            config: Arc::clone(&self.config),
        }
    }
}

impl<B, K: fmt::Debug> fmt::Debug for RateLimitLayer<B, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("policies", &self.config.policies)
            .field("key", &self.config.key)
            .field("failure", &self.config.shared.failure)
            .finish_non_exhaustive()
    }
}

fn shared(policies: &[Policy], failure: FailurePolicy) -> Arc<Shared> {
    Arc::new(Shared {
        policy_header: policy_value(policies),
        failure,
        incident: AtomicBool::new(false),
        warned_key: AtomicBool::new(false),
    })
}

impl RateLimitLayer<MemoryBackend, PeerIp> {
    /// A layer enforcing `policy` per client peer IP, in memory.
    pub fn new(policy: Policy) -> Self {
        let policies: Arc<[Policy]> = Arc::from([policy]);
        RateLimitLayer {
            config: Arc::new(Config {
                backend: MemoryBackend::new(),
                shared: shared(&policies, FailurePolicy::default()),
                policies,
                key: PeerIp,
            }),
        }
    }

    /// A layer enforcing every one of `policies` on each request (all-or-nothing: a request
    /// is admitted only if every policy admits it, and a denied one consumes from none), per
    /// client peer IP, in memory.
    ///
    /// # Errors
    /// [`ConfigError::NoPolicies`] for an empty list; [`ConfigError::DuplicatePolicyName`]
    /// when two policies share a name.
    pub fn with_policies(policies: impl IntoIterator<Item = Policy>) -> Result<Self, ConfigError> {
        let policies: Arc<[Policy]> = policies.into_iter().collect();
        if policies.is_empty() {
            return Err(ConfigError::NoPolicies);
        }
        for (i, p) in policies.iter().enumerate() {
            if policies[..i].iter().any(|q| q.name() == p.name()) {
                return Err(ConfigError::DuplicatePolicyName(p.name().to_owned()));
            }
        }
        Ok(RateLimitLayer {
            config: Arc::new(Config {
                backend: MemoryBackend::new(),
                shared: shared(&policies, FailurePolicy::default()),
                policies,
                key: PeerIp,
            }),
        })
    }
}

impl<B: Clone, K: Clone> RateLimitLayer<B, K> {
    /// The same layer with state in `backend` (for example a shared [`MemoryBackend`], or a
    /// Redis backend so a fleet enforces one limit).
    pub fn backend<B2>(self, backend: B2) -> RateLimitLayer<B2, K> {
        let c = Arc::unwrap_or_clone(self.config);
        RateLimitLayer {
            config: Arc::new(Config {
                backend,
                policies: c.policies,
                key: c.key,
                shared: c.shared,
            }),
        }
    }

    /// The same layer keying requests by `key` instead.
    pub fn key<K2: KeyExtractor>(self, key: K2) -> RateLimitLayer<B, K2> {
        let c = Arc::unwrap_or_clone(self.config);
        RateLimitLayer {
            config: Arc::new(Config {
                backend: c.backend,
                policies: c.policies,
                key,
                shared: c.shared,
            }),
        }
    }

    /// The same layer with `failure` applied when the backend cannot decide.
    pub fn on_backend_failure(self, failure: FailurePolicy) -> Self {
        let mut c = Arc::unwrap_or_clone(self.config);
        c.shared = shared(&c.policies, failure);
        RateLimitLayer {
            config: Arc::new(c),
        }
    }

    /// The policies checked on every request, in order.
    pub fn policies(&self) -> &[Policy] {
        &self.config.policies
    }

    /// The backend.
    pub fn backend_ref(&self) -> &B {
        &self.config.backend
    }
}

impl<S, B, K> Layer<S> for RateLimitLayer<B, K> {
    type Service = RateLimit<S, B, K>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}
