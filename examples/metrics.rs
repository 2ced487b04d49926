//! Metrics for Prometheus: the quickstart's `GET /` (10 requests per 60 s per client IP, in
//! memory), with turnstile's metrics served on `GET /metrics` — which is not itself rate
//! limited — by `metrics-exporter-prometheus`.
//!
//! ```text
//! cargo run -p turnstile-examples --example metrics -- --port 3004
//! for i in $(seq 12); do curl -s -o /dev/null -w '%{http_code}\n' http://127.0.0.1:3004/; done
//! curl -s http://127.0.0.1:3004/metrics | grep turnstile_
//! ```

#[path = "common.rs"]
mod common;

use std::time::Duration;

use axum::{routing::get, Router};
use clap::Parser;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tower_turnstile::{MemoryBackend, Policy, RateLimitLayer};

/// Serves `GET /` (rate-limited) and `GET /metrics` (Prometheus text) on 127.0.0.1.
#[derive(Parser, Debug)]
struct Args {
    /// TCP port to listen on (127.0.0.1).
    #[arg(long, default_value_t = 3004)]
    port: u16,
}

/// Installs the Prometheus recorder (once per process) and describes turnstile's metrics.
/// The backend latency is rendered as a histogram with buckets from 100 µs to 1 s.
pub(crate) fn install_recorder() -> Result<PrometheusHandle, Box<dyn std::error::Error>> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full(tower_turnstile::metrics::BACKEND_CHECK_DURATION_SECONDS.to_owned()),
            &[
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                1.0,
            ],
        )?
        .install_recorder()?;
    tower_turnstile::metrics::describe();
    Ok(handle)
}

/// The app: `GET /` behind the layer, `GET /metrics` added after it (so not limited). Must
/// run inside a tokio runtime: it starts the memory sweeper.
pub(crate) fn app(handle: PrometheusHandle) -> Result<Router, Box<dyn std::error::Error>> {
    let per_ip = Policy::token_bucket(10, Duration::from_secs(60))?.with_name("per-ip")?;
    let memory = MemoryBackend::new();
    // Expired clients go every second, without traffic: `turnstile_memory_keys` falls back.
    memory.spawn_sweeper(Duration::from_secs(1))?;
    Ok(Router::new()
        .route("/", get(|| async { "Hello from turnstile!\n" }))
        .layer(
            RateLimitLayer::builder()
                .policy(per_ip)
                .backend(memory)
                .build()?,
        )
        .route("/metrics", get(move || std::future::ready(handle.render()))))
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    common::main("metrics", run()).await
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let handle = install_recorder()?;
    // Without the exporter's HTTP listener, upkeep (draining histograms) is ours to run.
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            upkeep.run_upkeep();
        }
    });

    let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.port)).await?;
    let url = format!("http://{}/", listener.local_addr()?);
    println!(
        "turnstile metrics listening on {url} (GET /: 10 requests per 60 s per IP; GET /metrics: Prometheus text, not limited)"
    );
    println!(
        "try it: for i in $(seq 12); do curl -s -o /dev/null -w '%{{http_code}}\\n' {url}; done; curl -s {url}metrics | grep turnstile_"
    );
    common::serve(listener, app(handle)?).await
}
