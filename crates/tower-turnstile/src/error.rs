//! [`InvalidLayer`]: why a layer could not be built.

use std::fmt;
use std::time::Duration;

use turnstile_core::LimitsError;

/// Why a layer could not be built.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum InvalidLayer {
    /// No policy was given, neither on the layer nor in a rule.
    NoPolicies,
    /// A rule that is not exempt has no policy.
    RuleWithoutPolicies(String),
    /// An exempt rule was also given policies.
    ExemptRuleWithPolicies(String),
    /// Two policies of one rule (or of the layer) share a name, so they would share state.
    DuplicatePolicyName(String),
    /// Two rules apply policies of the same name but different parameters; they would fight
    /// over one counter.
    ConflictingPolicy(String),
    /// The name derived for a rule's policy (`<rule label> <parameters>`) is not a valid
    /// policy name (too long, or holds `"` or `\`); name the rule or the policy.
    InvalidPolicyName(String),
    /// No request can match a rule: its gRPC condition allows only paths
    /// `/<service>/<method>` (gRPC over HTTP/2, the "Path" of a call) and its `path` or
    /// `path_prefix` none of them — `path("/")` with `grpc_service("a.B")` — or a service or
    /// method name is empty or holds `/`.
    RuleMatchesNothing {
        /// The rule's label (its name, else its conditions).
        rule: String,
        /// Why nothing can match.
        reason: String,
    },
    /// A tier was invalid: a bad or repeated tier name, no policies, or two of its policies
    /// share a name.
    Tier(LimitsError),
    /// A rule (or the layer's defaults) has more than
    /// [`MAX_POLICIES`](turnstile_core::MAX_POLICIES) policies, the most one check may carry.
    TooManyPolicies {
        /// The rule's label.
        rule: String,
        /// How many policies it has.
        count: usize,
    },
    /// A tier lists a policy name that no rule and no default policy of the layer uses: a
    /// tier changes the parameters of the policies it names, so this entry would change
    /// nothing (a typo, or a policy left unnamed).
    UnusedTierPolicy {
        /// The tier's name.
        tier: String,
        /// The policy name no rule uses.
        policy: String,
    },
    /// With [`Action::Delay`](crate::Action::Delay), a leaky-bucket policy could ask a request to wait longer than
    /// `max_wait`: (B − 1)·T exceeds it.
    DelayExceedsMaxWait {
        /// The policy's name.
        policy: String,
        /// (B − 1)·T, rounded up.
        max_delay: Duration,
        /// The configured maximum wait.
        max_wait: Duration,
    },
    /// [`RateLimitLayerBuilder::max_key_bytes`](crate::RateLimitLayerBuilder::max_key_bytes)
    /// is above what the backend takes
    /// ([`Backend::max_key_bytes`](turnstile_core::Backend::max_key_bytes)): keys in between
    /// would pass the layer and fail every check. Raise the backend's cap with
    /// `max_key_bytes` on its builder, or lower the layer's.
    KeyCapAboveBackend {
        /// The layer's cap, in bytes.
        layer: usize,
        /// The backend's cap, in bytes.
        backend: usize,
    },
}

impl fmt::Display for InvalidLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InvalidLayer::NoPolicies => f.write_str("a rate-limit layer needs at least one policy"),
            InvalidLayer::RuleWithoutPolicies(r) => {
                write!(f, "rule {r:?} has no policy and is not exempt")
            }
            InvalidLayer::Tier(e) => write!(f, "invalid tier: {e}"),
            InvalidLayer::RuleMatchesNothing { rule, reason } => {
                write!(f, "no request can match rule {rule:?}: {reason}")
            }
            InvalidLayer::ExemptRuleWithPolicies(r) => {
                write!(f, "rule {r:?} is exempt but also has policies")
            }
            InvalidLayer::DuplicatePolicyName(n) => write!(
                f,
                "two policies are named {n:?}; names must be unique within a rule"
            ),
            InvalidLayer::ConflictingPolicy(n) => write!(
                f,
                "two rules apply policies named {n:?} with different parameters; a shared name means a shared counter, so the parameters must match"
            ),
            InvalidLayer::InvalidPolicyName(n) => write!(
                f,
                "the derived policy name {n:?} is not a valid policy name; give the rule a shorter name with Rule::name or the policy an explicit one"
            ),
            InvalidLayer::TooManyPolicies { rule, count } => write!(
                f,
                "rule {rule:?} has {count} policies, more than the {} one check may carry",
                turnstile_core::MAX_POLICIES
            ),
            InvalidLayer::UnusedTierPolicy { tier, policy } => write!(
                f,
                "tier {tier:?} lists policy {policy:?}, which no rule or default policy of the layer uses (a tier changes the parameters of the policies it names; give the rule's policy that name)"
            ),
            InvalidLayer::DelayExceedsMaxWait {
                policy,
                max_delay,
                max_wait,
            } => write!(
                f,
                "leaky-bucket policy {policy:?} can delay a request by up to {} ms, more than the maximum wait of {} ms",
                max_delay.as_millis(),
                max_wait.as_millis()
            ),
            InvalidLayer::KeyCapAboveBackend { layer, backend } => write!(
                f,
                "the layer takes keys of up to {layer} bytes (max_key_bytes) but its backend only {backend}; raise the backend's max_key_bytes or lower the layer's"
            ),
        }
    }
}

impl std::error::Error for InvalidLayer {}
