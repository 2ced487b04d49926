//! The layer's cap on a key's bytes (issue 25, fault 5): set on the builder or in the
//! configuration file, checked before the backend sees the key, never above what the backend
//! takes. (Real clients, servers and Redis: `tests/tests/long_keys.rs`.)

mod support;

use http::{Request, StatusCode};
use http_body_util::BodyExt;
use support::{hello, p};
use tower::{service_fn, Layer, ServiceExt};
use tower_turnstile::key::HeaderKey;
use tower_turnstile::{
    Backend, InvalidLayer, KeyExtractor, MemoryBackend, MissingKey, RateLimitLayer,
};

/// A request keyed by `x-api-key: key`.
fn with_key(key: &str) -> Request<()> {
    Request::builder()
        .uri("/")
        .header("x-api-key", key)
        .body(())
        .unwrap()
}

/// A key of 16 bytes passes `layer`, one of 17 gets 400.
async fn takes_16_bytes<B: Backend, K: KeyExtractor>(layer: RateLimitLayer<B, K>) {
    let svc = layer.layer(service_fn(hello));
    let res = svc
        .clone()
        .oneshot(with_key(&"k".repeat(16)))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let res = svc.oneshot(with_key(&"k".repeat(17))).await.unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
}

/// The layer's cap is its own: the layer's in-memory backend takes any length, so a cap
/// above the default admits what the default refuses; `on_missing_key` never applies to a
/// key too long, and nothing of it is stored.
#[tokio::test]
async fn the_layers_cap_is_set_on_its_builder_and_a_longer_key_gets_400() {
    let layer = RateLimitLayer::builder()
        .key(HeaderKey::named("x-api-key").unwrap())
        .policy(p("fixed-window:limit=10,period=1h,name=per-key"))
        .on_missing_key(MissingKey::key("anonymous"))
        .max_key_bytes(1024)
        .build()
        .unwrap();
    let backend = layer.backend_ref().clone();
    let svc = layer.layer(service_fn(hello));
    let res = svc
        .clone()
        .oneshot(with_key(&"k".repeat(1024)))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(backend.len(), 1);
    let res = svc.oneshot(with_key(&"k".repeat(1025))).await.unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    assert!(!res.headers().contains_key("ratelimit"));
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        problem["detail"],
        "turnstile: this request's rate-limit key is 1025 bytes, longer than the 1024 bytes the limiter takes."
    );
    assert_eq!(
        backend.len(),
        1,
        "neither the long key nor `anonymous` was stored"
    );
}

/// A cap above what a backend of one's own takes is refused at build: keys in between would
/// pass the layer and fail every check. Without a cap of its own the layer takes the smaller
/// of 512 and the backend's.
#[test]
fn a_cap_above_the_backends_is_refused_at_build() {
    let err = RateLimitLayer::builder()
        .backend(MemoryBackend::new())
        .policy(p("gcra:limit=1,period=1s"))
        .max_key_bytes(1024)
        .build()
        .unwrap_err();
    assert_eq!(
        err,
        InvalidLayer::KeyCapAboveBackend {
            layer: 1024,
            backend: 512
        }
    );
    assert_eq!(
        err.to_string(),
        "the layer takes keys of up to 1024 bytes (max_key_bytes) but its backend only 512; raise the backend's max_key_bytes or lower the layer's"
    );
    assert!(RateLimitLayer::builder()
        .backend(MemoryBackend::builder().max_key_bytes(1024).build())
        .policy(p("gcra:limit=1,period=1s"))
        .max_key_bytes(1024)
        .build()
        .is_ok());
}

#[tokio::test]
async fn a_backend_with_a_smaller_cap_lowers_the_layers_default() {
    let layer = RateLimitLayer::builder()
        .backend(MemoryBackend::builder().max_key_bytes(16).build())
        .key(HeaderKey::named("x-api-key").unwrap())
        .policy(p("gcra:limit=1,period=1s"))
        .build()
        .unwrap();
    takes_16_bytes(layer).await;
}

#[cfg(feature = "config")]
#[tokio::test]
async fn the_configuration_file_sets_the_cap() {
    use tower_turnstile::config::LayerConfig;
    let config = LayerConfig::from_toml(
        "turnstile.toml",
        r#"
key = "header:x-api-key"
policies = ["gcra:limit=5,period=1s,name=per-key"]

[backend]
max_key_bytes = 16
"#,
    )
    .unwrap();
    assert_eq!(config.backend().max_key_bytes(), Some(16));
    assert!(config
        .to_string()
        .contains("keys: at most 16 bytes (longer: 400 / INVALID_ARGUMENT)"));
    takes_16_bytes(config.builder().build().unwrap()).await;

    let zero = LayerConfig::from_toml("turnstile.toml", "[backend]\nmax_key_bytes = 0\n")
        .unwrap_err()
        .to_string();
    assert!(
        zero.contains("max_key_bytes 0 is out of range (at least 1)"),
        "{zero}"
    );
}
