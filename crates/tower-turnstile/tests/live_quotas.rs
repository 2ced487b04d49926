//! Live quotas through the layer: a key's override and tier, stored in the backend, change
//! its policies on the next request; keys without configuration follow the layer's choice.

mod support;

use std::convert::Infallible;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use support::{hello, p};
use tower::{Layer, Service, ServiceExt};
use tower_turnstile::key::HeaderKey;
use tower_turnstile::{
    Applied, Clock, ManualClock, MemoryBackend, Quotas, RateLimitLayer, Unconfigured,
};

fn req(api_key: &str) -> Request<()> {
    Request::builder()
        .uri("/")
        .header("x-api-key", api_key)
        .body(())
        .unwrap()
}

fn layer(
    backend: &MemoryBackend<ManualClock>,
    unconfigured: Unconfigured,
) -> RateLimitLayer<MemoryBackend<ManualClock>, HeaderKey> {
    RateLimitLayer::builder()
        .backend(backend.clone())
        .key(HeaderKey::named("x-api-key").unwrap())
        .policy(p("fixed-window:limit=2,period=1h,name=api"))
        .tier("pro", [p("fixed-window:limit=5,period=1h,name=api")])
        .when_unconfigured(unconfigured)
        .build()
        .unwrap()
}

/// Sends `n` requests for `key`; returns the statuses and the last response.
async fn send<S>(svc: &mut S, key: &str, n: usize) -> (Vec<u16>, Response<String>)
where
    S: Service<Request<()>, Response = Response<String>, Error = Infallible>,
{
    let mut statuses = Vec::new();
    let mut last = None;
    for _ in 0..n {
        let res = svc.ready().await.unwrap().call(req(key)).await.unwrap();
        statuses.push(res.status().as_u16());
        last = Some(res);
    }
    (statuses, last.unwrap())
}

#[tokio::test]
async fn tiers_and_overrides_take_effect_on_the_next_request() {
    let clock = ManualClock::new(1_700_000_000_000 - 1_700_000_000_000 % 3_600_000);
    let backend = MemoryBackend::builder().clock(clock.clone()).build();
    let mut svc = layer(&backend, Unconfigured::Defaults).layer(tower::service_fn(hello));

    let (s, _) = send(&mut svc, "free-user", 3).await;
    assert_eq!(s, [200, 200, 429]);

    // The key moves to the pro tier: five per hour from the next request on, and the one
    // request it already made still counts (the counter carries over).
    backend.set_tier("free-user", Some("pro")).await.unwrap();
    let (s, res) = send(&mut svc, "free-user", 4).await;
    assert_eq!(s, [200, 200, 200, 429]);
    assert_eq!(res.headers()["ratelimit-policy"], "\"api\";q=5;w=3600");

    // An override beats the tier, in both directions.
    backend
        .set_override("free-user", &[p("fixed-window:limit=7,period=1h,name=api")])
        .await
        .unwrap();
    let (s, res) = send(&mut svc, "free-user", 3).await;
    assert_eq!(s, [200, 200, 429]);
    assert_eq!(res.headers()["ratelimit-policy"], "\"api\";q=7;w=3600");
    assert_eq!(res.headers()["ratelimit"], "\"api\";r=0;t=3600");

    // A refund gives one back; a reset gives everything back.
    let limits =
        tower_turnstile::Limits::new([p("fixed-window:limit=2,period=1h,name=api")]).unwrap();
    let d = backend
        .refund("free-user", &limits, 1, Some(clock.now_ms()))
        .await
        .unwrap();
    assert_eq!((d.applied(), d.remaining()), (&Applied::Override, 1));
    let (s, _) = send(&mut svc, "free-user", 2).await;
    assert_eq!(s, [200, 429]);
    backend
        .reset("free-user", &limits, Some(clock.now_ms()))
        .await
        .unwrap();
    let (s, _) = send(&mut svc, "free-user", 8).await;
    assert_eq!(s, [200, 200, 200, 200, 200, 200, 200, 429]);

    // Removing the override puts the tier back (its counter is the same "api" one).
    backend.remove_override("free-user").await.unwrap();
    let (s, _) = send(&mut svc, "free-user", 1).await;
    assert_eq!(s, [429]);
    clock.advance(Duration::from_secs(3600));
    let (s, _) = send(&mut svc, "free-user", 6).await;
    assert_eq!(s, [200, 200, 200, 200, 200, 429]);
}

#[tokio::test]
async fn keys_without_configuration_can_be_denied_or_unlimited() {
    let clock = ManualClock::new(0);
    let backend = MemoryBackend::builder().clock(clock.clone()).build();
    backend.set_tier("customer", Some("pro")).await.unwrap();

    let mut deny = layer(&backend, Unconfigured::Deny).layer(tower::service_fn(hello));
    let (s, res) = send(&mut deny, "stranger", 1).await;
    assert_eq!(s, [429]);
    assert!(
        res.headers().get("retry-after").is_none(),
        "no wait can help"
    );
    assert!(res.headers().get("ratelimit").is_none());
    let (s, _) = send(&mut deny, "customer", 6).await;
    assert_eq!(s, [200, 200, 200, 200, 200, 429]);

    let mut allow = layer(&backend, Unconfigured::Allow).layer(tower::service_fn(hello));
    let (s, res) = send(&mut allow, "stranger", 50).await;
    assert!(s.iter().all(|s| *s == 200));
    assert!(res.headers().get("ratelimit").is_none());
    let res = allow
        .ready()
        .await
        .unwrap()
        .call(req("customer"))
        .await
        .unwrap();
    assert_eq!(
        res.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "the tier still applies"
    );
}

#[test]
fn invalid_tiers_are_refused_at_build_time() {
    let b = RateLimitLayer::builder()
        .policy(p("gcra:limit=1,period=1s"))
        .tier("no spaces", [p("gcra:limit=1,period=1s")])
        .build();
    assert!(matches!(b, Err(tower_turnstile::InvalidLayer::Tier(_))));
    let b = RateLimitLayer::builder()
        .policy(p("gcra:limit=1,period=1s"))
        .tier("pro", Vec::new())
        .build();
    assert!(matches!(b, Err(tower_turnstile::InvalidLayer::Tier(_))));
}
