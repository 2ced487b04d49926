//! A real axum server on loopback and a real hyper client over TCP.

use std::time::Duration;

use axum::{routing::get, Router};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower_turnstile::{Policy, RateLimitLayer};
use turnstile_tests::app_server::serve;

#[tokio::test]
async fn ten_200s_then_429_with_retry_after_and_headers() {
    let per_ip = Policy::token_bucket(10, Duration::from_secs(60))
        .unwrap()
        .with_name("per-ip")
        .unwrap();
    let addr = serve(
        Router::new()
            .route("/", get(|| async { "hello" }))
            .layer(RateLimitLayer::new(per_ip)),
    )
    .await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let uri: http::Uri = format!("http://{addr}/").parse().unwrap();

    let mut statuses = Vec::new();
    let mut last = None;
    for _ in 0..12 {
        let res = client.get(uri.clone()).await.unwrap();
        statuses.push(res.status().as_u16());
        if res.status() == 200 {
            assert_eq!(res.headers()["ratelimit-policy"], "\"per-ip\";q=10;w=60");
            assert!(res.headers()["ratelimit"]
                .to_str()
                .unwrap()
                .starts_with("\"per-ip\";r="));
        }
        last = Some(res);
    }
    assert_eq!(
        statuses,
        [200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 429, 429]
    );
    let res = last.unwrap();
    let retry: u64 = res.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=6).contains(&retry), "Retry-After {retry}");
    assert_eq!(
        res.headers()["ratelimit"],
        format!("\"per-ip\";r=0;t={retry}").as_str()
    );
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["title"], "Too Many Requests");
}

#[tokio::test]
async fn serving_without_connect_info_explains_the_fix() {
    let app = Router::new()
        .route("/", get(|| async { "hello" }))
        .layer(RateLimitLayer::new(
            "gcra:limit=1,period=1s".parse::<Policy>().unwrap(),
        ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let res = client
        .get(format!("http://{addr}/").parse().unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), 500);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert!(std::str::from_utf8(&body)
        .unwrap()
        .contains("into_make_service_with_connect_info"));
}
