//! Different limits per route from one layer, keyed by the client's IP — read from
//! `Forwarded` / `X-Forwarded-For` / `X-Real-IP` only when the peer is a trusted proxy:
//!
//! - `GET /`: 100 per minute per client IP (token bucket);
//! - `POST /login`: 5 per minute per client IP (sliding log: at most 5 in any 60 s);
//! - `GET /healthz`: exempt.
//!
//! ```text
//! cargo run -p turnstile-examples --example per_route -- --port 3002 --trusted-proxy 127.0.0.0/8
//! for i in $(seq 7); do curl -s -o /dev/null -w '%{http_code}\n' -X POST http://127.0.0.1:3002/login; done
//! ```

#[path = "common.rs"]
mod common;

use std::time::Duration;

use axum::routing::{get, post};
use axum::Router;
use clap::Parser;
use http::Method;
use tower_turnstile::key::ClientIp;
use tower_turnstile::key::IpNet;
use tower_turnstile::{Policy, RateLimitLayer, Rule};

/// Serves `GET /`, `POST /login` and `GET /healthz` on 127.0.0.1 with per-route limits.
#[derive(Parser, Debug)]
struct Args {
    /// TCP port to listen on (127.0.0.1).
    #[arg(long, default_value_t = 3002)]
    port: u16,
    /// A proxy network (CIDR, e.g. 10.0.0.0/8) trusted to report the client's address in
    /// Forwarded, X-Forwarded-For or X-Real-IP. Repeatable. Without it, every forwarding
    /// header is ignored and the key is the peer's address.
    #[arg(long = "trusted-proxy", value_name = "CIDR", value_parser = parse_cidr)]
    trusted_proxies: Vec<IpNet>,
}

/// A CIDR (`10.0.0.0/8`) or a bare address (`10.1.2.3`, one host).
fn parse_cidr(s: &str) -> Result<IpNet, String> {
    s.parse::<IpNet>()
        .or_else(|_| s.parse::<std::net::IpAddr>().map(IpNet::from))
        .map_err(|_| format!("{s:?} is not a CIDR (10.0.0.0/8) or an IP address"))
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    common::main("per_route", run()).await
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();

    let layer =
        RateLimitLayer::builder()
            .key(ClientIp::new().trust_all(args.trusted_proxies.iter().copied()))
            .rule(Rule::new().method(Method::GET).path("/healthz").exempt())
            .rule(Rule::new().method(Method::POST).path("/login").policy(
                Policy::sliding_log(5, Duration::from_secs(60))?.with_name("login-per-ip")?,
            ))
            .rule(Rule::new().method(Method::GET).path("/").policy(
                Policy::token_bucket(100, Duration::from_secs(60))?.with_name("index-per-ip")?,
            ))
            .build()?;

    let app = Router::new()
        .route("/", get(|| async { "Hello from turnstile!\n" }))
        .route("/login", post(|| async { "Logged in (not really).\n" }))
        .route("/healthz", get(|| async { "ok\n" }))
        .layer(layer);

    let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.port)).await?;
    let url = format!("http://{}/", listener.local_addr()?);
    println!(
        "turnstile per_route listening on {url} (GET / 100/min, POST /login 5/min per client IP, GET /healthz exempt; trusted proxies: {:?})",
        args.trusted_proxies
    );
    println!(
        "try it: for i in $(seq 7); do curl -s -o /dev/null -w '%{{http_code}}\\n' -X POST {url}login; done"
    );
    common::serve(listener, app).await
}
