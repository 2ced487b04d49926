//! [`Target`]: what a backend talks to, and what it can ask of its connection.

use redis::Value;
use tokio::time::Instant;

use crate::call::Call;
use crate::cluster::{slot_of, ClusterConn};
use crate::conn::NodeConn;
use crate::fault::Failed;

/// What the backend talks to.
pub(crate) enum Target {
    /// A single node, or the primary Sentinels name: one shared multiplexed connection.
    Single(NodeConn),
    /// A Cluster: one shared Cluster connection, health per master.
    Cluster(ClusterConn),
}

impl Target {
    /// Connections made so far (Cluster connections on a Cluster).
    pub(crate) fn connects(&self) -> u64 {
        match self {
            Target::Single(n) => n.connects(),
            Target::Cluster(c) => c.connects(),
        }
    }

    /// The connection generation now: what [`Self::replace`] is given for a call that
    /// begins now.
    pub(crate) fn generation(&self) -> u64 {
        match self {
            Target::Single(n) => n.generation(),
            Target::Cluster(c) => c.generation(),
        }
    }

    /// Whether the probe of a node that counts as down may go now: a connection is ready
    /// and no new one is being made (else one is started, and the probe waits for it).
    pub(crate) fn probe_ready(&self) -> bool {
        match self {
            Target::Single(n) => n.probe_ready(),
            Target::Cluster(c) => c.probe_ready(),
        }
    }

    /// Replaces the connection a call that began at generation `started` used, unless a
    /// newer one serves already: a single node's is dropped at once (it stopped answering;
    /// calls wait for the new one), a Cluster's serves the other masters until the new one is
    /// ready, which leaves the nodes `down` names out of its seeds.
    pub(crate) fn replace(&self, started: u64, down: impl FnOnce() -> Vec<String>) {
        match self {
            Target::Single(n) => n.replace(started),
            Target::Cluster(c) => c.replace(started, down()),
        }
    }

    /// Makes the first connection in the background, ready for the first calls.
    pub(crate) fn warm(&self) {
        match self {
            Target::Single(n) => n.warm(),
            Target::Cluster(c) => c.warm(),
        }
    }

    /// Why there is no connection, when an attempt to make one failed.
    pub(crate) fn unconnected(&self) -> Option<Failed> {
        match self {
            Target::Single(n) => n.unconnected(),
            Target::Cluster(c) => c.unconnected(),
        }
    }

    /// Runs `call`, whose keys are all in the slot of `key`, on its node; nothing is sent
    /// after `deadline`.
    pub(crate) async fn invoke(
        &self,
        call: &Call,
        key: &str,
        deadline: Instant,
    ) -> Result<Value, Failed> {
        match self {
            Target::Single(node) => node.invoke(call, deadline).await,
            Target::Cluster(cluster) => {
                cluster
                    .invoke(call, slot_of(key.as_bytes()), deadline)
                    .await
            }
        }
    }
}
