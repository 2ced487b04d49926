//! The in-memory backend's general path: any configuration (overrides, tiers, unconfigured
//! keys), several policies, sliding windows and logs, policies whose parameters changed.

use std::sync::Arc;

use super::entry::{Head, Policies, Slot};
use super::sweep::Now;
use super::{Lookup, MemoryBackend, Shard, ShardCell};
use crate::algorithm::{carry_over, eval_all, Eval, State};
use crate::backend::BackendError;
use crate::decision::{Decision, PolicyDecision};
use crate::few::Few;
use crate::policy::Policy;
use crate::quota::{resolve_which, Applied, KeyConfig, Tier, Unconfigured, Which};
use crate::shared::SharedPolicy;

impl<C> MemoryBackend<C> {
    /// The general path: any configuration, any policies.
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    pub(super) fn check_full(
        &self,
        cell: &ShardCell,
        shard: &mut Shard,
        index: Option<usize>,
        at: &Lookup<'_>,
        defaults: &[Policy],
        tiers: &[Tier],
        unconfigured: Unconfigured,
        cost: u64,
        now: Now,
    ) -> Result<Decision, BackendError> {
        let now_ms = now.ms;
        let Shard {
            table, policies, ..
        } = &mut *shard;
        if let Some(e) = index.and_then(|i| table.get_mut(i)) {
            e.head.full_mut(policies);
        }
        let entry = index
            .and_then(|i| table.get(i))
            .and_then(|e| match &e.head {
                Head::Full(f) => Some(&**f),
                Head::One { .. } => None,
            });
        let config = entry.and_then(|e| e.config.as_deref());
        let version = config.map_or(0, KeyConfig::version);
        let (which, applied) = resolve_which(config, tiers, unconfigured);
        // An override lives in the entry written below: hold it by its own `Arc`.
        let own: Option<Arc<[Policy]>> = match which {
            Which::Override => config.and_then(|c| c.policies.clone()),
            _ => None,
        };
        let policies_checked: &[Policy] = match (&own, which) {
            (Some(o), _) => o,
            (None, Which::Tier(i)) => &tiers[i].1,
            (None, Which::Defaults) => defaults,
            _ => {
                return Ok(match applied {
                    Applied::Unlimited => Decision::unlimited(version),
                    _ => Decision::unconfigured_denied(version),
                })
            }
        };
        let ps = policies_checked;
        // Each policy's slot in the entry, looked up once.
        let slot_of: Few<Option<usize>> = ps
            .iter()
            .map(|p| {
                entry.and_then(|e| {
                    e.slots
                        .iter()
                        .position(|s| policies.get(s.policy).is_some_and(|q| q.name() == p.name()))
                })
            })
            .collect();
        let slot = |i: usize| -> Option<&Slot> {
            let j = (*slot_of.as_slice().get(i)?)?;
            entry.map(|e| &e.slots[j])
        };
        let written_under = |i: usize| slot(i).and_then(|s| policies.get(s.policy));
        // A policy whose parameters changed since its state was written is evaluated on the
        // carried-over state (stored only if this request is admitted).
        let stale = |i: usize| {
            slot(i)
                .zip(written_under(i))
                .filter(|(_, q)| !q.same_parameters(&ps[i]))
        };
        let carried: Vec<Option<State>> = if (0..ps.len()).any(|i| stale(i).is_some()) {
            (0..ps.len())
                .map(|i| stale(i).map(|(s, q)| carry_over(q, &ps[i], &s.state, now_ms)))
                .collect()
        } else {
            Vec::new()
        };
        let fresh = State::new();
        let state_of = |i: usize| -> &State {
            match carried.get(i) {
                Some(Some(c)) => c,
                _ => slot(i).map_or(&fresh, |s| &s.state),
            }
        };
        let evals = eval_all(ps, state_of, now_ms, cost);
        let admitted = evals.as_slice().iter().all(|e| e.allowed);
        if !admitted || !evals.as_slice().iter().any(Eval::changes_state) {
            let decisions = ps
                .iter()
                .zip(evals)
                .map(|(p, e)| e.decision(shared(policies, p)))
                .collect();
            if let Some(e) = index.and_then(|i| table.get_mut(i)) {
                e.head.compact(policies);
            }
            return Ok(Decision::from_few_with(decisions, applied, version));
        }

        let i = self.entry_at(cell, shard, index, at, now)?;
        let Shard {
            table, policies, ..
        } = &mut *shard;
        let Some(head) = table.get_mut(i).map(|e| &mut e.head) else {
            return Err(BackendError::InvalidState(
                "the key's entry went missing".into(),
            ));
        };
        let entry = head.full_mut(policies);
        entry.explicit = now.explicit;
        let mut carried = carried.into_iter();
        let decisions: Few<PolicyDecision> = ps
            .iter()
            .zip(evals)
            .zip(slot_of)
            .map(|((p, eval), at)| {
                let carried = carried.next().flatten();
                // Slots found above keep their places: new ones are only appended.
                let j = match at {
                    Some(j) => j,
                    None => {
                        let id = policies.intern(p);
                        policies.acquire(id);
                        // Exactly one more: a first push would otherwise reserve room for four.
                        entry.slots.reserve_exact(1);
                        entry.slots.push(Slot {
                            policy: id,
                            expires_ms: 0,
                            state: State::new(),
                        });
                        entry.slots.len() - 1
                    }
                };
                let slot = &mut entry.slots[j];
                if let Some(c) = carried {
                    let id = policies.intern(p);
                    policies.acquire(id);
                    policies.release(slot.policy);
                    slot.policy = id;
                    slot.state = c;
                }
                if eval.changes_state() {
                    slot.expires_ms = eval.expires_at_ms;
                }
                eval.apply(&mut slot.state);
                let policy = policies
                    .get(slot.policy)
                    .cloned()
                    .unwrap_or_else(|| SharedPolicy::new(p.clone()));
                eval.decision(policy)
            })
            .collect();
        entry.settle(now_ms, policies);
        let expires_ms = entry.expires_ms;
        head.compact(policies);
        shard.note(cell, expires_ms, now.explicit);
        Ok(Decision::from_few_with(decisions, applied, version))
    }
}

/// The shard's shared copy of `p`, interned if new.
fn shared(policies: &mut Policies, p: &Policy) -> SharedPolicy {
    let id = policies.intern(p);
    policies
        .get(id)
        .cloned()
        .unwrap_or_else(|| SharedPolicy::new(p.clone()))
}
