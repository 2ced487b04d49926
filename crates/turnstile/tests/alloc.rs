//! Heap allocations per request through the layer, counted by dhat's global allocator: a
//! guard against regressions on the hot path (one test only in this binary, so nothing else
//! allocates while it counts).

use std::convert::Infallible;
use std::net::SocketAddr;

use http::{Request, Response};
use tower::{Layer, Service, ServiceExt};
use turnstile::{Backend, Policy, RateLimitLayer};

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

fn allocations() -> u64 {
    dhat::HeapStats::get().total_blocks
}

fn request(peer: SocketAddr) -> Request<()> {
    let mut r = Request::new(());
    r.extensions_mut().insert(peer);
    r
}

/// Allocations of one request through `svc`, averaged over `n` requests (after a warm-up),
/// not counting building the request and the inner service's own response.
async fn per_request<S>(mut svc: S, n: usize, denied: bool) -> f64
where
    S: Service<Request<()>, Error = Infallible>,
{
    let peer: SocketAddr = "192.0.2.1:4000".parse().unwrap();
    for _ in 0..3 {
        let _ = svc.ready().await.unwrap().call(request(peer)).await;
    }
    let reqs: Vec<_> = (0..n).map(|_| request(peer)).collect();
    let before = allocations();
    for r in reqs {
        let res = svc.ready().await.unwrap().call(r).await.unwrap();
        drop(res);
    }
    let total = allocations() - before;
    let _ = denied;
    total as f64 / n as f64
}

#[tokio::test(flavor = "current_thread")]
async fn allocations_per_request() {
    let _profiler = dhat::Profiler::builder().testing().build();
    // The inner service's response: one allocation for its header map is the inner
    // service's, so answer with a response that has none.
    let inner = tower::service_fn(|_r: Request<()>| async {
        Ok::<_, Infallible>(Response::new(String::new()))
    });
    let baseline = per_request(inner, 1000, false).await;

    let admit = RateLimitLayer::new(
        "token-bucket:limit=4294967295,period=1s,name=per-ip"
            .parse::<Policy>()
            .unwrap(),
    );
    let admitted = per_request(admit.layer(inner), 1000, false).await - baseline;

    let quiet = RateLimitLayer::builder()
        .policy(
            "token-bucket:limit=4294967295,period=1s,name=per-ip"
                .parse::<Policy>()
                .unwrap(),
        )
        .headers_on_allowed(false)
        .build()
        .unwrap();
    let no_headers = per_request(quiet.layer(inner), 1000, false).await - baseline;

    let deny = RateLimitLayer::new(
        "fixed-window:limit=1,period=1h,name=per-ip"
            .parse::<Policy>()
            .unwrap(),
    );
    let denied = per_request(deny.layer(inner), 1000, true).await - baseline;

    // The in-memory backend's own share, for comparison.
    let backend = turnstile::MemoryBackend::new();
    let pol = ["token-bucket:limit=4294967295,period=1s,name=per-ip"
        .parse::<Policy>()
        .unwrap()];
    let _ = backend.check("192.0.2.1", &pol, 1).into_inner();
    let before = allocations();
    for _ in 0..1000 {
        let _ = backend.check("192.0.2.1", &pol, 1).into_inner();
    }
    let in_backend = (allocations() - before) as f64 / 1000.0;

    println!(
        "in-memory backend alone {in_backend}; allocations per request: inner alone {baseline}, admitted +{admitted} (+{no_headers} without headers on admitted responses), denied +{denied}"
    );
    // Measured: see the crate's README ("Cost per request"). Keep them from growing.
    assert!(
        admitted <= 4.5,
        "admitted: {admitted} allocations per request"
    );
    assert!(
        no_headers <= 1.5,
        "no headers: {no_headers} allocations per request"
    );
    assert!(denied <= 8.5, "denied: {denied} allocations per request");

    // With the `metrics` feature and a recorder installed, the layer's own recording adds
    // nothing: its metric keys are prepared when the layer is built. (This recorder keeps
    // nothing, so what an exporter allocates is not counted.)
    #[cfg(feature = "metrics")]
    {
        let recorder = KeepNothing;
        let _guard = metrics::set_default_local_recorder(&recorder);
        let with_metrics = per_request(admit.layer(inner), 1000, false).await - baseline;
        let denied_metrics = per_request(deny.layer(inner), 1000, true).await - baseline;
        println!(
            "with a recorder: admitted +{with_metrics}, denied +{denied_metrics} (recorder calls: {})",
            CALLS.load(std::sync::atomic::Ordering::Relaxed)
        );
        assert!(CALLS.load(std::sync::atomic::Ordering::Relaxed) >= 4000);
        // A per-request allocation would add 1; the rest is the backend's map growing at
        // slightly different moments (keys hash with a per-process seed).
        assert!(with_metrics <= admitted + 0.25, "metrics: {with_metrics}");
        assert!(denied_metrics <= denied + 0.25, "metrics: {denied_metrics}");
    }
}

#[cfg(feature = "metrics")]
static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A recorder that counts registrations and keeps nothing.
#[cfg(feature = "metrics")]
struct KeepNothing;

#[cfg(feature = "metrics")]
impl metrics::Recorder for KeepNothing {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        metrics::Counter::noop()
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }
    fn register_histogram(
        &self,
        _: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        metrics::Histogram::noop()
    }
}
