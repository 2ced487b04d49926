//! IP keys: the TCP peer, or the client behind trusted proxies.

use std::fmt;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use arrayvec::ArrayString;
use http::{Extensions, HeaderMap, Request};
use ipnet::IpNet;

use super::buf::INLINE;
use super::{Key, KeyError, KeyExtractor};

use turnstile_core::ip::DEFAULT_IPV6_PREFIX;

/// An IPv6 prefix length above 128.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InvalidPrefix(pub u8);

impl fmt::Display for InvalidPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IPv6 prefix length {} is above 128", self.0)
    }
}

impl std::error::Error for InvalidPrefix {}

/// Keys each request by the IP address of the TCP peer.
///
/// The peer is read from axum's `ConnectInfo<SocketAddr>` (serve with
/// `into_make_service_with_connect_info`), tonic's `TcpConnectInfo` (feature `tonic`;
/// tonic's `Server` records it), or a bare [`SocketAddr`] extension. An IPv4-mapped IPv6
/// address (`::ffff:192.0.2.1`) counts as the IPv4 address it maps. IPv6 clients are grouped
/// by network, /64 by default ([`PeerIp::ipv6_prefix`]): the key of `2001:db8:1:2::7` is
/// `2001:db8:1:2::/64`. IPv4 keys are the plain address, `192.0.2.1`.
///
/// Behind a reverse proxy every request has the proxy's address; use [`ClientIp`] there.
#[derive(Clone, Copy, Debug)]
pub struct PeerIp {
    ipv6_prefix: u8,
}

impl Default for PeerIp {
    fn default() -> Self {
        PeerIp {
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }
}

impl PeerIp {
    /// Keys by peer IP, IPv6 grouped by /64.
    pub fn new() -> Self {
        Self::default()
    }

    /// Groups IPv6 peers by `len`-bit networks instead (128: one key per address).
    ///
    /// # Errors
    /// [`InvalidPrefix`] when `len` is above 128.
    pub fn ipv6_prefix(self, len: u8) -> Result<Self, InvalidPrefix> {
        check_prefix(len)?;
        Ok(PeerIp { ipv6_prefix: len })
    }
}

impl KeyExtractor for PeerIp {
    fn extract<B>(&self, req: &Request<B>) -> Result<String, KeyError> {
        self.extract_key(req).map(String::from)
    }

    fn extract_key<B>(&self, req: &Request<B>) -> Result<Key, KeyError> {
        peer_addr(req.extensions())
            .map(|a| ip_key_inline(a.ip(), self.ipv6_prefix))
            .ok_or(KeyError::MissingPeerAddr)
    }
}

/// Which header a trusted proxy reports the client's address in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ForwardedHeader {
    /// `Forwarded` (RFC 7239): the `for=` parameter of each element.
    Forwarded,
    /// `X-Forwarded-For`: a comma-separated list of addresses.
    XForwardedFor,
    /// `X-Real-IP`: one address.
    XRealIp,
}

impl ForwardedHeader {
    /// The header's name.
    pub fn name(self) -> http::HeaderName {
        match self {
            ForwardedHeader::Forwarded => http::header::FORWARDED,
            ForwardedHeader::XForwardedFor => http::HeaderName::from_static("x-forwarded-for"),
            ForwardedHeader::XRealIp => http::HeaderName::from_static("x-real-ip"),
        }
    }
}

/// Keys each request by the client's IP address, read from a forwarding header — but only
/// when the TCP peer is a trusted proxy.
///
/// - The peer must lie in one of the configured proxy networks ([`ClientIp::trust`]);
///   otherwise every forwarding header is ignored (a client cannot spoof its address) and
///   the key is the peer's address, as with [`PeerIp`].
/// - One header is read: the one set with [`ClientIp::header`], or by default the first
///   present of `Forwarded` (RFC 7239), `X-Forwarded-For` and `X-Real-IP`. Configure the
///   header your proxy writes: with the default, a client could send a header your proxy
///   passes through unchanged and that takes precedence over the one it appends.
/// - Repeated header lines are joined in order. The address chain is walked from the right
///   (the hop nearest to us) past trusted proxies; the first untrusted address is the client.
///   If every hop is trusted, the leftmost address is.
/// - An `unknown`, obfuscated (`_hidden`) or malformed entry stops the walk: the key is the
///   nearest address that can be trusted — the proxy that wrote the entry. Entries are read
///   one by one on the header's bytes: a byte that is not text (not UTF-8) makes only the
///   entry it is in malformed, never its line or its neighbours, so a client cannot move
///   the walk by sending one.
/// - IPv4-mapped IPv6 addresses count as IPv4; IPv6 clients are grouped by network, /64 by
///   default.
///
/// # Examples
/// ```
/// use tower_turnstile::key::{ClientIp, ForwardedHeader};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let key = ClientIp::new()
///     .trust("10.0.0.0/8".parse()?)
///     .header(ForwardedHeader::XForwardedFor);
/// # let _ = key; Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct ClientIp {
    trusted: Arc<[IpNet]>,
    header: Option<ForwardedHeader>,
    ipv6_prefix: u8,
}

impl Default for ClientIp {
    fn default() -> Self {
        ClientIp {
            trusted: Arc::from([]),
            header: None,
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }
}

impl ClientIp {
    /// Keys by client IP with no trusted proxy yet (so, by peer IP until [`ClientIp::trust`]
    /// is called), IPv6 grouped by /64.
    pub fn new() -> Self {
        Self::default()
    }

    /// Trusts the proxies in `net` to report the client's address. IPv4 networks also match
    /// IPv4-mapped IPv6 peers.
    pub fn trust(self, net: IpNet) -> Self {
        self.trust_all([net])
    }

    /// Trusts the proxies in every network of `nets`.
    pub fn trust_all(self, nets: impl IntoIterator<Item = IpNet>) -> Self {
        let mut all: Vec<IpNet> = self.trusted.to_vec();
        all.extend(nets.into_iter().map(|n| n.trunc()));
        ClientIp {
            trusted: Arc::from(all),
            ..self
        }
    }

    /// Reads only `header` (instead of the first present of `Forwarded`, `X-Forwarded-For`,
    /// `X-Real-IP`).
    pub fn header(self, header: ForwardedHeader) -> Self {
        ClientIp {
            header: Some(header),
            ..self
        }
    }

    /// Groups IPv6 clients by `len`-bit networks instead (128: one key per address).
    ///
    /// # Errors
    /// [`InvalidPrefix`] when `len` is above 128.
    pub fn ipv6_prefix(self, len: u8) -> Result<Self, InvalidPrefix> {
        check_prefix(len)?;
        Ok(ClientIp {
            ipv6_prefix: len,
            ..self
        })
    }

    /// The trusted proxy networks.
    pub fn trusted(&self) -> &[IpNet] {
        &self.trusted
    }

    /// Whether `ip` is a trusted proxy.
    pub fn is_trusted(&self, ip: IpAddr) -> bool {
        let ip = canonical_ip(ip);
        self.trusted.iter().any(|n| n.contains(&ip))
    }

    /// The client's address for a request from `peer` with `headers`, as described on
    /// [`ClientIp`] (before IPv6 grouping; IPv4-mapped addresses already as IPv4).
    pub fn client_addr(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let peer = canonical_ip(peer);
        if !self.is_trusted(peer) {
            return peer;
        }
        let header = match self.header {
            Some(h) => h,
            None => match [
                ForwardedHeader::Forwarded,
                ForwardedHeader::XForwardedFor,
                ForwardedHeader::XRealIp,
            ]
            .into_iter()
            .find(|h| headers.contains_key(h.name()))
            {
                Some(h) => h,
                None => return peer,
            },
        };
        let mut chain: Vec<Option<IpAddr>> = Vec::new();
        for value in headers.get_all(header.name()) {
            // Split on the bytes, then read each entry on its own: bytes that are not text
            // make their own entry malformed, nothing else.
            let value = value.as_bytes();
            match header {
                ForwardedHeader::Forwarded => parse_forwarded(value, &mut chain),
                ForwardedHeader::XForwardedFor => {
                    chain.extend(value.split(|&b| b == b',').map(parse_entry));
                }
                ForwardedHeader::XRealIp => chain.push(parse_entry(value)),
            }
        }
        // Walk from the right: each entry was written by the hop to its right, starting with
        // the peer. Stop at the first untrusted address (the client) or at an entry that
        // cannot be read (the hop that wrote it is the nearest trustworthy address).
        let mut nearest = peer;
        for entry in chain.iter().rev() {
            match entry {
                Some(ip) => {
                    let ip = canonical_ip(*ip);
                    if !self.is_trusted(ip) {
                        return ip;
                    }
                    nearest = ip;
                }
                None => return nearest,
            }
        }
        nearest
    }
}

impl KeyExtractor for ClientIp {
    fn extract<B>(&self, req: &Request<B>) -> Result<String, KeyError> {
        self.extract_key(req).map(String::from)
    }

    fn extract_key<B>(&self, req: &Request<B>) -> Result<Key, KeyError> {
        let peer = peer_addr(req.extensions()).ok_or(KeyError::MissingPeerAddr)?;
        Ok(ip_key_inline(
            self.client_addr(peer.ip(), req.headers()),
            self.ipv6_prefix,
        ))
    }
}

fn check_prefix(len: u8) -> Result<(), InvalidPrefix> {
    if len > 128 {
        Err(InvalidPrefix(len))
    } else {
        Ok(())
    }
}

/// The canonical key of `ip` (see [`turnstile_core::ip::ip_key`]).
#[cfg(test)]
pub(crate) fn ip_key(ip: IpAddr, prefix: u8) -> String {
    turnstile_core::ip::ip_key(ip, prefix)
}

/// The canonical key of `ip`, exactly [`turnstile_core::ip::ip_key`]'s, built inline (every
/// IP key fits): an IPv4 address (also one mapped into IPv6) written octet by octet, an IPv6
/// network as the standard library formats it.
pub(crate) fn ip_key_inline(ip: IpAddr, prefix: u8) -> Key {
    let v6 = match canonical_ip(ip) {
        IpAddr::V6(v6) => v6,
        IpAddr::V4(v4) => {
            // Dotted decimal, written a character at a time (ASCII: no UTF-8 check of the
            // whole) straight into the key's inline buffer. At most 15 characters: every
            // push fits.
            let mut text = ArrayString::<INLINE>::new();
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    let _ = text.try_push('.');
                }
                if octet >= 100 {
                    let _ = text.try_push(char::from(b'0' + octet / 100));
                }
                if octet >= 10 {
                    let _ = text.try_push(char::from(b'0' + octet / 10 % 10));
                }
                let _ = text.try_push(char::from(b'0' + octet % 10));
            }
            return Key::from_inline(text);
        }
    };
    let mut key = Key::new();
    if prefix >= 128 {
        let _ = write!(key, "{v6}");
    } else {
        let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
        let net = Ipv6Addr::from(u128::from(v6) & mask);
        let _ = write!(key, "{net}/{prefix}");
    }
    key
}

/// The peer address recorded in the request's extensions, if any.
pub(crate) fn peer_addr(ext: &Extensions) -> Option<SocketAddr> {
    #[cfg(feature = "axum")]
    if let Some(axum::extract::ConnectInfo(addr)) =
        ext.get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        return Some(*addr);
    }
    #[cfg(feature = "tonic")]
    if let Some(addr) = ext
        .get::<tonic::transport::server::TcpConnectInfo>()
        .and_then(|i| i.remote_addr())
    {
        return Some(addr);
    }
    ext.get::<SocketAddr>().copied()
}

/// IPv4-mapped IPv6 addresses as IPv4; everything else unchanged.
pub(crate) fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// One entry of `X-Forwarded-For` or `X-Real-IP`, as bytes: its node without the optional
/// whitespace around it; `None` when it is not text or not an address.
fn parse_entry(entry: &[u8]) -> Option<IpAddr> {
    parse_node(std::str::from_utf8(entry).ok()?.trim())
}

/// Parses one node of a forwarding header: `192.0.2.1`, `192.0.2.1:80`, `2001:db8::1`,
/// `[2001:db8::1]`, `[2001:db8::1]:443` (the port may be obfuscated, `:_p`). `None` for
/// `unknown`, an obfuscated identifier (`_hidden`) or anything malformed.
fn parse_node(s: &str) -> Option<IpAddr> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Some(rest) = s.strip_prefix('[') {
        let (inner, after) = rest.split_once(']')?;
        if !(after.is_empty() || after.strip_prefix(':').is_some_and(valid_port)) {
            return None;
        }
        return inner.parse::<Ipv6Addr>().ok().map(IpAddr::V6);
    }
    let (host, port) = s.split_once(':')?;
    if !valid_port(port) {
        return None;
    }
    host.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4)
}

/// A port (1 to 5 digits) or an obfuscated port (`_` then letters, digits, `.`, `_`, `-`).
fn valid_port(p: &str) -> bool {
    let obfuscated = p.strip_prefix('_').is_some_and(|r| {
        !r.is_empty()
            && r.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    });
    obfuscated || (!p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()))
}

/// Appends the `for=` node of each element of a `Forwarded` header value (RFC 7239) to
/// `chain`: an address, or `None` for an element that is `unknown`, obfuscated, malformed
/// (a byte that is not text included), or has no `for=`.
fn parse_forwarded(value: &[u8], chain: &mut Vec<Option<IpAddr>>) {
    for element in split_unquoted(value, b',') {
        let Ok(element) = std::str::from_utf8(element) else {
            chain.push(None);
            continue;
        };
        let mut node = None;
        let mut ok = true;
        for pair in split_unquoted(element.as_bytes(), b';') {
            // Split at an ASCII byte of text: still text (else malformed, to be safe).
            let Ok(pair) = std::str::from_utf8(pair) else {
                ok = false;
                continue;
            };
            let pair = pair.trim();
            if pair.is_empty() {
                continue;
            }
            let Some((name, value)) = pair.split_once('=') else {
                ok = false;
                continue;
            };
            if name.trim().eq_ignore_ascii_case("for") {
                if node.is_some() {
                    // Two `for=` in one element: ambiguous.
                    ok = false;
                }
                let raw = value.trim();
                node = unquote(raw);
                // A port or an IPv6 address needs a quoted-string (RFC 7239, section 6):
                // an unquoted `for=192.0.2.1:80` is malformed.
                if node.is_none() || (!raw.starts_with('"') && raw.contains([':', '[', ']'])) {
                    ok = false;
                }
            }
        }
        chain.push(if ok {
            node.and_then(|n| parse_node(&n))
        } else {
            None
        });
    }
}

/// Splits `bytes` at every `sep` (an ASCII byte) outside a quoted-string.
fn split_unquoted(bytes: &[u8], sep: u8) -> impl Iterator<Item = &[u8]> {
    let s = bytes;
    let mut parts = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, &b) in bytes.iter().enumerate() {
        if escaped {
            escaped = false;
        } else if quoted && b == b'\\' {
            escaped = true;
        } else if b == b'"' {
            quoted = !quoted;
        } else if b == sep && !quoted {
            parts.push(&s[start..i]);
            start = i + 1;
        }
    }
    parts.push(&s[start..]);
    parts.into_iter()
}

/// A token as itself, a quoted-string without its quotes and escapes; `None` if a quote is
/// unbalanced or the token is empty.
fn unquote(v: &str) -> Option<String> {
    match v.strip_prefix('"') {
        Some(rest) => {
            let inner = rest.strip_suffix('"')?;
            let mut out = String::with_capacity(inner.len());
            let mut chars = inner.chars();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => out.push(chars.next()?),
                    '"' => return None,
                    c => out.push(c),
                }
            }
            Some(out)
        }
        None if v.is_empty() || v.contains('"') => None,
        None => Some(v.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hm(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                http::HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn nodes() {
        assert_eq!(parse_node("192.0.2.1"), Some(ip("192.0.2.1")));
        assert_eq!(parse_node("192.0.2.1:8080"), Some(ip("192.0.2.1")));
        assert_eq!(parse_node("192.0.2.1:_x"), Some(ip("192.0.2.1")));
        assert_eq!(parse_node("2001:db8::1"), Some(ip("2001:db8::1")));
        assert_eq!(parse_node("[2001:db8::1]"), Some(ip("2001:db8::1")));
        assert_eq!(parse_node("[2001:db8::1]:443"), Some(ip("2001:db8::1")));
        for bad in [
            "",
            "unknown",
            "_hidden",
            "192.0.2",
            "192.0.2.1:",
            "192.0.2.1:99999x",
            "[2001:db8::1",
            "[192.0.2.1]",
            "[2001:db8::1]x",
            "fe80::1%eth0",
            "host.example",
            "1.2.3.4.5",
        ] {
            assert_eq!(parse_node(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn forwarded_elements() {
        let mut c = Vec::new();
        parse_forwarded(
            br#"for=192.0.2.60;proto=http;by=203.0.113.43, For="[2001:db8:cafe::17]:4711", for=unknown, for=_hidden, proto=https, for="a\"b", for="192.0.2.1;x", for=198.51.100.1;for=198.51.100.2"#,
            &mut c,
        );
        assert_eq!(
            c,
            [
                Some(ip("192.0.2.60")),
                Some(ip("2001:db8:cafe::17")),
                None,
                None,
                None,
                None,
                None,
                None
            ]
        );
    }

    #[test]
    fn an_unquoted_port_or_ipv6_address_is_malformed() {
        let mut c = Vec::new();
        parse_forwarded(
            br#"for=6.6.6.6:80, for=[2001:db8::1], for="6.6.6.6:80", for=7.7.7.7;;;"#,
            &mut c,
        );
        assert_eq!(c, [None, None, Some(ip("6.6.6.6")), Some(ip("7.7.7.7"))]);
    }

    #[test]
    fn inline_ip_keys_are_the_core_ones() {
        let mut addrs: Vec<IpAddr> = [
            "0.0.0.0",
            "9.10.99.100",
            "255.255.255.255",
            "192.0.2.1",
            "::ffff:192.0.2.1",
            "::ffff:10.0.0.255",
            "::",
            "::1",
            "2001:db8::1",
            "2001:db8:85a3:8d3:1319:8a2e:370:7348",
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            "fe80::1:2:3:4",
        ]
        .iter()
        .map(|s| ip(s))
        .collect();
        // A spread of addresses from a simple generator, both families.
        let mut x: u128 = 0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c834;
        for _ in 0..500 {
            x = x
                .wrapping_mul(0x2545_f491_4f6c_dd1d_2545_f491_4f6c_dd1d)
                .wrapping_add(1);
            addrs.push(IpAddr::V6(Ipv6Addr::from(x)));
            addrs.push(IpAddr::V4(std::net::Ipv4Addr::from((x >> 64) as u32)));
        }
        for a in addrs {
            for prefix in [0, 1, 32, 48, 56, 63, 64, 65, 96, 127, 128, 200] {
                let inline = ip_key_inline(a, prefix);
                assert!(inline.is_inline(), "{a} /{prefix}");
                assert_eq!(inline.as_str(), ip_key(a, prefix), "{a} /{prefix}");
            }
        }
    }

    #[test]
    fn ipv6_keys_group_by_prefix() {
        assert_eq!(ip_key(ip("2001:db8:1:2:3:4:5:6"), 64), "2001:db8:1:2::/64");
        assert_eq!(ip_key(ip("2001:db8:1:2:3:4:5:6"), 48), "2001:db8:1::/48");
        assert_eq!(
            ip_key(ip("2001:db8:1:2:3:4:5:6"), 128),
            "2001:db8:1:2:3:4:5:6"
        );
        assert_eq!(ip_key(ip("2001:db8::1"), 0), "::/0");
        assert_eq!(ip_key(ip("192.0.2.1"), 64), "192.0.2.1");
        assert_eq!(
            ip_key(canonical_ip(ip("::ffff:192.0.2.1")), 64),
            "192.0.2.1"
        );
        assert!(PeerIp::new().ipv6_prefix(129).is_err());
        assert!(ClientIp::new().ipv6_prefix(128).is_ok());
    }

    #[test]
    fn ipv4_keys_are_dotted_decimal() {
        for a in [
            "0.0.0.0",
            "255.255.255.255",
            "10.100.9.99",
            "1.20.199.200",
            "192.0.2.1",
        ] {
            assert_eq!(&*ip_key_inline(ip(a), 64), a);
            assert_eq!(ip_key_inline(ip(a), 64).as_str(), ip(a).to_string());
        }
        // Every octet value in every place.
        for v in 0..=255u8 {
            for place in 0..4 {
                let mut octets = [1, 22, 133, 4];
                octets[place] = v;
                let a = IpAddr::V4(std::net::Ipv4Addr::from(octets));
                assert_eq!(ip_key_inline(a, 64).as_str(), a.to_string());
            }
        }
    }

    #[test]
    fn untrusted_peer_headers_are_ignored() {
        let k = ClientIp::new().trust("10.0.0.0/8".parse().unwrap());
        let h = hm(&[
            ("x-forwarded-for", "1.1.1.1"),
            ("forwarded", "for=1.1.1.1"),
            ("x-real-ip", "1.1.1.1"),
        ]);
        assert_eq!(k.client_addr(ip("203.0.113.9"), &h), ip("203.0.113.9"));
        // No trusted networks at all: always the peer.
        assert_eq!(
            ClientIp::new().client_addr(ip("10.0.0.1"), &h),
            ip("10.0.0.1")
        );
    }

    #[test]
    fn chain_is_walked_from_the_right_past_trusted_hops() {
        let k = ClientIp::new()
            .trust("10.0.0.0/8".parse().unwrap())
            .trust("192.168.0.0/16".parse().unwrap());
        let peer = ip("10.0.0.1");
        // A spoofed leftmost entry is skipped: the first untrusted from the right wins.
        let h = hm(&[("x-forwarded-for", "6.6.6.6, 198.51.100.7, 192.168.1.1")]);
        assert_eq!(k.client_addr(peer, &h), ip("198.51.100.7"));
        // Repeated header lines are joined in order.
        let h = hm(&[
            ("x-forwarded-for", "6.6.6.6, 198.51.100.7"),
            ("x-forwarded-for", "192.168.1.1"),
        ]);
        assert_eq!(k.client_addr(peer, &h), ip("198.51.100.7"));
        let h = hm(&[
            ("x-forwarded-for", "198.51.100.7"),
            ("x-forwarded-for", "6.6.6.6, 192.168.1.1"),
        ]);
        assert_eq!(k.client_addr(peer, &h), ip("6.6.6.6"));
        // All trusted: the leftmost.
        let h = hm(&[("x-forwarded-for", "192.168.1.2, 192.168.1.1")]);
        assert_eq!(k.client_addr(peer, &h), ip("192.168.1.2"));
        // Unknown / malformed: the nearest trustworthy hop, never what lies left of it.
        let h = hm(&[("x-forwarded-for", "6.6.6.6, unknown, 192.168.1.1")]);
        assert_eq!(k.client_addr(peer, &h), ip("192.168.1.1"));
        let h = hm(&[("x-forwarded-for", "6.6.6.6, garbage")]);
        assert_eq!(k.client_addr(peer, &h), peer);
        let h = hm(&[("x-forwarded-for", "6.6.6.6,,")]);
        assert_eq!(k.client_addr(peer, &h), peer);
        let h = hm(&[("x-forwarded-for", "")]);
        assert_eq!(k.client_addr(peer, &h), peer);
        // IPv4-mapped entries and peers count as IPv4 (and match IPv4 networks).
        let h = hm(&[("x-forwarded-for", "::ffff:198.51.100.7, ::ffff:192.168.1.1")]);
        assert_eq!(k.client_addr(ip("::ffff:10.0.0.1"), &h), ip("198.51.100.7"));
    }

    /// A header map with one `name` line per value, values as raw bytes.
    fn raw(name: &str, values: &[&[u8]]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                http::HeaderValue::from_bytes(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn a_non_utf8_byte_made_the_whole_forwarding_line_one_malformed_entry() {
        // `X-Forwarded-For: \xff, 198.51.100.7` from a trusted proxy used to key the client
        // as the proxy (the whole line was one malformed entry): it must key exactly as
        // `198.51.100.7` alone.
        let k = ClientIp::new()
            .trust("10.0.0.0/8".parse().unwrap())
            .trust("192.168.0.0/16".parse().unwrap());
        let peer = ip("10.0.0.1");
        let client = ip("198.51.100.7");
        let alone = k.client_addr(peer, &raw("x-forwarded-for", &[b"198.51.100.7"]));
        assert_eq!(alone, client);
        for (header, values, want) in [
            // Only the malformed entry is malformed, wherever the byte is.
            ("x-forwarded-for", &[&b"\xff, 198.51.100.7"[..]][..], client),
            (
                "x-forwarded-for",
                &[&b"6.6.6.6, 1.2.3\xff.4, 198.51.100.7"[..]],
                client,
            ),
            (
                "x-forwarded-for",
                &[&b"\xff\xfe, 198.51.100.7, 192.168.1.1"[..]],
                client,
            ),
            // The walk still stops at a malformed entry on its way: at the nearest hop.
            ("x-forwarded-for", &[&b"198.51.100.7, \xff"[..]], peer),
            (
                "x-forwarded-for",
                &[&b"198.51.100.7, \xff, 192.168.1.1"[..]],
                ip("192.168.1.1"),
            ),
            // Several lines: each is read entry by entry.
            (
                "x-forwarded-for",
                &[&b"\xff"[..], &b"198.51.100.7"[..]],
                client,
            ),
            (
                "x-forwarded-for",
                &[&b"6.6.6.6, \xff"[..], &b"198.51.100.7"[..]],
                client,
            ),
            ("x-real-ip", &[&b"\xff"[..], &b"198.51.100.7"[..]], client),
            ("x-real-ip", &[&b"198.51.100.7"[..], &b"\xff"[..]], peer),
            ("forwarded", &[&b"for=\xff, for=198.51.100.7"[..]], client),
            (
                "forwarded",
                &[&b"for=6.6.6.6;proto=\xff, for=198.51.100.7"[..]],
                client,
            ),
            (
                "forwarded",
                &[&b"for=\"\xff\", for=198.51.100.7;proto=https"[..]],
                client,
            ),
            (
                "forwarded",
                &[&b"for=\xff"[..], &b"for=198.51.100.7"[..]],
                client,
            ),
            ("forwarded", &[&b"for=198.51.100.7, for=\xff"[..]], peer),
        ] {
            assert_eq!(
                k.client_addr(peer, &raw(header, values)),
                want,
                "{header}: {values:?}"
            );
        }
    }

    #[test]
    fn one_header_is_used() {
        let k = ClientIp::new().trust("10.0.0.0/8".parse().unwrap());
        let peer = ip("10.0.0.1");
        let h = hm(&[
            ("x-real-ip", "198.51.100.3"),
            ("x-forwarded-for", "198.51.100.2"),
            ("forwarded", "for=198.51.100.1"),
        ]);
        assert_eq!(k.client_addr(peer, &h), ip("198.51.100.1"));
        let h2 = hm(&[
            ("x-real-ip", "198.51.100.3"),
            ("x-forwarded-for", "198.51.100.2"),
        ]);
        assert_eq!(k.client_addr(peer, &h2), ip("198.51.100.2"));
        let xri = k.clone().header(ForwardedHeader::XRealIp);
        assert_eq!(xri.client_addr(peer, &h), ip("198.51.100.3"));
        // The configured header only: a Forwarded header is ignored when X-Forwarded-For is
        // the configured one, even if it is absent.
        let xff = k.header(ForwardedHeader::XForwardedFor);
        assert_eq!(
            xff.client_addr(peer, &hm(&[("forwarded", "for=6.6.6.6")])),
            peer
        );
    }

    #[test]
    fn forwarded_header_chain() {
        let k = ClientIp::new()
            .trust("10.0.0.0/8".parse().unwrap())
            .trust("2001:db8:ffff::/48".parse().unwrap());
        let peer = ip("2001:db8:ffff::1");
        let h = hm(&[(
            "forwarded",
            r#"for=6.6.6.6, for="[2001:db8:1::5]:1234";proto=https, for=10.1.1.1"#,
        )]);
        assert_eq!(k.client_addr(peer, &h), ip("2001:db8:1::5"));
        let h = hm(&[("forwarded", r#"for=6.6.6.6, for=_gazonk, for=10.1.1.1"#)]);
        assert_eq!(k.client_addr(peer, &h), ip("10.1.1.1"));
        let h = hm(&[("forwarded", r#"for=6.6.6.6, by=10.2.2.2"#)]);
        assert_eq!(k.client_addr(peer, &h), peer);
    }
}
