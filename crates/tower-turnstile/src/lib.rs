//! Rate limiting for tower services — axum routers, tonic servers, plain hyper — done
//! properly: exact algorithms, one line to add, standard responses.
//!
//! ```toml
//! [dependencies]
//! tower-turnstile = "0.1"   # features: axum (default), tonic, metrics, config, redis, redis-tls, full
//! axum = "0.8"
//! tokio = { version = "1", features = ["macros", "rt-multi-thread", "net"] }
//! ```
//!
//! Rust 1.85; 1.88 with the features `tonic`, `redis`, `redis-tls` or `full`.
//!
//! # With axum
//!
//! ```no_run
//! use std::net::SocketAddr;
//! use std::time::Duration;
//! use axum::{routing::get, Router};
//! use tower_turnstile::{Policy, RateLimitLayer};
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     // 10 requests per 60 s per client IP, in memory.
//!     let per_ip = Policy::token_bucket(10, Duration::from_secs(60))?.with_name("per-ip")?;
//!     let app = Router::new()
//!         .route("/", get(|| async { "hello\n" }))
//!         .layer(RateLimitLayer::new(per_ip));
//!
//!     let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//!     // The client's address is the key: serve with connect info.
//!     axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//!     Ok(())
//! }
//! ```
//!
//! Every admitted response carries `RateLimit-Policy` and `RateLimit` headers
//! (draft-ietf-httpapi-ratelimit-headers-10); a denied request gets `429 Too Many Requests`
//! with `Retry-After` (RFC 9110) and an RFC 9457 problem body — or, for a gRPC call, a
//! trailers-only `RESOURCE_EXHAUSTED` with `google.rpc.RetryInfo` and `QuotaFailure` — and
//! never reaches the inner service. See [`RateLimitLayer`].
//!
//! # One limit for a fleet, in Redis
//!
//! With the feature `redis`, every process counts in one Redis (a single node, a Cluster, or
//! the primary Sentinel names): the same decisions as in memory, one atomic call each.
//!
//! ```no_run
//! # #[cfg(feature = "redis")]
//! # async fn doc() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use axum::{routing::get, Router};
//! use tower_turnstile::redis::RedisBackend;
//! use tower_turnstile::wrap::DenyCache;
//! use tower_turnstile::{Policy, RateLimitLayer};
//!
//! let redis = RedisBackend::builder("redis://127.0.0.1:6379").build()?;
//! let per_ip = Policy::token_bucket(10, Duration::from_secs(60))?.with_name("per-ip")?;
//! let app: Router = Router::new()
//!     .route("/", get(|| async { "hello\n" }))
//!     // A denial Redis gave is repeated on this node without asking Redis again.
//!     .layer(RateLimitLayer::new(per_ip).backend(DenyCache::new(redis)));
//! # let _ = app; Ok(()) }
//! # fn main() {}
//! ```
//!
//! # With tonic
//!
//! The same layer wraps a tonic server; with the feature `tonic` the key is the peer address
//! tonic records, and a denied call gets `RESOURCE_EXHAUSTED` with how long to wait.
//!
//! ```no_run
//! # #[cfg(feature = "tonic")]
//! # async fn doc() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use tonic::service::Routes;
//! use tonic::transport::Server;
//! use tower_turnstile::{Policy, RateLimitLayer};
//!
//! let per_ip = Policy::token_bucket(5, Duration::from_secs(60))?.with_name("per-ip")?;
//! // Your services: Routes::new(GreeterServer::new(MyGreeter)), ...
//! let routes = Routes::default();
//! Server::builder()
//!     .layer(RateLimitLayer::new(per_ip))
//!     .add_routes(routes)
//!     .serve("127.0.0.1:50051".parse()?)
//!     .await?;
//! # Ok(()) }
//! # fn main() {}
//! ```
//!
//! # The rest
//!
//! [`RateLimitLayer::builder`] configures the rest: [`Rule`]s per method, path or gRPC
//! service/method, each with its own policies and cost; keys from the [`key`] module (peer
//! or client IP behind trusted proxies, a header, the route, the gRPC method, a closure,
//! combinations); exempt keys; [`Action::Delay`] (wait instead of failing) and
//! [`Action::Shadow`] (dry run); custom denial responses; tiers per client or per request;
//! the [`FailurePolicy`]. The guides (keys and rules, responses, Redis in production, tiers,
//! the configuration file, metrics, pitfalls) are in the
//! [repository](https://github.com/turnstile-rs/turnstile#guides); every decision follows
//! [`SEMANTICS.md`](https://github.com/turnstile-rs/turnstile/blob/main/docs/SEMANTICS.md).
//!
//! # Features
//! - `axum` (default): keys from axum's `ConnectInfo<SocketAddr>` and `MatchedPath`.
//! - `tonic`: gRPC denial details built with tonic-types, keys from tonic's
//!   `TcpConnectInfo` (tonic 0.14 needs Rust 1.88). Without it gRPC calls get the same
//!   trailers-only response with the same details, encoded by turnstile.
//! - `metrics`: decisions by policy and outcome, backend latency and errors, missing keys,
//!   through the `metrics` facade; [`metrics`] lists every name and label.
//! - `config`: layers from a TOML file (`config::LayerConfig`; `turnstile check-config`
//!   validates one).
//! - `redis`: the Redis backend, `tower_turnstile::redis` (the `turnstile-redis` crate): one limit
//!   for a fleet (Rust 1.88).
//! - `redis-tls`: the Redis backend over TLS (`rediss://`, rustls with `ring`): the system
//!   trust store or a CA file, client certificates for mutual TLS (Rust 1.88).
//! - `full`: all of the above.
//!
//! # Tracing
//! Each backend check runs in a `DEBUG` span `rate_limit_check` (target `turnstile`) with
//! the key — hashed by default, see [`KeyLogging`] — the rule, its policies and cost, and
//! records the outcome, the configuration that applied, the wait of a denial and the
//! backend's latency (`backend_us`). With no subscriber interested it costs a level check.
//! Backend incidents are warned once per incident.
//!
//! The algorithms, policies and backends come from [`turnstile_core`], re-exported here under
//! its own name with its key types at the root; its backend wrappers are [`wrap`]
//! ([`wrap::DenyCache`] in front of a remote backend repeats its denials locally).

// On docs.rs (`--cfg docsrs`, nightly): show which feature each gated item needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

#[doc(no_inline)]
pub use turnstile_core;

mod action;
mod body;
mod builder;
mod check;
#[cfg(feature = "config")]
#[cfg_attr(docsrs, doc(cfg(feature = "config")))]
pub mod config;
mod decide;
mod error;
mod future;
mod grpc;
pub mod headers;
pub mod key;
mod layer;
mod limiter;
pub mod metrics;
mod naming;
mod response;
mod rule;
mod service;
mod tier;
mod trace;
mod waiting;

/// The Redis backend (feature `redis`): the `turnstile-redis` crate.
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use turnstile_redis as redis;

pub use action::Action;
pub use body::{RateLimitBody, ResponseBody};
pub use builder::RateLimitLayerBuilder;
pub use error::InvalidLayer;
pub use future::ResponseFuture;
pub use key::{KeyError, KeyExtractor, KeyLogging, MissingKey, PeerIp};
pub use layer::RateLimitLayer;
pub use response::{Denial, DenialBody, Protocol, QUOTA_EXCEEDED_TYPE};
pub use rule::Rule;
pub use service::RateLimit;
pub use tier::RequestTier;

pub use turnstile_core::wrap;
pub use turnstile_core::{
    Algorithm, Applied, Backend, BackendError, Clock, Decision, FailurePolicy, InvalidPolicy,
    KeyConfig, Limits, LimitsError, ManualClock, MemoryBackend, Policy, PolicyDecision, Quotas,
    Source, SpawnSweeperError, SystemClock, Unconfigured, MAX_POLICIES,
};
