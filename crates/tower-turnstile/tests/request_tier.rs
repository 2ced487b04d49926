//! Tiers chosen from the request (a claim in the extensions): anonymous, signed-in, premium
//! and unlimited admins; a key's stored override or tier still wins.

mod support;

use std::convert::Infallible;

use http::{Request, Response};
use http_body_util::BodyExt;
use support::{hello, p};
use tower::{Layer, Service, ServiceExt};
use tower_turnstile::key::HeaderKey;
use tower_turnstile::{ManualClock, MemoryBackend, Quotas, RateLimitLayer, RequestTier};

/// What an authentication layer put in the request.
#[derive(Clone, Copy, Debug)]
enum Plan {
    SignedIn,
    Premium,
    Admin,
    /// A plan the application maps to a tier name the layer does not define.
    Mystery,
}

fn req(key: &str, plan: Option<Plan>) -> Request<()> {
    let mut r = Request::builder()
        .uri("/")
        .header("x-api-key", key)
        .body(())
        .unwrap();
    if let Some(plan) = plan {
        r.extensions_mut().insert(plan);
    }
    r
}

/// Anonymous 1 per hour, signed-in 2, premium 3, admins unlimited; the denial body names
/// the configuration that applied.
fn layer(
    backend: &MemoryBackend<ManualClock>,
) -> RateLimitLayer<MemoryBackend<ManualClock>, HeaderKey> {
    RateLimitLayer::builder()
        .backend(backend.clone())
        .key(HeaderKey::named("x-api-key").unwrap())
        .policy(p("fixed-window:limit=1,period=1h,name=per-user"))
        .tier(
            "signed-in",
            [p("fixed-window:limit=2,period=1h,name=per-user")],
        )
        .tier(
            "premium",
            [p("fixed-window:limit=3,period=1h,name=per-user")],
        )
        .request_tier(|req| match req.extensions().get::<Plan>() {
            None => RequestTier::Defaults,
            Some(Plan::SignedIn) => RequestTier::named("signed-in"),
            Some(Plan::Premium) => RequestTier::named("premium"),
            Some(Plan::Admin) => RequestTier::Unlimited,
            Some(Plan::Mystery) => RequestTier::named("platinum"),
        })
        .denial_response(|d| {
            let applied = match d.decision().applied() {
                tower_turnstile::Applied::Tier(t) => format!("tier {t}"),
                other => other.label().to_owned(),
            };
            let mut res = Response::new(applied);
            *res.status_mut() = http::StatusCode::TOO_MANY_REQUESTS;
            res
        })
        .build()
        .unwrap()
}

/// Sends `n` requests for `key` with `plan`: each status, and the last response's
/// `RateLimit-Policy` (or `-`) and body.
async fn send<S>(svc: &mut S, key: &str, plan: Option<Plan>, n: usize) -> (Vec<u16>, String, String)
where
    S: Service<Request<()>, Response = Response<String>, Error = Infallible>,
{
    let mut statuses = Vec::new();
    let (mut policy, mut body) = (String::new(), String::new());
    for _ in 0..n {
        let res = svc
            .ready()
            .await
            .unwrap()
            .call(req(key, plan))
            .await
            .unwrap();
        statuses.push(res.status().as_u16());
        policy = res
            .headers()
            .get("ratelimit-policy")
            .map_or("-".to_owned(), |v| v.to_str().unwrap().to_owned());
        let bytes = res.into_body().collect().await.unwrap().to_bytes();
        body = String::from_utf8(bytes.to_vec()).unwrap();
    }
    (statuses, policy, body)
}

fn hour_start() -> ManualClock {
    ManualClock::new(1_700_000_000_000 - 1_700_000_000_000 % 3_600_000)
}

#[tokio::test]
async fn each_request_gets_the_limit_of_its_plan() {
    let backend = MemoryBackend::builder().clock(hour_start()).build();
    let mut svc = layer(&backend).layer(tower::service_fn(hello));

    let (s, policy, body) = send(&mut svc, "anon", None, 2).await;
    assert_eq!(s, [200, 429]);
    assert_eq!(policy, "\"per-user\";q=1;w=3600");
    assert_eq!(body, "defaults");

    let (s, policy, body) = send(&mut svc, "sam", Some(Plan::SignedIn), 3).await;
    assert_eq!(s, [200, 200, 429]);
    assert_eq!(
        policy,
        "\"per-user\";q=2;w=3600;turnstile-tier=\"signed-in\""
    );
    assert_eq!(body, "tier signed-in");

    let (s, policy, body) = send(&mut svc, "pat", Some(Plan::Premium), 4).await;
    assert_eq!(s, [200, 200, 200, 429]);
    assert_eq!(policy, "\"per-user\";q=3;w=3600;turnstile-tier=\"premium\"");
    assert_eq!(body, "tier premium");

    // Admins: no limit, no rate-limit headers.
    let (s, policy, _) = send(&mut svc, "root", Some(Plan::Admin), 20).await;
    assert_eq!(s, [200; 20]);
    assert_eq!(policy, "-");

    // A tier name the layer does not define: the rule's policies.
    let (s, policy, body) = send(&mut svc, "odd", Some(Plan::Mystery), 2).await;
    assert_eq!(s, [200, 429]);
    assert_eq!(policy, "\"per-user\";q=1;w=3600");
    assert_eq!(body, "defaults");

    // The tier's policy shares the rule's name, so a user who signs in keeps their count:
    // "anon" spent 1 of the signed-in 2.
    let (s, _, _) = send(&mut svc, "anon", Some(Plan::SignedIn), 2).await;
    assert_eq!(s, [200, 429]);
}

#[tokio::test]
async fn a_keys_stored_override_or_tier_wins_over_the_requests_tier() {
    let backend = MemoryBackend::builder().clock(hour_start()).build();
    let mut svc = layer(&backend).layer(tower::service_fn(hello));

    // An operator's override for one key beats the premium claim, and the admin's too.
    let one = [p("fixed-window:limit=1,period=1h,name=per-user")];
    backend.set_override("pat", &one).await.unwrap();
    backend.set_override("root", &one).await.unwrap();
    let (s, policy, body) = send(&mut svc, "pat", Some(Plan::Premium), 2).await;
    assert_eq!(
        (s, policy.as_str(), body.as_str()),
        (
            vec![200, 429],
            "\"per-user\";q=1;w=3600;turnstile-override",
            "override"
        )
    );
    let (s, _, body) = send(&mut svc, "root", Some(Plan::Admin), 2).await;
    assert_eq!((s, body.as_str()), (vec![200, 429], "override"));

    // A stored tier beats the request's tier, and the anonymous default.
    backend.set_tier("sam", Some("signed-in")).await.unwrap();
    let (s, _, body) = send(&mut svc, "sam", Some(Plan::Premium), 3).await;
    assert_eq!((s, body.as_str()), (vec![200, 200, 429], "tier signed-in"));
    backend.set_tier("kim", Some("premium")).await.unwrap();
    let (s, _, body) = send(&mut svc, "kim", None, 4).await;
    assert_eq!(
        (s, body.as_str()),
        (vec![200, 200, 200, 429], "tier premium")
    );

    // Removing the override gives the request's tier back.
    backend.remove_override("pat").await.unwrap();
    let (s, _, _) = send(&mut svc, "pat", Some(Plan::Premium), 3).await;
    assert_eq!(s, [200, 200, 429]);
}

#[tokio::test]
async fn without_a_request_tier_function_the_layer_is_unchanged() {
    let backend = MemoryBackend::builder().clock(hour_start()).build();
    let svc = RateLimitLayer::builder()
        .backend(backend)
        .key(HeaderKey::named("x-api-key").unwrap())
        .policy(p("fixed-window:limit=1,period=1h,name=per-user"))
        .tier(
            "premium",
            [p("fixed-window:limit=3,period=1h,name=per-user")],
        )
        .build()
        .unwrap()
        .layer(tower::service_fn(hello));
    let mut statuses = Vec::new();
    for _ in 0..2 {
        let res = svc
            .clone()
            .oneshot(req("pat", Some(Plan::Premium)))
            .await
            .unwrap();
        statuses.push(res.status().as_u16());
    }
    assert_eq!(statuses, [200, 429]);
}

/// Issue 24, trap 1: the request's tier, the key's stored tier and its override each change
/// only the policies they name; the first that names a policy supplies its parameters.
#[tokio::test]
async fn each_source_changes_only_the_policies_it_names() {
    let backend = MemoryBackend::builder().clock(hour_start()).build();
    let mut svc = RateLimitLayer::builder()
        .backend(backend.clone())
        .key(HeaderKey::named("x-api-key").unwrap())
        .policy(p("fixed-window:limit=1,period=1h,name=per-user"))
        .policy(p("fixed-window:limit=3,period=1h,name=guard"))
        .tier(
            "premium",
            [p("fixed-window:limit=10,period=1h,name=per-user")],
        )
        .request_tier(|req| match req.extensions().get::<Plan>() {
            Some(Plan::Premium) => RequestTier::named("premium"),
            Some(Plan::Admin) => RequestTier::Unlimited,
            _ => RequestTier::Defaults,
        })
        .build()
        .unwrap()
        .layer(tower::service_fn(hello));

    // A premium claim lifts per-user; the guard stays.
    let (s, policy, _) = send(&mut svc, "pat", Some(Plan::Premium), 4).await;
    assert_eq!(s, [200, 200, 200, 429]);
    assert_eq!(
        policy,
        "\"per-user\";q=10;w=3600;turnstile-tier=\"premium\", \"guard\";q=3;w=3600"
    );

    // An override of the guard alone: per-user still from the request's tier.
    let guard = [p("fixed-window:limit=5,period=1h,name=guard")];
    backend.set_override("kim", &guard).await.unwrap();
    let (s, policy, _) = send(&mut svc, "kim", Some(Plan::Premium), 6).await;
    assert_eq!(s, [200, 200, 200, 200, 200, 429]);
    assert_eq!(
        policy,
        "\"per-user\";q=10;w=3600;turnstile-tier=\"premium\", \"guard\";q=5;w=3600;turnstile-override"
    );

    // Unlimited exempts from every policy, but an operator's override still holds for the
    // policies it names.
    let (s, policy, _) = send(&mut svc, "root", Some(Plan::Admin), 20).await;
    assert_eq!((s, policy.as_str()), (vec![200; 20], "-"));
    backend.set_override("root", &guard).await.unwrap();
    let (s, policy, _) = send(&mut svc, "root", Some(Plan::Admin), 6).await;
    assert_eq!(s, [200, 200, 200, 200, 200, 429]);
    assert_eq!(policy, "\"guard\";q=5;w=3600;turnstile-override");
}
