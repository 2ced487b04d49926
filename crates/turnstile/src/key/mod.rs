//! Key extractors: which client a request counts against.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use http::Request;

/// Derives the client key a request is limited by.
///
/// Implementations must be cheap to clone (they are shared by every clone of the service).
pub trait KeyExtractor: Clone + Send + Sync + 'static {
    /// The key for `req`.
    ///
    /// # Errors
    /// [`KeyError`] when the request carries nothing to key it by; the layer then answers
    /// with an error response explaining the misconfiguration.
    fn extract<B>(&self, req: &Request<B>) -> Result<String, KeyError>;
}

/// Why no key could be extracted from a request.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyError {
    /// The request has no peer address: the server was not set up to record it.
    MissingPeerAddr,
}

impl KeyError {
    /// The explanation sent as the body of the `500 Internal Server Error` response and logged.
    pub fn message(&self) -> &'static str {
        match self {
            KeyError::MissingPeerAddr => {
                "turnstile: this request has no peer address to rate-limit by. With axum, serve the router with `into_make_service_with_connect_info::<SocketAddr>()`, e.g. `axum::serve(listener, app.into_make_service_with_connect_info::<std::net::SocketAddr>())`.\n"
            }
        }
    }
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message().trim_end())
    }
}

impl std::error::Error for KeyError {}

/// Keys each request by the IP address of the TCP peer, as axum records it in
/// `ConnectInfo<SocketAddr>` (serve with `into_make_service_with_connect_info`). An
/// IPv4-mapped IPv6 address (`::ffff:192.0.2.1`) counts as the IPv4 address it maps.
///
/// A bare [`SocketAddr`] in the request extensions is used as well, for servers other than
/// axum that record the peer that way.
#[derive(Clone, Copy, Debug, Default)]
pub struct PeerIp;

impl KeyExtractor for PeerIp {
    fn extract<B>(&self, req: &Request<B>) -> Result<String, KeyError> {
        peer_addr(req)
            .map(|a| canonical_ip(a.ip()).to_string())
            .ok_or(KeyError::MissingPeerAddr)
    }
}

/// The peer address recorded in the request's extensions, if any.
pub(crate) fn peer_addr<B>(req: &Request<B>) -> Option<SocketAddr> {
    #[cfg(feature = "axum")]
    if let Some(axum::extract::ConnectInfo(addr)) = req
        .extensions()
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        return Some(*addr);
    }
    req.extensions().get::<SocketAddr>().copied()
}

/// IPv4-mapped IPv6 addresses as IPv4; everything else unchanged.
pub(crate) fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapped_ipv6_counts_as_ipv4() {
        let mut req = Request::new(());
        req.extensions_mut()
            .insert("[::ffff:192.0.2.1]:443".parse::<SocketAddr>().unwrap());
        assert_eq!(PeerIp.extract(&req).unwrap(), "192.0.2.1");
        assert_eq!(
            PeerIp.extract(&Request::new(())),
            Err(KeyError::MissingPeerAddr)
        );
    }
}
