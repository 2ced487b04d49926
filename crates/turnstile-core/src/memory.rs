//! The in-memory backend: state for one process, shared by every clone.

use std::fmt;
use std::future::{ready, Ready};
use std::hash::BuildHasher;

use foldhash::fast::RandomState;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use indexmap::IndexMap;

use crate::algorithm::{carry_over, evaluate, evaluate_few, refund, Evaluation, State};
use crate::backend::{Backend, BackendError};
use crate::clock::{Clock, SystemClock};
use crate::decision::{Decision, PolicyDecision};
use crate::few::Few;
use crate::policy::Policy;
use crate::quota::{
    resolve_which, validate_policy_set, validate_tier_name, Applied, KeyConfig, Limits, Tier,
    Unconfigured, Which,
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
/// two other entries of its shard, round-robin, and drops those that have expired, so idle
/// keys are reclaimed without a background task and without scanning everything on the hot
/// path. A key with one bucket or window policy costs about 230 heap bytes with a 12-byte key
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
/// use turnstile_core::{ManualClock, MemoryBackend, Policy};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let clock = ManualClock::new(0);
/// let backend = MemoryBackend::builder().clock(clock.clone()).build();
/// let per_second = Policy::token_bucket(2, Duration::from_secs(1))?;
///
/// assert!(backend.decide("alice", &[per_second.clone()], 1)?.allowed());
/// assert!(backend.decide("alice", &[per_second.clone()], 1)?.allowed());
/// let denied = backend.decide("alice", &[per_second.clone()], 1)?;
/// assert_eq!(denied.retry_after(), Some(Duration::from_millis(500)));
///
/// clock.advance(Duration::from_millis(500));
/// assert!(backend.decide("alice", &[per_second], 1)?.allowed());
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

    /// Whether no key is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every key whose state has expired at `now_ms`, scanning every shard. Checks do
    /// this incrementally on their own; call this only to reclaim memory at once (tests,
    /// maintenance). Returns how many keys were dropped.
    pub fn purge_expired(&self, now_ms: u64) -> usize {
        let mut dropped = 0;
        for shard in self.inner.shards.iter() {
            let mut shard = lock(shard);
            let before = shard.map.len();
            shard.map.retain(|_, e| e.expires_ms > now_ms);
            dropped += before - shard.map.len();
        }
        self.inner.keys.fetch_sub(dropped, Ordering::Relaxed);
        keys_gauge(-(dropped as f64));
        dropped
    }

    /// Checks `key` against `policies` at time `now_ms`, synchronously. This is what
    /// [`Backend::check_at`] runs. `policies` are the defaults: a key with an override or a
    /// tier of its own is checked against those instead (see [`MemoryBackend::decide_limits_at`]).
    ///
    /// # Errors
    /// [`BackendError::InvalidRequest`] when `policies` is empty or two of them share a name
    /// (they would share one state; the Redis backend refuses them alike);
    /// [`BackendError::CapacityExceeded`] when admitting would track a key beyond the cap.
    /// An error changes no state.
    pub fn decide_at(
        &self,
        key: &str,
        policies: &[Policy],
        cost: u64,
        now_ms: u64,
    ) -> Result<Decision, BackendError> {
        validate_policy_set(policies).map_err(|e| BackendError::InvalidRequest(e.to_string()))?;
        self.decide_inner(
            key,
            policies,
            &Limits::NO_TIERS,
            Unconfigured::Defaults,
            cost,
            now_ms,
        )
    }

    /// Checks `key` at `now_ms` against the policies `limits` resolves for it: its override,
    /// else its tier's, else the [`Unconfigured`] behaviour. The decision's
    /// [`Decision::applied`] says which.
    ///
    /// # Errors
    /// As [`MemoryBackend::decide_at`].
    pub fn decide_limits_at(
        &self,
        key: &str,
        limits: &Limits,
        cost: u64,
        now_ms: u64,
    ) -> Result<Decision, BackendError> {
        self.decide_inner(
            key,
            limits.defaults(),
            limits.tier_slice(),
            limits.unconfigured(),
            cost,
            now_ms,
        )
    }

    fn decide_inner(
        &self,
        key: &str,
        defaults: &[Policy],
        tiers: &[Tier],
        unconfigured: Unconfigured,
        cost: u64,
        now_ms: u64,
    ) -> Result<Decision, BackendError> {
        let mut shard = self.shard(key);
        self.sweep(&mut shard, now_ms, SWEEP_PER_CHECK);

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

        let entry = self.entry_at(&mut shard, index, key, now_ms)?;
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
        now_ms: u64,
    ) -> Result<&'s mut Entry, BackendError> {
        let index = shard.map.get_index_of(key);
        self.entry_at(shard, index, key, now_ms)
    }

    /// The entry at `index` (as `get_index_of` found it), or a new one for `key` (within the
    /// key cap): one hash of the key per check.
    fn entry_at<'s>(
        &self,
        shard: &'s mut Shard,
        index: Option<usize>,
        key: &str,
        now_ms: u64,
    ) -> Result<&'s mut Entry, BackendError> {
        let index = match index {
            Some(i) => i,
            None => {
                self.reserve_key(shard, now_ms)?;
                // The sweep in `reserve_key` may move entries, but `key` is not among them.
                let entry = Entry {
                    expires_ms: 0,
                    slots: Vec::new(),
                    config: None,
                    version_until_ms: 0,
                };
                shard.map.insert_full(Box::from(key), entry).0
            }
        };
        Ok(&mut shard.map[index])
    }

    /// Gives `cost` units back to `key` under every policy `limits` resolves for it, at
    /// `now_ms` (see [`algorithm::refund`](crate::algorithm::refund) for what that means per
    /// algorithm), bumps its version, and returns the key's state afterwards as a query
    /// would. Refunding a key with no state changes nothing but the version.
    ///
    /// # Errors
    /// [`BackendError::CapacityExceeded`] only if the key is new and the backend is full.
    pub fn refund_at(
        &self,
        key: &str,
        limits: &Limits,
        cost: u64,
        now_ms: u64,
    ) -> Result<Decision, BackendError> {
        {
            let mut shard = self.shard(key);
            let config = shard.map.get(key).and_then(|e| e.config.as_deref());
            let (policies, _) = limits.resolve(config);
            let policies: Vec<Policy> = policies.map(<[Policy]>::to_vec).unwrap_or_default();
            let entry = self.entry_mut(&mut shard, key, now_ms)?;
            for p in &policies {
                let Some(i) = entry.slots.iter().position(|s| s.policy.name() == p.name()) else {
                    continue;
                };
                let slot = &mut entry.slots[i];
                if slot.stale_for(p) {
                    slot.state = carry_over(&slot.policy, p, &slot.state, now_ms);
                    slot.policy = p.clone();
                }
                refund(p, &mut slot.state, now_ms, cost);
                slot.expires_ms = evaluate(p, &slot.state, now_ms, 0).expires_at_ms();
            }
            entry.bump_version(now_ms);
            entry.settle(now_ms);
        }
        self.decide_limits_at(key, limits, 0, now_ms)
    }

    /// Forgets the state of every policy that applies to `key` (it is fresh again), keeping
    /// its configuration, bumps its version, and returns its state afterwards as a query
    /// at `now_ms` would. Identical to the Redis backend's `reset`.
    ///
    /// # Errors
    /// [`BackendError::CapacityExceeded`] only if the key is new and the backend is full.
    pub fn reset_at(
        &self,
        key: &str,
        limits: &Limits,
        now_ms: u64,
    ) -> Result<Decision, BackendError> {
        {
            let mut shard = self.shard(key);
            let config = shard.map.get(key).and_then(|e| e.config.as_deref());
            let (policies, _) = limits.resolve(config);
            let names: Vec<Arc<str>> = policies
                .unwrap_or_default()
                .iter()
                .map(|p| Arc::clone(p.name_arc()))
                .collect();
            let entry = self.entry_mut(&mut shard, key, now_ms)?;
            entry
                .slots
                .retain(|s| !names.iter().any(|n| **n == *s.policy.name()));
            entry.bump_version(now_ms);
            entry.settle(now_ms);
        }
        self.decide_limits_at(key, limits, 0, now_ms)
    }

    /// The stored configuration of `key` (empty when it has none).
    pub fn config(&self, key: &str) -> KeyConfig {
        let shard = self.shard(key);
        shard
            .map
            .get(key)
            .and_then(|e| e.config.as_deref().cloned())
            .unwrap_or_default()
    }

    /// Stores `policies` as `key`'s override: from the next check on they replace the
    /// defaults and the key's tier. State of a policy of the same name carries over (see
    /// [`algorithm::carry_over`](crate::algorithm::carry_over)). Returns the new version.
    ///
    /// # Errors
    /// [`BackendError::InvalidRequest`] for an empty set or two policies of one name;
    /// [`BackendError::CapacityExceeded`] if the key is new and the backend is full.
    pub fn set_override(&self, key: &str, policies: Vec<Policy>) -> Result<u64, BackendError>
    where
        C: Clock,
    {
        validate_policy_set(&policies).map_err(|e| BackendError::InvalidRequest(e.to_string()))?;
        self.configure(key, |c| c.policies = Some(Arc::from(policies)))
    }

    /// Removes `key`'s override (its tier, if any, applies again). Returns the new version.
    ///
    /// # Errors
    /// [`BackendError::CapacityExceeded`] if the key is new and the backend is full.
    pub fn remove_override(&self, key: &str) -> Result<u64, BackendError>
    where
        C: Clock,
    {
        self.configure(key, |c| c.policies = None)
    }

    /// Removes `key`'s whole configuration, its override and its tier, in one change (one
    /// version). Returns the new version.
    ///
    /// # Errors
    /// [`BackendError::CapacityExceeded`] if the key is new and the backend is full.
    pub fn clear_config(&self, key: &str) -> Result<u64, BackendError>
    where
        C: Clock,
    {
        self.configure(key, |c| {
            c.policies = None;
            c.tier = None;
        })
    }

    /// Maps `key` to the tier `tier` (`None`: no tier). Returns the new version.
    ///
    /// # Errors
    /// [`BackendError::InvalidRequest`] for an invalid tier name;
    /// [`BackendError::CapacityExceeded`] if the key is new and the backend is full.
    pub fn set_tier(&self, key: &str, tier: Option<&str>) -> Result<u64, BackendError>
    where
        C: Clock,
    {
        if let Some(t) = tier {
            validate_tier_name(t).map_err(|e| BackendError::InvalidRequest(e.to_string()))?;
        }
        self.configure(key, |c| c.tier = tier.map(Arc::from))
    }

    fn configure(&self, key: &str, change: impl FnOnce(&mut KeyConfig)) -> Result<u64, BackendError>
    where
        C: Clock,
    {
        let now = self.inner.clock.now_ms();
        let mut shard = self.shard(key);
        let entry = self.entry_mut(&mut shard, key, now)?;
        change(entry.config.get_or_insert_with(Box::default));
        let version = entry.bump_version(now);
        // No slot is dropped here: states may be timed on another clock (explicit times).
        entry.settle(0);
        Ok(version)
    }

    /// Looks at up to `n` entries of `shard` for expiry, dropping expired ones.
    fn sweep(&self, shard: &mut Shard, now_ms: u64, n: usize) {
        let dropped = shard.sweep(now_ms, n);
        if dropped > 0 {
            self.inner.keys.fetch_sub(dropped, Ordering::Relaxed);
            keys_gauge(-(dropped as f64));
        }
    }

    /// Reserves room for one more key, dropping the shard's expired keys first when at the cap.
    fn reserve_key(&self, shard: &mut Shard, now_ms: u64) -> Result<(), BackendError> {
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
        self.sweep(shard, now_ms, len);
        for other in self.inner.shards.iter() {
            if let Ok(mut other) = other.try_lock() {
                self.sweep(&mut other, now_ms, SWEEP_AT_CAP);
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
    /// Checks `key` against `policies` at the backend clock's current time, synchronously.
    ///
    /// # Errors
    /// As [`MemoryBackend::decide_at`].
    pub fn decide(
        &self,
        key: &str,
        policies: &[Policy],
        cost: u64,
    ) -> Result<Decision, BackendError> {
        self.decide_at(key, policies, cost, self.inner.clock.now_ms())
    }

    /// The backend's clock.
    pub fn clock(&self) -> &C {
        &self.inner.clock
    }
}

impl<C: Clock> Backend for MemoryBackend<C> {
    type Future = Ready<Result<Decision, BackendError>>;

    fn check(&self, key: &str, policies: &[Policy], cost: u64) -> Self::Future {
        ready(self.decide(key, policies, cost))
    }

    fn check_at(&self, key: &str, policies: &[Policy], cost: u64, now_ms: u64) -> Self::Future {
        ready(self.decide_at(key, policies, cost, now_ms))
    }

    fn check_limits(
        &self,
        key: &str,
        limits: &Limits,
        cost: u64,
        now_ms: Option<u64>,
    ) -> Self::Future {
        let now = now_ms.unwrap_or_else(|| self.inner.clock.now_ms());
        ready(self.decide_limits_at(key, limits, cost, now))
    }
}

impl Shard {
    /// Looks at up to `n` entries from the cursor on, dropping those expired at `now_ms`.
    /// Returns how many were dropped.
    fn sweep(&mut self, now_ms: u64, n: usize) -> usize {
        let mut dropped = 0;
        for _ in 0..n {
            let len = self.map.len();
            if len == 0 {
                break;
            }
            let i = self.cursor % len;
            if self.map[i].expires_ms <= now_ms {
                self.map.swap_remove_index(i);
                dropped += 1;
            } else {
                self.cursor = i + 1;
            }
        }
        dropped
    }
}

/// Moves the `turnstile_memory_keys` gauge (feature `metrics`): several in-memory backends in
/// one process add up.
#[inline]
fn keys_gauge(_delta: f64) {
    #[cfg(feature = "metrics")]
    metrics::gauge!("turnstile_memory_keys").increment(_delta);
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
            b.decide_at(&format!("k{i}"), &pol, 1, 0).unwrap();
        }
        assert_eq!(b.len(), 100);
        // A day later, traffic on one key sweeps the idle ones a few at a time.
        for _ in 0..60 {
            b.decide_at("hot", &pol, 0, 86_400_000).unwrap();
        }
        assert!(b.len() <= 1, "{} keys left", b.len());
    }

    #[test]
    fn key_cap_is_a_typed_error_and_never_evicts_live_state() {
        let clock = ManualClock::new(0);
        let b = MemoryBackend::builder()
            .clock(clock.clone())
            .max_keys(2)
            .build();
        let pol = [p("token-bucket:limit=1,period=1m")];
        assert!(b.decide("a", &pol, 1).unwrap().allowed());
        assert!(b.decide("b", &pol, 1).unwrap().allowed());
        assert!(matches!(
            b.decide("c", &pol, 1),
            Err(BackendError::CapacityExceeded { max_keys: 2 })
        ));
        // Existing keys still decide, and stay denied: nothing was evicted.
        assert!(!b.decide("a", &pol, 1).unwrap().allowed());
        // Queries and denials on a new key need no room.
        assert!(b.decide("c", &pol, 0).unwrap().allowed());
        // Once the old keys expire, there is room again. (Which expired keys are dropped on
        // the way depends on the shards the keys hash to: at least one, at most both.)
        clock.advance(Duration::from_secs(60));
        assert!(b.decide("c", &pol, 1).unwrap().allowed());
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
            .decide_at("k", std::slice::from_ref(&small), 1, 0)
            .unwrap()
            .allowed());
        assert!(!b.decide_at("k", &[small], 1, 0).unwrap().allowed());
        // One unit in use carries over to the bigger bucket: 5 − 1 − 1 left.
        assert_eq!(b.decide_at("k", &[big], 1, 0).unwrap().remaining(), 3);
    }

    #[test]
    fn overrides_tiers_and_unconfigured_keys() {
        let b = MemoryBackend::new();
        let limits = Limits::new([p("fixed-window:limit=2,period=1h,name=api")])
            .unwrap()
            .with_tier("pro", [p("fixed-window:limit=5,period=1h,name=api")])
            .unwrap();
        let d = b.decide_limits_at("free", &limits, 1, 0).unwrap();
        assert_eq!((d.applied(), d.remaining()), (&Applied::Defaults, 1));

        let v1 = b.set_tier("paying", Some("pro")).unwrap();
        let d = b.decide_limits_at("paying", &limits, 1, 0).unwrap();
        assert_eq!(d.applied(), &Applied::Tier(Arc::from("pro")));
        assert_eq!((d.remaining(), d.version()), (4, v1));

        // An override beats the tier; the count of "api" carries over (same window, 1 used).
        let v2 = b
            .set_override("paying", vec![p("fixed-window:limit=3,period=1h,name=api")])
            .unwrap();
        assert!(v2 > v1);
        let d = b.decide_limits_at("paying", &limits, 1, 0).unwrap();
        assert_eq!((d.applied(), d.remaining()), (&Applied::Override, 1));
        assert_eq!(b.config("paying").tier(), Some("pro"));
        b.remove_override("paying").unwrap();
        assert_eq!(
            b.decide_limits_at("paying", &limits, 0, 0)
                .unwrap()
                .applied(),
            &Applied::Tier(Arc::from("pro"))
        );

        // An unknown tier is no configuration.
        b.set_tier("odd", Some("gold")).unwrap();
        let deny = limits.clone().when_unconfigured(Unconfigured::Deny);
        let d = b.decide_limits_at("odd", &deny, 1, 0).unwrap();
        assert!(!d.allowed());
        assert_eq!((d.applied(), d.retry_after()), (&Applied::Denied, None));
        let allow = limits.when_unconfigured(Unconfigured::Allow);
        let d = b.decide_limits_at("odd", &allow, 1_000_000, 0).unwrap();
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
            assert!(b.decide_limits_at("k", &limits, 1, 0).unwrap().allowed());
        }
        assert!(!b.decide_limits_at("k", &limits, 1, 0).unwrap().allowed());
        let d = b.refund_at("k", &limits, 2, 0).unwrap();
        assert_eq!((d.remaining(), d.version()), (2, 1));
        // Never beyond a fresh key's capacity.
        let d = b.refund_at("k", &limits, 100, 0).unwrap();
        assert_eq!(d.remaining(), 4);
        b.decide_limits_at("k", &limits, 3, 0).unwrap();
        let d = b.reset_at("k", &limits, 0).unwrap();
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
                            if b.decide_at("k", &pol, 1, 1_000).unwrap().allowed() {
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
            MemoryBackend::new().decide_at("k", &[], 1, 0),
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
                b.decide_at("k", &pol, 1, 0),
                Err(BackendError::InvalidRequest(_))
            ));
        }
        assert!(b.is_empty());
    }
}
