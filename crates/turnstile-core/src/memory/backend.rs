//! [`MemoryBackend`]: the handle every clone shares, its accessors and its [`Backend`] impl.

use std::fmt;
use std::future::{ready, Ready};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use foldhash::fast::RandomState;

use super::shard::ShardCell;
use super::sweep::{AutoSweep, Now};
use crate::backend::{Backend, CheckResult, Checked};
use crate::clock::{Clock, SystemClock};
use crate::policy::Policy;
use crate::quota::Limits;

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
/// Where no traffic may come, [`MemoryBackendBuilder::sweep_every`] or
/// [`MemoryBackend::spawn_sweeper`] (feature `tokio`) drops them on a timer. A shard's map gives its memory back once it is mostly empty (at most a
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
/// [`MemoryBackendBuilder::max_keys`](crate::MemoryBackendBuilder::max_keys), a check that would track one key more than the cap
/// fails with [`BackendError::CapacityExceeded`](crate::BackendError::CapacityExceeded) (after first dropping the expired keys of
/// its shard, and up to 8 of each other shard) instead of evicting live state, which would over-admit.
/// A key longer than [`MemoryBackendBuilder::max_key_bytes`](crate::MemoryBackendBuilder::max_key_bytes) (512 bytes by default) is refused
/// with [`BackendError::KeyTooLong`](crate::BackendError::KeyTooLong), so the state held is at
/// most `max_keys` × (`max_key_bytes` + the entry's bytes above).
///
/// Freed state goes back to the process's allocator, which may keep the pages resident (glibc's
/// `malloc` keeps free pages between live blocks until `malloc_trim`); the tower crate's
/// "Keys, rules and actions" guide says how each common allocator gives them back.
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
    doc = "[`MemoryBackend::spawn_sweeper`]: crate#features",
    doc = "[`MemoryBackendBuilder::sweep_every`]: crate#features"
)]
#[cfg_attr(
    feature = "tokio",
    doc = "",
    doc = "[`MemoryBackendBuilder::sweep_every`]: crate::MemoryBackendBuilder::sweep_every"
)]
pub struct MemoryBackend<C = SystemClock> {
    pub(super) inner: Arc<Inner<C>>,
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

/// What every clone of a [`MemoryBackend`] shares.
pub(super) struct Inner<C> {
    pub(super) shards: Box<[ShardCell]>,
    /// foldhash: fast on short keys, seeded per backend (keys are client-controlled).
    pub(super) hasher: RandomState,
    pub(super) clock: C,
    pub(super) max_keys: Option<usize>,
    /// The longest key taken, in bytes.
    pub(super) max_key_bytes: usize,
    /// Keys tracked, over every shard.
    pub(super) keys: AtomicUsize,
    /// The sweeper the backend starts by itself, if any.
    pub(super) auto_sweep: AutoSweep<C>,
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

    /// The longest key taken, in bytes ([`MemoryBackendBuilder::max_key_bytes`]).
    ///
    /// [`MemoryBackendBuilder::max_key_bytes`]: crate::MemoryBackendBuilder::max_key_bytes
    pub fn max_key_bytes(&self) -> usize {
        self.inner.max_key_bytes
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

impl<C: Clock> MemoryBackend<C> {
    /// The backend's clock.
    pub fn clock(&self) -> &C {
        &self.inner.clock
    }

    /// The time of a check: `now_ms` when given (explicit), else the clock's.
    #[inline]
    pub(super) fn now(&self, now_ms: Option<u64>) -> Now {
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
            limits.mode(),
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

    fn max_key_bytes(&self) -> usize {
        self.inner.max_key_bytes
    }
}

/// Moves the `turnstile_memory_keys` gauge (feature `metrics`): several in-memory backends in
/// one process add up.
#[inline]
pub(super) fn keys_gauge(_delta: f64) {
    #[cfg(feature = "metrics")]
    metrics::gauge!(crate::metric_names::MEMORY_KEYS).increment(_delta);
}
