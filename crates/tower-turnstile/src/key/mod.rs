//! Key extractors: which client a request counts against.
//!
//! A key is a string; two requests share quota exactly when their keys (and policy names)
//! match. The extractors here produce canonical strings, so the same client always gets the
//! same key:
//!
//! | extractor | key |
//! | --- | --- |
//! | [`PeerIp`] | the TCP peer's IP: `192.0.2.1`, or an IPv6 /64 network `2001:db8:1:2::/64` |
//! | [`ClientIp`] | the client's IP behind trusted proxies (`Forwarded`, `X-Forwarded-For`, `X-Real-IP`), same form |
//! | [`HeaderKey`] | a header's value, e.g. an API key |
//! | [`Route`] | axum's matched route pattern, e.g. `/users/{id}`; `<unmatched>` when no route matched (feature `axum`) |
//! | [`GrpcMethod`] | the gRPC `service/method`, e.g. `helloworld.Greeter/SayHello` |
//! | [`GlobalKey`] | one key for every request: `global` |
//! | [`KeyFn`] | whatever your closure returns ([`key_fn`]) |
//! | `(A, B)`, `(A, B, C)` | the parts joined by `|` (a `|` or `%` inside a part is percent-encoded) |
//!
//! The layer takes each key as a [`Key`] ([`KeyExtractor::extract_key`]): every extractor
//! here builds keys of up to 46 bytes inline, so extracting one allocates nothing.
//!
// Without the `axum` feature there is no `Route` here to link to: link to the full docs.
#![cfg_attr(
    not(feature = "axum"),
    doc = "[`Route`]: https://docs.rs/tower-turnstile/latest/turnstile/key/struct.Route.html"
)]

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use http::{Extensions, HeaderMap, HeaderName, Method, Request, Uri, Version};

mod buf;
mod ip;

pub use buf::Key;
pub(crate) use ip::peer_addr;
pub use ip::{ClientIp, ForwardedHeader, InvalidPrefix, PeerIp};

/// IP networks in CIDR notation (`10.0.0.0/8`, `2001:db8::/32`), as [`ClientIp::trust`]
/// takes them: the `ipnet` crate's types, re-exported so no direct dependency is needed.
pub use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// Derives the client key a request is limited by.
///
/// Implementations must be cheap to clone (they are shared by every clone of the service)
/// and must not panic.
pub trait KeyExtractor: Clone + Send + Sync + 'static {
    /// The key for `req`.
    ///
    /// # Errors
    /// [`KeyError`] when the request carries nothing to key it by; the layer then applies its
    /// [`MissingKey`] outcome (by default an error response explaining what is missing).
    fn extract<B>(&self, req: &Request<B>) -> Result<String, KeyError>;

    /// The key for `req` as a [`Key`]: what the layer calls, once per request. The default
    /// wraps [`extract`](KeyExtractor::extract)'s `String` (no copy); the extractors of this
    /// module override it to build keys of up to 46 bytes inline, so extracting one
    /// allocates nothing. Override it too when a key can be built without a `String`; it
    /// must give the same key as `extract`.
    ///
    /// # Errors
    /// As [`extract`](KeyExtractor::extract).
    fn extract_key<B>(&self, req: &Request<B>) -> Result<Key, KeyError> {
        self.extract(req).map(Key::from)
    }
}

/// What the layer does with a request whose key cannot be extracted. A key too long for the
/// backend ([`KeyError::TooLong`]) is always refused, whatever this says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum MissingKey {
    /// Answer with an error response saying what is missing (the default): `500` with a fix
    /// for a server misconfiguration (no peer address, no matched route), `400` for a request
    /// that lacks what it is keyed by (a header); for gRPC, `INTERNAL` or
    /// `INVALID_ARGUMENT`. The inner service is not called.
    #[default]
    Reject,
    /// Admit the request without checking it (and without rate-limit headers).
    Allow,
    /// Count every such request under this one shared key.
    Key(Arc<str>),
}

impl MissingKey {
    /// Count every request without a key under the shared key `key`.
    pub fn key(key: impl Into<Arc<str>>) -> Self {
        MissingKey::Key(key.into())
    }
}

/// Why no key could be extracted from a request.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyError {
    /// The request has no peer address: the server was not set up to record it.
    MissingPeerAddr,
    /// The request lacks the header it is keyed by (or the header is empty).
    MissingHeader(HeaderName),
    /// The request has no axum `MatchedPath` and never went through an axum `Router`: the
    /// layer runs around the router, not inside it. (A request the router matched to no
    /// route is keyed `<unmatched>` instead: see `Route`, feature `axum`.)
    MissingMatchedPath,
    /// The request's path is not a gRPC `/service/method` path.
    NotGrpc,
    /// A custom key function returned no key.
    Rejected,
    /// The key is longer than the backend takes
    /// ([`Backend::max_key_bytes`](turnstile_core::Backend::max_key_bytes), 512 bytes by
    /// default): answered `400` / `INVALID_ARGUMENT` whatever [`MissingKey`] says, and never
    /// sent to the backend, so a client cannot make the limiter hold (or hash) keys of any
    /// size.
    TooLong {
        /// The key's length in bytes.
        len: usize,
        /// The longest key the backend takes, in bytes.
        max: usize,
    },
}

impl KeyError {
    /// A short, stable name of the error's kind, for logs and metric labels: one of
    /// `missing_peer_addr`, `missing_header`, `missing_matched_path`, `not_grpc`, `rejected`,
    /// `too_long`.
    pub fn kind(&self) -> &'static str {
        match self {
            KeyError::MissingPeerAddr => "missing_peer_addr",
            KeyError::MissingHeader(_) => "missing_header",
            KeyError::MissingMatchedPath => "missing_matched_path",
            KeyError::NotGrpc => "not_grpc",
            KeyError::Rejected => "rejected",
            KeyError::TooLong { .. } => "too_long",
        }
    }

    /// Whether the error is the server's misconfiguration (answered `500`, logged once) rather
    /// than something the request lacks (answered `400`).
    pub fn is_misconfiguration(&self) -> bool {
        matches!(
            self,
            KeyError::MissingPeerAddr | KeyError::MissingMatchedPath
        )
    }

    /// The explanation sent as the body of the error response and logged.
    pub fn message(&self) -> Cow<'static, str> {
        match self {
            KeyError::MissingPeerAddr => Cow::Borrowed(
                "turnstile: this request has no peer address to rate-limit by. With axum, serve the router with `into_make_service_with_connect_info::<SocketAddr>()`, e.g. `axum::serve(listener, app.into_make_service_with_connect_info::<std::net::SocketAddr>())`; tonic's `Server` records it by itself.\n",
            ),
            KeyError::MissingHeader(h) => Cow::Owned(format!(
                "turnstile: this request has no `{h}` header to rate-limit by.\n"
            )),
            KeyError::MissingMatchedPath => Cow::Borrowed(
                "turnstile: this request did not go through an axum Router, so it has no route to rate-limit by. Add the layer inside the router with `Router::layer` or `Router::route_layer`, which run after routing, not around the router.\n",
            ),
            KeyError::NotGrpc => Cow::Borrowed(
                "turnstile: this request is not a gRPC call (`/package.Service/Method`) and cannot be rate-limited by gRPC method.\n",
            ),
            KeyError::Rejected => {
                Cow::Borrowed("turnstile: no rate-limit key could be derived from this request.\n")
            }
            KeyError::TooLong { len, max } => Cow::Owned(format!(
                "turnstile: this request's rate-limit key is {len} bytes, longer than the {max} bytes the limiter takes.\n"
            )),
        }
    }
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message().trim_end())
    }
}

impl std::error::Error for KeyError {}

/// How client keys appear in logs and spans: keys can be personal data (addresses, API
/// keys), so by default they are hashed.
///
/// The hash ([`KeyLogging::hash`]) is stable — the same on every build, platform and node —
/// so one client's requests can be followed across logs, and an operator who knows a key can
/// compute its hash to find it. It is pseudonymous, not anonymous: a key from a small space
/// (an IPv4 address) can be recovered by hashing every candidate. Where logs must hold no
/// trace of keys, use [`KeyLogging::Hidden`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyLogging {
    /// A 64-bit stable hash of the key, as 16 hex digits (the default).
    #[default]
    Hashed,
    /// The key itself (for debugging; mind what your logs may hold).
    Plain,
    /// Nothing: the field reads `hidden`.
    Hidden,
}

impl KeyLogging {
    /// The stable hash of `key` shown with [`KeyLogging::Hashed`]: FNV-1a (64 bits) of its
    /// bytes ([`key_hash`](turnstile_core::wrap::key_hash), as the backend wrappers' own
    /// warnings show keys).
    ///
    /// # Examples
    /// ```
    /// use tower_turnstile::key::KeyLogging;
    /// assert_eq!(format!("{:016x}", KeyLogging::hash("192.0.2.1")), KeyLogging::Hashed.display("192.0.2.1").to_string());
    /// ```
    pub fn hash(key: &str) -> u64 {
        turnstile_core::wrap::key_hash(key)
    }

    /// `key` as this setting shows it: hashed, plain or hidden. Formats without allocating.
    pub fn display(self, key: &str) -> LoggedKey<'_> {
        LoggedKey { key, mode: self }
    }
}

/// A key as [`KeyLogging`] shows it ([`KeyLogging::display`]).
#[derive(Clone, Copy, Debug)]
pub struct LoggedKey<'a> {
    key: &'a str,
    mode: KeyLogging,
}

impl fmt::Display for LoggedKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.mode {
            KeyLogging::Hashed => write!(f, "{:016x}", KeyLogging::hash(self.key)),
            KeyLogging::Plain => f.write_str(self.key),
            KeyLogging::Hidden => f.write_str("hidden"),
        }
    }
}

/// A borrowed view of a request's head, handed to closures ([`key_fn`], cost functions).
#[derive(Clone, Copy, Debug)]
pub struct RequestRef<'a> {
    method: &'a Method,
    uri: &'a Uri,
    version: Version,
    headers: &'a HeaderMap,
    extensions: &'a Extensions,
}

impl<'a> RequestRef<'a> {
    /// A view of `req`'s head.
    pub fn new<B>(req: &'a Request<B>) -> Self {
        RequestRef {
            method: req.method(),
            uri: req.uri(),
            version: req.version(),
            headers: req.headers(),
            extensions: req.extensions(),
        }
    }

    /// The request method.
    pub fn method(&self) -> &'a Method {
        self.method
    }

    /// The request URI.
    pub fn uri(&self) -> &'a Uri {
        self.uri
    }

    /// The URI's path.
    pub fn path(&self) -> &'a str {
        self.uri.path()
    }

    /// The HTTP version.
    pub fn version(&self) -> Version {
        self.version
    }

    /// The request headers.
    pub fn headers(&self) -> &'a HeaderMap {
        self.headers
    }

    /// The request extensions (peer address, matched route, ...).
    pub fn extensions(&self) -> &'a Extensions {
        self.extensions
    }

    /// Whether the request is a gRPC call: its `content-type` starts with `application/grpc`.
    pub fn is_grpc(&self) -> bool {
        is_grpc(self.headers)
    }

    /// The peer's socket address, as axum (`ConnectInfo<SocketAddr>`), tonic
    /// (`TcpConnectInfo`, feature `tonic`) or a bare `SocketAddr` extension records it.
    pub fn peer_addr(&self) -> Option<std::net::SocketAddr> {
        peer_addr(self.extensions)
    }
}

/// Whether `headers` say the request is gRPC (`content-type: application/grpc*`).
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// Keys each request by the value of one header, such as `x-api-key`. The first value is
/// used; a request without the header (or with an empty value) gets
/// [`KeyError::MissingHeader`]. Bytes outside visible ASCII are percent-encoded.
#[derive(Clone, Debug)]
pub struct HeaderKey {
    name: HeaderName,
}

impl HeaderKey {
    /// Keys by the header `name`.
    pub fn new(name: HeaderName) -> Self {
        HeaderKey { name }
    }

    /// Keys by the header `name`, given as a static string such as `"x-api-key"`.
    ///
    /// # Errors
    /// [`InvalidHeaderName`](https://docs.rs/http/1/http/header/struct.InvalidHeaderName.html) when `name` is not a valid header name.
    pub fn named(name: &str) -> Result<Self, http::header::InvalidHeaderName> {
        Ok(HeaderKey {
            name: HeaderName::from_bytes(name.as_bytes())?,
        })
    }
}

impl KeyExtractor for HeaderKey {
    fn extract<B>(&self, req: &Request<B>) -> Result<String, KeyError> {
        self.extract_key(req).map(String::from)
    }

    fn extract_key<B>(&self, req: &Request<B>) -> Result<Key, KeyError> {
        match req.headers().get(&self.name) {
            Some(v) if !v.is_empty() => {
                let mut key = Key::new();
                escape_into(&mut key, v.as_bytes(), b"%");
                Ok(key)
            }
            _ => Err(KeyError::MissingHeader(self.name.clone())),
        }
    }
}

/// Keys each request by axum's matched route pattern (`MatchedPath`), e.g. `/users/{id}`,
/// so every route has its own quota shared by all clients. Combine it with an IP key,
/// `(Route, PeerIp::new())`, for a per-route, per-client quota.
///
/// A request that reached the router but matched no route (the router's fallback: a `404`)
/// is keyed [`Route::UNMATCHED`], `<unmatched>`: all such requests share one quota, so a
/// flood of 404s is limited like any route, and [`MissingKey`] does not apply to them. Only
/// a request that never went through an axum `Router` (the layer added outside it) has no
/// route: [`KeyError::MissingMatchedPath`].
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
#[derive(Clone, Copy, Debug, Default)]
pub struct Route;

#[cfg(feature = "axum")]
impl Route {
    /// The key of a request the router matched to no route: `<unmatched>` (no route pattern
    /// starts with `<`).
    pub const UNMATCHED: &'static str = "<unmatched>";
}

#[cfg(feature = "axum")]
impl KeyExtractor for Route {
    fn extract<B>(&self, req: &Request<B>) -> Result<String, KeyError> {
        self.extract_key(req).map(String::from)
    }

    fn extract_key<B>(&self, req: &Request<B>) -> Result<Key, KeyError> {
        let ext = req.extensions();
        match ext.get::<axum::extract::MatchedPath>() {
            Some(p) => Ok(Key::from(p.as_str())),
            // Every axum Router records the URI it was called with before routing: with it
            // and no matched path, the router found no route (its fallback runs).
            None if ext.get::<axum::extract::OriginalUri>().is_some() => {
                Ok(Key::from(Route::UNMATCHED))
            }
            None => Err(KeyError::MissingMatchedPath),
        }
    }
}

/// Keys each request by its gRPC service and method, `package.Service/Method`, taken from
/// the path `/package.Service/Method`.
#[derive(Clone, Copy, Debug, Default)]
pub struct GrpcMethod;

impl KeyExtractor for GrpcMethod {
    fn extract<B>(&self, req: &Request<B>) -> Result<String, KeyError> {
        self.extract_key(req).map(String::from)
    }

    fn extract_key<B>(&self, req: &Request<B>) -> Result<Key, KeyError> {
        let (service, method) = grpc_path(req.uri().path()).ok_or(KeyError::NotGrpc)?;
        let mut key = Key::new();
        key.push_str(service);
        key.push_str("/");
        key.push_str(method);
        Ok(key)
    }
}

/// Splits a gRPC path `/package.Service/Method` into service and method.
pub(crate) fn grpc_path(path: &str) -> Option<(&str, &str)> {
    let (service, method) = path.strip_prefix('/')?.split_once('/')?;
    (!service.is_empty() && !method.is_empty() && !method.contains('/'))
        .then_some((service, method))
}

/// One key, `global`, for every request: the policies limit the whole service.
#[derive(Clone, Copy, Debug, Default)]
pub struct GlobalKey;

impl KeyExtractor for GlobalKey {
    fn extract<B>(&self, _req: &Request<B>) -> Result<String, KeyError> {
        Ok(String::from("global"))
    }

    fn extract_key<B>(&self, _req: &Request<B>) -> Result<Key, KeyError> {
        Ok(Key::from("global"))
    }
}

/// Keys each request by a closure over its head; see [`key_fn`].
#[derive(Clone)]
pub struct KeyFn<F> {
    f: F,
}

impl<F> fmt::Debug for KeyFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyFn").finish_non_exhaustive()
    }
}

/// Keys each request by `f`'s answer; `None` means no key ([`KeyError::Rejected`]).
///
/// # Examples
/// ```
/// use tower_turnstile::key::{key_fn, RequestRef};
///
/// // The tenant named in the path, /t/{tenant}/...
/// let by_tenant = key_fn(|req: &RequestRef<'_>| {
///     req.path().strip_prefix("/t/")?.split('/').next().map(str::to_owned)
/// });
/// # let _ = by_tenant;
/// ```
pub fn key_fn<F>(f: F) -> KeyFn<F>
where
    F: Fn(&RequestRef<'_>) -> Option<String> + Clone + Send + Sync + 'static,
{
    KeyFn { f }
}

impl<F> KeyExtractor for KeyFn<F>
where
    F: Fn(&RequestRef<'_>) -> Option<String> + Clone + Send + Sync + 'static,
{
    fn extract<B>(&self, req: &Request<B>) -> Result<String, KeyError> {
        (self.f)(&RequestRef::new(req)).ok_or(KeyError::Rejected)
    }
}

impl<A: KeyExtractor, B: KeyExtractor> KeyExtractor for (A, B) {
    fn extract<R>(&self, req: &Request<R>) -> Result<String, KeyError> {
        self.extract_key(req).map(String::from)
    }

    fn extract_key<R>(&self, req: &Request<R>) -> Result<Key, KeyError> {
        let a = self.0.extract_key(req)?;
        let b = self.1.extract_key(req)?;
        Ok(join(&[&a, &b]))
    }
}

impl<A: KeyExtractor, B: KeyExtractor, C: KeyExtractor> KeyExtractor for (A, B, C) {
    fn extract<R>(&self, req: &Request<R>) -> Result<String, KeyError> {
        self.extract_key(req).map(String::from)
    }

    fn extract_key<R>(&self, req: &Request<R>) -> Result<Key, KeyError> {
        let a = self.0.extract_key(req)?;
        let b = self.1.extract_key(req)?;
        let c = self.2.extract_key(req)?;
        Ok(join(&[&a, &b, &c]))
    }
}

/// Joins key parts with `|`, percent-encoding `%` and `|` inside parts so the result is
/// unambiguous.
pub(crate) fn join(parts: &[&str]) -> Key {
    let mut out = Key::new();
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            out.push_str("|");
        }
        if p.contains(['%', '|']) {
            escape_into(&mut out, p.as_bytes(), b"%|");
        } else {
            out.push_str(p);
        }
    }
    out
}

/// Appends `bytes` to `out`: visible ASCII and space as they are; every other byte, and
/// those in `extra`, percent-encoded (`%XX`, upper-case hex).
fn escape_into(out: &mut Key, bytes: &[u8], extra: &[u8]) {
    let keep = |b: u8| (0x20..0x7f).contains(&b) && !extra.contains(&b);
    let mut rest = bytes;
    while !rest.is_empty() {
        let run = rest.iter().position(|&b| !keep(b)).unwrap_or(rest.len());
        let (plain, tail) = rest.split_at(run);
        // Visible ASCII and space: text.
        out.push_str(std::str::from_utf8(plain).unwrap_or_default());
        if let Some((&b, tail)) = tail.split_first() {
            const HEX: &[u8; 16] = b"0123456789ABCDEF";
            let code = [b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]];
            out.push_str(std::str::from_utf8(&code).unwrap_or_default());
            rest = tail;
        } else {
            rest = tail;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_paths() {
        assert_eq!(
            grpc_path("/helloworld.Greeter/SayHello"),
            Some(("helloworld.Greeter", "SayHello"))
        );
        for bad in ["/", "//x", "/a/", "/a/b/c", "a/b", ""] {
            assert_eq!(grpc_path(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn combined_keys_are_unambiguous() {
        assert_eq!(join(&["a|b", "c"]), "a%7Cb|c");
        assert_eq!(join(&["a", "b|c"]), "a|b%7Cc");
        assert_eq!(join(&["50%", "x"]), "50%25|x");
        let mut req = Request::new(());
        req.headers_mut()
            .insert("x-api-key", http::HeaderValue::from_static("k1"));
        req.extensions_mut()
            .insert("192.0.2.1:1".parse::<std::net::SocketAddr>().unwrap());
        let k = (HeaderKey::named("x-api-key").unwrap(), PeerIp::new());
        assert_eq!(k.extract(&req).unwrap(), "k1|192.0.2.1");
        assert_eq!(
            (GlobalKey, GrpcMethod).extract(&req),
            Err(KeyError::NotGrpc)
        );
    }

    #[test]
    fn header_key_needs_a_non_empty_value() {
        let k = HeaderKey::named("x-api-key").unwrap();
        let mut req = Request::new(());
        assert!(matches!(k.extract(&req), Err(KeyError::MissingHeader(_))));
        req.headers_mut()
            .insert("x-api-key", http::HeaderValue::from_static(""));
        assert!(matches!(k.extract(&req), Err(KeyError::MissingHeader(_))));
        req.headers_mut().insert(
            "x-api-key",
            http::HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap(),
        );
        assert_eq!(k.extract(&req).unwrap(), "caf%C3%A9");
    }
}
