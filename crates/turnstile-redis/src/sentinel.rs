//! Redis Sentinel: `redis+sentinel://` URLs, and connections to the primary the Sentinels
//! name (asked again at every new connection, so a failover is followed).

use std::fmt;

#[cfg(feature = "sentinel")]
use redis::{
    aio::MultiplexedConnection,
    sentinel::{SentinelClientBuilder, SentinelServerType},
    AsyncConnectionConfig, ConnectionAddr, ProtocolVersion, RedisResult,
};

/// The scheme of Sentinel URLs.
pub(crate) const SCHEME: &str = "redis+sentinel://";

/// The same scheme as Lettuce and Spring Data Redis spell it, also accepted.
const SCHEME_ALIAS: &str = "redis-sentinel://";

/// The default Sentinel port.
const SENTINEL_PORT: u16 = 26379;

/// A parsed `redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/service[/db]`.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct SentinelSpec {
    pub(crate) sentinels: Vec<(String, u16)>,
    pub(crate) service: String,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
    pub(crate) db: i64,
}

impl fmt::Debug for SentinelSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SentinelSpec")
            .field("sentinels", &self.sentinels)
            .field("service", &self.service)
            .field("db", &self.db)
            .finish_non_exhaustive()
    }
}

/// Whether `url` is a Sentinel URL.
pub(crate) fn is_sentinel(url: &str) -> bool {
    let url = url.trim();
    [SCHEME, SCHEME_ALIAS].iter().any(|scheme| {
        url.get(..scheme.len())
            .is_some_and(|s| s.eq_ignore_ascii_case(scheme))
    })
}

fn percent_decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("bad percent-encoding in {s:?}"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("{s:?} is not UTF-8 once decoded"))
}

fn host_port(s: &str) -> Result<(String, u16), String> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let end = rest
            .find(']')
            .ok_or_else(|| format!("unclosed '[' in {s:?}"))?;
        (&rest[..end], rest[end + 1..].strip_prefix(':'))
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    if host.is_empty() {
        return Err(format!("no host in {s:?}"));
    }
    let port = match port {
        None => SENTINEL_PORT,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("bad port in {s:?}"))?,
    };
    Ok((host.to_owned(), port))
}

impl SentinelSpec {
    /// Parses a Sentinel URL.
    ///
    /// # Errors
    /// What is wrong with it, in words.
    pub(crate) fn parse(url: &str) -> Result<Self, String> {
        let url = url.trim();
        if !is_sentinel(url) {
            return Err(format!("{url:?} does not start with {SCHEME}"));
        }
        // Both schemes have the same length.
        let rest = &url[SCHEME.len()..];
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let (username, password) = match userinfo {
            None => (None, None),
            Some(u) => {
                let (user, pass) = match u.split_once(':') {
                    Some((user, pass)) => (user, Some(pass)),
                    None => (u, None),
                };
                let user = (!user.is_empty())
                    .then(|| percent_decode(user))
                    .transpose()?;
                let pass = pass.map(percent_decode).transpose()?;
                (user, pass)
            }
        };
        let sentinels = hosts
            .split(',')
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .map(host_port)
            .collect::<Result<Vec<_>, _>>()?;
        if sentinels.is_empty() {
            return Err("a Sentinel URL names at least one Sentinel".into());
        }
        let mut segments = path.split('/').filter(|s| !s.is_empty());
        let service = segments
            .next()
            .map(percent_decode)
            .transpose()?
            .ok_or("a Sentinel URL names the service after the hosts: /mymaster")?;
        let db = match segments.next() {
            None => 0,
            Some(d) => d
                .parse::<i64>()
                .ok()
                .filter(|d| *d >= 0)
                .ok_or_else(|| format!("bad database number {d:?}"))?,
        };
        if let Some(extra) = segments.next() {
            return Err(format!("unexpected path segment {extra:?}"));
        }
        Ok(SentinelSpec {
            sentinels,
            service,
            username,
            password,
            db,
        })
    }

    /// The URL without credentials, as logs name the node.
    pub(crate) fn name(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|(h, p)| {
                if h.contains(':') {
                    format!("[{h}]:{p}")
                } else {
                    format!("{h}:{p}")
                }
            })
            .collect();
        let db = if self.db == 0 {
            String::new()
        } else {
            format!("/{}", self.db)
        };
        format!("{SCHEME}{}/{}{db}", hosts.join(","), self.service)
    }

    /// A connection to the primary the Sentinels name now (redis-rs checks with `ROLE`
    /// that it is a primary).
    #[cfg(feature = "sentinel")]
    pub(crate) async fn connect(
        &self,
        protocol: ProtocolVersion,
        config: &AsyncConnectionConfig,
    ) -> RedisResult<MultiplexedConnection> {
        let addrs = self
            .sentinels
            .iter()
            .map(|(h, p)| ConnectionAddr::Tcp(h.clone(), *p));
        let mut builder =
            SentinelClientBuilder::new(addrs, &self.service, SentinelServerType::Master)?
                .set_client_to_redis_protocol(protocol)
                .set_client_to_redis_db(self.db);
        if let Some(u) = &self.username {
            builder = builder.set_client_to_redis_username(u);
        }
        if let Some(p) = &self.password {
            builder = builder.set_client_to_redis_password(p);
        }
        builder
            .build()?
            .get_async_connection_with_config(config)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinel_urls_parse() {
        let s = SentinelSpec::parse(
            "redis+sentinel://user:p%40ss@10.0.0.1:26380,10.0.0.2,[::1]:5000/mymaster/2",
        )
        .unwrap();
        assert_eq!(
            s.sentinels,
            [
                ("10.0.0.1".to_owned(), 26380),
                ("10.0.0.2".to_owned(), 26379),
                ("::1".to_owned(), 5000)
            ]
        );
        assert_eq!(s.service, "mymaster");
        assert_eq!(s.username.as_deref(), Some("user"));
        assert_eq!(s.password.as_deref(), Some("p@ss"));
        assert_eq!(s.db, 2);
        assert_eq!(
            s.name(),
            "redis+sentinel://10.0.0.1:26380,10.0.0.2:26379,[::1]:5000/mymaster/2"
        );
        assert!(!format!("{s:?}").contains("p@ss"));
        let s = SentinelSpec::parse("REDIS+SENTINEL://:secret@h/m").unwrap();
        assert_eq!((s.username, s.password.as_deref()), (None, Some("secret")));
        let s = SentinelSpec::parse("redis-sentinel://h:26380/m").unwrap();
        assert_eq!(s.name(), "redis+sentinel://h:26380/m");
    }

    #[test]
    fn bad_sentinel_urls_are_errors_in_words() {
        for bad in [
            "redis+sentinel://h:1",
            "redis+sentinel:///m",
            "redis+sentinel://h:0/m",
            "redis+sentinel://h:x/m",
            "redis+sentinel://h/m/-1",
            "redis+sentinel://h/m/0/x",
            "redis+sentinel://u:%zz@h/m",
            "redis://h/m",
        ] {
            assert!(SentinelSpec::parse(bad).is_err(), "{bad}");
        }
    }
}
