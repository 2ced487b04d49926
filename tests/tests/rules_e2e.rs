//! Per-route rules, client IPs behind trusted proxies (and spoofing attempts), exempt routes
//! and shaping, with a real axum server on loopback and a real hyper client over TCP.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::routing::{get, post};
use axum::Router;
use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::Empty;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use tower_turnstile::key::{ClientIp, ForwardedHeader};
use tower_turnstile::{Action, Policy, RateLimitLayer, Rule};
use turnstile_tests::app_server::serve;

fn app(key: ClientIp) -> Router {
    let layer = RateLimitLayer::builder()
        .key(key)
        .rule(Rule::new().method(Method::GET).path("/healthz").exempt())
        .rule(
            Rule::new()
                .method(Method::POST)
                .path("/login")
                .policy(Policy::sliding_log(5, Duration::from_secs(60)).unwrap()),
        )
        .rule(
            Rule::new()
                .method(Method::GET)
                .path("/")
                .policy(Policy::token_bucket(100, Duration::from_secs(60)).unwrap()),
        )
        .build()
        .unwrap();
    Router::new()
        .route("/", get(|| async { "hello" }))
        .route("/login", post(|| async { "welcome" }))
        .route("/healthz", get(|| async { "ok" }))
        .layer(layer)
}

struct Http {
    client: Client<HttpConnector, Empty<Bytes>>,
    addr: SocketAddr,
}

impl Http {
    fn new(addr: SocketAddr) -> Self {
        Http {
            client: Client::builder(TokioExecutor::new()).build_http(),
            addr,
        }
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
    ) -> http::Response<hyper::body::Incoming> {
        let mut b = Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.addr));
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        self.client
            .request(b.body(Empty::new()).unwrap())
            .await
            .unwrap()
    }

    async fn login(&self, headers: &[(&str, &str)]) -> u16 {
        self.send(Method::POST, "/login", headers)
            .await
            .status()
            .as_u16()
    }
}

#[tokio::test]
async fn routes_have_their_own_limits_and_healthz_is_exempt() {
    let http = Http::new(serve(app(ClientIp::new())).await);
    let mut logins = Vec::new();
    for _ in 0..7 {
        logins.push(http.login(&[]).await);
    }
    assert_eq!(logins, [200, 200, 200, 200, 200, 429, 429]);
    let denied = http.send(Method::POST, "/login", &[]).await;
    assert_eq!(
        denied.headers()["ratelimit-policy"],
        "\"POST /login sliding-log:limit=5,period=1m\";q=5;w=60"
    );
    // GET / has its own counter.
    let res = http.send(Method::GET, "/", &[]).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        res.headers()["ratelimit"],
        "\"GET / token-bucket:limit=100,period=1m\";r=99;t=1"
    );
    for _ in 0..20 {
        let res = http.send(Method::GET, "/healthz", &[]).await;
        assert_eq!(res.status(), StatusCode::OK);
        assert!(res.headers().get("ratelimit").is_none());
    }
}

#[tokio::test]
async fn forwarding_headers_from_an_untrusted_peer_are_ignored() {
    // 127.0.0.1 is not trusted: every header is a client's lie.
    let http = Http::new(serve(app(ClientIp::new().trust("10.0.0.0/8".parse().unwrap()))).await);
    let spoofs = [
        ("x-forwarded-for", "198.51.100.1"),
        ("x-forwarded-for", "198.51.100.2"),
        ("forwarded", "for=198.51.100.3"),
        ("x-real-ip", "198.51.100.4"),
        ("forwarded", "for=\"[2001:db8::5]\""),
        ("x-forwarded-for", "198.51.100.6, 10.0.0.1"),
    ];
    let mut statuses = Vec::new();
    for (h, v) in spoofs {
        statuses.push(http.login(&[(h, v)]).await);
    }
    // One client, one counter: the sixth is denied whatever it claims.
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429]);
}

#[tokio::test]
async fn a_trusted_proxy_reports_clients_and_spoofed_hops_are_skipped() {
    let key = ClientIp::new().trust("127.0.0.0/8".parse().unwrap());
    let http = Http::new(serve(app(key)).await);
    // Five logins each for two clients behind the proxy.
    for ip in ["198.51.100.1", "198.51.100.2"] {
        for _ in 0..5 {
            assert_eq!(http.login(&[("x-forwarded-for", ip)]).await, 200);
        }
    }
    // The client prepends a fake address: the proxy appended the real one on the right.
    assert_eq!(
        http.login(&[("x-forwarded-for", "203.0.113.77, 198.51.100.1")])
            .await,
        429
    );
    // Repeated header lines are one list, in order: the last line's last entry is nearest.
    assert_eq!(
        http.login(&[
            ("x-forwarded-for", "203.0.113.78"),
            ("x-forwarded-for", "198.51.100.2"),
        ])
        .await,
        429
    );
    // Forwarded (RFC 7239) takes precedence when present.
    assert_eq!(
        http.login(&[
            ("forwarded", "for=198.51.100.9;proto=https"),
            ("x-forwarded-for", "198.51.100.1"),
        ])
        .await,
        200
    );
    // IPv6 clients are grouped by /64; an IPv4-mapped client is its IPv4 address.
    for i in 1..=5 {
        let v = format!("for=\"[2001:db8:aa:bb::{i}]:443\"");
        assert_eq!(http.login(&[("forwarded", v.as_str())]).await, 200);
    }
    assert_eq!(
        http.login(&[("forwarded", "for=\"[2001:db8:aa:bb:ffff::1]\"")])
            .await,
        429
    );
    assert_eq!(
        http.login(&[("x-forwarded-for", "::ffff:198.51.100.1")])
            .await,
        429
    );
    // An unknown or garbled hop: the nearest trustworthy address (here the proxy itself,
    // 127.0.0.1) is the key, never the address left of it.
    let mut proxy = Vec::new();
    for v in [
        "198.51.100.50, unknown",
        "198.51.100.51, _hidden",
        "198.51.100.52, not-an-ip",
    ] {
        proxy.push(http.login(&[("x-forwarded-for", v)]).await);
    }
    proxy.push(http.login(&[("x-real-ip", "garbage")]).await);
    proxy.push(http.login(&[("forwarded", "for=unknown")]).await);
    proxy.push(http.login(&[]).await);
    assert_eq!(proxy, [200, 200, 200, 200, 200, 429]);
}

#[tokio::test]
async fn only_the_configured_header_is_read() {
    let key = ClientIp::new()
        .trust("127.0.0.0/8".parse().unwrap())
        .header(ForwardedHeader::XForwardedFor);
    let http = Http::new(serve(app(key)).await);
    for _ in 0..5 {
        assert_eq!(
            http.login(&[("x-forwarded-for", "198.51.100.1")]).await,
            200
        );
    }
    // A Forwarded header the proxy passed through unchanged does not change the key.
    assert_eq!(
        http.login(&[
            ("forwarded", "for=198.51.100.99"),
            ("x-forwarded-for", "198.51.100.1"),
        ])
        .await,
        429
    );
}

#[tokio::test]
async fn shaping_spreads_a_burst_instead_of_rejecting_it() {
    // 10 per second, queue of 4: delays of 0, 100, 200 and 300 ms.
    let layer = RateLimitLayer::builder()
        .policy("leaky-bucket:limit=10,period=1s,burst=4".parse().unwrap())
        .action(Action::delay(Duration::from_secs(2)))
        .build()
        .unwrap();
    let addr = serve(
        Router::new()
            .route("/", get(|| async { "hi" }))
            .layer(layer),
    )
    .await;
    let start = Instant::now();
    let tasks: Vec<_> = (0..6)
        .map(|_| {
            tokio::spawn(async move {
                let http = Http::new(addr);
                let res = http.send(Method::GET, "/", &[]).await;
                (res.status(), start.elapsed())
            })
        })
        .collect();
    let mut took = Vec::new();
    for t in tasks {
        let (status, d) = t.await.unwrap();
        assert_eq!(status, StatusCode::OK);
        took.push(d);
    }
    took.sort();
    // Six requests through a queue draining one per 100 ms: the last waits at least
    // 500 ms, and none is held past the 2 s maximum.
    assert!(took[5] >= Duration::from_millis(500), "{took:?}");
    assert!(took[5] < Duration::from_secs(2), "{took:?}");
}
