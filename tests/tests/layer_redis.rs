//! The layer on the Redis backend: two servers (two "processes") sharing one Redis enforce
//! one limit, over real TCP, with the same responses as in memory.

use std::time::Duration;

use axum::{routing::get, Router};
use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower_turnstile::wrap::DenyCache;
use tower_turnstile::{Policy, RateLimitLayer};
use turnstile_redis::RedisBackend;
use turnstile_tests::app_server::serve;
use turnstile_tests::redis_server::TestRedis;

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
        // A timeout no loaded machine reaches: each server's first check waits for its
        // backend's warm-up (connect, version, library) instead of deciding locally, so the
        // limit is the one Redis enforces (the cold start under a burst is
        // redis_cold_start.rs's).
        let backend = RedisBackend::builder(redis.url())
            .prefix(prefix.as_str())
            .timeout(Duration::from_secs(10))
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

/// A tier chosen per request reaches Redis as the check's defaults, so the script's own
/// order still holds: a key's stored override, then its stored tier, then the request's tier.
#[tokio::test]
async fn the_requests_tier_yields_to_a_keys_stored_override_and_tier_in_redis() {
    use tower::ServiceExt;
    use tower_turnstile::key::HeaderKey;
    use tower_turnstile::{Quotas, RequestTier};

    let redis = TestRedis::get();
    let prefix = format!("turnstile-request-tier-test:{}", std::process::id());
    let backend = RedisBackend::builder(redis.url())
        .prefix(prefix.as_str())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let p = |s: &str| s.parse::<Policy>().unwrap();
    let layer = RateLimitLayer::builder()
        .backend(backend.clone())
        .key(HeaderKey::named("x-api-key").unwrap())
        .policy(p("sliding-window:limit=1,period=1h,name=per-user"))
        .tier(
            "signed-in",
            [p("sliding-window:limit=2,period=1h,name=per-user")],
        )
        .tier(
            "premium",
            [p("sliding-window:limit=3,period=1h,name=per-user")],
        )
        .request_tier(
            |req| match req.headers().get("x-plan").map(|v| v.as_bytes()) {
                Some(b"premium") => RequestTier::named("premium"),
                Some(b"admin") => RequestTier::Unlimited,
                _ => RequestTier::Defaults,
            },
        )
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "hi" }))
        .layer(layer);
    let statuses = |key: &'static str, plan: &'static str, n: usize| {
        let app = app.clone();
        async move {
            let mut out = Vec::new();
            for _ in 0..n {
                let req = http::Request::builder()
                    .uri("/")
                    .header("x-api-key", key)
                    .header("x-plan", plan)
                    .body(axum::body::Body::empty())
                    .unwrap();
                out.push(app.clone().oneshot(req).await.unwrap().status().as_u16());
            }
            out
        }
    };
    backend
        .set_override(
            "ovr",
            &[p("sliding-window:limit=1,period=1h,name=per-user")],
        )
        .await
        .unwrap();
    backend.set_tier("tiered", Some("signed-in")).await.unwrap();
    assert_eq!(statuses("plain", "premium", 4).await, [200, 200, 200, 429]);
    assert_eq!(statuses("anon", "", 2).await, [200, 429]);
    assert_eq!(statuses("ovr", "premium", 2).await, [200, 429]);
    assert_eq!(statuses("ovr2", "admin", 5).await, [200; 5]);
    backend
        .set_override(
            "ovr2",
            &[p("sliding-window:limit=1,period=1h,name=per-user")],
        )
        .await
        .unwrap();
    // Unlimited requests counted nothing; the override now limits the admin's key.
    assert_eq!(statuses("ovr2", "admin", 2).await, [200, 429]);
    assert_eq!(statuses("tiered", "premium", 3).await, [200, 200, 429]);
    let _ = backend.delete_prefix().await;
}
