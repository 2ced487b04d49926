//! Waiting holds nothing of the inner service: a request that waits out a leaky bucket's
//! delay or an `Action::Delay` re-check releases the readiness it reserved (here, the one
//! permit of a `ConcurrencyLimit(1)` inside the layer) and acquires it again when its wait
//! ends. Virtual time: the backend's clock reads tokio's paused clock.

mod support;

use std::convert::Infallible;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use support::{request, settle, TokioClock};
use tokio::time::Instant;
use tower::limit::ConcurrencyLimitLayer;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_turnstile::{Action, MemoryBackend, Policy, RateLimitLayer, Rule};

fn backend() -> MemoryBackend<TokioClock> {
    MemoryBackend::builder()
        .clock(TokioClock::starting_at(1_700_000_000_000))
        .build()
}

fn get(path: &str) -> Request<()> {
    request("GET", path, "192.0.2.1:40000")
}

/// The inner handler: answers 200 at once.
type Handler = fn(Request<()>) -> std::future::Ready<Result<Response<String>, Infallible>>;

/// The app: answers 200 at once, behind a concurrency limit of one.
fn app<L>(layer: L) -> L::Service
where
    L: Layer<tower::limit::ConcurrencyLimit<tower::util::ServiceFn<Handler>>>,
{
    let ok: Handler = |_| std::future::ready(Ok(Response::new(String::from("ok"))));
    layer.layer(ConcurrencyLimitLayer::new(1).layer(tower::service_fn(ok)))
}

/// Sends `req` through a fresh clone of `svc` (readied first) on its own task: the time it
/// was answered (from `start`) and its status.
fn send<S>(
    svc: &S,
    req: Request<()>,
    start: Instant,
) -> tokio::task::JoinHandle<(Duration, StatusCode)>
where
    S: Service<Request<()>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
    S::Response: HasStatus,
{
    let svc = svc.clone();
    tokio::spawn(async move {
        let res = svc.oneshot(req).await.unwrap();
        (start.elapsed(), res.status())
    })
}

/// The status of a response, whatever its body.
trait HasStatus {
    fn status(&self) -> StatusCode;
}

impl<B> HasStatus for Response<B> {
    fn status(&self) -> StatusCode {
        Response::status(self)
    }
}

#[tokio::test(start_paused = true)]
async fn an_exempt_request_waited_behind_a_leaky_delay_for_the_inner_services_permit() {
    // Leaky bucket, 1 per second, burst 2: the first request goes at once, the second waits
    // 1 s in the queue. An exempt request sent meanwhile used to wait for the permit the
    // delayed one reserved (951 ms in the report); now it answers at once.
    let layer = RateLimitLayer::builder()
        .backend(backend())
        .rule(Rule::new().path("/healthz").exempt())
        .policy(
            "leaky-bucket:limit=1,period=1s,burst=2"
                .parse::<Policy>()
                .unwrap(),
        )
        .build()
        .unwrap();
    let svc = app(layer);
    let start = Instant::now();
    let first = send(&svc, get("/"), start);
    settle().await;
    assert_eq!(first.await.unwrap(), (Duration::ZERO, StatusCode::OK));
    let delayed = send(&svc, get("/"), start);
    settle().await;
    assert!(!delayed.is_finished(), "the second request waits its delay");
    let exempt = send(&svc, get("/healthz"), start);
    assert_eq!(exempt.await.unwrap(), (Duration::ZERO, StatusCode::OK));
    // The delayed one acquires the permit again when its delay ends, and gets through.
    assert_eq!(
        delayed.await.unwrap(),
        (Duration::from_secs(1), StatusCode::OK)
    );
}

#[tokio::test(start_paused = true)]
async fn an_exempt_request_waited_behind_a_delay_recheck_for_the_inner_services_permit() {
    // Token bucket, 1 per second: the second request is held for a re-check in 1 s
    // (Action::Delay); the exempt one meanwhile answers at once.
    let layer = RateLimitLayer::builder()
        .backend(backend())
        .rule(Rule::new().path("/healthz").exempt())
        .policy("token-bucket:limit=1,period=1s".parse::<Policy>().unwrap())
        .action(Action::delay(Duration::from_secs(5)))
        .build()
        .unwrap();
    let svc = app(layer);
    let start = Instant::now();
    assert_eq!(
        send(&svc, get("/"), start).await.unwrap(),
        (Duration::ZERO, StatusCode::OK)
    );
    let held = send(&svc, get("/"), start);
    settle().await;
    assert!(
        !held.is_finished(),
        "the second request is held for a re-check"
    );
    let exempt = send(&svc, get("/healthz"), start);
    assert_eq!(exempt.await.unwrap(), (Duration::ZERO, StatusCode::OK));
    assert_eq!(
        held.await.unwrap(),
        (Duration::from_secs(1), StatusCode::OK)
    );
}

#[tokio::test(start_paused = true)]
async fn a_delayed_request_waits_for_the_permit_again_when_its_delay_ends() {
    // Backpressure stays: a request whose delay ends while another holds the inner
    // service's one permit waits for it, and is called when that one finishes.
    let layer = RateLimitLayer::builder()
        .backend(backend())
        .rule(Rule::new().path("/slow").exempt())
        .policy(
            "leaky-bucket:limit=1,period=1s,burst=2"
                .parse::<Policy>()
                .unwrap(),
        )
        .build()
        .unwrap();
    let inner = tower::service_fn(|req: Request<()>| async move {
        if req.uri().path() == "/slow" {
            tokio::time::sleep(Duration::from_millis(1500)).await;
        }
        Ok::<_, Infallible>(Response::new(String::new()))
    });
    let svc = ServiceBuilder::new()
        .layer(layer)
        .concurrency_limit(1)
        .service(inner);
    let start = Instant::now();
    assert_eq!(
        send(&svc, get("/"), start).await.unwrap(),
        (Duration::ZERO, StatusCode::OK)
    );
    // Queued behind the first: a delay of 1 s, holding no permit.
    let delayed = send(&svc, get("/"), start);
    settle().await;
    // So the slow exempt request gets the permit at once, and keeps it 1.5 s.
    let slow = send(&svc, get("/slow"), start);
    settle().await;
    assert!(!delayed.is_finished() && !slow.is_finished());
    assert_eq!(
        slow.await.unwrap(),
        (Duration::from_millis(1500), StatusCode::OK)
    );
    // The delayed one's delay ended at 1 s; it got the permit back at 1.5 s.
    assert_eq!(
        delayed.await.unwrap(),
        (Duration::from_millis(1500), StatusCode::OK)
    );
}

#[tokio::test(start_paused = true)]
async fn a_denied_request_holds_no_permit_of_the_inner_service() {
    // Fixed window, 1 a minute: the second request is denied. The permit its readied service
    // reserved is given back when the denial is decided (in `call`, the backend being in
    // memory), not when its response future goes: another clone gets it meanwhile.
    let layer = RateLimitLayer::builder()
        .backend(backend())
        .policy("fixed-window:limit=1,period=1m".parse::<Policy>().unwrap())
        .build()
        .unwrap();
    let svc = app(layer);
    let start = Instant::now();
    assert_eq!(
        send(&svc, get("/"), start).await.unwrap(),
        (Duration::ZERO, StatusCode::OK)
    );
    let mut denied_svc = svc.clone();
    denied_svc.ready().await.unwrap();
    let denied = denied_svc.call(get("/"));
    let mut other = svc.clone();
    let ready = tokio::time::timeout(Duration::from_millis(1), other.ready()).await;
    assert!(
        ready.is_ok(),
        "the denied request kept the inner service's permit"
    );
    assert_eq!(
        denied.await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}
