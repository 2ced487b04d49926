//! The shards keys are spread over — each a table of entries behind its own lock, picked by
//! the key's hash — and how a check finds its key's entry or makes room for a new one within
//! the key cap.

use std::sync::atomic::{AtomicU64, Ordering};

use foldhash::fast::RandomState;
use parking_lot::{Mutex, MutexGuard};

use super::backend::{keys_gauge, MemoryBackend};
use super::entry::{Head, Policies};
use super::lock;
use super::sweep::Now;
use super::table::{hash_key, Entry, Probe, Table};
use crate::backend::BackendError;

/// How many entries of each other shard a check at the key cap looks at for expiry.
const SWEEP_AT_CAP: usize = 8;

/// How many entries each check looks at for expiry, beyond the one it uses.
const SWEEP_PER_CHECK: usize = 2;

/// One shard and, outside its lock, a copy of its expiry bound for checks that look at other
/// shards without locking them. Two cache lines of its own: threads working in neighbouring
/// shards never write to one line.
///
/// The lock is `parking_lot`'s, taken as [`lock::lock`] says (a bounded spin, then parking).
#[repr(align(128))]
pub(super) struct ShardCell {
    pub(super) shard: Mutex<Shard>,
    /// [`Shard::bound`], per time base (clock, explicit).
    pub(super) bound: [AtomicU64; 2],
}

impl ShardCell {
    pub(super) fn new() -> Self {
        ShardCell {
            shard: Mutex::new(Shard::new()),
            bound: [AtomicU64::new(u64::MAX), AtomicU64::new(u64::MAX)],
        }
    }
}

/// The keys of one shard, their policies, and how far the sweep has come.
pub(super) struct Shard {
    pub(super) table: Table,
    pub(super) policies: Policies,
    /// Where the round-robin sweep goes on.
    pub(super) cursor: usize,
    /// A lower bound of every entry's expiry (ms), per time base: no sweeping before it.
    pub(super) bound: [u64; 2],
    /// The least expiry seen since the sweep's current round began, per time base.
    pub(super) round_min: [u64; 2],
}

/// A key about to be looked up: its hash (which also picks its shard) and its bytes as the
/// table compares them.
pub(super) struct Lookup<'k> {
    pub(super) hash: u64,
    pub(super) probe: Probe<'k>,
}

impl<'k> Lookup<'k> {
    #[inline]
    pub(super) fn new(hasher: &RandomState, key: &'k str) -> Self {
        Lookup {
            hash: hash_key(hasher, key.as_bytes()),
            probe: Probe::new(key.as_bytes()),
        }
    }
}

impl Shard {
    /// Notes the expiry of entry `index` as it is now (see [`Shard::note`]): for the entry a
    /// check's sweep passed without taking its expiry into the round.
    #[cold]
    #[inline(never)]
    pub(super) fn note_entry(&mut self, cell: &ShardCell, index: Option<usize>) {
        let Some(e) = index.and_then(|i| self.table.get(i)) else {
            return;
        };
        let (expires_ms, explicit) = (e.head.expires_ms(&self.policies), e.head.explicit());
        self.note(cell, expires_ms, explicit);
    }
}

impl<C> MemoryBackend<C> {
    /// The shard of the key with hash `hash`: from bits 32 to 55, which the table uses
    /// neither for its slot (the low bits) nor for its tags (the top seven), scaled to the
    /// shard count by a multiplication (no division): below the count, as the 24 bits are
    /// below 2^24 (and the count below 2^40, so the product fits).
    #[inline]
    pub(super) fn cell(&self, hash: u64) -> &ShardCell {
        let shards = &self.inner.shards;
        let bits = (hash >> 32) & 0xFF_FFFF;
        &shards[((bits * shards.len() as u64) >> 24) as usize]
    }

    /// Locks the shard of `key`; returns its cell and the key's lookup.
    pub(super) fn shard<'k>(
        &self,
        key: &'k str,
    ) -> (&ShardCell, MutexGuard<'_, Shard>, Lookup<'k>) {
        let at = Lookup::new(&self.inner.hasher, key);
        let cell = self.cell(at.hash);
        (cell, lock::lock(&cell.shard), at)
    }

    /// The index of the entry of `at`, inserted (within the key cap) if missing.
    pub(super) fn entry_mut(
        &self,
        cell: &ShardCell,
        shard: &mut Shard,
        at: &Lookup<'_>,
        now: Now,
    ) -> Result<usize, BackendError> {
        let index = shard.table.find(at.hash, &at.probe);
        self.entry_at(cell, shard, index, at, now)
    }

    /// The entry at `index` (as `find` found it), or a new empty one for `at` (within the key
    /// cap).
    pub(super) fn entry_at(
        &self,
        cell: &ShardCell,
        shard: &mut Shard,
        index: Option<usize>,
        at: &Lookup<'_>,
        now: Now,
    ) -> Result<usize, BackendError> {
        if let Some(i) = index {
            return Ok(i);
        }
        self.reserve_key(cell, shard, now)?;
        // The sweep in `reserve_key` may move entries, but the key is not among them.
        let entry = Entry {
            key: at.probe.to_key(),
            head: Head::empty(now.explicit),
        };
        Ok(shard.table.insert(&self.inner.hasher, at.hash, entry))
    }

    /// Looks at up to `n` entries of `shard` for expiry, dropping expired ones.
    pub(super) fn sweep(&self, cell: &ShardCell, shard: &mut Shard, now: Now, n: usize) {
        let dropped = shard.sweep(&self.inner.hasher, cell, now, n);
        self.dropped(dropped);
    }

    /// A check's sweep of its own shard ([`SWEEP_PER_CHECK`] entries), leaving the checked
    /// key's entry at `index` in place; returns where that entry is now and whether the
    /// sweep passed it (then [`Shard::note_entry`] once the check is done).
    #[inline(never)]
    pub(super) fn sweep_sparing(
        &self,
        cell: &ShardCell,
        shard: &mut Shard,
        now: Now,
        index: Option<usize>,
    ) -> (Option<usize>, bool) {
        let swept = shard.sweep_sparing(&self.inner.hasher, cell, now, SWEEP_PER_CHECK, index);
        self.dropped(swept.dropped);
        (swept.spare, swept.passed)
    }

    /// Counts `n` keys dropped.
    pub(super) fn dropped(&self, n: usize) {
        if n > 0 {
            self.inner.keys.fetch_sub(n, Ordering::Relaxed);
            keys_gauge(-(n as f64));
        }
    }

    /// Reserves room for one more key, dropping the shard's expired keys first when at the cap.
    pub(super) fn reserve_key(
        &self,
        cell: &ShardCell,
        shard: &mut Shard,
        now: Now,
    ) -> Result<(), BackendError> {
        self.start_sweeper_once();
        if !shard.table.has_room() {
            return Err(BackendError::CapacityExceeded {
                max_keys: self.len(),
            });
        }
        let keys = &self.inner.keys;
        keys_gauge(1.0);
        let Some(max) = self.inner.max_keys else {
            keys.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        };
        let reserve = || {
            keys.fetch_update(Ordering::AcqRel, Ordering::Acquire, |k| {
                (k < max).then_some(k + 1)
            })
            .is_ok()
        };
        if reserve() {
            return Ok(());
        }
        // At the cap: drop every expired key of this shard, and a few of every other shard
        // that is free right now (never waiting on another lock while holding this one).
        let len = shard.table.len();
        self.sweep(cell, shard, now, len);
        for other in self.inner.shards.iter() {
            if let Some(mut locked) = other.shard.try_lock() {
                self.sweep(other, &mut locked, now, SWEEP_AT_CAP);
            }
        }
        if reserve() {
            return Ok(());
        }
        keys_gauge(-1.0);
        Err(BackendError::CapacityExceeded { max_keys: max })
    }
}
