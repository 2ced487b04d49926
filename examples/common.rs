//! What every example's `main` does around its own `run`: logs to stderr (`RUST_LOG`,
//! default `info`) and reports an error as a message, with a failing exit code.

use std::error::Error;
use std::future::Future;
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
