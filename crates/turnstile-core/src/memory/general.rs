//! The in-memory backend's general path: any configuration (overrides, tiers, unconfigured
//! keys), several policies, sliding windows and logs, policies whose parameters changed.

use std::collections::HashMap;

use super::check::{Place, Request};
use super::entry::{Full, Policies, Slot};
use super::shard::Shard;
use super::table::Table;
use super::MemoryBackend;
use crate::algorithm::{carry_over, eval_all, Eval, State};
use crate::backend::{BackendError, CheckResult};
use crate::decision::{Decision, PolicyDecision};
use crate::few::Few;
use crate::policy::Policy;
use crate::quota::{resolve, Applied, KeyConfig, Resolution, Source, SCAN_MAX};
use crate::shared::SharedPolicy;

/// What a check found in its key's entry for each policy it checks: the slot holding the
/// policy's state (by name), and, where that state was written under other parameters, the
/// state carried over to the policy's (stored only if the request is admitted).
struct Found {
    slot_of: Few<Option<usize>>,
    /// Empty when nothing is carried over; else one per policy.
    carried: Vec<Option<State>>,
}

impl Found {
    /// What `entry` holds for `ps` at `now_ms`.
    fn of(entry: Option<&Full>, ps: &[Policy], policies: &Policies, now_ms: u64) -> Found {
        let slot_of: Few<Option<usize>> = match entry {
            // Many policies: the entry's slots by name, once (linear, not one scan each).
            Some(e) if ps.len() > SCAN_MAX => {
                let by_name: HashMap<&str, usize> = (e.slots.iter().enumerate())
                    .filter_map(|(j, s)| Some((policies.get(s.policy)?.name(), j)))
                    .collect();
                ps.iter().map(|p| by_name.get(p.name()).copied()).collect()
            }
            _ => ps
                .iter()
                .map(|p| entry.and_then(|e| e.slot_named(policies, p.name())))
                .collect(),
        };
        let mut found = Found {
            slot_of,
            carried: Vec::new(),
        };
        // A policy whose parameters changed since its state was written is evaluated on the
        // carried-over state.
        let stale = |i: usize| {
            let slot = found.slot(entry, i)?;
            let written = policies.get(slot.policy)?;
            (!written.same_parameters(&ps[i])).then_some((slot, written))
        };
        if (0..ps.len()).any(|i| stale(i).is_some()) {
            let carried = (0..ps.len())
                .map(|i| stale(i).map(|(s, q)| carry_over(q, &ps[i], &s.state, now_ms)))
                .collect();
            found.carried = carried;
        }
        found
    }

    /// Policy `i`'s slot in `entry`.
    fn slot<'e>(&self, entry: Option<&'e Full>, i: usize) -> Option<&'e Slot> {
        let j = (*self.slot_of.as_slice().get(i)?)?;
        entry?.slots.get(j)
    }

    /// Policy `i`'s state: carried over, or as its slot in `entry` holds it (`None`: fresh).
    fn state<'e>(&'e self, entry: Option<&'e Full>, i: usize) -> Option<&'e State> {
        match self.carried.get(i) {
            Some(Some(c)) => Some(c),
            _ => self.slot(entry, i).map(|s| &s.state),
        }
    }
}

impl<C> MemoryBackend<C> {
    /// The general path: any configuration, any policies. The key's configuration gives
    /// each default policy its parameters (its override's or tier's of the same name, else
    /// the default's; see [`resolve`]), or none apply (a blanket deny or allow); then
    /// [`MemoryBackend::check_set`] decides them, and the decision says where each policy's
    /// parameters came from.
    #[inline(never)]
    pub(super) fn check_general(&self, place: Place<'_>, req: &Request<'_>) -> CheckResult {
        let Place { cell, shard, index } = place;
        // The configuration as the entry holds it (a packed entry has none): unpacked, if
        // at all, by the check of its policies.
        let config = index
            .and_then(|i| shard.table.get(i))
            .and_then(|e| e.head.config());
        let version = config.map_or(0, KeyConfig::version);
        let r = resolve(config, req.defaults, req.tiers, req.mode);
        let (ps, sources): (Vec<Policy>, Vec<Source>) = match &r {
            Resolution::AllDefaults => {
                let place = Place { cell, shard, index };
                return self.check_set(place, req, req.defaults, version);
            }
            Resolution::Unlimited => return Ok(Decision::unlimited(version)),
            Resolution::Denied => return Ok(Decision::unconfigured_denied(version)),
            // Held apart from the entry, which the check may change (an override lives in
            // it).
            Resolution::Picks { picks, .. } => picks
                .iter()
                .filter_map(|&pick| r.policy(pick, config, req.defaults, req.tiers))
                .map(|(p, s)| (p.clone(), s))
                .unzip(),
        };
        let place = Place { cell, shard, index };
        Ok(self
            .check_set(place, req, &ps, version)?
            .with_sources(sources))
    }

    /// Decides `ps` for the key at `place` (of configuration version `version`): every
    /// policy is evaluated on its state (all-or-nothing, `algorithm::eval_all`); the states
    /// are written only when the request is admitted and changes one.
    fn check_set(
        &self,
        place: Place<'_>,
        req: &Request<'_>,
        ps: &[Policy],
        version: u64,
    ) -> CheckResult {
        let Place { cell, shard, index } = place;
        let Shard {
            table, policies, ..
        } = &mut *shard;
        let entry = full_entry(table, policies, index);
        let found = Found::of(entry, ps, policies, req.now.ms);
        let fresh = State::new();
        let state_of = |i: usize| found.state(entry, i).unwrap_or(&fresh);
        let evals = eval_all(ps, state_of, req.now.ms, req.cost);
        let list = evals.as_slice();
        if !list.iter().all(|e| e.allowed) || !list.iter().any(Eval::changes_state) {
            let decisions = ps
                .iter()
                .zip(evals)
                .map(|(p, e)| e.decision(shared(policies, p)))
                .collect();
            if let Some(e) = index.and_then(|i| table.get_mut(i)) {
                e.head.compact(policies);
            }
            return Ok(Decision::from_few_with(
                decisions,
                Applied::Defaults,
                version,
            ));
        }
        let place = Place { cell, shard, index };
        let decisions = self.write_states(place, req, ps, evals, found)?;
        Ok(Decision::from_few_with(
            decisions,
            Applied::Defaults,
            version,
        ))
    }

    /// Stores an admitted request's evaluations `evals` of `ps` (as [`Found`] in the key's
    /// entry, made if missing) and returns each policy's decision.
    fn write_states(
        &self,
        place: Place<'_>,
        req: &Request<'_>,
        ps: &[Policy],
        evals: Few<Eval>,
        found: Found,
    ) -> Result<Few<PolicyDecision>, BackendError> {
        let Place { cell, shard, index } = place;
        let i = self.entry_at(cell, shard, index, &req.at, req.now)?;
        let Shard {
            table, policies, ..
        } = &mut *shard;
        let Some(head) = table.get_mut(i).map(|e| &mut e.head) else {
            return Err(BackendError::InvalidState(
                "the key's entry went missing".into(),
            ));
        };
        let entry = head.full_mut(policies);
        entry.explicit = req.now.explicit;
        let mut carried = found.carried.into_iter();
        let decisions: Few<PolicyDecision> = ps
            .iter()
            .zip(evals)
            .zip(found.slot_of)
            .map(|((p, eval), at)| {
                let slot = slot_for(entry, policies, p, at, carried.next().flatten());
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
        entry.settle(req.now.ms, policies);
        let expires_ms = entry.expires_ms;
        head.compact(policies);
        shard.note(cell, expires_ms, req.now.explicit);
        Ok(decisions)
    }
}

/// The key's entry at `index` as a [`Full`] entry (a packed one converted first).
fn full_entry<'t>(
    table: &'t mut Table,
    policies: &Policies,
    index: Option<usize>,
) -> Option<&'t Full> {
    let e = table.get_mut(index?)?;
    Some(&*e.head.full_mut(policies))
}

/// The slot of `p` in `entry`: the one found (`at`), or a new one appended (slots found keep
/// their places: new ones only ever go at the end). A state `carried` over to `p`'s
/// parameters replaces the slot's, which then refers to `p`.
fn slot_for<'e>(
    entry: &'e mut Full,
    policies: &mut Policies,
    p: &Policy,
    at: Option<usize>,
    carried: Option<State>,
) -> &'e mut Slot {
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
        slot.carried(policies, p, c);
    }
    slot
}

/// The shard's shared copy of `p`, interned if new.
fn shared(policies: &mut Policies, p: &Policy) -> SharedPolicy {
    let id = policies.intern(p);
    policies
        .get(id)
        .cloned()
        .unwrap_or_else(|| SharedPolicy::new(p.clone()))
}
