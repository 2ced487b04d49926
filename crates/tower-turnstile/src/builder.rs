//! [`RateLimitLayerBuilder`]: checks a whole configuration at once and builds the layer.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::Response;
use turnstile_core::wrap::Share;
use turnstile_core::{
    Algorithm, Backend, FailurePolicy, Limits, LimitsError, MemoryBackend, Policy, Unconfigured,
    DEFAULT_MAX_KEY_BYTES, MAX_POLICIES,
};

use crate::action::{check_action, check_action_policies, max_leaky_delay, Action};
use crate::error::InvalidLayer;
use crate::headers::policy_value;
use crate::key::{KeyExtractor, KeyLogging, MissingKey, PeerIp, RequestRef};
use crate::layer::RateLimitLayer;
use crate::limiter::{Limiter, Settings};
use crate::naming;
use crate::response::{denial_fn, Denial, DenialBody, DenialFn};
use crate::rule::{CompiledRule, CostFn, Rule};
use crate::tier::{RequestTier, RuleTiers, TierFn};

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
        RateLimitLayerBuilder::new()
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
    parts: Parts,
}

/// Everything a builder holds apart from backend and key (which change its type).
struct Parts {
    policies: Vec<Policy>,
    rules: Vec<Rule>,
    cost: Option<CostFn>,
    exempt_keys: Vec<String>,
    action: Action,
    failure: FailurePolicy,
    unknown_share: Share,
    missing_key: MissingKey,
    headers_on_allowed: bool,
    legacy_headers: bool,
    response: Option<DenialFn>,
    tiers: Vec<(String, Vec<Policy>)>,
    request_tier: Option<TierFn>,
    unconfigured: Unconfigured,
    key_logging: KeyLogging,
    /// The longest key the layer takes, in bytes, when set.
    max_key_bytes: Option<usize>,
}

impl RateLimitLayerBuilder<MemoryBackend, PeerIp> {
    /// The defaults: in memory, keyed by peer IP, no policy yet.
    pub(crate) fn new() -> Self {
        RateLimitLayerBuilder {
            backend: crate::limiter::layer_memory().build(),
            key: PeerIp::new(),
            parts: Parts {
                policies: Vec::new(),
                rules: Vec::new(),
                cost: None,
                exempt_keys: Vec::new(),
                action: Action::Reject,
                failure: FailurePolicy::Local,
                unknown_share: Share::ALL,
                missing_key: MissingKey::Reject,
                headers_on_allowed: true,
                legacy_headers: false,
                response: None,
                tiers: Vec::new(),
                request_tier: None,
                unconfigured: Unconfigured::Defaults,
                key_logging: KeyLogging::Hashed,
                max_key_bytes: None,
            },
        }
    }
}

/// The longest key a layer takes: `set` ([`RateLimitLayerBuilder::max_key_bytes`]), which
/// must not exceed what `backend` takes; else [`DEFAULT_MAX_KEY_BYTES`] or the backend's
/// cap, whichever is smaller.
fn key_cap(set: Option<usize>, backend: usize) -> Result<usize, InvalidLayer> {
    match set {
        Some(layer) if layer > backend => Err(InvalidLayer::KeyCapAboveBackend { layer, backend }),
        Some(layer) => Ok(layer),
        None => Ok(DEFAULT_MAX_KEY_BYTES.min(backend)),
    }
}

impl<B, K: fmt::Debug> fmt::Debug for RateLimitLayerBuilder<B, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayerBuilder")
            .field("key", &self.key)
            .field("policies", &self.parts.policies)
            .field("rules", &self.parts.rules)
            .field("action", &self.parts.action)
            .field("failure", &self.parts.failure)
            .finish_non_exhaustive()
    }
}

impl<B, K> RateLimitLayerBuilder<B, K> {
    /// Keeps state in `backend` (default: a new [`MemoryBackend`] that drops its expired keys
    /// every second by itself, so memory a flood of clients took comes back without
    /// traffic). A [`MemoryBackend`] of your own does so with
    /// [`MemoryBackendBuilder::sweep_every`](turnstile_core::MemoryBackendBuilder::sweep_every)
    /// (or [`MemoryBackend::spawn_sweeper`]).
    ///
    /// Keys longer than the layer takes ([`max_key_bytes`](Self::max_key_bytes)) are
    /// refused before any check; `backend` must take keys at least that long
    /// ([`Backend::max_key_bytes`](turnstile_core::Backend::max_key_bytes)).
    pub fn backend<B2>(self, backend: B2) -> RateLimitLayerBuilder<B2, K> {
        RateLimitLayerBuilder {
            backend,
            key: self.key,
            parts: self.parts,
        }
    }

    /// Keys requests by `key` (default: [`PeerIp`]).
    pub fn key<K2: KeyExtractor>(self, key: K2) -> RateLimitLayerBuilder<B, K2> {
        RateLimitLayerBuilder {
            backend: self.backend,
            key,
            parts: self.parts,
        }
    }

    /// Adds a policy applied to every request no rule matches (policies keep their own
    /// names here).
    pub fn policy(mut self, policy: Policy) -> Self {
        self.parts.policies.push(policy);
        self
    }

    /// Adds several such policies.
    pub fn policies(mut self, policies: impl IntoIterator<Item = Policy>) -> Self {
        self.parts.policies.extend(policies);
        self
    }

    /// Adds a rule; rules are tried in the order added, the first that matches applies.
    pub fn rule(mut self, rule: Rule) -> Self {
        self.parts.rules.push(rule);
        self
    }

    /// Charges each request `cost(request)` units (default 1) unless its rule has its own
    /// cost. A cost of 0 is a query: always admitted, counting nothing.
    pub fn cost<F>(mut self, cost: F) -> Self
    where
        F: Fn(&RequestRef<'_>) -> u64 + Send + Sync + 'static,
    {
        self.parts.cost = Some(Arc::new(cost));
        self
    }

    /// Never limits requests whose key is `key` (an allow list; for IP keys, the canonical
    /// form: `192.0.2.1`, `2001:db8:1:2::/64`).
    pub fn exempt_key(mut self, key: impl Into<String>) -> Self {
        self.parts.exempt_keys.push(key.into());
        self
    }

    /// Never limits requests with any of `keys`.
    pub fn exempt_keys(mut self, keys: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.parts
            .exempt_keys
            .extend(keys.into_iter().map(Into::into));
        self
    }

    /// What to do with denied requests (default [`Action::Reject`]).
    pub fn action(mut self, action: Action) -> Self {
        self.parts.action = action;
        self
    }

    /// What to do when the backend cannot decide (default [`FailurePolicy::Local`]: decide
    /// in memory on this process; see [`FailurePolicy`] for which error gets which outcome).
    /// The layer answers each outcome ([`OnError`](turnstile_core::OnError)) so:
    ///
    /// | outcome | HTTP | gRPC |
    /// | --- | --- | --- |
    /// | admitted (`Open`, and what `Local` cannot decide) | the inner service's response, without rate-limit headers | the same |
    /// | denied as unavailable (`Closed`) | `503 Service Unavailable` with an RFC 9457 problem body; the inner service is not called | `UNAVAILABLE` (trailers only) |
    /// | decided by the local fallback (`Local`) | as any decision: admitted with headers, or `429` | as any decision |
    ///
    /// `turnstile check-config` says the same in words.
    pub fn on_backend_failure(mut self, failure: FailurePolicy) -> Self {
        self.parts.failure = failure;
        self
    }

    /// Under [`FailurePolicy::Local`], what a key the backend never answered for starts an
    /// outage with: `share` of each policy's capacity (default [`Share::ALL`]). Keys the
    /// backend did answer for start from its last answer (see
    /// [`Fallback`](turnstile_core::wrap::Fallback)).
    pub fn fallback_unknown_share(mut self, share: Share) -> Self {
        self.parts.unknown_share = share;
        self
    }

    /// What to do with requests whose key cannot be extracted (default
    /// [`MissingKey::Reject`]).
    pub fn on_missing_key(mut self, missing: MissingKey) -> Self {
        self.parts.missing_key = missing;
        self
    }

    /// Whether admitted responses carry `RateLimit-Policy` and `RateLimit` (default: yes).
    /// Denials always do.
    pub fn headers_on_allowed(mut self, on: bool) -> Self {
        self.parts.headers_on_allowed = on;
        self
    }

    /// Whether responses also carry the legacy `X-RateLimit-Limit`, `-Remaining` and
    /// `-Reset` (delta seconds) of the binding policy (default: no).
    pub fn legacy_headers(mut self, on: bool) -> Self {
        self.parts.legacy_headers = on;
        self
    }

    /// Answers denials with `f`'s response instead of the default (an RFC 9457 problem, or
    /// gRPC `RESOURCE_EXHAUSTED`). `f` is told the decision and whether the request is
    /// gRPC; [`Denial::default_response`] gives the default to start from. The body may be
    /// anything [`DenialBody`] covers: `String`, `Vec<u8>`, `Bytes`, a static string, and
    /// with the `axum` feature axum's own body, so `f` may end in
    /// `IntoResponse::into_response()` (or use
    /// `denial_into_response`, feature `axum`). The layer adds
    /// `RateLimit-Policy` and `RateLimit` (and the legacy fields if enabled) to whatever `f`
    /// returns; `Retry-After` is `f`'s to set (the default response sets it).
    ///
    /// A body that is not complete when `f` returns (a stream that would have to wait) cannot
    /// be sent from a denial: the default denial is sent instead and an error logged once.
    ///
    /// # Examples
    /// ```
    /// use http::{header, HeaderValue, Response, StatusCode};
    /// use tower_turnstile::{Policy, RateLimitLayer};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let layer = RateLimitLayer::builder()
    ///     .policy("gcra:limit=10,period=1m,name=api".parse::<Policy>()?)
    ///     .denial_response(|d| {
    ///         let secs = d.retry_after().map_or(0, |r| r.as_secs().max(1));
    ///         let mut res = Response::new(format!(r#"{{"error":"slow down","retry_in_s":{secs}}}"#));
    ///         *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    ///         let json = HeaderValue::from_static("application/json");
    ///         res.headers_mut().insert(header::CONTENT_TYPE, json);
    ///         res
    ///     })
    ///     .build()?;
    /// # let _ = layer; Ok(()) }
    /// ```
    pub fn denial_response<F, T>(mut self, f: F) -> Self
    where
        F: Fn(&Denial<'_>) -> Response<T> + Send + Sync + 'static,
        T: DenialBody,
    {
        self.parts.response = Some(denial_fn(f));
        self
    }

    /// [`denial_response`](Self::denial_response) for anything axum's `IntoResponse` takes
    /// — `(StatusCode, Json(..))`, a `Response`, your own error type — as an axum handler
    /// returns it (feature `axum`).
    ///
    /// # Examples
    /// ```
    /// use axum::http::StatusCode;
    /// use tower_turnstile::{Policy, RateLimitLayer};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let layer = RateLimitLayer::builder()
    ///     .policy("gcra:limit=10,period=1m,name=api".parse::<Policy>()?)
    ///     .denial_into_response(|_| (StatusCode::TOO_MANY_REQUESTS, "slow down\n"))
    ///     .build()?;
    /// # let _ = layer; Ok(()) }
    /// ```
    #[cfg(feature = "axum")]
    #[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
    pub fn denial_into_response<F, R>(self, f: F) -> Self
    where
        F: Fn(&Denial<'_>) -> R + Send + Sync + 'static,
        R: axum::response::IntoResponse,
    {
        self.denial_response(move |d| f(d).into_response())
    }

    /// Defines the tier `name`: for a key the backend maps to it (see the backends'
    /// `set_tier`), or a request that chooses it ([`request_tier`](Self::request_tier)),
    /// each policy of the matched rule whose name `policies` lists takes those parameters;
    /// every other policy stays as the rule wrote it. A key's own override, stored in the
    /// backend, beats its tier for the policies it names. Every name listed here must be a
    /// policy name some rule (or the layer's defaults) uses, else `build` fails with
    /// [`InvalidLayer::UnusedTierPolicy`]; at most [`MAX_POLICIES`] policies.
    pub fn tier(
        mut self,
        name: impl Into<String>,
        policies: impl IntoIterator<Item = Policy>,
    ) -> Self {
        self.parts
            .tiers
            .push((name.into(), policies.into_iter().collect()));
        self
    }

    /// Chooses each request's tier with `f` — from a claim an authentication layer put in
    /// the request's extensions, a header the gateway sets — instead of (or besides) a tier
    /// stored per key in the backend. `f` returns [`RequestTier::named`] for a tier defined
    /// with [`tier`](Self::tier), [`RequestTier::Unlimited`], or [`RequestTier::Defaults`]
    /// for the rule's policies.
    ///
    /// Per policy, a key's stored configuration still wins, atomically in the backend (Redis
    /// included): for each policy of the matched rule, **the key's stored override > the
    /// key's stored tier > the request's tier > the rule's own** — the first that names the
    /// policy supplies its parameters (or [`when_unconfigured`](Self::when_unconfigured)
    /// applies to a key without configuration when `f` chose `Defaults`). So an operator's per-key decision (`turnstile quota set-override`)
    /// holds whatever the request claims. `f` runs once per checked request (not for exempt
    /// rules or exempt keys) and must be cheap; it must not panic.
    ///
    /// # Examples
    /// Anonymous 10/min, signed-in 50/min, premium 100/min, admins unlimited, from a claim
    /// an authentication layer put in the extensions:
    /// ```
    /// use std::time::Duration;
    /// use tower_turnstile::{Policy, RateLimitLayer, RequestTier};
    ///
    /// #[derive(Clone)]
    /// enum Plan { Free, Premium, Admin }
    /// #[derive(Clone)]
    /// struct Claims { plan: Plan }
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let per_min = |n| Policy::token_bucket(n, Duration::from_secs(60))?.with_name("per-user");
    /// let layer = RateLimitLayer::builder()
    ///     .policy(per_min(10)?)
    ///     .tier("signed-in", [per_min(50)?])
    ///     .tier("premium", [per_min(100)?])
    ///     .request_tier(|req| match req.extensions().get::<Claims>().map(|c| &c.plan) {
    ///         None => RequestTier::Defaults,
    ///         Some(Plan::Free) => RequestTier::named("signed-in"),
    ///         Some(Plan::Premium) => RequestTier::named("premium"),
    ///         Some(Plan::Admin) => RequestTier::Unlimited,
    ///     })
    ///     .build()?;
    /// # let _ = layer; Ok(()) }
    /// ```
    pub fn request_tier<F>(mut self, f: F) -> Self
    where
        F: Fn(&RequestRef<'_>) -> RequestTier + Send + Sync + 'static,
    {
        self.parts.request_tier = Some(Arc::new(f));
        self
    }

    /// What to do with a key that has neither an override nor a tier this layer defines
    /// (default [`Unconfigured::Defaults`]: check the rule's policies). With
    /// [`Unconfigured::Deny`] such requests get a denial no wait can help; with
    /// [`Unconfigured::Allow`] they pass without limit (and without rate-limit headers).
    pub fn when_unconfigured(mut self, unconfigured: Unconfigured) -> Self {
        self.parts.unconfigured = unconfigured;
        self
    }

    /// Caps a client key's length at `bytes` (default
    /// [`DEFAULT_MAX_KEY_BYTES`], 512, or the backend's
    /// [`max_key_bytes`](turnstile_core::Backend::max_key_bytes) if smaller), measured on the
    /// extracted key before it is hashed or sent. A request with a longer key is refused
    /// before any check, whatever [`on_missing_key`](Self::on_missing_key) says: HTTP `400`
    /// with an RFC 9457 problem body naming both sizes, gRPC `INVALID_ARGUMENT`; the backend
    /// never sees it. So an in-memory backend holds at most `max_keys` × (`bytes` + its
    /// per-key overhead) however clients choose their keys. Every IP key (at most 43 bytes)
    /// and route pattern fits the default; raise it for long API keys or tokens.
    ///
    /// A backend of your own must take keys this long: [`build`](Self::build) fails with
    /// [`InvalidLayer::KeyCapAboveBackend`] otherwise (raise the backend's own cap with
    /// `max_key_bytes` on its builder). The layer's own in-memory backend takes any length.
    pub fn max_key_bytes(mut self, bytes: usize) -> Self {
        self.parts.max_key_bytes = Some(bytes);
        self
    }

    /// How client keys appear in the check spans and logs (default [`KeyLogging::Hashed`]:
    /// keys can be personal data).
    pub fn log_keys(mut self, logging: KeyLogging) -> Self {
        self.parts.key_logging = logging;
        self
    }

    /// Checks the configuration and builds the layer.
    ///
    /// # Errors
    /// [`InvalidLayer`]: no policy anywhere, a non-exempt rule without policies, duplicate or
    /// conflicting policy names, an invalid derived name, or (with [`Action::Delay`]) a leaky
    /// bucket that could delay longer than the maximum wait, or a
    /// [`max_key_bytes`](Self::max_key_bytes) above the backend's.
    pub fn build(self) -> Result<RateLimitLayer<B, K>, InvalidLayer>
    where
        B: Backend,
    {
        let RateLimitLayerBuilder {
            backend,
            key,
            parts: p,
        } = self;
        let max_key_bytes = key_cap(p.max_key_bytes, backend.max_key_bytes())?;
        let has_default = !p.policies.is_empty();
        let mut rules = compile_rules(p.rules, p.policies)?;
        check_action(&rules, p.action)?;
        check_tiers(&p.tiers, p.action)?;
        check_tier_names(&rules, &p.tiers)?;
        for rule in &mut rules {
            attach_limits(rule, &p.tiers, p.unconfigured, p.request_tier.is_some())?;
        }
        let metric_keys = crate::metrics::Keys::new(
            rules
                .iter()
                .flat_map(|r| r.policies.iter())
                .chain(p.tiers.iter().flat_map(|(_, p)| p.iter())),
        );
        let settings = Settings {
            rules: rules.into_boxed_slice(),
            has_default,
            cost: p.cost,
            exempt_keys: p
                .exempt_keys
                .into_iter()
                .map(String::into_boxed_str)
                .collect(),
            action: p.action,
            failure: p.failure,
            unknown_share: p.unknown_share,
            missing_key: p.missing_key,
            headers_on_allowed: p.headers_on_allowed,
            legacy_headers: p.legacy_headers,
            response: p.response,
            request_tier: p.request_tier,
            key_logging: p.key_logging,
            metric_keys: Arc::new(metric_keys),
            max_key_bytes,
        };
        Ok(RateLimitLayer {
            live: None,
            limiter: Arc::new(Limiter {
                backend: settings.fallback(backend),
                key,
                settings: Arc::new(settings),
                stats: Arc::default(),
            }),
        })
    }
}

/// The layer's rules, compiled in order, then its own `policies` as a last rule matching
/// every request (when there are any). Some policy must apply somewhere, and a name shared
/// between rules must mean the same parameters (a shared name is a shared counter).
fn compile_rules(
    rules: Vec<Rule>,
    policies: Vec<Policy>,
) -> Result<Vec<CompiledRule>, InvalidLayer> {
    let mut compiled: Vec<CompiledRule> = Vec::with_capacity(rules.len() + 1);
    for rule in rules {
        compiled.push(compile(rule, true)?);
    }
    if !policies.is_empty() {
        compiled.push(compile(Rule::new().policies(policies), false)?);
    }
    if !compiled
        .iter()
        .any(|r| !r.rule.exempt && !r.policies.is_empty())
    {
        return Err(InvalidLayer::NoPolicies);
    }
    naming::check_shared_names(compiled.iter().flat_map(|r| r.policies.iter()))?;
    Ok(compiled)
}

/// Each tier: a valid name, a valid policy set, no leaky bucket longer than `action` waits.
fn check_tiers(tiers: &[(String, Vec<Policy>)], action: Action) -> Result<(), InvalidLayer> {
    for (name, policies) in tiers {
        check_action_policies(policies, action)?;
        turnstile_core::quota::validate_policy_set(policies).map_err(InvalidLayer::Tier)?;
        turnstile_core::quota::validate_tier_name(name).map_err(InvalidLayer::Tier)?;
    }
    Ok(())
}

/// Each policy a tier lists is named by some rule's (or default) policy: a tier changes the
/// parameters of the policies it names, and a name no rule uses changes nothing.
fn check_tier_names(
    rules: &[CompiledRule],
    tiers: &[(String, Vec<Policy>)],
) -> Result<(), InvalidLayer> {
    let used: std::collections::HashSet<&str> = rules
        .iter()
        .flat_map(|r| r.policies.iter().map(Policy::name))
        .collect();
    for (tier, policies) in tiers {
        if let Some(p) = policies.iter().find(|p| !used.contains(p.name())) {
            return Err(InvalidLayer::UnusedTierPolicy {
                tier: tier.clone(),
                policy: p.name().to_owned(),
            });
        }
    }
    Ok(())
}

/// Gives a rule with policies the [`Limits`] its requests are checked against (its policies,
/// the layer's `tiers`, and what keys without configuration get), and, when a request-tier
/// function chooses tiers per request (`per_request`), the tier sets it selects.
fn attach_limits(
    rule: &mut CompiledRule,
    tiers: &[(String, Vec<Policy>)],
    unconfigured: Unconfigured,
    per_request: bool,
) -> Result<(), InvalidLayer> {
    if rule.policies.is_empty() {
        return Ok(());
    }
    let mut limits = Limits::new(rule.policies.iter().cloned())
        .map_err(|e| match e {
            LimitsError::TooManyPolicies { count, .. } => InvalidLayer::TooManyPolicies {
                rule: rule.rule.label(),
                count,
            },
            _ => InvalidLayer::DuplicatePolicyName(rule.rule.label()),
        })?
        .when_unconfigured(unconfigured);
    for (name, policies) in tiers {
        limits = limits
            .with_tier(name, policies.iter().cloned())
            .map_err(InvalidLayer::Tier)?;
    }
    rule.limits = Some(limits);
    if per_request {
        rule.tiers = Some(
            RuleTiers::new(&rule.policies, &rule.policy_header, tiers)
                .map_err(InvalidLayer::Tier)?,
        );
    }
    Ok(())
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
    if rule.policies.len() > MAX_POLICIES {
        return Err(InvalidLayer::TooManyPolicies {
            rule: label,
            count: rule.policies.len(),
        });
    }
    if let Some(reason) = rule.matches_nothing() {
        return Err(InvalidLayer::RuleMatchesNothing {
            rule: label,
            reason,
        });
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
        label: label.into(),
        limits: None,
        tiers: None,
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
            .limiter
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
        // A gRPC rule whose path no call of its service has: it would never match.
        let one = "gcra:limit=1,period=1s".parse::<Policy>().unwrap();
        assert_eq!(
            err(RateLimitLayer::builder().rule(
                Rule::new()
                    .grpc_service("a.B")
                    .path("/")
                    .policy(one.clone())
            )),
            InvalidLayer::RuleMatchesNothing {
                rule: "/ grpc a.B/*".to_owned(),
                reason: "path \"/\" is not a path /a.B/<method> of its gRPC calls".to_owned(),
            }
        );
        assert!(matches!(
            err(RateLimitLayer::builder()
                .policy(one.clone())
                .rule(Rule::new().grpc_service("a.B").path_prefix("/api").exempt())),
            InvalidLayer::RuleMatchesNothing { .. }
        ));
        assert!(RateLimitLayer::builder()
            .rule(
                Rule::new()
                    .grpc_service("a.B")
                    .path_prefix("/a.B")
                    .policy(one)
            )
            .build()
            .is_ok());
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
