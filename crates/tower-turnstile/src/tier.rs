//! Tiers chosen per request: [`RequestTier`], and the policy sets a rule checks for each
//! choice.
//!
//! A tier changes the parameters of the policies it names, and nothing else. For each policy
//! of the matched rule, the first of **the key's stored override > the key's stored tier >
//! the request's tier** that lists its name supplies its parameters; otherwise the rule's
//! own apply. A request's tier is merged into the rule's policies here, once, at build (the
//! *defaults* of the [`Limits`] passed to the check, with every tier of the layer kept); the
//! key's stored configuration is applied per policy in the backend, atomically with the
//! check (the Redis script resolves the same way: it is the same `Limits`).

use std::borrow::Cow;
use std::sync::Arc;

use http::HeaderValue;
use turnstile_core::{CheckResult, Limits, LimitsError, Policy, Source, Unconfigured};

use crate::headers::policy_value;
use crate::key::RequestRef;

/// The tier a request asks for, as a [`RateLimitLayerBuilder::request_tier`] function
/// chooses it from the request — a claim an authentication layer put in the extensions, a
/// header the gateway sets.
///
/// A tier changes the policies it names. Whatever the request chooses, a key's own stored
/// configuration wins for the policies it names: its override, then its stored tier (see
/// the backends' `set_override` and `set_tier`). The full order, per policy of the matched
/// rule: the key's stored override > the key's stored tier > the request's tier > the
/// rule's own.
///
/// [`RateLimitLayerBuilder::request_tier`]: crate::RateLimitLayerBuilder::request_tier
#[derive(Clone, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum RequestTier {
    /// No tier: the rule's policies (or the layer's
    /// [`when_unconfigured`](crate::RateLimitLayerBuilder::when_unconfigured) behaviour).
    #[default]
    Defaults,
    /// The tier of this name (defined with
    /// [`RateLimitLayerBuilder::tier`](crate::RateLimitLayerBuilder::tier)). A name the layer
    /// does not define counts as [`RequestTier::Defaults`], and the first such request logs
    /// an error naming it.
    Named(Cow<'static, str>),
    /// No limit: an exemption from every policy, except those the key's stored override or
    /// tier names (the backend is still asked, so an operator's decision holds for those);
    /// a key without one is admitted without limit and without rate-limit headers.
    Unlimited,
}

impl RequestTier {
    /// [`RequestTier::Named`]: the tier `name`. A `&'static str` costs no allocation.
    pub fn named(name: impl Into<Cow<'static, str>>) -> Self {
        RequestTier::Named(name.into())
    }
}

/// A request-tier function.
pub(crate) type TierFn = Arc<dyn Fn(&RequestRef<'_>) -> RequestTier + Send + Sync>;

/// What a request's tier resolved to, for one rule: `None` for the rule's own limits,
/// `Some(i)` for [`RuleTiers::limits`]`[i]` (the layer's tier `i`, or the last entry:
/// unlimited).
pub(crate) type Chosen = Option<usize>;

/// One rule's policy sets for each request tier.
#[derive(Clone, Debug)]
pub(crate) struct RuleTiers {
    /// One [`Limits`] per tier of the layer, in order (defaults: the rule's policies, those
    /// the tier names taking its parameters), then one for [`RequestTier::Unlimited`] (the
    /// rule's policies, checked only where the key's stored configuration names them).
    limits: Box<[Limits]>,
    /// The `RateLimit-Policy` value of each tier's defaults, in the same order (the last is
    /// the rule's, never used: an unlimited check that reports policies has an override or
    /// a stored tier, which get their own).
    headers: Box<[HeaderValue]>,
    /// Per tier, in the same order: which of its defaults took the tier's parameters.
    merged: Box<[Box<[bool]>]>,
    /// The tier names, in the same order.
    names: Box<[Arc<str>]>,
}

impl RuleTiers {
    /// The sets for a rule whose policies are `rule` and whose layer defines `tiers`.
    pub(crate) fn new(
        rule: &[Policy],
        rule_header: &HeaderValue,
        tiers: &[(String, Vec<Policy>)],
    ) -> Result<Self, LimitsError> {
        let with_tiers = |defaults: &[Policy]| {
            tiers.iter().try_fold(
                Limits::new(defaults.iter().cloned())?,
                |l, (name, policies)| l.with_tier(name, policies.iter().cloned()),
            )
        };
        let mut limits = Vec::with_capacity(tiers.len() + 1);
        let mut headers = Vec::with_capacity(tiers.len() + 1);
        let mut merged = Vec::with_capacity(tiers.len());
        for (_, policies) in tiers {
            let (set, from_tier) = merge(rule, policies);
            limits.push(with_tiers(&set)?.when_unconfigured(Unconfigured::Defaults));
            headers.push(policy_value(set.iter()));
            merged.push(from_tier.into_boxed_slice());
        }
        limits.push(with_tiers(rule)?.stored_only());
        headers.push(rule_header.clone());
        Ok(RuleTiers {
            limits: limits.into(),
            headers: headers.into(),
            merged: merged.into(),
            names: tiers.iter().map(|(n, _)| Arc::from(n.as_str())).collect(),
        })
    }

    /// Which set `tier` selects; `Err(name)` for a tier name the layer does not define
    /// (handled as the rule's own set).
    pub(crate) fn choose<'a>(&self, tier: &'a RequestTier) -> Result<Chosen, &'a str> {
        match tier {
            RequestTier::Defaults => Ok(None),
            RequestTier::Unlimited => Ok(Some(self.names.len())),
            RequestTier::Named(n) => match self.names.iter().position(|t| **t == **n) {
                Some(i) => Ok(Some(i)),
                None => Err(n),
            },
        }
    }

    /// The limits of `chosen`, `None` meaning the rule's own.
    pub(crate) fn limits(&self, chosen: usize) -> Option<&Limits> {
        self.limits.get(chosen)
    }

    /// The `RateLimit-Policy` value for `chosen`'s defaults.
    pub(crate) fn header(&self, chosen: usize) -> Option<&HeaderValue> {
        self.headers.get(chosen)
    }

    /// `result` as the layer reports it: each policy whose parameters the request's tier
    /// supplied (the backend says "defaults": the tier was merged into them) is labelled
    /// with the tier, so spans, metrics, headers and custom denials see [`Source::Tier`]
    /// (and the decision's `applied`, when no stored configuration supplied any).
    pub(crate) fn relabel(&self, chosen: Chosen, result: CheckResult) -> CheckResult {
        let Some((name, merged)) =
            chosen.and_then(|i| Some((self.names.get(i)?, self.merged.get(i)?)))
        else {
            return result;
        };
        match result {
            Ok(d) if merged.iter().any(|&m| m) && d.sources().next().is_some() => {
                let sources: Vec<Source> = d
                    .sources()
                    .zip(merged.iter())
                    .map(|(s, &m)| match s {
                        Source::Defaults if m => Source::Tier(Arc::clone(name)),
                        s => s,
                    })
                    .collect();
                Ok(d.with_sources(sources))
            }
            r => r,
        }
    }
}

/// The rule's policies `rule`, each of a name `tier` lists taking the tier's parameters,
/// and which did.
fn merge(rule: &[Policy], tier: &[Policy]) -> (Vec<Policy>, Vec<bool>) {
    rule.iter()
        .map(|p| match tier.iter().find(|q| q.name() == p.name()) {
            Some(q) => (q.clone(), true),
            None => (p.clone(), false),
        })
        .unzip()
}
