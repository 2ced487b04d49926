//! The local deny cache: a denial Redis gave is repeated locally, without asking Redis, for as
//! long as it provably still holds.
//!
//! When Redis says a key is denied with `retry_after` d for a request **sent** at time s, the
//! same request (same key, policies and cost) is denied locally until s + d. Redis decided at
//! some time e ≥ s that nothing admits the request before e + d ≥ s + d, and while nothing
//! gives quota back other nodes can only consume more; so the local denial is exactly the
//! denial Redis would give, and a flood of denied traffic costs Redis nothing. The
//! `retry_after` reported from the cache is timed from the **reply** (r ≥ e), so it never
//! understates the real wait as Redis saw it (a request this node admits for the key
//! afterwards drops the key's cached denials, whose waits it made longer). (A costlier request would be denied too, but its own wait is
//! longer than d, so it asks Redis — which then caches it under its own cost; a key keeps up
//! to four costs.)
//!
//! A denial answered from the cache is the one Redis gave, its durations shortened by the time
//! since the reply; its `remaining` is Redis's (a lower bound: entries that expired since are
//! not counted back), so with the cache on a decision can differ from Redis's own in
//! `remaining` — never in `allowed`. Simulations (explicit times) turn it off for exact
//! output.
//!
//! What gives quota back — a reset, a refund, a raised override or tier — reaches this
//! node's cache at once when it goes through this backend, and other nodes' caches within
//! their cap (`RedisBackendBuilder::deny_cache`, 1 s by default): an entry is never kept
//! longer than that.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use turnstile_core::{Decision, Limits, Policy};

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
type Shard = HashMap<Box<str>, Vec<Entry>>;

#[derive(Debug)]
pub(crate) struct DenyCache {
    max_ns: u128,
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
}

/// A fingerprint of the policy sets of `limits` (defaults, tiers, unconfigured behaviour) and
/// of the time base, so a cached denial only answers the same question.
pub(crate) fn limits_fingerprint(limits: &Limits, explicit_time: bool) -> u64 {
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

impl DenyCache {
    pub(crate) fn new(max: Duration) -> Self {
        DenyCache {
            max_ns: max.as_nanos(),
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: RandomState::new(),
        }
    }

    fn shard(&self, key: &str) -> &Mutex<Shard> {
        &self.shards[(self.hasher.hash_one(key) as usize) % SHARDS]
    }

    /// A cached denial of `key` for a request of `cost` at `now_ns`, with its durations
    /// counted from the reply it came in.
    pub(crate) fn lookup(
        &self,
        key: &str,
        limits: u64,
        cost: u64,
        now_ns: u128,
    ) -> Option<Decision> {
        let shard = self
            .shard(key)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let e = shard
            .get(key)?
            .iter()
            .find(|e| e.limits == limits && e.cost == cost && now_ns < e.until_ns)?;
        let elapsed = Duration::from_nanos(
            u64::try_from(now_ns.saturating_sub(e.reply_ns)).unwrap_or(u64::MAX),
        );
        Some(e.decision.elapsed_by(elapsed))
    }

    /// Remembers a denial Redis gave for a request of `cost` sent at `sent_ns` whose reply
    /// arrived at `reply_ns`. Only denials some wait can end are kept.
    pub(crate) fn insert(
        &self,
        key: &str,
        limits: u64,
        cost: u64,
        sent_ns: u128,
        reply_ns: u128,
        decision: &Decision,
    ) {
        let Some(retry) = decision.retry_after() else {
            return;
        };
        if decision.allowed() || cost == 0 || retry.is_zero() {
            return;
        }
        let until_ns = sent_ns + retry.as_nanos().min(self.max_ns);
        let mut shard = self
            .shard(key)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Expired entries go when a full shard is written.
        if shard.len() >= MAX_ENTRIES / SHARDS && !shard.contains_key(key) {
            shard.retain(|_, es| {
                es.retain(|e| e.until_ns > reply_ns);
                !es.is_empty()
            });
            if shard.len() >= MAX_ENTRIES / SHARDS {
                return;
            }
        }
        let entries = shard.entry(Box::from(key)).or_default();
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
    pub(crate) fn invalidate(&self, key: &str) {
        let mut shard = self
            .shard(key)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if !shard.is_empty() {
            shard.remove(key);
        }
    }
}
