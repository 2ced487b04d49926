//! The time of one check by the number of policies on it (issue 25, fault 4), through
//! `RedisBackend` against the Redis at `--url`: `scripts/bench-policies.sh` starts a private
//! one and runs this.
//!
//! ```text
//! policy_cost --url redis://127.0.0.1:6379 --counts 20,100,300,512 --calls 30
//! ```
//!
//! For each count and each script mode (Functions, `EVALSHA`) it prints the median and the
//! largest time of `--calls` checks, each of `n` fixed windows nothing exceeds, on a key of
//! its own. A count over `turnstile_core::MAX_POLICIES` is refused before anything is sent
//! (`Limits::new`'s typed error), and the line says so.

use std::time::{Duration, Instant};

use clap::Parser;
use turnstile_core::{Backend, Limits, Policy};
use turnstile_redis::{RedisBackend, ScriptMode};

/// Times one check by its number of policies.
#[derive(Parser, Debug)]
struct Args {
    /// The Redis to check against.
    #[arg(long)]
    url: String,
    /// The policy counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "20,100,300,512,1000")]
    counts: Vec<usize>,
    /// Checks timed per count and mode.
    #[arg(long, default_value_t = 30)]
    calls: usize,
}

/// `n` fixed-window policies of a million per minute each, named p0, p1, …
fn many(n: usize) -> Vec<Policy> {
    (0..n)
        .map(|i| {
            format!("fixed-window:limit=1000000,period=1m,name=p{i}")
                .parse()
                .expect("a valid policy string")
        })
        .collect()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    for (mode, name) in [
        (ScriptMode::Auto, "functions"),
        (ScriptMode::Eval, "evalsha"),
    ] {
        let redis = RedisBackend::builder(args.url.as_str())
            .prefix(format!("turnstile:policy-cost:{name}"))
            .script_mode(mode)
            .timeout(Duration::from_secs(10))
            .build()?;
        for &n in &args.counts {
            let limits = match Limits::new(many(n)) {
                Ok(limits) => limits,
                Err(e) => {
                    println!("{name:>9} {n:>5} policies: refused before sending ({e})");
                    continue;
                }
            };
            let mut times = Vec::with_capacity(args.calls);
            for _ in 0..args.calls {
                let t = Instant::now();
                let d = redis
                    .check_limits(&format!("k{n}"), &limits, 1, None)
                    .await?;
                times.push(t.elapsed());
                assert!(d.allowed(), "{n} policies nothing exceeds denied a check");
            }
            times.sort();
            println!(
                "{name:>9} {n:>5} policies: median {:8.3} ms, max {:8.3} ms",
                ms(times[times.len() / 2]),
                ms(times[times.len() - 1])
            );
        }
        redis.delete_prefix().await?;
    }
    Ok(())
}
