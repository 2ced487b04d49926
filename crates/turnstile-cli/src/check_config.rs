//! `turnstile check-config FILE`: validate a configuration file and print the effective rules.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use tower_turnstile::config::LayerConfig;

/// The arguments of `turnstile check-config`.
#[derive(Debug, Args)]
pub(crate) struct CheckConfigArgs {
    /// The configuration file (TOML).
    #[arg(value_name = "FILE")]
    pub(crate) file: PathBuf,
}

/// Validates the file: prints `FILE: valid` and the effective configuration on standard
/// output (exit 0), or the error with the offending line on standard error (exit 1).
pub(crate) fn run(args: &CheckConfigArgs) -> ExitCode {
    match LayerConfig::from_file(&args.file) {
        Ok(config) => {
            let mut out = std::io::stdout().lock();
            let written = write!(out, "{}: valid\n{config}", args.file.display());
            match written.and_then(|()| out.flush()) {
                Ok(()) => ExitCode::SUCCESS,
                // A closed pipe (`| head`) is not an error of ours.
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("turnstile: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            if let Some(snippet) = e.snippet() {
                eprintln!("{snippet}");
            }
            ExitCode::FAILURE
        }
    }
}
