//! Benchmarks live in `benches/`; run them with `cargo bench -p turnstile-benches`.
//!
//! This library holds what the HTTP server (`src/bin/http_server.rs`, loaded by
//! `scripts/bench-http.sh`) and the in-process HTTP bench (`benches/http_path.rs`, counted by
//! `scripts/profile-http.sh`) share: the stacks they serve.

use std::time::Duration;

use axum::{routing::get, Router};
use clap::ValueEnum;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::GovernorLayer;
use tower_turnstile::{Policy, RateLimitLayer};

/// Which stack serves `GET /`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// axum alone.
    Bare,
    /// axum behind turnstile's `RateLimitLayer` (defaults: `RateLimit` headers on every response).
    Turnstile,
    /// As `turnstile`, without headers on admitted responses (`headers_on_allowed(false)`).
    TurnstileNoHeaders,
    /// As `turnstile`, with a quota of one request per hour: every request after the first is
    /// denied (`429` with `Retry-After`, both rate-limit headers and a problem body). Not
    /// served by `scripts/bench-http.sh` (wrk would count the `429`s as errors); counted
    /// in process by `scripts/profile-http.sh`.
    TurnstileDenied,
    /// axum behind tower_governor's `GovernorLayer` (defaults: no headers).
    TowerGovernor,
    /// As `tower-governor`, with `.use_headers()`: `x-ratelimit-limit` and
    /// `x-ratelimit-remaining` on every admitted response (the twin of `turnstile`).
    TowerGovernorHeaders,
    /// axum behind a layer that does nothing (tower's `Identity`): what axum itself adds for
    /// any layer (the boxed route and future, the response mapping), the floor under every
    /// other layered stack. Counted by `scripts/profile-http.sh`.
    IdentityLayer,
}

/// Requests per second of every quota (and its burst) that must not deny: 10^9, never
/// reached.
pub const RATE: u64 = 1_000_000_000;

/// The axum hello-world `GET /` → `Hello, World!` behind the stack `mode` names. Every limiter
/// keys by the peer IP (axum's `ConnectInfo<SocketAddr>`, so serve the router with
/// `into_make_service_with_connect_info::<SocketAddr>()`, or insert it into each request).
///
/// # Errors
/// An invalid policy or `tower_governor` configuration (not with these constants).
pub fn app(mode: Mode) -> Result<Router, Box<dyn std::error::Error>> {
    let app = Router::new().route("/", get(|| async { "Hello, World!" }));
    Ok(match mode {
        Mode::Bare => app,
        Mode::Turnstile | Mode::TurnstileNoHeaders => {
            let policy = Policy::token_bucket(RATE, Duration::from_secs(1))?.with_name("per-ip")?;
            let layer = RateLimitLayer::builder()
                .policy(policy)
                .headers_on_allowed(mode == Mode::Turnstile)
                .build()?;
            app.layer(layer)
        }
        Mode::TurnstileDenied => {
            let policy = Policy::fixed_window(1, Duration::from_secs(3600))?.with_name("per-ip")?;
            app.layer(RateLimitLayer::new(policy))
        }
        Mode::TowerGovernor => {
            let config = GovernorConfigBuilder::default()
                .per_nanosecond(1)
                .burst_size(u32::try_from(RATE)?)
                .finish()
                .ok_or("invalid tower_governor configuration")?;
            app.layer(GovernorLayer::new(config))
        }
        Mode::TowerGovernorHeaders => {
            let config = GovernorConfigBuilder::default()
                .per_nanosecond(1)
                .burst_size(u32::try_from(RATE)?)
                .use_headers()
                .finish()
                .ok_or("invalid tower_governor configuration")?;
            app.layer(GovernorLayer::new(config))
        }
        Mode::IdentityLayer => app.layer(tower_layer::Identity::new()),
    })
}
