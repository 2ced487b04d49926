//! From the file's text to a [`LayerConfig`]: parsing (each value checked where serde reads
//! it, in `raw`), then the checks that span several values (the `Validator`).

use std::ops::Range;
use std::path::{Path, PathBuf};

use toml::Spanned;
use turnstile_core::{Policy, Unconfigured};

use super::backend::BackendConfig;
use super::error::ConfigFileError;
use super::key::{ConfigKey, Part};
use super::raw::{self, FilePath, KeyPart, PolicySpec, RawAction, RawFile};
use super::{LayerConfig, RuleEntry};
use crate::action::Action;
use crate::error::InvalidLayer;
use crate::key::{ClientIp, ForwardedHeader, HeaderKey, KeyLogging, MissingKey, PeerIp};
use crate::naming;
use crate::rule::Rule;
use turnstile_core::FailurePolicy;

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
}

/// A place in the file: a field path and its span.
struct Loc {
    field: String,
    span: Range<usize>,
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

    /// An error about the file as a whole (no place in it).
    fn whole_file(&self, message: String) -> ConfigFileError {
        ConfigFileError::new(self.file, self.text, None, String::new(), message)
    }

    /// The `[backend]` table; the TLS files go together with a `rediss://` url.
    fn backend(&self, b: raw::RawBackend) -> Result<BackendConfig, ConfigFileError> {
        self.check_tls_url(&b)?;
        let url = b.url.map(|u| u.0);
        let tls_client = self.tls_client(b.tls_cert, b.tls_key)?;
        Ok(BackendConfig {
            url,
            prefix: b.prefix.map(|p| p.0),
            timeout: b.timeout.map(|t| t.0),
            failure: b.failure.map(FailurePolicy::from),
            max_keys: b.max_keys.map(|m| m.0),
            max_key_bytes: b.max_key_bytes.map(|m| m.0),
            tls_ca: b.tls_ca.map(|p| p.into_inner().0),
            tls_client,
        })
    }

    /// TLS files need a `rediss://` url for every node, and a CA file a url that verifies
    /// certificates (no `#insecure`).
    fn check_tls_url(&self, b: &raw::RawBackend) -> Result<(), ConfigFileError> {
        let url = b.url.as_ref().map(|u| u.0.as_str());
        let tls = [
            ("backend.tls_ca", &b.tls_ca),
            ("backend.tls_cert", &b.tls_cert),
            ("backend.tls_key", &b.tls_key),
        ];
        if let Some((field, Some(first))) = tls.iter().find(|(_, v)| v.is_some()) {
            let all_tls = url.is_some_and(|u| {
                u.split(',').all(|u| {
                    u.trim()
                        .get(..9)
                        .is_some_and(|s| s.eq_ignore_ascii_case("rediss://"))
                })
            });
            if !all_tls {
                return Err(self.span_at(
                    first,
                    field,
                    "TLS files need a rediss:// url (TLS) for every node",
                ));
            }
        }
        if let (Some(ca), Some(u)) = (&b.tls_ca, url) {
            if u.contains("#insecure") {
                return Err(self.span_at(
                    ca,
                    "backend.tls_ca",
                    "the url's #insecure turns certificate verification off, so tls_ca would not be used: give one or the other",
                ));
            }
        }
        Ok(())
    }

    /// The client certificate and its key, which go together.
    fn tls_client(
        &self,
        cert: Option<Spanned<FilePath>>,
        key: Option<Spanned<FilePath>>,
    ) -> Result<Option<(PathBuf, PathBuf)>, ConfigFileError> {
        match (cert, key) {
            (Some(cert), Some(key)) => Ok(Some((cert.into_inner().0, key.into_inner().0))),
            (None, None) => Ok(None),
            (Some(cert), None) => Err(self.span_at(
                &cert,
                "backend.tls_cert",
                "tls_cert needs tls_key, the certificate's private key",
            )),
            (None, Some(key)) => Err(self.span_at(
                &key,
                "backend.tls_key",
                "tls_key needs tls_cert, the client certificate it belongs to",
            )),
        }
    }

    fn validate(&self, raw: RawFile) -> Result<LayerConfig, ConfigFileError> {
        let key = self.key(&raw)?;
        // Every policy under the name the layer gives it, with where it was written.
        let mut named: Vec<(Policy, Loc)> = Vec::new();
        let mut rules = Vec::with_capacity(raw.rules.len());
        for (i, r) in raw.rules.iter().enumerate() {
            rules.push(self.rule(i, r, &mut named)?);
        }
        let policies = self.name_set(None, &raw.policies, "policies", &mut named, true)?;
        if policies.is_empty() && rules.iter().all(|r: &RuleEntry| r.named.is_empty()) {
            return Err(self.whole_file(
                "no policy applies to any request: give `policies = [...]` for every request, or `[[rules]]` with policies".to_owned(),
            ));
        }
        let tiers = self.tiers(&raw.tiers, &mut named)?;
        if let (Some(h), true) = (&raw.tier_header, tiers.is_empty()) {
            return Err(self.span_at(
                h,
                "tier_header",
                "the header names a tier per request, but the file defines no `[tiers]`",
            ));
        }
        let backend = match raw.backend {
            Some(b) => self.backend(b)?,
            None => BackendConfig::default(),
        };
        let config = LayerConfig {
            key: key.key,
            trusted_proxies: key.trusted_proxies,
            forwarded_header: key.forwarded_header,
            ipv6_prefix: key.ipv6_prefix,
            policies,
            rules,
            tiers,
            cost: raw.cost.map(|c| c.0),
            action: raw
                .action
                .as_ref()
                .map_or(Action::Reject, |a| Action::from(*a.get_ref())),
            missing_key: raw
                .on_missing_key
                .map_or(MissingKey::Reject, MissingKey::from),
            unconfigured: raw
                .unconfigured
                .map_or(Unconfigured::Defaults, Unconfigured::from),
            key_logging: raw.log_keys.map_or(KeyLogging::Hashed, KeyLogging::from),
            headers_on_allowed: raw.headers_on_allowed.unwrap_or(true),
            legacy_headers: raw.legacy_headers.unwrap_or(false),
            tier_header: raw.tier_header.map(|h| h.into_inner().0),
            exempt_keys: raw.exempt_keys,
            backend,
        };
        self.check_builds(&config, &named, raw.action.as_ref())?;
        Ok(config)
    }

    /// `[tiers]`: each a valid name and at least one policy, named as the layer names them.
    fn tiers(
        &self,
        raw: &raw::Tiers,
        named: &mut Vec<(Policy, Loc)>,
    ) -> Result<Vec<(String, Vec<Policy>)>, ConfigFileError> {
        let mut tiers = Vec::with_capacity(raw.0.len());
        for (name, list) in &raw.0 {
            let field = format!("tiers.{name}");
            if turnstile_core::quota::validate_tier_name(name).is_err() {
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
            let set = self.name_set(None, list.get_ref(), &field, named, false)?;
            tiers.push((name.clone(), set));
        }
        Ok(tiers)
    }

    /// Whatever the builder still refuses in `config` (a leaky bucket longer than the
    /// maximum wait, a tier policy no rule uses, too many policies), named by the policy or
    /// the action it concerns.
    fn check_builds(
        &self,
        config: &LayerConfig,
        named: &[(Policy, Loc)],
        action: Option<&Spanned<RawAction>>,
    ) -> Result<(), ConfigFileError> {
        let Err(e) = config.builder().build() else {
            return Ok(());
        };
        let loc = match &e {
            InvalidLayer::DelayExceedsMaxWait { policy, .. }
            | InvalidLayer::UnusedTierPolicy { policy, .. } => named
                .iter()
                .find(|(p, _)| p.name() == policy)
                .map(|(_, loc)| loc),
            _ => None,
        };
        Err(match (loc, action) {
            (Some(loc), _) => self.at(loc, e.to_string()),
            (None, Some(a)) if matches!(e, InvalidLayer::DelayExceedsMaxWait { .. }) => {
                self.span_at(a, "action", e.to_string())
            }
            _ => self.whole_file(e.to_string()),
        })
    }

    /// The key and the settings of its IP sources.
    fn key(&self, raw: &RawFile) -> Result<KeySettings, ConfigFileError> {
        let parts: Vec<KeyPart> = raw
            .key
            .as_ref()
            .map_or_else(|| vec![KeyPart::Ip], |k| k.get_ref().0.clone());
        self.check_ip_settings(raw, &parts)?;
        let trusted_proxies: Vec<ipnet::IpNet> = raw
            .trusted_proxies
            .as_ref()
            .map(|t| t.get_ref().iter().map(|c| c.0).collect())
            .unwrap_or_default();
        let forwarded_header = raw
            .forwarded_header
            .as_ref()
            .map(|h| ForwardedHeader::from(*h.get_ref()));
        let ipv6_prefix = raw.ipv6_prefix.as_ref().map(|p| p.get_ref().0);
        let key = ConfigKey::new(
            parts
                .iter()
                .map(|part| key_part(part, &trusted_proxies, forwarded_header, ipv6_prefix))
                .collect(),
        );
        Ok(KeySettings {
            key,
            trusted_proxies,
            forwarded_header,
            ipv6_prefix,
        })
    }

    /// The IP sources' settings are given only with a key that has those sources.
    fn check_ip_settings(&self, raw: &RawFile, parts: &[KeyPart]) -> Result<(), ConfigFileError> {
        let client_ip = parts.contains(&KeyPart::ClientIp);
        if let (Some(t), false) = (&raw.trusted_proxies, client_ip) {
            return Err(self.span_at(
                t,
                "trusted_proxies",
                "trusted_proxies applies to the client-ip key only; add \"client-ip\" to `key`",
            ));
        }
        if let (Some(h), false) = (&raw.forwarded_header, client_ip) {
            return Err(self.span_at(
                h,
                "forwarded_header",
                "forwarded_header applies to the client-ip key only; add \"client-ip\" to `key`",
            ));
        }
        let any_ip = client_ip || parts.contains(&KeyPart::Ip);
        if let (Some(p), false) = (&raw.ipv6_prefix, any_ip) {
            return Err(self.span_at(
                p,
                "ipv6_prefix",
                "ipv6_prefix applies to the ip and client-ip keys only",
            ));
        }
        Ok(())
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
        if let Some(conflict) = rule_conflict(r) {
            return Err(fail(conflict));
        }
        let mut rule = rule_conditions(r);
        if let Some(reason) = rule.matches_nothing() {
            return Err(fail(&format!("no request can match this rule: {reason}")));
        }
        if r.exempt {
            rule = rule.exempt();
        }
        if let Some(c) = r.cost {
            let c = c.0;
            rule = rule.cost(move |_| c);
        }
        rule = rule.policies(r.policies.iter().map(|p| p.get_ref().0.clone()));
        let set = self.name_set(
            Some(&rule.label()),
            &r.policies,
            &format!("{field}.policies"),
            named,
            true,
        )?;
        Ok(RuleEntry {
            rule,
            cost: r.cost.map(|c| c.0),
            named: set,
        })
    }

    /// Names a set of policies as the layer does ([`naming`]): a rule's after `rule_label`,
    /// the top-level ones and a tier's as given. Records each in `named` with where it was
    /// written (`field[j]`); with `shared`, checks them against every policy named before: a
    /// shared name is a shared counter, so the parameters must match.
    fn name_set(
        &self,
        rule_label: Option<&str>,
        specs: &[Spanned<PolicySpec>],
        field: &str,
        named: &mut Vec<(Policy, Loc)>,
        shared: bool,
    ) -> Result<Vec<Policy>, ConfigFileError> {
        let policies: Vec<Policy> = specs.iter().map(|p| p.get_ref().0.clone()).collect();
        let locs: Vec<Loc> = specs
            .iter()
            .enumerate()
            .map(|(j, p)| Loc {
                field: format!("{field}[{j}]"),
                span: p.span(),
            })
            .collect();
        let set = naming::name_policies(rule_label, &policies)
            .map_err(|m| self.misnamed(&m.error, &locs[m.index], None))?;
        named.extend(set.iter().cloned().zip(locs));
        if shared {
            naming::check_shared_names(named.iter().map(|(p, _)| p)).map_err(|m| {
                let earlier = m.earlier.map(|e| &named[e].1);
                self.misnamed(&m.error, &named[m.index].1, earlier)
            })?;
        }
        Ok(set)
    }

    /// A naming problem as the file says it, at the policy concerned; for a conflict,
    /// `earlier` is where the other policy of that name was written.
    fn misnamed(&self, error: &InvalidLayer, loc: &Loc, earlier: Option<&Loc>) -> ConfigFileError {
        let message = match (error, earlier) {
            (InvalidLayer::InvalidPolicyName(name), _) => format!("the name this policy gets from its rule, {name:?}, is not a valid policy name; give the rule a shorter `name` or the policy its own"),
            (InvalidLayer::DuplicatePolicyName(name), _) => format!(
                "another policy of this set is named {name:?}; names must be unique within a rule, a tier or the top-level policies"
            ),
            (InvalidLayer::ConflictingPolicy(name), Some(other)) => format!(
                "{} also has a policy named {name:?}, with different parameters; a shared name is a shared counter, so the parameters must match",
                other.field
            ),
            (e, _) => e.to_string(),
        };
        self.at(loc, message)
    }
}

/// The file's key and the settings of its IP sources.
struct KeySettings {
    key: ConfigKey,
    trusted_proxies: Vec<ipnet::IpNet>,
    forwarded_header: Option<ForwardedHeader>,
    ipv6_prefix: Option<u8>,
}

/// One source of the key, with the IP sources' settings.
fn key_part(
    part: &KeyPart,
    trusted: &[ipnet::IpNet],
    header: Option<ForwardedHeader>,
    prefix: Option<u8>,
) -> Part {
    match part {
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
        KeyPart::Route => Part::Route,
        KeyPart::GrpcMethod => Part::Grpc,
        KeyPart::Global => Part::Global,
    }
}

/// What a rule's fields ask that cannot go together, if anything.
fn rule_conflict(r: &raw::RawRule) -> Option<&'static str> {
    let conflicts = [
        (
            r.path.is_some() && r.path_prefix.is_some(),
            "give either `path` or `path_prefix`, not both",
        ),
        (
            r.grpc_service.is_some() && r.grpc_method.is_some(),
            "give either `grpc_service` or `grpc_method`, not both",
        ),
        (
            r.preflight && !r.methods.is_empty(),
            "`preflight = true` matches OPTIONS requests only; drop `methods`",
        ),
        (
            r.exempt && !r.policies.is_empty(),
            "an exempt rule takes no policies",
        ),
        (r.exempt && r.cost.is_some(), "an exempt rule takes no cost"),
        (
            !r.exempt && r.policies.is_empty(),
            "the rule has no policies: give `policies = [...]`, or `exempt = true`",
        ),
    ];
    conflicts.into_iter().find(|(yes, _)| *yes).map(|(_, m)| m)
}

/// The rule the conditions of `r` make: its name, methods, path, gRPC service or method,
/// preflight.
fn rule_conditions(r: &raw::RawRule) -> Rule {
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
    if r.preflight {
        rule = rule.cors_preflight();
    }
    rule
}
