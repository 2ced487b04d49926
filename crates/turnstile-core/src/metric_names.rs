//! Every metric name, label name and fixed label value turnstile records through the
//! `metrics` facade, declared once for every crate that records one: the `tower-turnstile` crate,
//! the in-memory backend (here) and the Redis backend (`turnstile-redis`).
//!
//! The `tower-turnstile` crate's `metrics` module re-exports these and describes each metric: its
//! type, labels, unit and when it is recorded.

/// `turnstile_decisions_total{policy, outcome}` (counter, requests): one per policy per
/// request the `tower-turnstile` crate checked. Labels [`LABEL_POLICY`] and [`LABEL_OUTCOME`].
pub const DECISIONS_TOTAL: &str = "turnstile_decisions_total";

/// `turnstile_backend_check_duration_seconds` (histogram, seconds): the latency of each
/// backend check, as the `tower-turnstile` crate (the caller) measures it. No labels.
pub const BACKEND_CHECK_DURATION_SECONDS: &str = "turnstile_backend_check_duration_seconds";

/// `turnstile_backend_errors_total{kind}` (counter, errors): backend errors that reached the
/// `tower-turnstile` crate (past any wrapper). Label [`LABEL_KIND`].
pub const BACKEND_ERRORS_TOTAL: &str = "turnstile_backend_errors_total";

/// `turnstile_missing_key_total{reason}` (counter, requests): requests whose key could not
/// be extracted. Label [`LABEL_REASON`].
pub const MISSING_KEY_TOTAL: &str = "turnstile_missing_key_total";

/// `turnstile_fallback_activations_total{kind}` (counter, incidents): incidents in which the
/// Redis backend began deciding with its local in-memory fallback (recorded by the Redis
/// backend). Label [`LABEL_KIND`], the error kind that started the incident.
pub const FALLBACK_ACTIVATIONS_TOTAL: &str = "turnstile_fallback_activations_total";

/// `turnstile_fallback_decisions_total` (counter, checks): checks the Redis backend's local
/// fallback decided (recorded by the Redis backend). No labels.
pub const FALLBACK_DECISIONS_TOTAL: &str = "turnstile_fallback_decisions_total";

/// `turnstile_memory_keys` (gauge, keys): keys tracked by in-memory backends (recorded by
/// the in-memory backend: +1 when it starts tracking a key, −1 when it drops one). No labels.
pub const MEMORY_KEYS: &str = "turnstile_memory_keys";

/// `turnstile_deny_cache_hits_total` (counter, checks): checks a deny cache denied without
/// asking the backend (recorded by the backend that keeps the cache). No labels.
pub const DENY_CACHE_HITS_TOTAL: &str = "turnstile_deny_cache_hits_total";

/// The label naming a policy (its [`Policy::name`](crate::Policy::name)).
pub const LABEL_POLICY: &str = "policy";

/// The label of a decision's outcome: one of [`OUTCOMES`].
pub const LABEL_OUTCOME: &str = "outcome";

/// The label of a backend error's kind ([`BackendError::kind`](crate::BackendError::kind)).
pub const LABEL_KIND: &str = "kind";

/// The label of the reason a request's key is missing (the `tower-turnstile` crate's
/// `KeyError::kind`).
pub const LABEL_REASON: &str = "reason";

/// `outcome` of a request admitted at once.
pub const OUTCOME_ALLOWED: &str = "allowed";

/// `outcome` of a request admitted after waiting.
pub const OUTCOME_DELAYED: &str = "delayed";

/// `outcome` of a rejected request.
pub const OUTCOME_DENIED: &str = "denied";

/// `outcome` of a request a shadow (dry-run) action admitted though it would have been
/// denied.
pub const OUTCOME_SHADOW_DENIED: &str = "shadow_denied";

/// Every value of the `outcome` label.
pub const OUTCOMES: [&str; 4] = [
    OUTCOME_ALLOWED,
    OUTCOME_DELAYED,
    OUTCOME_DENIED,
    OUTCOME_SHADOW_DENIED,
];

/// The `policy` label of keys without configuration denied or admitted without limit (no
/// policy can be named with the empty string).
pub const UNCONFIGURED_POLICY: &str = "";
