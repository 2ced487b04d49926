//! The in-memory backend: state for one process, shared by every clone.

mod quotas;
mod sweep;

use sweep::Now;
#[cfg(feature = "tokio")]
pub use sweep::SpawnSweeperError;

use std::fmt;
use std::future::{ready, Ready};
use std::hash::BuildHasher;

use foldhash::fast::RandomState;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use indexmap::IndexMap;

use crate::algorithm::{carry_over, evaluate_few, Evaluation, State};
use crate::backend::{Backend, BackendError, CheckResult, Checked};
use crate::clock::{Clock, SystemClock};
use crate::decision::{Decision, PolicyDecision};
use crate::few::Few;
use crate::policy::Policy;
use crate::quota::{
    resolve_which, validate_policy_set, Applied, KeyConfig, Limits, Tier, Unconfigured, Which,
};

/// How long a key's version is kept when it has no other configuration: a day, as in Redis.
const VERSION_TTL_MS: u64 = 86_400_000;

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
/// A key's state is dropped once its `reset_after` has passed: every check also inspects
/// two other entries of its shard, and every fourth check of a thread eight entries of
/// another shard, round-robin over all shards, and drops those that have expired; so idle
/// keys are reclaimed while any traffic flows, without scanning everything on the hot path.
/// Where no traffic may come, [`MemoryBackend::spawn_sweeper`] (feature `tokio`) drops
/// them on a timer. A shard's map gives its memory back once it is mostly empty (at most a
/// quarter full, it shrinks to twice its keys). Keys checked at explicit times
/// ([`Backend::check_at`]: simulations) are only ever swept by checks at explicit times,
/// never by the clock.
///
/// A key with one bucket or window policy costs about 245 heap bytes with a 12-byte key
/// such as an IPv4 address, the map's spare capacity included (measured by the
/// `bytes_per_key` test: 20,000 keys); a sliding-log policy about 100 more for its log, then
/// 16 bytes per further distinct millisecond logged (at most min(limit, period in ms)
/// entries). With
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
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    clock: C,
    max_keys: Option<usize>,
    keys: AtomicUsize,
}

#[derive(Default)]
struct Shard {
    /// foldhash: fast on short keys, seeded per process (keys are client-controlled).
    map: IndexMap<Box<str>, Entry, RandomState>,
    cursor: usize,
}

struct Entry {
    /// Max of the slots' `expires_ms`; `u64::MAX` while the key has an override or a tier.
    expires_ms: u64,
    slots: Vec<Slot>,
    config: Option<Box<KeyConfig>>,
    /// Until when a version without other configuration is kept.
    version_until_ms: u64,
    /// Whether the key was last written at an explicit time (a simulation): then only checks
    /// at explicit times sweep it, never the clock.
    explicit: bool,
}

struct Slot {
    /// The policy the state was last written under (name and parameters).
    policy: Policy,
    expires_ms: u64,
    state: State,
}

impl Slot {
    /// Whether the state was written under other parameters than `p`'s (same name).
    fn stale_for(&self, p: &Policy) -> bool {
        self.policy.name() == p.name() && !self.policy.same_parameters(p)
    }
}

impl Entry {
    fn slot_mut(&mut self, p: &Policy) -> &mut Slot {
        let i = match self.slots.iter().position(|s| s.policy.name() == p.name()) {
            Some(i) => i,
            None => {
                // Exactly one more: a first push would otherwise reserve room for four.
                self.slots.reserve_exact(1);
                self.slots.push(Slot {
                    policy: p.clone(),
                    expires_ms: 0,
                    state: State::new(),
                });
                self.slots.len() - 1
            }
        };
        &mut self.slots[i]
    }

    /// Bumps the key's version; a version alone is kept a day from `now_ms`, as in Redis.
    fn bump_version(&mut self, now_ms: u64) -> u64 {
        let config = self.config.get_or_insert_with(Box::default);
        config.version = config.version.wrapping_add(1);
        self.version_until_ms = now_ms.saturating_add(VERSION_TTL_MS);
        config.version
    }

    /// Drops expired slots and recomputes when the whole entry expires.
    fn settle(&mut self, now_ms: u64) {
        self.slots.retain(|s| s.expires_ms > now_ms);
        let configured = self.config.as_deref().is_some_and(|c| !c.is_empty());
        self.expires_ms = if configured {
            u64::MAX
        } else {
            let state = self.slots.iter().map(|s| s.expires_ms).max().unwrap_or(0);
            state.max(self.version_until_ms)
        };
    }
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

    /// A builder, starting from the system clock, no key cap and 64 shards.
    pub fn builder() -> MemoryBackendBuilder<SystemClock> {
        MemoryBackendBuilder {
            clock: SystemClock,
            max_keys: None,
            shards: 64,
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

    /// Sets the number of independently locked shards (default 64; at least 1).
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = shards.max(1);
        self
    }

    /// Builds the backend.
    pub fn build(self) -> MemoryBackend<C> {
        MemoryBackend {
            inner: Arc::new(Inner {
                shards: (0..self.shards).map(|_| Mutex::default()).collect(),
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
    pub fn purge_expired(&self, now_ms: u64) -> usize {
        self.sweep_all(|e| e.expires_ms <= now_ms)
    }

    /// A check of `policies` (the defaults, no tiers) at `now`.
    fn check_policies(&self, key: &str, policies: &[Policy], cost: u64, now: Now) -> CheckResult {
        validate_policy_set(policies).map_err(|e| BackendError::InvalidRequest(e.to_string()))?;
        self.check_inner(
            key,
            policies,
            &Limits::NO_TIERS,
            Unconfigured::Defaults,
            cost,
            now,
        )
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn check_inner(
        &self,
        key: &str,
        defaults: &[Policy],
        tiers: &[Tier],
        unconfigured: Unconfigured,
        cost: u64,
        now: Now,
    ) -> Result<Decision, BackendError> {
        self.sweep_elsewhere(now);
        let now_ms = now.ms;
        let mut shard = self.shard(key);
        self.sweep(&mut shard, now, SWEEP_PER_CHECK);

        let index = shard.map.get_index_of(key);
        let entry = index.map(|i| &shard.map[i]);
        let config = entry.and_then(|e| e.config.as_deref());
        let version = config.map_or(0, KeyConfig::version);
        let (which, applied) = resolve_which(config, tiers, unconfigured);
        // An override lives in the entry written below: hold it by its own `Arc`.
        let own: Option<Arc<[Policy]>> = match which {
            Which::Override => config.and_then(|c| c.policies.clone()),
            _ => None,
        };
        let policies: &[Policy] = match (&own, which) {
            (Some(o), _) => o,
            (None, Which::Tier(i)) => &tiers[i].1,
            (None, Which::Defaults) => defaults,
            _ => {
                return Ok(match applied {
                    Applied::Unlimited => Decision::unlimited(version),
                    _ => Decision::unconfigured_denied(version),
                })
            }
        };
        // Each policy's slot in the entry, looked up once.
        let slot_of: Few<Option<usize>> = policies
            .iter()
            .map(|p| entry.and_then(|e| e.slots.iter().position(|s| s.policy.name() == p.name())))
            .collect();
        let slot = |i: usize| -> Option<&Slot> {
            let j = (*slot_of.as_slice().get(i)?)?;
            entry.map(|e| &e.slots[j])
        };
        // A policy whose parameters changed since its state was written is evaluated on the
        // carried-over state (stored only if this request is admitted).
        let stale = |i: usize| slot(i).filter(|s| !s.policy.same_parameters(&policies[i]));
        let carried: Vec<Option<State>> = if (0..policies.len()).any(|i| stale(i).is_some()) {
            (0..policies.len())
                .map(|i| stale(i).map(|s| carry_over(&s.policy, &policies[i], &s.state, now_ms)))
                .collect()
        } else {
            Vec::new()
        };
        let fresh = State::new();
        let state_of = |i: usize| -> &State {
            match carried.get(i) {
                Some(Some(c)) => c,
                _ => slot(i).map_or(&fresh, |s| &s.state),
            }
        };
        let evals = evaluate_few(policies, state_of, now_ms, cost);
        let admitted = evals.as_slice().iter().all(|e| e.decision().allowed());
        if !admitted || !evals.as_slice().iter().any(Evaluation::changes_state) {
            return Ok(Decision::from_few_with(
                evals.into_iter().map(Evaluation::into_decision).collect(),
                applied,
                version,
            ));
        }

        let entry = self.entry_at(&mut shard, index, key, now)?;
        entry.explicit = now.explicit;
        let mut carried = carried.into_iter();
        let decisions: Few<PolicyDecision> = policies
            .iter()
            .zip(evals)
            .zip(slot_of)
            .map(|((p, eval), at)| {
                let expires_ms = eval.expires_at_ms();
                let changes = eval.changes_state();
                let carried = carried.next().flatten();
                // Slots found above keep their places: new ones are only appended.
                let slot = match at {
                    Some(j) => &mut entry.slots[j],
                    None => entry.slot_mut(p),
                };
                if let Some(c) = carried {
                    slot.state = c;
                    slot.policy = p.clone();
                }
                if changes {
                    slot.expires_ms = expires_ms;
                }
                eval.apply(&mut slot.state)
            })
            .collect();
        entry.settle(now_ms);
        Ok(Decision::from_few_with(decisions, applied, version))
    }

    /// Locks the shard of `key`.
    fn shard(&self, key: &str) -> MutexGuard<'_, Shard> {
        let inner = &*self.inner;
        let hash = inner.hasher.hash_one(key);
        lock(&inner.shards[(hash as usize) % inner.shards.len()])
    }

    /// The entry of `key`, inserted (within the key cap) if missing.
    fn entry_mut<'s>(
        &self,
        shard: &'s mut Shard,
        key: &str,
        now: Now,
    ) -> Result<&'s mut Entry, BackendError> {
        let index = shard.map.get_index_of(key);
        self.entry_at(shard, index, key, now)
    }

    /// The entry at `index` (as `get_index_of` found it), or a new one for `key` (within the
    /// key cap): one hash of the key per check.
    fn entry_at<'s>(
        &self,
        shard: &'s mut Shard,
        index: Option<usize>,
        key: &str,
        now: Now,
    ) -> Result<&'s mut Entry, BackendError> {
        let index = match index {
            Some(i) => i,
            None => {
                self.reserve_key(shard, now)?;
                // The sweep in `reserve_key` may move entries, but `key` is not among them.
                let entry = Entry {
                    expires_ms: 0,
                    slots: Vec::new(),
                    config: None,
                    version_until_ms: 0,
                    explicit: now.explicit,
                };
                shard.map.insert_full(Box::from(key), entry).0
            }
        };
        Ok(&mut shard.map[index])
    }

    /// Looks at up to `n` entries of `shard` for expiry, dropping expired ones.
    fn sweep(&self, shard: &mut Shard, now: Now, n: usize) {
        let dropped = shard.sweep(now, n);
        if dropped > 0 {
            self.inner.keys.fetch_sub(dropped, Ordering::Relaxed);
            keys_gauge(-(dropped as f64));
        }
    }

    /// Reserves room for one more key, dropping the shard's expired keys first when at the cap.
    fn reserve_key(&self, shard: &mut Shard, now: Now) -> Result<(), BackendError> {
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
        let len = shard.map.len();
        self.sweep(shard, now, len);
        for other in self.inner.shards.iter() {
            if let Ok(mut other) = other.try_lock() {
                self.sweep(&mut other, now, SWEEP_AT_CAP);
            }
        }
        if reserve() {
            return Ok(());
        }
        keys_gauge(-1.0);
        Err(BackendError::CapacityExceeded { max_keys: max })
    }
}

impl<C: Clock> MemoryBackend<C> {
    /// The backend's clock.
    pub fn clock(&self) -> &C {
        &self.inner.clock
    }

    /// The time of a check: `now_ms` when given (explicit), else the clock's.
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

    fn check_limits(
        &self,
        key: &str,
        limits: &Limits,
        cost: u64,
        now_ms: Option<u64>,
    ) -> Self::Future {
        ready(self.check_inner(
            key,
            limits.defaults(),
            limits.tier_slice(),
            limits.unconfigured(),
            cost,
            self.now(now_ms),
        ))
    }

    /// Checks `policies` without building a [`Limits`] (no allocation).
    fn check(&self, key: &str, policies: &[Policy], cost: u64) -> Checked<Self::Future> {
        Checked::ready(self.check_policies(key, policies, cost, self.now(None)))
    }

    /// Checks `policies` without building a [`Limits`] (no allocation).
    fn check_at(
        &self,
        key: &str,
        policies: &[Policy],
        cost: u64,
        now_ms: u64,
    ) -> Checked<Self::Future> {
        Checked::ready(self.check_policies(key, policies, cost, Now::explicit(now_ms)))
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

/// Locks a shard. A poisoned lock (a panic elsewhere while it was held) is taken over: every
/// state transition here completes before any state is written, so the map is consistent.
fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    shard
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
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
        b.inner.shards.iter().map(|s| lock(s).map.capacity()).sum()
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
}
