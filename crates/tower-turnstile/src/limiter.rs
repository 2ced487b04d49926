//! [`Limiter`]: what every service of one layer and their response futures share at run
//! time — the backend, the key extractor, the settings and the counters. (A configuration
//! file is the `config` module's; this is what a layer is made of once built.)

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use std::sync::Arc;

use bytes::Bytes;
use http::Response;
use turnstile_core::wrap::{Fallback, IncidentLog, Share, Ticket, DEFAULT_FALLBACK_MAX_KEYS};
use turnstile_core::{BackendError, Clock, Decision, FailurePolicy, Origin};

use crate::action::Action;
use crate::key::{KeyError, KeyLogging, MissingKey, RequestRef};
use crate::response::{Denial, DenialFn};
use crate::rule::{CompiledRule, CostFn};
use crate::tier::{Chosen, TierFn};

/// How often the layer's own in-memory backends (its default one, the local fallback's)
/// drop their expired keys, without traffic.
pub(crate) const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// The in-memory backend a layer makes for itself (its default, a configuration file's, the
/// local fallback's): it sweeps its expired keys every [`SWEEP_EVERY`] on the runtime of the
/// first request that adds a key, so a flood's keys go without traffic, and stops with the
/// backend. It takes keys of any length: the layer refuses those longer than its own cap
/// before any check.
pub(crate) fn layer_memory() -> turnstile_core::MemoryBackendBuilder {
    turnstile_core::MemoryBackend::builder()
        .max_key_bytes(usize::MAX)
        .sweep_every(SWEEP_EVERY)
}

/// The rate limiter a built layer runs: everything a service and its futures need.
pub(crate) struct Limiter<B, K> {
    /// The backend, behind the local fallback the failure policy asks for.
    pub(crate) backend: Fallback<B>,
    pub(crate) key: K,
    pub(crate) settings: Arc<Settings>,
    /// Shared by every layer derived from one built layer.
    pub(crate) stats: Arc<Stats>,
}

/// A reloadable layer's limiter in force, swapped whole when the file is reloaded.
pub(crate) type LiveLimiter<B, K> = Arc<arc_swap::ArcSwap<Limiter<B, K>>>;

/// The layer's configuration apart from backend and key.
#[derive(Clone)]
pub(crate) struct Settings {
    pub(crate) rules: Box<[CompiledRule]>,
    /// The layer's own policies, the last entry of `rules` when there are any.
    pub(crate) has_default: bool,
    pub(crate) cost: Option<CostFn>,
    pub(crate) exempt_keys: HashSet<Box<str>>,
    pub(crate) action: Action,
    pub(crate) failure: FailurePolicy,
    /// What a key never seen starts a backend outage with, under `FailurePolicy::Local`.
    pub(crate) unknown_share: Share,
    pub(crate) missing_key: MissingKey,
    pub(crate) headers_on_allowed: bool,
    pub(crate) legacy_headers: bool,
    pub(crate) response: Option<DenialFn>,
    /// Chooses each request's tier.
    pub(crate) request_tier: Option<TierFn>,
    pub(crate) key_logging: KeyLogging,
    /// The prepared metric keys of every policy of the rules and tiers.
    pub(crate) metric_keys: Arc<crate::metrics::Keys>,
    /// The longest key taken, in bytes: longer ones are refused before any check.
    pub(crate) max_key_bytes: usize,
}

/// Counters and once-per-incident log flags, shared by every service of one layer.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    /// Backend incidents (errors that reached the layer) and keys with bad state.
    incidents: IncidentLog,
    warned_key: AtomicBool,
    warned_tier: AtomicBool,
    shadow_denied: AtomicU64,
}

impl Stats {
    /// How many requests shadow mode admitted that enforcing would have denied.
    pub(crate) fn shadow_denied(&self) -> u64 {
        self.shadow_denied.load(Ordering::Relaxed)
    }
}

impl Settings {
    /// `backend` behind the local fallback these settings ask for. The fallback's memory
    /// sweeps itself every second once it holds a key; it takes keys of any length, as the
    /// layer refuses those longer than `backend` takes before any check.
    pub(crate) fn fallback<B>(&self, backend: B) -> Fallback<B> {
        let local = layer_memory().max_keys(DEFAULT_FALLBACK_MAX_KEYS).build();
        Fallback::with_local_share(backend, self.failure, local, self.unknown_share)
    }
}

impl<B, K> Limiter<B, K> {
    /// A limiter of `backend`, `key` and `settings` that shares this one's counters and
    /// incident state (a layer derived from this one, or a reloaded configuration).
    pub(crate) fn sharing_stats<B2, K2>(
        &self,
        backend: Fallback<B2>,
        key: K2,
        settings: Arc<Settings>,
    ) -> Limiter<B2, K2> {
        Limiter {
            backend,
            key,
            settings,
            stats: Arc::clone(&self.stats),
        }
    }

    /// The ticket of a check sent now (see [`IncidentLog`]).
    pub(crate) fn ticket(&self) -> Ticket {
        self.stats.incidents.ticket()
    }

    /// Notes an error that reached the layer for a check of `key` sent with `sent`: one
    /// warning per incident; one key's unreadable state is logged at most once per key per
    /// minute, and starts no incident.
    pub(crate) fn backend_failed(&self, e: &BackendError, key: &str, sent: Ticket) {
        if matches!(e, BackendError::InvalidState(_)) {
            let now_ms = self.backend.local().clock().now_ms();
            if self.stats.incidents.bad_key(key, now_ms) {
                tracing::warn!(target: "turnstile", error = %e, key = %self.settings.key_logging.display(key), failure_policy = %self.settings.failure, "rate-limit backend cannot read this key's state; applying the failure policy to it");
            }
        } else if self.stats.incidents.failed(sent) {
            tracing::warn!(target: "turnstile", error = %e, kind = e.kind(), failure_policy = %self.settings.failure, "rate-limit backend failed; applying the failure policy until it recovers");
        }
    }

    /// Notes a decision for a check sent with `sent`: the backend's own answer to a check
    /// sent during an incident ends it, with one line (a deny cache's or a fallback's
    /// answer, or a reply in flight from before, does not).
    #[inline]
    pub(crate) fn backend_ok(&self, decision: &Decision, sent: Ticket) {
        if decision.origin() == Origin::Backend && self.stats.incidents.answered(sent) {
            tracing::info!(target: "turnstile", "rate-limit backend recovered");
        }
    }

    /// Notes a key that could not be extracted: a misconfiguration (no connect info, no
    /// matched route) is logged once per layer, with the fix, whatever [`MissingKey`] then
    /// does with the request.
    pub(crate) fn key_failed(&self, e: &KeyError) {
        if e.is_misconfiguration() && !self.stats.warned_key.swap(true, Ordering::Relaxed) {
            tracing::error!(target: "turnstile", kind = e.kind(), "{e}");
        }
    }

    /// The tier `req` asks for under `rule` (`None`: the rule's own limits). A tier name the
    /// layer does not define counts as none, and the first is logged.
    #[inline]
    pub(crate) fn choose_tier(
        &self,
        settings: &Settings,
        rule: &CompiledRule,
        req: &RequestRef<'_>,
    ) -> Chosen {
        match (&settings.request_tier, &rule.tiers) {
            (Some(f), Some(tiers)) => self.choose_tier_of(f, tiers, req),
            _ => None,
        }
    }

    /// [`Limiter::choose_tier`] where the layer has a request-tier function `f` and the rule
    /// has `tiers`.
    #[inline(never)]
    fn choose_tier_of(
        &self,
        f: &TierFn,
        tiers: &crate::tier::RuleTiers,
        req: &RequestRef<'_>,
    ) -> Chosen {
        let tier = f(req);
        match tiers.choose(&tier) {
            Ok(chosen) => chosen,
            Err(name) => {
                if !self.stats.warned_tier.swap(true, Ordering::Relaxed) {
                    tracing::error!(target: "turnstile", tier = name, "the request-tier function chose a tier this layer does not define; such requests get the rule's policies");
                }
                None
            }
        }
    }

    /// Counts a request shadow mode admitted although enforcing would have denied it.
    pub(crate) fn shadow_denied(&self) {
        self.stats.shadow_denied.fetch_add(1, Ordering::Relaxed);
    }

    /// The cost of `req` under `rule`: the rule's cost function, else the layer's, else 1.
    pub(crate) fn cost(&self, rule: &CompiledRule, req: &RequestRef<'_>) -> u64 {
        match rule.rule.cost.as_ref().or(self.settings.cost.as_ref()) {
            Some(f) => f(req),
            None => 1,
        }
    }

    /// The denial response for `denial`, custom or default, with the rate-limit headers
    /// ([`headers::insert`](crate::headers::insert): `policy_header` for the policies the
    /// check defaulted to).
    pub(crate) fn denial_response(
        &self,
        denial: &Denial<'_>,
        policy_header: &http::HeaderValue,
    ) -> Response<Bytes> {
        let legacy = self.settings.legacy_headers;
        match &self.settings.response {
            Some(f) => {
                let mut res = f(denial);
                crate::headers::insert(res.headers_mut(), policy_header, denial.decision, legacy);
                res
            }
            None => crate::response::default_denial_with_headers(denial, policy_header, legacy),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::{ready, Ready};
    use std::time::Duration;

    use http::Request;
    use tower::{service_fn, Layer, ServiceExt};
    use turnstile_core::{Backend, CheckResult, Limits, SystemClock};

    use crate::key::HeaderKey;
    use crate::RateLimitLayer;

    use super::*;

    /// A backend that is never reachable: every check goes to the local fallback.
    #[derive(Clone)]
    struct Down;

    impl Backend for Down {
        type Future = Ready<CheckResult>;

        fn check_limits(&self, _: &str, _: &Limits, _: u64, _: Option<u64>) -> Self::Future {
            ready(Err(BackendError::Connection("down".into())))
        }
    }

    /// Regression (issue 25, fault 7): the keys a local fallback learned during an outage
    /// stayed until traffic swept them; its memory now sweeps itself, without traffic.
    #[tokio::test(start_paused = true)]
    async fn the_fallbacks_memory_drops_expired_keys_without_traffic() {
        let layer = RateLimitLayer::builder()
            .backend(Down)
            .key(HeaderKey::named("x-client").unwrap())
            .policy("token-bucket:limit=1,period=1s".parse().unwrap())
            .build()
            .unwrap();
        let svc = layer.layer(service_fn(|_: Request<()>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
        }));
        for id in 0..200 {
            let req = Request::builder()
                .header("x-client", format!("c{id}"))
                .body(())
                .unwrap();
            let res = svc.clone().oneshot(req).await.unwrap();
            assert!(res.headers().contains_key("ratelimit"), "decided locally");
        }
        let ended = SystemClock.now_ms();
        let local = layer.limiter.backend.local();
        assert_eq!(local.len(), 200);
        // Fresh 1 s later by the system clock, which the fallback's memory reads.
        while SystemClock.now_ms() <= ended + 1000 {
            std::thread::sleep(Duration::from_millis(20));
        }
        tokio::time::advance(SWEEP_EVERY).await;
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        assert_eq!(local.len(), 0);
    }
}
