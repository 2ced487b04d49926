//! How the in-memory backend gives memory back: expired keys dropped a few at a time by the
//! checks (in their own shard and, round-robin, in every other), on a timer where no traffic
//! comes ([`MemoryBackend::spawn_sweeper`]), and maps shrunk once they are mostly empty.
// Without the `tokio` feature there is no `spawn_sweeper`: its links go to the features.
#![cfg_attr(
    not(feature = "tokio"),
    doc = "",
    doc = "[`MemoryBackend::spawn_sweeper`]: crate#features"
)]

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use foldhash::fast::RandomState;

use super::entry::Policies;
use super::shard::{Shard, ShardCell};
use super::table::Table;
use super::MemoryBackend;
use crate::clock::Clock;

/// Every this many checks, a thread sweeps a few entries of another shard.
const ELSEWHERE_EVERY: u32 = 16;

/// How many entries of another shard such a check looks at (two per check, on average).
const SWEEP_ELSEWHERE: usize = 32;

/// A map holding more room than this (in entries) shrinks when at most a quarter full; a
/// smaller one only when empty.
const SHRINK_ABOVE: usize = 8;

thread_local! {
    /// This thread's turn in the round-robin over other shards (any backend).
    static TURN: Cell<u32> = const { Cell::new(0) };
}

/// The time of a check, and whether the caller gave it (a simulation's trace time) or it is
/// the backend's clock. A key is only ever swept on the time base it was last checked on.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Now {
    pub(crate) ms: u64,
    pub(crate) explicit: bool,
}

impl Now {
    /// An explicit time (ms since the caller's epoch).
    pub(crate) fn explicit(ms: u64) -> Self {
        Now { ms, explicit: true }
    }

    /// The time base's index in per-base arrays: 0 the clock, 1 explicit times.
    fn base(self) -> usize {
        usize::from(self.explicit)
    }
}

/// What [`Shard::sweep_sparing`] did: how many entries it dropped, where the spared entry
/// is now, and whether the sweep passed it (so its expiry is the caller's to note).
pub(super) struct Swept {
    pub(super) dropped: usize,
    pub(super) spare: Option<usize>,
    pub(super) passed: bool,
}

impl Shard {
    pub(super) fn new() -> Self {
        Shard {
            table: Table::default(),
            policies: Policies::default(),
            cursor: 0,
            bound: [u64::MAX; 2],
            round_min: [u64::MAX; 2],
        }
    }

    /// Whether some key of this shard may have expired at `now` (on its time base): only
    /// then is sweeping worth it.
    #[inline]
    pub(super) fn due(&self, now: Now) -> bool {
        now.ms >= self.bound[now.base()]
    }

    /// Notes that an entry on time base `explicit` now expires at `expires_ms`: the bounds
    /// stay below every entry's expiry.
    #[inline]
    pub(super) fn note(&mut self, cell: &ShardCell, expires_ms: u64, explicit: bool) {
        let b = usize::from(explicit);
        // Written only when lowered: under a lock two threads share, a write to a line
        // both read is a cache miss for the other.
        if expires_ms < self.round_min[b] {
            self.round_min[b] = expires_ms;
            if expires_ms < self.bound[b] {
                self.bound[b] = expires_ms;
                cell.bound[b].store(expires_ms, Ordering::Relaxed);
            }
        }
    }

    /// Ends a round of the sweep, which has seen every entry since the last one ended (or
    /// been told of it by [`Shard::note`]): the least expiry it saw becomes the bound.
    fn end_round(&mut self, cell: &ShardCell) {
        self.bound = self.round_min;
        for (b, v) in cell.bound.iter().zip(self.bound) {
            b.store(v, Ordering::Relaxed);
        }
        self.round_min = [u64::MAX; 2];
        self.cursor = 0;
    }

    /// Looks at up to `n` entries from the cursor on, dropping those expired at `now` (on
    /// its time base), and shrinks the map if that left it mostly empty. Returns how many
    /// were dropped.
    pub(super) fn sweep(
        &mut self,
        hasher: &RandomState,
        cell: &ShardCell,
        now: Now,
        n: usize,
    ) -> usize {
        self.sweep_sparing(hasher, cell, now, n, None).dropped
    }

    /// [`Shard::sweep`], leaving entry `spare` (the key a check is about to decide) in place
    /// whether or not it has expired: the check overwrites it, so dropping it would only
    /// make the check insert the key again. Its expiry is not taken into the round: the
    /// caller notes it ([`Shard::note`]) once the check is done, when the sweep passed it.
    /// Returns how many entries were dropped, where `spare` is now (the last entry takes
    /// the place of each one dropped) and whether the sweep passed it.
    pub(super) fn sweep_sparing(
        &mut self,
        hasher: &RandomState,
        cell: &ShardCell,
        now: Now,
        n: usize,
        mut spare: Option<usize>,
    ) -> Swept {
        let (mut dropped, mut passed) = (0, false);
        for _ in 0..n {
            if self.cursor >= self.table.len() {
                self.end_round(cell);
                if self.table.is_empty() {
                    break;
                }
            }
            let i = self.cursor;
            if spare == Some(i) {
                passed = true;
                self.cursor = i + 1;
                continue;
            }
            let Some(e) = self.table.get(i) else { break };
            let (expires_ms, explicit) = (e.head.expires_ms(&self.policies), e.head.explicit());
            if explicit == now.explicit && expires_ms <= now.ms {
                self.remove(hasher, i);
                dropped += 1;
                if spare == Some(self.table.len()) {
                    spare = Some(i);
                }
            } else {
                let b = usize::from(explicit);
                self.round_min[b] = self.round_min[b].min(expires_ms);
                self.cursor = i + 1;
            }
        }
        if dropped > 0 {
            self.give_back(hasher);
        }
        Swept {
            dropped,
            spare,
            passed,
        }
    }

    /// Removes entry `i`, releasing its policies. The last entry takes its place: if the
    /// sweep's round already passed that place, the moved entry's expiry is noted for the
    /// round (it will not be visited in it).
    pub(super) fn remove(&mut self, hasher: &RandomState, i: usize) {
        let Some(e) = self.table.swap_remove(hasher, i) else {
            return;
        };
        for id in e.head.policy_ids() {
            self.policies.release(id);
        }
        if i < self.cursor {
            if let Some(moved) = self.table.get(i) {
                let b = usize::from(moved.head.explicit());
                let expires_ms = moved.head.expires_ms(&self.policies);
                self.round_min[b] = self.round_min[b].min(expires_ms);
            }
        }
    }

    /// Shrinks the map to twice its keys when it is at most a quarter full (and frees it
    /// when empty): the memory of a flood comes back, and shrinking costs O(keys) only after
    /// at least as many removals (amortized O(1) each).
    pub(super) fn give_back(&mut self, hasher: &RandomState) {
        let capacity = self.table.capacity();
        let len = self.table.len();
        if (capacity > SHRINK_ABOVE || len == 0) && len <= capacity / 4 {
            self.table.shrink_to(hasher, len * 2);
        }
        if len == 0 {
            self.policies.drop_unused();
        }
    }
}

/// The sweeper a backend starts by itself
/// ([`MemoryBackendBuilder::sweep_every`](crate::MemoryBackendBuilder::sweep_every)): its
/// interval, whether it has started, and how to start it (made where the clock is known to be
/// a [`Clock`], so that the check paths need not be).
pub(super) struct AutoSweep<C> {
    every: Option<Duration>,
    started: AtomicBool,
    start: fn(&MemoryBackend<C>, Duration) -> bool,
    /// Whether timed sweeps also drop keys checked at explicit times, by the clock: set for a
    /// local fallback, whose explicit times are its clock's readings.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    explicit_by_clock: AtomicBool,
}

impl<C: Clock> AutoSweep<C> {
    /// A sweeper every `every` (`None`: none).
    pub(super) fn new(every: Option<Duration>) -> Self {
        AutoSweep {
            every,
            started: AtomicBool::new(false),
            start: start_sweeper::<C>,
            explicit_by_clock: AtomicBool::new(false),
        }
    }
}

/// Starts `backend`'s sweeper on the current tokio runtime; `false` when there is none.
fn start_sweeper<C: Clock>(_backend: &MemoryBackend<C>, _every: Duration) -> bool {
    #[cfg(feature = "tokio")]
    return _backend.spawn_sweeper(_every).is_ok();
    #[cfg(not(feature = "tokio"))]
    false
}

impl<C> MemoryBackend<C> {
    /// Makes timed sweeps ([`MemoryBackend::spawn_sweeper`], the backend's own) drop keys
    /// checked at explicit times too, once the clock is past their expiry: for the local
    /// fallback, which checks at times its clock gave (so that a decision and its bookkeeping
    /// share one reading), and whose keys would otherwise wait for traffic.
    pub(crate) fn sweep_explicit_times_by_clock(&self) {
        self.inner
            .auto_sweep
            .explicit_by_clock
            .store(true, Ordering::Relaxed);
    }

    /// Starts the backend's own sweeper, if it has one that has not started: called as a key
    /// is added (never on a check of a key already tracked). One load when it has started.
    #[inline]
    pub(super) fn start_sweeper_once(&self) {
        let auto = &self.inner.auto_sweep;
        if let Some(every) = auto.every {
            if !auto.started.load(Ordering::Relaxed) {
                self.start_sweeper_now(every);
            }
        }
    }

    #[cold]
    #[inline(never)]
    fn start_sweeper_now(&self, every: Duration) {
        let auto = &self.inner.auto_sweep;
        // One thread starts it; outside a runtime it is left for a later key.
        if auto
            .started
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
            && !(auto.start)(self, every)
        {
            auto.started.store(false, Ordering::Release);
        }
    }

    /// Every 16th check of a thread looks at a few entries of the next shard in its
    /// round-robin, if some key there may have expired and the shard is free right now
    /// (never waiting, never holding another lock): keys expire from every shard while any
    /// traffic flows. No hashing, no allocation. Never the check's `own` shard: its own
    /// sweep spares the key it checks ([`Shard::sweep_sparing`]).
    #[inline]
    pub(super) fn sweep_elsewhere(&self, own: &ShardCell, now: Now) {
        let turn = TURN.with(|t| {
            let next = t.get().wrapping_add(1);
            t.set(next);
            next
        });
        if turn % ELSEWHERE_EVERY == 0 {
            self.sweep_other(turn / ELSEWHERE_EVERY, own, now);
        }
    }

    /// The shard `turn` points to, swept if some key there may have expired, it is free and
    /// it is not `own`.
    #[inline(never)]
    fn sweep_other(&self, turn: u32, own: &ShardCell, now: Now) {
        let shards = &self.inner.shards;
        if shards.len() < 2 {
            return;
        }
        let cell = &shards[turn as usize % shards.len()];
        if std::ptr::eq(cell, own) || now.ms < cell.bound[now.base()].load(Ordering::Relaxed) {
            return;
        }
        if let Some(mut shard) = cell.shard.try_lock() {
            self.sweep(cell, &mut shard, now, SWEEP_ELSEWHERE);
        }
    }

    /// Drops the keys `expired(expires_ms, explicit)` says are, one shard locked at a time,
    /// shrinking the maps that are left mostly empty. Returns how many keys were dropped.
    pub(super) fn sweep_all(&self, expired: impl Fn(u64, bool) -> bool) -> usize {
        let hasher = &self.inner.hasher;
        let mut dropped = 0;
        for cell in self.inner.shards.iter() {
            let mut shard = cell.shard.lock();
            let shard = &mut *shard;
            let Shard {
                table, policies, ..
            } = &mut *shard;
            let gone = table.retain(hasher, |e| {
                !expired(e.head.expires_ms(policies), e.head.explicit())
            });
            for head in &gone {
                for id in head.policy_ids() {
                    policies.release(id);
                }
            }
            // A full round: the bounds are the least expiry of what is left.
            shard.round_min = [u64::MAX; 2];
            for e in shard.table.entries() {
                let b = usize::from(e.head.explicit());
                let expires_ms = e.head.expires_ms(&shard.policies);
                shard.round_min[b] = shard.round_min[b].min(expires_ms);
            }
            shard.end_round(cell);
            if !gone.is_empty() {
                dropped += gone.len();
                shard.give_back(hasher);
            }
        }
        self.dropped(dropped);
        dropped
    }
}

impl<C: Clock> MemoryBackend<C> {
    /// Drops every key whose state has expired by the backend's clock, scanning every shard
    /// (one locked at a time), and gives the maps' spare memory back. Keys last checked at
    /// explicit times ([`Backend::check_at`](crate::Backend::check_at): simulations) are
    /// left alone: their time is not the clock's. Returns how many keys were dropped.
    ///
    /// [`MemoryBackend::spawn_sweeper`] calls this on a timer; call it from your own timer
    /// where there is no tokio runtime.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use turnstile_core::{Backend, ManualClock, MemoryBackend, Policy};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let clock = ManualClock::new(0);
    /// let backend = MemoryBackend::builder().clock(clock.clone()).build();
    /// let per_minute = [Policy::fixed_window(5, Duration::from_secs(60))?];
    /// backend.check("one-off", &per_minute, 1).into_inner()?;
    /// assert_eq!(backend.len(), 1);
    /// clock.advance(Duration::from_secs(60));
    /// assert_eq!(backend.sweep_expired(), 1);
    /// assert!(backend.is_empty());
    /// # Ok(()) }
    /// ```
    #[cfg_attr(
        not(feature = "tokio"),
        doc = "",
        doc = "[`MemoryBackend::spawn_sweeper`]: crate#features"
    )]
    pub fn sweep_expired(&self) -> usize {
        let now_ms = self.inner.clock.now_ms();
        self.sweep_all(|expires_ms, explicit| !explicit && expires_ms <= now_ms)
    }

    /// One sweep of the timer: [`MemoryBackend::sweep_expired`], or for a local fallback
    /// every key expired by the clock.
    #[cfg(feature = "tokio")]
    fn timed_sweep(&self) -> usize {
        if self
            .inner
            .auto_sweep
            .explicit_by_clock
            .load(Ordering::Relaxed)
        {
            self.purge_expired(self.inner.clock.now_ms())
        } else {
            self.sweep_expired()
        }
    }

    /// Spawns a task on the current tokio runtime that calls
    /// [`MemoryBackend::sweep_expired`] every `every` (for the local fallback of
    /// the `Fallback` wrapper, whose checks are at its clock's times, it drops
    /// every key the clock says has expired), so expired keys go (and their memory
    /// with them) even when no request comes. The task ends by itself once every clone of
    /// the backend is dropped; abort the handle to end it sooner. Each pass scans every key
    /// once, one shard locked at a time: an interval of a second or more suits most
    /// services.
    ///
    /// # Errors
    /// [`SpawnSweeperError::ZeroInterval`] when `every` is zero;
    /// [`SpawnSweeperError::NoRuntime`] when called outside a tokio runtime.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use turnstile_core::MemoryBackend;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let backend = MemoryBackend::new();
    /// let sweeper = backend.spawn_sweeper(Duration::from_secs(1))?;
    /// # sweeper.abort();
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub fn spawn_sweeper(
        &self,
        every: std::time::Duration,
    ) -> Result<tokio::task::JoinHandle<()>, SpawnSweeperError> {
        if every.is_zero() {
            return Err(SpawnSweeperError::ZeroInterval);
        }
        let runtime =
            tokio::runtime::Handle::try_current().map_err(|_| SpawnSweeperError::NoRuntime)?;
        let backend = std::sync::Arc::downgrade(&self.inner);
        // The first sweep is `every` after this call (not after the task first runs, which
        // may be later): nothing can have expired before. (This thread is in the runtime's
        // context, which the timer needs.)
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Ok(runtime.spawn(async move {
            loop {
                tick.tick().await;
                let Some(inner) = backend.upgrade() else {
                    break;
                };
                MemoryBackend { inner }.timed_sweep();
            }
        }))
    }
}

/// Why [`MemoryBackend::spawn_sweeper`] could not start a sweeper.
#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SpawnSweeperError {
    /// The interval was zero: a sweep needs a period.
    ZeroInterval,
    /// There is no tokio runtime on this thread to run the task.
    NoRuntime,
}

#[cfg(feature = "tokio")]
impl std::fmt::Display for SpawnSweeperError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SpawnSweeperError::ZeroInterval => "the sweep interval must be longer than zero",
            SpawnSweeperError::NoRuntime => {
                "no tokio runtime on this thread to run the memory sweeper"
            }
        })
    }
}

#[cfg(feature = "tokio")]
impl std::error::Error for SpawnSweeperError {}
