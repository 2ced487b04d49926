//! Client keys from IP addresses, the same everywhere they are derived (the `tower-turnstile`
//! crate's IP key extractors, `turnstile simulate --format nginx`, `turnstile quota`).

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv6Addr};

/// The default IPv6 grouping: one key per /64, the smallest network a site is normally given.
pub const DEFAULT_IPV6_PREFIX: u8 = 64;

/// The client key of `ip`: an IPv4 address (also one IPv4-mapped into IPv6, `::ffff:a.b.c.d`)
/// as itself, `192.0.2.1`; an IPv6 address as its `ipv6_prefix`-bit network, e.g.
/// `2001:db8:1:2::/64` (as itself at 128 or more).
///
/// # Examples
/// ```
/// use turnstile_core::ip::ip_key;
/// assert_eq!(ip_key("2001:db8:1:2:3:4:5:6".parse().unwrap(), 64), "2001:db8:1:2::/64");
/// assert_eq!(ip_key("::ffff:192.0.2.1".parse().unwrap(), 64), "192.0.2.1");
/// ```
pub fn ip_key(ip: IpAddr, ipv6_prefix: u8) -> String {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    // Sized up front: one allocation per key (the longest, an IPv6 network, is 43 bytes).
    let mut s = String::with_capacity(48);
    let _ = match ip {
        IpAddr::V4(v4) => write!(s, "{v4}"),
        IpAddr::V6(v6) if ipv6_prefix >= 128 => write!(s, "{v6}"),
        IpAddr::V6(v6) => {
            let mask = u128::MAX
                .checked_shl(128 - u32::from(ipv6_prefix))
                .unwrap_or(0);
            let net = Ipv6Addr::from(u128::from(v6) & mask);
            write!(s, "{net}/{ipv6_prefix}")
        }
    };
    s
}
