//! Layers from a TOML configuration file (feature `config`): policies, rules, keys, actions,
//! tiers and the backend, deserialised with serde into the builder's own types.
//!
//! ```
//! use turnstile::config::LayerConfig;
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
//! | `[[rules]]` | rules, tried in order; the first that matches applies | none |
//! | `[backend]` | where state lives (see [`BackendConfig`]): `url`, `prefix`, `timeout`, `failure`, `max_keys` | in memory |
//!
//! A rule: `name`, `methods` (`["GET", "HEAD"]`), `path` (exact) or `path_prefix`
//! (segment-wise), `grpc_service` (`helloworld.Greeter`) or `grpc_method`
//! (`helloworld.Greeter/SayHello`), and then `policies` (with an optional `cost`) or
//! `exempt = true`. Unnamed policies are named after their rule, as [`Rule`] says.

mod key;
mod raw;

use std::fmt;
use std::ops::Range;
use std::path::Path;
use std::time::Duration;

use toml::Spanned;
use turnstile_core::{format_duration_ms, MemoryBackend, Policy, Unconfigured};

pub use key::ConfigKey;

use crate::key::{ClientIp, ForwardedHeader, HeaderKey, KeyLogging, MissingKey, PeerIp};
use crate::layer::{Action, FailurePolicy, RateLimitLayer, RateLimitLayerBuilder};
use crate::rule::Rule;
use key::Part;
use raw::{KeyPart, PolicySpec, RawAction, RawFailure, RawFile, RawForwarded};

/// Why a configuration file was refused: where (file, line, column, field) and what.
///
/// Displayed as `FILE:LINE:COLUMN: FIELD: MESSAGE`, e.g.
/// `turnstile.toml:12:13: rules[1].policies[0]: limit 0 is out of range (1 to 4294967295)`;
/// parts that do not apply (an unreadable file has no line) are left out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigFileError(Box<ErrorInner>);

#[derive(Clone, Debug, PartialEq, Eq)]
struct ErrorInner {
    file: String,
    line: Option<usize>,
    column: Option<usize>,
    field: String,
    message: String,
    source_line: Option<String>,
}

impl ConfigFileError {
    fn new(
        file: &str,
        text: &str,
        span: Option<Range<usize>>,
        field: String,
        message: String,
    ) -> Self {
        let (line, column, source_line) = match span {
            Some(span) => {
                let start = span.start.min(text.len());
                let before = &text[..floor_char(text, start)];
                let line = before.matches('\n').count() + 1;
                let line_start = before.rfind('\n').map_or(0, |i| i + 1);
                let column = before[line_start..].chars().count() + 1;
                let source_line = text[line_start..].lines().next().unwrap_or("").to_owned();
                (Some(line), Some(column), Some(source_line))
            }
            None => (None, None, None),
        };
        ConfigFileError(Box::new(ErrorInner {
            file: file.to_owned(),
            line,
            column,
            field,
            message,
            source_line,
        }))
    }

    /// The file's name as given.
    pub fn file(&self) -> &str {
        &self.0.file
    }

    /// The line (from 1), when the error has a place in the file.
    pub fn line(&self) -> Option<usize> {
        self.0.line
    }

    /// The column (from 1, in characters), when the error has a place in the file.
    pub fn column(&self) -> Option<usize> {
        self.0.column
    }

    /// The field, as a path such as `rules[1].policies[0]` (empty for the whole file).
    pub fn field(&self) -> &str {
        &self.0.field
    }

    /// What is wrong.
    pub fn message(&self) -> &str {
        &self.0.message
    }

    /// The offending line of the file with a caret under the column, for people:
    /// ```text
    ///    |
    /// 12 | policies = ["fixed-window:limit=0,period=1s"]
    ///    |             ^
    /// ```
    pub fn snippet(&self) -> Option<String> {
        let e = &self.0;
        let (line, column, text) = (e.line?, e.column?, e.source_line.as_ref()?);
        let number = line.to_string();
        let pad = " ".repeat(number.len());
        let indent: String = text
            .chars()
            .take(column.saturating_sub(1))
            .map(|c| if c == '\t' { '\t' } else { ' ' })
            .collect();
        Some(format!("{pad} |\n{number} | {text}\n{pad} | {indent}^"))
    }
}

impl fmt::Display for ConfigFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let e = &self.0;
        f.write_str(&e.file)?;
        if let Some(line) = e.line {
            write!(f, ":{line}")?;
            if let Some(column) = e.column {
                write!(f, ":{column}")?;
            }
        }
        f.write_str(": ")?;
        if !e.field.is_empty() {
            write!(f, "{}: ", e.field)?;
        }
        f.write_str(&e.message)
    }
}

impl std::error::Error for ConfigFileError {}

/// The largest char boundary at or below `i`.
fn floor_char(text: &str, mut i: usize) -> usize {
    while i > 0 && !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

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

    fn as_str(self) -> &'static str {
        match self {
            BackendFailure::Local => "local",
            BackendFailure::Open => "open",
            BackendFailure::Closed => "closed",
        }
    }
}

/// The `[backend]` table: where rate-limit state lives. turnstile builds the in-memory
/// backend itself ([`LayerConfig::builder`]); for Redis the application builds a
/// `turnstile_redis::RedisBackend` from these settings (see `examples/axum_redis.rs`) and
/// passes it to [`RateLimitLayerBuilder::backend`].
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
    url: Option<String>,
    prefix: Option<String>,
    timeout: Option<Duration>,
    failure: Option<BackendFailure>,
    max_keys: Option<usize>,
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
    exempt_keys: Vec<String>,
    backend: BackendConfig,
}

/// A place in the file: a field path and its span.
struct Loc {
    field: String,
    span: Range<usize>,
}

impl LayerConfig {
    /// Reads and validates the configuration file at `path`.
    ///
    /// # Errors
    /// [`ConfigFileError`]: the file cannot be read, is not TOML, or holds an invalid or
    /// inconsistent setting (each named by line and field).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, ConfigFileError> {
        let path = path.as_ref();
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigFileError::new(
                &name,
                "",
                None,
                String::new(),
                format!("cannot read the file: {e}"),
            )
        })?;
        Self::from_toml(&name, &text)
    }

    /// Validates the configuration `text`; `file` names it in errors.
    ///
    /// # Errors
    /// As [`LayerConfig::from_file`].
    pub fn from_toml(file: &str, text: &str) -> Result<Self, ConfigFileError> {
        let err = |span: Option<Range<usize>>, field: String, message: String| {
            ConfigFileError::new(file, text, span, field, message)
        };
        let de = toml::Deserializer::parse(text)
            .map_err(|e| err(e.span(), String::new(), e.message().to_owned()))?;
        let raw: RawFile = serde_path_to_error::deserialize(de).map_err(|e| {
            let field = field_path(e.path());
            let inner = e.into_inner();
            err(inner.span(), field, inner.message().to_owned())
        })?;
        Validator { file, text }.validate(raw)
    }

    /// A builder with everything the file says, keeping state in memory (a
    /// [`MemoryBackend`], capped at `[backend] max_keys` if set). Add or change anything with
    /// the builder's methods — [`RateLimitLayerBuilder::backend`] for Redis — then `build`.
    pub fn builder(&self) -> RateLimitLayerBuilder<MemoryBackend, ConfigKey> {
        let backend = MemoryBackend::builder()
            .max_keys(self.backend.max_keys)
            .build();
        let mut b = RateLimitLayer::builder()
            .backend(backend)
            .key(self.key.clone())
            .policies(self.policies.iter().cloned())
            .action(self.action)
            .on_backend_failure(self.backend.failure().failure_policy())
            .on_missing_key(self.missing_key.clone())
            .when_unconfigured(self.unconfigured)
            .log_keys(self.key_logging)
            .headers_on_allowed(self.headers_on_allowed)
            .legacy_headers(self.legacy_headers)
            .exempt_keys(self.exempt_keys.iter().cloned());
        if let Some(c) = self.cost {
            b = b.cost(move |_| c);
        }
        for r in &self.rules {
            b = b.rule(r.rule.clone());
        }
        for (name, policies) in &self.tiers {
            b = b.tier(name.clone(), policies.iter().cloned());
        }
        b
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
        self.backend.failure().failure_policy()
    }

    /// What happens to keys with neither override nor tier.
    pub fn unconfigured(&self) -> Unconfigured {
        self.unconfigured
    }

    /// The `[backend]` table.
    pub fn backend(&self) -> &BackendConfig {
        &self.backend
    }
}

/// A serde path as the file's fields: `rules[1].policies[0].limit`, without the span
/// wrappers' own fields.
fn field_path(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for seg in path.iter() {
        match seg {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } if key.starts_with("$__serde_spanned_private") => {}
            Segment::Map { key } | Segment::Enum { variant: key } => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Segment::Unknown => {}
        }
    }
    out
}

/// The checks that span several values.
struct Validator<'a> {
    file: &'a str,
    text: &'a str,
}

impl Validator<'_> {
    fn at(&self, loc: &Loc, message: impl Into<String>) -> ConfigFileError {
        ConfigFileError::new(
            self.file,
            self.text,
            Some(loc.span.clone()),
            loc.field.clone(),
            message.into(),
        )
    }

    fn span_at<T>(
        &self,
        v: &Spanned<T>,
        field: &str,
        message: impl Into<String>,
    ) -> ConfigFileError {
        self.at(
            &Loc {
                field: field.to_owned(),
                span: v.span(),
            },
            message,
        )
    }

    fn validate(&self, raw: RawFile) -> Result<LayerConfig, ConfigFileError> {
        let key = self.key(&raw)?;
        // Every policy under the name the layer gives it, with where it was written.
        let mut named: Vec<(Policy, Loc)> = Vec::new();
        let mut rules = Vec::with_capacity(raw.rules.len());
        for (i, r) in raw.rules.iter().enumerate() {
            rules.push(self.rule(i, r, &mut named)?);
        }
        let mut policies = Vec::with_capacity(raw.policies.len());
        for (j, p) in raw.policies.iter().enumerate() {
            let loc = Loc {
                field: format!("policies[{j}]"),
                span: p.span(),
            };
            let policy = p.get_ref().0.clone();
            self.unique_in_set(&policies, &policy, &loc)?;
            self.consistent(&named, &policy, &loc)?;
            policies.push(policy.clone());
            named.push((policy, loc));
        }
        if policies.is_empty() && rules.iter().all(|r: &RuleEntry| r.named.is_empty()) {
            return Err(ConfigFileError::new(
                self.file,
                self.text,
                None,
                String::new(),
                "no policy applies to any request: give `policies = [...]` for every request, or `[[rules]]` with policies".to_owned(),
            ));
        }
        let mut tiers = Vec::with_capacity(raw.tiers.0.len());
        for (name, list) in &raw.tiers.0 {
            let field = format!("tiers.{name}");
            if turnstile_core::validate_tier_name(name).is_err() {
                return Err(self.span_at(
                    list,
                    &field,
                    format!(
                        "tier name {name:?} is not 1 to 64 ASCII letters, digits, '-', '_' or '.'"
                    ),
                ));
            }
            if list.get_ref().is_empty() {
                return Err(self.span_at(list, &field, "a tier needs at least one policy"));
            }
            let mut set: Vec<Policy> = Vec::new();
            for (j, p) in list.get_ref().iter().enumerate() {
                let loc = Loc {
                    field: format!("{field}[{j}]"),
                    span: p.span(),
                };
                let policy = p.get_ref().0.clone();
                self.unique_in_set(&set, &policy, &loc)?;
                set.push(policy.clone());
                named.push((policy, loc));
            }
            tiers.push((name.clone(), set));
        }
        let action = match raw.action.as_ref().map(|a| *a.get_ref()) {
            None | Some(RawAction::Reject) => Action::Reject,
            Some(RawAction::Shadow) => Action::Shadow,
            Some(RawAction::Delay(d)) => Action::delay(d.0),
        };
        let backend = raw
            .backend
            .map(|b| BackendConfig {
                url: b.url.map(|u| u.0),
                prefix: b.prefix.map(|p| p.0),
                timeout: b.timeout.map(|t| t.0),
                failure: b.failure.map(|f| match f {
                    RawFailure::Local => BackendFailure::Local,
                    RawFailure::Open => BackendFailure::Open,
                    RawFailure::Closed => BackendFailure::Closed,
                }),
                max_keys: b.max_keys.map(|m| m.0),
            })
            .unwrap_or_default();
        let config = LayerConfig {
            key: key.0,
            trusted_proxies: key.1,
            forwarded_header: key.2,
            ipv6_prefix: key.3,
            policies,
            rules,
            tiers,
            cost: raw.cost.map(|c| c.0),
            action,
            missing_key: match raw.on_missing_key {
                None | Some(raw::RawMissingKey::Reject) => MissingKey::Reject,
                Some(raw::RawMissingKey::Allow) => MissingKey::Allow,
                Some(raw::RawMissingKey::Key(k)) => MissingKey::key(k.0),
            },
            unconfigured: match raw.unconfigured {
                None | Some(raw::RawUnconfigured::Defaults) => Unconfigured::Defaults,
                Some(raw::RawUnconfigured::Deny) => Unconfigured::Deny,
                Some(raw::RawUnconfigured::Allow) => Unconfigured::Allow,
            },
            key_logging: match raw.log_keys {
                None | Some(raw::RawKeyLogging::Hashed) => KeyLogging::Hashed,
                Some(raw::RawKeyLogging::Plain) => KeyLogging::Plain,
                Some(raw::RawKeyLogging::Hidden) => KeyLogging::Hidden,
            },
            headers_on_allowed: raw.headers_on_allowed.unwrap_or(true),
            legacy_headers: raw.legacy_headers.unwrap_or(false),
            exempt_keys: raw.exempt_keys,
            backend,
        };
        // Whatever the builder still refuses (a leaky bucket longer than the maximum wait),
        // named by the policy or the action it concerns.
        if let Err(e) = config.builder().build() {
            let loc = match &e {
                crate::InvalidLayer::DelayExceedsMaxWait { policy, .. } => named
                    .iter()
                    .find(|(p, _)| p.name() == policy)
                    .map(|(_, loc)| loc),
                _ => None,
            };
            return Err(match (loc, &raw.action) {
                (Some(loc), _) => self.at(loc, e.to_string()),
                (None, Some(a)) if matches!(e, crate::InvalidLayer::DelayExceedsMaxWait { .. }) => {
                    self.span_at(a, "action", e.to_string())
                }
                _ => ConfigFileError::new(self.file, self.text, None, String::new(), e.to_string()),
            });
        }
        Ok(config)
    }

    /// The key and the settings of its IP sources.
    #[allow(clippy::type_complexity)]
    fn key(
        &self,
        raw: &RawFile,
    ) -> Result<
        (
            ConfigKey,
            Vec<ipnet::IpNet>,
            Option<ForwardedHeader>,
            Option<u8>,
        ),
        ConfigFileError,
    > {
        let parts: Vec<KeyPart> = raw
            .key
            .as_ref()
            .map_or_else(|| vec![KeyPart::Ip], |k| k.get_ref().0.clone());
        let has = |p: &KeyPart| parts.contains(p);
        let trusted: Vec<ipnet::IpNet> = raw
            .trusted_proxies
            .as_ref()
            .map(|t| t.get_ref().iter().map(|c| c.0).collect())
            .unwrap_or_default();
        if let Some(t) = &raw.trusted_proxies {
            if !has(&KeyPart::ClientIp) {
                return Err(self.span_at(
                    t,
                    "trusted_proxies",
                    "trusted_proxies applies to the client-ip key only; add \"client-ip\" to `key`",
                ));
            }
        }
        let header = raw.forwarded_header.as_ref().map(|h| match h.get_ref() {
            RawForwarded::Forwarded => ForwardedHeader::Forwarded,
            RawForwarded::XForwardedFor => ForwardedHeader::XForwardedFor,
            RawForwarded::XRealIp => ForwardedHeader::XRealIp,
        });
        if let Some(h) = &raw.forwarded_header {
            if !has(&KeyPart::ClientIp) {
                return Err(self.span_at(
                    h,
                    "forwarded_header",
                    "forwarded_header applies to the client-ip key only; add \"client-ip\" to `key`",
                ));
            }
        }
        let prefix = raw.ipv6_prefix.as_ref().map(|p| p.get_ref().0);
        if let Some(p) = &raw.ipv6_prefix {
            if !has(&KeyPart::Ip) && !has(&KeyPart::ClientIp) {
                return Err(self.span_at(
                    p,
                    "ipv6_prefix",
                    "ipv6_prefix applies to the ip and client-ip keys only",
                ));
            }
        }
        let mut out = Vec::with_capacity(parts.len());
        for part in &parts {
            out.push(match part {
                KeyPart::Ip => {
                    let k = PeerIp::new();
                    Part::Peer(match prefix {
                        Some(len) => k.ipv6_prefix(len).unwrap_or(k),
                        None => k,
                    })
                }
                KeyPart::ClientIp => {
                    let mut k = ClientIp::new().trust_all(trusted.iter().copied());
                    if let Some(h) = header {
                        k = k.header(h);
                    }
                    Part::Client(match prefix {
                        Some(len) => k.clone().ipv6_prefix(len).unwrap_or(k),
                        None => k,
                    })
                }
                KeyPart::Header(name) => Part::Header(HeaderKey::new(name.clone()), name.clone()),
                #[cfg(feature = "axum")]
                KeyPart::Route => Part::Route,
                #[cfg(not(feature = "axum"))]
                KeyPart::Route => {
                    let k = raw.key.as_ref().map(|k| k.span()).unwrap_or(0..0);
                    return Err(self.at(
                        &Loc {
                            field: "key".to_owned(),
                            span: k,
                        },
                        "the route key needs turnstile's `axum` feature",
                    ));
                }
                KeyPart::GrpcMethod => Part::Grpc,
                KeyPart::Global => Part::Global,
            });
        }
        Ok((ConfigKey::new(out), trusted, header, prefix))
    }

    /// One rule: its conditions, and its policies under the names the layer gives them.
    fn rule(
        &self,
        i: usize,
        spanned: &Spanned<raw::RawRule>,
        named: &mut Vec<(Policy, Loc)>,
    ) -> Result<RuleEntry, ConfigFileError> {
        let field = format!("rules[{i}]");
        let r = spanned.get_ref();
        let fail = |message: &str| self.span_at(spanned, &field, message);
        if r.path.is_some() && r.path_prefix.is_some() {
            return Err(fail("give either `path` or `path_prefix`, not both"));
        }
        if r.grpc_service.is_some() && r.grpc_method.is_some() {
            return Err(fail(
                "give either `grpc_service` or `grpc_method`, not both",
            ));
        }
        if r.exempt && !r.policies.is_empty() {
            return Err(fail("an exempt rule takes no policies"));
        }
        if r.exempt && r.cost.is_some() {
            return Err(fail("an exempt rule takes no cost"));
        }
        if !r.exempt && r.policies.is_empty() {
            return Err(fail(
                "the rule has no policies: give `policies = [...]`, or `exempt = true`",
            ));
        }
        let mut rule = Rule::new();
        if let Some(n) = &r.name {
            rule = rule.name(n.clone());
        }
        for m in &r.methods {
            rule = rule.method(m.0.clone());
        }
        if let Some(p) = &r.path {
            rule = rule.path(p.0.clone());
        }
        if let Some(p) = &r.path_prefix {
            rule = rule.path_prefix(p.0.clone());
        }
        if let Some(s) = &r.grpc_service {
            rule = rule.grpc_service(s.0.clone());
        }
        if let Some(m) = &r.grpc_method {
            rule = rule.grpc_method(m.0 .0.clone(), m.0 .1.clone());
        }
        if r.exempt {
            rule = rule.exempt();
        }
        if let Some(c) = r.cost {
            let c = c.0;
            rule = rule.cost(move |_| c);
        }
        let label = rule.label();
        let mut set: Vec<Policy> = Vec::with_capacity(r.policies.len());
        for (j, p) in r.policies.iter().enumerate() {
            let loc = Loc {
                field: format!("{field}.policies[{j}]"),
                span: p.span(),
            };
            let PolicySpec(policy) = p.get_ref();
            rule = rule.policy(policy.clone());
            let final_policy = if policy.has_explicit_name() {
                policy.clone()
            } else {
                let name = format!("{label} {}", policy.name());
                policy.clone().with_name(&name).map_err(|_| {
                    self.at(
                        &loc,
                        format!("the name this policy gets from its rule, {name:?}, is not a valid policy name; give the rule a shorter `name` or the policy its own"),
                    )
                })?
            };
            self.unique_in_set(&set, &final_policy, &loc)?;
            self.consistent(named, &final_policy, &loc)?;
            set.push(final_policy.clone());
            named.push((final_policy, loc));
        }
        Ok(RuleEntry {
            rule,
            cost: r.cost.map(|c| c.0),
            named: set,
        })
    }

    /// Two policies of one set may not share a name.
    fn unique_in_set(&self, set: &[Policy], p: &Policy, loc: &Loc) -> Result<(), ConfigFileError> {
        if set.iter().any(|q| q.name() == p.name()) {
            return Err(self.at(
                loc,
                format!(
                    "another policy of this set is named {:?}; names must be unique within a rule, a tier or the top-level policies",
                    p.name()
                ),
            ));
        }
        Ok(())
    }

    /// Policies of one name share a counter: their parameters must match.
    fn consistent(
        &self,
        named: &[(Policy, Loc)],
        p: &Policy,
        loc: &Loc,
    ) -> Result<(), ConfigFileError> {
        if let Some((_, other)) = named
            .iter()
            .find(|(q, _)| q.name() == p.name() && q.fingerprint() != p.fingerprint())
        {
            return Err(self.at(
                loc,
                format!(
                    "{} also has a policy named {:?}, with different parameters; a shared name is a shared counter, so the parameters must match",
                    other.field,
                    p.name()
                ),
            ));
        }
        Ok(())
    }
}

impl fmt::Display for LayerConfig {
    /// The effective configuration, as `turnstile check-config` prints it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "key: {}", self.key.spec())?;
        let parts = self.key.parts();
        for p in parts {
            writeln!(f, "  {}: {}", p.spec(), p.meaning())?;
        }
        if parts.len() > 1 {
            writeln!(f, "  stored as the parts joined with |")?;
        }
        if parts.iter().any(|p| matches!(p, Part::Client(_))) {
            let nets: Vec<String> = self.trusted_proxies.iter().map(|n| n.to_string()).collect();
            if nets.is_empty() {
                writeln!(
                    f,
                    "  trusted proxies: none (every forwarding header is ignored)"
                )?;
            } else {
                writeln!(f, "  trusted proxies: {}", nets.join(", "))?;
            }
            match self.forwarded_header {
                Some(h) => writeln!(f, "  forwarding header: {}", h.name())?,
                None => writeln!(
                    f,
                    "  forwarding header: the first present of forwarded, x-forwarded-for, x-real-ip"
                )?,
            }
        }
        if let Some(p) = self.ipv6_prefix {
            writeln!(f, "  IPv6 grouped by /{p}")?;
        }
        let action = match self.action {
            Action::Reject => "reject".to_owned(),
            Action::Shadow => "shadow (count and log, admit everything)".to_owned(),
            Action::Delay { max_wait } => format!(
                "delay (wait up to {})",
                format_duration_ms(u64::try_from(max_wait.as_millis()).unwrap_or(u64::MAX))
            ),
        };
        writeln!(f, "action: {action}")?;
        let missing = match &self.missing_key {
            MissingKey::Reject => "reject".to_owned(),
            MissingKey::Allow => "allow".to_owned(),
            MissingKey::Key(k) => format!("count under the key {k:?}"),
        };
        writeln!(f, "on missing key: {missing}")?;
        let unconfigured = match self.unconfigured {
            Unconfigured::Defaults => "the rule's policies",
            Unconfigured::Deny => "deny",
            Unconfigured::Allow => "allow without limit",
            _ => "?",
        };
        writeln!(f, "keys without override or tier: {unconfigured}")?;
        if !self.exempt_keys.is_empty() {
            writeln!(f, "exempt keys: {}", self.exempt_keys.join(", "))?;
        }
        writeln!(
            f,
            "headers: RateLimit on admitted responses: {}; legacy X-RateLimit-*: {}",
            if self.headers_on_allowed { "yes" } else { "no" },
            if self.legacy_headers { "yes" } else { "no" }
        )?;
        let logging = match self.key_logging {
            KeyLogging::Plain => "plain",
            KeyLogging::Hidden => "hidden",
            _ => "hashed",
        };
        writeln!(f, "keys in logs: {logging}")?;
        let b = &self.backend;
        match b.url() {
            Some(url) => {
                write!(f, "backend: redis {url}")?;
                if let Some(p) = b.prefix() {
                    write!(f, ", prefix {p}")?;
                }
                if let Some(t) = b.timeout() {
                    write!(
                        f,
                        ", timeout {}",
                        format_duration_ms(u64::try_from(t.as_millis()).unwrap_or(u64::MAX))
                    )?;
                }
                writeln!(f)?;
            }
            None => match b.max_keys() {
                Some(n) => writeln!(f, "backend: in memory, at most {n} keys")?,
                None => writeln!(f, "backend: in memory")?,
            },
        }
        let failure = match b.failure() {
            BackendFailure::Local => "Redis decides in memory on each node; errors that still reach the layer admit the request",
            BackendFailure::Open => "admit the request",
            BackendFailure::Closed => "answer 503 (gRPC UNAVAILABLE)",
        };
        writeln!(
            f,
            "on backend failure: {} ({failure})",
            b.failure().as_str()
        )?;
        let cost = |c: Option<u64>| c.or(self.cost).unwrap_or(1);
        writeln!(f, "rules (the first that matches applies):")?;
        for (i, r) in self.rules.iter().enumerate() {
            write!(f, "  {}. {}", i + 1, r.rule.conditions())?;
            if let Some(n) = &r.rule.name {
                write!(f, " (rule {n:?})")?;
            }
            if r.rule.exempt {
                writeln!(f, ": exempt")?;
                continue;
            }
            writeln!(f, ", cost {}:", cost(r.cost))?;
            for p in &r.named {
                writeln!(f, "       {:?} {}", p.name(), p.spec_without_name())?;
            }
        }
        if self.policies.is_empty() {
            writeln!(f, "  otherwise: not limited")?;
        } else {
            writeln!(f, "  otherwise, cost {}:", cost(None))?;
            for p in &self.policies {
                writeln!(f, "       {:?} {}", p.name(), p.spec_without_name())?;
            }
        }
        if !self.tiers.is_empty() {
            writeln!(
                f,
                "tiers (instead of a rule's policies for keys set to the tier):"
            )?;
            for (name, policies) in &self.tiers {
                writeln!(f, "  {name}:")?;
                for p in policies {
                    writeln!(f, "       {:?} {}", p.name(), p.spec_without_name())?;
                }
            }
        }
        Ok(())
    }
}
