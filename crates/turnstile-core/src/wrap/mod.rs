//! Wrappers over any [`Backend`](crate::Backend): what a failed or a denied check gets.
//!
//! - [`Fallback`] decides locally, in memory, when the backend cannot (the
//!   [`FailurePolicy::Local`](crate::FailurePolicy::Local) row of the failure table).
//! - [`DenyCache`] repeats a denial the backend gave, without asking it again, for as long as
//!   the denial provably still holds.
//!
//! - [`IncidentLog`] tells which failure starts a backend incident and which answer ends
//!   it, so each is logged once; [`key_hash`] is how such lines show a key.
//!
//! Both wrappers forward every other call to the backend they wrap — the
//! [`Quotas`](crate::Quotas) operations through one [`Wrapper`] impl each — see every
//! successful decision, and stack:
//! `Fallback::new(DenyCache::new(redis), FailurePolicy::Local)`.

mod deny_cache;
mod fallback;
mod incident;
mod learned;
mod wrapper;

pub use deny_cache::{DenyCache, DenyCacheFuture, DEFAULT_DENY_CACHE_MAX};
pub use fallback::{Fallback, FallbackFuture, InvalidShare, Share, DEFAULT_FALLBACK_MAX_KEYS};
pub use incident::{key_hash, IncidentLog, Ticket, BAD_KEY_LOG_INTERVAL_MS, MAX_BAD_KEYS_LOGGED};
pub use wrapper::Wrapper;

#[cfg(test)]
mod tests;
