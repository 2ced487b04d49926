//! How a check reaches Redis: alone, as it always did, or — with coalescing on, while a call of
//! its pair is in flight — queued in the pair's lane (`coalesce.rs`) and sent with the others
//! queued there in one call of the batch function, by a *driver* task the lane's lead starts
//! when its call ends. Both keep the failure handling of a call: node health, timeouts from
//! each check's arrival, refunds of what a late reply charged.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::time::Instant;
use turnstile_core::policy::MAX_EXACT;
use turnstile_core::{BackendError, CheckResult, Clock, Decision};

use crate::backend::{min_ttl, sets, tier_list, RedisBackend, LATE_REPLY_WAIT};
use crate::call::{Call, Which};
use crate::coalesce::{charged, fail_all, wait, Joined, Lanes, Member, Pair};
use crate::fault::{Failed, Fault};
use crate::wire::reply::Decided;
use crate::wire::{array, batch_args, parse_batch, Op};

impl<C: Clock> RedisBackend<C> {
    /// A check of `pair` (the client's state string, its limits, its time) with the failure
    /// handling: sent at once when no call of the pair is in flight, else (coalescing on)
    /// queued for the next call of the pair (see `coalesce.rs`).
    pub(crate) async fn run(self, pair: Arc<Pair>, cost: u64) -> CheckResult {
        let inner = &*self.inner;
        let (attempt, cluster) = self.begin(&pair.key)?;
        let deadline = Instant::now() + inner.timeout;
        // The probe of a node counted down goes alone.
        let lead = match &inner.lanes {
            Some(lanes) if !attempt.is_probe() => match lanes.join(&pair, cost, deadline) {
                Joined::Lead(hash) => Some(Lead::new(self.clone(), hash, Arc::clone(&pair))),
                Joined::Wait(ticket) => {
                    attempt.release();
                    return wait(ticket, deadline, || self.timed_out().error).await;
                }
                Joined::Alone => None,
            },
            _ => None,
        };
        let started = inner.target.generation();
        // The call runs to its end even when the caller stops waiting: a script Redis runs
        // after the timeout may have charged a request the caller refused or decided
        // elsewhere, and is then refunded (a request is never charged for nothing).
        let this = self.clone();
        let mut call = Box::pin(async move {
            let tiers = tier_list(&pair.limits);
            let result = this
                .call_on_node(
                    &pair.key,
                    sets(&pair.limits, &tiers),
                    Op::Check,
                    cost,
                    pair.now_ms,
                    deadline,
                )
                .await;
            (result, this, pair)
        });
        let result = match tokio::time::timeout_at(deadline, &mut call).await {
            Ok((result, ..)) => result,
            Err(_) => {
                tokio::spawn(Self::finish_late(call, cost));
                Err(self.timed_out())
            }
        };
        // The pair's next call may go (its checks queued meanwhile, together).
        drop(lead);
        match result {
            Ok((_, decision)) => {
                attempt.answered();
                Ok(decision)
            }
            Err(failed) => {
                self.settle(attempt, failed.fault, started, cluster);
                Err(failed.error)
            }
        }
    }

    /// Awaits a check its caller gave up on, for at most [`LATE_REPLY_WAIT`], and refunds
    /// what it charged.
    async fn finish_late(
        call: Pin<Box<impl Future<Output = (Result<(u64, Decision), Failed>, Self, Arc<Pair>)>>>,
        cost: u64,
    ) {
        let Ok((late, this, pair)) = tokio::time::timeout(LATE_REPLY_WAIT, call).await else {
            return;
        };
        if let Ok((_, decision)) = late {
            if decision.allowed() && cost > 0 {
                this.refund_late(&pair, cost).await;
            }
        }
    }
}

/// The lead of a lane: while it lives, the pair's checks queue; dropped (its call ended,
/// timed out, or its caller stopped waiting), it lets the queue go (a driver task sends it).
pub(crate) struct Lead<C: Clock> {
    backend: RedisBackend<C>,
    hash: u64,
    pair: Arc<Pair>,
}

impl<C: Clock> Lead<C> {
    pub(crate) fn new(backend: RedisBackend<C>, hash: u64, pair: Arc<Pair>) -> Self {
        Lead {
            backend,
            hash,
            pair,
        }
    }
}

impl<C: Clock> Drop for Lead<C> {
    fn drop(&mut self) {
        let Some(lanes) = &self.backend.inner.lanes else {
            return;
        };
        if lanes.release(self.hash, &self.pair) {
            let driver = self
                .backend
                .clone()
                .drive(self.hash, Arc::clone(&self.pair));
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => drop(rt.spawn(driver)),
                Err(_) => lanes.abandon(self.hash, &self.pair),
            }
        }
    }
}

/// A batch call in flight: its outcome, and what a late reply's refunds need.
type BatchCall<C> = (
    Result<Vec<Decided>, Failed>,
    RedisBackend<C>,
    Arc<Pair>,
    Vec<u64>,
);

impl<C: Clock> RedisBackend<C> {
    /// Sends the queue of `pair` (lane `hash`), one call at a time, until it is empty.
    async fn drive(self, hash: u64, pair: Arc<Pair>) {
        let Some(lanes) = &self.inner.lanes else {
            return;
        };
        let mut carried = Vec::new();
        while let Some(members) = lanes.next(hash, &pair, carried) {
            carried = self.batch_round(&pair, members).await;
        }
    }

    /// One call for the checks `members` of `pair`, in their order, with the failure
    /// handling of a lone check: node health counts the call once, and it times out at the
    /// last of the checks' deadlines (each check's caller stops waiting at its own). Each
    /// check is told its outcome; an admitted one whose caller gave up is refunded. Returns
    /// the checks the call did not decide (beyond its budget), first in line for the next.
    async fn batch_round(&self, pair: &Arc<Pair>, members: Vec<Member>) -> Vec<Member> {
        let (attempt, cluster) = match self.begin(&pair.key) {
            Ok(begun) => begun,
            Err(e) => {
                fail_all(members, e);
                return Vec::new();
            }
        };
        let started = self.inner.target.generation();
        let deadline = members.iter().map(|m| m.deadline).max();
        let deadline = deadline.unwrap_or_else(Instant::now);
        let costs: Vec<u64> = members.iter().map(|m| m.cost).collect();
        let (this, p) = (self.clone(), Arc::clone(pair));
        // As for a lone check, the call runs to its end even when every caller stops waiting:
        // what a late reply charged is refunded.
        let mut call = Box::pin(async move {
            let outcome = this.call_batch_on_node(&p, &costs, deadline).await;
            (outcome, this, p, costs)
        });
        match tokio::time::timeout_at(deadline, &mut call).await {
            Ok((Ok(decided), ..)) => {
                attempt.answered();
                self.deliver(pair, members, decided)
            }
            Ok((Err(failed), ..)) => {
                self.settle(attempt, failed.fault, started, cluster);
                fail_all(members, failed.error);
                Vec::new()
            }
            Err(_) => {
                tokio::spawn(Self::finish_late_batch(call));
                let failed = self.timed_out();
                self.settle(attempt, failed.fault, started, cluster);
                fail_all(members, failed.error);
                Vec::new()
            }
        }
    }

    /// Tells each of `members` its outcome in `decided` (in order; fewer when the call left
    /// some undecided, which are returned), and refunds those admitted whose callers gave up.
    fn deliver(
        &self,
        pair: &Arc<Pair>,
        members: Vec<Member>,
        decided: Vec<Decided>,
    ) -> Vec<Member> {
        let mut members = members.into_iter();
        let mut refunds = Vec::new();
        for (outcome, m) in decided.into_iter().zip(members.by_ref()) {
            let charged = charged(&outcome, m.cost);
            if m.tx.send(outcome.map(|(_, d)| d)).is_err() && charged {
                refunds.push(m.cost);
            }
        }
        if !refunds.is_empty() {
            tokio::spawn(self.clone().refund_each(Arc::clone(pair), refunds));
        }
        members.collect()
    }

    /// Refunds each of `costs` to `pair`, one after the other.
    async fn refund_each(self, pair: Arc<Pair>, costs: Vec<u64>) {
        for cost in costs {
            self.refund_late(&pair, cost).await;
        }
    }

    /// Awaits a batch call every caller gave up on, for at most [`LATE_REPLY_WAIT`], and
    /// refunds each check it admitted.
    async fn finish_late_batch(call: Pin<Box<impl Future<Output = BatchCall<C>>>>) {
        let Ok((late, this, pair, costs)) = tokio::time::timeout(LATE_REPLY_WAIT, call).await
        else {
            return;
        };
        if let Ok(decided) = late {
            let refunds = decided
                .iter()
                .zip(&costs)
                .filter(|(outcome, cost)| charged(outcome, **cost))
                .map(|(_, cost)| *cost)
                .collect();
            this.refund_each(pair, refunds).await;
        }
    }

    /// One call deciding the checks of `costs` (in order) of `pair`: the check function's for
    /// one, the batch function's for more. Returns the outcomes of those it decided (at least
    /// the first); nothing is sent after `deadline`.
    async fn call_batch_on_node(
        &self,
        pair: &Pair,
        costs: &[u64],
        deadline: Instant,
    ) -> Result<Vec<Decided>, Failed> {
        let inner = &*self.inner;
        let tiers = tier_list(&pair.limits);
        let sets = sets(&pair.limits, &tiers);
        if let [cost] = costs {
            let one = self.call_on_node(&pair.key, sets, Op::Check, *cost, pair.now_ms, deadline);
            return Ok(vec![Ok(one.await?)]);
        }
        if pair.now_ms.is_some_and(|t| t > MAX_EXACT) {
            return Err(Failed::local(BackendError::InvalidRequest(
                "the time must be at most 2^53 − 1 ms".into(),
            )));
        }
        let mut inv = Call::new(Which::Batch, inner.scripts.function(Which::Batch), 1);
        inv.key(&pair.key);
        let budget = inner.lanes.as_ref().map_or(1, Lanes::evaluations);
        batch_args(
            &mut inv,
            sets,
            costs,
            budget,
            pair.now_ms,
            min_ttl(pair.now_ms),
        );
        let stats = &inner.stats;
        stats.redis_calls.fetch_add(1, Ordering::Relaxed);
        stats.batches.fetch_add(1, Ordering::Relaxed);
        stats
            .checks
            .fetch_add(costs.len() as u64, Ordering::Relaxed);
        let reply: redis::Value = inner.target.invoke(&inv, &pair.key, deadline).await?;
        let request = |error| Failed {
            error,
            fault: Fault::Request,
        };
        parse_batch(
            &array(reply, "batch").map_err(request)?,
            sets,
            costs.len(),
            &inner.node,
        )
        .map_err(request)
    }
}
