//! The Redis backend over TLS (`rediss://`) against `redis-server --port 0 --tls-port P`
//! processes these tests start, with a CA and certificates they make (rcgen): server
//! verification with the right and the wrong CA, mutual TLS with and without a client
//! certificate, `#insecure`, TLS 1.2, a Cluster over mutual TLS, and every misconfiguration
//! refused at build.
//!
//! Issue 12, item 7: the first `rediss://` connection panicked (no rustls crypto provider),
//! no CA or client certificate could be given, and `#insecure` was refused as a script error.

use std::path::Path;
use std::time::Duration;

use turnstile_core::{BackendError, Decision, Policy};
use turnstile_redis::{InvalidRedisConfig, RedisBackend, RedisBackendBuilder};
use turnstile_tests::redis_server::RedisServer;
use turnstile_tests::tls::TestPki;

fn policy() -> Policy {
    "fixed-window:limit=5,period=1h".parse().unwrap()
}

fn builder(url: &str) -> RedisBackendBuilder {
    RedisBackend::builder(url)
        .prefix(format!("turnstile:test:tls:{}", std::process::id()))
        .timeout(Duration::from_secs(5))
}

fn tls_server(pki: &TestPki, auth_clients: bool, extra: &[&str]) -> RedisServer {
    let mut args = pki.server_args(auth_clients);
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    RedisServer::start_tls(&args)
}

/// Two checks of one key on `backend`: the decisions, or the first error.
async fn two_checks(backend: &RedisBackend, key: &str) -> Result<[Decision; 2], BackendError> {
    let pol = [policy()];
    let first = backend.check_on_redis(key, &pol, 1, None).await?.1;
    let second = backend.check_on_redis(key, &pol, 1, None).await?.1;
    Ok([first, second])
}

/// Both checks admitted, with the remaining counts of a fresh limit of 5: the state lives
/// on the TLS server.
fn assert_admitted(result: Result<[Decision; 2], BackendError>) {
    let [a, b] = result.expect("both checks answered over TLS");
    assert!(a.allowed() && b.allowed(), "{a:?} {b:?}");
    assert_eq!((a.remaining(), b.remaining()), (4, 3));
}

/// The check failed as a connection failure (the failure policy's "unreachable"), never a
/// script error, and the message says why.
fn assert_connection_error(result: Result<[Decision; 2], BackendError>, why: &str) {
    match result {
        Err(BackendError::Connection(e)) => {
            let text = e.to_string();
            assert!(text.contains(why), "{why:?} not in {text:?}");
        }
        other => panic!("expected a connection error ({why}), got {other:?}"),
    }
}

fn tls_error(result: Result<RedisBackend, InvalidRedisConfig>) -> String {
    match result {
        Err(InvalidRedisConfig::Tls(message)) => message,
        other => panic!("expected InvalidRedisConfig::Tls, got {other:?}"),
    }
}

#[tokio::test]
async fn issue12_first_rediss_check_needs_no_crypto_provider_from_the_application() {
    // Before: rustls found no process-level crypto provider and the first connection
    // panicked (exit 101). The builder now installs ring's unless the application chose one.
    let pki = TestPki::generate();
    let server = tls_server(&pki, false, &[]);
    let backend = builder(&server.url())
        .tls_ca_file(pki.path("ca.pem"))
        .build()
        .unwrap();
    assert_admitted(two_checks(&backend, "first").await);
    assert!(rustls::crypto::CryptoProvider::get_default().is_some());
}

#[tokio::test]
async fn the_wrong_ca_fails_every_check_with_a_connection_error() {
    let pki = TestPki::generate();
    let server = tls_server(&pki, false, &[]);
    let backend = builder(&server.url())
        .tls_ca_file(pki.path("other-ca.pem"))
        .build()
        .unwrap();
    assert_connection_error(two_checks(&backend, "wrong-ca").await, "UnknownIssuer");
}

#[tokio::test]
async fn a_private_ca_is_not_trusted_by_the_system_store() {
    // No CA file: the system trust store (here Debian's) is read at build and does not hold
    // the tests' CA.
    let pki = TestPki::generate();
    let server = tls_server(&pki, false, &[]);
    let backend = builder(&server.url()).build().unwrap();
    assert_connection_error(two_checks(&backend, "system-store").await, "UnknownIssuer");
}

#[tokio::test]
async fn the_server_name_is_verified() {
    // The certificate names 127.0.0.1 and localhost, not 127.0.0.2 (which reaches the same
    // server).
    let pki = TestPki::generate();
    let server = tls_server(&pki, false, &["--bind", "127.0.0.1 127.0.0.2"]);
    let url = server.url().replace("127.0.0.1", "127.0.0.2");
    let backend = builder(&url)
        .tls_ca_file(pki.path("ca.pem"))
        .build()
        .unwrap();
    assert_connection_error(
        two_checks(&backend, "name").await,
        "certificate not valid for name",
    );
    let by_name = server.url().replace("127.0.0.1", "localhost");
    let backend = builder(&by_name)
        .tls_ca_file(pki.path("ca.pem"))
        .build()
        .unwrap();
    assert_admitted(two_checks(&backend, "name").await);
}

#[tokio::test]
async fn mutual_tls_works_with_the_client_certificate() {
    let pki = TestPki::generate();
    let server = tls_server(&pki, true, &[]);
    let backend = builder(&server.url())
        .tls_ca_file(pki.path("ca.pem"))
        .tls_client_cert(pki.path("client.pem"), pki.path("client.key"))
        .build()
        .unwrap();
    assert_admitted(two_checks(&backend, "mtls").await);
}

#[tokio::test]
async fn mutual_tls_fails_without_a_client_certificate() {
    let pki = TestPki::generate();
    let server = tls_server(&pki, true, &[]);
    let backend = builder(&server.url())
        .tls_ca_file(pki.path("ca.pem"))
        .build()
        .unwrap();
    assert_connection_error(
        two_checks(&backend, "no-cert").await,
        "received fatal alert: CertificateRequired",
    );
}

#[tokio::test]
async fn mutual_tls_fails_with_a_client_certificate_of_another_ca() {
    let pki = TestPki::generate();
    let server = tls_server(&pki, true, &[]);
    let backend = builder(&server.url())
        .tls_ca_file(pki.path("ca.pem"))
        .tls_client_cert(pki.path("other-client.pem"), pki.path("other-client.key"))
        .build()
        .unwrap();
    assert_connection_error(
        two_checks(&backend, "other-cert").await,
        "received fatal alert: UnknownCA",
    );
}

#[tokio::test]
async fn a_client_certificate_the_server_does_not_ask_for_is_harmless() {
    let pki = TestPki::generate();
    let server = tls_server(&pki, false, &[]);
    let backend = builder(&server.url())
        .tls_ca_file(pki.path("ca.pem"))
        .tls_client_cert(pki.path("client.pem"), pki.path("client.key"))
        .build()
        .unwrap();
    assert_admitted(two_checks(&backend, "unasked").await);
}

#[tokio::test]
async fn issue12_insecure_url_connects_without_verification() {
    // Before: `#insecure` needed a redis-rs feature the `tls` feature did not turn on, and the
    // refusal was reported as a script error.
    let pki = TestPki::generate();
    let server = tls_server(&pki, false, &[]);
    let backend = builder(&format!("{}/#insecure", server.url()))
        .build()
        .unwrap();
    assert_admitted(two_checks(&backend, "insecure").await);
}

#[tokio::test]
async fn insecure_with_a_client_certificate_passes_mutual_tls() {
    let pki = TestPki::generate();
    let server = tls_server(&pki, true, &[]);
    let backend = builder(&format!("{}/#insecure", server.url()))
        .tls_client_cert(pki.path("client.pem"), pki.path("client.key"))
        .build()
        .unwrap();
    assert_admitted(two_checks(&backend, "insecure-mtls").await);
}

#[tokio::test]
async fn a_server_with_only_tls_1_2_is_reached() {
    let pki = TestPki::generate();
    let server = tls_server(&pki, false, &["--tls-protocols", "TLSv1.2"]);
    let backend = builder(&server.url())
        .tls_ca_file(pki.path("ca.pem"))
        .build()
        .unwrap();
    assert_admitted(two_checks(&backend, "tls12").await);
}

#[tokio::test]
async fn a_server_restarted_with_the_same_certificates_is_reached_again() {
    let pki = TestPki::generate();
    let mut server = tls_server(&pki, true, &[]);
    let backend = builder(&server.url())
        .tls_ca_file(pki.path("ca.pem"))
        .tls_client_cert(pki.path("client.pem"), pki.path("client.key"))
        .build()
        .unwrap();
    assert_admitted(two_checks(&backend, "restart").await);
    server.kill();
    let down = backend
        .check_on_redis("restart", &[policy()], 1, None)
        .await;
    assert!(matches!(down, Err(BackendError::Connection(_))), "{down:?}");
    server.restart();
    // A fresh server (no persistence): the key starts over, over a new TLS connection.
    assert_admitted(two_checks(&backend, "restart").await);
}

#[test]
fn tls_misconfigurations_are_typed_errors_at_build() {
    let pki = TestPki::generate();
    let ca = pki.path("ca.pem");
    let url = "rediss://127.0.0.1:6380";
    let missing = pki.path("missing.pem");
    let garbage = pki.write("garbage.pem", "not a certificate\n");
    let bad_base64 = pki.write(
        "bad-base64.pem",
        "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n",
    );
    let not_der = pki.write(
        "not-der.pem",
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    );
    let encrypted = pki.write(
        "encrypted.key",
        "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n",
    );
    let cases: Vec<(&str, RedisBackendBuilder, &str)> = vec![
        (
            "missing CA file",
            builder(url).tls_ca_file(&missing),
            "cannot read the CA file",
        ),
        (
            "CA file without a certificate",
            builder(url).tls_ca_file(&garbage),
            "holds no certificate",
        ),
        (
            "CA file with bad base64",
            builder(url).tls_ca_file(&bad_base64),
            "not valid PEM",
        ),
        (
            "CA file with a block that is no certificate",
            builder(url).tls_ca_file(&not_der),
            "cannot be a trust anchor",
        ),
        (
            "a key file as the CA file",
            builder(url).tls_ca_file(pki.path("client.key")),
            "holds no certificate",
        ),
        (
            "missing client certificate",
            builder(url)
                .tls_ca_file(&ca)
                .tls_client_cert(&missing, pki.path("client.key")),
            "cannot read the client certificate file",
        ),
        (
            "missing client key",
            builder(url)
                .tls_ca_file(&ca)
                .tls_client_cert(pki.path("client.pem"), &missing),
            "cannot read the client key file",
        ),
        (
            "a certificate as the client key",
            builder(url)
                .tls_ca_file(&ca)
                .tls_client_cert(pki.path("client.pem"), pki.path("client.pem")),
            "holds no unencrypted private key",
        ),
        (
            "an encrypted client key",
            builder(url)
                .tls_ca_file(&ca)
                .tls_client_cert(pki.path("client.pem"), &encrypted),
            "holds no unencrypted private key",
        ),
        (
            "a key as the client certificate",
            builder(url)
                .tls_ca_file(&ca)
                .tls_client_cert(pki.path("client.key"), pki.path("client.key")),
            "holds no certificate",
        ),
        (
            "a key that is not the certificate's",
            builder(url)
                .tls_ca_file(&ca)
                .tls_client_cert(pki.path("client.pem"), pki.path("other-client.key")),
            "cannot be used together",
        ),
        (
            "a CA file with redis://",
            builder("redis://127.0.0.1:6379").tls_ca_file(&ca),
            "no URL is rediss://",
        ),
        (
            "a client certificate with redis://",
            builder("redis://127.0.0.1:6379")
                .tls_client_cert(pki.path("client.pem"), pki.path("client.key")),
            "no URL is rediss://",
        ),
        (
            "a CA file with #insecure",
            builder("rediss://127.0.0.1:6380/#insecure").tls_ca_file(&ca),
            "#insecure",
        ),
        (
            "rediss:// and redis:// nodes mixed",
            builder("rediss://127.0.0.1:7000,redis://127.0.0.1:7001"),
            "some URLs are rediss://",
        ),
    ];
    for (name, b, expected) in cases {
        let message = tls_error(b.build());
        assert!(
            message.contains(expected),
            "{name}: {expected:?} not in {message:?}"
        );
    }
    // The paths are named, so the operator knows which file.
    let message = tls_error(builder(url).tls_ca_file(&garbage).build());
    assert!(
        message.contains(&garbage.display().to_string()),
        "{message}"
    );
    // Files are read at build, not at each connection: a path read once is not needed
    // afterwards.
    let copy = pki.write("copy.pem", &std::fs::read_to_string(&ca).unwrap());
    let b = builder(url).tls_ca_file(&copy).build();
    assert!(b.is_ok(), "{b:?}");
    std::fs::remove_file(Path::new(&copy)).unwrap();
}

#[tokio::test]
async fn issue12_a_connection_that_cannot_be_set_up_is_a_connection_error_not_a_script_error() {
    // The kind of the `#insecure` report: an error while making a connection (TLS, or the
    // AUTH redis-rs sends when it connects) is the failure policy's "unreachable", reported
    // as such, not as the check script's failure.
    let server = RedisServer::start_with(&["--requirepass", "secret"]);
    let wrong = format!("redis://:wrong@127.0.0.1:{}", server.port());
    let backend = builder(&wrong).build().unwrap();
    let r = backend.check_on_redis("auth", &[policy()], 1, None).await;
    assert!(matches!(r, Err(BackendError::Connection(_))), "{r:?}");
    let right = format!("redis://:secret@127.0.0.1:{}", server.port());
    let backend = builder(&right).build().unwrap();
    assert_admitted(two_checks(&backend, "auth").await);

    // TLS spoken to a plain server (which waits for a command's end: the handshake times
    // out), and plain spoken to a TLS server (which hangs up).
    let url = format!("rediss://localhost:{}/#insecure", server.port());
    let backend = builder(&url)
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let r = backend.check_on_redis("auth", &[policy()], 1, None).await;
    assert!(
        matches!(
            r,
            Err(BackendError::Connection(_) | BackendError::Timeout { .. })
        ),
        "{r:?}"
    );
    let pki = TestPki::generate();
    let tls = tls_server(&pki, false, &[]);
    let plain = tls.url().replace("rediss://", "redis://");
    let backend = builder(&plain).build().unwrap();
    let r = backend.check_on_redis("auth", &[policy()], 1, None).await;
    assert!(matches!(r, Err(BackendError::Connection(_))), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue12_a_cluster_connection_that_cannot_be_set_up_is_a_connection_error() {
    // The same kind on a Cluster (one redis-rs Cluster connection): the wrong password makes
    // the Cluster connection fail at AUTH, which is the node's unreachability, not a script
    // error; the right password then works on every node.
    use turnstile_tests::redis_server::{command, RedisCluster};

    let cluster = RedisCluster::start(3);
    for node in cluster.nodes() {
        let r = command(node.port(), "CONFIG SET requirepass secret").unwrap();
        assert_eq!(r.trim(), "+OK", "node {}", node.port());
    }
    let with = |password: &str| {
        cluster
            .nodes()
            .iter()
            .map(|n| format!("redis://:{password}@127.0.0.1:{}", n.port()))
            .collect::<Vec<_>>()
            .join(",")
    };
    let wrong = builder(&with("wrong")).build().unwrap();
    for key in ["a", "b", "c"] {
        let r = wrong.check_on_redis(key, &[policy()], 1, None).await;
        assert!(
            matches!(r, Err(BackendError::Connection(_))),
            "{key}: {r:?}"
        );
    }
    let right = builder(&with("secret")).build().unwrap();
    for i in 0..10 {
        assert_admitted(two_checks(&right, &format!("client-{i}")).await);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_over_mutual_tls_gets_the_certificates_on_every_node() {
    use turnstile_tests::redis_server::RedisCluster;

    let pki = TestPki::generate();
    let cluster = RedisCluster::start_tls(3, &pki);
    let urls = cluster.tls_urls();
    let backend = builder(&urls)
        .tls_ca_file(pki.path("ca.pem"))
        .tls_client_cert(pki.path("client.pem"), pki.path("client.key"))
        .build()
        .unwrap();
    // Keys in many slots, so every node is asked (redis-rs connects to the nodes the
    // topology names with the same certificates).
    for i in 0..30 {
        assert_admitted(two_checks(&backend, &format!("client-{i}")).await);
    }
    for node in cluster.nodes() {
        let keys = turnstile_tests::redis_server::command(node.port(), "DBSIZE").unwrap();
        assert_ne!(
            keys.trim(),
            ":0",
            "node {} holds none of the keys",
            node.port()
        );
    }
    // Without the client certificate, or with the wrong CA: connection errors.
    let no_cert = builder(&urls)
        .tls_ca_file(pki.path("ca.pem"))
        .build()
        .unwrap();
    let r = no_cert.check_on_redis("k", &[policy()], 1, None).await;
    assert!(matches!(r, Err(BackendError::Connection(_))), "{r:?}");
    let wrong_ca = builder(&urls)
        .tls_ca_file(pki.path("other-ca.pem"))
        .tls_client_cert(pki.path("client.pem"), pki.path("client.key"))
        .build()
        .unwrap();
    let r = wrong_ca.check_on_redis("k", &[policy()], 1, None).await;
    assert!(matches!(r, Err(BackendError::Connection(_))), "{r:?}");
}
