//! [`MemoryBackendBuilder`]: a backend's clock, key cap and shard count.

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
#[cfg(feature = "tokio")]
use std::time::Duration;

use foldhash::fast::RandomState;

use super::backend::{Inner, MemoryBackend};
use super::shard::ShardCell;
use super::sweep::AutoSweep;
use crate::backend::DEFAULT_MAX_KEY_BYTES;
use crate::clock::{Clock, SystemClock};

/// The default shard count: 4 per CPU the process may use, rounded up to a power of two,
/// from 8 to 64 — as many as keep threads from waiting on each other's shards, and no more:
/// every shard's lock and table header are cache lines each check may miss, and 64 shards on
/// two CPUs cost about one L1 miss per check on 10,000 keys (cachegrind).
fn default_shards() -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    cpus.saturating_mul(4).next_power_of_two().clamp(8, 64)
}

/// Configures a [`MemoryBackend`]: its clock, its caps on tracked keys and on a key's bytes,
/// its shard count, and (feature `tokio`) a sweeper it starts by itself.
#[derive(Debug)]
#[must_use]
pub struct MemoryBackendBuilder<C = SystemClock> {
    clock: C,
    max_keys: Option<usize>,
    max_key_bytes: usize,
    shards: usize,
    /// The sweeper's interval, when the backend starts one by itself.
    sweep_every: Option<std::time::Duration>,
}

impl MemoryBackend<SystemClock> {
    /// A backend on the system clock with no cap on tracked keys.
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// A builder, starting from the system clock, no key cap, keys of at most
    /// [`DEFAULT_MAX_KEY_BYTES`](crate::DEFAULT_MAX_KEY_BYTES) bytes, the default shard count
    /// (4 per CPU, from 8 to 64) and no sweeper of its own. Reads the system
    /// clock once, so that its one-time calibration (see [`SystemClock`]) happens here
    /// rather than in the first check.
    pub fn builder() -> MemoryBackendBuilder<SystemClock> {
        SystemClock.now_ms();
        MemoryBackendBuilder {
            clock: SystemClock,
            max_keys: None,
            max_key_bytes: DEFAULT_MAX_KEY_BYTES,
            shards: default_shards(),
            sweep_every: None,
        }
    }
}

impl Default for MemoryBackend<SystemClock> {
    fn default() -> Self {
        Self::new()
    }
}

impl<C: Clock> MemoryBackendBuilder<C> {
    /// Uses `clock` for [`Backend::check`](crate::Backend::check) (not for
    /// [`Backend::check_at`](crate::Backend::check_at), which is given the
    /// time).
    pub fn clock<C2: Clock>(self, clock: C2) -> MemoryBackendBuilder<C2> {
        MemoryBackendBuilder {
            clock,
            max_keys: self.max_keys,
            max_key_bytes: self.max_key_bytes,
            shards: self.shards,
            sweep_every: self.sweep_every,
        }
    }

    /// Caps the number of keys tracked at once; `None` (the default) for no cap. At the cap,
    /// a check that would add a key fails with
    /// [`BackendError::CapacityExceeded`](crate::BackendError::CapacityExceeded).
    pub fn max_keys(mut self, max_keys: impl Into<Option<usize>>) -> Self {
        self.max_keys = max_keys.into();
        self
    }

    /// Caps a client key's length at `bytes` (default
    /// [`DEFAULT_MAX_KEY_BYTES`](crate::DEFAULT_MAX_KEY_BYTES), 512): a check or quota
    /// operation of a longer key fails with
    /// [`BackendError::KeyTooLong`](crate::BackendError::KeyTooLong) and stores nothing. With
    /// [`max_keys`](Self::max_keys), memory is bounded by keys × (key bytes + about 260
    /// bytes of entry and state; see [`MemoryBackend`]'s "Memory").
    pub fn max_key_bytes(mut self, bytes: usize) -> Self {
        self.max_key_bytes = bytes;
        self
    }

    /// Makes the backend sweep its expired keys every `every` on its own (feature `tokio`):
    /// the first check that adds a key inside a tokio runtime starts
    /// [`MemoryBackend::spawn_sweeper`]'s task on that runtime (a check outside any runtime
    /// starts none; the next one inside does). The task ends once every clone of the backend
    /// is dropped. So expired keys go, and the maps shrink, without traffic and without
    /// anyone keeping a handle. `every` is at least 1 ms. The tower layer's own in-memory
    /// backends (its default and the local fallback's) sweep every second this way.
    #[cfg(feature = "tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub fn sweep_every(mut self, every: Duration) -> Self {
        self.sweep_every = Some(every.max(Duration::from_millis(1)));
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
                max_key_bytes: self.max_key_bytes,
                keys: AtomicUsize::new(0),
                auto_sweep: AutoSweep::new(self.sweep_every),
            }),
        }
    }
}
