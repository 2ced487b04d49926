//! Hammers one key on Redis from many tasks; prints `admitted=A denied=D errors=E`.
//!
//! `hammer URL PREFIX KEY POLICY TASKS REQUESTS_PER_TASK TIMEOUT_MS`
//!
//! Used by the concurrency tests, which start several of these processes at once. Errors are
//! returned, not absorbed by a local fallback, so the test can assert there were none.
//!
//! With `HAMMER_FOR_MS=n` each task keeps going for n ms instead of a count, and every
//! decision is printed as `decision START_NS ALLOWED` (the wall-clock time the request was
//! sent, in ns since the epoch, and 1 or 0) before the totals. `HAMMER_COALESCE=1` (or `0`)
//! turns the backend's coalescing on (off); without it, the backend's default.

use std::time::Duration;

use turnstile_core::wrap::DenyCache;
use turnstile_core::{Backend, Policy};
use turnstile_redis::RedisBackend;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, prefix, key, policy, tasks, per_task, timeout_ms] = &args[..] else {
        eprintln!("usage: hammer URL PREFIX KEY POLICY TASKS REQUESTS_PER_TASK TIMEOUT_MS");
        std::process::exit(2);
    };
    let policy: Policy = policy.parse().unwrap_or_else(|e| {
        eprintln!("hammer: {e}");
        std::process::exit(2)
    });
    let (tasks, per_task, timeout_ms): (usize, usize, u64) =
        match (tasks.parse(), per_task.parse(), timeout_ms.parse()) {
            (Ok(a), Ok(b), Ok(c)) => (a, b, c),
            _ => {
                eprintln!("hammer: TASKS, REQUESTS_PER_TASK and TIMEOUT_MS are integers");
                std::process::exit(2)
            }
        };
    let mut builder = RedisBackend::builder(url.as_str())
        .prefix(prefix.as_str())
        .timeout(Duration::from_millis(timeout_ms));
    if let Ok(on) = std::env::var("HAMMER_COALESCE") {
        builder = builder.coalesce(on == "1");
    }
    let backend = builder.build().map(DenyCache::new).unwrap_or_else(|e| {
        eprintln!("hammer: {e}");
        std::process::exit(2)
    });
    let run_for = std::env::var("HAMMER_FOR_MS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .map(Duration::from_millis);
    let started = std::time::Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let backend = backend.clone();
            let policy = policy.clone();
            let key = key.clone();
            tokio::spawn(async move {
                let (mut admitted, mut denied, mut errors) = (0u64, 0u64, 0u64);
                let mut i = 0;
                loop {
                    match run_for {
                        Some(d) if started.elapsed() >= d => break,
                        None if i >= per_task => break,
                        _ => i += 1,
                    }
                    let sent = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_nanos());
                    let result = backend.check(&key, std::slice::from_ref(&policy), 1).await;
                    if run_for.is_some() {
                        if let Ok(d) = &result {
                            println!("decision {sent} {}", u8::from(d.allowed()));
                        }
                    }
                    match result {
                        Ok(d) if d.allowed() => admitted += 1,
                        Ok(_) => denied += 1,
                        Err(e) => {
                            eprintln!("hammer: {e}");
                            errors += 1;
                        }
                    }
                }
                (admitted, denied, errors)
            })
        })
        .collect();
    let (mut a, mut d, mut e) = (0, 0, 0);
    for h in handles {
        let (x, y, z) = h.await.unwrap_or((0, 0, 1));
        a += x;
        d += y;
        e += z;
    }
    println!("admitted={a} denied={d} errors={e}");
}
