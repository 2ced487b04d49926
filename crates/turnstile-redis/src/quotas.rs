//! [`RedisBackend`]'s live-quota operations ([`Quotas`]).

use std::future::Future;

use turnstile_core::{BackendError, CheckResult, Clock, KeyConfig, Limits, Policy, Quotas};

use crate::backend::{sets, tier_list, RedisBackend};
use crate::wire::{encode_override, Op};

impl<C: Clock> RedisBackend<C> {
    /// Runs `op` of the check script for `key`, bounded by the timeout.
    async fn quota_op(
        &self,
        key: &str,
        limits: &Limits,
        op: Op,
        cost: u64,
        now_ms: Option<u64>,
    ) -> CheckResult {
        let tiers = tier_list(limits);
        let fut = self.call(key, sets(limits, &tiers), op, cost, now_ms);
        Ok(self.timed(fut).await?.1)
    }
}

impl<C: Clock> Quotas for RedisBackend<C> {
    fn reset(
        &self,
        key: &str,
        limits: &Limits,
        now_ms: Option<u64>,
    ) -> impl Future<Output = CheckResult> + Send {
        self.quota_op(key, limits, Op::Reset, 0, now_ms)
    }

    fn refund(
        &self,
        key: &str,
        limits: &Limits,
        cost: u64,
        now_ms: Option<u64>,
    ) -> impl Future<Output = CheckResult> + Send {
        self.quota_op(key, limits, Op::Refund, cost, now_ms)
    }

    fn config(&self, key: &str) -> impl Future<Output = Result<KeyConfig, BackendError>> + Send {
        self.configure(key, &["get"])
    }

    async fn set_override(
        &self,
        key: &str,
        policies: &[Policy],
    ) -> Result<KeyConfig, BackendError> {
        turnstile_core::quota::validate_policy_set(policies)
            .map_err(|e| BackendError::InvalidRequest(e.to_string()))?;
        self.configure(key, &["set", "o", &encode_override(policies)])
            .await
    }

    fn remove_override(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<KeyConfig, BackendError>> + Send {
        self.configure(key, &["set", "o", ""])
    }

    async fn set_tier(&self, key: &str, tier: Option<&str>) -> Result<KeyConfig, BackendError> {
        if let Some(t) = tier {
            turnstile_core::quota::validate_tier_name(t)
                .map_err(|e| BackendError::InvalidRequest(e.to_string()))?;
        }
        self.configure(key, &["set", "t", tier.unwrap_or("")]).await
    }

    fn clear_config(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<KeyConfig, BackendError>> + Send {
        self.configure(key, &["clear"])
    }
}
