//! The file as serde reads it. Each value is checked on its own where it is read (so an error
//! names its field and line); what spans several values is checked in `super::validate`.

use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use http::{HeaderName, Method};
use ipnet::IpNet;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use toml::Spanned;
use turnstile_core::policy::{parse_duration, MAX_LIMIT, MAX_PERIOD_MS, MAX_REQUEST_VALUE};
use turnstile_core::{Algorithm, FailurePolicy, InvalidPolicy, Policy, Unconfigured};

use crate::action::Action;
use crate::key::{ForwardedHeader, KeyLogging, MissingKey};

/// The whole file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFile {
    pub(super) key: Option<Spanned<KeySpec>>,
    pub(super) trusted_proxies: Option<Spanned<Vec<Cidr>>>,
    pub(super) forwarded_header: Option<Spanned<RawForwarded>>,
    pub(super) ipv6_prefix: Option<Spanned<Ipv6Prefix>>,
    pub(super) action: Option<Spanned<RawAction>>,
    pub(super) on_missing_key: Option<RawMissingKey>,
    pub(super) unconfigured: Option<RawUnconfigured>,
    pub(super) log_keys: Option<RawKeyLogging>,
    pub(super) headers_on_allowed: Option<bool>,
    pub(super) legacy_headers: Option<bool>,
    pub(super) tier_header: Option<Spanned<HeaderSpec>>,
    #[serde(default)]
    pub(super) exempt_keys: Vec<String>,
    pub(super) cost: Option<Cost>,
    #[serde(default)]
    pub(super) policies: Vec<Spanned<PolicySpec>>,
    #[serde(default)]
    pub(super) tiers: Tiers,
    #[serde(default)]
    pub(super) rules: Vec<Spanned<RawRule>>,
    pub(super) backend: Option<RawBackend>,
}

/// One `[[rules]]` entry.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRule {
    pub(super) name: Option<String>,
    #[serde(default)]
    pub(super) methods: Vec<MethodSpec>,
    pub(super) path: Option<PathSpec>,
    pub(super) path_prefix: Option<PathSpec>,
    pub(super) grpc_service: Option<GrpcService>,
    pub(super) grpc_method: Option<GrpcMethodSpec>,
    #[serde(default)]
    pub(super) preflight: bool,
    #[serde(default)]
    pub(super) policies: Vec<Spanned<PolicySpec>>,
    #[serde(default)]
    pub(super) exempt: bool,
    pub(super) cost: Option<Cost>,
}

/// The `[backend]` table.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBackend {
    pub(super) url: Option<RedisUrl>,
    pub(super) prefix: Option<Prefix>,
    pub(super) timeout: Option<Timeout>,
    pub(super) failure: Option<RawFailure>,
    pub(super) max_keys: Option<MaxKeys>,
    pub(super) max_key_bytes: Option<MaxKeyBytes>,
    pub(super) tls_ca: Option<Spanned<FilePath>>,
    pub(super) tls_cert: Option<Spanned<FilePath>>,
    pub(super) tls_key: Option<Spanned<FilePath>>,
}

#[derive(Clone, Copy, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum RawFailure {
    Local,
    Open,
    Closed,
}

#[derive(Clone, Copy, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum RawForwarded {
    Forwarded,
    XForwardedFor,
    XRealIp,
}

#[derive(Clone, Copy, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum RawAction {
    Reject,
    Shadow,
    Delay(DurationSpec),
}

#[derive(Clone, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum RawMissingKey {
    Reject,
    Allow,
    Key(NonEmpty),
}

#[derive(Clone, Copy, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum RawUnconfigured {
    Defaults,
    Deny,
    Allow,
}

#[derive(Clone, Copy, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum RawKeyLogging {
    Hashed,
    Plain,
    Hidden,
}

impl From<RawFailure> for FailurePolicy {
    fn from(f: RawFailure) -> Self {
        match f {
            RawFailure::Local => FailurePolicy::Local,
            RawFailure::Open => FailurePolicy::Open,
            RawFailure::Closed => FailurePolicy::Closed,
        }
    }
}

impl From<RawForwarded> for ForwardedHeader {
    fn from(h: RawForwarded) -> Self {
        match h {
            RawForwarded::Forwarded => ForwardedHeader::Forwarded,
            RawForwarded::XForwardedFor => ForwardedHeader::XForwardedFor,
            RawForwarded::XRealIp => ForwardedHeader::XRealIp,
        }
    }
}

impl From<RawAction> for Action {
    fn from(a: RawAction) -> Self {
        match a {
            RawAction::Reject => Action::Reject,
            RawAction::Shadow => Action::Shadow,
            RawAction::Delay(d) => Action::delay(d.0),
        }
    }
}

impl From<RawMissingKey> for MissingKey {
    fn from(m: RawMissingKey) -> Self {
        match m {
            RawMissingKey::Reject => MissingKey::Reject,
            RawMissingKey::Allow => MissingKey::Allow,
            RawMissingKey::Key(k) => MissingKey::key(k.0),
        }
    }
}

impl From<RawUnconfigured> for Unconfigured {
    fn from(u: RawUnconfigured) -> Self {
        match u {
            RawUnconfigured::Defaults => Unconfigured::Defaults,
            RawUnconfigured::Deny => Unconfigured::Deny,
            RawUnconfigured::Allow => Unconfigured::Allow,
        }
    }
}

impl From<RawKeyLogging> for KeyLogging {
    fn from(k: RawKeyLogging) -> Self {
        match k {
            RawKeyLogging::Hashed => KeyLogging::Hashed,
            RawKeyLogging::Plain => KeyLogging::Plain,
            RawKeyLogging::Hidden => KeyLogging::Hidden,
        }
    }
}

/// Implements `Deserialize` for a newtype by parsing one kind of TOML value (a string or an
/// integer). The check runs inside the value's own visitor, so an error carries the value's
/// place in the file.
macro_rules! parsed {
    ($name:ident($inner:ty) from $from:ident, $expecting:literal, |$v:ident| $parse:expr) => {
        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                fn check($v: $from) -> Result<$name, String> {
                    let parsed: Result<$inner, String> = $parse;
                    parsed.map($name)
                }
                d.deserialize_any(Checked::<$from, $name>(check, $expecting))
            }
        }
    };
}

/// A visitor that accepts one kind of value (`String` or `u64`) and checks it.
struct Checked<F, T>(fn(F) -> Result<T, String>, &'static str);

impl<'de, T> Visitor<'de> for Checked<String, T> {
    type Value = T;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a string ({})", self.1)
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<T, E> {
        (self.0)(s.to_owned()).map_err(E::custom)
    }
}

impl<'de, T> Visitor<'de> for Checked<u64, T> {
    type Value = T;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a non-negative integer ({})", self.1)
    }
    fn visit_u64<E: de::Error>(self, n: u64) -> Result<T, E> {
        (self.0)(n).map_err(E::custom)
    }
    fn visit_i64<E: de::Error>(self, n: i64) -> Result<T, E> {
        match u64::try_from(n) {
            Ok(n) => (self.0)(n).map_err(E::custom),
            Err(_) => Err(E::invalid_value(de::Unexpected::Signed(n), &self)),
        }
    }
}

/// A duration in the grammar of `SEMANTICS.md`.
#[derive(Clone, Copy)]
pub(super) struct DurationSpec(pub(super) Duration);
parsed!(DurationSpec(Duration) from String, "duration", |s| parse_duration(&s)
    .map_err(|e| e.to_string()));

/// A timeout: a duration above zero.
pub(super) struct Timeout(pub(super) Duration);
parsed!(Timeout(Duration) from String, "timeout", |s| match parse_duration(&s) {
    Ok(d) if d.is_zero() => Err("a timeout must be above 0".to_owned()),
    Ok(d) => Ok(d),
    Err(e) => Err(e.to_string()),
});

/// A request cost: 0 to 2^53 − 1.
#[derive(Clone, Copy)]
pub(super) struct Cost(pub(super) u64);
parsed!(Cost(u64) from u64, "cost", |c| if c <= MAX_REQUEST_VALUE {
    Ok(c)
} else {
    Err(format!("cost {c} is out of range (0 to {MAX_REQUEST_VALUE})"))
});

/// A key cap: at least 1.
pub(super) struct MaxKeys(pub(super) usize);
parsed!(MaxKeys(usize) from u64, "max_keys", |n| match usize::try_from(n) {
    Ok(n) if n > 0 => Ok(n),
    _ => Err(format!("max_keys {n} is out of range (at least 1)")),
});

/// A cap on a key's bytes: at least 1.
pub(super) struct MaxKeyBytes(pub(super) usize);
parsed!(MaxKeyBytes(usize) from u64, "max_key_bytes", |n| match usize::try_from(n) {
    Ok(n) if n > 0 => Ok(n),
    _ => Err(format!("max_key_bytes {n} is out of range (at least 1)")),
});

/// An IPv6 prefix length, 0 to 128.
#[derive(Clone, Copy)]
pub(super) struct Ipv6Prefix(pub(super) u8);
parsed!(Ipv6Prefix(u8) from u64, "ipv6_prefix", |n| match u8::try_from(n) {
    Ok(n) if n <= 128 => Ok(n),
    _ => Err(format!("IPv6 prefix length {n} is above 128")),
});

/// A non-empty string.
#[derive(Clone)]
pub(super) struct NonEmpty(pub(super) String);
parsed!(NonEmpty(String) from String, "string", |s| if s.is_empty() {
    Err("must not be empty".to_owned())
} else {
    Ok(s)
});

/// A network (CIDR), or one address.
pub(super) struct Cidr(pub(super) IpNet);
parsed!(Cidr(IpNet) from String, "network", |s| s
    .parse::<IpNet>()
    .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
    .map_err(|_| format!("{s:?} is not a network (CIDR such as 10.0.0.0/8) or an IP address")));

/// An HTTP method, as written (methods are case-sensitive).
pub(super) struct MethodSpec(pub(super) Method);
parsed!(MethodSpec(Method) from String, "method", |s| {
    if s.bytes().any(|b| b.is_ascii_lowercase()) {
        Err(format!(
            "method {s:?} has lowercase letters; HTTP methods are case-sensitive: write {:?}",
            s.to_ascii_uppercase()
        ))
    } else {
        Method::from_bytes(s.as_bytes()).map_err(|_| format!("{s:?} is not an HTTP method"))
    }
});

/// A path: starts with `/`.
pub(super) struct PathSpec(pub(super) String);
parsed!(PathSpec(String) from String, "path", |s| if s.starts_with('/') {
    Ok(s)
} else {
    Err(format!("path {s:?} must start with '/'"))
});

/// A fully qualified gRPC service, `package.Service`.
pub(super) struct GrpcService(pub(super) String);
parsed!(GrpcService(String) from String, "gRPC service", |s| if s.is_empty()
    || s.contains('/')
{
    Err(format!(
        "gRPC service {s:?} must be a fully qualified service name such as helloworld.Greeter"
    ))
} else {
    Ok(s)
});

/// A gRPC method, `package.Service/Method`.
pub(super) struct GrpcMethodSpec(pub(super) (String, String));
parsed!(GrpcMethodSpec((String, String)) from String, "gRPC method", |s| match s.split_once('/') {
    Some((svc, m)) if !svc.is_empty() && !m.is_empty() && !m.contains('/') => {
        Ok((svc.to_owned(), m.to_owned()))
    }
    _ => Err(format!(
        "gRPC method {s:?} must be SERVICE/METHOD, such as helloworld.Greeter/SayHello"
    )),
});

/// A Redis URL (several comma-separated for a Cluster).
pub(super) struct RedisUrl(pub(super) String);
parsed!(RedisUrl(String) from String, "URL", |s| {
    let ok = !s.is_empty()
        && s.split(',').all(|u| {
            let u = u.trim();
            ["redis://", "rediss://", "redis+unix://", "unix://"]
                .iter()
                .any(|scheme| u.len() > scheme.len() && u.starts_with(scheme))
        });
    if ok {
        Ok(s)
    } else {
        Err(format!(
            "{s:?} is not a Redis URL (redis://host:port, rediss:// for TLS, several comma-separated for a Cluster)"
        ))
    }
});

/// A file's path: not empty, no NUL. Read by whoever uses it (the Redis backend's builder
/// reads the TLS files), relative to the process's working directory.
pub(super) struct FilePath(pub(super) std::path::PathBuf);
parsed!(FilePath(std::path::PathBuf) from String, "file path", |s| if s.is_empty()
    || s.contains('\0')
{
    Err(format!("{s:?} is not a file path"))
} else {
    Ok(s.into())
});

/// A Redis key prefix: not empty, no braces.
pub(super) struct Prefix(pub(super) String);
parsed!(Prefix(String) from String, "prefix", |s| if s.is_empty() || s.contains(['{', '}']) {
    Err(format!("prefix {s:?} must be non-empty and hold no '{{' or '}}'"))
} else {
    Ok(s)
});

/// A header name (`tier_header`).
pub(super) struct HeaderSpec(pub(super) HeaderName);
parsed!(HeaderSpec(HeaderName) from String, "header name", |s| HeaderName::from_bytes(s.as_bytes())
    .map_err(|_| format!("{s:?} is not a header name")));

/// One source of a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum KeyPart {
    Ip,
    ClientIp,
    Header(HeaderName),
    Route,
    GrpcMethod,
    Global,
}

impl KeyPart {
    fn parse(s: &str) -> Result<Self, String> {
        Ok(match s {
            "ip" => KeyPart::Ip,
            "client-ip" => KeyPart::ClientIp,
            "route" => KeyPart::Route,
            "grpc-method" => KeyPart::GrpcMethod,
            "global" => KeyPart::Global,
            _ => match s.strip_prefix("header:") {
                Some(name) => KeyPart::Header(
                    HeaderName::from_bytes(name.as_bytes())
                        .map_err(|_| format!("{name:?} is not a header name"))?,
                ),
                None => {
                    return Err(format!(
                        "unknown key source {s:?} (expected ip, client-ip, header:NAME, route, grpc-method or global)"
                    ))
                }
            },
        })
    }
}

/// `key`: one source, or a list of two or three (joined with `|`).
pub(super) struct KeySpec(pub(super) Vec<KeyPart>);

impl<'de> Deserialize<'de> for KeySpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = KeySpec;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key source (ip, client-ip, header:NAME, route, grpc-method, global) or a list of two or three")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<KeySpec, E> {
                KeyPart::parse(s)
                    .map(|p| KeySpec(vec![p]))
                    .map_err(E::custom)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<KeySpec, A::Error> {
                let mut parts = Vec::new();
                while let Some(s) = seq.next_element::<String>()? {
                    let part = KeyPart::parse(&s).map_err(de::Error::custom)?;
                    if parts.contains(&part) {
                        return Err(de::Error::custom(format!(
                            "key source {s:?} is given twice"
                        )));
                    }
                    parts.push(part);
                }
                if !(1..=3).contains(&parts.len()) {
                    return Err(de::Error::custom("a combined key has one to three sources"));
                }
                Ok(KeySpec(parts))
            }
        }
        d.deserialize_any(V)
    }
}

/// `[tiers]`: tier names to policy lists, in file order.
#[derive(Default)]
pub(super) struct Tiers(pub(super) Vec<(String, Spanned<Vec<Spanned<PolicySpec>>>)>);

impl<'de> Deserialize<'de> for Tiers {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Tiers;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a table of tier names to lists of policies")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Tiers, A::Error> {
                let mut tiers = Vec::new();
                while let Some(name) = map.next_key::<String>()? {
                    let policies = map.next_value()?;
                    tiers.push((name, policies));
                }
                Ok(Tiers(tiers))
            }
        }
        d.deserialize_map(V)
    }
}

/// A policy: a policy string, or a table `{ algorithm, limit, period, burst, name }`.
pub(super) struct PolicySpec(pub(super) Policy);

impl<'de> Deserialize<'de> for PolicySpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = PolicySpec;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a policy string (ALGORITHM:limit=L,period=DUR[,burst=B][,name=NAME]) or a table {algorithm, limit, period, burst, name}")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<PolicySpec, E> {
                s.parse::<Policy>()
                    .map(PolicySpec)
                    .map_err(|e| E::custom(policy_message(&e)))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<PolicySpec, A::Error> {
                let t = PolicyTable::deserialize(de::value::MapAccessDeserializer::new(map))?;
                let mut p =
                    Policy::from_parts(t.algorithm.0, t.limit.0, t.period.0, t.burst.map(|b| b.0))
                        .map_err(|e| de::Error::custom(policy_message(&e)))?;
                if let Some(n) = t.name {
                    p = p
                        .with_name(&n.0)
                        .map_err(|e| de::Error::custom(policy_message(&e)))?;
                }
                Ok(PolicySpec(p))
            }
        }
        d.deserialize_any(V)
    }
}

/// An invalid policy's message. A policy string's syntax errors quote the string already.
fn policy_message(e: &InvalidPolicy) -> String {
    e.to_string()
}

/// The table form of a policy; each field checked where it is read.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyTable {
    algorithm: AlgorithmSpec,
    limit: Limit,
    period: Period,
    burst: Option<Burst>,
    name: Option<PolicyName>,
}

struct AlgorithmSpec(Algorithm);
parsed!(AlgorithmSpec(Algorithm) from String, "algorithm", |s| s
    .parse::<Algorithm>()
    .map_err(|e| e.to_string()));

struct Limit(u64);
parsed!(Limit(u64) from u64, "limit", |n| if (1..=MAX_LIMIT).contains(&n) {
    Ok(n)
} else {
    Err(InvalidPolicy::Limit(n).to_string())
});

struct Burst(u64);
parsed!(Burst(u64) from u64, "burst", |n| if (1..=MAX_LIMIT).contains(&n) {
    Ok(n)
} else {
    Err(InvalidPolicy::Burst(n).to_string())
});

/// A period in whole milliseconds, 1 ms to 365 days.
struct Period(u64);
parsed!(Period(u64) from String, "period", |s| match parse_duration(&s) {
    Err(e) => Err(e.to_string()),
    Ok(d) => match u64::try_from(d.as_millis()) {
        Ok(ms) if (1..=MAX_PERIOD_MS).contains(&ms) => Ok(ms),
        _ => Err(InvalidPolicy::Period(d.as_millis()).to_string()),
    },
});

struct PolicyName(String);
parsed!(PolicyName(String) from String, "name", |s| {
    // Policy names are checked by the policy itself.
    match Policy::new(Algorithm::TokenBucket, 1, Duration::from_secs(1)) {
        Ok(p) => p.with_name(&s).map(|_| s).map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    }
});
