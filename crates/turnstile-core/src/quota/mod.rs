//! Live quotas: which policies apply to a key and where each takes its parameters from — the
//! defaults, the key's own override, its tier — and what happens to a key with no
//! configuration.
//!
//! # The rule
//! A check's policies are its *defaults* (a rule's policies, in the tower layer); each is
//! known by its name, as counting is (two checks share a counter exactly when key and policy
//! name match). A key's stored override, the key's stored tier (a tier the [`Limits`]
//! define) and a tier the request chose each change the parameters of the policies they list
//! **by name**, and nothing else: for each default policy, the first of the override, the
//! stored tier and the request's tier that lists its name supplies its parameters, otherwise
//! the default applies as it is. A name those list that no default has does not apply to
//! the check. [`Unconfigured`] says what a key with neither override nor known tier gets;
//! [`Limits::stored_only`] (a request that asks for no limit) checks only what the key's
//! stored configuration lists.

mod resolve;

use std::fmt;
use std::sync::Arc;

use crate::policy::Policy;

pub(crate) use resolve::{resolve, Resolution, SCAN_MAX};

/// The most policies one check may carry, and one policy set may hold (a rule's, a tier's,
/// an override): 512. Everything that makes a set refuses a larger one
/// ([`LimitsError::TooManyPolicies`]): [`Limits`], [`validate_policy_set`], the backends'
/// `set_override` and checks, the tower layer's builder, configuration files, and the
/// Redis script itself (`TURNSTILE_TOO_MANY_POLICIES`, a
/// [`BackendError::InvalidRequest`](crate::BackendError::InvalidRequest)). A check's time
/// is linear in its policies; the cap keeps any one call from holding Redis for long.
pub const MAX_POLICIES: usize = 512;

/// What a backend does with a key that has neither an override nor a known tier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Unconfigured {
    /// Check the default policies (the default).
    #[default]
    Defaults,
    /// Deny: no wait can help (`retry_after` is never).
    Deny,
    /// Admit without any limit.
    Allow,
}

/// Which configuration decided a request (see [`Decision::applied`](crate::Decision::applied)):
/// of the sources of its policies' parameters ([`Source`]), the first in the order override,
/// tier, defaults; or, when no policy was checked, why.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Applied {
    /// Every policy's parameters are the defaults' (the key has no configuration, a tier
    /// the application does not define, or one that lists none of these policies).
    #[default]
    Defaults,
    /// The key's own override, stored in the backend, supplied some policy's parameters.
    Override,
    /// The tier named here (the key's stored tier, or the request's) supplied some policy's
    /// parameters, and no override did.
    Tier(Arc<str>),
    /// No configuration and [`Unconfigured::Deny`]: denied.
    Denied,
    /// No policy applies: no configuration and [`Unconfigured::Allow`], or limits that check
    /// only what the key's stored configuration lists ([`Limits::stored_only`]) and it lists
    /// none of these policies. Admitted without limit.
    Unlimited,
}

impl Applied {
    /// A short, stable label: `defaults`, `override`, `tier`, `denied` or `unlimited`.
    pub fn label(&self) -> &'static str {
        match self {
            Applied::Defaults => "defaults",
            Applied::Override => "override",
            Applied::Tier(_) => "tier",
            Applied::Denied => "denied",
            Applied::Unlimited => "unlimited",
        }
    }

    /// The [`Source`] of every policy of a decision this configuration decided alone;
    /// `None` for [`Applied::Denied`] and [`Applied::Unlimited`] (no policy).
    pub fn source(&self) -> Option<Source> {
        match self {
            Applied::Defaults => Some(Source::Defaults),
            Applied::Override => Some(Source::Override),
            Applied::Tier(t) => Some(Source::Tier(Arc::clone(t))),
            _ => None,
        }
    }
}

/// Where one policy of a check took its parameters from (see
/// [`Decision::sources`](crate::Decision::sources)): the policy's name is always the
/// default's, and so is its counter.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Source {
    /// The default policy as it is (in the tower layer: the rule's own).
    #[default]
    Defaults,
    /// The key's override, stored in the backend.
    Override,
    /// The tier named here: the key's stored tier, or the tier the request chose.
    Tier(Arc<str>),
}

impl Source {
    /// A short, stable label: `defaults`, `override` or `tier`.
    pub fn label(&self) -> &'static str {
        match self {
            Source::Defaults => "defaults",
            Source::Override => "override",
            Source::Tier(_) => "tier",
        }
    }

    /// The [`Applied`] of a decision whose policies all took their parameters from here.
    pub fn applied(&self) -> Applied {
        match self {
            Source::Defaults => Applied::Defaults,
            Source::Override => Applied::Override,
            Source::Tier(t) => Applied::Tier(Arc::clone(t)),
        }
    }
}

/// Why a [`Limits`] or an override was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LimitsError {
    /// A policy set was empty.
    Empty,
    /// Two policies of one set share a name (they would share state).
    DuplicateName(String),
    /// A tier name was empty, over 64 bytes, or held anything but ASCII letters, digits,
    /// `-`, `_` and `.`.
    TierName(String),
    /// A tier was defined twice.
    DuplicateTier(String),
    /// A policy set held more than [`MAX_POLICIES`] policies.
    TooManyPolicies {
        /// How many it held.
        count: usize,
        /// The most a set may hold, [`MAX_POLICIES`].
        max: usize,
    },
}

impl fmt::Display for LimitsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LimitsError::Empty => f.write_str("a policy set needs at least one policy"),
            LimitsError::DuplicateName(n) => {
                write!(f, "two policies of one set are named {n:?}")
            }
            LimitsError::TierName(n) => write!(
                f,
                "tier name {n:?} is not 1 to 64 ASCII letters, digits, '-', '_' or '.'"
            ),
            LimitsError::DuplicateTier(n) => write!(f, "tier {n:?} is defined twice"),
            LimitsError::TooManyPolicies { count, max } => write!(
                f,
                "a policy set of {count} policies is more than the {max} one check may carry"
            ),
        }
    }
}

impl std::error::Error for LimitsError {}

/// Checks that a policy set is non-empty, holds at most [`MAX_POLICIES`] policies and has
/// unique names. Linear in the set's size.
///
/// # Errors
/// [`LimitsError::Empty`], [`LimitsError::TooManyPolicies`] or
/// [`LimitsError::DuplicateName`].
#[inline]
pub fn validate_policy_set(policies: &[Policy]) -> Result<(), LimitsError> {
    match policies {
        [] => return Err(LimitsError::Empty),
        [_] => return Ok(()),
        ps if ps.len() > MAX_POLICIES => {
            return Err(LimitsError::TooManyPolicies {
                count: ps.len(),
                max: MAX_POLICIES,
            })
        }
        _ => {}
    }
    match resolve::first_repeated(policies.iter().map(Policy::name)) {
        Some(name) => Err(LimitsError::DuplicateName(name.to_owned())),
        None => Ok(()),
    }
}

/// Checks a tier name: 1 to 64 ASCII letters, digits, `-`, `_` and `.`.
///
/// # Errors
/// [`LimitsError::TierName`].
pub fn validate_tier_name(name: &str) -> Result<(), LimitsError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(LimitsError::TierName(name.to_owned()))
    }
}

/// What the defaults of a [`Limits`] are to a key whose stored configuration does not list
/// them: [`Unconfigured`]'s three behaviours for a key without configuration (whose
/// defaults apply if it has one), or [`Limits::stored_only`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) enum Mode {
    /// A key without configuration gets the defaults ([`Unconfigured::Defaults`]).
    #[default]
    Defaults,
    /// A key without configuration is denied ([`Unconfigured::Deny`]).
    Deny,
    /// A key without configuration is admitted without limit ([`Unconfigured::Allow`]).
    Allow,
    /// Only policies the key's stored override or tier lists are checked; a key without
    /// configuration is admitted without limit.
    StoredOnly,
}

impl From<Unconfigured> for Mode {
    fn from(u: Unconfigured) -> Self {
        match u {
            Unconfigured::Deny => Mode::Deny,
            Unconfigured::Allow => Mode::Allow,
            _ => Mode::Defaults,
        }
    }
}

/// The application's side of live quotas: the default policies, the policy set of each tier,
/// and what to do with a key that has no configuration. Cheap to clone.
///
/// For each default policy, the key's stored override supplies its parameters if it lists
/// the policy's name, else the key's tier (if this `Limits` defines it) if that lists it,
/// else the default applies as it is: a tier or an override changes the policies it names
/// and leaves every other in force (see the [module](self) docs). A key with neither an
/// override nor a known tier gets the [`Unconfigured`] behaviour (by default the defaults).
/// Tiers travel with every check (to Redis as script arguments), so a tier's policies change
/// with a redeploy and a key's tier changes at run time. A tier may list policies the
/// defaults do not have (one `Limits` per rule shares the layer's tiers): those do not
/// apply here.
///
/// Every set holds at most [`MAX_POLICIES`] policies.
///
/// # Examples
/// ```
/// use turnstile_core::{Limits, Policy, Unconfigured};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limits = Limits::new([
///     "token-bucket:limit=10,period=1m,name=api".parse::<Policy>()?,
///     "sliding-log:limit=5,period=1m,name=login".parse::<Policy>()?,
/// ])?
/// // "pro" changes "api" only: its keys keep the login limit.
/// .with_tier("pro", ["token-bucket:limit=1000,period=1m,name=api".parse::<Policy>()?])?
/// .when_unconfigured(Unconfigured::Defaults);
/// assert_eq!(limits.tier("pro").map(|t| t.len()), Some(1));
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    defaults: Arc<[Policy]>,
    tiers: Arc<[Tier]>,
    mode: Mode,
}

impl Limits {
    /// Limits whose default policies are `defaults`, with no tiers.
    ///
    /// # Errors
    /// [`LimitsError::Empty`], [`LimitsError::TooManyPolicies`] or
    /// [`LimitsError::DuplicateName`].
    pub fn new(defaults: impl IntoIterator<Item = Policy>) -> Result<Self, LimitsError> {
        let defaults: Arc<[Policy]> = defaults.into_iter().collect();
        validate_policy_set(&defaults)?;
        Ok(Limits {
            defaults,
            tiers: Arc::from([]),
            mode: Mode::Defaults,
        })
    }

    /// Adds the tier `name` with its policies: for a key in this tier, each default policy
    /// of a name listed here takes these parameters.
    ///
    /// # Errors
    /// [`LimitsError::TierName`], [`LimitsError::DuplicateTier`], [`LimitsError::Empty`],
    /// [`LimitsError::TooManyPolicies`] or [`LimitsError::DuplicateName`].
    pub fn with_tier(
        self,
        name: &str,
        policies: impl IntoIterator<Item = Policy>,
    ) -> Result<Self, LimitsError> {
        validate_tier_name(name)?;
        if self.tier(name).is_some() {
            return Err(LimitsError::DuplicateTier(name.to_owned()));
        }
        let policies: Arc<[Policy]> = policies.into_iter().collect();
        validate_policy_set(&policies)?;
        let mut tiers = self.tiers.to_vec();
        tiers.push((Arc::from(name), policies));
        Ok(Limits {
            tiers: tiers.into(),
            ..self
        })
    }

    /// Sets what happens to a key with no configuration (default [`Unconfigured::Defaults`]).
    /// Undoes [`Limits::stored_only`].
    pub fn when_unconfigured(self, unconfigured: Unconfigured) -> Self {
        Limits {
            mode: Mode::from(unconfigured),
            ..self
        }
    }

    /// The same limits for a request that asks for no limit: only the policies the key's
    /// stored override or tier lists are checked (with those parameters), every other
    /// default policy is exempt, and a key without configuration is admitted without limit
    /// ([`Applied::Unlimited`]). The tower layer's `RequestTier::Unlimited`: an operator's
    /// stored decision still holds for the policies it names.
    pub fn stored_only(self) -> Self {
        Limits {
            mode: Mode::StoredOnly,
            ..self
        }
    }

    /// Whether only the key's stored configuration is checked ([`Limits::stored_only`]).
    pub fn is_stored_only(&self) -> bool {
        self.mode == Mode::StoredOnly
    }

    /// The default policies.
    pub fn defaults(&self) -> &[Policy] {
        &self.defaults
    }

    /// The tiers, in the order they were added.
    pub fn tiers(&self) -> impl Iterator<Item = (&str, &[Policy])> {
        self.tiers.iter().map(|(n, p)| (&**n, &**p))
    }

    /// The policies of tier `name`, if defined.
    pub fn tier(&self, name: &str) -> Option<&[Policy]> {
        self.tiers
            .iter()
            .find(|(n, _)| &**n == name)
            .map(|(_, p)| &**p)
    }

    /// The tiers as stored (for backends).
    pub(crate) fn tier_slice(&self) -> &[Tier] {
        &self.tiers
    }

    /// An empty tier list.
    pub(crate) const NO_TIERS: [Tier; 0] = [];

    /// What happens to a key with no configuration ([`Unconfigured::Allow`] under
    /// [`Limits::stored_only`]).
    pub fn unconfigured(&self) -> Unconfigured {
        match self.mode {
            Mode::Defaults => Unconfigured::Defaults,
            Mode::Deny => Unconfigured::Deny,
            Mode::Allow | Mode::StoredOnly => Unconfigured::Allow,
        }
    }

    /// What the defaults are to a key (for backends).
    #[inline]
    pub(crate) fn mode(&self) -> Mode {
        self.mode
    }

    /// The policies that apply to a key with `config`, in the defaults' order, each with
    /// where its parameters came from, and the [`Applied`] that sums them up. No policy for
    /// [`Applied::Denied`] and [`Applied::Unlimited`].
    pub fn resolve(&self, config: Option<&KeyConfig>) -> Vec<(Policy, Source)> {
        let r = resolve(config, &self.defaults, &self.tiers, self.mode);
        r.picks(self.defaults.len())
            .filter_map(|pick| r.policy(pick, config, &self.defaults, &self.tiers))
            .map(|(p, source)| (p.clone(), source))
            .collect()
    }

    /// [`Limits::resolve`]'s [`Applied`]: which configuration decides for a key with
    /// `config`.
    pub fn applied(&self, config: Option<&KeyConfig>) -> Applied {
        resolve(config, &self.defaults, &self.tiers, self.mode).applied(&self.tiers)
    }
}

impl From<Policy> for Limits {
    fn from(policy: Policy) -> Self {
        Limits {
            defaults: Arc::from([policy]),
            tiers: Arc::from([]),
            mode: Mode::Defaults,
        }
    }
}

/// A tier: its name and its policies.
pub(crate) type Tier = (Arc<str>, Arc<[Policy]>);

/// A key's configuration as stored in the backend: its own policies (an override), its tier,
/// and its version.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyConfig {
    pub(crate) policies: Option<Arc<[Policy]>>,
    pub(crate) tier: Option<Arc<str>>,
    pub(crate) version: u64,
}

impl KeyConfig {
    /// A configuration from its parts (as read back from a store).
    pub fn new(policies: Option<Vec<Policy>>, tier: Option<String>, version: u64) -> Self {
        KeyConfig {
            policies: policies.map(Arc::from),
            tier: tier.map(Arc::from),
            version,
        }
    }

    /// The key's override: the policies that replace every other for it.
    pub fn policies(&self) -> Option<&[Policy]> {
        self.policies.as_deref()
    }

    /// The key's tier.
    pub fn tier(&self) -> Option<&str> {
        self.tier.as_deref()
    }

    /// The key's version: bumped by every operation that changes its policies or gives it
    /// quota back.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Whether the configuration holds neither an override nor a tier.
    pub fn is_empty(&self) -> bool {
        self.policies.is_none() && self.tier.is_none()
    }
}
