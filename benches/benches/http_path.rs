//! A fixed number of `GET /` requests through one HTTP stack, in process (no sockets): the
//! axum router of `scripts/bench-http.sh` (`turnstile_benches::app`), called as a tower
//! service with the peer address axum's `ConnectInfo` would carry, each response's body read
//! to the end. `scripts/profile-http.sh` runs it under callgrind twice per stack and prints
//! instructions per request (the difference of the two runs, so set-up and warm-up cancel
//! out): a load-independent measure of what each layer adds to a request, which the timed
//! `bench-http.sh` on a shared machine cannot give.
//!
//! ```text
//! http_path MODE COUNT
//! ```
//!
//! MODE: `bare`, `turnstile`, `turnstile-no-headers`, `turnstile-denied`, `tower-governor`,
//! `tower-governor-headers`, `identity-layer`
//! (see `turnstile_benches::Mode`); COUNT: requests after a warm-up of 100. It prints the
//! status codes counted.

use std::hint::black_box;
use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::ConnectInfo;
use clap::ValueEnum;
use http::Request;
use tower::{Service, ServiceExt};
use turnstile_benches::{app, Mode};

fn usage() -> ! {
    eprintln!("usage: http_path bare|turnstile|turnstile-no-headers|turnstile-denied|tower-governor|tower-governor-headers|identity-layer COUNT");
    std::process::exit(2)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // `cargo bench` passes `--bench`: nothing to do then.
    if args.len() != 2 {
        if args.iter().any(|a| a == "--bench") {
            return;
        }
        usage();
    }
    let mode = Mode::from_str(&args[0], false).unwrap_or_else(|_| usage());
    let count: u64 = args[1].parse().unwrap_or_else(|_| usage());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    // As `axum::serve` runs it: the state applied once (else every request converts its
    // handler into a route again).
    let mut router = app(mode).expect("a valid stack").with_state::<()>(());
    let peer: SocketAddr = "192.0.2.1:40000".parse().expect("an address");
    let (mut ok, mut other) = (0u64, 0u64);
    runtime.block_on(async {
        for i in 0..100 + count {
            let mut req = Request::get("/").body(Body::empty()).expect("a request");
            req.extensions_mut().insert(ConnectInfo(peer));
            let svc = ServiceExt::<Request<Body>>::ready(&mut router)
                .await
                .expect("ready");
            let res = svc.call(req).await.expect("infallible");
            let status = res.status();
            black_box(res.headers());
            let body = axum::body::to_bytes(res.into_body(), usize::MAX)
                .await
                .expect("a body");
            black_box(body);
            if i >= 100 {
                if status.is_success() {
                    ok += 1;
                } else {
                    other += 1;
                }
            }
        }
    });
    println!("{}: {ok} 2xx, {other} other", args[0]);
}
