//! Metrics: every name and label turnstile records through the [`metrics`] facade (feature
//! `metrics`), so any exporter — Prometheus, StatsD, OpenTelemetry — can publish them.
//!
//! [`metrics`]: https://docs.rs/metrics
//!
//! The names follow Prometheus conventions (`_total` on counters, the unit in the name) and
//! every label takes a bounded set of values: never the client key. Policy names are bounded
//! by configuration (the rules, tiers and overrides an operator defines). Each name, label
//! and fixed label value is a constant, declared once in [`turnstile_core::metric_names`]
//! and re-exported here, so the crates that record them and the dashboards that read them
//! agree.
//!
//! | name | constant | type | labels | what |
//! | --- | --- | --- | --- | --- |
//! | `turnstile_decisions_total` | [`DECISIONS_TOTAL`] | counter | `policy` ([`LABEL_POLICY`]), `outcome` ([`LABEL_OUTCOME`]) | one per policy per checked request, see below |
//! | `turnstile_backend_check_duration_seconds` | [`BACKEND_CHECK_DURATION_SECONDS`] | histogram | — | how long each backend check took, measured in the layer around the backend's future (every backend; a request [`Action::Delay`](crate::Action::Delay) re-checks is measured per check) |
//! | `turnstile_backend_errors_total` | [`BACKEND_ERRORS_TOTAL`] | counter | `kind` ([`LABEL_KIND`]) | backend errors that reached the layer (and its [`FailurePolicy`](crate::FailurePolicy)), by [`BackendError::kind`](crate::BackendError::kind): `capacity_exceeded`, `timeout`, `connection`, `script`, `invalid_state`, `invalid_request`, `key_too_long` |
//! | `turnstile_missing_key_total` | [`MISSING_KEY_TOTAL`] | counter | `reason` ([`LABEL_REASON`]) | requests whose key could not be extracted, by [`KeyError::kind`](crate::KeyError::kind): `missing_peer_addr`, `missing_header`, `missing_matched_path`, `not_grpc`, `rejected` (whatever [`MissingKey`](crate::MissingKey) then did), `too_long` (a key longer than the backend takes, always refused) |
//! | `turnstile_fallback_activations_total` | [`FALLBACK_ACTIVATIONS_TOTAL`] | counter | `kind` ([`LABEL_KIND`]) | recorded by the Redis backend: incidents in which it began deciding with its local in-memory fallback, by the error kind that started them |
//! | `turnstile_fallback_decisions_total` | [`FALLBACK_DECISIONS_TOTAL`] | counter | — | recorded by the Redis backend: checks its local fallback decided |
//! | `turnstile_memory_keys` | [`MEMORY_KEYS`] | gauge | — | recorded by the in-memory backend: keys it tracks (every in-memory backend of the process together, the Redis backend's fallback included) |
//! | `turnstile_deny_cache_hits_total` | [`DENY_CACHE_HITS_TOTAL`] | counter | — | recorded by the backend's deny cache: checks it denied locally without asking the backend |
//!
//! `turnstile_decisions_total` counts, for each request the layer checked, the policies that
//! decided it, each under its own name (`policy`) with the request's `outcome`:
//!
//! | `outcome` | the request | counted under |
//! | --- | --- | --- |
//! | `allowed` ([`OUTCOME_ALLOWED`]) | admitted at once | every policy checked |
//! | `delayed` ([`OUTCOME_DELAYED`]) | admitted after waiting (a leaky bucket's `delay`, or [`Action::Delay`](crate::Action::Delay)'s re-checks) | every policy checked |
//! | `denied` ([`OUTCOME_DENIED`]) | rejected | each policy that denied it (a policy that would have admitted it gave nothing, and is not counted) |
//! | `shadow_denied` ([`OUTCOME_SHADOW_DENIED`]) | admitted by [`Action::Shadow`](crate::Action::Shadow), though enforcing would have rejected it | each policy that denied it |
//!
//! So for a rule with one policy the series of that policy add up to the requests the rule
//! checked; with several policies, use one policy's series to count requests. A key without
//! configuration denied or admitted without limit ([`Unconfigured::Deny`](crate::Unconfigured::Deny),
//! [`Unconfigured::Allow`](crate::Unconfigured::Allow)) is counted under `policy=""`
//! ([`UNCONFIGURED_POLICY`]; no policy can be named with the empty string). The policies are
//! those that applied to the key: the rule's, its tier's or its override's. A request [`Action::Delay`](crate::Action::Delay)
//! holds is counted once, when its outcome is final.
//!
//! Exempt requests, requests no rule matches (with no layer policies) and exempt keys are not
//! checked and not counted; neither are requests passed by the failure policy (see
//! `turnstile_backend_errors_total`).
//!
//! # Cost
//! The layer prepares the metric keys of every policy it knows (rules and tiers) when it is
//! built, so recording costs no allocation on its side: a counter increment per policy and a
//! histogram sample per check, plus whatever the installed recorder does. Only a key's override
//! (policies stored in the backend) needs its keys built per request. Without the feature
//! nothing is recorded and nothing is measured.
//!
//! # Examples
//! Serving them with `metrics-exporter-prometheus` (see `examples/metrics.rs`):
//! ```text
//! let handle = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;
//! tower_turnstile::metrics::describe();
//! let app = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(layer)
//!     // added after the layer, so not rate limited
//!     .route("/metrics", get(move || std::future::ready(handle.render())));
//! ```

pub use turnstile_core::metric_names::{
    BACKEND_CHECK_DURATION_SECONDS, BACKEND_ERRORS_TOTAL, DECISIONS_TOTAL, DENY_CACHE_HITS_TOTAL,
    FALLBACK_ACTIVATIONS_TOTAL, FALLBACK_DECISIONS_TOTAL, LABEL_KIND, LABEL_OUTCOME, LABEL_POLICY,
    LABEL_REASON, MEMORY_KEYS, MISSING_KEY_TOTAL, OUTCOMES, OUTCOME_ALLOWED, OUTCOME_DELAYED,
    OUTCOME_DENIED, OUTCOME_SHADOW_DENIED, UNCONFIGURED_POLICY,
};

/// Registers the description and unit of every metric above with the installed recorder
/// (exporters show them as `# HELP` lines). Call it once, after installing the recorder.
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub fn describe() {
    use ::metrics::Unit;
    ::metrics::describe_counter!(
        DECISIONS_TOTAL,
        Unit::Count,
        "Rate-limit decisions per policy and outcome (allowed, delayed, denied, shadow_denied)."
    );
    ::metrics::describe_histogram!(
        BACKEND_CHECK_DURATION_SECONDS,
        Unit::Seconds,
        "Latency of each rate-limit backend check, measured in the layer."
    );
    ::metrics::describe_counter!(
        BACKEND_ERRORS_TOTAL,
        Unit::Count,
        "Rate-limit backend errors that reached the layer, by kind."
    );
    ::metrics::describe_counter!(
        MISSING_KEY_TOTAL,
        Unit::Count,
        "Requests whose rate-limit key could not be extracted, by reason."
    );
    ::metrics::describe_counter!(
        FALLBACK_ACTIVATIONS_TOTAL,
        Unit::Count,
        "Incidents in which the Redis backend began deciding with its local fallback."
    );
    ::metrics::describe_counter!(
        FALLBACK_DECISIONS_TOTAL,
        Unit::Count,
        "Checks decided by the Redis backend's local fallback."
    );
    ::metrics::describe_gauge!(
        MEMORY_KEYS,
        Unit::Count,
        "Keys tracked by in-memory rate-limit backends."
    );
    ::metrics::describe_counter!(
        DENY_CACHE_HITS_TOTAL,
        Unit::Count,
        "Checks denied by the local deny cache without asking the backend."
    );
}

/// What became of a checked request, as the metrics and the check's span report it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Allowed,
    Delayed,
    Denied,
    ShadowDenied,
}

impl Outcome {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Outcome::Allowed => OUTCOME_ALLOWED,
            Outcome::Delayed => OUTCOME_DELAYED,
            Outcome::Denied => OUTCOME_DENIED,
            Outcome::ShadowDenied => OUTCOME_SHADOW_DENIED,
        }
    }

    #[cfg(feature = "metrics")]
    fn index(self) -> usize {
        match self {
            Outcome::Allowed => 0,
            Outcome::Delayed => 1,
            Outcome::Denied => 2,
            Outcome::ShadowDenied => 3,
        }
    }
}

#[cfg(feature = "metrics")]
pub(crate) use enabled::*;

#[cfg(not(feature = "metrics"))]
pub(crate) use disabled::*;

#[cfg(feature = "metrics")]
mod enabled {
    use std::collections::HashMap;
    use std::sync::Arc;
    use std::time::Duration;

    use ::metrics::{Key, Label, Level, Metadata};
    use turnstile_core::{Decision, Policy};

    use super::*;

    static METADATA: Metadata<'static> =
        Metadata::new("turnstile", Level::INFO, Some(module_path!()));

    static DURATION_KEY: Key = Key::from_static_name(BACKEND_CHECK_DURATION_SECONDS);

    /// The prepared `turnstile_decisions_total` keys of one policy name, one per outcome.
    #[derive(Clone, Debug)]
    pub(crate) struct PolicyKeys([Key; 4]);

    impl PolicyKeys {
        pub(crate) fn new(name: &Arc<str>) -> Self {
            let key = |outcome: &'static str| {
                Key::from_parts(
                    DECISIONS_TOTAL,
                    vec![
                        Label::new(LABEL_POLICY, Arc::clone(name)),
                        Label::from_static_parts(LABEL_OUTCOME, outcome),
                    ],
                )
            };
            PolicyKeys(OUTCOMES.map(key))
        }
    }

    /// Every policy name a layer knows (rules and tiers) with its prepared keys.
    #[derive(Debug)]
    pub(crate) struct Keys {
        by_name: HashMap<Arc<str>, PolicyKeys>,
        unconfigured: PolicyKeys,
    }

    impl Keys {
        pub(crate) fn new<'a>(policies: impl IntoIterator<Item = &'a Policy>) -> Self {
            let mut by_name = HashMap::new();
            for p in policies {
                by_name
                    .entry(Arc::clone(p.name_arc()))
                    .or_insert_with(|| PolicyKeys::new(p.name_arc()));
            }
            Keys {
                by_name,
                unconfigured: PolicyKeys::new(&Arc::from(UNCONFIGURED_POLICY)),
            }
        }
    }

    fn increment(key: &Key) {
        ::metrics::with_recorder(|r| r.register_counter(key, &METADATA).increment(1));
    }

    /// Counts a final decision: every policy checked when admitted, each policy that denied
    /// otherwise.
    pub(crate) fn decision(keys: &Keys, decision: &Decision, outcome: Outcome) {
        let i = outcome.index();
        let denied = matches!(outcome, Outcome::Denied | Outcome::ShadowDenied);
        if decision.policies().is_empty() {
            increment(&keys.unconfigured.0[i]);
            return;
        }
        for p in decision.policies() {
            if denied && p.allowed() {
                continue;
            }
            match keys.by_name.get(p.name()) {
                Some(k) => increment(&k.0[i]),
                // An override's policy, unknown when the layer was built.
                None => increment(&PolicyKeys::new(p.policy().name_arc()).0[i]),
            }
        }
    }

    /// Records one backend check's latency.
    pub(crate) fn backend_latency(elapsed: Duration) {
        ::metrics::with_recorder(|r| {
            r.register_histogram(&DURATION_KEY, &METADATA)
                .record(elapsed.as_secs_f64());
        });
    }

    /// Counts a backend error that reached the layer.
    pub(crate) fn backend_error(kind: &'static str) {
        // Errors are rare: building the key per error is fine.
        let key = Key::from_parts(
            BACKEND_ERRORS_TOTAL,
            vec![Label::from_static_parts(LABEL_KIND, kind)],
        );
        increment(&key);
    }

    /// Counts a request whose key was missing.
    pub(crate) fn missing_key(reason: &'static str) {
        let key = Key::from_parts(
            MISSING_KEY_TOTAL,
            vec![Label::from_static_parts(LABEL_REASON, reason)],
        );
        increment(&key);
    }

    /// Whether backend latency is measured for metrics.
    pub(crate) const MEASURE: bool = true;
}

#[cfg(not(feature = "metrics"))]
mod disabled {
    use std::time::Duration;

    use turnstile_core::{Decision, Policy};

    use super::Outcome;

    /// Nothing to prepare without the `metrics` feature.
    #[derive(Debug, Default)]
    pub(crate) struct Keys;

    impl Keys {
        pub(crate) fn new<'a>(_policies: impl IntoIterator<Item = &'a Policy>) -> Self {
            Keys
        }
    }

    #[inline(always)]
    pub(crate) fn decision(_keys: &Keys, _decision: &Decision, _outcome: Outcome) {}

    #[inline(always)]
    pub(crate) fn backend_latency(_elapsed: Duration) {}

    #[inline(always)]
    pub(crate) fn backend_error(_kind: &'static str) {}

    #[inline(always)]
    pub(crate) fn missing_key(_reason: &'static str) {}

    pub(crate) const MEASURE: bool = false;
}
