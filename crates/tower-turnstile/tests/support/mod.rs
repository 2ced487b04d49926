//! Helpers shared by the layer's tests: policies from strings, an in-memory backend on
//! tokio's (paused) clock, an inner service that says hello, and a way to let spawned tasks
//! run.

#![allow(dead_code)] // each test file uses its own subset

use std::convert::Infallible;
use std::net::SocketAddr;

use http::{Request, Response};
use tokio::time::Instant;
use tower_turnstile::{Clock, MemoryBackend, Policy};

/// A request for `path` with `method` from the peer address `peer` (`"192.0.2.1:40000"`),
/// as a server with connect info sees it.
pub(crate) fn request(method: &str, path: &str, peer: &str) -> Request<()> {
    let mut r = Request::builder()
        .method(method)
        .uri(path)
        .body(())
        .unwrap();
    r.extensions_mut()
        .insert(peer.parse::<SocketAddr>().unwrap());
    r
}

/// The policy `spec` (`"gcra:limit=10,period=1s"`), which must be valid.
pub(crate) fn p(spec: &str) -> Policy {
    spec.parse().unwrap()
}

/// A whole hour (2023-11-14T22:00:00Z), in ms since the Unix epoch: a [`TokioClock`]
/// starting there starts fixed windows of up to an hour with it.
pub(crate) const WHOLE_HOUR_MS: u64 = 1_699_999_200_000;

/// A clock that follows tokio's (paused) clock from `start_ms`, so waits in virtual time are
/// exact and instant.
#[derive(Clone)]
pub(crate) struct TokioClock {
    start: Instant,
    start_ms: u64,
}

impl TokioClock {
    /// A clock that reads `start_ms` now and follows tokio's clock from there.
    pub(crate) fn starting_at(start_ms: u64) -> Self {
        TokioClock {
            start: Instant::now(),
            start_ms,
        }
    }
}

impl Clock for TokioClock {
    fn now_ms(&self) -> u64 {
        self.start_ms + self.start.elapsed().as_millis() as u64
    }
}

/// An in-memory backend on a [`TokioClock`] starting at [`WHOLE_HOUR_MS`].
pub(crate) fn tokio_backend() -> MemoryBackend<TokioClock> {
    MemoryBackend::builder()
        .clock(TokioClock::starting_at(WHOLE_HOUR_MS))
        .build()
}

/// An inner service's handler: answers `hello` to every request.
pub(crate) async fn hello(_: Request<()>) -> Result<Response<String>, Infallible> {
    Ok(Response::new("hello".into()))
}

/// Lets spawned tasks run up to their next wait (virtual time does not move meanwhile).
pub(crate) async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}
