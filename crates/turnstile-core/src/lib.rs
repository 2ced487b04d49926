//! Exact rate-limiting decisions for [turnstile]: policies, the six algorithms as pure state
//! transitions, clocks, the [`Backend`] trait and the in-memory backend.
//!
//! Nothing here knows about HTTP or Redis; the `tower-turnstile` crate puts this behind a tower
//! layer (and re-exports this crate as `tower_turnstile::turnstile_core`), and `turnstile-redis`
//! runs the same transitions in Redis Lua. Every decision follows the project's
//! [`SEMANTICS.md`] to the unit: integer arithmetic with the emission interval T = P / L
//! never rounded, so no drift over any run.
//!
//! ```toml
//! [dependencies]
//! turnstile-core = "0.1"   # features: tokio, metrics
//! ```
//!
//! Rust 1.85. In memory, on a manual clock:
//!
//! ```
//! use std::time::Duration;
//! use turnstile_core::{Backend, ManualClock, MemoryBackend, Policy};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // 10 per second and 100 per hour, checked together: all-or-nothing.
//! let policies = [
//!     Policy::token_bucket(10, Duration::from_secs(1))?.with_name("per-second")?,
//!     "sliding-window:limit=100,period=1h,name=per-hour".parse()?,
//! ];
//! let clock = ManualClock::new(1_700_000_000_000);
//! let backend = MemoryBackend::builder().clock(clock.clone()).build();
//!
//! let admitted = (0..12)
//!     .filter(|_| backend.check("alice", &policies, 1).into_inner().is_ok_and(|d| d.allowed()))
//!     .count();
//! assert_eq!(admitted, 10);
//!
//! let denied = backend.check("alice", &policies, 1).into_inner()?;
//! assert!(!denied.allowed());
//! assert_eq!(denied.retry_after(), Some(Duration::from_millis(100)));
//! assert_eq!(denied.violated().next().map(|p| p.name()), Some("per-second"));
//! # Ok(()) }
//! ```
//!
//! # Features
//!
//! None is on by default.
//! - `tokio`: `MemoryBackend::spawn_sweeper`, which drops expired keys on a timer on the
//!   current tokio runtime (without it, checks drop them as they go, and
//!   `MemoryBackend::purge_expired` drops them at once).
//! - `metrics`: the `turnstile_memory_keys` gauge (keys an in-memory backend tracks) through
//!   the `metrics` facade.
//!
//! [turnstile]: https://github.com/turnstile-rs/turnstile
//! [`SEMANTICS.md`]: https://github.com/turnstile-rs/turnstile/blob/main/docs/SEMANTICS.md

// On docs.rs (`--cfg docsrs`, nightly): show which feature each gated item needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod algorithm;
mod backend;
mod clock;
mod debt;
pub mod decision;
mod failure;
mod few;
pub mod ip;
mod memory;
pub mod metric_names;
pub mod policy;
pub mod quota;
pub mod round;
mod shared;
#[cfg(test)]
mod test_util;
pub mod wrap;

pub use algorithm::{Evaluation, State};
pub use backend::{
    check_key_len, Backend, BackendError, BoxError, CheckResult, Checked, Quotas,
    DEFAULT_MAX_KEY_BYTES,
};
pub use clock::{Clock, ManualClock, SystemClock};
pub use decision::{Decision, Origin, PolicyDecision};
pub use failure::{FailurePolicy, OnError, UnknownFailurePolicy};
#[cfg(feature = "tokio")]
pub use memory::SpawnSweeperError;
pub use memory::{MemoryBackend, MemoryBackendBuilder};
pub use policy::{Algorithm, InvalidPolicy, Policy};
pub use quota::{Applied, KeyConfig, Limits, LimitsError, Source, Unconfigured, MAX_POLICIES};
