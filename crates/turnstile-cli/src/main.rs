//! The `turnstile` command: replay a JSON Lines trace of requests against rate-limit policies
//! and print every decision (`turnstile simulate`), exactly as `SEMANTICS.md` defines them.

mod backend;
mod cli;
mod simulate;
mod summary;
mod trace;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    match cli.command {
        cli::Command::Simulate(args) => {
            // Usage errors (exit 2, clap's format) end the process inside `policies()`.
            let policies = args.policies_or_exit();
            simulate::run(&args, &policies)
        }
    }
}
