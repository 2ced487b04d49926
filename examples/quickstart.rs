//! The quickstart: an axum app whose `GET /` is limited to 10 requests per 60 s per client IP
//! (token bucket, burst 10), in memory.
//!
//! ```text
//! cargo run -p turnstile-examples --example quickstart -- --port 3000
//! for i in $(seq 12); do curl -s -o /dev/null -w '%{http_code}\n' http://127.0.0.1:3000/; done
//! ```
//!
//! With `--config FILE` the file's key, rules and policies (see `examples/turnstile.toml`)
//! replace the built-in policy; state stays in memory. Edit the file and send the process
//! `SIGHUP` (`kill -HUP <pid>`) to reload it: counters carry over, and a file that fails
//! validation is refused (logged) while the previous configuration stays in force.

#[path = "common.rs"]
mod common;

use std::path::PathBuf;
use std::time::Duration;

use axum::{routing::get, Router};
use clap::Parser;
use tower_turnstile::config::{ConfigReload, LayerConfig};
use tower_turnstile::{Policy, RateLimitLayer};

/// Serves `GET /` on 127.0.0.1, rate-limited to 10 requests per 60 s per client IP.
#[derive(Parser, Debug)]
struct Args {
    /// TCP port to listen on (127.0.0.1).
    #[arg(long, default_value_t = 3000)]
    port: u16,
    /// A turnstile configuration file (TOML) whose key, rules and policies replace the
    /// built-in 10 per 60 s per IP.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
}

/// The app: `GET /` behind the built-in policy, or behind the rules of `config` (read from
/// the file at the path given with it), reloaded on `SIGHUP`. Must run inside a tokio
/// runtime: it starts the reload task. The layer's own in-memory backend forgets clients
/// that went away every second, even when no request comes, so the memory a flood of
/// clients took comes back.
pub(crate) fn app(
    config: Option<(&std::path::Path, &LayerConfig)>,
) -> Result<Router, Box<dyn std::error::Error>> {
    let router = Router::new().route("/", get(|| async { "Hello from turnstile!\n" }));
    Ok(match config {
        Some((path, config)) => {
            let layer = config.builder().build()?;
            let (layer, reload) = ConfigReload::new(path, config, layer);
            tokio::spawn(reload_on_hangup(reload));
            router.layer(layer)
        }
        None => {
            // 10 per 60 s per IP; a fresh client may use its burst of 10 at once, then gets
            // one more every 6 s.
            let per_ip = Policy::token_bucket(10, Duration::from_secs(60))?
                .with_burst(10)?
                .with_name("per-ip")?;
            router.layer(RateLimitLayer::builder().policy(per_ip).build()?)
        }
    })
}

/// Reloads the configuration file on each `SIGHUP` (refusals are logged by `reload`).
async fn reload_on_hangup<B: tower_turnstile::Backend>(reload: ConfigReload<B>) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(mut hangups) = signal(SignalKind::hangup()) else {
            return;
        };
        while hangups.recv().await.is_some() {
            let _ = reload.reload();
        }
    }
    #[cfg(not(unix))]
    let _ = reload;
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    common::main("quickstart", run()).await
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let config = match &args.config {
        Some(path) => Some(LayerConfig::from_file(path)?),
        None => None,
    };
    let app = app(args.config.as_deref().zip(config.as_ref()))?;

    let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.port)).await?;
    let url = format!("http://{}/", listener.local_addr()?);
    match (&args.config, &config) {
        (Some(path), Some(config)) => {
            println!(
                "turnstile quickstart listening on {url} (GET /: the rules of {}, in memory; kill -HUP {} reloads it)",
                path.display(),
                std::process::id()
            );
            if config.backend().url().is_some() {
                println!("note: the quickstart keeps state in memory; the file's [backend] url is for axum_redis");
            }
        }
        _ => {
            println!("turnstile quickstart listening on {url} (GET /: 10 requests per 60 s per IP)")
        }
    }
    println!(
        "try it: for i in $(seq 12); do curl -s -o /dev/null -w '%{{http_code}}\\n' {url}; done"
    );
    common::serve(listener, app).await
}
