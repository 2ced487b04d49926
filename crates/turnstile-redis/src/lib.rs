//! The Redis backend of [turnstile]: one limit for a whole fleet, on a single Redis node, a
//! Redis Cluster, or the primary Redis Sentinel names (feature `sentinel`). Redis 5.0 or later
//! ([`MIN_REDIS_VERSION`]); failover, restarts and overload are handled as
//! [`RedisBackend`]'s docs say, and the guide to running it in production is
//! [`docs/redis.md`](https://github.com/turnstile-rs/turnstile/blob/main/docs/redis.md).
//!
//! With the tower layer, enable the `redis` feature of `tower-turnstile` (`tower_turnstile::redis` is this
//! crate) and pass the backend to `RateLimitLayer::backend`. On its own:
//!
//! ```toml
//! [dependencies]
//! turnstile-redis = "0.1"   # features: tls, tls-webpki-roots, sentinel, metrics
//! turnstile-core = "0.1"
//! tokio = { version = "1", features = ["macros", "rt-multi-thread"] }
//! ```
//!
//! Rust 1.88 (the `redis` crate 1.8 needs it).
//!
//! ```no_run
//! use std::time::Duration;
//! use turnstile_core::{wrap::DenyCache, Backend, Policy};
//! use turnstile_redis::RedisBackend;
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let redis = RedisBackend::builder("redis://127.0.0.1:6379")
//!         .prefix("myapp:turnstile:v1")
//!         .build()?;
//!     // Repeated denials answered locally, without asking Redis again.
//!     let redis = DenyCache::new(redis);
//!     let policies = [
//!         Policy::token_bucket(10, Duration::from_secs(1))?.with_name("per-second")?,
//!         Policy::sliding_window(1000, Duration::from_secs(3600))?.with_name("per-hour")?,
//!     ];
//!     let d = redis.check("client-42", &policies, 1).await?;
//!     println!("allowed={} remaining={}", d.allowed(), d.remaining());
//!     Ok(())
//! }
//! ```
//!
//! Every decision is made by one atomic call of turnstile's Lua (the files in `lua/`): an
//! `FCALL` of its Redis Function library ([`library()`]) on Redis 7, an `EVALSHA` of the same
//! Lua composed into one script ([`CHECK_SCRIPT`]) where Functions are refused or
//! [`ScriptMode::Eval`] asks for it,
//! following the project's [`SEMANTICS.md`] exactly, as the in-memory backend does: the two
//! give the same decisions for the same requests at the same times. Lua numbers are doubles,
//! so the scripts keep every intermediate below 2^53 and divide with `math.fmod`.
//!
//! # TLS
//! With the `tls` feature, `rediss://` URLs connect over TLS 1.2 or 1.3 (RFC 5246, RFC 8446)
//! with rustls and its `ring` crypto provider, which [`RedisBackendBuilder::build`] installs
//! as the process default unless the application installed one first. The server's
//! certificate is verified (RFC 5280 paths, RFC 6125 names) against the CA file given to
//! [`RedisBackendBuilder::tls_ca_file`], else the system trust store (`SSL_CERT_FILE` and
//! `SSL_CERT_DIR` when set, else the OS store), or with `tls-webpki-roots` the Mozilla roots
//! compiled in. [`RedisBackendBuilder::tls_client_cert`] gives a client certificate for mutual
//! TLS. `rediss://host:port/#insecure` turns verification off (any certificate, any name).
//! Every file is read and checked at build: what cannot work is an
//! [`InvalidRedisConfig::Tls`] then, never a panic or an error at the first check. A single
//! node and every node of a Cluster use the certificates; Sentinel (`redis+sentinel://`) has
//! no TLS here, and TLS files with a Sentinel URL are refused.
//!
//! [turnstile]: https://github.com/turnstile-rs/turnstile
//! [`SEMANTICS.md`]: https://github.com/turnstile-rs/turnstile/blob/main/docs/SEMANTICS.md

// On docs.rs (`--cfg docsrs`, nightly): show which feature each gated item needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod backend;
mod builder;
mod call;
mod cluster;
mod coalesce;
mod conn;
mod connector;
mod dispatch;
mod error;
mod fault;
mod health;
mod keys;
mod library;
mod quotas;
mod sentinel;
mod server;
mod target;
mod tls;
mod wire;

pub use backend::{CheckFuture, RedisBackend, RedisStats, SIMULATION_MIN_TTL};
pub use builder::{
    RedisBackendBuilder, DEFAULT_BATCH_EVALUATIONS, DEFAULT_PREFIX, DEFAULT_RETRY_INTERVAL,
    DEFAULT_TIMEOUT, MAX_BATCH_EVALUATIONS,
};
pub use error::{InvalidRedisConfig, TlsHandshakeError};
pub use health::{NodeDown, DEFAULT_FAILURE_THRESHOLD};
pub use keys::KeyEncoding;
pub use library::{library, FunctionLibrary, ScriptMode};
/// The `redis` crate this backend is built on (its `Value`, errors and URLs appear in this API).
pub use redis;
pub use server::{UnsupportedRedisVersion, MIN_REDIS_VERSION};
pub use wire::{BATCH_SCRIPT, CHECK_SCRIPT, CONFIG_SCRIPT};
