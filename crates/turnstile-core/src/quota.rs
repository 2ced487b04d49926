//! Live quotas: which policies apply to a key — the defaults, the key's own override, or its
//! tier — and what happens to a key with no configuration.

use std::fmt;
use std::sync::Arc;

use crate::policy::Policy;

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

/// Which configuration decided a request (see [`Decision::applied`](crate::Decision::applied)).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Applied {
    /// The default policies: the key has no configuration (or a tier the application does
    /// not define) and [`Unconfigured::Defaults`] applies.
    #[default]
    Defaults,
    /// The key's own override, stored in the backend.
    Override,
    /// The policies of the key's tier, named here.
    Tier(Arc<str>),
    /// No configuration and [`Unconfigured::Deny`]: denied.
    Denied,
    /// No configuration and [`Unconfigured::Allow`]: admitted without limit.
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
        }
    }
}

impl std::error::Error for LimitsError {}

/// Checks that a policy set is non-empty with unique names.
///
/// # Errors
/// [`LimitsError::Empty`] or [`LimitsError::DuplicateName`].
#[inline]
pub fn validate_policy_set(policies: &[Policy]) -> Result<(), LimitsError> {
    match policies {
        [] => return Err(LimitsError::Empty),
        [_] => return Ok(()),
        _ => {}
    }
    for (i, p) in policies.iter().enumerate() {
        if policies[..i].iter().any(|q| q.name() == p.name()) {
            return Err(LimitsError::DuplicateName(p.name().to_owned()));
        }
    }
    Ok(())
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

/// The application's side of live quotas: the default policies, the policy set of each tier,
/// and what to do with a key that has no configuration. Cheap to clone.
///
/// A key's stored configuration decides which set applies: its override if it has one, else
/// its tier's policies if it has a tier this `Limits` defines, else the [`Unconfigured`]
/// behaviour (by default the defaults). Tiers travel with every check (to Redis as script
/// arguments), so a tier's policies change with a redeploy and a key's tier changes at run
/// time.
///
/// # Examples
/// ```
/// use turnstile_core::{Limits, Policy, Unconfigured};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limits = Limits::new(["token-bucket:limit=10,period=1m,name=api".parse::<Policy>()?])?
///     .with_tier("pro", ["token-bucket:limit=1000,period=1m,name=api".parse::<Policy>()?])?
///     .when_unconfigured(Unconfigured::Defaults);
/// assert_eq!(limits.tier("pro").map(|t| t.len()), Some(1));
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    defaults: Arc<[Policy]>,
    tiers: Arc<[Tier]>,
    unconfigured: Unconfigured,
}

impl Limits {
    /// Limits whose default policies are `defaults`, with no tiers.
    ///
    /// # Errors
    /// [`LimitsError::Empty`] or [`LimitsError::DuplicateName`].
    pub fn new(defaults: impl IntoIterator<Item = Policy>) -> Result<Self, LimitsError> {
        let defaults: Arc<[Policy]> = defaults.into_iter().collect();
        validate_policy_set(&defaults)?;
        Ok(Limits {
            defaults,
            tiers: Arc::from([]),
            unconfigured: Unconfigured::Defaults,
        })
    }

    /// Adds the tier `name` with its policies.
    ///
    /// # Errors
    /// [`LimitsError::TierName`], [`LimitsError::DuplicateTier`], [`LimitsError::Empty`] or
    /// [`LimitsError::DuplicateName`].
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
    pub fn when_unconfigured(self, unconfigured: Unconfigured) -> Self {
        Limits {
            unconfigured,
            ..self
        }
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

    /// What happens to a key with no configuration.
    pub fn unconfigured(&self) -> Unconfigured {
        self.unconfigured
    }

    /// Which policies apply to a key with `config`, and the [`Applied`] that says why.
    /// `None` policies mean no policy applies ([`Applied::Denied`] or [`Applied::Unlimited`]).
    pub fn resolve<'a>(&'a self, config: Option<&'a KeyConfig>) -> (Option<&'a [Policy]>, Applied) {
        resolve(config, &self.defaults, &self.tiers, self.unconfigured)
    }
}

impl From<Policy> for Limits {
    fn from(policy: Policy) -> Self {
        Limits {
            defaults: Arc::from([policy]),
            tiers: Arc::from([]),
            unconfigured: Unconfigured::Defaults,
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

/// Which policy set applies to a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Which {
    Defaults,
    /// The tier at this index.
    Tier(usize),
    Override,
    /// No policy: denied or unlimited.
    Nothing,
}

/// Which policy set applies to a key with `config`, and the [`Applied`] that says why.
pub(crate) fn resolve_which(
    config: Option<&KeyConfig>,
    tiers: &[Tier],
    unconfigured: Unconfigured,
) -> (Which, Applied) {
    if let Some(c) = config {
        if c.policies.is_some() {
            return (Which::Override, Applied::Override);
        }
        if let Some((i, (name, _))) = c
            .tier
            .as_deref()
            .and_then(|t| tiers.iter().enumerate().find(|(_, (n, _))| &**n == t))
        {
            return (Which::Tier(i), Applied::Tier(Arc::clone(name)));
        }
    }
    match unconfigured {
        Unconfigured::Deny => (Which::Nothing, Applied::Denied),
        Unconfigured::Allow => (Which::Nothing, Applied::Unlimited),
        _ => (Which::Defaults, Applied::Defaults),
    }
}

/// The policies that apply to a key with `config` (see [`Limits::resolve`]).
pub(crate) fn resolve<'a>(
    config: Option<&'a KeyConfig>,
    defaults: &'a [Policy],
    tiers: &'a [Tier],
    unconfigured: Unconfigured,
) -> (Option<&'a [Policy]>, Applied) {
    let (which, applied) = resolve_which(config, tiers, unconfigured);
    let set = match which {
        Which::Defaults => Some(defaults),
        Which::Tier(i) => Some(&*tiers[i].1),
        Which::Override => config.and_then(|c| c.policies.as_deref()),
        Which::Nothing => None,
    };
    (set, applied)
}
