//! An axum app limited through Redis: run several copies on different ports against one
//! Redis and they enforce one limit together.
//!
//! ```text
//! cargo run -p turnstile-examples --example axum_redis -- --port 3001
//! cargo run -p turnstile-examples --example axum_redis -- --port 3011 --key header:x-api-key
//! for i in $(seq 12); do curl -s -o /dev/null -w '%{http_code}\n' http://127.0.0.1:3001/; done
//! ```
//!
//! With `--config FILE` the file's key, rules, policies and tiers (see
//! `examples/turnstile.toml`) replace `--algorithm`, `--limit`, `--period`, `--burst` and
//! `--key`; its `[backend]` settings (`url`, `prefix`, `timeout`, `failure`, `tls_ca`,
//! `tls_cert`, `tls_key`), where given, take the place of `--redis-url`, `--prefix`,
//! `--redis-timeout`, `--failure`, `--tls-ca`, `--tls-cert` and `--tls-key`.
//!
//! `--redis-url` takes `redis://`, comma-separated URLs for a Cluster, or
//! `redis+sentinel://host:port[,host:port...]/service` for the primary Redis Sentinel names.
//!
//! Over TLS, with a private CA and a client certificate (mutual TLS):
//!
//! ```text
//! cargo run -p turnstile-examples --example axum_redis -- --redis-url rediss://redis.internal:6380 \
//!     --tls-ca ca.pem --tls-cert client.pem --tls-key client.key
//! ```

#[path = "common.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use axum::{routing::get, Router};
use clap::Parser;
use http::Request;
use tower_turnstile::config::LayerConfig;
use tower_turnstile::key::{HeaderKey, KeyError, KeyExtractor, PeerIp};
use tower_turnstile::wrap::DenyCache;
use tower_turnstile::{Algorithm, FailurePolicy, Policy, RateLimitLayer};
use turnstile_redis::{RedisBackend, RedisBackendBuilder};

/// Serves `GET /` on 127.0.0.1, rate-limited through Redis.
#[derive(Parser, Debug)]
struct Args {
    /// TCP port to listen on (127.0.0.1).
    #[arg(long, default_value_t = 3001)]
    port: u16,
    /// Redis URL (several comma-separated URLs for a Cluster;
    /// redis+sentinel://host:port[,host:port...]/service for Sentinel).
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    redis_url: String,
    /// With a rediss:// URL: the PEM file of the CA certificate(s) that verify Redis, in
    /// place of the system trust store.
    #[arg(long, value_name = "FILE")]
    tls_ca: Option<PathBuf>,
    /// With a rediss:// URL: the PEM file of a client certificate, for mutual TLS.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The PEM file of --tls-cert's private key.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// The timeout of each Redis call: <integer><unit>, unit ms, s, m, h or d (the
    /// backend's default is 100ms). A check that takes longer fails and goes to the failure
    /// policy.
    #[arg(long, default_value = "100ms", value_parser = parse_period)]
    redis_timeout: Duration,
    /// Key prefix in Redis (no braces).
    #[arg(long, default_value = turnstile_redis::DEFAULT_PREFIX)]
    prefix: String,
    /// token-bucket, gcra, leaky-bucket, fixed-window, sliding-log or sliding-window.
    #[arg(long, default_value = "token-bucket", value_parser = parse_algorithm)]
    algorithm: Algorithm,
    /// Requests admitted per period.
    #[arg(long, default_value_t = 10)]
    limit: u64,
    /// The period: <integer><unit>, unit ms, s, m, h or d.
    #[arg(long, default_value = "60s", value_parser = parse_period)]
    period: Duration,
    /// Bucket capacity (bucket algorithms; defaults to the limit).
    #[arg(long)]
    burst: Option<u64>,
    /// What a request is counted by: `ip` (the peer address) or `header:NAME`.
    #[arg(long, default_value = "ip", value_parser = parse_key)]
    key: KeySource,
    /// When Redis fails: `local` (decide in memory on this node until Redis is back),
    /// `open` (admit) or `closed` (answer 503).
    #[arg(long, default_value_t = FailurePolicy::Local)]
    failure: FailurePolicy,
    /// A turnstile configuration file (TOML) whose key, rules and policies replace the flags
    /// above; its [backend] settings, where given, replace --redis-url, --prefix,
    /// --redis-timeout and --failure.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["algorithm", "limit", "period", "burst", "key"])]
    config: Option<PathBuf>,
}

fn parse_algorithm(s: &str) -> Result<Algorithm, String> {
    s.parse()
        .map_err(|e: tower_turnstile::InvalidPolicy| e.to_string())
}

fn parse_period(s: &str) -> Result<Duration, String> {
    tower_turnstile::turnstile_core::policy::parse_duration(s).map_err(|e| e.to_string())
}

/// `ip` or `header:NAME`.
#[derive(Clone, Debug)]
enum KeySource {
    Ip(PeerIp),
    Header(HeaderKey, String),
}

fn parse_key(s: &str) -> Result<KeySource, String> {
    match s.split_once(':') {
        None if s == "ip" => Ok(KeySource::Ip(PeerIp::new())),
        Some(("header", name)) => HeaderKey::named(name)
            .map(|k| KeySource::Header(k, name.to_owned()))
            .map_err(|e| format!("{name:?} is not a header name: {e}")),
        _ => Err(format!("{s:?}: expected `ip` or `header:NAME`")),
    }
}

impl KeyExtractor for KeySource {
    fn extract<B>(&self, req: &Request<B>) -> Result<String, KeyError> {
        match self {
            KeySource::Ip(k) => k.extract(req),
            KeySource::Header(k, _) => k.extract(req),
        }
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    common::main("axum_redis", run()).await
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    if let Some(path) = &args.config {
        return serve_config(&args, path).await;
    }

    let mut policy = Policy::new(args.algorithm, args.limit, args.period)?;
    if let Some(burst) = args.burst {
        policy = policy.with_burst(burst)?;
    }
    let policy = policy.with_name("per-client")?;
    let redis = with_tls(
        RedisBackend::builder(args.redis_url.as_str()),
        args.tls_ca.as_deref(),
        args.tls_cert.as_deref().zip(args.tls_key.as_deref()),
    )
    .prefix(args.prefix.as_str())
    .timeout(args.redis_timeout)
    .build()?;
    // Repeated denials are answered on this node without asking Redis again.
    let layer = RateLimitLayer::builder()
        .policy(policy.clone())
        .backend(DenyCache::new(redis))
        .key(args.key.clone())
        .on_backend_failure(args.failure)
        .build()?;
    let app = app(layer);

    let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.port)).await?;
    let url = format!("http://{}/", listener.local_addr()?);
    let key = match &args.key {
        KeySource::Ip(_) => "client IP".to_owned(),
        KeySource::Header(_, name) => format!("`{name}` header"),
    };
    println!(
        "turnstile axum_redis listening on {url} (GET /: {policy} per {key}; Redis {}; on Redis failure: {})",
        args.redis_url, args.failure
    );
    let try_it = match &args.key {
        KeySource::Ip(_) => String::new(),
        KeySource::Header(_, name) => format!(" -H '{name}: demo'"),
    };
    println!(
        "try it: for i in $(seq 12); do curl -s -o /dev/null -w '%{{http_code}}\\n'{try_it} {url}; done"
    );
    common::serve(listener, app).await
}

/// Serves the rules of the configuration file at `path` on Redis.
async fn serve_config(
    args: &Args,
    path: &std::path::Path,
) -> Result<(), Box<dyn std::error::Error>> {
    let config = LayerConfig::from_file(path)?;
    let b = config.backend();
    let redis_url = b.url().unwrap_or(&args.redis_url).to_owned();
    let failure = b.failure_setting().unwrap_or(args.failure);
    // The file's TLS files go with the file's url; else the flags' go with --redis-url.
    let (ca, client) = if b.url().is_some() {
        (b.tls_ca(), b.tls_client_cert())
    } else {
        (
            args.tls_ca.as_deref(),
            args.tls_cert.as_deref().zip(args.tls_key.as_deref()),
        )
    };
    let redis = with_tls(RedisBackend::builder(redis_url.as_str()), ca, client)
        .prefix(b.prefix().unwrap_or(&args.prefix))
        .timeout(b.timeout().unwrap_or(args.redis_timeout));
    // The file's key cap is the layer's; the backend must take keys as long.
    let redis = match b.max_key_bytes() {
        Some(n) => redis.max_key_bytes(n),
        None => redis,
    };
    let layer = config
        .builder()
        .backend(DenyCache::new(redis.build()?))
        .on_backend_failure(failure)
        .build()?;
    let app = app(layer);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.port)).await?;
    let url = format!("http://{}/", listener.local_addr()?);
    println!(
        "turnstile axum_redis listening on {url} (GET /: the rules of {}, key {}; Redis {redis_url}; on Redis failure: {failure})",
        path.display(),
        config.key().spec()
    );
    println!(
        "try it: for i in $(seq 12); do curl -s -o /dev/null -w '%{{http_code}}\\n' {url}; done"
    );
    common::serve(listener, app).await
}

/// The app: `GET /` behind `layer`.
fn app<K: KeyExtractor>(layer: RateLimitLayer<DenyCache<RedisBackend>, K>) -> Router {
    Router::new()
        .route("/", get(|| async { "Hello from turnstile on Redis!\n" }))
        .layer(layer)
}

/// `builder` with a CA file and a client certificate, where given.
fn with_tls(
    mut builder: RedisBackendBuilder,
    ca: Option<&Path>,
    client: Option<(&Path, &Path)>,
) -> RedisBackendBuilder {
    if let Some(ca) = ca {
        builder = builder.tls_ca_file(ca);
    }
    if let Some((cert, key)) = client {
        builder = builder.tls_client_cert(cert, key);
    }
    builder
}
