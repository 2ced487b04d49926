//! Policies that decisions share instead of each holding a copy, and their interning.

use std::collections::HashSet;
use std::fmt;
use std::ops::Deref;
use std::sync::{Arc, Mutex};

use crate::policy::Policy;

/// A policy that decisions share instead of each holding a copy: moving one moves a
/// pointer. Policies the in-memory backend decides by are interned for the life of the
/// process ([`SharedPolicy::interned`]), so its decisions carry them without counting
/// references (no atomic operation per decision); other decisions (the Redis backend's, the
/// pure `algorithm` functions') hold a reference-counted copy.
#[derive(Clone)]
pub(crate) enum SharedPolicy {
    Interned(&'static Policy),
    Counted(Arc<Policy>),
}

/// How many distinct policies (name and parameters) [`SharedPolicy::interned`] keeps for
/// the life of the process: a few MB at most (a policy with its name is at most about
/// 300 bytes), far more than any configuration holds. Beyond it, policies are shared by
/// reference count instead.
const MAX_INTERNED: usize = 16_384;

impl SharedPolicy {
    /// A reference-counted copy of `policy`.
    pub(crate) fn new(policy: Policy) -> Self {
        SharedPolicy::Counted(Arc::new(policy))
    }

    /// `policy` interned: every call with an equal policy (name and parameters) gives the
    /// same copy, kept for the life of the process — up to [`MAX_INTERNED`] distinct ones,
    /// then a reference-counted copy. Takes a process-wide lock: call it when a policy is
    /// first seen (the in-memory backend does once per shard), not per decision.
    pub(crate) fn interned(policy: &Policy) -> Self {
        static INTERNED: Mutex<Option<HashSet<&'static Policy>>> = Mutex::new(None);
        let mut set = INTERNED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let set = set.get_or_insert_with(HashSet::new);
        if let Some(&p) = set.get(policy) {
            return SharedPolicy::Interned(p);
        }
        if set.len() >= MAX_INTERNED {
            return SharedPolicy::new(policy.clone());
        }
        let p: &'static Policy = Box::leak(Box::new(policy.clone()));
        set.insert(p);
        SharedPolicy::Interned(p)
    }
}

impl SharedPolicy {
    /// [`Policy::identity`] of the policy.
    pub(crate) fn identity(&self) -> (usize, [u64; 2]) {
        (**self).identity()
    }
}

impl Deref for SharedPolicy {
    type Target = Policy;

    #[inline]
    fn deref(&self) -> &Policy {
        match self {
            SharedPolicy::Interned(p) => p,
            SharedPolicy::Counted(p) => p,
        }
    }
}

impl PartialEq for SharedPolicy {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for SharedPolicy {}

impl fmt::Debug for SharedPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        (**self).fmt(f)
    }
}
