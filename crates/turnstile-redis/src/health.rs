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

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

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

    /// How long until one request probes the node again (zero: a probe is in flight).
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
        if self.retry_in.is_zero() {
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
        }
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

/// What ending an [`Attempt`] changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Change {
    None,
    /// The node has just come to count as down.
    WentDown,
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
        }
        if n.down.load(Ordering::Acquire) && n.down.swap(false, Ordering::AcqRel) {
            tracing::info!(node = %n.name, "Redis node answers again; its checks go to it again");
        }
        if self.probe {
            n.probing.store(false, Ordering::Release);
        }
    }

    /// The call failed at local time `now_ms` in a way that counts against the node.
    pub(crate) fn failed(mut self, now_ms: u64, threshold: u32, retry: Duration) -> Change {
        self.settled = true;
        let n = &*self.node;
        let retry_ms = u64::try_from(retry.as_millis()).unwrap_or(u64::MAX);
        let probe_at = now_ms.saturating_add(retry_ms);
        if self.probe {
            n.epoch.fetch_add(1, Ordering::AcqRel);
            n.probe_at.store(probe_at, Ordering::Release);
            n.probing.store(false, Ordering::Release);
            return Change::None;
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
        if failures < threshold || n.is_down() {
            return Change::None;
        }
        n.probe_at.store(probe_at, Ordering::Release);
        if n.down.swap(true, Ordering::AcqRel) {
            return Change::None;
        }
        tracing::warn!(
            node = %n.name,
            failures,
            retry_ms,
            "Redis node counts as down; checks of its keys fail fast, and one probes it after each retry interval"
        );
        Change::WentDown
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

    fn node() -> Arc<NodeHealth> {
        Arc::new(NodeHealth::new("n"))
    }

    #[test]
    fn a_node_counts_as_down_after_three_failed_rounds_in_a_row() {
        let n = node();
        for t in 0..2 {
            assert_eq!(n.begin(t).unwrap().failed(t, 3, RETRY), Change::None);
            assert!(!n.is_down());
        }
        assert_eq!(n.begin(2).unwrap().failed(2, 3, RETRY), Change::WentDown);
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
        for c in calls {
            assert_eq!(c.failed(100, 3, RETRY), Change::None);
        }
        assert!(!n.is_down());
        assert!(n.begin(100).is_ok());
    }

    #[test]
    fn an_answer_ends_the_streak() {
        let n = node();
        n.begin(0).unwrap().failed(0, 3, RETRY);
        n.begin(1).unwrap().failed(1, 3, RETRY);
        n.begin(2).unwrap().answered();
        n.begin(3).unwrap().failed(3, 3, RETRY);
        n.begin(4).unwrap().failed(4, 3, RETRY);
        assert!(!n.is_down());
    }

    #[test]
    fn one_probe_at_a_time_after_the_retry_interval_brings_the_node_back() {
        let n = node();
        for t in 0..3 {
            let _ = n.begin(t).unwrap().failed(t, 3, RETRY);
        }
        assert!(n.begin(1001).is_err(), "before the interval");
        let probe = n.begin(1002).unwrap();
        assert!(probe.is_probe());
        // While the probe is in flight, the others fail fast.
        assert_eq!(n.begin(1003).unwrap_err().retry_in(), Duration::ZERO);
        // A failed probe: another interval.
        assert_eq!(probe.failed(1010, 3, RETRY), Change::None);
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
            let _ = n.begin(t).unwrap().failed(t, 3, RETRY);
        }
        drop(n.begin(5000).unwrap());
        assert!(n.begin(5001).unwrap().is_probe());
    }

    #[test]
    fn threshold_one_is_down_at_the_first_failure() {
        let n = node();
        assert_eq!(n.begin(0).unwrap().failed(0, 1, RETRY), Change::WentDown);
        let h = Health::default();
        assert!(Arc::ptr_eq(&h.node("a"), &h.node("a")));
        assert!(h.down().is_empty());
        let a = h.node("a");
        let _ = a.begin(0).unwrap().failed(0, 1, RETRY);
        assert_eq!(h.down(), ["a"]);
    }
}
