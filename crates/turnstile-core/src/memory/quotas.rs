//! The in-memory backend's live-quota operations ([`Quotas`]).

use std::future::{ready, Future};
use std::sync::Arc;

use super::entry::{expires_at, Full, Policies};
use super::sweep::Now;
use super::MemoryBackend;
use crate::algorithm::{carry_over, refund};
use crate::backend::{check_key_len, BackendError, CheckResult, Quotas};
use crate::clock::Clock;
use crate::policy::Policy;
use crate::quota::{validate_policy_set, validate_tier_name, KeyConfig, Limits};

impl<C: Clock> MemoryBackend<C> {
    /// Gives `cost` units back to `key` at `now` (see [`Quotas::refund`]).
    fn refund_now(&self, key: &str, limits: &Limits, cost: u64, now: Now) -> CheckResult {
        self.fits(key)?;
        let now_ms = now.ms;
        self.change_applying(key, limits, now, |entry, interned, policies| {
            for p in policies {
                let Some(j) = entry.slot_named(interned, p.name()) else {
                    continue;
                };
                let slot = &mut entry.slots[j];
                if let Some(q) = interned.get(slot.policy).filter(|q| !q.same_parameters(p)) {
                    let carried = carry_over(q, p, &slot.state, now_ms);
                    slot.carried(interned, p, carried);
                }
                refund(p, &mut slot.state, now_ms, cost);
                slot.expires_ms = expires_at(p, &slot.state);
            }
        })?;
        self.query(key, limits, now)
    }

    /// Forgets the state of every policy that applies to `key` at `now` (see
    /// [`Quotas::reset`]).
    fn reset_now(&self, key: &str, limits: &Limits, now: Now) -> CheckResult {
        self.fits(key)?;
        self.change_applying(key, limits, now, |entry, interned, policies| {
            entry.slots.retain(|s| {
                let named = interned
                    .get(s.policy)
                    .is_some_and(|q| policies.iter().any(|p| p.name() == q.name()));
                if named {
                    interned.release(s.policy);
                }
                !named
            });
        })?;
        self.query(key, limits, now)
    }

    /// Changes the states of the policies that apply to `key` (as its configuration resolves
    /// `limits`) at `now` with `change`, which gets the key's entry (made if missing), the
    /// shard's policies and those that apply; then bumps the key's version.
    fn change_applying(
        &self,
        key: &str,
        limits: &Limits,
        now: Now,
        change: impl FnOnce(&mut Full, &mut Policies, &[Policy]),
    ) -> Result<(), BackendError> {
        let (cell, mut shard, at) = self.shard(key);
        let shard = &mut *shard;
        let index = shard.table.find(at.hash, &at.probe);
        let config = index
            .and_then(|i| shard.table.get(i))
            .and_then(|e| e.head.config());
        // Held apart from the entry, which `change` changes (its override among others).
        let policies: Vec<Policy> = limits.resolve(config).into_iter().map(|(p, _)| p).collect();
        let i = self.entry_at(cell, shard, index, &at, now)?;
        let Some(head) = shard.table.get_mut(i).map(|e| &mut e.head) else {
            return Err(missing());
        };
        let interned = &mut shard.policies;
        let entry = head.full_mut(interned);
        entry.explicit = now.explicit;
        change(entry, interned, &policies);
        entry.bump_version(now.ms);
        entry.settle(now.ms, interned);
        let expires_ms = entry.expires_ms;
        head.compact(interned);
        shard.note(cell, expires_ms, now.explicit);
        Ok(())
    }

    /// A query (cost 0) of `key` at `now`, on the same time base.
    fn query(&self, key: &str, limits: &Limits, now: Now) -> CheckResult {
        self.check_inner::<CheckResult>(
            key,
            limits.defaults(),
            limits.tier_slice(),
            limits.mode(),
            0,
            now,
        )
    }

    /// Whether `key` is within the backend's cap on key bytes.
    fn fits(&self, key: &str) -> Result<(), BackendError> {
        check_key_len(key, self.inner.max_key_bytes)
    }

    /// The stored configuration of `key` (empty when it has none).
    fn config_now(&self, key: &str) -> Result<KeyConfig, BackendError> {
        self.fits(key)?;
        let (_, shard, at) = self.shard(key);
        Ok(shard
            .table
            .find(at.hash, &at.probe)
            .and_then(|i| shard.table.get(i))
            .and_then(|e| e.head.config().cloned())
            .unwrap_or_default())
    }

    /// Changes `key`'s configuration with `change` and bumps its version.
    fn configure(
        &self,
        key: &str,
        change: impl FnOnce(&mut KeyConfig),
    ) -> Result<KeyConfig, BackendError> {
        self.fits(key)?;
        let now = self.now(None);
        let (cell, mut shard, at) = self.shard(key);
        let shard = &mut *shard;
        let i = self.entry_mut(cell, shard, &at, now)?;
        let (config, expires_ms, explicit) = {
            let Some(head) = shard.table.get_mut(i).map(|e| &mut e.head) else {
                return Err(missing());
            };
            let entry = head.full_mut(&shard.policies);
            change(entry.config.get_or_insert_with(Box::default));
            entry.bump_version(now.ms);
            // No slot is dropped here: states may be timed on another clock (explicit times).
            entry.settle(0, &mut shard.policies);
            let config = entry.config.as_deref().cloned().unwrap_or_default();
            (config, entry.expires_ms, entry.explicit)
        };
        shard.note(cell, expires_ms, explicit);
        Ok(config)
    }
}

/// The error for an entry that vanished under its own shard's lock: never happens.
fn missing() -> BackendError {
    BackendError::InvalidState("the key's entry went missing".into())
}

impl<C: Clock> Quotas for MemoryBackend<C> {
    fn reset(
        &self,
        key: &str,
        limits: &Limits,
        now_ms: Option<u64>,
    ) -> impl Future<Output = CheckResult> + Send {
        ready(self.reset_now(key, limits, self.now(now_ms)))
    }

    fn refund(
        &self,
        key: &str,
        limits: &Limits,
        cost: u64,
        now_ms: Option<u64>,
    ) -> impl Future<Output = CheckResult> + Send {
        ready(self.refund_now(key, limits, cost, self.now(now_ms)))
    }

    fn config(&self, key: &str) -> impl Future<Output = Result<KeyConfig, BackendError>> + Send {
        ready(self.config_now(key))
    }

    fn set_override(
        &self,
        key: &str,
        policies: &[Policy],
    ) -> impl Future<Output = Result<KeyConfig, BackendError>> + Send {
        ready(
            validate_policy_set(policies)
                .map_err(|e| BackendError::InvalidRequest(e.to_string()))
                .and_then(|()| {
                    self.configure(key, |c| c.policies = Some(Arc::from(policies.to_vec())))
                }),
        )
    }

    fn remove_override(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<KeyConfig, BackendError>> + Send {
        ready(self.configure(key, |c| c.policies = None))
    }

    fn set_tier(
        &self,
        key: &str,
        tier: Option<&str>,
    ) -> impl Future<Output = Result<KeyConfig, BackendError>> + Send {
        let valid = match tier {
            Some(t) => {
                validate_tier_name(t).map_err(|e| BackendError::InvalidRequest(e.to_string()))
            }
            None => Ok(()),
        };
        ready(valid.and_then(|()| self.configure(key, |c| c.tier = tier.map(Arc::from))))
    }

    fn clear_config(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<KeyConfig, BackendError>> + Send {
        ready(self.configure(key, |c| {
            c.policies = None;
            c.tier = None;
        }))
    }
}

impl<C> MemoryBackend<C> {
    /// Drops `key`'s state under each of `policies` (by name), keeping its configuration and
    /// version: for a local fallback priming a key from what the backend last said.
    pub(crate) fn forget_policies<'p>(
        &self,
        key: &str,
        policies: impl IntoIterator<Item = &'p Policy>,
        now_ms: u64,
    ) {
        let (cell, mut shard, at) = self.shard(key);
        let shard = &mut *shard;
        let Some(i) = shard.table.find(at.hash, &at.probe) else {
            return;
        };
        let Some(head) = shard.table.get_mut(i).map(|e| &mut e.head) else {
            return;
        };
        let interned = &mut shard.policies;
        let entry = head.full_mut(interned);
        for p in policies {
            entry.slots.retain(|s| {
                let named = interned.get(s.policy).is_some_and(|q| q.name() == p.name());
                if named {
                    interned.release(s.policy);
                }
                !named
            });
        }
        entry.settle(now_ms, interned);
        let (expires_ms, explicit) = (entry.expires_ms, entry.explicit);
        head.compact(interned);
        shard.note(cell, expires_ms, explicit);
    }
}
