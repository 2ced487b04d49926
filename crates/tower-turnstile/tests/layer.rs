//! The layer against tower's contract, with tower-test's mock service and virtual time.

use std::net::SocketAddr;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use tokio_test::{assert_pending, assert_ready_ok};
use tower_test::mock;
use tower_turnstile::{Backend, FailurePolicy, ManualClock, MemoryBackend, Policy, RateLimitLayer};

type Req = Request<()>;

fn req_from(ip: &str) -> Req {
    let mut req = Request::new(());
    req.extensions_mut()
        .insert(format!("{ip}:40000").parse::<SocketAddr>().unwrap());
    req
}

fn layer(spec: &str, clock: &ManualClock) -> RateLimitLayer<MemoryBackend<ManualClock>> {
    RateLimitLayer::new(spec.parse().unwrap())
        .backend(MemoryBackend::builder().clock(clock.clone()).build())
}

#[tokio::test]
async fn pending_readiness_is_propagated_and_the_ready_clone_is_called() {
    let clock = ManualClock::new(0);
    let (mut svc, mut handle) = mock::spawn_layer::<Req, Response<String>, _>(layer(
        "token-bucket:limit=5,period=1s",
        &clock,
    ));

    handle.allow(0);
    assert_pending!(svc.poll_ready());
    handle.allow(1);
    assert_ready_ok!(svc.poll_ready());

    // tower-test's mock panics if `call` reaches a clone that was not polled ready, so this
    // proves `call` uses the ready service (the in-memory backend decides in `call`, which
    // calls it at once; a backend that answers later has the future take it).
    let fut = tokio::spawn(svc.call(req_from("192.0.2.1")));
    let (req, send) = handle.next_request().await.unwrap();
    assert!(req.extensions().get::<SocketAddr>().is_some());
    send.send_response(Response::new("ok".to_owned()));
    let res = fut.await.unwrap().unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        res.headers()["ratelimit"],
        "\"token-bucket:limit=5,period=1s\";r=4;t=1"
    );
    assert_eq!(
        res.headers()["ratelimit-policy"],
        "\"token-bucket:limit=5,period=1s\";q=5;w=1"
    );
}

#[tokio::test]
async fn an_in_memory_admission_calls_the_inner_service_before_the_future_is_polled() {
    let clock = ManualClock::new(0);
    let (mut svc, mut handle) = mock::spawn_layer::<Req, Response<String>, _>(layer(
        "token-bucket:limit=5,period=1s",
        &clock,
    ));
    handle.allow(1);
    assert_ready_ok!(svc.poll_ready());
    let fut = svc.call(req_from("192.0.2.1"));
    // Not polled yet, and the request is already with the inner service.
    let (_, send) = handle.next_request().await.unwrap();
    send.send_response(Response::new("ok".to_owned()));
    let res = fut.await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        res.headers()["ratelimit"],
        "\"token-bucket:limit=5,period=1s\";r=4;t=1"
    );
}

#[tokio::test]
async fn a_denied_request_never_reaches_the_inner_service() {
    let clock = ManualClock::new(0);
    let (mut svc, mut handle) = mock::spawn_layer::<Req, Response<String>, _>(layer(
        "fixed-window:limit=2,period=1m,name=per-ip",
        &clock,
    ));
    for _ in 0..2 {
        handle.allow(1);
        assert_ready_ok!(svc.poll_ready());
        let fut = tokio::spawn(svc.call(req_from("192.0.2.1")));
        let (_, send) = handle.next_request().await.unwrap();
        send.send_response(Response::new(String::new()));
        assert_eq!(fut.await.unwrap().unwrap().status(), StatusCode::OK);
    }

    handle.allow(1);
    assert_ready_ok!(svc.poll_ready());
    let res = svc.call(req_from("192.0.2.1")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()["retry-after"], "60");
    assert_eq!(res.headers()["ratelimit"], "\"per-ip\";r=0;t=60");
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(json["status"], 429);
    assert_eq!(json["violated-policies"][0], "per-ip");
    // Nothing reached the mock.
    assert!(futures_poll_once(handle.next_request()).is_none());

    // Another client is unaffected.
    handle.allow(1);
    assert_ready_ok!(svc.poll_ready());
    let fut = tokio::spawn(svc.call(req_from("192.0.2.2")));
    let (_, send) = handle.next_request().await.unwrap();
    send.send_response(Response::new(String::new()));
    assert_eq!(fut.await.unwrap().unwrap().status(), StatusCode::OK);

    // A minute later the first client is admitted again.
    clock.advance(Duration::from_secs(60));
    handle.allow(1);
    assert_ready_ok!(svc.poll_ready());
    let fut = tokio::spawn(svc.call(req_from("192.0.2.1")));
    let (_, send) = handle.next_request().await.unwrap();
    send.send_response(Response::new(String::new()));
    assert_eq!(fut.await.unwrap().unwrap().status(), StatusCode::OK);
}

/// Polls a future once; `Some` if it completed.
fn futures_poll_once<F: std::future::Future>(f: F) -> Option<F::Output> {
    let mut f = std::pin::pin!(f);
    let waker = std::task::Waker::noop();
    match f.as_mut().poll(&mut std::task::Context::from_waker(waker)) {
        std::task::Poll::Ready(v) => Some(v),
        std::task::Poll::Pending => None,
    }
}

#[tokio::test]
async fn missing_peer_address_is_a_500_that_says_how_to_fix_it() {
    let clock = ManualClock::new(0);
    let (mut svc, mut handle) =
        mock::spawn_layer::<Req, Response<String>, _>(layer("gcra:limit=1,period=1s", &clock));
    handle.allow(1);
    assert_ready_ok!(svc.poll_ready());
    let res = svc.call(Request::new(())).await.unwrap();
    assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("into_make_service_with_connect_info"));
}

#[tokio::test]
async fn a_multi_policy_denial_reports_every_policy_unconsumed() {
    let clock = ManualClock::new(0);
    let l = RateLimitLayer::with_policies([
        "token-bucket:limit=1,period=1s,name=a"
            .parse::<Policy>()
            .unwrap(),
        "fixed-window:limit=3,period=1h,name=b".parse().unwrap(),
    ])
    .unwrap()
    .backend(MemoryBackend::builder().clock(clock.clone()).build());
    let (mut svc, mut handle) = mock::spawn_layer::<Req, Response<String>, _>(l);
    handle.allow(1);
    assert_ready_ok!(svc.poll_ready());
    let fut = tokio::spawn(svc.call(req_from("192.0.2.9")));
    let (_, send) = handle.next_request().await.unwrap();
    send.send_response(Response::new(String::new()));
    let res = fut.await.unwrap().unwrap();
    assert_eq!(
        res.headers()["ratelimit"],
        "\"a\";r=0;t=1, \"b\";r=2;t=3600"
    );
    handle.allow(1);
    assert_ready_ok!(svc.poll_ready());
    let res = svc.call(req_from("192.0.2.9")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    // Denied by "a" only; "b" reports its count as if nothing were consumed.
    assert_eq!(
        res.headers()["ratelimit"],
        "\"a\";r=0;t=1, \"b\";r=2;t=3600"
    );
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(json["violated-policies"], serde_json::json!(["a"]));
}

#[tokio::test(start_paused = true)]
async fn leaky_bucket_delay_is_waited_out_before_the_inner_call() {
    let clock = ManualClock::new(0);
    let (mut svc, mut handle) = mock::spawn_layer::<Req, Response<String>, _>(layer(
        "leaky-bucket:limit=2,period=1s,burst=3",
        &clock,
    ));
    handle.allow(3);
    let mut waits = Vec::new();
    for _ in 0..3 {
        assert_ready_ok!(svc.poll_ready());
        let start = tokio::time::Instant::now();
        let fut = tokio::spawn(svc.call(req_from("192.0.2.1")));
        let (_, send) = handle.next_request().await.unwrap();
        waits.push(start.elapsed());
        send.send_response(Response::new(String::new()));
        assert_eq!(fut.await.unwrap().unwrap().status(), StatusCode::OK);
    }
    // Queue of 0, 1 and 2 units ahead, draining one per 500 ms.
    assert_eq!(
        waits,
        [
            Duration::ZERO,
            Duration::from_millis(500),
            Duration::from_millis(1000)
        ]
    );
}

#[tokio::test]
async fn backend_failure_follows_the_failure_policy() {
    let pol: Policy = "token-bucket:limit=5,period=1s".parse().unwrap();
    let full = MemoryBackend::builder().max_keys(1).build();
    // Fill the one slot.
    full.check("someone-else", std::slice::from_ref(&pol), 1)
        .into_inner()
        .unwrap();

    let closed = RateLimitLayer::new(pol.clone())
        .backend(full.clone())
        .on_backend_failure(FailurePolicy::Closed);
    let (mut svc, mut handle) = mock::spawn_layer::<Req, Response<String>, _>(closed);
    handle.allow(1);
    assert_ready_ok!(svc.poll_ready());
    let res = svc.call(req_from("192.0.2.1")).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);

    let open = RateLimitLayer::new(pol).backend(full);
    let (mut svc, mut handle) = mock::spawn_layer::<Req, Response<String>, _>(open);
    handle.allow(1);
    assert_ready_ok!(svc.poll_ready());
    let fut = tokio::spawn(svc.call(req_from("192.0.2.1")));
    let (_, send) = handle.next_request().await.unwrap();
    send.send_response(Response::new(String::new()));
    let res = fut.await.unwrap().unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(res.headers().get("ratelimit").is_none());
}

#[tokio::test]
async fn dropping_the_future_leaves_the_limiter_consistent() {
    let clock = ManualClock::new(0);
    let backend = MemoryBackend::builder().clock(clock.clone()).build();
    let pol: Policy = "token-bucket:limit=3,period=1s".parse().unwrap();
    let (mut svc, mut handle) = mock::spawn_layer::<Req, Response<String>, _>(
        RateLimitLayer::new(pol.clone()).backend(backend.clone()),
    );
    handle.allow(2);
    assert_ready_ok!(svc.poll_ready());
    drop(svc.call(req_from("192.0.2.1")));
    // The memory backend decided (and consumed) at call time; a dropped future neither
    // double-counts nor corrupts: exactly one unit is used.
    let q = backend.check("192.0.2.1", &[pol], 0).into_inner().unwrap();
    assert_eq!(q.remaining(), 2);
    assert_ready_ok!(svc.poll_ready());
}

#[tokio::test]
async fn a_response_future_polled_after_it_completed_stays_pending() {
    // (Admitted, failed and denied.)
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    let clock = ManualClock::new(0);
    let (mut svc, mut handle) = mock::spawn_layer::<Req, Response<String>, _>(layer(
        "fixed-window:limit=1,period=1m",
        &clock,
    ));
    let mut cx = Context::from_waker(Waker::noop());
    // Admitted: the inner service's answer once, then pending (the mock's finished future
    // is never polled again).
    handle.allow(1);
    assert_ready_ok!(svc.poll_ready());
    let mut fut = std::pin::pin!(svc.call(req_from("192.0.2.1")));
    let (_, send) = handle.next_request().await.unwrap();
    send.send_response(Response::new("ok".to_owned()));
    match fut.as_mut().poll(&mut cx) {
        Poll::Ready(Ok(res)) => assert_eq!(res.status(), StatusCode::OK),
        other => panic!("{other:?}"),
    }
    assert!(fut.as_mut().poll(&mut cx).is_pending());
    // The inner service's error: once, then pending (another client, within its limit).
    handle.allow(1);
    assert_ready_ok!(svc.poll_ready());
    let mut fut = std::pin::pin!(svc.call(req_from("192.0.2.2")));
    let (_, send) = handle.next_request().await.unwrap();
    send.send_error("inner failure");
    assert!(matches!(fut.as_mut().poll(&mut cx), Poll::Ready(Err(_))));
    assert!(fut.as_mut().poll(&mut cx).is_pending());
    // Denied: the denial once, then pending.
    handle.allow(1);
    assert_ready_ok!(svc.poll_ready());
    let mut fut = std::pin::pin!(svc.call(req_from("192.0.2.1")));
    match fut.as_mut().poll(&mut cx) {
        Poll::Ready(Ok(res)) => assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS),
        other => panic!("{other:?}"),
    }
    assert!(fut.as_mut().poll(&mut cx).is_pending());
    assert!(format!("{fut:?}").contains("\"done\""), "{fut:?}");
}
