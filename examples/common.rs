//! What every example does around its own app: `main` logs to stderr (`RUST_LOG`, default
//! `info`) and reports an error as a message, with a failing exit code; `serve` serves an
//! axum app until Ctrl-C.

use std::error::Error;
use std::future::Future;
use std::net::SocketAddr;
use std::process::ExitCode;

/// Sets up logging, runs `run`, and turns its error into `name: message` on stderr.
pub(crate) async fn main(
    name: &str,
    run: impl Future<Output = Result<(), Box<dyn Error>>>,
) -> ExitCode {
    tracing_subscriber::fmt()
        // Logs on stderr, coloured only on a terminal (no escape codes in files or pipes).
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    match run.await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Serves `app` on `listener` until Ctrl-C, with each connection's peer address as
/// `ConnectInfo` (what the examples key by).
#[allow(dead_code)] // the gRPC examples serve with tonic
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    app: axum::Router,
) -> Result<(), Box<dyn Error>> {
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
