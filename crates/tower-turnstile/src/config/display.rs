//! The effective configuration, as `turnstile check-config` prints it: the `Display` of
//! [`LayerConfig`].

use std::fmt;
use std::time::Duration;

use turnstile_core::policy::format_duration_ms;
use turnstile_core::{FailurePolicy, Policy, Unconfigured};

use super::key::Part;
use super::{BackendConfig, LayerConfig};
use crate::action::Action;
use crate::key::{KeyLogging, MissingKey};

impl fmt::Display for LayerConfig {
    /// The effective configuration, as `turnstile check-config` prints it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_key(f)?;
        self.write_settings(f)?;
        self.backend.write(f)?;
        self.write_rules(f)?;
        self.write_tiers(f)
    }
}

impl LayerConfig {
    /// The key, each of its sources, and the settings of its IP sources.
    fn write_key(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
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
        Ok(())
    }

    /// What denied requests, requests without a key and keys without configuration get;
    /// tiers per request, exempt keys, headers and logged keys.
    fn write_settings(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let action = match self.action {
            Action::Reject => "reject".to_owned(),
            Action::Shadow => "shadow (count and log, admit everything)".to_owned(),
            Action::Delay { max_wait } => format!("delay (wait up to {})", duration(max_wait)),
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
        if let Some(h) = &self.tier_header {
            writeln!(
                f,
                "tier per request: named by the {h} header (a key's stored override or tier wins)"
            )?;
        }
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
        writeln!(f, "keys in logs: {logging}")
    }

    /// The rules in order, each with its cost and policies, then the layer's own policies.
    fn write_rules(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
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
            write_policies(f, &r.named)?;
        }
        if self.policies.is_empty() {
            writeln!(f, "  otherwise: not limited")
        } else {
            writeln!(f, "  otherwise, cost {}:", cost(None))?;
            write_policies(f, &self.policies)
        }
    }

    /// The tiers and their policies.
    fn write_tiers(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.tiers.is_empty() {
            return Ok(());
        }
        writeln!(
            f,
            "tiers (for keys set to the tier, each policy a tier names takes its parameters; every other stays in force):"
        )?;
        for (name, policies) in &self.tiers {
            writeln!(f, "  {name}:")?;
            write_policies(f, policies)?;
        }
        Ok(())
    }
}

impl BackendConfig {
    /// Where state lives, and what happens when the backend cannot decide.
    fn write(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.url() {
            Some(url) => {
                write!(f, "backend: redis {url}")?;
                if let Some(p) = self.prefix() {
                    write!(f, ", prefix {p}")?;
                }
                if let Some(t) = self.timeout() {
                    write!(f, ", timeout {}", duration(t))?;
                }
                if let Some(ca) = self.tls_ca() {
                    write!(f, ", TLS CA {}", ca.display())?;
                }
                if let Some((cert, key)) = self.tls_client_cert() {
                    write!(
                        f,
                        ", TLS client certificate {} (key {})",
                        cert.display(),
                        key.display()
                    )?;
                }
                writeln!(f)?;
            }
            None => match self.max_keys() {
                Some(n) => writeln!(f, "backend: in memory, at most {n} keys")?,
                None => writeln!(f, "backend: in memory")?,
            },
        }
        if let Some(n) = self.max_key_bytes() {
            writeln!(
                f,
                "keys: at most {n} bytes (longer: 400 / INVALID_ARGUMENT)"
            )?;
        }
        writeln!(
            f,
            "on backend failure: {} ({})",
            self.failure(),
            failure_outcome(self.failure())
        )
    }
}

/// One line per policy: its name as the layer gives it, and its parameters.
fn write_policies(f: &mut fmt::Formatter<'_>, policies: &[Policy]) -> fmt::Result {
    for p in policies {
        writeln!(f, "       {:?} {}", p.name(), p.spec_without_name())?;
    }
    Ok(())
}

/// `d` as a policy string writes a duration.
fn duration(d: Duration) -> String {
    format_duration_ms(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// What `failure` does with a request the backend cannot decide, as the layer answers it
/// (see [`RateLimitLayerBuilder::on_backend_failure`](crate::RateLimitLayerBuilder::on_backend_failure)).
fn failure_outcome(failure: FailurePolicy) -> &'static str {
    match failure {
        FailurePolicy::Closed => "answer 503 (gRPC UNAVAILABLE)",
        other => other.describe(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The policy names the effective configuration prints, rule by rule and then the
    /// top-level ones (tiers left out).
    fn printed_names(config: &LayerConfig) -> Vec<String> {
        config
            .to_string()
            .lines()
            .take_while(|l| !l.starts_with("tiers "))
            .filter_map(|l| l.strip_prefix("       \""))
            .map(|l| l.split('"').next().unwrap_or_default().to_owned())
            .collect()
    }

    #[test]
    fn check_config_prints_the_names_the_layer_uses() {
        let text = r#"
policies = ["token-bucket:limit=100,period=1m", "gcra:limit=5,period=1s,name=per-second"]

[[rules]]
methods = ["POST"]
path = "/login"
policies = ["fixed-window:limit=5,period=1m", "sliding-log:limit=20,period=1h"]

[[rules]]
name = "api"
path_prefix = "/api"
policies = ["gcra:limit=10,period=1s", "fixed-window:limit=5,period=1m,name=shared"]

[[rules]]
grpc_method = "helloworld.Greeter/SayHello"
policies = ["fixed-window:limit=5,period=1m", "fixed-window:limit=5,period=1m,name=shared"]

[[rules]]
path = "/healthz"
exempt = true
"#;
        let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/turnstile.toml");
        for config in [
            LayerConfig::from_toml("t.toml", text).unwrap(),
            LayerConfig::from_file(example).unwrap(),
        ] {
            let layer = config.builder().build().unwrap();
            let used: Vec<String> = layer
                .limiter
                .settings
                .rules
                .iter()
                .flat_map(|r| r.policies.iter().map(|p| p.name().to_owned()))
                .collect();
            assert_eq!(printed_names(&config), used);
            let printed = printed_names(&config);
            let own: Vec<&str> = layer.policies().iter().map(|p| p.name()).collect();
            assert_eq!(printed[printed.len() - own.len()..], own);
        }
        let config = LayerConfig::from_toml("t.toml", text).unwrap();
        assert_eq!(
            printed_names(&config),
            [
                "POST /login fixed-window:limit=5,period=1m",
                "POST /login sliding-log:limit=20,period=1h",
                "api gcra:limit=10,period=1s",
                "shared",
                "grpc helloworld.Greeter/SayHello fixed-window:limit=5,period=1m",
                "shared",
                "token-bucket:limit=100,period=1m",
                "per-second",
            ]
        );
    }
}
