//! [`RateLimitLayer`] and its builder: configuration, shared by every service it builds.

use std::fmt;
use std::sync::Arc;

use tower_layer::Layer;
use turnstile_core::wrap::Fallback;
use turnstile_core::{FailurePolicy, MemoryBackend, Policy};

use crate::action::{check_action, Action};
use crate::error::InvalidLayer;
use crate::key::{KeyExtractor, PeerIp};
use crate::limiter::{Limiter, LiveLimiter, Settings};
use crate::response::DenialFnDebug;
use crate::service::RateLimit;

/// A tower [`Layer`](https://docs.rs/tower-layer/0.3/tower_layer/trait.Layer.html) that rate-limits every request of the service it wraps.
///
/// Each request is matched against the layer's [`Rule`](crate::Rule)s (the first that matches applies;
/// a request no rule matches gets the layer's own policies, and with none is passed through
/// unchecked), keyed (by default by the client's peer IP, see [`PeerIp`]), checked against
/// the rule's policies at once (all-or-nothing) in the backend (by default a
/// [`MemoryBackend`]) with the request's cost (default 1), and then:
///
/// - **admitted**: passed to the inner service; the response gets `RateLimit-Policy` and
///   `RateLimit` headers (draft-ietf-httpapi-ratelimit-headers-10). A leaky-bucket policy's
///   `delay` is waited out first (shaping).
/// - **denied**: by default ([`Action::Reject`]) answered `429 Too Many Requests` with
///   `Retry-After` (RFC 9110; whole seconds rounded up, at least 1; absent when no wait can
///   help), both headers, and an RFC 9457 problem body — or, for a gRPC call, a trailers-only
///   `RESOURCE_EXHAUSTED` with `google.rpc.RetryInfo` and `QuotaFailure` details. The inner
///   service is never called. [`Action::Delay`] waits instead, [`Action::Shadow`] only
///   records.
///
/// The layer is cheap to clone (one `Arc`); every service it builds shares one state.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use axum::{routing::get, Router};
/// use tower_turnstile::{Policy, RateLimitLayer};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let per_ip = Policy::token_bucket(10, Duration::from_secs(60))?.with_name("per-ip")?;
/// let app: Router = Router::new()
///     .route("/", get(|| async { "hello" }))
///     .layer(RateLimitLayer::new(per_ip));
/// // serve with `app.into_make_service_with_connect_info::<std::net::SocketAddr>()`
/// # let _ = app; Ok(()) }
/// ```
///
/// Different policies per route, client IPs behind a proxy, an exempt health check:
/// ```
/// use std::time::Duration;
/// use http::Method;
/// use tower_turnstile::{key::ClientIp, Policy, RateLimitLayer, Rule};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let layer = RateLimitLayer::builder()
///     .key(ClientIp::new().trust("10.0.0.0/8".parse()?))
///     .rule(Rule::new().path("/healthz").exempt())
///     .rule(
///         Rule::new()
///             .method(Method::POST)
///             .path("/login")
///             .policy(Policy::sliding_log(5, Duration::from_secs(60))?),
///     )
///     .policy(Policy::token_bucket(100, Duration::from_secs(60))?)
///     .build()?;
/// # let _ = layer; Ok(()) }
/// ```
///
/// # With CORS and other tower-http layers
/// Put tower-http's `CorsLayer` *outside* the limiter (listed before it in a
/// `ServiceBuilder`, or added after it with axum's `Router::layer`): it answers browsers'
/// preflight `OPTIONS` requests itself, so they spend no quota, and it adds its headers to
/// the limiter's `429`s, so a browser script can read them. The usual stack:
/// `ServiceBuilder::new().layer(TraceLayer::new_for_http()).layer(TimeoutLayer::..)
/// .layer(CorsLayer::..).layer(rate_limit)`. Preflights that do reach the limiter count
/// like any request unless a rule exempts them: [`Rule::preflight`](crate::Rule::preflight).
pub struct RateLimitLayer<B = MemoryBackend, K = PeerIp> {
    pub(crate) limiter: Arc<Limiter<B, K>>,
    /// The limiter in force, when the layer can be reloaded (`config::ConfigReload`): each
    /// request reads it once, when it arrives.
    pub(crate) live: Option<LiveLimiter<B, K>>,
}

impl<B, K> Clone for RateLimitLayer<B, K> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            limiter: Arc::clone(&self.limiter),
            live: self.live.clone(),
        }
    }
}

impl<B, K: fmt::Debug> fmt::Debug for RateLimitLayer<B, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.limiter.settings;
        f.debug_struct("RateLimitLayer")
            .field("rules", &s.rules)
            .field("key", &self.limiter.key)
            .field("action", &s.action)
            .field("failure", &s.failure)
            .field("missing_key", &s.missing_key)
            .field("response", &DenialFnDebug(&s.response))
            .finish_non_exhaustive()
    }
}

impl<B, K> RateLimitLayer<B, K> {
    /// The same layer, made reloadable: every service it builds reads the limiter in force
    /// once per request, from the pointer a reload swaps ([`LiveLimiter`]). The methods below that
    /// derive a new layer (`backend`, `key`, `on_backend_failure`, `with_action`) derive a
    /// fixed one from the configuration as built.
    #[cfg(feature = "config")]
    pub(crate) fn into_live(self) -> (Self, LiveLimiter<B, K>) {
        let live: LiveLimiter<B, K> = Arc::new(arc_swap::ArcSwap::new(Arc::clone(&self.limiter)));
        let layer = RateLimitLayer {
            limiter: self.limiter,
            live: Some(Arc::clone(&live)),
        };
        (layer, live)
    }

    /// A fixed (not reloadable) layer of `backend`, `key` and `settings`, sharing this one's
    /// counters and incident state.
    fn derived<B2, K2>(
        &self,
        backend: Fallback<B2>,
        key: K2,
        settings: Arc<Settings>,
    ) -> RateLimitLayer<B2, K2> {
        RateLimitLayer {
            limiter: Arc::new(self.limiter.sharing_stats(backend, key, settings)),
            live: None,
        }
    }

    /// The same layer with state in `backend` (for example a shared [`MemoryBackend`], or a
    /// Redis backend so a fleet enforces one limit). The shadow-mode count and incident state
    /// stay shared with this layer.
    pub fn backend<B2>(self, backend: B2) -> RateLimitLayer<B2, K>
    where
        K: Clone,
    {
        let c = &self.limiter;
        self.derived(
            c.settings.fallback(backend),
            c.key.clone(),
            Arc::clone(&c.settings),
        )
    }

    /// The same layer keying requests by `key` instead. Counters stay shared.
    pub fn key<K2: KeyExtractor>(self, key: K2) -> RateLimitLayer<B, K2>
    where
        B: Clone,
    {
        let c = &self.limiter;
        self.derived(c.backend.clone(), key, Arc::clone(&c.settings))
    }

    /// The same layer with `failure` applied when the backend cannot decide (see
    /// [`RateLimitLayerBuilder::on_backend_failure`](crate::RateLimitLayerBuilder::on_backend_failure)
    /// for what each outcome gets). Counters stay shared.
    pub fn on_backend_failure(self, failure: FailurePolicy) -> Self
    where
        B: Clone,
        K: Clone,
    {
        let c = &self.limiter;
        let mut settings = Settings::clone(&c.settings);
        settings.failure = failure;
        self.derived(
            settings.fallback(c.backend.inner().clone()),
            c.key.clone(),
            Arc::new(settings),
        )
    }

    /// The same layer with `action` applied to denied requests. Counters stay shared.
    ///
    /// # Errors
    /// [`InvalidLayer::DelayExceedsMaxWait`] for [`Action::Delay`] when a leaky-bucket policy
    /// could ask for a longer delay than its `max_wait`.
    pub fn with_action(self, action: Action) -> Result<Self, InvalidLayer>
    where
        B: Clone,
        K: Clone,
    {
        check_action(&self.limiter.settings.rules, action)?;
        let c = &self.limiter;
        let mut settings = Settings::clone(&c.settings);
        settings.action = action;
        Ok(self.derived(c.backend.clone(), c.key.clone(), Arc::new(settings)))
    }

    /// The layer's own policies (those applied to requests no rule matches), in order, as
    /// built (a reloaded configuration's are `ConfigReload::current`'s).
    pub fn policies(&self) -> &[Policy] {
        let s = &self.limiter.settings;
        match s.rules.last() {
            Some(r) if s.has_default => &r.policies,
            _ => &[],
        }
    }

    /// The backend.
    pub fn backend_ref(&self) -> &B {
        self.limiter.backend.inner()
    }

    /// What the layer does when the backend cannot decide.
    pub fn failure_policy(&self) -> FailurePolicy {
        self.limiter.settings.failure
    }

    /// How many requests [`Action::Shadow`] admitted that enforcing would have denied, over
    /// every service this layer built.
    pub fn shadow_denied(&self) -> u64 {
        self.limiter.stats.shadow_denied()
    }
}

impl<S, B, K> Layer<S> for RateLimitLayer<B, K> {
    type Service = RateLimit<S, B, K>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            limiter: Arc::clone(&self.limiter),
            live: self.live.clone(),
        }
    }
}
