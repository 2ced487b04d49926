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
    Applied, Clock, ManualClock, MemoryBackend, Quotas, RateLimitLayer, Source, Unconfigured,
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
    assert_eq!(
        res.headers()["ratelimit-policy"],
        "\"api\";q=5;w=3600;turnstile-tier=\"pro\""
    );

    // An override beats the tier, in both directions.
    backend
        .set_override("free-user", &[p("fixed-window:limit=7,period=1h,name=api")])
        .await
        .unwrap();
    let (s, res) = send(&mut svc, "free-user", 3).await;
    assert_eq!(s, [200, 200, 429]);
    assert_eq!(
        res.headers()["ratelimit-policy"],
        "\"api\";q=7;w=3600;turnstile-override"
    );
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

/// Issue 24, trap 1: a tier or an override changes the parameters of the policies it names;
/// every other policy of the request stays in force.
#[tokio::test]
async fn a_tier_or_an_override_changes_only_the_policies_it_names() {
    let clock = ManualClock::new(1_700_000_000_000 - 1_700_000_000_000 % 3_600_000);
    let backend = MemoryBackend::builder().clock(clock.clone()).build();
    let layer = RateLimitLayer::builder()
        .backend(backend.clone())
        .key(HeaderKey::named("x-api-key").unwrap())
        .policy(p("fixed-window:limit=2,period=1h,name=api"))
        .policy(p("fixed-window:limit=4,period=1h,name=guard"))
        .tier("pro", [p("fixed-window:limit=50,period=1h,name=api")])
        .build()
        .unwrap();
    let mut svc = layer.layer(tower::service_fn(hello));

    backend.set_tier("premium", Some("pro")).await.unwrap();
    let (s, res) = send(&mut svc, "premium", 5).await;
    assert_eq!(s, [200, 200, 200, 200, 429], "the guard stays in force");
    assert_eq!(
        res.headers()["ratelimit-policy"],
        "\"api\";q=50;w=3600;turnstile-tier=\"pro\", \"guard\";q=4;w=3600"
    );

    // An override of "api" alone: the guard still holds; a name no policy has changes
    // nothing.
    backend
        .set_override(
            "vip",
            &[
                p("fixed-window:limit=100,period=1h,name=api"),
                p("fixed-window:limit=100,period=1h,name=elsewhere"),
            ],
        )
        .await
        .unwrap();
    let (s, res) = send(&mut svc, "vip", 5).await;
    assert_eq!(s, [200, 200, 200, 200, 429]);
    assert_eq!(
        res.headers()["ratelimit-policy"],
        "\"api\";q=100;w=3600;turnstile-override, \"guard\";q=4;w=3600"
    );

    // The decision says, per policy, where its parameters came from.
    let limits = layer_limits();
    let d = tower_turnstile::Backend::check_limits(&backend, "vip", &limits, 0, None)
        .await
        .unwrap();
    assert_eq!(d.applied(), &Applied::Override);
    let sources: Vec<_> = d.sources().map(|s| s.label()).collect();
    assert_eq!(sources, ["override", "defaults"]);
    let d = tower_turnstile::Backend::check_limits(&backend, "premium", &limits, 0, None)
        .await
        .unwrap();
    assert_eq!(d.applied(), &Applied::Tier("pro".into()));
    assert_eq!(
        d.sources().collect::<Vec<_>>(),
        [Source::Tier("pro".into()), Source::Defaults]
    );
}

fn layer_limits() -> tower_turnstile::Limits {
    tower_turnstile::Limits::new([
        p("fixed-window:limit=2,period=1h,name=api"),
        p("fixed-window:limit=4,period=1h,name=guard"),
    ])
    .unwrap()
    .with_tier("pro", [p("fixed-window:limit=50,period=1h,name=api")])
    .unwrap()
}

#[test]
fn a_tier_naming_a_policy_no_rule_uses_is_refused_at_build_time() {
    let b = RateLimitLayer::builder()
        .policy(p("gcra:limit=1,period=1s,name=api"))
        .tier("pro", [p("gcra:limit=9,period=1s,name=apii")])
        .build();
    assert_eq!(
        b.err(),
        Some(tower_turnstile::InvalidLayer::UnusedTierPolicy {
            tier: "pro".into(),
            policy: "apii".into()
        })
    );
}

/// Issue 25, fault 4: at most `MAX_POLICIES` policies per check, refused at build.
#[test]
fn a_huge_policy_set_is_refused_at_build_time() {
    let many = |n: usize| -> Vec<tower_turnstile::Policy> {
        (0..n)
            .map(|i| p(&format!("fixed-window:limit=5,period=1m,name=p{i}")))
            .collect()
    };
    let max = tower_turnstile::MAX_POLICIES;
    let b = RateLimitLayer::builder().policies(many(1000)).build();
    assert!(matches!(
        b.err(),
        Some(tower_turnstile::InvalidLayer::TooManyPolicies { count: 1000, .. })
    ));
    assert!(RateLimitLayer::builder()
        .policies(many(max))
        .build()
        .is_ok());
    let b = RateLimitLayer::builder()
        .policies(many(2))
        .tier("pro", many(max + 1))
        .build();
    assert!(matches!(
        b.err(),
        Some(tower_turnstile::InvalidLayer::Tier(
            tower_turnstile::LimitsError::TooManyPolicies {
                count: 513,
                max: 512
            }
        ))
    ));
}
