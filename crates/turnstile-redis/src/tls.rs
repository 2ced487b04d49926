//! TLS for `rediss://` URLs: which certificate authority verifies the server, the client
//! certificate for mutual TLS, and rustls's crypto provider — all read and checked when the
//! backend is built, so a misconfiguration is an [`InvalidRedisConfig::Tls`] at start-up,
//! never a panic or a failure at the first check.
//!
//! With the `tls` feature the connections use rustls (TLS 1.2 and 1.3, RFC 5246 and RFC 8446)
//! with its `ring` crypto provider. The server's certificate is verified (RFC 5280 path
//! validation, RFC 6125 name check) against:
//! - the CA file given to [`RedisBackendBuilder::tls_ca_file`](crate::RedisBackendBuilder::tls_ca_file),
//!   when one is given: it replaces every other root;
//! - else the system trust store (rustls-native-certs: `SSL_CERT_FILE` and `SSL_CERT_DIR` when
//!   set, else the operating system's store), or, with the `tls-webpki-roots` feature, the
//!   Mozilla roots compiled in.
//!
//! `rediss://host:port/#insecure` turns verification off (any certificate, any name).

use std::path::PathBuf;

use crate::error::InvalidRedisConfig;

/// The TLS files a builder was given; read when the backend is built.
#[derive(Clone, Debug, Default)]
pub(crate) struct TlsFiles {
    /// PEM file of the CA certificate(s) that verify the server.
    pub(crate) ca: Option<PathBuf>,
    /// PEM files of the client certificate chain and its private key.
    pub(crate) client: Option<(PathBuf, PathBuf)>,
}

/// How the backend's connections are made, once the URLs and the TLS files were checked.
pub(crate) struct Connect {
    /// The certificates handed to redis-rs for `rediss://` URLs; `None` when the URLs' own
    /// settings suffice (plain `redis://`, or `rediss://` with the default roots).
    #[cfg(feature = "tls")]
    certs: Option<redis::TlsCertificates>,
}

impl Connect {
    /// The connection parameters of one node.
    pub(crate) fn connection_info(
        &self,
        url: &str,
    ) -> Result<redis::ConnectionInfo, InvalidRedisConfig> {
        #[cfg(feature = "tls")]
        if let Some(certs) = &self.certs {
            return redis::Client::build_with_tls(url, certs.clone())
                .map(|client| client.get_connection_info().clone())
                .map_err(|e| InvalidRedisConfig::Tls(e.to_string()));
        }
        // The error, not the URL: it may hold a password.
        redis::IntoConnectionInfo::into_connection_info(url)
            .map_err(|e| InvalidRedisConfig::Url(e.to_string()))
    }

    /// `builder` (a Cluster's) with the certificates, which redis-rs hands to every node.
    pub(crate) fn cluster_certificates(
        &self,
        builder: redis::cluster::ClusterClientBuilder,
    ) -> redis::cluster::ClusterClientBuilder {
        #[cfg(feature = "tls")]
        if let Some(certs) = &self.certs {
            return builder.certs(certs.clone());
        }
        builder
    }
}

/// Refuses TLS files for a Sentinel URL: the connections through Sentinel (to the Sentinels
/// and to the primary they name) are plain TCP here.
///
/// # Errors
/// [`InvalidRedisConfig::Tls`] when a CA file or client certificate was given.
pub(crate) fn refuse_for_sentinel(files: &TlsFiles) -> Result<(), InvalidRedisConfig> {
    if files.ca.is_some() || files.client.is_some() {
        return Err(InvalidRedisConfig::Tls(
            "a TLS CA file or client certificate was given with a redis+sentinel:// URL: TLS \
             through Sentinel is not supported, use rediss://host:port (a single node) or a \
             Cluster"
                .into(),
        ));
    }
    Ok(())
}

/// `url`'s scheme is `rediss` (TLS).
fn is_tls(url: &str) -> bool {
    url.get(..9)
        .is_some_and(|s| s.eq_ignore_ascii_case("rediss://"))
}

/// Checks the URLs' TLS against the files given, reads and checks the files, installs the
/// crypto provider and checks the trust store the connections will use.
///
/// # Errors
/// [`InvalidRedisConfig::Tls`] for: a CA file or client certificate with no `rediss://`
/// URL; `rediss://` and `redis://` mixed; `rediss://` without the `tls` feature; a CA file
/// with `#insecure`; an unreadable file, one that holds no certificate (or no key), invalid
/// PEM or DER, a key that does not match its certificate; an unreadable or empty system trust
/// store when no CA file is given.
pub(crate) fn prepare(urls: &[String], files: &TlsFiles) -> Result<Connect, InvalidRedisConfig> {
    let tls_urls = urls.iter().filter(|u| is_tls(u)).count();
    if tls_urls == 0 {
        if files.ca.is_some() || files.client.is_some() {
            return Err(InvalidRedisConfig::Tls(
                "a TLS CA file or client certificate was given, but no URL is rediss:// \
                 (TLS): use rediss://host:port"
                    .into(),
            ));
        }
        return Ok(Connect {
            #[cfg(feature = "tls")]
            certs: None,
        });
    }
    if tls_urls != urls.len() {
        return Err(InvalidRedisConfig::Tls(
            "some URLs are rediss:// (TLS) and some are not: every node of a Cluster uses TLS \
             or none does"
                .into(),
        ));
    }
    prepare_tls(urls, files)
}

/// [`prepare`] for `rediss://` URLs without the `tls` feature: refused.
#[cfg(not(feature = "tls"))]
fn prepare_tls(_urls: &[String], _files: &TlsFiles) -> Result<Connect, InvalidRedisConfig> {
    Err(InvalidRedisConfig::Tls(
        "rediss:// (TLS) needs the `tls` feature of turnstile-redis (turnstile's `redis-tls` \
         feature)"
            .into(),
    ))
}

/// [`prepare`] for `rediss://` URLs.
#[cfg(feature = "tls")]
fn prepare_tls(urls: &[String], files: &TlsFiles) -> Result<Connect, InvalidRedisConfig> {
    let insecure = urls.iter().any(|u| {
        redis::parse_redis_url(u).is_some_and(|parsed| parsed.fragment() == Some("insecure"))
    });
    rustls_checks::prepare(files, insecure)
}

#[cfg(feature = "tls")]
mod rustls_checks {
    use std::path::Path;
    use std::sync::Arc;

    use rustls::pki_types::pem::{self, PemObject};
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use rustls::{ClientConfig, RootCertStore};

    use super::{Connect, TlsFiles};
    use crate::error::InvalidRedisConfig;

    fn err(message: String) -> InvalidRedisConfig {
        InvalidRedisConfig::Tls(message)
    }

    /// The process's rustls crypto provider: the one the application installed, else
    /// `ring`'s, installed now. rustls (and so redis-rs) panics at the first TLS connection
    /// when no provider is installed and the crate features do not name exactly one.
    fn provider() -> Arc<rustls::crypto::CryptoProvider> {
        if let Some(p) = rustls::crypto::CryptoProvider::get_default() {
            return Arc::clone(p);
        }
        // Another thread may install one between the two calls: whichever was installed
        // first is kept and returned.
        let _ = rustls::crypto::ring::default_provider().install_default();
        rustls::crypto::CryptoProvider::get_default()
            .map(Arc::clone)
            .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()))
    }

    fn read(what: &str, path: &Path) -> Result<Vec<u8>, InvalidRedisConfig> {
        std::fs::read(path)
            .map_err(|e| err(format!("cannot read the {what} {}: {e}", path.display())))
    }

    /// Every certificate in a PEM file (RFC 7468 `CERTIFICATE` blocks), at least one.
    fn certificates(
        what: &str,
        path: &Path,
        pem: &[u8],
    ) -> Result<Vec<CertificateDer<'static>>, InvalidRedisConfig> {
        let certs = CertificateDer::pem_slice_iter(pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| {
                err(format!(
                    "the {what} {} is not valid PEM: {e}",
                    path.display()
                ))
            })?;
        if certs.is_empty() {
            return Err(err(format!(
                "the {what} {} holds no certificate (a PEM block -----BEGIN CERTIFICATE-----)",
                path.display()
            )));
        }
        Ok(certs)
    }

    /// Checks the system trust store as redis-rs reads it at every connection (it refuses to
    /// connect when any part of it cannot be read or parsed); `needed` when no CA file
    /// replaces it, and then it must hold a certificate.
    #[cfg(not(feature = "tls-webpki-roots"))]
    fn check_default_roots(needed: bool) -> Result<(), InvalidRedisConfig> {
        let native = rustls_native_certs::load_native_certs();
        if let Some(e) = native.errors.first() {
            return Err(err(format!(
                "the system trust store cannot be read ({e}); check SSL_CERT_FILE and \
                 SSL_CERT_DIR, or give a CA file"
            )));
        }
        let mut roots = RootCertStore::empty();
        for cert in native.certs {
            roots.add(cert).map_err(|e| {
                err(format!(
                    "the system trust store holds a certificate rustls cannot use ({e}); \
                     check SSL_CERT_FILE and SSL_CERT_DIR, or give a CA file"
                ))
            })?;
        }
        if needed && roots.is_empty() {
            return Err(err(
                "the system trust store holds no certificate, so no server could be verified: \
                 install the CA certificates (Debian: ca-certificates), set SSL_CERT_FILE, or \
                 give a CA file"
                    .into(),
            ));
        }
        Ok(())
    }

    /// The Mozilla roots compiled in (webpki-roots) need no check.
    #[cfg(feature = "tls-webpki-roots")]
    fn check_default_roots(_needed: bool) -> Result<(), InvalidRedisConfig> {
        Ok(())
    }

    pub(super) fn prepare(files: &TlsFiles, insecure: bool) -> Result<Connect, InvalidRedisConfig> {
        let provider = provider();
        if insecure && files.ca.is_some() {
            return Err(err(
                "the URL's #insecure turns certificate verification off, so the CA file \
                 would not be used: give one or the other"
                    .into(),
            ));
        }
        check_default_roots(files.ca.is_none() && !insecure)?;
        let (roots, root_pem) = match &files.ca {
            Some(path) => {
                let pem = read("CA file", path)?;
                let mut roots = RootCertStore::empty();
                for cert in certificates("CA file", path, &pem)? {
                    roots.add(cert).map_err(|e| {
                        err(format!(
                            "the CA file {} holds a certificate that cannot be a trust \
                             anchor: {e}",
                            path.display()
                        ))
                    })?;
                }
                (roots, Some(pem))
            }
            // The roots only matter to the server's verification, not to the client key's
            // checks below.
            None => (RootCertStore::empty(), None),
        };
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| err(format!("the crypto provider cannot do TLS 1.2 or 1.3: {e}")))?
            .with_root_certificates(roots);
        let client_tls = match &files.client {
            None => None,
            Some((cert_path, key_path)) => {
                let cert_pem = read("client certificate file", cert_path)?;
                let chain = certificates("client certificate file", cert_path, &cert_pem)?;
                let key_pem = read("client key file", key_path)?;
                let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| match e {
                    pem::Error::NoItemsFound => err(format!(
                        "the client key file {} holds no unencrypted private key (a PEM block \
                         -----BEGIN PRIVATE KEY-----, RSA PRIVATE KEY or EC PRIVATE KEY)",
                        key_path.display()
                    )),
                    e => err(format!(
                        "the client key file {} is not valid PEM: {e}",
                        key_path.display()
                    )),
                })?;
                // Checks the key's type and that it belongs to the certificate.
                config.with_client_auth_cert(chain, key).map_err(|e| {
                    err(format!(
                        "the client certificate {} and key {} cannot be used together: {e}",
                        cert_path.display(),
                        key_path.display()
                    ))
                })?;
                Some(redis::ClientTlsConfig {
                    client_cert: cert_pem,
                    client_key: key_pem,
                })
            }
        };
        let certs =
            (client_tls.is_some() || root_pem.is_some()).then_some(redis::TlsCertificates {
                client_tls,
                root_cert: root_pem,
            });
        Ok(Connect { certs })
    }
}

#[cfg(test)]
mod tests {
    use super::is_tls;
    use crate::{InvalidRedisConfig, RedisBackend};

    fn tls_error(b: crate::RedisBackendBuilder) -> String {
        match b.build() {
            Err(InvalidRedisConfig::Tls(m)) => m,
            other => panic!("expected InvalidRedisConfig::Tls, got {other:?}"),
        }
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn rediss_without_the_tls_feature_is_a_config_error() {
        for url in [
            "rediss://127.0.0.1:6380",
            "rediss://127.0.0.1:7000,rediss://127.0.0.1:7001",
        ] {
            let m = tls_error(RedisBackend::builder(url));
            assert!(m.contains("`tls` feature"), "{m}");
        }
        let m = tls_error(RedisBackend::builder("rediss://h:1").tls_ca_file("/nonexistent.pem"));
        assert!(m.contains("`tls` feature"), "{m}");
    }

    #[test]
    fn tls_files_without_a_rediss_url_are_refused() {
        let m = tls_error(RedisBackend::builder("redis://127.0.0.1:6379").tls_ca_file("ca.pem"));
        assert!(m.contains("no URL is rediss://"), "{m}");
        let m = tls_error(
            RedisBackend::builder("redis://127.0.0.1:6379").tls_client_cert("c.pem", "c.key"),
        );
        assert!(m.contains("no URL is rediss://"), "{m}");
        let m = tls_error(RedisBackend::builder(
            "rediss://127.0.0.1:7000,redis://127.0.0.1:7001",
        ));
        assert!(m.contains("some URLs are rediss://"), "{m}");
    }

    #[test]
    fn tls_files_with_a_sentinel_url_are_refused() {
        let m = tls_error(
            RedisBackend::builder("redis+sentinel://127.0.0.1:26379/mymaster")
                .tls_ca_file("ca.pem"),
        );
        assert!(m.contains("TLS through Sentinel is not supported"), "{m}");
        let m = tls_error(
            RedisBackend::builder("redis+sentinel://127.0.0.1:26379/mymaster")
                .tls_client_cert("c.pem", "c.key"),
        );
        assert!(m.contains("TLS through Sentinel is not supported"), "{m}");
    }

    #[test]
    fn plain_urls_need_no_tls() {
        let b = RedisBackend::builder("redis://127.0.0.1:6379").build();
        assert!(b.is_ok(), "{b:?}");
    }

    #[test]
    fn the_tls_scheme_is_recognised_in_any_case() {
        assert!(is_tls("rediss://127.0.0.1:6380"));
        assert!(is_tls("REDISS://127.0.0.1:6380"));
        assert!(!is_tls("redis://127.0.0.1:6379"));
        assert!(!is_tls("rediss:/x"));
        assert!(!is_tls(""));
    }
}
