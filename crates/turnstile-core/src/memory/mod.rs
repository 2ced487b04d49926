//! The in-memory backend: state for one process, shared by every clone.
//!
//! - `backend`: [`MemoryBackend`], the handle every clone shares, and its `Backend` impl;
//! - `builder`: [`MemoryBackendBuilder`];
//! - `shard`: the locked shards keys are spread over, finding a key's entry, the key cap;
//! - `check`: one check's `Request` and its paths — a packed bucket decided in place on its
//!   words (`fast`), one packed state of the single default policy, else `general` (any
//!   configuration, several policies, carry-over);
//! - `entry` and `table`: what a shard keeps per key; `sweep`: expired keys dropped and
//!   memory given back; `quotas`: refunds, resets and per-key configuration; `lock`: how a
//!   shard's lock is taken.

mod backend;
mod builder;
mod check;
mod entry;
mod fast;
mod general;
mod lock;
mod quotas;
mod shard;
mod sweep;
mod table;
#[cfg(test)]
mod tests;

pub use backend::MemoryBackend;
pub use builder::MemoryBackendBuilder;
#[cfg(feature = "tokio")]
pub use sweep::SpawnSweeperError;
