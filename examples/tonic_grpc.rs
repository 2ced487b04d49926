//! A tonic gRPC server (`helloworld.Greeter/SayHello`) rate-limited per method and peer IP,
//! by default 5 calls per 60 s (token bucket), in memory or in Redis.
//!
//! A denied call gets `RESOURCE_EXHAUSTED` with `google.rpc.RetryInfo` (how long to wait)
//! and `google.rpc.QuotaFailure` (which policy) in its status details.
//!
//! ```text
//! cargo run -p turnstile-examples --example tonic_grpc -- --port 50051
//! cargo run -p turnstile-examples --example grpc_client -- --url http://127.0.0.1:50051 --count 7
//! ```

#[path = "common.rs"]
mod common;

mod helloworld;

use std::time::Duration;

use clap::Parser;
use tonic::transport::server::TcpIncoming;
use tonic::transport::Server;
use tower_turnstile::key::{GrpcMethod, PeerIp};
use tower_turnstile::wrap::DenyCache;
use tower_turnstile::{Algorithm, Backend, Policy, RateLimitLayer};
use turnstile_redis::RedisBackend;

/// Serves helloworld.Greeter on 127.0.0.1, rate-limited per method and peer IP.
#[derive(Parser, Debug)]
struct Args {
    /// TCP port to listen on (127.0.0.1).
    #[arg(long, default_value_t = 50051)]
    port: u16,
    /// Keep rate-limit state in Redis at this URL (e.g. redis://127.0.0.1:6379), so several
    /// servers share one limit; in memory when absent.
    #[arg(long)]
    redis_url: Option<String>,
    /// token-bucket, gcra, leaky-bucket, fixed-window, sliding-log or sliding-window.
    #[arg(long, default_value = "token-bucket")]
    algorithm: Algorithm,
    /// Calls admitted per period.
    #[arg(long, default_value_t = 5)]
    limit: u64,
    /// The period: <integer><unit>, unit ms, s, m, h or d.
    #[arg(long, default_value = "60s", value_parser = tower_turnstile::turnstile_core::policy::parse_duration)]
    period: Duration,
    /// Bucket capacity (bucket algorithms only; default: the limit).
    #[arg(long)]
    burst: Option<u64>,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    common::main("tonic_grpc", run()).await
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();

    let mut policy = Policy::new(args.algorithm, args.limit, args.period)?;
    if let Some(b) = args.burst {
        policy = policy.with_burst(b)?;
    }
    let policy = policy.with_name("per-method-ip")?;
    let summary = format!("{policy}");
    // One key per (gRPC method, client IP): `helloworld.Greeter/SayHello|127.0.0.1`.
    let layer = RateLimitLayer::builder()
        .key((GrpcMethod, PeerIp::new()))
        .policy(policy);
    match &args.redis_url {
        Some(url) => {
            let redis = RedisBackend::builder(url.as_str()).build()?;
            println!("rate-limit state in Redis at {url}");
            serve(
                layer.backend(DenyCache::new(redis)).build()?,
                args.port,
                &summary,
            )
            .await
        }
        None => serve(layer.build()?, args.port, &summary).await,
    }
}

async fn serve<B: Backend>(
    layer: RateLimitLayer<B, (GrpcMethod, PeerIp)>,
    port: u16,
    summary: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    println!(
        "turnstile tonic_grpc listening on http://{addr} (helloworld.Greeter/SayHello: {summary} per method and IP)"
    );
    println!(
        "try it: cargo run -p turnstile-examples --example grpc_client -- --url http://{addr} --count 7"
    );
    Server::builder()
        .layer(layer)
        .add_service(helloworld::Greeter)
        .serve_with_incoming_shutdown(TcpIncoming::from(listener), async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
