//! A fixed-rate HTTP load generator for the chaos runs (`scripts/chaos.sh`).
//!
//! `loadgen RATE DURATION_MS KEYS HEADER OUT URL [URL...]`
//!
//! Sends `RATE` requests per second in all (open loop: a request is sent on schedule whether or
//! not earlier ones have answered, at most 1024 in flight), for `DURATION_MS`, round-robin over
//! `KEYS` client keys sent in the header `HEADER` (`k0` … `k{KEYS-1}`), each key to every `URL`
//! in turn (request i: key i mod KEYS, URL (i div KEYS) mod the number of URLs), so every
//! process behind the URLs decides every key.
//! Writes one line per request to `OUT`: `SENT_MS KEY STATUS LATENCY_US TARGET HEADERS`, where
//! `SENT_MS` is the wall-clock send time in ms since the Unix epoch, `STATUS` is the HTTP
//! status, or 0 when the request failed without one (refused connection, or no answer within
//! 5 s), `TARGET` is the index of the URL it was sent to (0 for the first), and `HEADERS` is 1
//! when the answer carried a `RateLimit` header (draft-ietf-httpapi-ratelimit-headers), 0
//! otherwise (turnstile answers without one when it admits a request failing open). Prints a
//! one-line summary. Only for loopback targets: every URL must be on 127.0.0.0/8.

use std::io::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::Semaphore;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 6 {
        eprintln!("usage: loadgen RATE DURATION_MS KEYS HEADER OUT URL [URL...]");
        std::process::exit(2);
    }
    let (Ok(rate), Ok(duration_ms), Ok(keys)) = (
        args[0].parse::<u64>(),
        args[1].parse::<u64>(),
        args[2].parse::<usize>(),
    ) else {
        eprintln!("loadgen: RATE, DURATION_MS and KEYS are integers");
        std::process::exit(2);
    };
    if rate == 0 || keys == 0 {
        eprintln!("loadgen: RATE and KEYS must be positive");
        std::process::exit(2);
    }
    let header = args[3].clone();
    let out_path = args[4].clone();
    let urls: Vec<http::Uri> = args[5..]
        .iter()
        .map(|u| {
            let uri: http::Uri = u.parse().unwrap_or_else(|e| {
                eprintln!("loadgen: {u}: {e}");
                std::process::exit(2)
            });
            let host = uri.host().unwrap_or("");
            if !(host == "localhost" || host.starts_with("127.")) {
                eprintln!("loadgen: {u}: only loopback targets (127.0.0.0/8) are allowed");
                std::process::exit(2);
            }
            uri
        })
        .collect();

    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let in_flight = Arc::new(Semaphore::new(1024));
    let interval = Duration::from_nanos(1_000_000_000 / rate);
    let total = rate * duration_ms / 1000;
    let start = Instant::now();
    let mut handles = Vec::with_capacity(usize::try_from(total).unwrap_or(0));
    for i in 0..total {
        tokio::time::sleep_until((start + interval * u32::try_from(i).unwrap_or(u32::MAX)).into())
            .await;
        let Ok(permit) = Arc::clone(&in_flight).acquire_owned().await else {
            break;
        };
        let key = format!("k{}", i as usize % keys);
        // Each key goes to every URL in turn (with `i % urls.len()`, an even number of keys
        // would pin each key to one URL, and no two processes would ever share a key).
        let target = (i as usize / keys) % urls.len();
        let uri = urls[target].clone();
        let header = header.clone();
        let client = client.clone();
        handles.push(tokio::spawn(async move {
            let _permit = permit;
            let sent_ms = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis());
            let t0 = Instant::now();
            let req = http::Request::get(uri)
                .header(header.as_str(), key.as_str())
                .body(Empty::<Bytes>::new());
            let (status, headers) = match req {
                Ok(req) => {
                    match tokio::time::timeout(Duration::from_secs(5), client.request(req)).await {
                        Ok(Ok(res)) => (
                            res.status().as_u16(),
                            u8::from(res.headers().contains_key("ratelimit")),
                        ),
                        _ => (0, 0),
                    }
                }
                Err(_) => (0, 0),
            };
            (
                sent_ms,
                key,
                status,
                t0.elapsed().as_micros(),
                target,
                headers,
            )
        }));
    }
    let mut out = match std::fs::File::create(&out_path) {
        Ok(f) => std::io::BufWriter::new(f),
        Err(e) => {
            eprintln!("loadgen: {out_path}: {e}");
            std::process::exit(1);
        }
    };
    let (mut ok, mut denied, mut other) = (0u64, 0u64, 0u64);
    for h in handles {
        let Ok((sent, key, status, us, target, headers)) = h.await else {
            continue;
        };
        match status {
            200 => ok += 1,
            429 => denied += 1,
            _ => other += 1,
        }
        if writeln!(out, "{sent} {key} {status} {us} {target} {headers}").is_err() {
            eprintln!("loadgen: cannot write {out_path}");
            std::process::exit(1);
        }
    }
    let _ = out.flush();
    println!("sent={total} 200={ok} 429={denied} other={other}");
}
