//! Rules, keys, costs, actions (delay, shadow) and responses, through the layer, on virtual
//! time: the backend's clock reads tokio's paused clock, so waits are exact and instant.

mod support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use support::{p, request, tokio_backend};
use tokio::time::Instant;
use tokio_test::{assert_pending, assert_ready_ok};
use tower::{Layer, Service, ServiceExt};
use tower_test::mock;
use tower_turnstile::key::{ClientIp, HeaderKey, RequestRef};
use tower_turnstile::{
    Action, Backend, FailurePolicy, MemoryBackend, MissingKey, Protocol, RateLimitLayer, Rule,
};

fn req(method: Method, path: &str, ip: &str) -> Request<()> {
    let peer = SocketAddr::new(ip.parse().unwrap(), 40000);
    request(method.as_str(), path, &peer.to_string())
}

fn get(path: &str) -> Request<()> {
    req(Method::GET, path, "192.0.2.1")
}

/// An inner service that answers 200 "ok" and records when each call arrived.
#[derive(Clone, Default)]
struct Recorder {
    calls: Arc<Mutex<Vec<Duration>>>,
    start: Arc<Mutex<Option<Instant>>>,
}

impl Recorder {
    fn new() -> Self {
        let r = Recorder::default();
        *r.start.lock().unwrap() = Some(Instant::now());
        r
    }

    fn count(&self) -> usize {
        self.calls.lock().unwrap().len()
    }

    fn times(&self) -> Vec<Duration> {
        self.calls.lock().unwrap().clone()
    }
}

impl Service<Request<()>> for Recorder {
    type Response = Response<String>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<String>, Infallible>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: Request<()>) -> Self::Future {
        let start = self.start.lock().unwrap().unwrap_or_else(Instant::now);
        self.calls.lock().unwrap().push(start.elapsed());
        std::future::ready(Ok(Response::new("ok".to_owned())))
    }
}

/// Sends `n` requests at once; returns each one's status and how long it took.
async fn burst<S>(svc: S, n: usize, make: impl Fn() -> Request<()>) -> Vec<(StatusCode, Duration)>
where
    S: Service<Request<()>, Response = Response<String>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    let start = Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let svc = svc.clone();
            let r = make();
            tokio::spawn(async move {
                let res = svc.oneshot(r).await.unwrap();
                (res.status(), start.elapsed())
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

#[tokio::test(start_paused = true)]
async fn delay_waits_for_retry_after_and_never_longer_than_max_wait() {
    let max_wait = Duration::from_millis(1200);
    let inner = Recorder::new();
    let layer = RateLimitLayer::builder()
        .backend(tokio_backend())
        .policy(p("token-bucket:limit=2,period=1s"))
        .action(Action::delay(max_wait))
        .build()
        .unwrap();
    let svc = layer.layer(inner.clone());
    let out = burst(svc, 6, || get("/")).await;
    for (status, took) in &out {
        assert!(*took <= max_wait, "{status} after {took:?}");
    }
    let ok = out.iter().filter(|(s, _)| *s == StatusCode::OK).count();
    // Two at once, one more at 500 ms and 1000 ms; the rest cannot make it by 1200 ms and
    // are rejected at 1000 ms, when their next wait would end too late.
    assert_eq!(ok, 4);
    let mut times = inner.times();
    times.sort();
    assert_eq!(
        times,
        [
            Duration::ZERO,
            Duration::ZERO,
            Duration::from_millis(500),
            Duration::from_millis(1000)
        ]
    );
    for (status, took) in &out {
        if *status == StatusCode::TOO_MANY_REQUESTS {
            assert_eq!(*took, Duration::from_millis(1000));
        }
    }
}

#[tokio::test(start_paused = true)]
async fn delay_rejects_at_once_when_no_wait_can_help() {
    let inner = Recorder::new();
    let layer = RateLimitLayer::builder()
        .backend(tokio_backend())
        .policy(p("token-bucket:limit=2,period=1s"))
        .cost(|_: &RequestRef<'_>| 3)
        .action(Action::delay(Duration::from_secs(60)))
        .build()
        .unwrap();
    let start = Instant::now();
    let res = layer.layer(inner.clone()).oneshot(get("/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert!(res.headers().get("retry-after").is_none());
    assert_eq!(inner.count(), 0);
}

#[tokio::test(start_paused = true)]
async fn delay_counts_a_leaky_buckets_delay_in_the_maximum() {
    // B = 2, T = 500 ms: a leaky bucket delays by at most (B − 1)·T = 500 ms.
    let max_wait = Duration::from_millis(1000);
    let inner = Recorder::new();
    let layer = RateLimitLayer::builder()
        .backend(tokio_backend())
        .policy(p("leaky-bucket:limit=2,period=1s"))
        .action(Action::delay(max_wait))
        .build()
        .unwrap();
    let out = burst(layer.layer(inner.clone()), 5, || get("/")).await;
    for (status, took) in &out {
        assert!(*took <= max_wait, "{status} after {took:?}");
    }
    let mut times = inner.times();
    times.sort();
    // Queue: 0 ms and 500 ms at once; the third waits 500 ms for room, then 500 ms in the
    // queue; the others could not be through by 1000 ms.
    assert_eq!(
        times,
        [
            Duration::ZERO,
            Duration::from_millis(500),
            Duration::from_millis(1000)
        ]
    );
    let denied = out
        .iter()
        .filter(|(s, _)| *s == StatusCode::TOO_MANY_REQUESTS)
        .count();
    assert_eq!(denied, 2);
}

#[tokio::test(start_paused = true)]
async fn shadow_never_rejects_but_counts_what_it_would_have_denied() {
    let inner = Recorder::new();
    let layer = RateLimitLayer::builder()
        .backend(tokio_backend())
        .policies([
            p("fixed-window:limit=1,period=1m"),
            p("leaky-bucket:limit=1,period=1s,burst=5"),
        ])
        .action(Action::Shadow)
        .build()
        .unwrap();
    let start = Instant::now();
    for _ in 0..5 {
        let res = layer.layer(inner.clone()).oneshot(get("/")).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        // A dry run shows clients nothing.
        assert!(res.headers().get("ratelimit").is_none());
    }
    assert_eq!(inner.count(), 5);
    assert_eq!(layer.shadow_denied(), 4);
    // A layer changed after it was built keeps counting where it was.
    let changed = layer
        .clone()
        .with_action(Action::Shadow)
        .unwrap()
        .on_backend_failure(tower_turnstile::FailurePolicy::Closed)
        .backend(tokio_backend());
    assert_eq!(changed.shadow_denied(), 4);
    let res = changed
        .layer(inner.clone())
        .oneshot(get("/"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let res = changed
        .layer(inner.clone())
        .oneshot(get("/"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!((changed.shadow_denied(), layer.shadow_denied()), (5, 5));

    // Nor does it shape: a leaky bucket's delays are not waited out.
    let shaper = RateLimitLayer::builder()
        .backend(tokio_backend())
        .policy(p("leaky-bucket:limit=1,period=1s,burst=5"))
        .action(Action::Shadow)
        .build()
        .unwrap();
    for _ in 0..5 {
        let res = shaper.layer(inner.clone()).oneshot(get("/")).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
    }
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(shaper.shadow_denied(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_request_dropped_while_waiting_consumes_nothing() {
    let b = tokio_backend();
    let pol = p("token-bucket:limit=1,period=1s,name=one");
    let layer = RateLimitLayer::builder()
        .backend(b.clone())
        .policy(pol.clone())
        .action(Action::delay(Duration::from_secs(5)))
        .build()
        .unwrap();
    let inner = Recorder::new();
    let mut svc = layer.layer(inner.clone());
    assert_eq!(svc.call(get("/")).await.unwrap().status(), StatusCode::OK);

    // The second is denied and held for a re-check; drop it mid-wait.
    let mut fut = tokio_test::task::spawn(svc.call(get("/")));
    assert_pending!(fut.poll());
    tokio::time::advance(Duration::from_millis(300)).await;
    assert_pending!(fut.poll());
    drop(fut);
    assert_eq!(inner.count(), 1);

    // Exactly one unit was used: a second later the bucket is full again.
    tokio::time::advance(Duration::from_millis(700)).await;
    let q = b.check("192.0.2.1", &[pol], 0).await.unwrap();
    assert_eq!(q.remaining(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_request_dropped_during_its_leaky_delay_keeps_its_place_used() {
    let b = tokio_backend();
    let pol = p("leaky-bucket:limit=1,period=1s,burst=3,name=q");
    let layer = RateLimitLayer::builder()
        .backend(b.clone())
        .policy(pol.clone())
        .build()
        .unwrap();
    let inner = Recorder::new();
    let mut svc = layer.layer(inner.clone());
    assert_eq!(svc.call(get("/")).await.unwrap().status(), StatusCode::OK);
    let mut fut = tokio_test::task::spawn(svc.call(get("/")));
    assert_pending!(fut.poll());
    drop(fut);
    // Admitted (it consumed its unit) but never reached the inner service.
    assert_eq!(inner.count(), 1);
    let q = b.check("192.0.2.1", &[pol], 0).await.unwrap();
    assert_eq!(q.remaining(), 1);
    assert_eq!(q.delay(), Duration::from_secs(2));
}

#[tokio::test]
async fn backpressure_checks_nothing_until_the_inner_service_is_ready() {
    let b = tokio_backend();
    let layer = RateLimitLayer::builder()
        .backend(b.clone())
        .policy(p("gcra:limit=1,period=1s"))
        .build()
        .unwrap();
    let (mut svc, mut handle) = mock::spawn_layer::<Request<()>, Response<String>, _>(layer);
    handle.allow(0);
    assert_pending!(svc.poll_ready());
    assert_pending!(svc.poll_ready());
    assert!(
        b.is_empty(),
        "no check while the inner service is not ready"
    );
    handle.allow(1);
    assert_ready_ok!(svc.poll_ready());
    let fut = tokio::spawn(svc.call(get("/")));
    let (_, send) = handle.next_request().await.unwrap();
    send.send_response(Response::new(String::new()));
    assert_eq!(fut.await.unwrap().unwrap().status(), StatusCode::OK);
    assert_eq!(b.len(), 1);
    // The service's one permit was used: not ready again until the mock allows more.
    assert_pending!(svc.poll_ready());
}

#[tokio::test]
async fn routes_get_their_own_counters_unless_they_share_a_name() {
    let inner = Recorder::new();
    let layer = RateLimitLayer::builder()
        .backend(tokio_backend())
        .rule(Rule::new().path("/healthz").exempt())
        .rule(
            Rule::new()
                .path("/a")
                .policy(p("fixed-window:limit=1,period=1m")),
        )
        .rule(
            Rule::new()
                .path("/b")
                .policy(p("fixed-window:limit=1,period=1m")),
        )
        .rule(
            Rule::new()
                .path("/c")
                .policy(p("fixed-window:limit=1,period=1m,name=cd")),
        )
        .rule(
            Rule::new()
                .path("/d")
                .policy(p("fixed-window:limit=1,period=1m,name=cd")),
        )
        .rule(
            Rule::new()
                .method(Method::POST)
                .path_prefix("/api")
                .policy(p("fixed-window:limit=1,period=1m")),
        )
        .build()
        .unwrap();
    let svc = layer.layer(inner.clone());
    let status = |r| {
        let svc = svc.clone();
        async move { svc.oneshot(r).await.unwrap().status() }
    };
    assert_eq!(status(get("/a")).await, StatusCode::OK);
    assert_eq!(status(get("/a")).await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(status(get("/b")).await, StatusCode::OK);
    assert_eq!(status(get("/c")).await, StatusCode::OK);
    assert_eq!(status(get("/d")).await, StatusCode::TOO_MANY_REQUESTS);
    for _ in 0..5 {
        let res = svc.clone().oneshot(get("/healthz")).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert!(res.headers().get("ratelimit").is_none());
        // No rule matches: not limited either.
        assert_eq!(status(get("/other")).await, StatusCode::OK);
        assert_eq!(status(get("/api/x")).await, StatusCode::OK);
    }
    let res = svc
        .clone()
        .oneshot(req(Method::POST, "/api/users", "192.0.2.1"))
        .await
        .unwrap();
    assert_eq!(
        res.headers()["ratelimit-policy"],
        "\"POST /api/* fixed-window:limit=1,period=1m\";q=1;w=60"
    );
    assert_eq!(
        status(req(Method::POST, "/api/items", "192.0.2.1")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn exempt_keys_and_costs() {
    let inner = Recorder::new();
    let layer = RateLimitLayer::builder()
        .backend(tokio_backend())
        .policy(p("token-bucket:limit=10,period=1m,name=units"))
        .cost(|r: &RequestRef<'_>| {
            r.headers()
                .get("x-cost")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(1)
        })
        .exempt_key("192.0.2.99")
        .build()
        .unwrap();
    let svc = layer.layer(inner);
    for _ in 0..20 {
        let res = svc
            .clone()
            .oneshot(req(Method::GET, "/", "192.0.2.99"))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert!(res.headers().get("ratelimit").is_none());
    }
    let mut r = get("/");
    r.headers_mut().insert("x-cost", "7".parse().unwrap());
    let res = svc.clone().oneshot(r).await.unwrap();
    assert_eq!(res.headers()["ratelimit"], "\"units\";r=3;t=42");
    let mut r = get("/");
    r.headers_mut().insert("x-cost", "4".parse().unwrap());
    assert_eq!(
        svc.clone().oneshot(r).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // A cost of 0 is a query: admitted, counting nothing.
    let mut r = get("/");
    r.headers_mut().insert("x-cost", "0".parse().unwrap());
    let res = svc.clone().oneshot(r).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["ratelimit"], "\"units\";r=3;t=42");
}

#[tokio::test]
async fn a_missing_key_gets_the_configured_outcome() {
    let build = |m: MissingKey| {
        RateLimitLayer::builder()
            .backend(tokio_backend())
            .key(HeaderKey::named("x-api-key").unwrap())
            .policy(p("fixed-window:limit=1,period=1m,name=per-key"))
            .on_missing_key(m)
            .build()
            .unwrap()
            .layer(Recorder::new())
    };
    let res = build(MissingKey::Reject).oneshot(get("/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("x-api-key"));

    let allow = build(MissingKey::Allow);
    for _ in 0..3 {
        let res = allow.clone().oneshot(get("/")).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert!(res.headers().get("ratelimit").is_none());
    }

    let shared = build(MissingKey::key("anonymous"));
    assert_eq!(
        shared.clone().oneshot(get("/")).await.unwrap().status(),
        StatusCode::OK
    );
    assert_eq!(
        shared.clone().oneshot(get("/")).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    let mut keyed = get("/");
    keyed
        .headers_mut()
        .insert("x-api-key", "k1".parse().unwrap());
    assert_eq!(
        shared.oneshot(keyed).await.unwrap().status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn legacy_headers_and_no_headers_on_allowed() {
    let layer = RateLimitLayer::builder()
        .backend(tokio_backend())
        .policies([
            p("fixed-window:limit=3,period=1m,name=minute"),
            p("fixed-window:limit=100,period=1h,name=hour"),
        ])
        .legacy_headers(true)
        .build()
        .unwrap();
    let svc = layer.layer(Recorder::new());
    let res = svc.clone().oneshot(get("/")).await.unwrap();
    assert_eq!(res.headers()["x-ratelimit-limit"], "3");
    assert_eq!(res.headers()["x-ratelimit-remaining"], "2");
    let reset: u64 = res.headers()["x-ratelimit-reset"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&reset));

    let quiet = RateLimitLayer::builder()
        .backend(tokio_backend())
        .policy(p("fixed-window:limit=1,period=1m,name=minute"))
        .headers_on_allowed(false)
        .build()
        .unwrap()
        .layer(Recorder::new());
    let res = quiet.clone().oneshot(get("/")).await.unwrap();
    assert!(res.headers().get("ratelimit").is_none());
    // Denials always carry them.
    let res = quiet.oneshot(get("/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()["ratelimit"], "\"minute\";r=0;t=60");
}

fn grpc_req(path: &str) -> Request<()> {
    let mut r = req(Method::POST, path, "192.0.2.1");
    r.headers_mut()
        .insert("content-type", "application/grpc+proto".parse().unwrap());
    r
}

#[tokio::test]
async fn a_grpc_call_is_denied_with_a_trailers_only_resource_exhausted() {
    let layer = RateLimitLayer::builder()
        .backend(tokio_backend())
        .rule(
            Rule::new()
                .grpc_method("helloworld.Greeter", "SayHello")
                .policy(p("fixed-window:limit=1,period=1m,name=hello")),
        )
        .build()
        .unwrap();
    let svc = layer.layer(Recorder::new());
    let ok = svc
        .clone()
        .oneshot(grpc_req("/helloworld.Greeter/SayHello"))
        .await
        .unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    let res = svc
        .clone()
        .oneshot(grpc_req("/helloworld.Greeter/SayHello"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let h = res.headers();
    assert_eq!(h["content-type"], "application/grpc");
    assert_eq!(h["grpc-status"], "8");
    assert_eq!(
        h["grpc-message"],
        "Rate%20limit%20exceeded;%20retry%20in%2060%20s."
    );
    assert!(!h["grpc-status-details-bin"].is_empty());
    assert!(h.get("retry-after").is_none());
    assert_eq!(h["ratelimit"], "\"hello\";r=0;t=60");
    // Trailers-only: no body at all.
    assert!(res
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .is_empty());
    // Another method of the service matches no rule.
    let other = svc
        .oneshot(grpc_req("/helloworld.Greeter/SayBye"))
        .await
        .unwrap();
    assert!(other.headers().get("grpc-status").is_none());
}

#[tokio::test]
async fn a_custom_denial_response_is_told_the_protocol() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = Arc::clone(&seen);
    let layer = RateLimitLayer::builder()
        .backend(tokio_backend())
        .policy(p("fixed-window:limit=1,period=1m,name=m"))
        .denial_response(move |d| {
            seen2.lock().unwrap().push(d.protocol());
            if d.is_grpc() {
                d.default_response()
            } else {
                let mut r = Response::new(bytes::Bytes::from_static(b"slow down"));
                *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                r
            }
        })
        .build()
        .unwrap();
    let svc = layer.layer(Recorder::new());
    svc.clone().oneshot(get("/")).await.unwrap();
    let res = svc.clone().oneshot(get("/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(res.headers()["ratelimit"], "\"m\";r=0;t=60");
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"slow down");
    let res = svc.oneshot(grpc_req("/x.Y/Z")).await.unwrap();
    assert_eq!(res.headers()["grpc-status"], "8");
    assert_eq!(*seen.lock().unwrap(), [Protocol::Http, Protocol::Grpc]);
}

#[tokio::test]
async fn fail_closed_is_unavailable_for_grpc_and_503_for_http() {
    let pol = p("token-bucket:limit=5,period=1s");
    let full = MemoryBackend::builder().max_keys(1).build();
    full.check("someone-else", std::slice::from_ref(&pol), 1)
        .into_inner()
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let calls2 = Arc::clone(&calls);
    let inner = tower::service_fn(move |_r: Request<()>| {
        calls2.fetch_add(1, Ordering::Relaxed);
        async { Ok::<_, Infallible>(Response::new(String::new())) }
    });
    let svc = RateLimitLayer::new(pol)
        .backend(full)
        .on_backend_failure(FailurePolicy::Closed)
        .layer(inner);
    let res = svc.clone().oneshot(grpc_req("/x.Y/Z")).await.unwrap();
    assert_eq!(res.headers()["grpc-status"], "14");
    let res = svc.oneshot(get("/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(calls.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn client_ip_keys_behind_a_trusted_proxy_through_the_layer() {
    let layer = RateLimitLayer::builder()
        .backend(tokio_backend())
        .key(ClientIp::new().trust("10.0.0.0/8".parse().unwrap()))
        .policy(p("fixed-window:limit=1,period=1m,name=ip"))
        .build()
        .unwrap();
    let svc = layer.layer(Recorder::new());
    let via = |peer: &str, xff: &str| {
        let mut r = req(Method::GET, "/", peer);
        r.headers_mut()
            .insert("x-forwarded-for", xff.parse().unwrap());
        let svc = svc.clone();
        async move { svc.oneshot(r).await.unwrap().status() }
    };
    // Through the proxy, two clients are two keys.
    assert_eq!(via("10.0.0.1", "198.51.100.1").await, StatusCode::OK);
    assert_eq!(via("10.0.0.1", "198.51.100.2").await, StatusCode::OK);
    assert_eq!(
        via("10.0.0.2", "6.6.6.6, 198.51.100.1").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // A client talking directly cannot pick its key with a header.
    assert_eq!(via("203.0.113.5", "198.51.100.9").await, StatusCode::OK);
    assert_eq!(
        via("203.0.113.5", "198.51.100.10").await,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn ipv6_peers_are_grouped_by_64_and_mapped_ipv4_is_ipv4() {
    let layer = RateLimitLayer::builder()
        .backend(tokio_backend())
        .policy(p("fixed-window:limit=1,period=1m,name=ip"))
        .build()
        .unwrap();
    let svc = layer.layer(Recorder::new());
    let from = |ip: &str| {
        let svc = svc.clone();
        let r = req(Method::GET, "/", ip);
        async move { svc.oneshot(r).await.unwrap().status() }
    };
    assert_eq!(from("2001:db8:1:2::1").await, StatusCode::OK);
    assert_eq!(
        from("2001:db8:1:2:ffff::9").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(from("2001:db8:1:3::1").await, StatusCode::OK);
    assert_eq!(from("192.0.2.7").await, StatusCode::OK);
    assert_eq!(
        from("::ffff:192.0.2.7").await,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[test]
fn the_layer_is_clone_send_sync_and_its_service_and_future_are_send() {
    fn clone_send_sync<T: Clone + Send + Sync>(_: &T) {}
    fn send<T: Send>(_: &T) {}
    let layer = RateLimitLayer::builder()
        .key((ClientIp::new(), HeaderKey::named("x-api-key").unwrap()))
        .policy(p("gcra:limit=1,period=1s"))
        .cost(|_: &RequestRef<'_>| 1)
        .denial_response(|d| d.default_response())
        .build()
        .unwrap();
    clone_send_sync(&layer);
    let mut svc = layer.layer(Recorder::new());
    clone_send_sync(&svc);
    let fut = svc.call(get("/"));
    send(&fut);
    clone_send_sync(&RateLimitLayer::new(p("gcra:limit=1,period=1s")));
}
