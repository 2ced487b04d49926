//! [`MemoryBackendBuilder`]: a backend's clock, key cap and shard count.

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use foldhash::fast::RandomState;

use super::backend::{Inner, MemoryBackend};
use super::shard::ShardCell;
use crate::clock::{Clock, SystemClock};

/// The default shard count: 4 per CPU the process may use, rounded up to a power of two,
/// from 8 to 64 — as many as keep threads from waiting on each other's shards, and no more:
/// every shard's lock and table header are cache lines each check may miss, and 64 shards on
/// two CPUs cost about one L1 miss per check on 10,000 keys (cachegrind).
fn default_shards() -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    cpus.saturating_mul(4).next_power_of_two().clamp(8, 64)
}

/// Configures a [`MemoryBackend`]: its clock, its cap on tracked keys, its shard count.
#[derive(Debug)]
#[must_use]
pub struct MemoryBackendBuilder<C = SystemClock> {
    clock: C,
    max_keys: Option<usize>,
    shards: usize,
}

impl MemoryBackend<SystemClock> {
    /// A backend on the system clock with no cap on tracked keys.
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// A builder, starting from the system clock, no key cap and the default shard count
    /// (4 per CPU, from 8 to 64). Reads the system
    /// clock once, so that its one-time calibration (see [`SystemClock`]) happens here
    /// rather than in the first check.
    pub fn builder() -> MemoryBackendBuilder<SystemClock> {
        SystemClock.now_ms();
        MemoryBackendBuilder {
            clock: SystemClock,
            max_keys: None,
            shards: default_shards(),
        }
    }
}

impl Default for MemoryBackend<SystemClock> {
    fn default() -> Self {
        Self::new()
    }
}

impl<C> MemoryBackendBuilder<C> {
    /// Uses `clock` for [`Backend::check`] (not for [`Backend::check_at`], which is given the
    /// time).
    pub fn clock<C2: Clock>(self, clock: C2) -> MemoryBackendBuilder<C2> {
        MemoryBackendBuilder {
            clock,
            max_keys: self.max_keys,
            shards: self.shards,
        }
    }

    /// Caps the number of keys tracked at once; `None` (the default) for no cap. At the cap,
    /// a check that would add a key fails with [`BackendError::CapacityExceeded`].
    pub fn max_keys(mut self, max_keys: impl Into<Option<usize>>) -> Self {
        self.max_keys = max_keys.into();
        self
    }

    /// Sets the number of independently locked shards (default: 4 per CPU the process may
    /// use, rounded up to a power of two, from 8 to 64; at least 1).
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = shards.max(1);
        self
    }

    /// Builds the backend.
    pub fn build(self) -> MemoryBackend<C> {
        MemoryBackend {
            inner: Arc::new(Inner {
                shards: (0..self.shards).map(|_| ShardCell::new()).collect(),
                hasher: RandomState::default(),
                clock: self.clock,
                max_keys: self.max_keys,
                keys: AtomicUsize::new(0),
            }),
        }
    }
}
