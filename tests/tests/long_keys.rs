//! Regression (issue 25, fault 5): keys had no byte cap, so 100 KB and 300 KB keys were
//! accepted and 2,000 of them grew a process by 195 MB. A key longer than the backend takes
//! (512 bytes by default) is refused before any check — HTTP 400 with an RFC 9457 problem
//! body, gRPC `INVALID_ARGUMENT` — whatever `on_missing_key` says, in memory and in Redis;
//! a key at the cap is checked as any other. Real servers on loopback, real clients over TCP.

#[path = "../../examples/helloworld.rs"]
mod helloworld;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::{routing::get, Router};
use bytes::Bytes;
use http::HeaderValue;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic::Code;
use tower::ServiceBuilder;
use tower_turnstile::key::HeaderKey;
use tower_turnstile::redis::RedisBackend;
use tower_turnstile::{
    Backend, BackendError, MemoryBackend, MissingKey, Policy, Quotas, RateLimitLayer,
};
use turnstile_core::DEFAULT_MAX_KEY_BYTES;
use turnstile_tests::app_server::serve;
use turnstile_tests::redis_server::TestRedis;

/// The keys every test sends, with whether the layer must check it: at the cap and one byte
/// past it, 100 KB and 300 KB.
fn keys() -> [(String, bool); 4] {
    let of = |n: usize| "k".repeat(n);
    [
        (of(DEFAULT_MAX_KEY_BYTES), true),
        (of(DEFAULT_MAX_KEY_BYTES + 1), false),
        (of(100 * 1024), false),
        (of(300 * 1024), false),
    ]
}

/// A layer keyed by `x-api-key` over `backend`, admitting requests without the header
/// unchecked (which must not apply to keys too long).
fn layer<B: Backend>(backend: B) -> RateLimitLayer<B, HeaderKey> {
    RateLimitLayer::builder()
        .backend(backend)
        .key(HeaderKey::named("x-api-key").unwrap())
        .policy(
            "fixed-window:limit=10,period=1h,name=per-key"
                .parse::<Policy>()
                .unwrap(),
        )
        .on_missing_key(MissingKey::Allow)
        .build()
        .unwrap()
}

/// Each of [`keys`] sent to an axum app behind `layer` with hyper's client: 200 with the
/// rate-limit headers for the key at the cap; 400 with a problem body naming the sizes for
/// every longer one, which never reaches the handler.
async fn http_refuses_long_keys<B: Backend>(layer: RateLimitLayer<B, HeaderKey>) {
    let called = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&called);
    let app = Router::new()
        .route(
            "/",
            get(move || {
                seen.fetch_add(1, Ordering::Relaxed);
                async { "hello" }
            }),
        )
        .layer(layer);
    let addr = serve(app).await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    for (key, checked) in keys() {
        let req = http::Request::get(format!("http://{addr}/"))
            .header("x-api-key", &key)
            .body(Empty::new())
            .unwrap();
        let res = client.request(req).await.unwrap();
        if checked {
            assert_eq!(res.status(), 200, "{} bytes", key.len());
            // The fixed window is aligned to the epoch: `t` is what is left of the hour.
            let ratelimit = res.headers()["ratelimit"].to_str().unwrap();
            assert!(ratelimit.starts_with("\"per-key\";r=9;t="), "{ratelimit}");
            continue;
        }
        assert_eq!(res.status(), 400, "{} bytes", key.len());
        assert_eq!(
            res.headers()["content-type"],
            "application/problem+json",
            "{} bytes",
            key.len()
        );
        assert!(!res.headers().contains_key("ratelimit"));
        let body = res.into_body().collect().await.unwrap().to_bytes();
        let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(problem["status"], 400);
        assert_eq!(problem["title"], "Bad Request");
        assert_eq!(
            problem["detail"],
            format!(
                "turnstile: this request's rate-limit key is {} bytes, longer than the {DEFAULT_MAX_KEY_BYTES} bytes the limiter takes.",
                key.len()
            )
        );
    }
    assert_eq!(called.load(Ordering::Relaxed), 1, "only the key at the cap");
}

/// A tonic server behind `layer` that takes headers of up to 1 MiB (HTTP/2's default is
/// 16 KiB, which would refuse the long keys before the layer sees them).
async fn grpc_server<B: Backend>(layer: RateLimitLayer<B, HeaderKey>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        Server::builder()
            .http2_max_header_list_size(1 << 20)
            .layer(layer)
            .add_service(helloworld::Greeter)
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .unwrap();
    });
    addr
}

/// Each of [`keys`] sent as `x-api-key` metadata with tonic's client: the key at the cap is
/// answered, every longer one refused with `INVALID_ARGUMENT`.
async fn grpc_refuses_long_keys<B: Backend>(layer: RateLimitLayer<B, HeaderKey>) {
    let addr = grpc_server(layer).await;
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    for (key, checked) in keys() {
        let value = HeaderValue::from_str(&key).unwrap();
        let with_key = ServiceBuilder::new()
            .map_request(move |mut req: http::Request<tonic::body::Body>| {
                req.headers_mut().insert("x-api-key", value.clone());
                req
            })
            .service(channel.clone());
        let result = helloworld::say_hello(with_key, "world").await;
        if checked {
            let res = result.unwrap_or_else(|s| panic!("{} bytes: {s:?}", key.len()));
            assert_eq!(res.get_ref().message, "Hello world!");
            continue;
        }
        let status = result.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{} bytes", key.len());
        assert!(
            status.message().contains(&format!(
                "key is {} bytes, longer than the {DEFAULT_MAX_KEY_BYTES} bytes",
                key.len()
            )),
            "{status:?}"
        );
    }
}

#[tokio::test]
async fn long_keys_are_refused_over_http_in_memory() {
    let memory = MemoryBackend::new();
    http_refuses_long_keys(layer(memory.clone())).await;
    assert_eq!(memory.len(), 1, "only the key at the cap is stored");
}

#[tokio::test]
async fn long_keys_are_refused_over_grpc_in_memory() {
    let memory = MemoryBackend::new();
    grpc_refuses_long_keys(layer(memory.clone())).await;
    assert_eq!(memory.len(), 1, "only the key at the cap is stored");
}

fn redis_backend(redis: &TestRedis, prefix: &str) -> RedisBackend {
    RedisBackend::builder(redis.url())
        .prefix(prefix)
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap()
}

#[tokio::test]
async fn long_keys_are_refused_over_http_and_grpc_in_redis() {
    let redis = TestRedis::get();
    let http = redis_backend(&redis, "turnstile:test-long-keys-http");
    http.delete_prefix().await.unwrap();
    http_refuses_long_keys(layer(http)).await;
    let grpc = redis_backend(&redis, "turnstile:test-long-keys-grpc");
    grpc.delete_prefix().await.unwrap();
    grpc_refuses_long_keys(layer(grpc)).await;
}

/// The backends themselves: every check and quota operation of a key past the cap is a
/// typed error, and nothing is stored; the cap is the backend's to change.
#[tokio::test]
async fn the_backends_refuse_long_keys_with_a_typed_error() {
    let redis = TestRedis::get();
    let in_redis = redis_backend(&redis, "turnstile:test-long-keys-api");
    in_redis.delete_prefix().await.unwrap();
    refuses_long_keys(MemoryBackend::new()).await;
    refuses_long_keys(in_redis).await;

    // A cap of 1 KiB takes what 512 bytes refused.
    let key = "k".repeat(1024);
    let p: Policy = "gcra:limit=1,period=1s".parse().unwrap();
    let memory = MemoryBackend::builder().max_key_bytes(1024).build();
    assert_eq!(memory.max_key_bytes(), 1024);
    assert!(memory
        .check(&key, std::slice::from_ref(&p), 1)
        .await
        .unwrap()
        .allowed());
    let in_redis = RedisBackend::builder(redis.url())
        .prefix("turnstile:test-long-keys-api")
        .max_key_bytes(1024)
        .build()
        .unwrap();
    assert!(in_redis.check(&key, &[p], 1).await.unwrap().allowed());
    in_redis.delete_prefix().await.unwrap();
}

async fn refuses_long_keys<B: Quotas>(backend: B) {
    let p: Policy = "gcra:limit=5,period=1s".parse().unwrap();
    let limits = tower_turnstile::Limits::new([p.clone()]).unwrap();
    assert_eq!(backend.max_key_bytes(), DEFAULT_MAX_KEY_BYTES);
    let at_cap = "k".repeat(DEFAULT_MAX_KEY_BYTES);
    assert!(backend
        .check(&at_cap, std::slice::from_ref(&p), 1)
        .await
        .unwrap()
        .allowed());
    backend.reset(&at_cap, &limits, None).await.unwrap();
    for len in [DEFAULT_MAX_KEY_BYTES + 1, 300 * 1024] {
        let key = "k".repeat(len);
        let too_long = |e: BackendError| {
            assert!(
                matches!(e, BackendError::KeyTooLong { len: l, max } if l == len && max == DEFAULT_MAX_KEY_BYTES),
                "{e}"
            );
            assert_eq!(e.kind(), "key_too_long");
        };
        too_long(
            backend
                .check(&key, std::slice::from_ref(&p), 1)
                .await
                .unwrap_err(),
        );
        too_long(
            backend
                .check_at(&key, std::slice::from_ref(&p), 1, 0)
                .await
                .unwrap_err(),
        );
        too_long(backend.peek(&key, &limits, None).await.unwrap_err());
        too_long(backend.reset(&key, &limits, None).await.unwrap_err());
        too_long(backend.refund(&key, &limits, 1, None).await.unwrap_err());
        too_long(backend.config(&key).await.unwrap_err());
        too_long(
            backend
                .set_override(&key, std::slice::from_ref(&p))
                .await
                .unwrap_err(),
        );
        too_long(backend.remove_override(&key).await.unwrap_err());
        too_long(backend.set_tier(&key, Some("pro")).await.unwrap_err());
        too_long(backend.clear_config(&key).await.unwrap_err());
    }
}
