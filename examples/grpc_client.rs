//! A gRPC client in Rust for the `tonic_grpc` example: calls `helloworld.Greeter/SayHello`
//! `--count` times over one connection and prints each outcome — the greeting and the
//! `ratelimit` metadata, or the `RESOURCE_EXHAUSTED` status with the wait from its
//! `google.rpc.RetryInfo` and the policies from its `google.rpc.QuotaFailure`.
//!
//! ```text
//! cargo run -p turnstile-examples --example tonic_grpc
//! cargo run -p turnstile-examples --example grpc_client -- --url http://127.0.0.1:50051 --count 7
//! ```

#[path = "common.rs"]
mod common;

mod helloworld;

use clap::Parser;
use tonic::transport::Channel;
use tonic_types::StatusExt;

/// Calls helloworld.Greeter/SayHello and prints what each call got.
#[derive(Parser, Debug)]
struct Args {
    /// The server's URL.
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    url: String,
    /// How many calls to make.
    #[arg(long, default_value_t = 7)]
    count: u32,
    /// The name to greet.
    #[arg(long, default_value = "world")]
    name: String,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    common::main("grpc_client", run(Args::parse())).await
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let channel = Channel::from_shared(args.url.clone())?
        .connect()
        .await
        .map_err(|e| {
            format!(
                "cannot connect to {}: {e} (is the tonic_grpc example running?)",
                args.url
            )
        })?;
    for i in 1..=args.count {
        match helloworld::say_hello(channel.clone(), &args.name).await {
            Ok(res) => {
                let ratelimit = res
                    .metadata()
                    .get("ratelimit")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("-");
                println!(
                    "{i}: OK {:?} (ratelimit: {ratelimit})",
                    res.get_ref().message
                );
            }
            Err(status) => {
                let retry = status
                    .get_details_retry_info()
                    .and_then(|r| r.retry_delay)
                    .map_or(
                        "never (the call costs more than the policy allows)".to_owned(),
                        |d| format!("{} ms", d.as_millis()),
                    );
                let policies: Vec<String> = status
                    .get_details_quota_failure()
                    .map(|q| q.violations.into_iter().map(|v| v.subject).collect())
                    .unwrap_or_default();
                println!(
                    "{i}: {:?} {:?}; retry after {retry}; policies {policies:?}",
                    status.code(),
                    status.message()
                );
            }
        }
    }
    Ok(())
}
