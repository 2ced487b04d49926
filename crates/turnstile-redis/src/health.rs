//! Node health: a node counts as down only on evidence — consecutive failed rounds — and one
//! request at a time probes it back.
//!
//! A *round* is a failure of a call that began after the node's previous counted failure:
//! calls that were in flight together when a node stalled (a burst at a window edge, one
//! slow script) fail together and count once. So a node counts as down after
//! `failure_threshold` rounds in a row with no success in between — with the default 3 and
//! timeouts of 100 ms, after about 300 ms of answering nothing, or after 3 refused connections
//! one after the other. Any answer from the node (a decision, or an error about the request
//! itself) ends the streak.
//!
//! While a node is down its checks fail fast with [`NodeDown`]. Once the retry interval has
//! passed, the next check goes through as the probe (the others keep failing fast until it
//! ends): if it succeeds the node is up again, if it fails the node waits another interval.
//!
//! The retry interval gives a node that stopped answering (a timeout) or answered that it is
//! overloaded a rest. A node whose failures were all told at once and say it is away for a
//! moment ([`Fault::quick`]: a refused connection, a connection closed by a restart,
//! `READONLY` or `LOADING` during a failover) is probed again soon instead: after a tenth of
//! how long it has been failing, between 5 ms and 100 ms (never longer than the retry
//! interval), so a fast restart costs no retry interval.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::connector::soon_after;
use crate::fault::Fault;

/// The default number of consecutive failed rounds after which a node counts as down: 3.
pub const DEFAULT_FAILURE_THRESHOLD: u32 = 3;

/// The health settings of one backend.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HealthConfig {
    pub(crate) failure_threshold: u32,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            failure_threshold: DEFAULT_FAILURE_THRESHOLD,
        }
    }
}

/// Why a check failed fast without asking Redis: its node counts as down.
///
/// Carried as the source of a
/// [`BackendError::Connection`](turnstile_core::BackendError::Connection).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeDown {
    node: Arc<str>,
    failures: u32,
    retry_in: Duration,
    /// The probe waits for the node's connection to be replaced.
    replacing: bool,
}

impl NodeDown {
    /// The node, as logs name it (`host:port` on a Cluster, the URL without credentials
    /// otherwise).
    pub fn node(&self) -> &str {
        &self.node
    }

    /// How many failed rounds in a row made it count as down.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// How long until one request probes the node again (zero: a probe is in flight, or
    /// waits for the node's connection to be replaced).
    pub fn retry_in(&self) -> Duration {
        self.retry_in
    }
}

impl fmt::Display for NodeDown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Redis node {} counts as down after {} failed rounds in a row; ",
            self.node, self.failures
        )?;
        if self.replacing {
            f.write_str("its connection is being replaced before a request probes it")
        } else if self.retry_in.is_zero() {
            f.write_str("a probe is in flight")
        } else {
            write!(
                f,
                "one request probes it again in {} ms",
                self.retry_in.as_millis()
            )
        }
    }
}

impl std::error::Error for NodeDown {}

/// The health of one node.
#[derive(Debug)]
pub(crate) struct NodeHealth {
    name: Arc<str>,
    /// Counted failed rounds since the last answer.
    failures: AtomicU32,
    /// Bumped at every counted failure: a call that began before the bump belongs to a
    /// round already counted.
    epoch: AtomicU64,
    down: AtomicBool,
    /// Local time (ms) from which the next probe may go, while down.
    probe_at: AtomicU64,
    probing: AtomicBool,
    /// Local time (ms) of the first counted failure since the last answer.
    since: AtomicU64,
    /// Whether a failure since the last answer was not quick (see [`Fault::quick`]).
    slow: AtomicBool,
}

impl NodeHealth {
    pub(crate) fn new(name: impl Into<Arc<str>>) -> Self {
        NodeHealth {
            name: name.into(),
            failures: AtomicU32::new(0),
            epoch: AtomicU64::new(0),
            down: AtomicBool::new(false),
            probe_at: AtomicU64::new(0),
            probing: AtomicBool::new(false),
            since: AtomicU64::new(0),
            slow: AtomicBool::new(false),
        }
    }

    /// Local time (ms) of the next probe after a failure at `now_ms`: the retry interval
    /// after it when a failure since the last answer was not quick, else soon
    /// ([`soon_after`] how long the node has been failing; at most the retry interval).
    fn next_probe(&self, now_ms: u64, retry: Duration) -> u64 {
        let wait = if self.slow.load(Ordering::Acquire) {
            retry
        } else {
            let failing = now_ms.saturating_sub(self.since.load(Ordering::Acquire));
            soon_after(Duration::from_millis(failing)).min(retry)
        };
        now_ms.saturating_add(u64::try_from(wait.as_millis()).unwrap_or(u64::MAX))
    }

    /// Whether the node counts as down.
    pub(crate) fn is_down(&self) -> bool {
        self.down.load(Ordering::Acquire)
    }

    /// [`Self::begin_at`] at local time `now_ms`.
    #[cfg(test)]
    pub(crate) fn begin(self: &Arc<Self>, now_ms: u64) -> Result<Attempt, NodeDown> {
        self.begin_at(|| now_ms)
    }

    /// Lets a call to this node begin, or refuses it while the node is down and no probe is
    /// due. The local time (ms) is read from `now_ms` only when the node is down: a healthy
    /// node's calls need no clock.
    ///
    /// # Errors
    /// [`NodeDown`] while the node is down and the call is not the probe.
    pub(crate) fn begin_at(
        self: &Arc<Self>,
        now_ms: impl FnOnce() -> u64,
    ) -> Result<Attempt, NodeDown> {
        let epoch = self.epoch.load(Ordering::Acquire);
        let mut probe = false;
        if self.is_down() {
            let now_ms = now_ms();
            let at = self.probe_at.load(Ordering::Acquire);
            if now_ms < at || self.probing.swap(true, Ordering::AcqRel) {
                return Err(NodeDown {
                    node: Arc::clone(&self.name),
                    failures: self.failures.load(Ordering::Relaxed),
                    retry_in: Duration::from_millis(at.saturating_sub(now_ms)),
                    replacing: false,
                });
            }
            probe = true;
        }
        Ok(Attempt {
            node: Arc::clone(self),
            epoch,
            probe,
            settled: false,
        })
    }
}

/// What ending an [`Attempt`] with a failure changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Change {
    /// Nothing: the failure belongs to a round already counted.
    None,
    /// A failed round was counted: this many in a row now, the node not (newly) down.
    Counted(u32),
    /// The node has just come to count as down.
    WentDown,
    /// The probe of a node that counts as down failed.
    ProbeFailed,
}

/// One call to a node, from [`NodeHealth::begin`] to its outcome. Dropped without an outcome
/// (the caller gave up), it changes nothing — except that a probe lets the next request probe.
#[must_use]
#[derive(Debug)]
pub(crate) struct Attempt {
    node: Arc<NodeHealth>,
    epoch: u64,
    probe: bool,
    settled: bool,
}

impl Attempt {
    /// Whether this call is the probe of a node that counts as down.
    pub(crate) fn is_probe(&self) -> bool {
        self.probe
    }

    /// The node answered.
    pub(crate) fn answered(mut self) {
        self.settled = true;
        let n = &*self.node;
        // Read before written: a healthy node's answers leave its line of memory unwritten
        // (shared by every worker thread's calls).
        if n.failures.load(Ordering::Relaxed) != 0 {
            n.failures.store(0, Ordering::Relaxed);
            n.slow.store(false, Ordering::Release);
        }
        if n.down.load(Ordering::Acquire) && n.down.swap(false, Ordering::AcqRel) {
            tracing::info!(node = %n.name, "Redis node answers again; its checks go to it again");
        }
        if self.probe {
            n.probing.store(false, Ordering::Release);
        }
    }

    /// The call failed at local time `now_ms` with `fault`, which counts against the node.
    pub(crate) fn failed(
        mut self,
        now_ms: u64,
        threshold: u32,
        retry: Duration,
        fault: Fault,
    ) -> Change {
        self.settled = true;
        let n = &*self.node;
        if self.probe {
            if !fault.quick() {
                n.slow.store(true, Ordering::Release);
            }
            n.epoch.fetch_add(1, Ordering::AcqRel);
            n.probe_at
                .store(n.next_probe(now_ms, retry), Ordering::Release);
            n.probing.store(false, Ordering::Release);
            return Change::ProbeFailed;
        }
        if n.epoch
            .compare_exchange(
                self.epoch,
                self.epoch + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_err()
        {
            // A call that was in flight with one already counted: the same round.
            return Change::None;
        }
        let failures = n.failures.fetch_add(1, Ordering::AcqRel) + 1;
        if failures == 1 {
            n.since.store(now_ms, Ordering::Release);
            n.slow.store(!fault.quick(), Ordering::Release);
        } else if !fault.quick() {
            n.slow.store(true, Ordering::Release);
        }
        if failures < threshold || n.is_down() {
            return Change::Counted(failures);
        }
        let probe_at = n.next_probe(now_ms, retry);
        n.probe_at.store(probe_at, Ordering::Release);
        if n.down.swap(true, Ordering::AcqRel) {
            return Change::Counted(failures);
        }
        tracing::warn!(
            node = %n.name,
            failures,
            probe_in_ms = probe_at.saturating_sub(now_ms),
            "Redis node counts as down; checks of its keys fail fast, and one probes it after each retry interval (soon, when it only refused connections or said it cannot serve for now)"
        );
        Change::WentDown
    }

    /// The probe does not go yet: the node's connection is being replaced. The next request
    /// probes instead; this one fails fast.
    pub(crate) fn defer(mut self) -> NodeDown {
        self.settled = true;
        let n = &*self.node;
        n.probing.store(false, Ordering::Release);
        NodeDown {
            node: Arc::clone(&n.name),
            failures: n.failures.load(Ordering::Relaxed),
            retry_in: Duration::ZERO,
            replacing: true,
        }
    }

    /// The call ended without saying anything about the node (it was never sent).
    pub(crate) fn release(mut self) {
        self.settled = true;
        if self.probe {
            self.node.probing.store(false, Ordering::Release);
        }
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        if !self.settled && self.probe {
            self.node.probing.store(false, Ordering::Release);
        }
    }
}

/// The health of every node a backend talks to, by name.
#[derive(Debug, Default)]
pub(crate) struct Health {
    nodes: RwLock<HashMap<Arc<str>, Arc<NodeHealth>>>,
}

impl Health {
    /// The health of the node `name`, created healthy the first time.
    pub(crate) fn node(&self, name: &str) -> Arc<NodeHealth> {
        let read = self.nodes.read().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = read.get(name) {
            return Arc::clone(n);
        }
        drop(read);
        let mut write = self.nodes.write().unwrap_or_else(|e| e.into_inner());
        Arc::clone(
            write
                .entry(Arc::from(name))
                .or_insert_with(|| Arc::new(NodeHealth::new(name))),
        )
    }

    /// The names of the nodes that count as down.
    pub(crate) fn down(&self) -> Vec<String> {
        let read = self.nodes.read().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<String> = read
            .iter()
            .filter(|(_, n)| n.is_down())
            .map(|(k, _)| k.to_string())
            .collect();
        v.sort();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RETRY: Duration = Duration::from_millis(1000);
    /// A failure that says nothing quickly: the retry interval applies.
    const SLOW: Fault = Fault::Timeout;

    fn node() -> Arc<NodeHealth> {
        Arc::new(NodeHealth::new("n"))
    }

    #[test]
    fn a_node_counts_as_down_after_three_failed_rounds_in_a_row() {
        let n = node();
        for t in 0..2 {
            let failures = u32::try_from(t).unwrap() + 1;
            assert_eq!(
                n.begin(t).unwrap().failed(t, 3, RETRY, SLOW),
                Change::Counted(failures)
            );
            assert!(!n.is_down());
        }
        assert_eq!(
            n.begin(2).unwrap().failed(2, 3, RETRY, SLOW),
            Change::WentDown
        );
        assert!(n.is_down());
        let err = n.begin(3).unwrap_err();
        assert_eq!(err.failures(), 3);
        assert_eq!(err.retry_in(), Duration::from_millis(999));
        assert_eq!(err.node(), "n");
    }

    #[test]
    fn calls_that_stalled_together_count_as_one_round() {
        let n = node();
        // 256 calls in flight at once, all timing out: one round.
        let calls: Vec<Attempt> = (0..256).map(|_| n.begin(0).unwrap()).collect();
        let changes: Vec<Change> = calls
            .into_iter()
            .map(|c| c.failed(100, 3, RETRY, SLOW))
            .collect();
        assert_eq!(changes[0], Change::Counted(1));
        assert!(changes[1..].iter().all(|c| *c == Change::None));
        assert!(!n.is_down());
        assert!(n.begin(100).is_ok());
    }

    #[test]
    fn an_answer_ends_the_streak() {
        let n = node();
        n.begin(0).unwrap().failed(0, 3, RETRY, SLOW);
        n.begin(1).unwrap().failed(1, 3, RETRY, SLOW);
        n.begin(2).unwrap().answered();
        n.begin(3).unwrap().failed(3, 3, RETRY, SLOW);
        n.begin(4).unwrap().failed(4, 3, RETRY, SLOW);
        assert!(!n.is_down());
    }

    #[test]
    fn one_probe_at_a_time_after_the_retry_interval_brings_the_node_back() {
        let n = node();
        for t in 0..3 {
            let _ = n.begin(t).unwrap().failed(t, 3, RETRY, SLOW);
        }
        assert!(n.begin(1001).is_err(), "before the interval");
        let probe = n.begin(1002).unwrap();
        assert!(probe.is_probe());
        // While the probe is in flight, the others fail fast.
        assert_eq!(n.begin(1003).unwrap_err().retry_in(), Duration::ZERO);
        // A failed probe: another interval.
        assert_eq!(probe.failed(1010, 3, RETRY, SLOW), Change::ProbeFailed);
        assert!(n.begin(2009).is_err());
        let probe = n.begin(2010).unwrap();
        assert!(probe.is_probe());
        probe.answered();
        assert!(!n.is_down());
        assert!(!n.begin(2011).unwrap().is_probe());
    }

    #[test]
    fn a_probe_given_up_lets_the_next_request_probe() {
        let n = node();
        for t in 0..3 {
            let _ = n.begin(t).unwrap().failed(t, 3, RETRY, SLOW);
        }
        drop(n.begin(5000).unwrap());
        assert!(n.begin(5001).unwrap().is_probe());
    }

    #[test]
    fn a_deferred_probe_fails_fast_and_lets_the_next_request_probe() {
        let n = node();
        for t in 0..3 {
            let _ = n.begin(t).unwrap().failed(t, 3, RETRY, SLOW);
        }
        let down = n.begin(1002).unwrap().defer();
        assert_eq!((down.failures(), down.retry_in()), (3, Duration::ZERO));
        assert!(down.to_string().contains("being replaced"), "{down}");
        assert!(n.is_down());
        assert!(n.begin(1003).unwrap().is_probe());
    }

    #[test]
    fn a_node_away_for_a_moment_is_probed_again_soon_not_after_the_retry_interval() {
        // A restart: refused connections from t = 1000 on, nothing timed out.
        let n = node();
        for t in [1000, 1001, 1002] {
            let _ = n.begin(t).unwrap().failed(t, 3, RETRY, Fault::Unreachable);
        }
        assert!(n.is_down());
        // Down for 2 ms: the next probe 5 ms later (the least wait), not 1 s.
        assert_eq!(
            n.begin(1004).unwrap_err().retry_in(),
            Duration::from_millis(3)
        );
        let probe = n.begin(1007).unwrap();
        assert!(probe.is_probe());
        // Failing for 500 ms: a tenth of it.
        assert_eq!(
            probe.failed(1500, 3, RETRY, Fault::Dropped),
            Change::ProbeFailed
        );
        assert_eq!(
            n.begin(1500).unwrap_err().retry_in(),
            Duration::from_millis(50)
        );
        // Failing for 5 s: at most 100 ms.
        let probe = n.begin(6000).unwrap();
        let _ = probe.failed(6000, 3, RETRY, Fault::CannotServe);
        assert_eq!(
            n.begin(6000).unwrap_err().retry_in(),
            Duration::from_millis(100)
        );
        // A probe that timed out: the retry interval from then on, until an answer.
        let probe = n.begin(6100).unwrap();
        let _ = probe.failed(6100, 3, RETRY, SLOW);
        assert_eq!(n.begin(6100).unwrap_err().retry_in(), RETRY);
        let probe = n.begin(7100).unwrap();
        let _ = probe.failed(7100, 3, RETRY, Fault::Unreachable);
        assert_eq!(n.begin(7100).unwrap_err().retry_in(), RETRY);
        n.begin(8100).unwrap().answered();
        assert!(!n.is_down());
        // A new streak starts quick again; one slow failure in it makes it slow.
        for t in [9000, 9001] {
            let _ = n.begin(t).unwrap().failed(t, 3, RETRY, Fault::Unreachable);
        }
        let _ = n.begin(9002).unwrap().failed(9002, 3, RETRY, SLOW);
        assert_eq!(n.begin(9002).unwrap_err().retry_in(), RETRY);
        // Never longer than the retry interval, however short.
        let m = node();
        let _ = m
            .begin(0)
            .unwrap()
            .failed(0, 1, Duration::from_millis(2), Fault::Unreachable);
        assert_eq!(m.begin(0).unwrap_err().retry_in(), Duration::from_millis(2));
    }

    #[test]
    fn threshold_one_is_down_at_the_first_failure() {
        let n = node();
        assert_eq!(
            n.begin(0).unwrap().failed(0, 1, RETRY, SLOW),
            Change::WentDown
        );
        let h = Health::default();
        assert!(Arc::ptr_eq(&h.node("a"), &h.node("a")));
        assert!(h.down().is_empty());
        let a = h.node("a");
        let _ = a.begin(0).unwrap().failed(0, 1, RETRY, SLOW);
        assert_eq!(h.down(), ["a"]);
    }
}
