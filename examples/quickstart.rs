//! The quickstart: an axum app whose `GET /` is limited to 10 requests per 60 s per client IP
//! (token bucket, burst 10), in memory.
//!
//! ```text
//! cargo run -p turnstile-examples --example quickstart -- --port 3000
//! for i in $(seq 12); do curl -s -o /dev/null -w '%{http_code}\n' http://127.0.0.1:3000/; done
//! ```

use std::net::SocketAddr;
use std::time::Duration;

use axum::{routing::get, Router};
use clap::Parser;
use turnstile::{Policy, RateLimitLayer};

/// Serves `GET /` on 127.0.0.1, rate-limited to 10 requests per 60 s per client IP.
#[derive(Parser, Debug)]
struct Args {
    /// TCP port to listen on (127.0.0.1).
    #[arg(long, default_value_t = 3000)]
    port: u16,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();

    // 10 per 60 s per IP; a fresh client may use its burst of 10 at once, then gets one more
    // every 6 s.
    let per_ip = Policy::token_bucket(10, Duration::from_secs(60))?
        .with_burst(10)?
        .with_name("per-ip")?;
    let app = Router::new()
        .route("/", get(|| async { "Hello from turnstile!\n" }))
        .layer(RateLimitLayer::new(per_ip));

    let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.port)).await?;
    let url = format!("http://{}/", listener.local_addr()?);
    println!("turnstile quickstart listening on {url} (GET /: 10 requests per 60 s per IP)");
    println!(
        "try it: for i in $(seq 12); do curl -s -o /dev/null -w '%{{http_code}}\\n' {url}; done"
    );
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    Ok(())
}
