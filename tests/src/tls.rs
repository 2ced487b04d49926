//! Certificates the TLS tests make for themselves (rcgen): a certificate authority, a server
//! certificate for `127.0.0.1` and `localhost` signed by it, and a client certificate for
//! mutual TLS, written as PEM files into a scratch folder removed on drop.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// A CA and the certificates it signed, as PEM files.
#[derive(Debug)]
pub struct TestPki {
    dir: PathBuf,
}

fn ca_params(name: &str) -> CertificateParams {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params
}

fn leaf_params(name: &str, sans: &[&str], usages: &[ExtendedKeyUsagePurpose]) -> CertificateParams {
    let sans: Vec<String> = sans.iter().map(|s| (*s).to_owned()).collect();
    let mut params = CertificateParams::new(sans).expect("leaf parameters");
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = usages.to_vec();
    params
}

fn write(dir: &Path, name: &str, pem: &str) {
    std::fs::write(dir.join(name), pem).unwrap_or_else(|e| panic!("writing {name}: {e}"));
}

impl TestPki {
    /// Makes `ca.pem`; `server.pem` and `server.key` (for `127.0.0.1` and `localhost`, usable
    /// as a server's and as a client's certificate) and
    /// `client.pem` and `client.key` signed by it; and `other-ca.pem`, a CA that signed
    /// nothing here (the wrong CA), with `other-client.pem` and `other-client.key` signed by
    /// that one.
    pub fn generate() -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "turnstile-tls-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("a scratch folder for certificates");

        let ca_key = KeyPair::generate().expect("a CA key");
        let params = ca_params("turnstile test CA");
        let ca_cert = params.self_signed(&ca_key).expect("the CA certificate");
        write(&dir, "ca.pem", &ca_cert.pem());
        let ca = Issuer::new(params, ca_key);

        let server_key = KeyPair::generate().expect("a server key");
        let server = leaf_params(
            "turnstile test server",
            &["127.0.0.1", "localhost"],
            // A Redis server also presents its certificate as a client, to the other nodes
            // of a Cluster (its TLS cluster bus) and to its master.
            &[
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        )
        .signed_by(&server_key, &ca)
        .expect("the server certificate");
        write(&dir, "server.pem", &server.pem());
        write(&dir, "server.key", &server_key.serialize_pem());

        let client_key = KeyPair::generate().expect("a client key");
        let client = leaf_params(
            "turnstile test client",
            &[],
            &[ExtendedKeyUsagePurpose::ClientAuth],
        )
        .signed_by(&client_key, &ca)
        .expect("the client certificate");
        write(&dir, "client.pem", &client.pem());
        write(&dir, "client.key", &client_key.serialize_pem());

        let other_key = KeyPair::generate().expect("another CA key");
        let other_params = ca_params("another test CA");
        let other_cert = other_params.self_signed(&other_key).expect("another CA");
        write(&dir, "other-ca.pem", &other_cert.pem());
        let other = Issuer::new(other_params, other_key);
        let other_client_key = KeyPair::generate().expect("another client key");
        let other_client = leaf_params(
            "client of another CA",
            &[],
            &[ExtendedKeyUsagePurpose::ClientAuth],
        )
        .signed_by(&other_client_key, &other)
        .expect("another client certificate");
        write(&dir, "other-client.pem", &other_client.pem());
        write(&dir, "other-client.key", &other_client_key.serialize_pem());

        TestPki { dir }
    }

    /// The path of one of the files, e.g. `ca.pem`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Writes `text` into a new file `name` in the folder (for malformed files) and returns
    /// its path.
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        write(&self.dir, name, text);
        self.path(name)
    }

    /// `redis-server` arguments serving `server.pem` and trusting `ca.pem` for client
    /// certificates, which it requires when `auth_clients` (`--tls-auth-clients yes|no`).
    pub fn server_args(&self, auth_clients: bool) -> Vec<String> {
        let p = |name: &str| self.path(name).display().to_string();
        vec![
            "--tls-cert-file".into(),
            p("server.pem"),
            "--tls-key-file".into(),
            p("server.key"),
            "--tls-ca-cert-file".into(),
            p("ca.pem"),
            "--tls-auth-clients".into(),
            if auth_clients { "yes" } else { "no" }.into(),
        ]
    }
}

impl Drop for TestPki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
