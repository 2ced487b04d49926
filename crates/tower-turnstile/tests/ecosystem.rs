//! The layer in the stacks users build: tower-http's trace, timeout and CORS layers around
//! it in one `ServiceBuilder`, under an axum router.
#![cfg(feature = "axum")]

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::routing::get;
use axum::Router;
use http::{header, Method, Request, StatusCode};
use http_body_util::BodyExt;
use support::p;
use tower::{ServiceBuilder, ServiceExt};
use tower_http::cors::CorsLayer;
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;
use tower_turnstile::key::Route;
use tower_turnstile::{ManualClock, MemoryBackend, MissingKey, RateLimitLayer};

/// A layer enforcing `policy` in memory, at time 0 for ever (fixed windows count from the
/// epoch, so the wall clock would make `t` vary).
fn limit(policy: &str, legacy: bool) -> RateLimitLayer<MemoryBackend<ManualClock>> {
    RateLimitLayer::builder()
        .backend(MemoryBackend::builder().clock(ManualClock::new(0)).build())
        .policy(p(policy))
        .legacy_headers(legacy)
        .build()
        .unwrap()
}

fn get_from(path: &str, ip: &str) -> Request<axum::body::Body> {
    let mut req = Request::builder()
        .uri(path)
        .header(header::ORIGIN, "https://app.example")
        .body(axum::body::Body::empty())
        .unwrap();
    let addr: SocketAddr = format!("{ip}:40000").parse().unwrap();
    req.extensions_mut().insert(ConnectInfo(addr));
    req
}

/// The stack of the issue, verbatim: trace, timeout, CORS, then the limiter.
fn app(policy: &str) -> Router {
    Router::new()
        .route("/", get(|| async { "hello" }))
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(60)).await;
                "late"
            }),
        )
        .layer(
            ServiceBuilder::new()
                .layer(TraceLayer::new_for_http())
                .layer(TimeoutLayer::with_status_code(
                    StatusCode::REQUEST_TIMEOUT,
                    Duration::from_secs(10),
                ))
                .layer(CorsLayer::permissive())
                .layer(limit(policy, false)),
        )
}

#[tokio::test(start_paused = true)]
async fn the_standard_service_builder_stack_composes_and_each_layer_does_its_part() {
    let app = app("fixed-window:limit=3,period=1m,name=per-ip");
    // Admitted: 200 with the limiter's and CORS's headers.
    for r in [2, 1] {
        let res = app
            .clone()
            .oneshot(get_from("/", "192.0.2.1"))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()["ratelimit"], format!("\"per-ip\";r={r};t=60"));
        assert_eq!(res.headers()["access-control-allow-origin"], "*");
        let body = res.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"hello");
    }
    // The timeout layer answers on its own (with its `Default` body) when the handler is
    // too slow; the request still counted.
    let res = app
        .clone()
        .oneshot(get_from("/slow", "192.0.2.1"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::REQUEST_TIMEOUT);
    assert!(res
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .is_empty());
    // Denied: 429 from the limiter, with CORS headers so a browser can read it.
    let res = app
        .clone()
        .oneshot(get_from("/", "192.0.2.1"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()["retry-after"], "60");
    assert_eq!(res.headers()["access-control-allow-origin"], "*");
    assert_eq!(res.headers()["ratelimit"], "\"per-ip\";r=0;t=60");
    // Another client is unaffected.
    let res = app.oneshot(get_from("/", "192.0.2.2")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["ratelimit"], "\"per-ip\";r=2;t=60");
}

#[tokio::test]
async fn cors_outside_the_limiter_answers_preflights_without_spending_quota() {
    let app = app("fixed-window:limit=1,period=1m,name=per-ip");
    for _ in 0..5 {
        let mut req = get_from("/", "192.0.2.1");
        *req.method_mut() = Method::OPTIONS;
        req.headers_mut().insert(
            header::ACCESS_CONTROL_REQUEST_METHOD,
            "GET".parse().unwrap(),
        );
        let res = app.clone().oneshot(req).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert!(res.headers().get("ratelimit").is_none());
        assert_eq!(res.headers()["access-control-allow-origin"], "*");
    }
    let res = app.oneshot(get_from("/", "192.0.2.1")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["ratelimit"], "\"per-ip\";r=0;t=60");
}

/// A router-wide limit (`Router::layer`) around a tighter per-route one (`route_layer`).
fn stacked() -> Router {
    let outer = limit("fixed-window:limit=100,period=1m,name=outer", true);
    let inner = limit("fixed-window:limit=2,period=1m,name=inner", true);
    Router::new()
        .route("/login", get(|| async { "in" }))
        .route_layer(inner)
        .route("/free", get(|| async { "free" }))
        .layer(outer)
}

#[tokio::test]
async fn stacked_layers_keep_each_others_headers() {
    let app = stacked();
    for (inner_r, outer_r) in [(1, 99), (0, 98)] {
        let res = app
            .clone()
            .oneshot(get_from("/login", "192.0.2.1"))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(
            res.headers()["ratelimit-policy"],
            "\"inner\";q=2;w=60, \"outer\";q=100;w=60"
        );
        assert_eq!(
            res.headers()["ratelimit"],
            format!("\"inner\";r={inner_r};t=60, \"outer\";r={outer_r};t=60")
        );
        // The single-valued legacy fields are the innermost layer's.
        assert_eq!(res.headers()["x-ratelimit-limit"], "2");
        assert_eq!(res.headers()["x-ratelimit-remaining"], inner_r.to_string());
        assert_eq!(res.headers().get_all("ratelimit").iter().count(), 1);
    }
    // Regression (stacked layers replaced each other's headers): the inner limit denies; the
    // headers name both policies and agree with the body, which names the inner one.
    let res = app
        .clone()
        .oneshot(get_from("/login", "192.0.2.1"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        res.headers()["ratelimit"],
        "\"inner\";r=0;t=60, \"outer\";r=97;t=60"
    );
    assert_eq!(
        res.headers()["ratelimit-policy"],
        "\"inner\";q=2;w=60, \"outer\";q=100;w=60"
    );
    assert_eq!(res.headers()["retry-after"], "60");
    assert_eq!(res.headers()["x-ratelimit-limit"], "2");
    assert_eq!(res.headers()["x-ratelimit-remaining"], "0");
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["violated-policies"], serde_json::json!(["inner"]));
    // A route outside the inner layer reports the outer policy only.
    let res = app.oneshot(get_from("/free", "192.0.2.1")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["ratelimit"], "\"outer\";r=96;t=60");
    assert_eq!(res.headers()["ratelimit-policy"], "\"outer\";q=100;w=60");
    assert_eq!(res.headers()["x-ratelimit-limit"], "100");
}

/// Regression: the outer layer denying answers alone; nothing of the inner layer's.
#[tokio::test]
async fn an_outer_denial_carries_only_the_outer_layers_fields() {
    let outer = limit("fixed-window:limit=1,period=1m,name=outer", false);
    let inner = limit("fixed-window:limit=5,period=1m,name=inner", false);
    let app = Router::new()
        .route("/", get(|| async { "x" }))
        .route_layer(inner)
        .layer(outer);
    let res = app
        .clone()
        .oneshot(get_from("/", "192.0.2.1"))
        .await
        .unwrap();
    assert_eq!(
        res.headers()["ratelimit"],
        "\"inner\";r=4;t=60, \"outer\";r=0;t=60"
    );
    let res = app.oneshot(get_from("/", "192.0.2.1")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()["ratelimit"], "\"outer\";r=0;t=60");
    assert_eq!(res.headers()["ratelimit-policy"], "\"outer\";q=1;w=60");
}

/// The JSON error shape an API returns everywhere, for denials too.
fn json_error(d: &tower_turnstile::Denial<'_>) -> impl axum::response::IntoResponse {
    let body = serde_json::json!({
        "error": { "code": "rate_limited", "retry_after_s": d.retry_after().map(|r| r.as_secs()) }
    });
    (StatusCode::TOO_MANY_REQUESTS, axum::Json(body))
}

#[tokio::test]
async fn a_custom_denial_is_whatever_an_axum_handler_would_return() {
    let layer = RateLimitLayer::builder()
        .backend(MemoryBackend::builder().clock(ManualClock::new(0)).build())
        .policy(p("fixed-window:limit=1,period=1m,name=api"))
        .denial_into_response(json_error)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let res = app
        .clone()
        .oneshot(get_from("/", "192.0.2.1"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let res = app.oneshot(get_from("/", "192.0.2.1")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()["content-type"], "application/json");
    // The layer's own fields are added to the custom response.
    assert_eq!(res.headers()["ratelimit"], "\"api\";r=0;t=60");
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&body).unwrap(),
        serde_json::json!({"error": {"code": "rate_limited", "retry_after_s": 60}})
    );
}

#[tokio::test]
async fn a_custom_denial_body_may_be_a_string_or_bytes() {
    for body in [0, 1, 2] {
        let layer = RateLimitLayer::builder()
            .backend(MemoryBackend::builder().clock(ManualClock::new(0)).build())
            .policy(p("fixed-window:limit=1,period=1m,name=api"))
            .denial_response(move |_| {
                let mut res = match body {
                    0 => http::Response::new(String::from("slow")).map(String::into_bytes),
                    1 => http::Response::new(b"slow".to_vec()),
                    _ => http::Response::new(&b"slow"[..]).map(<[u8]>::to_vec),
                };
                *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                res
            })
            .build()
            .unwrap();
        let app = Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer);
        app.clone()
            .oneshot(get_from("/", "192.0.2.1"))
            .await
            .unwrap();
        let res = app.oneshot(get_from("/", "192.0.2.1")).await.unwrap();
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        let bytes = res.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&bytes[..], b"slow");
    }
}

/// A body that never yields a frame.
struct Never;

impl http_body::Body for Never {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        std::task::Poll::Pending
    }
}

#[tokio::test]
async fn a_streaming_custom_denial_body_falls_back_to_the_default_denial() {
    let layer = RateLimitLayer::builder()
        .backend(MemoryBackend::builder().clock(ManualClock::new(0)).build())
        .policy(p("fixed-window:limit=1,period=1m,name=api"))
        .denial_into_response(|_| axum::body::Body::new(Never))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    app.clone()
        .oneshot(get_from("/", "192.0.2.1"))
        .await
        .unwrap();
    let res = app.oneshot(get_from("/", "192.0.2.1")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    assert_eq!(res.headers()["retry-after"], "60");
}

fn preflight_from(ip: &str) -> Request<axum::body::Body> {
    let mut req = get_from("/", ip);
    *req.method_mut() = Method::OPTIONS;
    req.headers_mut().insert(
        header::ACCESS_CONTROL_REQUEST_METHOD,
        "GET".parse().unwrap(),
    );
    req
}

/// An app that answers `OPTIONS` itself, inside the limiter (no CORS layer in front).
fn options_app(layer: RateLimitLayer<MemoryBackend<ManualClock>>) -> Router {
    Router::new()
        .route("/", get(|| async { "hello" }).options(|| async { "" }))
        .layer(layer)
}

/// Regression: browser preflights spent quota, so after three preflights the real GET was
/// refused. `Rule::preflight()` exempts them.
#[tokio::test]
async fn three_preflights_no_longer_refuse_the_real_get() {
    let layer = RateLimitLayer::builder()
        .backend(MemoryBackend::builder().clock(ManualClock::new(0)).build())
        .rule(tower_turnstile::Rule::preflight())
        .policy(p("fixed-window:limit=3,period=1m,name=per-ip"))
        .build()
        .unwrap();
    let app = options_app(layer);
    for _ in 0..3 {
        let res = app
            .clone()
            .oneshot(preflight_from("192.0.2.1"))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert!(res.headers().get("ratelimit").is_none());
    }
    for r in [2, 1, 0] {
        let res = app
            .clone()
            .oneshot(get_from("/", "192.0.2.1"))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()["ratelimit"], format!("\"per-ip\";r={r};t=60"));
    }
    // A plain OPTIONS (no Access-Control-Request-Method) is not a preflight: it counts.
    let mut plain = get_from("/", "192.0.2.1");
    *plain.method_mut() = Method::OPTIONS;
    let res = app.oneshot(plain).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
}

/// The documented default: without the rule (and without a CORS layer in front) the limiter
/// counts preflights like any request.
#[tokio::test]
async fn preflights_that_reach_the_limiter_count_by_default() {
    let app = options_app(limit("fixed-window:limit=3,period=1m,name=per-ip", false));
    for r in [2, 1, 0] {
        let res = app
            .clone()
            .oneshot(preflight_from("192.0.2.1"))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()["ratelimit"], format!("\"per-ip\";r={r};t=60"));
    }
    let res = app.oneshot(get_from("/", "192.0.2.1")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
}

/// The errors turnstile writes itself are RFC 9457 problems like its 429.
#[tokio::test]
async fn every_error_turnstile_writes_is_a_problem_document() {
    async fn problem(res: http::Response<axum::body::Body>) -> serde_json::Value {
        assert_eq!(res.headers()["content-type"], "application/problem+json");
        let body = res.into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice(&body).unwrap()
    }
    // 500: no connect info, with the fix in `detail`.
    let app = Router::new()
        .route("/", get(|| async { "x" }))
        .layer(limit("fixed-window:limit=1,period=1m,name=per-ip", false));
    let req = Request::builder()
        .uri("/")
        .body(axum::body::Body::empty())
        .unwrap();
    let res = app.oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let doc = problem(res).await;
    assert_eq!(doc["type"], "about:blank");
    assert_eq!(doc["title"], "Internal Server Error");
    assert_eq!(doc["status"], 500);
    assert!(doc["detail"]
        .as_str()
        .unwrap()
        .contains("into_make_service_with_connect_info::<std::net::SocketAddr>()"));
    // 400: the header the key is read from is missing.
    let layer = RateLimitLayer::builder()
        .key(tower_turnstile::key::HeaderKey::named("x-api-key").unwrap())
        .policy(p("fixed-window:limit=1,period=1m,name=per-key"))
        .build()
        .unwrap();
    let app = Router::new().route("/", get(|| async { "x" })).layer(layer);
    let res = app.oneshot(get_from("/", "192.0.2.1")).await.unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    let doc = problem(res).await;
    assert_eq!(
        (doc["title"].as_str(), doc["status"].as_u64()),
        (Some("Bad Request"), Some(400))
    );
    assert_eq!(
        doc["detail"],
        "turnstile: this request has no `x-api-key` header to rate-limit by."
    );
    // 503: the backend cannot decide and the layer fails closed.
    let policy = p("gcra:limit=5,period=1s");
    let full = MemoryBackend::builder().max_keys(1).build();
    tower_turnstile::Backend::check(&full, "someone-else", std::slice::from_ref(&policy), 1)
        .into_inner()
        .unwrap();
    let layer = RateLimitLayer::new(policy)
        .backend(full)
        .on_backend_failure(tower_turnstile::FailurePolicy::Closed);
    let app = Router::new().route("/", get(|| async { "x" })).layer(layer);
    let res = app.oneshot(get_from("/", "192.0.2.1")).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        problem(res).await,
        serde_json::json!({
            "type": "about:blank",
            "title": "Service Unavailable",
            "status": 503,
            "detail": "The rate limiter is unavailable; try again later."
        })
    );
}

/// The pitfalls of `docs/pitfalls.md`, as axum behaves: `Router::layer` limits `404`s too,
/// `route_layer` only matched routes.
#[tokio::test]
async fn layer_counts_404s_and_route_layer_does_not() {
    let app = Router::new()
        .route("/", get(|| async { "x" }))
        .layer(limit("fixed-window:limit=2,period=1m,name=per-ip", false));
    let res = app
        .clone()
        .oneshot(get_from("/nope", "192.0.2.1"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    assert_eq!(res.headers()["ratelimit"], "\"per-ip\";r=1;t=60");
    let res = app.oneshot(get_from("/nope", "192.0.2.1")).await.unwrap();
    assert_eq!(res.headers()["ratelimit"], "\"per-ip\";r=0;t=60");

    let app = Router::new()
        .route("/", get(|| async { "x" }))
        .route_layer(limit("fixed-window:limit=2,period=1m,name=per-ip", false));
    for _ in 0..3 {
        let res = app
            .clone()
            .oneshot(get_from("/nope", "192.0.2.1"))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::NOT_FOUND);
        assert!(res.headers().get("ratelimit").is_none());
    }
    let res = app.oneshot(get_from("/", "192.0.2.1")).await.unwrap();
    assert_eq!(res.headers()["ratelimit"], "\"per-ip\";r=1;t=60");
}

/// Regression (issue 24, trap 3): with the `Route` key on `Router::layer`, every `404` was a
/// `500` whose message suggested `Router::layer`. A request no route matched is limited under
/// the one key `<unmatched>`: a flood of `404`s counts, whatever `on_missing_key` says, and
/// matched routes keep their own keys.
#[tokio::test]
async fn route_key_limits_unmatched_requests_under_one_shared_key() {
    let layer = RateLimitLayer::builder()
        .backend(MemoryBackend::builder().clock(ManualClock::new(0)).build())
        .key(Route)
        .policy(p("fixed-window:limit=2,period=1m,name=per-route"))
        .on_missing_key(MissingKey::Allow)
        .build()
        .unwrap();
    let backend = layer.backend_ref().clone();
    let app = Router::new().route("/", get(|| async { "x" })).layer(layer);
    // Two unknown paths share the quota of 2: 404, 404, then 429.
    for (path, left) in [("/nope", 1), ("/other/unknown", 0)] {
        let res = app
            .clone()
            .oneshot(get_from(path, "192.0.2.1"))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::NOT_FOUND, "{path}");
        assert_eq!(
            res.headers()["ratelimit"],
            format!("\"per-route\";r={left};t=60").as_str()
        );
    }
    let res = app
        .clone()
        .oneshot(get_from("/nope", "192.0.2.9"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(backend.len(), 1, "one key for every unmatched request");
    // The matched route has its own quota.
    let res = app.oneshot(get_from("/", "192.0.2.1")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["ratelimit"], "\"per-route\";r=1;t=60");
    assert_eq!(backend.len(), 2);
}

/// Only a layer around the router (not inside it) sees no route at all: `500` with the fix.
#[tokio::test]
async fn route_key_around_the_router_is_a_misconfiguration() {
    let layer = RateLimitLayer::builder()
        .backend(MemoryBackend::builder().clock(ManualClock::new(0)).build())
        .key(Route)
        .policy(p("fixed-window:limit=2,period=1m,name=per-route"))
        .build()
        .unwrap();
    let app = ServiceBuilder::new()
        .layer(layer)
        .service(Router::new().route("/", get(|| async { "x" })));
    let res = app.oneshot(get_from("/", "192.0.2.1")).await.unwrap();
    assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let body = String::from_utf8(body.to_vec()).unwrap();
    assert!(body.contains("did not go through an axum Router"), "{body}");
}

/// A layer inside a nested router sees the path with the nest's prefix stripped.
#[tokio::test]
async fn a_rule_inside_a_nest_matches_the_inner_path() {
    let layer = RateLimitLayer::builder()
        .backend(MemoryBackend::builder().clock(ManualClock::new(0)).build())
        .rule(
            tower_turnstile::Rule::new()
                .path("/users")
                .policy(p("fixed-window:limit=1,period=1m,name=users")),
        )
        .build()
        .unwrap();
    let inner = Router::new()
        .route("/users", get(|| async { "u" }))
        .route("/other", get(|| async { "o" }))
        .layer(layer);
    let app = Router::new().nest("/api", inner);
    let res = app
        .clone()
        .oneshot(get_from("/api/users", "192.0.2.1"))
        .await
        .unwrap();
    assert_eq!(res.headers()["ratelimit"], "\"users\";r=0;t=60");
    let res = app
        .clone()
        .oneshot(get_from("/api/users", "192.0.2.1"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    // No rule matches /other (and the layer has no policy of its own): unchecked.
    let res = app
        .oneshot(get_from("/api/other", "192.0.2.1"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(res.headers().get("ratelimit").is_none());
}

#[test]
fn the_key_module_re_exports_the_network_types_client_ip_takes() {
    let net: tower_turnstile::key::IpNet = "10.0.0.0/8".parse().unwrap();
    let v6: tower_turnstile::key::Ipv6Net = "2001:db8::/32".parse().unwrap();
    let key = tower_turnstile::key::ClientIp::new()
        .trust(net)
        .trust(v6.into());
    assert_eq!(key.trusted(), [net, tower_turnstile::key::IpNet::V6(v6)]);
}
