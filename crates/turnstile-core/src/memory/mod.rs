//! The in-memory backend: state for one process, shared by every clone.

mod entry;
mod fast;
mod full;
mod lock;
mod quotas;
mod sweep;
mod table;

use sweep::Now;
#[cfg(feature = "tokio")]
pub use sweep::SpawnSweeperError;

use std::fmt;
use std::future::{ready, Ready};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};

use foldhash::fast::RandomState;

use crate::algorithm::{eval, Packed, State};
use crate::backend::{Backend, BackendError, CheckResult, Checked};
use crate::clock::{Clock, SystemClock};
use crate::decision::{Decision, PolicyDecision};
use crate::policy::Policy;
use crate::quota::{validate_policy_set, Applied, Limits, Tier, Unconfigured};
use entry::{Head, Policies, PolicyId, Tag};
use fast::{Words, FRESH_WORDS};
use table::{hash_key, Entry, Probe, Table};

/// How many entries each check looks at for expiry, beyond the one it uses.
const SWEEP_PER_CHECK: usize = 2;

/// How many entries of each other shard a check at the key cap looks at for expiry.
const SWEEP_AT_CAP: usize = 8;

/// The in-memory [`Backend`]: every algorithm, exact, for one process.
///
/// State is keyed by client key and policy name and shared by every clone (clones are
/// cheap: one `Arc`). Keys are spread over mutex-guarded shards; one check locks one shard
/// once, so a check against several policies is all-or-nothing and many tasks and threads on
/// one key never overshoot a limit.
///
/// # Memory
/// A key's state is dropped once its `reset_after` has passed: while some key of its shard
/// may have expired (each shard keeps a lower bound of its keys' expiry times), every check
/// also inspects two other entries of its shard, and every 16th check of a thread 32
/// entries of another shard, round-robin over all shards, and drops those that have
/// expired; so idle keys are reclaimed while any traffic flows, without scanning everything
/// on the hot path, and a check does no sweeping at all while nothing can have expired.
/// Where no traffic may come, [`MemoryBackend::spawn_sweeper`] (feature `tokio`) drops
/// them on a timer. A shard's map gives its memory back once it is mostly empty (at most a
/// quarter full, it shrinks to twice its keys). Keys checked at explicit times
/// ([`Backend::check_at`]: simulations) are only ever swept by checks at explicit times,
/// never by the clock.
///
/// A key with one token-bucket, GCRA, leaky-bucket or fixed-window policy and no
/// configuration costs about 60 heap bytes, the tables' spare room included, when the key
/// has at most 23 bytes (an IPv4 address, an IPv6 network): its state is packed into its
/// entry. A longer key costs its length more. A key with several policies, a sliding
/// window, an override or a tier costs about 200 bytes more (its entry then points to its
/// slots); a sliding log 16 bytes per distinct millisecond logged besides (at most
/// min(limit, period in ms) entries). The `bytes_per_key` test measures these with 20,000
/// keys. With
/// [`MemoryBackendBuilder::max_keys`], a check that would track one key more than the cap
/// fails with [`BackendError::CapacityExceeded`] (after first dropping the expired keys of
/// its shard, and up to 8 of each other shard) instead of evicting live state, which would over-admit.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use turnstile_core::{Backend, ManualClock, MemoryBackend, Policy};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let clock = ManualClock::new(0);
/// let backend = MemoryBackend::builder().clock(clock.clone()).build();
/// let per_second = Policy::token_bucket(2, Duration::from_secs(1))?;
///
/// assert!(backend.check("alice", &[per_second.clone()], 1).into_inner()?.allowed());
/// assert!(backend.check("alice", &[per_second.clone()], 1).into_inner()?.allowed());
/// let denied = backend.check("alice", &[per_second.clone()], 1).into_inner()?;
/// assert_eq!(denied.retry_after(), Some(Duration::from_millis(500)));
///
/// clock.advance(Duration::from_millis(500));
/// assert!(backend.check("alice", &[per_second], 1).into_inner()?.allowed());
/// # Ok(()) }
/// ```
#[cfg_attr(
    not(feature = "tokio"),
    doc = "",
    doc = "[`MemoryBackend::spawn_sweeper`]: crate#features"
)]
pub struct MemoryBackend<C = SystemClock> {
    inner: Arc<Inner<C>>,
}

impl<C> Clone for MemoryBackend<C> {
    fn clone(&self) -> Self {
        MemoryBackend {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<C> fmt::Debug for MemoryBackend<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryBackend")
            .field("keys", &self.len())
            .field("max_keys", &self.inner.max_keys)
            .field("shards", &self.inner.shards.len())
            .finish()
    }
}

struct Inner<C> {
    shards: Box<[ShardCell]>,
    hasher: RandomState,
    clock: C,
    max_keys: Option<usize>,
    keys: AtomicUsize,
}

/// One shard and, outside its lock, a copy of its expiry bound for checks that look at other
/// shards without locking them. Two cache lines of its own: threads working in neighbouring
/// shards never write to one line.
///
/// The lock is `parking_lot`'s, taken as [`lock::lock`] says (a bounded spin, then parking).
#[repr(align(128))]
struct ShardCell {
    shard: Mutex<Shard>,
    /// [`Shard::bound`], per time base (clock, explicit).
    bound: [AtomicU64; 2],
}

impl ShardCell {
    fn new() -> Self {
        ShardCell {
            shard: Mutex::new(Shard::new()),
            bound: [AtomicU64::new(u64::MAX), AtomicU64::new(u64::MAX)],
        }
    }
}

struct Shard {
    /// foldhash: fast on short keys, seeded per backend (keys are client-controlled).
    table: Table,
    policies: Policies,
    /// Where the round-robin sweep goes on.
    cursor: usize,
    /// A lower bound of every entry's expiry (ms), per time base: no sweeping before it.
    bound: [u64; 2],
    /// The least expiry seen since the sweep's current round began, per time base.
    round_min: [u64; 2],
}

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

impl<C> MemoryBackend<C> {
    /// The number of keys currently tracked (including expired ones not yet dropped).
    pub fn len(&self) -> usize {
        self.inner.keys.load(Ordering::Relaxed)
    }

    /// The cap on tracked keys, if any.
    pub fn max_keys(&self) -> Option<usize> {
        self.inner.max_keys
    }

    /// Whether no key is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every key whose state has expired at `now_ms` (whichever time base it was
    /// checked on), scanning every shard, and gives the maps' spare memory back. Checks do
    /// this incrementally on their own, and [`MemoryBackend::spawn_sweeper`] on a timer;
    /// call this only to reclaim memory at once (tests, maintenance). Returns how many keys
    /// were dropped.
    #[cfg_attr(
        not(feature = "tokio"),
        doc = "",
        doc = "[`MemoryBackend::spawn_sweeper`]: crate#features"
    )]
    pub fn purge_expired(&self, now_ms: u64) -> usize {
        self.sweep_all(|expires_ms, _| expires_ms <= now_ms)
    }

    /// A check of `policies` (the defaults, no tiers) at `now`.
    #[inline(always)]
    fn check_policies<A: Answer>(&self, key: &str, policies: &[Policy], cost: u64, now: Now) -> A {
        if let Err(e) = validate_policy_set(policies) {
            return A::answer(Err(BackendError::InvalidRequest(e.to_string())));
        }
        self.check_inner(
            key,
            policies,
            &Limits::NO_TIERS,
            Unconfigured::Defaults,
            cost,
            now,
        )
    }

    /// Checks `key`: the policies its configuration resolves to (see
    /// [`Backend::check_limits`]) at `now`. One hash of the key picks its shard and finds its
    /// entry; a key with one packed state and the single default policy is decided in place,
    /// anything else by [`MemoryBackend::check_full`]. The answer comes back as `A` (the
    /// result itself, or the future a [`Backend`] method returns), built in place.
    ///
    /// Inlined into its callers (the [`Backend`] methods, and theirs): the answer is then
    /// built where the caller keeps it, and the caller reads what it needs of it without
    /// copying it whole (60 instructions of about 500 per check). The general path stays
    /// out of line.
    #[inline(always)]
    pub(crate) fn check_inner<A: Answer>(
        &self,
        key: &str,
        defaults: &[Policy],
        tiers: &[Tier],
        unconfigured: Unconfigured,
        cost: u64,
        now: Now,
    ) -> A {
        self.sweep_elsewhere(now);
        let at = Lookup::new(&self.inner.hasher, key);
        let cell = self.cell(at.hash);
        let mut shard = lock::lock(&cell.shard);
        let shard = &mut *shard;
        if shard.due(now) {
            self.sweep(cell, shard, now, SWEEP_PER_CHECK);
        }
        let index = shard.table.find(at.hash, &at.probe);
        // The commonest check: one default policy (unconfigured keys get the defaults) on a
        // key holding one packed bucket state of that very policy (same name and
        // parameters), decided and written in place, one look at the entry. An admission
        // never brings a bucket's expiry forward (it is the last update plus the debt's time
        // then, and the debt grows by the cost), so the shard's bounds still hold: the
        // sweep's round has seen the entry's old expiry or will see the new one. Only a key
        // moving to the other time base is noted. Written out here, not called, so the
        // decision is built once, from scalars, in the place it is returned from; every other
        // check goes out of line ([`MemoryBackend::check_slow`]), so no other path's answer
        // merges with this one's on the way out.
        if let ([policy], Unconfigured::Defaults) = (defaults, unconfigured) {
            if let Some(Entry {
                head: Head::One { tag, c, a, b },
                ..
            }) = index.and_then(|i| shard.table.get_mut(i))
            {
                let words = Words {
                    kind: tag.kind(),
                    a: *a,
                    b: *b,
                    c: *c,
                };
                if let Some(shared) = shard.policies.get_if(tag.policy(), policy) {
                    if let Some(f) = fast::decide(policy, words, now.ms, cost) {
                        let shared = shared.clone();
                        if let Some(w) = f.write {
                            (*c, *a, *b) = (w.c, w.a, w.b);
                            // The tag changes only with the state's kind or time base (a
                            // fresh key's first write, a key moving between time bases).
                            let moved = tag.explicit() != now.explicit;
                            if w.kind != words.kind || moved {
                                *tag = tag.with_state(w.kind, now.explicit);
                            }
                            if moved {
                                let expires_ms =
                                    fast::expires_at(f.now, f.debts.after, policy.limit());
                                shard.note(cell, expires_ms, now.explicit);
                            }
                        }
                        let d = PolicyDecision::bucket(shared, f.debts);
                        return A::answer(Ok(Decision::one(d, Applied::Defaults, 0)));
                    }
                }
            }
        }
        self.check_slow(
            cell,
            shard,
            index,
            &at,
            defaults,
            tiers,
            unconfigured,
            cost,
            now,
        )
    }

    /// [`MemoryBackend::check_inner`] for every check but a packed bucket decided in place:
    /// a new key or a fixed window with the single default policy (still without the
    /// general evaluation), else [`MemoryBackend::check_full`]. Out of line, its answer
    /// built where the caller keeps it.
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    fn check_slow<A: Answer>(
        &self,
        cell: &ShardCell,
        shard: &mut Shard,
        index: Option<usize>,
        at: &Lookup<'_>,
        defaults: &[Policy],
        tiers: &[Tier],
        unconfigured: Unconfigured,
        cost: u64,
        now: Now,
    ) -> A {
        // Still without the general evaluation: one default policy, on a key that is new or
        // holds one packed state of that very policy, without configuration (else `break
        // 'fast` to the general path).
        'fast: {
            let [policy] = defaults else { break 'fast };
            // Without configuration the defaults apply, unless unconfigured keys are denied
            // or admitted without limit (the general path answers those).
            if unconfigured != Unconfigured::Defaults {
                break 'fast;
            }
            let (stored, words) = match index {
                Some(i) => match shard.table.get(i).map(|e| &e.head) {
                    Some(&Head::One { tag, c, a, b }) => {
                        let kind = tag.kind();
                        (Some(tag.policy()), Words { kind, a, b, c })
                    }
                    _ => break 'fast,
                },
                None => (None, FRESH_WORDS),
            };
            // The state must be this policy's, with these parameters (else: carry-over).
            let (id, shared) = match stored {
                Some(id) => match shard.policies.get_if(id, policy) {
                    Some(shared) => (id, shared.clone()),
                    None => break 'fast,
                },
                None => {
                    let id = shard.policies.intern(policy);
                    let Some(shared) = shard.policies.get(id).cloned() else {
                        break 'fast;
                    };
                    (id, shared)
                }
            };
            // Buckets decide on the packed words; fixed windows on the unpacked state.
            let limit = policy.limit();
            let Some(f) = fast::decide(policy, words, now.ms, cost) else {
                let packed = Packed {
                    kind: words.kind,
                    a: words.a,
                    b: words.b,
                    c: words.c,
                };
                let mut state = State::unpack(packed, limit);
                let e = eval(policy, &state, now.ms, cost);
                if e.allowed && e.changes_state() {
                    e.apply(&mut state);
                    let head = Head::single(id, limit, state, e.expires_at_ms, now.explicit);
                    let put = self.put_one(cell, shard, index, at, id, head, e.expires_at_ms, now);
                    if let Err(err) = put {
                        return A::answer(Err(err));
                    }
                }
                return A::answer(Ok(Decision::one(e.decision(shared), Applied::Defaults, 0)));
            };
            if let Some(w) = f.write {
                let Some(new_tag) = Tag::new(id, w.kind, now.explicit) else {
                    break 'fast;
                };
                match index.and_then(|i| shard.table.get_mut(i)) {
                    // The packed state in place (no new head to drop the old one for). An
                    // admission never brings a bucket's expiry forward (it is the last update
                    // plus the debt's time then, and the debt grows by the cost), so the
                    // shard's bounds still hold: the sweep's round has seen the entry's old
                    // expiry or will see the new one. Only a key moving to the other time
                    // base is noted.
                    Some(Entry {
                        head: Head::One { tag, c, a, b },
                        ..
                    }) => {
                        let moved = tag.explicit() != now.explicit;
                        (*tag, *c, *a, *b) = (new_tag, w.c, w.a, w.b);
                        if moved {
                            let expires_ms = fast::expires_at(f.now, f.debts.after, limit);
                            shard.note(cell, expires_ms, now.explicit);
                        }
                    }
                    _ => {
                        // The exact expiry (a division) only when it may lower the bound.
                        let floor = fast::expires_no_earlier_than(f.now, f.debts.after, limit);
                        let expires_ms = if floor < shard.round_min[usize::from(now.explicit)] {
                            fast::expires_at(f.now, f.debts.after, limit)
                        } else {
                            floor
                        };
                        let head = Head::One {
                            tag: new_tag,
                            c: w.c,
                            a: w.a,
                            b: w.b,
                        };
                        let put = self.put_one(cell, shard, index, at, id, head, expires_ms, now);
                        if let Err(err) = put {
                            return A::answer(Err(err));
                        }
                    }
                }
            }
            let d = PolicyDecision::bucket(shared, f.debts);
            return A::answer(Ok(Decision::one(d, Applied::Defaults, 0)));
        }
        let general = self.check_full(
            cell,
            shard,
            index,
            at,
            defaults,
            tiers,
            unconfigured,
            cost,
            now,
        );
        A::answer(general)
    }

    /// Stores the fast path's `head` for the key of `at`: at `index`, or a new entry (within
    /// the key cap) referring to policy `id`; notes its expiry.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn put_one(
        &self,
        cell: &ShardCell,
        shard: &mut Shard,
        index: Option<usize>,
        at: &Lookup<'_>,
        id: PolicyId,
        head: Head,
        expires_ms: u64,
        now: Now,
    ) -> Result<(), BackendError> {
        match index.and_then(|i| shard.table.get_mut(i)) {
            Some(e) => e.head = head,
            None => {
                // Referred to before the room is made: a sweep that empties the shard drops
                // the policies nothing refers to, which must not include this one.
                shard.policies.acquire(id);
                if let Err(e) = self.reserve_key(cell, shard, now) {
                    shard.policies.release(id);
                    return Err(e);
                }
                let entry = Entry {
                    key: at.probe.to_key(),
                    head,
                };
                shard.table.insert(&self.inner.hasher, at.hash, entry);
            }
        }
        shard.note(cell, expires_ms, now.explicit);
        Ok(())
    }

    /// The shard of the key with hash `hash`: from bits 32 to 55, which the table uses
    /// neither for its slot (the low bits) nor for its tags (the top seven), scaled to the
    /// shard count by a multiplication (no division): below the count, as the 24 bits are
    /// below 2^24 (and the count below 2^40, so the product fits).
    #[inline]
    fn cell(&self, hash: u64) -> &ShardCell {
        let shards = &self.inner.shards;
        let bits = (hash >> 32) & 0xFF_FFFF;
        &shards[((bits * shards.len() as u64) >> 24) as usize]
    }

    /// Locks the shard of `key`; returns its cell and the key's lookup.
    fn shard<'k>(&self, key: &'k str) -> (&ShardCell, MutexGuard<'_, Shard>, Lookup<'k>) {
        let at = Lookup::new(&self.inner.hasher, key);
        let cell = self.cell(at.hash);
        (cell, lock::lock(&cell.shard), at)
    }

    /// The index of the entry of `at`, inserted (within the key cap) if missing.
    fn entry_mut(
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
    fn entry_at(
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
    fn sweep(&self, cell: &ShardCell, shard: &mut Shard, now: Now, n: usize) {
        let dropped = shard.sweep(&self.inner.hasher, cell, now, n);
        self.dropped(dropped);
    }

    /// Counts `n` keys dropped.
    fn dropped(&self, n: usize) {
        if n > 0 {
            self.inner.keys.fetch_sub(n, Ordering::Relaxed);
            keys_gauge(-(n as f64));
        }
    }

    /// Reserves room for one more key, dropping the shard's expired keys first when at the cap.
    fn reserve_key(
        &self,
        cell: &ShardCell,
        shard: &mut Shard,
        now: Now,
    ) -> Result<(), BackendError> {
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

/// How a check's answer is handed back: the result itself, or the future a [`Backend`]
/// method returns. Built where the decision is made, so the decision is never copied whole
/// on its way out (a copy of a value just written field by field stalls the CPU: the
/// copy's wide loads cannot be served from the narrow stores still in flight).
pub(crate) trait Answer {
    fn answer(result: CheckResult) -> Self;
}

impl Answer for CheckResult {
    #[inline(always)]
    fn answer(result: CheckResult) -> Self {
        result
    }
}

impl Answer for Ready<CheckResult> {
    #[inline(always)]
    fn answer(result: CheckResult) -> Self {
        ready(result)
    }
}

impl Answer for Checked<Ready<CheckResult>> {
    #[inline(always)]
    fn answer(result: CheckResult) -> Self {
        Checked::ready(result)
    }
}

/// A key about to be looked up: its hash (which also picks its shard) and its bytes as the
/// table compares them.
struct Lookup<'k> {
    hash: u64,
    probe: Probe<'k>,
}

impl<'k> Lookup<'k> {
    #[inline]
    fn new(hasher: &RandomState, key: &'k str) -> Self {
        Lookup {
            hash: hash_key(hasher, key.as_bytes()),
            probe: Probe::new(key.as_bytes()),
        }
    }
}

impl<C: Clock> MemoryBackend<C> {
    /// The backend's clock.
    pub fn clock(&self) -> &C {
        &self.inner.clock
    }

    /// The time of a check: `now_ms` when given (explicit), else the clock's.
    #[inline]
    fn now(&self, now_ms: Option<u64>) -> Now {
        match now_ms {
            Some(ms) => Now::explicit(ms),
            None => Now {
                ms: self.inner.clock.now_ms(),
                explicit: false,
            },
        }
    }
}

impl<C: Clock> Backend for MemoryBackend<C> {
    type Future = Ready<CheckResult>;

    #[inline]
    fn check_limits(
        &self,
        key: &str,
        limits: &Limits,
        cost: u64,
        now_ms: Option<u64>,
    ) -> Self::Future {
        self.check_inner(
            key,
            limits.defaults(),
            limits.tier_slice(),
            limits.unconfigured(),
            cost,
            self.now(now_ms),
        )
    }

    /// Checks `policies` without building a [`Limits`] (no allocation).
    #[inline]
    fn check(&self, key: &str, policies: &[Policy], cost: u64) -> Checked<Self::Future> {
        self.check_policies(key, policies, cost, self.now(None))
    }

    /// Checks `policies` without building a [`Limits`] (no allocation).
    fn check_at(
        &self,
        key: &str,
        policies: &[Policy],
        cost: u64,
        now_ms: u64,
    ) -> Checked<Self::Future> {
        self.check_policies(key, policies, cost, Now::explicit(now_ms))
    }

    /// Always `Ok`: the in-memory backend decides inside [`Backend::check_limits`].
    #[inline]
    fn ready_now(fut: Self::Future) -> Result<CheckResult, Self::Future> {
        Ok(fut.into_inner())
    }

    fn is_local(&self) -> bool {
        true
    }
}

/// Moves the `turnstile_memory_keys` gauge (feature `metrics`): several in-memory backends in
/// one process add up.
#[inline]
fn keys_gauge(_delta: f64) {
    #[cfg(feature = "metrics")]
    metrics::gauge!(crate::metric_names::MEMORY_KEYS).increment(_delta);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Quotas;
    use crate::test_util::now;

    use crate::clock::ManualClock;
    use std::time::Duration;

    fn p(s: &str) -> Policy {
        s.parse().unwrap()
    }

    #[test]
    fn idle_keys_are_dropped_incrementally() {
        let b = MemoryBackend::builder().shards(1).build();
        let pol = [p("fixed-window:limit=5,period=1s")];
        for i in 0..100 {
            b.check_at(&format!("k{i}"), &pol, 1, 0)
                .into_inner()
                .unwrap();
        }
        assert_eq!(b.len(), 100);
        // A day later, traffic on one key sweeps the idle ones a few at a time.
        for _ in 0..60 {
            b.check_at("hot", &pol, 0, 86_400_000).into_inner().unwrap();
        }
        assert!(b.len() <= 1, "{} keys left", b.len());
    }

    /// The room the shards' maps hold, in entries.
    fn capacity<C>(b: &MemoryBackend<C>) -> usize {
        b.inner
            .shards
            .iter()
            .map(|s| s.shard.lock().table.capacity())
            .sum()
    }

    #[test]
    fn one_off_clients_were_still_counted_after_they_expired() {
        // 1,000 clients come once; afterwards one client keeps coming. Its checks used to
        // sweep only its own shard, so the others stayed counted (and in memory) for good.
        let clock = ManualClock::new(0);
        let b = MemoryBackend::builder().clock(clock.clone()).build();
        let pol = [p("token-bucket:limit=10,period=60s")];
        for i in 0..1000 {
            assert!(b
                .check(&format!("10.0.{}.{}", i / 256, i % 256), &pol, 1)
                .into_inner()
                .unwrap()
                .allowed());
        }
        assert_eq!(b.len(), 1000);
        // Each key's reset_after is 6 s (one token of 10 per 60 s).
        clock.advance(Duration::from_millis(6_000));
        for _ in 0..2_000 {
            assert!(b.check("regular", &pol, 0).into_inner().unwrap().allowed());
        }
        assert_eq!(b.len(), 0, "{} one-off clients still counted", b.len());
        assert!(b.check("regular", &pol, 1).into_inner().unwrap().allowed());
        assert_eq!(b.len(), 1);
    }

    #[test]
    fn expired_keys_go_without_traffic_and_the_maps_give_memory_back() {
        let clock = ManualClock::new(1_000);
        let b = MemoryBackend::builder().clock(clock.clone()).build();
        let pol = [p("sliding-log:limit=5,period=60s")];
        let empty = capacity(&b);
        for i in 0..20_000 {
            b.check(&format!("k{i}"), &pol, 1).into_inner().unwrap();
        }
        let full = capacity(&b);
        assert!(full >= 20_000);
        // Not yet expired: the sweep keeps everything.
        clock.advance(Duration::from_millis(59_999));
        assert_eq!(b.sweep_expired(), 0);
        assert_eq!(b.len(), 20_000);
        clock.advance(Duration::from_millis(1));
        assert_eq!(b.sweep_expired(), 20_000);
        assert_eq!(b.len(), 0);
        assert!(
            capacity(&b) <= empty,
            "room for {} entries left of {full}",
            capacity(&b)
        );
    }

    #[test]
    fn keys_checked_at_explicit_times_are_never_swept_by_the_clock() {
        // A simulation's trace times are not the clock's: a trace from 1970 must not look
        // expired to the wall clock.
        let clock = ManualClock::new(1_700_000_000_000);
        let b = MemoryBackend::builder().clock(clock.clone()).build();
        let pol = [p("fixed-window:limit=1,period=1h")];
        for i in 0..100 {
            b.check_at(&format!("sim{i}"), &pol, 1, 5_000)
                .into_inner()
                .unwrap();
        }
        b.check("live", &pol, 1).into_inner().unwrap();
        clock.advance(Duration::from_secs(3600));
        // The clock's sweep and the clock's checks drop the live key only.
        assert_eq!(b.sweep_expired(), 1);
        for _ in 0..2_000 {
            b.check("other", &pol, 0).into_inner().unwrap();
        }
        assert_eq!(b.len(), 100);
        // Still denied at trace time 6,000: the state is there.
        assert!(!b
            .check_at("sim7", &pol, 1, 6_000)
            .into_inner()
            .unwrap()
            .allowed());
        // Checks at explicit times sweep them once the trace passes their expiry.
        for _ in 0..2_000 {
            b.check_at("sim0", &pol, 0, 3_600_000).into_inner().unwrap();
        }
        assert_eq!(b.len(), 0);
    }

    #[test]
    fn key_cap_is_a_typed_error_and_never_evicts_live_state() {
        let clock = ManualClock::new(0);
        let b = MemoryBackend::builder()
            .clock(clock.clone())
            .max_keys(2)
            .build();
        let pol = [p("token-bucket:limit=1,period=1m")];
        assert!(b.check("a", &pol, 1).into_inner().unwrap().allowed());
        assert!(b.check("b", &pol, 1).into_inner().unwrap().allowed());
        assert!(matches!(
            b.check("c", &pol, 1).into_inner(),
            Err(BackendError::CapacityExceeded { max_keys: 2 })
        ));
        // Existing keys still decide, and stay denied: nothing was evicted.
        assert!(!b.check("a", &pol, 1).into_inner().unwrap().allowed());
        // Queries and denials on a new key need no room.
        assert!(b.check("c", &pol, 0).into_inner().unwrap().allowed());
        // Once the old keys expire, there is room again. (Which expired keys are dropped on
        // the way depends on the shards the keys hash to: at least one, at most both.)
        clock.advance(Duration::from_secs(60));
        assert!(b.check("c", &pol, 1).into_inner().unwrap().allowed());
        assert!(b.len() <= 2);
        b.purge_expired(clock.now_ms());
        assert_eq!(b.len(), 1);
    }

    #[test]
    fn a_new_key_keeps_its_policy_when_the_cap_sweeps_its_shard_empty() {
        // At the cap, a new key's check sweeps its whole shard first. When that leaves the
        // shard empty, the shard drops the policies nothing refers to: never the new key's.
        for q in [
            "token-bucket:limit=1,period=1h",
            "fixed-window:limit=1,period=1h",
        ] {
            let b = MemoryBackend::builder().shards(1).max_keys(4).build();
            let short = [p("gcra:limit=10,period=1s")];
            for k in ["a1", "a2", "a3"] {
                assert!(b.check_at(k, &short, 1, 0).into_inner().unwrap().allowed());
            }
            // Keys of other threads, in other shards, fill the cap meanwhile (counted only).
            b.inner.keys.fetch_add(3, Ordering::Relaxed);
            // The check's own sweep drops two expired keys, the cap's sweep the third.
            let q = [p(q)];
            assert!(b
                .check_at("b", &q, 1, 10_000)
                .into_inner()
                .unwrap()
                .allowed());
            assert_eq!(b.len(), 4);
            let again = b.check_at("b", &q, 1, 10_000).into_inner().unwrap();
            assert!(!again.allowed(), "{q:?}: the key's state was lost");
        }
    }

    #[test]
    fn changed_policy_parameters_carry_over_the_units_in_use() {
        let b = MemoryBackend::new();
        let small = p("token-bucket:limit=1,period=1m,name=x");
        let big = p("token-bucket:limit=5,period=1m,name=x");
        assert!(b
            .check_at("k", std::slice::from_ref(&small), 1, 0)
            .into_inner()
            .unwrap()
            .allowed());
        assert!(!b
            .check_at("k", &[small], 1, 0)
            .into_inner()
            .unwrap()
            .allowed());
        // One unit in use carries over to the bigger bucket: 5 − 1 − 1 left.
        assert_eq!(
            b.check_at("k", &[big], 1, 0)
                .into_inner()
                .unwrap()
                .remaining(),
            3
        );
    }

    #[test]
    fn overrides_tiers_and_unconfigured_keys() {
        let b = MemoryBackend::new();
        let limits = Limits::new([p("fixed-window:limit=2,period=1h,name=api")])
            .unwrap()
            .with_tier("pro", [p("fixed-window:limit=5,period=1h,name=api")])
            .unwrap();
        let d = b
            .check_limits("free", &limits, 1, Some(0))
            .into_inner()
            .unwrap();
        assert_eq!((d.applied(), d.remaining()), (&Applied::Defaults, 1));

        let v1 = now(b.set_tier("paying", Some("pro"))).unwrap().version();
        let d = b
            .check_limits("paying", &limits, 1, Some(0))
            .into_inner()
            .unwrap();
        assert_eq!(d.applied(), &Applied::Tier(Arc::from("pro")));
        assert_eq!((d.remaining(), d.version()), (4, v1));

        // An override beats the tier; the count of "api" carries over (same window, 1 used).
        let v2 = now(b.set_override("paying", &[p("fixed-window:limit=3,period=1h,name=api")]))
            .unwrap()
            .version();
        assert!(v2 > v1);
        let d = b
            .check_limits("paying", &limits, 1, Some(0))
            .into_inner()
            .unwrap();
        assert_eq!((d.applied(), d.remaining()), (&Applied::Override, 1));
        assert_eq!(now(b.config("paying")).unwrap().tier(), Some("pro"));
        now(b.remove_override("paying")).unwrap();
        assert_eq!(
            b.check_limits("paying", &limits, 0, Some(0))
                .into_inner()
                .unwrap()
                .applied(),
            &Applied::Tier(Arc::from("pro"))
        );

        // An unknown tier is no configuration.
        now(b.set_tier("odd", Some("gold"))).unwrap().version();
        let deny = limits.clone().when_unconfigured(Unconfigured::Deny);
        let d = b
            .check_limits("odd", &deny, 1, Some(0))
            .into_inner()
            .unwrap();
        assert!(!d.allowed());
        assert_eq!((d.applied(), d.retry_after()), (&Applied::Denied, None));
        let allow = limits.when_unconfigured(Unconfigured::Allow);
        let d = b
            .check_limits("odd", &allow, 1_000_000, Some(0))
            .into_inner()
            .unwrap();
        assert!(d.allowed());
        assert_eq!(d.applied(), &Applied::Unlimited);
        // Configured keys never expire; unconfigured ones do.
        assert_eq!(b.purge_expired(u64::MAX - 1), 1, "only `free` goes");
        assert_eq!(b.len(), 2);
    }

    #[test]
    fn refund_and_reset_give_quota_back_and_bump_the_version() {
        let b = MemoryBackend::new();
        let limits = Limits::new([
            p("token-bucket:limit=4,period=4s,name=tb"),
            p("sliding-log:limit=4,period=4s,name=log"),
        ])
        .unwrap();
        for _ in 0..4 {
            assert!(b
                .check_limits("k", &limits, 1, Some(0))
                .into_inner()
                .unwrap()
                .allowed());
        }
        assert!(!b
            .check_limits("k", &limits, 1, Some(0))
            .into_inner()
            .unwrap()
            .allowed());
        let d = now(b.refund("k", &limits, 2, Some(0))).unwrap();
        assert_eq!((d.remaining(), d.version()), (2, 1));
        // Never beyond a fresh key's capacity.
        let d = now(b.refund("k", &limits, 100, Some(0))).unwrap();
        assert_eq!(d.remaining(), 4);
        b.check_limits("k", &limits, 3, Some(0))
            .into_inner()
            .unwrap();
        let d = now(b.reset("k", &limits, Some(0))).unwrap();
        assert_eq!((d.remaining(), d.version()), (4, 3));
        // A version alone is kept a day, then the key is forgotten.
        assert_eq!(b.purge_expired(86_400_000 - 1), 0);
        assert_eq!(b.purge_expired(86_400_000), 1);
    }

    #[test]
    fn many_threads_on_one_key_never_overshoot() {
        for alg in crate::Algorithm::ALL {
            let b = MemoryBackend::new();
            let pol = [Policy::new(alg, 100, Duration::from_secs(3600)).unwrap()];
            let admitted = AtomicUsize::new(0);
            std::thread::scope(|s| {
                for _ in 0..8 {
                    s.spawn(|| {
                        for _ in 0..50 {
                            if b.check_at("k", &pol, 1, 1_000)
                                .into_inner()
                                .unwrap()
                                .allowed()
                            {
                                admitted.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    });
                }
            });
            assert_eq!(admitted.load(Ordering::Relaxed), 100, "{alg}");
        }
    }

    /// Every shard's expiry bounds are at most the expiry of each of its entries, on the
    /// entry's time base: the sweep never skips a shard holding an expired key.
    fn assert_bounds_hold<C>(b: &MemoryBackend<C>) {
        for cell in b.inner.shards.iter() {
            let shard = cell.shard.lock();
            for e in shard.table.entries() {
                let base = usize::from(e.head.explicit());
                let expires_ms = e.head.expires_ms(&shard.policies);
                assert_eq!(expires_ms, e.head.expires_ms_general(&shard.policies));
                assert!(shard.bound[base] <= expires_ms, "{base}: {expires_ms}");
                assert!(cell.bound[base].load(Ordering::Relaxed) <= expires_ms);
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn expiry_bounds_stay_below_every_entry(
            steps in proptest::collection::vec(
                (0u8..6, 0u64..3_000, 0u64..4, proptest::bool::ANY, 0usize..4),
                1..150,
            ),
        ) {
            let pols = [
                p("token-bucket:limit=3,period=1s"),
                p("gcra:limit=5,period=2s,burst=2"),
                p("leaky-bucket:limit=2,period=500ms"),
                p("fixed-window:limit=4,period=1s"),
            ];
            let clock = ManualClock::new(1_000_000);
            let b = MemoryBackend::builder().clock(clock.clone()).shards(2).build();
            let mut t = 1_000_000u64;
            for (key, dt, cost, explicit, pol) in steps {
                // Mostly forward, sometimes back (a clock that steps back).
                t = if dt % 5 == 0 { t - dt } else { t + dt };
                clock.set_ms(t);
                let key = format!("k{key}");
                let one = std::slice::from_ref(&pols[pol]);
                let d = if explicit {
                    b.check_at(&key, one, cost, t).into_inner()
                } else {
                    b.check(&key, one, cost).into_inner()
                };
                proptest::prop_assert!(d.is_ok());
                assert_bounds_hold(&b);
            }
        }
    }

    #[test]
    fn empty_policy_list_is_an_error() {
        assert!(matches!(
            MemoryBackend::new().check_at("k", &[], 1, 0).into_inner(),
            Err(BackendError::InvalidRequest(_))
        ));
    }

    #[test]
    fn duplicate_policy_names_are_an_error() {
        // Sharing one state slot, they would overwrite each other's state on every check.
        let b = MemoryBackend::new();
        let pol = [
            p("gcra:limit=2,period=1s,name=x"),
            p("fixed-window:limit=5,period=1s,name=x"),
        ];
        for _ in 0..3 {
            assert!(matches!(
                b.check_at("k", &pol, 1, 0).into_inner(),
                Err(BackendError::InvalidRequest(_))
            ));
        }
        assert!(b.is_empty());
    }

    #[test]
    fn look_alike_keys_each_have_a_quota_of_their_own() {
        // Keys of 0 to 26 bytes in one shard: runs of one character, with the first or last
        // changed, one longer, and non-ASCII ones (é is 2 bytes, 日 3, 🦀 4).
        let mut keys: Vec<String> = Vec::new();
        for n in 0..=26 {
            for unit in ["a", "é", "日", "🦀", "ab"] {
                let run: String = unit.chars().cycle().take(n).collect();
                keys.push(run.clone());
                keys.push(format!("{run}b"));
                keys.push(format!("b{run}"));
                keys.push(format!("{run}\u{0}"));
                if let Some(last) = run.chars().last() {
                    let mut changed = run.clone();
                    changed.pop();
                    changed.push(if last == 'z' { 'y' } else { 'z' });
                    keys.push(changed);
                }
            }
        }
        keys.sort();
        keys.dedup();
        let b = MemoryBackend::builder().shards(1).build();
        let pol = [p("fixed-window:limit=1,period=1h")];
        for k in &keys {
            let d = b.check_at(k, &pol, 1, 0).into_inner().unwrap();
            assert!(d.allowed(), "{k:?}");
        }
        for k in &keys {
            let d = b.check_at(k, &pol, 1, 0).into_inner().unwrap();
            assert!(!d.allowed(), "{k:?}");
        }
        assert_eq!(b.len(), keys.len());
    }
}
