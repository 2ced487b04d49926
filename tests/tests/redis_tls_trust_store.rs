//! Without a CA file, `rediss://` trusts the system trust store, which `SSL_CERT_FILE`
//! replaces (rustls-native-certs, as OpenSSL does). One test in its own binary: it sets
//! `SSL_CERT_FILE`, which every TLS backend of the process reads.

use std::time::Duration;

use turnstile_core::{BackendError, Policy};
use turnstile_redis::{InvalidRedisConfig, RedisBackend};
use turnstile_tests::redis_server::RedisServer;
use turnstile_tests::tls::TestPki;

fn build(url: &str, ca: Option<&std::path::Path>) -> Result<RedisBackend, InvalidRedisConfig> {
    let mut b = RedisBackend::builder(url)
        .prefix(format!("turnstile:test:tls-store:{}", std::process::id()))
        .timeout(Duration::from_secs(5));
    if let Some(ca) = ca {
        b = b.tls_ca_file(ca);
    }
    b.build()
}

fn tls_message(result: Result<RedisBackend, InvalidRedisConfig>) -> String {
    match result {
        Err(InvalidRedisConfig::Tls(m)) => m,
        other => panic!("expected InvalidRedisConfig::Tls, got {other:?}"),
    }
}

#[tokio::test]
async fn ssl_cert_file_is_the_trust_store_and_a_broken_one_is_refused_at_build() {
    let pki = TestPki::generate();
    let args = pki.server_args(false);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = RedisServer::start_tls(&args);
    let url = server.url();
    let pol: [Policy; 1] = ["fixed-window:limit=5,period=1h".parse().unwrap()];
    std::env::remove_var("SSL_CERT_DIR");

    // The tests' CA as the system trust store: no CA file needed.
    std::env::set_var("SSL_CERT_FILE", pki.path("ca.pem"));
    let backend = build(&url, None).unwrap();
    let d1 = backend.check_on_redis("k", &pol, 1, None).await.unwrap().1;
    let d2 = backend.check_on_redis("k", &pol, 1, None).await.unwrap().1;
    assert!(d1.allowed() && d2.allowed());
    assert_eq!((d1.remaining(), d2.remaining()), (4, 3));

    // Another CA as the trust store: the server is not trusted.
    std::env::set_var("SSL_CERT_FILE", pki.path("other-ca.pem"));
    let backend = build(&url, None).unwrap();
    match backend.check_on_redis("k", &pol, 1, None).await {
        Err(BackendError::Connection(e)) => {
            assert!(e.to_string().contains("UnknownIssuer"), "{e}")
        }
        other => panic!("expected a connection error, got {other:?}"),
    }

    // A trust store file that does not exist: redis-rs would refuse every connection, so
    // the build does, with or without a CA file.
    std::env::set_var("SSL_CERT_FILE", pki.path("missing.pem"));
    let m = tls_message(build(&url, None));
    assert!(m.contains("system trust store cannot be read"), "{m}");
    let m = tls_message(build(&url, Some(&pki.path("ca.pem"))));
    assert!(m.contains("system trust store cannot be read"), "{m}");

    // An empty trust store: nothing could be verified without a CA file.
    std::env::set_var("SSL_CERT_FILE", pki.write("empty.pem", ""));
    let m = tls_message(build(&url, None));
    assert!(m.contains("holds no certificate"), "{m}");
    // With a CA file it is not needed; with #insecure nothing is verified.
    let backend = build(&url, Some(&pki.path("ca.pem"))).unwrap();
    let d = backend.check_on_redis("k", &pol, 1, None).await.unwrap().1;
    assert!(d.allowed());
    assert_eq!(d.remaining(), 2);
    let backend = build(&format!("{url}/#insecure"), None).unwrap();
    let d = backend.check_on_redis("k", &pol, 1, None).await.unwrap().1;
    assert!(d.allowed());
    assert_eq!(d.remaining(), 1);
    std::env::remove_var("SSL_CERT_FILE");
}
