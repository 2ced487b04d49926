//! The `turnstile` command: replay a trace of requests (JSON Lines or an nginx/Apache access
//! log) against rate-limit policies and print every decision (`turnstile simulate`), exactly
//! as `SEMANTICS.md` defines them; compare candidate policies side by side, summarise and
//! plot; manage live quotas on Redis (`turnstile quota`); and validate configuration files
//! (`turnstile check-config`).

mod access_log;
mod backend;
mod candidate;
mod check_config;
mod cli;
mod plot;
mod quota;
mod simulate;
mod summary;
mod trace;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    match cli.command {
        cli::Command::Simulate(args) => {
            // Usage errors (exit 2, clap's format) end the process inside `candidates()`.
            let candidates = args.candidates_or_exit();
            simulate::run(&args, &candidates)
        }
        cli::Command::Quota(args) => quota::run(args),
        cli::Command::CheckConfig(args) => check_config::run(&args),
    }
}
