//! Shaping instead of rejecting: `GET /` goes through a leaky bucket per client IP, so a
//! burst of requests is spread out at the bucket's rate — each request waits its turn —
//! rather than failing. Only a request that would have to wait longer than `--max-wait`
//! is answered `429`.
//!
//! ```text
//! cargo run -p turnstile-examples --example throttle -- --port 3003
//! for i in $(seq 10); do curl -s -o /dev/null -w '%{http_code} %{time_total}s\n' http://127.0.0.1:3003/ & done; wait
//! ```

#[path = "common.rs"]
mod common;

use std::time::Duration;

use axum::{routing::get, Router};
use clap::Parser;
use tower_turnstile::{Action, Policy, RateLimitLayer};

/// Serves `GET /` on 127.0.0.1, shaped by a leaky bucket per client IP.
#[derive(Parser, Debug)]
struct Args {
    /// TCP port to listen on (127.0.0.1).
    #[arg(long, default_value_t = 3003)]
    port: u16,
    /// Requests let through per period.
    #[arg(long, default_value_t = 5)]
    limit: u64,
    /// The period: <integer><unit>, unit ms, s, m, h or d.
    #[arg(long, default_value = "1s", value_parser = tower_turnstile::turnstile_core::policy::parse_duration)]
    period: Duration,
    /// Queue capacity in requests (default: the limit).
    #[arg(long)]
    burst: Option<u64>,
    /// The longest a request is held before it is served (or answered 429).
    #[arg(long, default_value = "2s", value_parser = tower_turnstile::turnstile_core::policy::parse_duration)]
    max_wait: Duration,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    common::main("throttle", run()).await
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();

    let mut policy = Policy::leaky_bucket(args.limit, args.period)?;
    if let Some(b) = args.burst {
        policy = policy.with_burst(b)?;
    }
    let policy = policy.with_name("shaped-per-ip")?;
    let summary = policy.to_string();
    // Refused at build time if the bucket could ask one request to wait longer than
    // --max-wait ((burst − 1) × period / limit).
    let layer = RateLimitLayer::builder()
        .policy(policy)
        .action(Action::delay(args.max_wait))
        .build()?;
    let app = Router::new()
        .route(
            "/",
            get(|| async { "Hello from turnstile, at a steady pace!\n" }),
        )
        .layer(layer);

    let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.port)).await?;
    let url = format!("http://{}/", listener.local_addr()?);
    println!(
        "turnstile throttle listening on {url} (GET /: {summary}, requests wait up to {} ms instead of failing)",
        args.max_wait.as_millis()
    );
    println!(
        "try it: for i in $(seq 10); do curl -s -o /dev/null -w '%{{http_code}} %{{time_total}}s\\n' {url} & done; wait"
    );
    common::serve(listener, app).await
}
