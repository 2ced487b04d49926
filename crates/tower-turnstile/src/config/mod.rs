//! Layers from a TOML configuration file (feature `config`): policies, rules, keys, actions,
//! tiers and the backend, deserialised with serde into the builder's own types.
//!
//! ```
//! use tower_turnstile::config::LayerConfig;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let config = LayerConfig::from_toml("turnstile.toml", r#"
//! key = "client-ip"
//! trusted_proxies = ["10.0.0.0/8"]
//! policies = ["token-bucket:limit=100,period=1m,name=per-ip"]
//!
//! [[rules]]
//! methods = ["POST"]
//! path = "/login"
//! policies = [{ algorithm = "sliding-log", limit = 5, period = "1m", name = "login" }]
//! "#)?;
//! let layer = config.builder().build()?;
//! # let _ = layer; Ok(()) }
//! ```
//!
//! A layer built from a file can take a new version of it while it serves: see
//! [`ConfigReload`] (on `SIGHUP`, or when the file changes).
//!
//! Errors name the file, the line and column, and the field:
//! `turnstile.toml:12:13: rules[1].policies[0]: limit 0 is out of range (1 to 4294967295)`
//! (indices count from 0, in file order).
//!
//! # The file
//! Every field is optional except that some policy must apply somewhere.
//!
//! | field | meaning | default |
//! | --- | --- | --- |
//! | `key` | what a request counts against: `ip`, `client-ip`, `header:NAME`, `route`, `grpc-method`, `global`, or a list of two or three of them, joined with `\|` (see [`ConfigKey`]) | `"ip"` |
//! | `trusted_proxies` | with `client-ip`: networks (`10.0.0.0/8`) or addresses of proxies trusted to report the client's address | none |
//! | `forwarded_header` | with `client-ip`: the one header to read, `forwarded`, `x-forwarded-for` or `x-real-ip` | the first present |
//! | `ipv6_prefix` | with `ip` or `client-ip`: IPv6 clients are grouped by this prefix length | `64` |
//! | `policies` | policies for requests no rule matches: policy strings (`"gcra:limit=10,period=1s,name=x"`) or tables (`{ algorithm = "gcra", limit = 10, period = "1s", burst = 20, name = "x" }`) | none: such requests pass |
//! | `cost` | units each request costs unless its rule says otherwise | `1` |
//! | `action` | what a denied request gets: `"reject"`, `"shadow"`, or `{ delay = "2s" }` (wait up to 2 s) | `"reject"` |
//! | `on_missing_key` | a request without a key: `"reject"`, `"allow"`, or `{ key = "anonymous" }` (one shared key) | `"reject"` |
//! | `unconfigured` | a key with neither override nor tier: `"defaults"`, `"deny"` or `"allow"` | `"defaults"` |
//! | `exempt_keys` | keys never limited | none |
//! | `headers_on_allowed`, `legacy_headers` | as the builder's methods of those names | `true`, `false` |
//! | `log_keys` | keys in spans and logs: `"hashed"`, `"plain"`, `"hidden"` ([`KeyLogging`]) | `"hashed"` |
//! | `[tiers]` | `NAME = [policies...]`: the policies of each tier | none |
//! | `tier_header` | a header whose value names each request's tier (one of `[tiers]`; absent, empty or naming no tier: the rule's policies). A key's stored override or tier still wins (see [`RequestTier`](crate::RequestTier)). Trust it only from a gateway that sets or strips it: a client could otherwise pick its own tier | none |
//! | `[[rules]]` | rules, tried in order; the first that matches applies | none |
//! | `[backend]` | where state lives (see [`BackendConfig`]): `url`, `prefix`, `timeout`, `failure`, `max_keys`, `max_key_bytes`, `tls_ca`, `tls_cert`, `tls_key` | in memory |
//!
//! A rule: `name`, `methods` (`["GET", "HEAD"]`), `path` (exact) or `path_prefix`
//! (segment-wise), `grpc_service` (`helloworld.Greeter`) or `grpc_method`
//! (`helloworld.Greeter/SayHello`), `preflight = true` (CORS preflights: `OPTIONS` with
//! `Access-Control-Request-Method`; see [`Rule::preflight`]), and then `policies` (with an
//! optional `cost`) or `exempt = true`. Preflights count like any request unless a rule
//! exempts them:
//!
//! ```toml
//! [[rules]]
//! preflight = true
//! exempt = true
//! ``` Unnamed policies are named after their rule, as [`Rule`] says.

// `validate` reads a file into a `LayerConfig` (`from_file`, `from_toml`); `display` prints
// it as `turnstile check-config` does.
mod backend;
mod display;
mod error;
mod key;
mod raw;
mod reload;
mod validate;

use turnstile_core::{MemoryBackend, Policy, Unconfigured};

pub use backend::BackendConfig;
pub use error::ConfigFileError;
pub use key::ConfigKey;
pub use reload::{ConfigReload, ReloadError};

use crate::action::Action;
use crate::builder::RateLimitLayerBuilder;
use crate::key::{ForwardedHeader, KeyLogging, MissingKey};
use crate::layer::RateLimitLayer;
use crate::rule::Rule;
use turnstile_core::FailurePolicy;

/// One rule of the file, validated.
#[derive(Clone, Debug)]
struct RuleEntry {
    rule: Rule,
    cost: Option<u64>,
    /// The policies as the layer names them.
    named: Vec<Policy>,
}

/// A validated configuration file: everything a [`RateLimitLayer`] needs, in the builder's
/// own types. [`LayerConfig::builder`] turns it into a [`RateLimitLayerBuilder`] (in
/// memory; swap the backend with [`RateLimitLayerBuilder::backend`]); its `Display` is the
/// effective configuration, rule by rule, with every policy under the name the layer gives it
/// (what `turnstile check-config` prints).
///
/// The module docs describe the file.
#[derive(Clone, Debug)]
pub struct LayerConfig {
    key: ConfigKey,
    trusted_proxies: Vec<ipnet::IpNet>,
    forwarded_header: Option<ForwardedHeader>,
    ipv6_prefix: Option<u8>,
    policies: Vec<Policy>,
    rules: Vec<RuleEntry>,
    tiers: Vec<(String, Vec<Policy>)>,
    cost: Option<u64>,
    action: Action,
    missing_key: MissingKey,
    unconfigured: Unconfigured,
    key_logging: KeyLogging,
    headers_on_allowed: bool,
    legacy_headers: bool,
    tier_header: Option<http::HeaderName>,
    exempt_keys: Vec<String>,
    backend: BackendConfig,
}

impl LayerConfig {
    /// A builder with everything the file says, keeping state in memory (a
    /// [`MemoryBackend`], capped at `[backend] max_keys` if set; keys capped at `[backend]
    /// max_key_bytes` if set). Add or change anything with
    /// the builder's methods — [`RateLimitLayerBuilder::backend`] for Redis — then `build`.
    pub fn builder(&self) -> RateLimitLayerBuilder<MemoryBackend, ConfigKey> {
        let backend = crate::limiter::layer_memory()
            .max_keys(self.backend.max_keys)
            .build();
        let mut b = RateLimitLayer::builder()
            .backend(backend)
            .key(self.key.clone())
            .policies(self.policies.iter().cloned())
            .action(self.action)
            .on_backend_failure(self.backend.failure())
            .on_missing_key(self.missing_key.clone())
            .when_unconfigured(self.unconfigured)
            .log_keys(self.key_logging)
            .headers_on_allowed(self.headers_on_allowed)
            .legacy_headers(self.legacy_headers)
            .exempt_keys(self.exempt_keys.iter().cloned());
        if let Some(c) = self.cost {
            b = b.cost(move |_| c);
        }
        if let Some(n) = self.backend.max_key_bytes {
            b = b.max_key_bytes(n);
        }
        for r in &self.rules {
            b = b.rule(r.rule.clone());
        }
        for (name, policies) in &self.tiers {
            b = b.tier(name.clone(), policies.iter().cloned());
        }
        if let Some(h) = &self.tier_header {
            b = b.request_tier(tier_from_header(h.clone(), &self.tiers));
        }
        b
    }

    /// Every policy set a request may be checked against, in the order rules are tried:
    /// each rule with policies (its label: its name, else its conditions such as
    /// `POST /login`) and its policies as the layer names them, then the default policies
    /// (labelled `otherwise`) if the file has some. For tools that act on a key's quota per
    /// rule (`turnstile quota --config`).
    pub fn rule_sets(&self) -> Vec<(String, Vec<Policy>)> {
        let rules = self
            .rules
            .iter()
            .filter(|r| !r.named.is_empty())
            .map(|r| (r.rule.label(), r.named.clone()));
        let defaults =
            (!self.policies.is_empty()).then(|| ("otherwise".to_owned(), self.policies.clone()));
        rules.chain(defaults).collect()
    }

    /// The key extractor.
    pub fn key(&self) -> &ConfigKey {
        &self.key
    }

    /// The policies for requests no rule matches.
    pub fn policies(&self) -> &[Policy] {
        &self.policies
    }

    /// The rules, in order, as the builder takes them.
    pub fn rules(&self) -> impl ExactSizeIterator<Item = &Rule> {
        self.rules.iter().map(|r| &r.rule)
    }

    /// The tiers and their policies, in file order.
    pub fn tiers(&self) -> impl ExactSizeIterator<Item = (&str, &[Policy])> {
        self.tiers.iter().map(|(n, p)| (n.as_str(), p.as_slice()))
    }

    /// What denied requests get.
    pub fn action(&self) -> Action {
        self.action
    }

    /// The layer's failure policy (from `[backend] failure`).
    pub fn failure_policy(&self) -> FailurePolicy {
        self.backend.failure()
    }

    /// What happens to keys with neither override nor tier.
    pub fn unconfigured(&self) -> Unconfigured {
        self.unconfigured
    }

    /// The header whose value names each request's tier (`tier_header`), if any.
    pub fn tier_header(&self) -> Option<&http::HeaderName> {
        self.tier_header.as_ref()
    }

    /// The `[backend]` table.
    pub fn backend(&self) -> &BackendConfig {
        &self.backend
    }
}

/// The request-tier function of `tier_header = "NAME"`: the header's value names one of
/// `tiers`; absent, empty, or naming no tier, the rule's policies.
fn tier_from_header(
    header: http::HeaderName,
    tiers: &[(String, Vec<Policy>)],
) -> impl Fn(&crate::key::RequestRef<'_>) -> crate::RequestTier + Send + Sync + 'static {
    let names: std::sync::Arc<[String]> = tiers.iter().map(|(n, _)| n.clone()).collect();
    move |req| {
        let value = req.headers().get(&header).map(http::HeaderValue::as_bytes);
        match value.and_then(|v| names.iter().find(|n| n.as_bytes() == v)) {
            Some(name) => crate::RequestTier::named(name.clone()),
            None => crate::RequestTier::Defaults,
        }
    }
}
