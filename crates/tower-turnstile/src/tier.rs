//! Tiers chosen per request: [`RequestTier`], and the policy sets a rule checks for each
//! choice.
//!
//! A key's stored configuration still decides first, in the backend and atomically with the
//! check: a request's tier becomes the *defaults* of the [`Limits`] passed to the check,
//! with every tier of the layer kept, so the backend's own order — override, else stored
//! tier, else defaults — gives: **the key's stored override > the key's stored tier > the
//! request's tier > the rule's policies** (or the layer's
//! [`Unconfigured`] behaviour when the request chose none).
//! The Redis script resolves the same way, since it is the same `Limits`.

use std::borrow::Cow;
use std::sync::Arc;

use http::HeaderValue;
use turnstile_core::{Applied, CheckResult, Limits, LimitsError, Policy, Unconfigured};

use crate::headers::policy_value;
use crate::key::RequestRef;

/// The tier a request asks for, as a [`RateLimitLayerBuilder::request_tier`] function
/// chooses it from the request — a claim an authentication layer put in the extensions, a
/// header the gateway sets.
///
/// Whatever it chooses, a key's own stored configuration wins: its override, then its
/// stored tier (see the backends' `set_override` and `set_tier`). The full order is the
/// key's stored override > the key's stored tier > the request's tier > the rule's policies.
///
/// [`RateLimitLayerBuilder::request_tier`]: crate::RateLimitLayerBuilder::request_tier
#[derive(Clone, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum RequestTier {
    /// No tier: the rule's policies (or the layer's
    /// [`when_unconfigured`](crate::RateLimitLayerBuilder::when_unconfigured) behaviour).
    #[default]
    Defaults,
    /// The policies of the tier of this name (defined with
    /// [`RateLimitLayerBuilder::tier`](crate::RateLimitLayerBuilder::tier)). A name the layer
    /// does not define counts as [`RequestTier::Defaults`], and the first such request logs
    /// an error naming it.
    Named(Cow<'static, str>),
    /// No limit, unless the key has a stored override or tier: the backend is still asked
    /// (so an override set on the key applies), and a key without one is admitted without
    /// limit and without rate-limit headers.
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
    /// One [`Limits`] per tier of the layer, in order (defaults: that tier's policies), then
    /// one for [`RequestTier::Unlimited`].
    limits: Box<[Limits]>,
    /// The `RateLimit-Policy` value of each tier's policies, in the same order (the last is
    /// the rule's, never used: an unlimited check that reports policies has an override or
    /// a stored tier, which get their own).
    headers: Box<[HeaderValue]>,
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
        let with_tiers = |defaults: &[Policy], unconfigured| {
            tiers.iter().try_fold(
                Limits::new(defaults.iter().cloned())?.when_unconfigured(unconfigured),
                |l, (name, policies)| l.with_tier(name, policies.iter().cloned()),
            )
        };
        let mut limits = Vec::with_capacity(tiers.len() + 1);
        let mut headers = Vec::with_capacity(tiers.len() + 1);
        for (_, policies) in tiers {
            limits.push(with_tiers(policies, Unconfigured::Defaults)?);
            headers.push(policy_value(policies.iter()));
        }
        limits.push(with_tiers(rule, Unconfigured::Allow)?);
        headers.push(rule_header.clone());
        Ok(RuleTiers {
            limits: limits.into(),
            headers: headers.into(),
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

    /// `result` as the layer reports it: a decision the request's tier made (the backend
    /// says "defaults", since the tier was passed as the defaults) is labelled with the
    /// tier, so spans, metrics and custom denials see [`Applied::Tier`].
    pub(crate) fn relabel(&self, chosen: Chosen, result: CheckResult) -> CheckResult {
        match (chosen.and_then(|i| self.names.get(i)), result) {
            (Some(name), Ok(d)) if *d.applied() == Applied::Defaults => {
                let version = d.version();
                Ok(d.with_applied(Applied::Tier(Arc::clone(name)), version))
            }
            (_, r) => r,
        }
    }
}
