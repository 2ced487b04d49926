//! [`RateLimitLayer`] and its builder: configuration, shared by every service it builds.

pub(crate) mod naming;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use tower_layer::Layer;
use turnstile_core::wrap::Fallback;
use turnstile_core::{Algorithm, FailurePolicy, Limits, MemoryBackend, Policy, Unconfigured};

use crate::action::{check_action, check_action_policies, max_leaky_delay, Action};
use crate::error::InvalidLayer;
use crate::headers::policy_value;
use crate::key::{KeyExtractor, KeyLogging, MissingKey, PeerIp, RequestRef};
use crate::response::{Denial, DenialFn, DenialFnDebug};
use crate::rule::{CompiledRule, CostFn, Rule};
use crate::service::RateLimit;
use crate::state::{Config, Settings};

/// A [`tower_layer::Layer`] that rate-limits every request of the service it wraps.
///
/// Each request is matched against the layer's [`Rule`]s (the first that matches applies;
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
///
/// Different policies per route, client IPs behind a proxy, an exempt health check:
/// ```
/// use std::time::Duration;
/// use http::Method;
/// use turnstile::{key::ClientIp, Policy, RateLimitLayer, Rule};
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
pub struct RateLimitLayer<B = MemoryBackend, K = PeerIp> {
    pub(crate) config: Arc<Config<B, K>>,
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
        let s = &self.config.settings;
        f.debug_struct("RateLimitLayer")
            .field("rules", &s.rules)
            .field("key", &self.config.key)
            .field("action", &s.action)
            .field("failure", &s.failure)
            .field("missing_key", &s.missing_key)
            .field("response", &DenialFnDebug(&s.response))
            .finish_non_exhaustive()
    }
}

impl RateLimitLayer<MemoryBackend, PeerIp> {
    /// A layer enforcing `policy` on every request per client peer IP, in memory.
    pub fn new(policy: Policy) -> Self {
        // One valid policy always builds.
        match Self::builder().policy(policy).build() {
            Ok(l) => l,
            Err(e) => unreachable!("a single policy is a valid layer: {e}"),
        }
    }

    /// A layer enforcing every one of `policies` on each request (all-or-nothing: a request
    /// is admitted only if every policy admits it, and a denied one consumes from none), per
    /// client peer IP, in memory.
    ///
    /// # Errors
    /// [`InvalidLayer::NoPolicies`] for an empty list; [`InvalidLayer::DuplicatePolicyName`]
    /// when two policies share a name.
    pub fn with_policies(policies: impl IntoIterator<Item = Policy>) -> Result<Self, InvalidLayer> {
        Self::builder().policies(policies).build()
    }

    /// A builder for everything else: rules, keys, costs, actions, responses, backends.
    pub fn builder() -> RateLimitLayerBuilder<MemoryBackend, PeerIp> {
        RateLimitLayerBuilder {
            backend: MemoryBackend::new(),
            key: PeerIp::new(),
            policies: Vec::new(),
            rules: Vec::new(),
            cost: None,
            exempt_keys: Vec::new(),
            action: Action::Reject,
            failure: FailurePolicy::Local,
            missing_key: MissingKey::Reject,
            headers_on_allowed: true,
            legacy_headers: false,
            response: None,
            tiers: Vec::new(),
            unconfigured: Unconfigured::Defaults,
            key_logging: KeyLogging::Hashed,
        }
    }
}

impl<B, K> RateLimitLayer<B, K> {
    /// The same layer with state in `backend` (for example a shared [`MemoryBackend`], or a
    /// Redis backend so a fleet enforces one limit). The shadow-mode count and incident state
    /// stay shared with this layer.
    pub fn backend<B2>(self, backend: B2) -> RateLimitLayer<B2, K>
    where
        K: Clone,
    {
        let c = &self.config;
        RateLimitLayer {
            config: Arc::new(Config {
                backend: Fallback::new(backend, c.settings.failure),
                key: c.key.clone(),
                settings: Arc::clone(&c.settings),
                stats: Arc::clone(&c.stats),
            }),
        }
    }

    /// The same layer keying requests by `key` instead. Counters stay shared.
    pub fn key<K2: KeyExtractor>(self, key: K2) -> RateLimitLayer<B, K2>
    where
        B: Clone,
    {
        let c = &self.config;
        RateLimitLayer {
            config: Arc::new(Config {
                backend: c.backend.clone(),
                key,
                settings: Arc::clone(&c.settings),
                stats: Arc::clone(&c.stats),
            }),
        }
    }

    /// The same layer with `failure` applied when the backend cannot decide (see
    /// [`FailurePolicy`] for the table). Counters stay shared.
    pub fn on_backend_failure(self, failure: FailurePolicy) -> Self
    where
        B: Clone,
        K: Clone,
    {
        let c = &self.config;
        let mut settings = Settings::clone(&c.settings);
        settings.failure = failure;
        RateLimitLayer {
            config: Arc::new(Config {
                backend: Fallback::new(c.backend.inner().clone(), failure),
                key: c.key.clone(),
                settings: Arc::new(settings),
                stats: Arc::clone(&c.stats),
            }),
        }
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
        check_action(&self.config.settings.rules, action)?;
        let c = &self.config;
        let mut settings = Settings::clone(&c.settings);
        settings.action = action;
        Ok(RateLimitLayer {
            config: Arc::new(Config {
                backend: c.backend.clone(),
                key: c.key.clone(),
                settings: Arc::new(settings),
                stats: Arc::clone(&c.stats),
            }),
        })
    }

    /// The layer's own policies (those applied to requests no rule matches), in order.
    pub fn policies(&self) -> &[Policy] {
        let s = &self.config.settings;
        match s.rules.last() {
            Some(r) if s.has_default => &r.policies,
            _ => &[],
        }
    }

    /// The backend.
    pub fn backend_ref(&self) -> &B {
        self.config.backend.inner()
    }

    /// What the layer does when the backend cannot decide.
    pub fn failure_policy(&self) -> FailurePolicy {
        self.config.settings.failure
    }

    /// How many requests [`Action::Shadow`] admitted that enforcing would have denied, over
    /// every service this layer built.
    pub fn shadow_denied(&self) -> u64 {
        self.config.stats.shadow_denied()
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

/// Builds a [`RateLimitLayer`]: rules, key, cost, exempt keys, action, responses, backend.
///
/// Made by [`RateLimitLayer::builder`]; every method takes and returns the builder, and
/// [`RateLimitLayerBuilder::build`] checks the whole configuration at once.
#[must_use]
pub struct RateLimitLayerBuilder<B = MemoryBackend, K = PeerIp> {
    backend: B,
    key: K,
    policies: Vec<Policy>,
    rules: Vec<Rule>,
    cost: Option<CostFn>,
    exempt_keys: Vec<String>,
    action: Action,
    failure: FailurePolicy,
    missing_key: MissingKey,
    headers_on_allowed: bool,
    legacy_headers: bool,
    response: Option<DenialFn>,
    tiers: Vec<(String, Vec<Policy>)>,
    unconfigured: Unconfigured,
    key_logging: KeyLogging,
}

impl<B, K: fmt::Debug> fmt::Debug for RateLimitLayerBuilder<B, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayerBuilder")
            .field("key", &self.key)
            .field("policies", &self.policies)
            .field("rules", &self.rules)
            .field("action", &self.action)
            .field("failure", &self.failure)
            .finish_non_exhaustive()
    }
}

impl<B, K> RateLimitLayerBuilder<B, K> {
    /// Keeps state in `backend` (default: a new [`MemoryBackend`]).
    pub fn backend<B2>(self, backend: B2) -> RateLimitLayerBuilder<B2, K> {
        RateLimitLayerBuilder {
            backend,
            key: self.key,
            policies: self.policies,
            rules: self.rules,
            cost: self.cost,
            exempt_keys: self.exempt_keys,
            action: self.action,
            failure: self.failure,
            missing_key: self.missing_key,
            headers_on_allowed: self.headers_on_allowed,
            legacy_headers: self.legacy_headers,
            response: self.response,
            tiers: self.tiers,
            unconfigured: self.unconfigured,
            key_logging: self.key_logging,
        }
    }

    /// Keys requests by `key` (default: [`PeerIp`]).
    pub fn key<K2: KeyExtractor>(self, key: K2) -> RateLimitLayerBuilder<B, K2> {
        RateLimitLayerBuilder {
            backend: self.backend,
            key,
            policies: self.policies,
            rules: self.rules,
            cost: self.cost,
            exempt_keys: self.exempt_keys,
            action: self.action,
            failure: self.failure,
            missing_key: self.missing_key,
            headers_on_allowed: self.headers_on_allowed,
            legacy_headers: self.legacy_headers,
            response: self.response,
            tiers: self.tiers,
            unconfigured: self.unconfigured,
            key_logging: self.key_logging,
        }
    }

    /// Adds a policy applied to every request no rule matches (policies keep their own
    /// names here).
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policies.push(policy);
        self
    }

    /// Adds several such policies.
    pub fn policies(mut self, policies: impl IntoIterator<Item = Policy>) -> Self {
        self.policies.extend(policies);
        self
    }

    /// Adds a rule; rules are tried in the order added, the first that matches applies.
    pub fn rule(mut self, rule: Rule) -> Self {
        self.rules.push(rule);
        self
    }

    /// Charges each request `cost(request)` units (default 1) unless its rule has its own
    /// cost. A cost of 0 is a query: always admitted, counting nothing.
    pub fn cost<F>(mut self, cost: F) -> Self
    where
        F: Fn(&RequestRef<'_>) -> u64 + Send + Sync + 'static,
    {
        self.cost = Some(Arc::new(cost));
        self
    }

    /// Never limits requests whose key is `key` (an allow list; for IP keys, the canonical
    /// form: `192.0.2.1`, `2001:db8:1:2::/64`).
    pub fn exempt_key(mut self, key: impl Into<String>) -> Self {
        self.exempt_keys.push(key.into());
        self
    }

    /// Never limits requests with any of `keys`.
    pub fn exempt_keys(mut self, keys: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.exempt_keys.extend(keys.into_iter().map(Into::into));
        self
    }

    /// What to do with denied requests (default [`Action::Reject`]).
    pub fn action(mut self, action: Action) -> Self {
        self.action = action;
        self
    }

    /// What to do when the backend cannot decide (default [`FailurePolicy::Local`]: decide
    /// in memory on this process; see [`FailurePolicy`] for the whole table).
    pub fn on_backend_failure(mut self, failure: FailurePolicy) -> Self {
        self.failure = failure;
        self
    }

    /// What to do with requests whose key cannot be extracted (default
    /// [`MissingKey::Reject`]).
    pub fn on_missing_key(mut self, missing: MissingKey) -> Self {
        self.missing_key = missing;
        self
    }

    /// Whether admitted responses carry `RateLimit-Policy` and `RateLimit` (default: yes).
    /// Denials always do.
    pub fn headers_on_allowed(mut self, on: bool) -> Self {
        self.headers_on_allowed = on;
        self
    }

    /// Whether responses also carry the legacy `X-RateLimit-Limit`, `-Remaining` and
    /// `-Reset` (delta seconds) of the binding policy (default: no).
    pub fn legacy_headers(mut self, on: bool) -> Self {
        self.legacy_headers = on;
        self
    }

    /// Answers denials with `f`'s response instead of the default (an RFC 9457 problem, or
    /// gRPC `RESOURCE_EXHAUSTED`). `f` is told the decision and whether the request is
    /// gRPC; [`Denial::default_response`] gives the default to start from. The layer adds
    /// `RateLimit-Policy` and `RateLimit` (and the legacy fields if enabled) to whatever `f`
    /// returns.
    pub fn denial_response<F>(mut self, f: F) -> Self
    where
        F: Fn(&Denial<'_>) -> Response<Bytes> + Send + Sync + 'static,
    {
        self.response = Some(Arc::new(f));
        self
    }

    /// Defines the tier `name`: a key the backend maps to it (see the backends'
    /// `set_tier`) is checked against these `policies` instead of the rule's. A key's own
    /// override, stored in the backend, beats its tier.
    pub fn tier(
        mut self,
        name: impl Into<String>,
        policies: impl IntoIterator<Item = Policy>,
    ) -> Self {
        self.tiers
            .push((name.into(), policies.into_iter().collect()));
        self
    }

    /// What to do with a key that has neither an override nor a tier this layer defines
    /// (default [`Unconfigured::Defaults`]: check the rule's policies). With
    /// [`Unconfigured::Deny`] such requests get a denial no wait can help; with
    /// [`Unconfigured::Allow`] they pass without limit (and without rate-limit headers).
    pub fn when_unconfigured(mut self, unconfigured: Unconfigured) -> Self {
        self.unconfigured = unconfigured;
        self
    }

    /// How client keys appear in the check spans and logs (default [`KeyLogging::Hashed`]:
    /// keys can be personal data).
    pub fn log_keys(mut self, logging: KeyLogging) -> Self {
        self.key_logging = logging;
        self
    }

    /// Checks the configuration and builds the layer.
    ///
    /// # Errors
    /// [`InvalidLayer`]: no policy anywhere, a non-exempt rule without policies, duplicate or
    /// conflicting policy names, an invalid derived name, or (with [`Action::Delay`]) a leaky
    /// bucket that could delay longer than the maximum wait.
    pub fn build(self) -> Result<RateLimitLayer<B, K>, InvalidLayer> {
        let mut rules: Vec<CompiledRule> = Vec::with_capacity(self.rules.len() + 1);
        for rule in self.rules {
            rules.push(compile(rule, true)?);
        }
        let has_default = !self.policies.is_empty();
        if has_default {
            rules.push(compile(Rule::new().policies(self.policies), false)?);
        }
        if !rules
            .iter()
            .any(|r| !r.rule.exempt && !r.policies.is_empty())
        {
            return Err(InvalidLayer::NoPolicies);
        }
        // A shared name is a shared counter: the parameters must agree.
        naming::check_shared_names(rules.iter().flat_map(|r| r.policies.iter()))?;
        check_action(&rules, self.action)?;
        for (name, policies) in &self.tiers {
            check_action_policies(policies, self.action)?;
            turnstile_core::validate_policy_set(policies).map_err(InvalidLayer::Tier)?;
            turnstile_core::validate_tier_name(name).map_err(InvalidLayer::Tier)?;
        }
        for rule in &mut rules {
            if rule.policies.is_empty() {
                continue;
            }
            let mut limits = Limits::new(rule.policies.iter().cloned())
                .map_err(|_| InvalidLayer::DuplicatePolicyName(rule.rule.label()))?
                .when_unconfigured(self.unconfigured);
            for (name, policies) in &self.tiers {
                limits = limits
                    .with_tier(name, policies.iter().cloned())
                    .map_err(InvalidLayer::Tier)?;
            }
            rule.limits = Some(limits);
        }
        let metric_keys = crate::metrics::Keys::new(
            rules
                .iter()
                .flat_map(|r| r.policies.iter())
                .chain(self.tiers.iter().flat_map(|(_, p)| p.iter())),
        );
        Ok(RateLimitLayer {
            config: Arc::new(Config {
                backend: Fallback::new(self.backend, self.failure),
                key: self.key,
                settings: Arc::new(Settings {
                    rules: rules.into_boxed_slice(),
                    has_default,
                    cost: self.cost,
                    exempt_keys: self
                        .exempt_keys
                        .into_iter()
                        .map(String::into_boxed_str)
                        .collect(),
                    action: self.action,
                    failure: self.failure,
                    missing_key: self.missing_key,
                    headers_on_allowed: self.headers_on_allowed,
                    legacy_headers: self.legacy_headers,
                    response: self.response,
                    key_logging: self.key_logging,
                    metric_keys: Arc::new(metric_keys),
                }),
                stats: Arc::default(),
            }),
        })
    }
}

/// Names a rule's policies and precomputes what the layer needs. `derive_names`: whether
/// unnamed policies are named after the rule (the layer's own policies keep theirs).
fn compile(rule: Rule, derive_names: bool) -> Result<CompiledRule, InvalidLayer> {
    let label = rule.label();
    if rule.exempt && !rule.policies.is_empty() {
        return Err(InvalidLayer::ExemptRuleWithPolicies(label));
    }
    if !rule.exempt && rule.policies.is_empty() {
        return Err(InvalidLayer::RuleWithoutPolicies(label));
    }
    let policies = naming::name_policies(derive_names.then_some(label.as_str()), &rule.policies)?;
    let max_leaky_delay = policies
        .iter()
        .filter(|p| p.algorithm() == Algorithm::LeakyBucket)
        .map(max_leaky_delay)
        .max()
        .unwrap_or(Duration::ZERO);
    let policies: Arc<[Policy]> = policies.into();
    Ok(CompiledRule {
        policy_header: policy_value(policies.iter()),
        limits: None,
        policies,
        rule,
        max_leaky_delay,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Policy {
        s.parse().unwrap()
    }

    #[test]
    fn rule_policies_are_named_after_their_rule() {
        let l = RateLimitLayer::builder()
            .rule(
                Rule::new()
                    .method(http::Method::POST)
                    .path("/login")
                    .policy(p("fixed-window:limit=5,period=1m")),
            )
            .rule(
                Rule::new()
                    .path("/a")
                    .policy(p("fixed-window:limit=5,period=1m")),
            )
            .rule(
                Rule::new()
                    .path("/b")
                    .policy(p("gcra:limit=5,period=1m,name=shared")),
            )
            .rule(
                Rule::new()
                    .path("/c")
                    .policy(p("gcra:limit=5,period=1m,name=shared")),
            )
            .policy(p("token-bucket:limit=100,period=1m"))
            .build()
            .unwrap();
        let names: Vec<&str> = l
            .config
            .settings
            .rules
            .iter()
            .flat_map(|r| r.policies.iter().map(Policy::name))
            .collect();
        assert_eq!(
            names,
            [
                "POST /login fixed-window:limit=5,period=1m",
                "/a fixed-window:limit=5,period=1m",
                "shared",
                "shared",
                "token-bucket:limit=100,period=1m"
            ]
        );
        assert_eq!(l.policies().len(), 1);
    }

    #[test]
    fn invalid_configurations_are_refused() {
        let err = |b: RateLimitLayerBuilder| b.build().unwrap_err();
        assert_eq!(err(RateLimitLayer::builder()), InvalidLayer::NoPolicies);
        assert_eq!(
            err(RateLimitLayer::builder().rule(Rule::new().path("/x").exempt())),
            InvalidLayer::NoPolicies
        );
        assert!(matches!(
            err(RateLimitLayer::builder().rule(Rule::new().path("/x"))),
            InvalidLayer::RuleWithoutPolicies(_)
        ));
        assert!(matches!(
            err(RateLimitLayer::builder()
                .rule(
                    Rule::new()
                        .path("/b")
                        .policy(p("gcra:limit=5,period=1m,name=s"))
                )
                .rule(
                    Rule::new()
                        .path("/c")
                        .policy(p("gcra:limit=6,period=1m,name=s"))
                )),
            InvalidLayer::ConflictingPolicy(_)
        ));
        assert!(matches!(
            err(RateLimitLayer::builder().policies([
                p("gcra:limit=5,period=1m,name=s"),
                p("gcra:limit=6,period=1m,name=s")
            ])),
            InvalidLayer::DuplicatePolicyName(_)
        ));
        assert!(matches!(
            err(RateLimitLayer::builder().rule(
                Rule::new()
                    .path("/\"quoted\"")
                    .policy(p("gcra:limit=5,period=1m"))
            )),
            InvalidLayer::InvalidPolicyName(_)
        ));
    }

    #[test]
    fn a_leaky_bucket_longer_than_the_maximum_wait_is_refused() {
        // B = 5, T = 200 ms: (B − 1)·T = 800 ms.
        let lb = || p("leaky-bucket:limit=5,period=1s");
        let ok = RateLimitLayer::builder()
            .policy(lb())
            .action(Action::delay(Duration::from_millis(800)))
            .build();
        assert!(ok.is_ok());
        let too_short = RateLimitLayer::builder()
            .policy(lb())
            .action(Action::delay(Duration::from_millis(799)))
            .build()
            .unwrap_err();
        assert_eq!(
            too_short,
            InvalidLayer::DelayExceedsMaxWait {
                policy: "leaky-bucket:limit=5,period=1s".into(),
                max_delay: Duration::from_millis(800),
                max_wait: Duration::from_millis(799)
            }
        );
        // T = 1000/3 ms, B − 1 = 2: 666.666667 ms, rounded up.
        assert_eq!(
            max_leaky_delay(&p("leaky-bucket:limit=3,period=1s")),
            Duration::from_nanos(666_666_667)
        );
        assert!(RateLimitLayer::new(lb())
            .with_action(Action::delay(Duration::from_millis(100)))
            .is_err());
    }
}
