//! The one place where a simulation's backend is chosen.

use clap::ValueEnum;
use turnstile_core::{BackendError, Decision, MemoryBackend, Policy};

/// Which backend decides the simulated requests (`--backend`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum BackendKind {
    /// The in-memory backend of `turnstile-core`, with no cap on tracked keys.
    Memory,
}

/// A backend as the simulation uses it: one synchronous check at an explicit time.
pub(crate) trait SimBackend {
    /// Checks `key` against every policy with `cost` units at `t_ms` (ms since the trace's
    /// epoch), all-or-nothing.
    fn decide(
        &self,
        key: &str,
        policies: &[Policy],
        cost: u64,
        t_ms: u64,
    ) -> Result<Decision, BackendError>;
}

impl SimBackend for MemoryBackend {
    fn decide(
        &self,
        key: &str,
        policies: &[Policy],
        cost: u64,
        t_ms: u64,
    ) -> Result<Decision, BackendError> {
        self.decide_at(key, policies, cost, t_ms)
    }
}

/// Opens the backend `kind` names, fresh (no key has any state yet).
pub(crate) fn open(kind: BackendKind) -> Box<dyn SimBackend> {
    match kind {
        // Unbounded: a simulation must never refuse a key for lack of room.
        BackendKind::Memory => Box::new(MemoryBackend::builder().max_keys(None).build()),
    }
}
