//! What a [`Fallback`](super::Fallback) learned from the backend's answers, so that an outage
//! starts each key from where the backend last left it instead of a fresh quota.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use crate::backend::Backend;
use crate::clock::Clock;
use crate::decision::Decision;
use crate::memory::MemoryBackend;
use crate::policy::Policy;
use crate::quota::Limits;

const SHARDS: usize = 16;

/// One shard: each key's last answer.
type Shard = HashMap<Box<str>, Seen>;

/// The last answer the backend gave for one key: each policy's `remaining` at `at_ms`.
#[derive(Debug, Default)]
struct Seen {
    at_ms: u64,
    remaining: Vec<(Policy, u64)>,
    /// [`Learned`]'s count of answers when this one was recorded.
    recorded: u64,
    /// Whether the local state of this key was primed since that answer: the key's outage
    /// goes on, and what the local backend holds for it is the outage's own count.
    primed: bool,
}

/// Per key, the backend's last answer; bounded (`max` keys over all shards).
#[derive(Debug)]
pub(super) struct Learned {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    max_per_shard: usize,
    /// The share s of the capacity a key the backend never answered for starts with, in
    /// millionths (1,000,000 = the whole capacity).
    share_ppm: u64,
    /// Answers recorded so far (all keys): orders a check's send after an answer.
    answers: AtomicU64,
}

impl Learned {
    pub(super) fn new(max_keys: usize, share_ppm: u64) -> Self {
        Learned {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: RandomState::new(),
            max_per_shard: max_keys.div_ceil(SHARDS),
            share_ppm: share_ppm.min(1_000_000),
            answers: AtomicU64::new(0),
        }
    }

    /// The mark of a check sent now, for [`Learned::record`] of its answer.
    pub(super) fn sent(&self) -> u64 {
        self.answers.load(Ordering::Acquire)
    }

    fn shard(&self, key: &str) -> std::sync::MutexGuard<'_, Shard> {
        let i = (self.hasher.hash_one(key) as usize) % SHARDS;
        self.shards[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// How many keys are remembered.
    pub(super) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).len())
            .sum()
    }

    /// Remembers the backend's answer for `key` at local time `at_ms` to a check sent with
    /// the mark `sent` ([`Learned::sent`]). An answer to a check sent before the key's last
    /// recorded answer arrived was decided in an order this process cannot know (checks in
    /// flight together, a coalesced call's decisions, told in any order): of the two, each
    /// policy keeps the smaller `remaining`, from the later time, so an outage never starts
    /// from an earlier, larger one.
    pub(super) fn record(&self, key: &str, sent: u64, at_ms: u64, decision: &Decision) {
        if decision.policies().is_empty() {
            return;
        }
        let recorded = self.answers.fetch_add(1, Ordering::AcqRel) + 1;
        let mut shard = self.shard(key);
        if !shard.contains_key(key) && shard.len() >= self.max_per_shard {
            // Full: forget one other key (it will start from the unknown share).
            let Some(victim) = shard.keys().next().cloned() else {
                return;
            };
            shard.remove(&victim);
        }
        let seen = shard.entry(Box::from(key)).or_default();
        let overlapped = sent < seen.recorded
            && seen.remaining.len() == decision.policies().len()
            && seen
                .remaining
                .iter()
                .zip(decision.policies())
                .all(|((p, _), d)| p == d.policy());
        // (Numbered before the lock: a racing answer may store after a later-numbered one.)
        seen.recorded = seen.recorded.max(recorded);
        // A new answer: the key's next outage starts from it.
        seen.primed = false;
        if overlapped {
            seen.at_ms = seen.at_ms.max(at_ms);
            for ((_, r), d) in seen.remaining.iter_mut().zip(decision.policies()) {
                *r = (*r).min(d.remaining());
            }
            return;
        }
        seen.at_ms = at_ms;
        seen.remaining.clear();
        seen.remaining.extend(
            decision
                .policies()
                .iter()
                .map(|p| (p.policy().clone(), p.remaining())),
        );
    }

    /// Before `local` decides `key` for the first time since the backend's last answer for
    /// it (the first local decision of the key's outage): its local state is set to what the
    /// backend last said (each policy's `remaining` at that time, refilling from there at the
    /// policy's own rate), or, for a key the backend never answered for, to the unknown share
    /// of each policy's capacity, at `now_ms`. Later local decisions of the same outage
    /// count on from there, however often other keys' answers end and begin incidents in
    /// between (a Cluster with one master down answers for every other master's keys).
    pub(super) fn prime<C: Clock>(
        &self,
        local: &MemoryBackend<C>,
        key: &str,
        limits: &Limits,
        now_ms: u64,
    ) {
        let mut shard = self.shard(key);
        if !shard.contains_key(key) && shard.len() >= self.max_per_shard {
            if let Some(victim) = shard.keys().next().cloned() {
                shard.remove(&victim);
            }
        }
        let seen = shard.entry(Box::from(key)).or_default();
        if seen.primed {
            return;
        }
        seen.primed = true;
        // Whatever an earlier outage left locally is stale: the backend answered since.
        forget(local, key, limits, now_ms);
        if seen.remaining.is_empty() {
            for p in limits.defaults() {
                let cap = p.capacity();
                let kept = u64::try_from(u128::from(cap) * u128::from(self.share_ppm) / 1_000_000)
                    .unwrap_or(cap);
                consume(local, key, p, cap - kept.min(cap), now_ms);
            }
        } else {
            for (p, r) in &seen.remaining {
                consume(local, key, p, p.capacity().saturating_sub(*r), seen.at_ms);
            }
        }
    }
}

/// Takes `cost` units of `policy` for `key` in `local` at `at_ms` (nothing for 0).
fn consume<C: Clock>(local: &MemoryBackend<C>, key: &str, policy: &Policy, cost: u64, at_ms: u64) {
    if cost > 0 {
        // A fresh key admits up to its capacity: this cannot be denied. A full local backend
        // (its key cap) leaves the key fresh.
        let _ = local
            .check_at(key, std::slice::from_ref(policy), cost, at_ms)
            .into_inner();
    }
}

/// Drops `key`'s local state for every policy `limits` can apply.
fn forget<C: Clock>(local: &MemoryBackend<C>, key: &str, limits: &Limits, now_ms: u64) {
    local.forget_policies(
        key,
        limits
            .defaults()
            .iter()
            .chain(limits.tiers().flat_map(|(_, ps)| ps.iter())),
        now_ms,
    );
}
