//! The in-memory backend's live-quota operations ([`Quotas`]).

use std::future::{ready, Future};
use std::sync::Arc;

use super::{MemoryBackend, Now};
use crate::algorithm::{carry_over, evaluate, refund};
use crate::backend::{BackendError, CheckResult, Quotas};
use crate::clock::Clock;
use crate::policy::Policy;
use crate::quota::{validate_policy_set, validate_tier_name, KeyConfig, Limits};

impl<C: Clock> MemoryBackend<C> {
    /// Gives `cost` units back to `key` at `now` (see [`Quotas::refund`]).
    fn refund_now(&self, key: &str, limits: &Limits, cost: u64, now: Now) -> CheckResult {
        let now_ms = now.ms;
        {
            let mut shard = self.shard(key);
            let config = shard.map.get(key).and_then(|e| e.config.as_deref());
            let (policies, _) = limits.resolve(config);
            let policies: Vec<Policy> = policies.map(<[Policy]>::to_vec).unwrap_or_default();
            let entry = self.entry_mut(&mut shard, key, now)?;
            entry.explicit = now.explicit;
            for p in &policies {
                let Some(i) = entry.slots.iter().position(|s| s.policy.name() == p.name()) else {
                    continue;
                };
                let slot = &mut entry.slots[i];
                if slot.stale_for(p) {
                    slot.state = carry_over(&slot.policy, p, &slot.state, now_ms);
                    slot.policy = p.clone();
                }
                refund(p, &mut slot.state, now_ms, cost);
                slot.expires_ms = evaluate(p, &slot.state, now_ms, 0).expires_at_ms();
            }
            entry.bump_version(now_ms);
            entry.settle(now_ms);
        }
        self.query(key, limits, now)
    }

    /// Forgets the state of every policy that applies to `key` at `now` (see
    /// [`Quotas::reset`]).
    fn reset_now(&self, key: &str, limits: &Limits, now: Now) -> CheckResult {
        let now_ms = now.ms;
        {
            let mut shard = self.shard(key);
            let config = shard.map.get(key).and_then(|e| e.config.as_deref());
            let (policies, _) = limits.resolve(config);
            let names: Vec<Arc<str>> = policies
                .unwrap_or_default()
                .iter()
                .map(|p| Arc::clone(p.name_arc()))
                .collect();
            let entry = self.entry_mut(&mut shard, key, now)?;
            entry.explicit = now.explicit;
            entry
                .slots
                .retain(|s| !names.iter().any(|n| **n == *s.policy.name()));
            entry.bump_version(now_ms);
            entry.settle(now_ms);
        }
        self.query(key, limits, now)
    }

    /// A query (cost 0) of `key` at `now`, on the same time base.
    fn query(&self, key: &str, limits: &Limits, now: Now) -> CheckResult {
        self.check_inner(
            key,
            limits.defaults(),
            limits.tier_slice(),
            limits.unconfigured(),
            0,
            now,
        )
    }

    /// The stored configuration of `key` (empty when it has none).
    fn config_now(&self, key: &str) -> KeyConfig {
        let shard = self.shard(key);
        shard
            .map
            .get(key)
            .and_then(|e| e.config.as_deref().cloned())
            .unwrap_or_default()
    }

    /// Changes `key`'s configuration with `change` and bumps its version.
    fn configure(
        &self,
        key: &str,
        change: impl FnOnce(&mut KeyConfig),
    ) -> Result<KeyConfig, BackendError> {
        let now = self.now(None);
        let mut shard = self.shard(key);
        let entry = self.entry_mut(&mut shard, key, now)?;
        change(entry.config.get_or_insert_with(Box::default));
        entry.bump_version(now.ms);
        // No slot is dropped here: states may be timed on another clock (explicit times).
        entry.settle(0);
        Ok(entry.config.as_deref().cloned().unwrap_or_default())
    }
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
        ready(Ok(self.config_now(key)))
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
        let mut shard = self.shard(key);
        let Some(entry) = shard.map.get_mut(key) else {
            return;
        };
        for p in policies {
            entry.slots.retain(|s| s.policy.name() != p.name());
        }
        entry.settle(now_ms);
    }
}
