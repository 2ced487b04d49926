//! The Rust snippets of the pages below, compiled as this crate's doctests (and run, unless
//! marked `no_run`) with exactly the dependencies those pages show:
//! `cargo test -p turnstile-snippets-redis --doc`.

/// `docs/redis.md`.
#[cfg(doctest)]
#[doc = include_str!("../../../../docs/redis.md")]
pub struct Redis;

/// `docs/quotas-and-tiers.md`.
#[cfg(doctest)]
#[doc = include_str!("../../../../docs/quotas-and-tiers.md")]
pub struct QuotasAndTiers;
