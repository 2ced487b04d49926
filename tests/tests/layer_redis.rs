//! The layer on the Redis backend: two servers (two "processes") sharing one Redis enforce
//! one limit, over real TCP, with the same responses as in memory.

use std::net::SocketAddr;
use std::time::Duration;

use axum::{routing::get, Router};
use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use turnstile::wrap::DenyCache;
use turnstile::{Policy, RateLimitLayer};
use turnstile_redis::RedisBackend;
use turnstile_tests::redis_server::TestRedis;

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    addr
}

#[tokio::test]
async fn two_servers_on_one_redis_share_one_limit() {
    let redis = TestRedis::get();
    let prefix = format!("turnstile-layer-test:{}", std::process::id());
    let policy = Policy::sliding_window(4, Duration::from_secs(60))
        .unwrap()
        .with_name("per-ip")
        .unwrap();
    let mut addrs = Vec::new();
    for _ in 0..2 {
        let backend = RedisBackend::builder(redis.url())
            .prefix(prefix.as_str())
            .build()
            .unwrap();
        let layer = RateLimitLayer::new(policy.clone()).backend(DenyCache::new(backend));
        addrs.push(
            serve(
                Router::new()
                    .route("/", get(|| async { "hi" }))
                    .layer(layer),
            )
            .await,
        );
    }
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let mut statuses = Vec::new();
    for i in 0..6 {
        let uri = format!("http://{}/", addrs[i % 2]).parse().unwrap();
        let res = client.get(uri).await.unwrap();
        statuses.push(res.status().as_u16());
        if res.status() == 429 {
            assert_eq!(res.headers()["ratelimit-policy"], "\"per-ip\";q=4;w=60");
            assert!(res.headers().contains_key("retry-after"));
        }
    }
    assert_eq!(statuses, [200, 200, 200, 200, 429, 429]);
    let backend = RedisBackend::builder(redis.url())
        .prefix(prefix.as_str())
        .build()
        .unwrap();
    let _ = backend.delete_prefix().await;
}
