//! [`DenyCache`]: a denial the backend gave is repeated locally, without asking the backend,
//! for as long as it provably still holds.
//!
//! The wrapper is documented on [`DenyCache`].

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use pin_project_lite::pin_project;

use super::Wrapper;
use crate::backend::{Backend, CheckResult};
use crate::decision::{Decision, Origin};
use crate::policy::Policy;
use crate::quota::Limits;

/// The default longest time a cached denial is trusted: 1 s.
pub const DEFAULT_DENY_CACHE_MAX: Duration = Duration::from_secs(1);

/// Keys kept at most (over all shards): beyond it, new denials are not cached.
const MAX_ENTRIES: usize = 100_000;
/// Costs cached per key.
const COSTS_PER_KEY: usize = 4;
const SHARDS: usize = 16;

#[derive(Debug)]
struct Entry {
    /// Which policy set (and time base) the denial is for.
    limits: u64,
    /// The denied cost.
    cost: u64,
    /// Denied while now < until (ns on the entry's time base).
    until_ns: u128,
    /// When the reply arrived (ns): reported durations count from here.
    reply_ns: u128,
    decision: Decision,
}

/// One shard: the cached denials of each key, one per cost.
#[derive(Debug, Default)]
struct Shard {
    keys: HashMap<Box<str>, Vec<Entry>>,
    /// Counts the invalidations of the shard's keys: a denial whose request was sent before
    /// one of them may have been decided on state this process has since consumed from, so
    /// it is not cached.
    generation: u64,
}

/// The cached denials, shared by every clone of a [`DenyCache`].
#[derive(Debug)]
struct Cache {
    max_ns: u128,
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    /// The time base of checks at the backend's own time (monotonic).
    epoch: Instant,
    hits: AtomicU64,
}

/// A fingerprint of the policy sets of `limits` (defaults, tiers, unconfigured behaviour) and
/// of the time base, so a cached denial only answers the same question.
fn limits_fingerprint(limits: &Limits, explicit_time: bool) -> u64 {
    fn eat(h: &mut u64, x: u64) {
        *h ^= x;
        *h = h.wrapping_mul(0x0000_0100_0000_01b3).rotate_left(17);
    }
    fn set(h: &mut u64, ps: &[Policy]) {
        eat(h, ps.len() as u64);
        for p in ps {
            eat(h, p.fingerprint());
            p.name().bytes().for_each(|b| eat(h, u64::from(b)));
        }
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ u64::from(explicit_time);
    set(&mut h, limits.defaults());
    for (name, ps) in limits.tiers() {
        name.bytes().for_each(|b| eat(&mut h, u64::from(b)));
        set(&mut h, ps);
    }
    eat(&mut h, limits.unconfigured() as u64);
    h
}

impl Cache {
    fn new(max: Duration) -> Self {
        Cache {
            max_ns: max.as_nanos(),
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: RandomState::new(),
            epoch: Instant::now(),
            hits: AtomicU64::new(0),
        }
    }

    /// The cache's time in ns: the explicit time of a simulation, else monotonic time.
    fn now_ns(&self, now_ms: Option<u64>) -> u128 {
        match now_ms {
            Some(t) => u128::from(t) * 1_000_000,
            None => self.epoch.elapsed().as_nanos(),
        }
    }

    fn shard(&self, key: &str) -> &Mutex<Shard> {
        &self.shards[(self.hasher.hash_one(key) as usize) % SHARDS]
    }

    /// A cached denial of `key` for a request of `cost` at `now_ns`, with its durations
    /// counted from the reply it came in; else the shard's generation, for
    /// [`Cache::insert`].
    fn lookup(&self, key: &str, limits: u64, cost: u64, now_ns: u128) -> Result<Decision, u64> {
        let shard = self
            .shard(key)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // A time before the reply (an explicit time that went back) asks the backend.
        let hit = shard.keys.get(key).and_then(|es| {
            es.iter().find(|e| {
                e.limits == limits && e.cost == cost && e.reply_ns <= now_ns && now_ns < e.until_ns
            })
        });
        match hit {
            Some(e) => {
                let elapsed =
                    Duration::from_nanos(u64::try_from(now_ns - e.reply_ns).unwrap_or(u64::MAX));
                Ok(e.decision
                    .elapsed_by(elapsed)
                    .with_origin(Origin::DenyCache))
            }
            None => Err(shard.generation),
        }
    }

    /// Remembers a denial the backend gave for a request of `cost` sent at `sent_ns`, when
    /// the key's shard was at `generation`, whose reply arrived at `reply_ns`. Only denials
    /// some wait can end are kept, and only for as long as every field they show stays
    /// exact ([`Decision::unchanged_for`]), counted from the send (the backend decided at
    /// or after it).
    #[allow(clippy::too_many_arguments)]
    fn insert(
        &self,
        key: &str,
        limits: u64,
        cost: u64,
        sent: (u128, u64),
        reply_ns: u128,
        decision: &Decision,
    ) {
        let (sent_ns, generation) = sent;
        let Some(retry) = decision.retry_after() else {
            return;
        };
        if decision.allowed() || cost == 0 || retry.is_zero() {
            return;
        }
        let holds = decision.unchanged_for(cost).as_nanos().min(self.max_ns);
        let until_ns = sent_ns + holds;
        if until_ns <= reply_ns {
            return;
        }
        let mut shard = self
            .shard(key)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if shard.generation != generation {
            return;
        }
        // Expired entries go when a full shard is written.
        if shard.keys.len() >= MAX_ENTRIES / SHARDS && !shard.keys.contains_key(key) {
            shard.keys.retain(|_, es| {
                es.retain(|e| e.until_ns > reply_ns);
                !es.is_empty()
            });
            if shard.keys.len() >= MAX_ENTRIES / SHARDS {
                return;
            }
        }
        let entries = shard.keys.entry(Box::from(key)).or_default();
        entries.retain(|e| e.until_ns > reply_ns && !(e.cost == cost && e.limits == limits));
        if entries.len() >= COSTS_PER_KEY {
            entries.remove(0);
        }
        entries.push(Entry {
            limits,
            cost,
            until_ns,
            reply_ns,
            decision: decision.clone(),
        });
    }

    /// Forgets `key`'s cached denials: something gave it quota back, or this node consumed
    /// some (which makes the cached waits too short).
    fn invalidate(&self, key: &str) {
        let mut shard = self
            .shard(key)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        shard.generation = shard.generation.wrapping_add(1);
        if !shard.keys.is_empty() {
            shard.keys.remove(key);
        }
    }
}

/// A [`Backend`] that answers a repeated denial from memory, exactly as the backend would.
///
/// When the backend denies a request **sent** at time s, the same request (same key,
/// policies and cost) is denied locally until s + u, where u is how long every field the
/// denial shows stays exact with nothing else arriving ([`Decision::unchanged_for`]): until
/// the first violated policy could admit, or any policy's `remaining` could rise, whichever
/// comes first (capped at [`DenyCache::with_max`]). The backend decided at some time e ≥ s, so
/// nothing changes before e + u ≥ s + u; a denied request changes no state, and while nothing
/// gives quota back other processes can only consume. So the local denial is the denial the
/// backend would give, and a flood of denied traffic costs the backend nothing.
///
/// A denial answered from the cache is the one the backend gave, with every `retry_after`
/// and `reset_after` shortened by the time since the **reply** (r ≥ e): at explicit times
/// (simulations, where s = e = r) it equals the backend's own answer field for field —
/// allowed, violated policies, each policy's `remaining`, `retry_after` and `reset_after`,
/// the aggregate. In real time a cached wait is never shorter than the one the backend gave
/// this process and at most one round trip (r − e) longer. Where the end of a field's
/// exactness needs state a decision does not carry (a sliding log's oldest entry, a sliding
/// window's previous count), the entry is kept only when the violated policy misses exactly
/// the units its admission needs, and otherwise the backend is asked again. A request this
/// process admits for the key drops the key's cached denials (it made their waits longer),
/// and so does one admitted while a denial was on its way (that denial is not cached).
/// Other processes' consumption is not seen: it can only make the true wait longer and the
/// true `remaining` smaller than the cached ones, never turn a cached denial into an
/// admission. (A costlier request would be denied too, but its own fields differ, so it
/// asks the backend — which then caches it under its own cost; a key keeps up to four costs.)
///
/// What gives quota back — a reset, a refund, a raised override or tier — reaches this
/// process's cache at once when it goes through the wrapper ([`Quotas`](crate::Quotas), see
/// [`Wrapper::giving_back`]), and other processes' caches within their cap
/// ([`DenyCache::with_max`], 1 s by default): an entry is never kept longer than that.
///
/// Queries (cost 0) are never cached; checks at explicit times (simulations) are cached on
/// their own time base. Clones share one cache.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use turnstile_core::{wrap::DenyCache, Backend, MemoryBackend, Policy};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let backend = DenyCache::new(MemoryBackend::new());
/// let one_per_minute = [Policy::fixed_window(1, Duration::from_secs(60))?];
/// assert!(backend.check_at("k", &one_per_minute, 1, 0).now_or_never().ok_or("pending")??.allowed());
/// assert!(!backend.check_at("k", &one_per_minute, 1, 10).now_or_never().ok_or("pending")??.allowed());
/// // Asked again: answered from the cache, with the wait counted from the first reply.
/// let again = backend.check_at("k", &one_per_minute, 1, 20).now_or_never().ok_or("pending")??;
/// assert!(!again.allowed());
/// assert_eq!(backend.hits(), 1);
/// # Ok(()) }
/// ```
pub struct DenyCache<B> {
    inner: B,
    cache: Arc<Cache>,
}

impl<B: Clone> Clone for DenyCache<B> {
    fn clone(&self) -> Self {
        DenyCache {
            inner: self.inner.clone(),
            cache: Arc::clone(&self.cache),
        }
    }
}

impl<B: fmt::Debug> fmt::Debug for DenyCache<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DenyCache")
            .field("inner", &self.inner)
            .field("max", &Duration::from_nanos(self.cache.max_ns as u64))
            .finish()
    }
}

impl<B> DenyCache<B> {
    /// Wraps `inner`, trusting a cached denial at most [`DEFAULT_DENY_CACHE_MAX`] (1 s).
    pub fn new(inner: B) -> Self {
        Self::with_max(inner, DEFAULT_DENY_CACHE_MAX)
    }

    /// Wraps `inner`, trusting a cached denial at most `max`: the bound on how late a refund,
    /// reset or raised quota made through **another** process reaches this one (through this
    /// wrapper it applies at once).
    pub fn with_max(inner: B, max: Duration) -> Self {
        DenyCache {
            inner,
            cache: Arc::new(Cache::new(max)),
        }
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &B {
        &self.inner
    }

    /// Checks answered from the cache since it was built (all clones together).
    pub fn hits(&self) -> u64 {
        self.cache.hits.load(Ordering::Relaxed)
    }

    /// Forgets this process's cached denials of `key`.
    pub fn forget(&self, key: &str) {
        self.cache.invalidate(key);
    }
}

impl<B: Backend> Backend for DenyCache<B> {
    type Future = DenyCacheFuture<B::Future>;

    fn check_limits(
        &self,
        key: &str,
        limits: &Limits,
        cost: u64,
        now_ms: Option<u64>,
    ) -> Self::Future {
        if cost == 0 {
            let fut = self.inner.check_limits(key, limits, cost, now_ms);
            return DenyCacheFuture {
                state: State::Asking { fut, learn: None },
            };
        }
        let fp = limits_fingerprint(limits, now_ms.is_some());
        let sent_ns = self.cache.now_ns(now_ms);
        let generation = match self.cache.lookup(key, fp, cost, sent_ns) {
            Ok(decision) => {
                self.cache.hits.fetch_add(1, Ordering::Relaxed);
                #[cfg(feature = "metrics")]
                metrics::counter!(crate::metric_names::DENY_CACHE_HITS_TOTAL).increment(1);
                return DenyCacheFuture {
                    state: State::Cached {
                        decision: Some(decision),
                    },
                };
            }
            Err(generation) => generation,
        };
        let fut = self.inner.check_limits(key, limits, cost, now_ms);
        DenyCacheFuture {
            state: State::Asking {
                fut,
                learn: Some(Learn {
                    cache: Arc::clone(&self.cache),
                    key: Box::from(key),
                    fp,
                    cost,
                    sent_ns,
                    generation,
                    now_ms,
                }),
            },
        }
    }

    #[inline]
    fn ready_now(fut: Self::Future) -> Result<CheckResult, Self::Future> {
        match fut.state {
            State::Cached {
                decision: Some(decision),
            } => Ok(Ok(decision)),
            State::Cached { decision: None } => Err(DenyCacheFuture {
                state: State::Cached { decision: None },
            }),
            State::Asking { fut, learn } => match B::ready_now(fut) {
                Ok(result) => {
                    if let Some(l) = learn {
                        l.learn(&result);
                    }
                    Ok(result)
                }
                Err(fut) => Err(DenyCacheFuture {
                    state: State::Asking { fut, learn },
                }),
            },
        }
    }

    fn is_local(&self) -> bool {
        self.inner.is_local()
    }

    fn max_key_bytes(&self) -> usize {
        self.inner.max_key_bytes()
    }
}

/// What a check that asked the backend teaches the cache.
struct Learn {
    cache: Arc<Cache>,
    key: Box<str>,
    fp: u64,
    cost: u64,
    sent_ns: u128,
    /// The key's shard's generation when the request was sent.
    generation: u64,
    now_ms: Option<u64>,
}

impl Learn {
    fn learn(self, result: &CheckResult) {
        let Ok(decision) = result else { return };
        if decision.allowed() {
            // This process consumed: its cached waits for the key grew.
            self.cache.invalidate(&self.key);
        } else {
            let reply_ns = self.cache.now_ns(self.now_ms);
            self.cache.insert(
                &self.key,
                self.fp,
                self.cost,
                (self.sent_ns, self.generation),
                reply_ns,
                decision,
            );
        }
    }
}

pin_project! {
    /// The future of a [`DenyCache`]'s check.
    #[must_use = "futures do nothing unless polled"]
    pub struct DenyCacheFuture<F> {
        #[pin]
        state: State<F>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Cached { decision: Option<Decision> },
        Asking { #[pin] fut: F, learn: Option<Learn> },
    }
}

impl<F> fmt::Debug for DenyCacheFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DenyCacheFuture").finish_non_exhaustive()
    }
}

impl<F: Future<Output = CheckResult>> Future for DenyCacheFuture<F> {
    type Output = CheckResult;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<CheckResult> {
        match self.project().state.project() {
            StateProj::Cached { decision } => match decision.take() {
                Some(d) => Poll::Ready(Ok(d)),
                None => Poll::Pending,
            },
            StateProj::Asking { fut, learn } => {
                let result = ready!(fut.poll(cx));
                if let Some(l) = learn.take() {
                    l.learn(&result);
                }
                Poll::Ready(result)
            }
        }
    }
}

impl<B> Wrapper for DenyCache<B> {
    type Inner = B;

    fn inner(&self) -> &B {
        &self.inner
    }

    /// Forgets `key` now and again when `op` ends: quota given back (or a raised limit)
    /// ends a cached denial, and a denial on its way during `op` may predate it.
    fn giving_back<T: Send>(
        &self,
        key: &str,
        op: impl Future<Output = T> + Send,
    ) -> impl Future<Output = T> + Send {
        self.cache.invalidate(key);
        let cache = Arc::clone(&self.cache);
        let key: Box<str> = Box::from(key);
        async move {
            let out = op.await;
            cache.invalidate(&key);
            out
        }
    }
}
