//! Coalescing (issue 27): while a check of a *pair* — a client key's state string, its
//! limits and its time (the server's, or one explicit time) — is in flight from this backend,
//! the pair's further checks wait for it and are then sent together as one call of the batch
//! function (`lua/batch.lua`), which decides them in their order exactly as one by one at one
//! server time. No timer: a check with nothing in flight for its pair leads, and goes at
//! once, alone, as the check function's call it always was.
//!
//! Per pair in flight a *lane* holds the queue. When the lead's call ends (or times out: a
//! silent connection must not hold the queue for the late reply's wait), a task of its own,
//! the *driver*, sends the queue in calls of at most [`Lanes`]' budget of policy evaluations
//! each, one call at a time, until the queue is empty; then the lane goes, and the next
//! check leads again. Every check keeps its own deadline, counted from its arrival; node
//! health counts a call, not its checks.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, BuildHasherDefault, Hasher, RandomState};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::oneshot;
use tokio::time::Instant;
use turnstile_core::{BackendError, BoxError, CheckResult, Limits};

use crate::health::NodeDown;
use crate::server::UnsupportedRedisVersion;
use crate::wire::reply::Decided;

/// What checks share a call: one client key's state string, with the same limits, at the
/// same time.
#[derive(Debug)]
pub(crate) struct Pair {
    /// The client's state string.
    pub(crate) key: String,
    pub(crate) limits: Limits,
    /// The explicit time of the checks (ms), or `None`: the server's.
    pub(crate) now_ms: Option<u64>,
}

impl Pair {
    fn same(&self, other: &Pair) -> bool {
        self.key == other.key && self.now_ms == other.now_ms && self.limits == other.limits
    }

    /// The most policies one check of the pair evaluates among the sets its limits carry.
    fn policies_per_check(&self) -> usize {
        let tiers = self.limits.tiers().map(|(_, ps)| ps.len());
        tiers.fold(self.limits.defaults().len(), usize::max).max(1)
    }
}

/// A check waiting in a lane.
#[derive(Debug)]
pub(crate) struct Member {
    pub(crate) cost: u64,
    /// When its caller stops waiting (its arrival and the timeout).
    pub(crate) deadline: Instant,
    pub(crate) tx: oneshot::Sender<CheckResult>,
}

impl Member {
    /// Whether its caller still waits at `now`: a check whose caller gave up is not sent.
    fn waiting(&self, now: Instant) -> bool {
        !self.tx.is_closed() && self.deadline > now
    }
}

/// The queue of one pair whose call is in flight.
#[derive(Debug)]
struct Lane {
    pair: Arc<Pair>,
    queue: VecDeque<Member>,
}

/// A hasher of `u64`s that are hashes already.
#[derive(Debug, Default)]
struct Hashed(u64);

impl Hasher for Hashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type Shard = HashMap<u64, Lane, BuildHasherDefault<Hashed>>;

const SHARDS: usize = 32;

/// The lanes of a backend's pairs in flight (those of other checks, none), by a hash of the
/// pair: a check whose hash another pair's lane holds goes alone.
#[derive(Debug)]
pub(crate) struct Lanes {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    /// The most policy evaluations one call may make.
    evaluations: usize,
}

/// How a check joined its pair's lane.
#[derive(Debug)]
pub(crate) enum Joined {
    /// Nothing of the pair was in flight: the check goes now, and the lane (this hash) is
    /// held until its call ends ([`Lead`]).
    Lead(u64),
    /// A call of the pair is in flight: the check's outcome comes here.
    Wait(oneshot::Receiver<CheckResult>),
    /// Another pair holds the lane of the same hash: the check goes alone.
    Alone,
}

impl Lanes {
    pub(crate) fn new(evaluations: usize) -> Self {
        Lanes {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: RandomState::new(),
            evaluations,
        }
    }

    /// The most policy evaluations one call may make.
    pub(crate) fn evaluations(&self) -> usize {
        self.evaluations
    }

    fn shard(&self, hash: u64) -> MutexGuard<'_, Shard> {
        self.shards[(hash % SHARDS as u64) as usize]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// A check of `pair` for `cost` whose caller waits until `deadline`.
    pub(crate) fn join(&self, pair: &Arc<Pair>, cost: u64, deadline: Instant) -> Joined {
        let hash = self.hasher.hash_one((&pair.key, pair.now_ms));
        let mut shard = self.shard(hash);
        match shard.get_mut(&hash) {
            None => {
                let lane = Lane {
                    pair: Arc::clone(pair),
                    queue: VecDeque::new(),
                };
                shard.insert(hash, lane);
                Joined::Lead(hash)
            }
            Some(lane) if lane.pair.same(pair) => {
                let (tx, rx) = oneshot::channel();
                lane.queue.push_back(Member { cost, deadline, tx });
                Joined::Wait(rx)
            }
            Some(_) => Joined::Alone,
        }
    }

    /// The lead's call of `pair` (lane `hash`) ended: the lane goes when nothing waits;
    /// returns whether checks wait (a driver must send them).
    pub(crate) fn release(&self, hash: u64, pair: &Arc<Pair>) -> bool {
        let mut shard = self.shard(hash);
        match shard.get(&hash) {
            Some(lane) if Arc::ptr_eq(&lane.pair, pair) => {
                if lane.queue.is_empty() {
                    shard.remove(&hash);
                    false
                } else {
                    true
                }
            }
            _ => false,
        }
    }

    /// The checks of the next call of `pair` (lane `hash`): `carried` (left by the call
    /// before, first in line), then the queue's oldest, as many as the budget holds; those
    /// whose callers gave up are dropped unsent (a dropped check's caller gets a timeout).
    /// `None`, and the lane goes, when none is left.
    pub(crate) fn next(
        &self,
        hash: u64,
        pair: &Arc<Pair>,
        mut carried: Vec<Member>,
    ) -> Option<Vec<Member>> {
        let most = (self.evaluations / pair.policies_per_check()).max(1);
        let now = Instant::now();
        carried.retain(|m| m.waiting(now));
        let mut shard = self.shard(hash);
        let Some(lane) = shard.get_mut(&hash).filter(|l| Arc::ptr_eq(&l.pair, pair)) else {
            return (!carried.is_empty()).then_some(carried);
        };
        while carried.len() < most {
            let Some(m) = lane.queue.pop_front() else {
                break;
            };
            if m.waiting(now) {
                carried.push(m);
            }
        }
        if carried.is_empty() {
            shard.remove(&hash);
            return None;
        }
        Some(carried)
    }

    /// No runtime is left to drive the lane of `pair` (`hash`): it goes, and its checks
    /// with it (their callers get timeouts).
    pub(crate) fn abandon(&self, hash: u64, pair: &Arc<Pair>) {
        let mut shard = self.shard(hash);
        if shard.get(&hash).is_some_and(|l| Arc::ptr_eq(&l.pair, pair)) {
            shard.remove(&hash);
        }
    }
}

/// The outcome of a check that joined a lane (`ticket`), or a timeout (`timed_out`) at
/// `deadline`. An outcome that arrives as the deadline passes is taken; after it, none can
/// (the driver then refunds what it charged).
pub(crate) async fn wait(
    mut ticket: oneshot::Receiver<CheckResult>,
    deadline: Instant,
    timed_out: impl FnOnce() -> BackendError,
) -> CheckResult {
    match tokio::time::timeout_at(deadline, &mut ticket).await {
        Ok(Ok(outcome)) => outcome,
        // Dropped unsent: its deadline had passed when its call was made up.
        Ok(Err(_)) => Err(timed_out()),
        Err(_) => {
            ticket.close();
            ticket.try_recv().unwrap_or_else(|_| Err(timed_out()))
        }
    }
}

/// Whether `outcome` charged a check of `cost`: admitted, for a cost above 0.
pub(crate) fn charged(outcome: &Decided, cost: u64) -> bool {
    cost > 0 && matches!(outcome, Ok((_, d)) if d.allowed())
}

/// A copy of `e` for another check of the same call (a [`BackendError`] is not `Clone`):
/// the same kind and message, and the same source where it is one of this crate's.
fn copy_of(e: &BackendError) -> BackendError {
    match e {
        BackendError::Timeout { after } => BackendError::Timeout { after: *after },
        BackendError::Connection(source) => BackendError::Connection(copy_source(source)),
        BackendError::Script(s) => BackendError::Script(s.clone()),
        BackendError::InvalidState(s) => BackendError::InvalidState(s.clone()),
        BackendError::InvalidRequest(s) => BackendError::InvalidRequest(s.clone()),
        BackendError::CapacityExceeded { max_keys } => BackendError::CapacityExceeded {
            max_keys: *max_keys,
        },
        other => BackendError::Script(other.to_string()),
    }
}

fn copy_source(source: &BoxError) -> BoxError {
    if let Some(e) = source.downcast_ref::<redis::RedisError>() {
        Box::new(e.clone())
    } else if let Some(d) = source.downcast_ref::<NodeDown>() {
        Box::new(d.clone())
    } else if let Some(v) = source.downcast_ref::<UnsupportedRedisVersion>() {
        Box::new(v.clone())
    } else {
        source.to_string().into()
    }
}

/// Fails every check of `members` with `error` (each its own copy).
pub(crate) fn fail_all(members: Vec<Member>, error: BackendError) {
    let mut members = members.into_iter().peekable();
    let mut error = Some(error);
    while let Some(m) = members.next() {
        let e = match members.peek() {
            Some(_) => error.as_ref().map(copy_of),
            None => error.take(),
        };
        if let Some(e) = e {
            let _ = m.tx.send(Err(e));
        }
    }
}
