//! A real tonic server on loopback with the layer, and a real tonic client over TCP.

#[path = "../../examples/helloworld.rs"]
mod helloworld;

use std::net::SocketAddr;
use std::time::Duration;

use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic::Code;
use tonic_types::StatusExt;
use tower_turnstile::key::{GrpcMethod, PeerIp};
use tower_turnstile::{Backend, FailurePolicy, MemoryBackend, Policy, RateLimitLayer, Rule};

async fn serve<B, K>(layer: RateLimitLayer<B, K>) -> SocketAddr
where
    B: tower_turnstile::Backend,
    K: tower_turnstile::KeyExtractor,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        Server::builder()
            .layer(layer)
            .add_service(helloworld::Greeter)
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .unwrap();
    });
    addr
}

async fn channel(addr: SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

#[tokio::test]
async fn the_tonic_client_sees_resource_exhausted_and_reads_the_retry_delay() {
    let policy = Policy::token_bucket(5, Duration::from_secs(60))
        .unwrap()
        .with_name("per-method-ip")
        .unwrap();
    // Keyed by tonic's TcpConnectInfo peer address and the gRPC method.
    let layer = RateLimitLayer::builder()
        .key((GrpcMethod, PeerIp::new()))
        .policy(policy)
        .build()
        .unwrap();
    let addr = serve(layer).await;
    let ch = channel(addr).await;

    for i in 0..5 {
        let res = helloworld::say_hello(ch.clone(), "world")
            .await
            .unwrap_or_else(|s| panic!("call {i} failed: {s:?}"));
        assert_eq!(res.get_ref().message, "Hello world!");
        assert_eq!(
            res.metadata().get("ratelimit-policy").unwrap(),
            "\"per-method-ip\";q=5;w=60"
        );
    }
    let status = helloworld::say_hello(ch.clone(), "world")
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(status
        .message()
        .starts_with("Rate limit exceeded; retry in"));
    let retry = status
        .get_details_retry_info()
        .and_then(|r| r.retry_delay)
        .expect("RetryInfo with a delay");
    // One token every 12 s; rounded up to whole milliseconds.
    assert!(retry > Duration::from_secs(11) && retry <= Duration::from_secs(12));
    assert_eq!(retry.subsec_nanos() % 1_000_000, 0);
    let quota = status.get_details_quota_failure().expect("QuotaFailure");
    assert_eq!(quota.violations.len(), 1);
    assert_eq!(quota.violations[0].subject, "per-method-ip");
}

#[tokio::test]
async fn a_call_that_can_never_fit_gets_quota_failure_without_retry_info() {
    let layer = RateLimitLayer::builder()
        .rule(
            Rule::new()
                .grpc_service("helloworld.Greeter")
                .policy("fixed-window:limit=2,period=1m".parse().unwrap()),
        )
        .cost(|_: &tower_turnstile::key::RequestRef<'_>| 3)
        .build()
        .unwrap();
    let addr = serve(layer).await;
    let status = helloworld::say_hello(channel(addr).await, "x")
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(status.get_details_retry_info().is_none());
    let quota = status.get_details_quota_failure().unwrap();
    assert_eq!(
        quota.violations[0].subject,
        "grpc helloworld.Greeter/* fixed-window:limit=2,period=1m"
    );
}

#[tokio::test]
async fn fail_closed_is_unavailable() {
    let pol: Policy = "gcra:limit=5,period=1s".parse().unwrap();
    let full = MemoryBackend::builder().max_keys(1).build();
    full.check("someone-else", std::slice::from_ref(&pol), 1)
        .into_inner()
        .unwrap();
    let layer = RateLimitLayer::new(pol)
        .backend(full)
        .on_backend_failure(FailurePolicy::Closed);
    let addr = serve(layer).await;
    let status = helloworld::say_hello(channel(addr).await, "x")
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
}

#[tokio::test]
async fn the_standard_tower_http_stack_wraps_a_tonic_server() {
    use tower::ServiceBuilder;
    use tower_http::cors::CorsLayer;
    use tower_http::timeout::TimeoutLayer;
    use tower_http::trace::TraceLayer;

    let layer = RateLimitLayer::builder()
        .key((GrpcMethod, PeerIp::new()))
        .policy(
            "fixed-window:limit=2,period=1m,name=per-call"
                .parse()
                .unwrap(),
        )
        .build()
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        Server::builder()
            .layer(
                ServiceBuilder::new()
                    .layer(TraceLayer::new_for_grpc())
                    .layer(TimeoutLayer::with_status_code(
                        http::StatusCode::REQUEST_TIMEOUT,
                        Duration::from_secs(10),
                    ))
                    .layer(CorsLayer::permissive())
                    .layer(layer),
            )
            .add_service(helloworld::Greeter)
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .unwrap();
    });
    let ch = channel(addr).await;
    for _ in 0..2 {
        let res = helloworld::say_hello(ch.clone(), "world").await.unwrap();
        assert_eq!(res.get_ref().message, "Hello world!");
        assert_eq!(
            res.metadata().get("ratelimit-policy").unwrap(),
            "\"per-call\";q=2;w=60"
        );
    }
    let status = helloworld::say_hello(ch, "world").await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    let quota = status.get_details_quota_failure().expect("QuotaFailure");
    assert_eq!(quota.violations[0].subject, "per-call");
}
