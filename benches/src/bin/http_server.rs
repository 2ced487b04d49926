//! The HTTP servers `scripts/bench-http.sh` loads with wrk: an axum hello-world alone, behind
//! turnstile's `RateLimitLayer` (in memory, nothing denied), or behind tower_governor's
//! `GovernorLayer`.
//!
//! ```text
//! cargo run --release -p turnstile-benches --bin http_server -- --mode turnstile --port 8080
//! ```
//!
//! Every limiter keys by the peer IP (one hot key under a local load generator) with a quota
//! far above what one core can serve (10^9 per second, burst 10^9), so nothing is denied
//! and every request goes through the limiter's writing path. It prints
//! `listening on 127.0.0.1:PORT` once it accepts connections.

use std::io::Write as _;
use std::net::SocketAddr;

use clap::Parser;
use turnstile_benches::{app, Mode};

/// Serves an axum hello-world on 127.0.0.1 for load tests.
#[derive(Parser, Debug)]
struct Args {
    /// The stack to serve.
    #[arg(long, value_enum)]
    mode: Mode,
    /// TCP port (0: any free port; the one chosen is printed).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Tokio worker threads; 0 for the current-thread runtime. Default: one per CPU the
    /// process may run on (under `taskset -c N`: one).
    #[arg(long)]
    workers: Option<usize>,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let runtime = match args.workers {
        Some(0) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?,
        Some(n) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build()?,
        None => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?,
    };
    runtime.block_on(serve(args))
}

async fn serve(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let app = app(args.mode)?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.port)).await?;
    println!("listening on {}", listener.local_addr()?);
    std::io::stdout().flush()?;
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
