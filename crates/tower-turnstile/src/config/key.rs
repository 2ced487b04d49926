//! [`ConfigKey`]: the key extractor a configuration file describes.

use std::fmt;
use std::sync::Arc;

use http::{HeaderName, Request};

use crate::key::{
    join, ClientIp, GlobalKey, GrpcMethod, HeaderKey, Key, KeyError, KeyExtractor, PeerIp,
};

/// The key extractor of a configuration file's `key`: one source, or two or three joined with
/// `|` exactly as the tuples of [`key`](crate::key) extractors join them.
///
/// | `key` | extractor | stored key |
/// | --- | --- | --- |
/// | `ip` (default) | [`PeerIp`] | the peer's IP: `192.0.2.1`, IPv6 by network `2001:db8:1:2::/64` |
/// | `client-ip` | [`ClientIp`] with `trusted_proxies` | the client's IP behind the trusted proxies, same form |
/// | `header:NAME` | [`HeaderKey`] | the header's value, `%` and bytes outside printable ASCII percent-encoded |
/// | `route` | [`Route`] (feature `axum`) | the matched route, `/users/{id}` |
/// | `grpc-method` | [`GrpcMethod`] | `package.Service/Method` |
/// | `global` | [`GlobalKey`] | `global` |
/// | `["header:x-api-key", "ip"]` | the tuple of those | the parts joined with `|`: `k1|192.0.2.1` |
///
#[cfg_attr(feature = "axum", doc = "[`Route`]: crate::key::Route")]
// Without the `axum` feature there is no `Route` to link to: link to the full docs.
#[cfg_attr(
    not(feature = "axum"),
    doc = "[`Route`]: https://docs.rs/tower-turnstile/latest/turnstile/key/struct.Route.html"
)]
#[derive(Clone)]
pub struct ConfigKey {
    parts: Arc<[Part]>,
}

#[derive(Clone, Debug)]
pub(super) enum Part {
    Peer(PeerIp),
    Client(ClientIp),
    Header(HeaderKey, HeaderName),
    /// axum's matched route. Without the `axum` feature nothing can set one, so every
    /// request lacks it (and [`MissingKey`](crate::MissingKey) decides); the file itself is
    /// valid, as it is for a service built with axum.
    Route,
    Grpc,
    Global,
}

impl Part {
    fn extract_key<B>(&self, req: &Request<B>) -> Result<Key, KeyError> {
        match self {
            Part::Peer(k) => k.extract_key(req),
            Part::Client(k) => k.extract_key(req),
            Part::Header(k, _) => k.extract_key(req),
            #[cfg(feature = "axum")]
            Part::Route => crate::key::Route.extract_key(req),
            #[cfg(not(feature = "axum"))]
            Part::Route => Err(KeyError::MissingMatchedPath),
            Part::Grpc => GrpcMethod.extract_key(req),
            Part::Global => GlobalKey.extract_key(req),
        }
    }

    /// The source as the file writes it.
    pub(super) fn spec(&self) -> String {
        match self {
            Part::Peer(_) => "ip".to_owned(),
            Part::Client(_) => "client-ip".to_owned(),
            Part::Header(_, n) => format!("header:{n}"),
            Part::Route => "route".to_owned(),
            Part::Grpc => "grpc-method".to_owned(),
            Part::Global => "global".to_owned(),
        }
    }

    /// What the stored key is, for people.
    pub(super) fn meaning(&self) -> String {
        match self {
            Part::Peer(_) => {
                "the peer's IP (192.0.2.1; IPv6 by network, 2001:db8:1:2::/64)".to_owned()
            }
            Part::Client(_) => {
                "the client's IP behind the trusted proxies (192.0.2.1; IPv6 by network, 2001:db8:1:2::/64)"
                    .to_owned()
            }
            Part::Header(_, n) => format!(
                "the value of the {n} header (% and bytes outside printable ASCII percent-encoded)"
            ),
            Part::Route => "the matched route (/users/{id})".to_owned(),
            Part::Grpc => "the gRPC method (helloworld.Greeter/SayHello)".to_owned(),
            Part::Global => "global (one key for every request)".to_owned(),
        }
    }
}

impl ConfigKey {
    pub(super) fn new(parts: Vec<Part>) -> Self {
        ConfigKey {
            parts: parts.into(),
        }
    }

    pub(super) fn parts(&self) -> &[Part] {
        &self.parts
    }

    /// The key as the file writes it: `ip`, `header:x-api-key`, or a list such as
    /// `["grpc-method", "ip"]`.
    pub fn spec(&self) -> String {
        match &*self.parts {
            [one] => one.spec(),
            parts => {
                let quoted: Vec<String> = parts.iter().map(|p| format!("{:?}", p.spec())).collect();
                format!("[{}]", quoted.join(", "))
            }
        }
    }
}

impl Default for ConfigKey {
    /// `ip`: the peer's IP.
    fn default() -> Self {
        ConfigKey::new(vec![Part::Peer(PeerIp::new())])
    }
}

impl fmt::Debug for ConfigKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ConfigKey").field(&self.spec()).finish()
    }
}

impl KeyExtractor for ConfigKey {
    fn extract<B>(&self, req: &Request<B>) -> Result<String, KeyError> {
        self.extract_key(req).map(String::from)
    }

    fn extract_key<B>(&self, req: &Request<B>) -> Result<Key, KeyError> {
        match &*self.parts {
            [one] => one.extract_key(req),
            [a, b] => Ok(join(&[&a.extract_key(req)?, &b.extract_key(req)?])),
            parts => {
                let mut values = Vec::with_capacity(parts.len());
                for p in parts {
                    values.push(p.extract_key(req)?);
                }
                let refs: Vec<&str> = values.iter().map(Key::as_str).collect();
                Ok(join(&refs))
            }
        }
    }
}
