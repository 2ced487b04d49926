//! The rule of live quotas, per policy (see the [module](super) docs): which policies a check
//! of a key applies, and where each takes its parameters from. One function, [`resolve`],
//! for every backend path that needs it (the in-memory backend's checks, refunds and
//! resets; `Limits::resolve`); the Redis script's `applying` (`lua/general.lua`) is its
//! twin. Linear in the policies: names are looked up by scanning a few, or through a map.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::{Applied, KeyConfig, Mode, Source, Tier};
use crate::policy::Policy;

/// Up to this many policies, a set is searched by scanning it; beyond, through a map (also
/// the in-memory backend's rule for a key's slots).
pub(crate) const SCAN_MAX: usize = 8;

/// Where one policy of a check comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pick {
    /// The default policy at this index, as it is.
    Default(usize),
    /// The policy at this index of the key's override.
    Override(usize),
    /// The policy at this index of the key's stored tier.
    Tier(usize),
}

/// Which policies a check of a key applies (see [`resolve`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Resolution {
    /// No policy: a key without configuration, denied ([`Mode::Deny`]).
    Denied,
    /// No policy: admitted without limit.
    Unlimited,
    /// Every default policy as it is, in order (most checks: no list is made).
    AllDefaults,
    /// These policies, in the defaults' order; `tier`: the index of the key's stored tier
    /// among the limits' tiers, when it is one of them.
    Picks {
        picks: Vec<Pick>,
        tier: Option<usize>,
    },
}

/// The policies a check of a key with `config` applies, under `defaults`, `tiers` and `mode`:
/// for each default policy, the key's override's policy of its name, else its stored tier's
/// (a tier of `tiers`), else the default itself — or, under [`Mode::StoredOnly`], nothing.
/// A key with neither an override nor a known tier gets what `mode` says.
pub(crate) fn resolve(
    config: Option<&KeyConfig>,
    defaults: &[Policy],
    tiers: &[Tier],
    mode: Mode,
) -> Resolution {
    let over = config.and_then(|c| c.policies.as_deref());
    let tier = config
        .and_then(|c| c.tier.as_deref())
        .and_then(|t| tiers.iter().position(|(n, _)| **n == *t));
    if over.is_none() && tier.is_none() {
        return match mode {
            Mode::Defaults => Resolution::AllDefaults,
            Mode::Deny => Resolution::Denied,
            Mode::Allow | Mode::StoredOnly => Resolution::Unlimited,
        };
    }
    let over = over.map(|o| ByName::new(o, defaults.len()));
    let in_tier = tier.map(|i| ByName::new(&tiers[i].1, defaults.len()));
    let mut picks = Vec::with_capacity(defaults.len());
    for (i, d) in defaults.iter().enumerate() {
        let name = d.name();
        let pick = match (
            over.as_ref().and_then(|o| o.find(name)),
            in_tier.as_ref().and_then(|t| t.find(name)),
        ) {
            (Some(j), _) => Pick::Override(j),
            (None, Some(j)) => Pick::Tier(j),
            (None, None) if mode == Mode::StoredOnly => continue,
            (None, None) => Pick::Default(i),
        };
        picks.push(pick);
    }
    if picks.is_empty() {
        Resolution::Unlimited
    } else if picks.iter().all(|p| matches!(p, Pick::Default(_))) {
        Resolution::AllDefaults
    } else {
        Resolution::Picks { picks, tier }
    }
}

impl Resolution {
    /// The picks, in order, of a check whose defaults number `defaults`.
    pub(crate) fn picks(&self, defaults: usize) -> impl Iterator<Item = Pick> + '_ {
        let (all, list): (usize, &[Pick]) = match self {
            Resolution::AllDefaults => (defaults, &[]),
            Resolution::Picks { picks, .. } => (0, picks),
            _ => (0, &[]),
        };
        (0..all).map(Pick::Default).chain(list.iter().copied())
    }

    /// The policy `pick` stands for, and where it came from.
    pub(crate) fn policy<'a>(
        &self,
        pick: Pick,
        config: Option<&'a KeyConfig>,
        defaults: &'a [Policy],
        tiers: &'a [Tier],
    ) -> Option<(&'a Policy, Source)> {
        match pick {
            Pick::Default(i) => Some((defaults.get(i)?, Source::Defaults)),
            Pick::Override(j) => Some((config?.policies.as_deref()?.get(j)?, Source::Override)),
            Pick::Tier(j) => {
                let (name, set) = tiers.get(self.tier()?)?;
                Some((set.get(j)?, Source::Tier(Arc::clone(name))))
            }
        }
    }

    /// The index of the key's stored tier among the limits' tiers, when a policy comes from
    /// it.
    pub(crate) fn tier(&self) -> Option<usize> {
        match self {
            Resolution::Picks { tier, .. } => *tier,
            _ => None,
        }
    }

    /// The [`Applied`] that sums the picks up: the override if a policy comes from it, else
    /// the stored tier if one does, else the defaults; or why no policy applies.
    pub(crate) fn applied(&self, tiers: &[Tier]) -> Applied {
        match self {
            Resolution::Denied => Applied::Denied,
            Resolution::Unlimited => Applied::Unlimited,
            Resolution::AllDefaults => Applied::Defaults,
            Resolution::Picks { picks, tier } => {
                if picks.iter().any(|p| matches!(p, Pick::Override(_))) {
                    Applied::Override
                } else {
                    match tier.and_then(|i| tiers.get(i)) {
                        Some((name, _)) if picks.iter().any(|p| matches!(p, Pick::Tier(_))) => {
                            Applied::Tier(Arc::clone(name))
                        }
                        _ => Applied::Defaults,
                    }
                }
            }
        }
    }
}

/// A policy set searched by name: a scan for a few policies, a map for more (so `lookups`
/// searches of a large set stay linear).
pub(crate) struct ByName<'a> {
    set: &'a [Policy],
    map: Option<HashMap<&'a str, usize>>,
}

impl<'a> ByName<'a> {
    /// `set`, to be searched about `lookups` times.
    pub(crate) fn new(set: &'a [Policy], lookups: usize) -> Self {
        let map = (set.len() > SCAN_MAX && lookups > 1)
            .then(|| set.iter().enumerate().map(|(i, p)| (p.name(), i)).collect());
        ByName { set, map }
    }

    /// The index of the policy named `name`.
    pub(crate) fn find(&self, name: &str) -> Option<usize> {
        match &self.map {
            Some(m) => m.get(name).copied(),
            None => self.set.iter().position(|p| p.name() == name),
        }
    }
}

/// The first of `names` that an earlier one repeats: pairwise for a few, through a set for
/// more (linear).
pub(crate) fn first_repeated<'a>(
    names: impl ExactSizeIterator<Item = &'a str> + Clone,
) -> Option<&'a str> {
    if names.len() <= SCAN_MAX {
        let all = names.clone();
        return names
            .enumerate()
            .find(|&(i, n)| all.clone().take(i).any(|m| m == n))
            .map(|(_, n)| n);
    }
    let mut seen = HashSet::with_capacity(names.len());
    names.into_iter().find(|n| !seen.insert(*n))
}
