//! The one rule for policy names, used by the layer builder and by configuration files alike
//! (so `turnstile check-config` prints the names the running layer uses).
//!
//! Two checks share state exactly when key and policy name match. So a rule's policies without
//! an explicit name are named after the rule, `<rule label> <policy string>`, and two rules
//! never share a counter by accident; no two policies of one set (a rule, a tier, the layer's
//! own) may share a name; and policies of one name in different rules share a counter, so
//! their parameters must match.

use turnstile_core::Policy;

use crate::error::InvalidLayer;

/// A policy that breaks the naming rule: which one, and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Misnamed {
    /// The policy's index in the policies checked.
    pub(crate) index: usize,
    /// For a conflict: the index of the earlier policy of that name, whose parameters differ.
    pub(crate) earlier: Option<usize>,
    /// What is wrong: [`InvalidLayer::InvalidPolicyName`],
    /// [`InvalidLayer::DuplicatePolicyName`] or [`InvalidLayer::ConflictingPolicy`].
    pub(crate) error: InvalidLayer,
}

impl From<Misnamed> for InvalidLayer {
    fn from(m: Misnamed) -> Self {
        m.error
    }
}

/// `policies` under the names the layer gives them. With `rule_label` (a rule's policies,
/// `Rule::label`), each policy without an explicit name is named
/// `<rule_label> <policy string>`; without (the layer's own policies, a tier's), every policy
/// keeps its name.
///
/// # Errors
/// The first policy, in order, whose derived name is not a valid policy name
/// ([`InvalidLayer::InvalidPolicyName`], with that name), or whose name an earlier policy of
/// `policies` already has ([`InvalidLayer::DuplicatePolicyName`]).
pub(crate) fn name_policies(
    rule_label: Option<&str>,
    policies: &[Policy],
) -> Result<Vec<Policy>, Misnamed> {
    let mut named: Vec<Policy> = Vec::with_capacity(policies.len());
    for (index, p) in policies.iter().enumerate() {
        let misnamed = |error| Misnamed {
            index,
            earlier: None,
            error,
        };
        let p = match rule_label {
            Some(label) if !p.has_explicit_name() => {
                let name = format!("{label} {}", p.name());
                p.clone()
                    .with_name(&name)
                    .map_err(|_| misnamed(InvalidLayer::InvalidPolicyName(name)))?
            }
            _ => p.clone(),
        };
        if named.iter().any(|q| q.name() == p.name()) {
            return Err(misnamed(InvalidLayer::DuplicatePolicyName(
                p.name().to_owned(),
            )));
        }
        named.push(p);
    }
    Ok(named)
}

/// Checks that policies sharing a name share their parameters (a shared name is a shared
/// counter), over named `policies` of several rules.
///
/// # Errors
/// The first policy, in order, whose name an earlier one with different parameters has
/// ([`InvalidLayer::ConflictingPolicy`]; `earlier` is the first such).
pub(crate) fn check_shared_names<'a>(
    policies: impl IntoIterator<Item = &'a Policy>,
) -> Result<(), Misnamed> {
    let all: Vec<&Policy> = policies.into_iter().collect();
    for (index, p) in all.iter().enumerate() {
        if let Some(earlier) = all[..index]
            .iter()
            .position(|q| q.name() == p.name() && q.fingerprint() != p.fingerprint())
        {
            return Err(Misnamed {
                index,
                earlier: Some(earlier),
                error: InvalidLayer::ConflictingPolicy(p.name().to_owned()),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Policy {
        s.parse().unwrap()
    }

    #[test]
    fn unnamed_policies_are_named_after_their_rule() {
        let set = [
            p("gcra:limit=5,period=1m"),
            p("gcra:limit=9,period=1h,name=x"),
        ];
        let names = |label| -> Vec<String> {
            name_policies(label, &set)
                .unwrap()
                .iter()
                .map(|p| p.name().to_owned())
                .collect()
        };
        assert_eq!(
            names(Some("POST /login")),
            ["POST /login gcra:limit=5,period=1m", "x"]
        );
        assert_eq!(names(None), ["gcra:limit=5,period=1m", "x"]);
    }

    #[test]
    fn misnamed_policies_are_located() {
        let dup = [
            p("gcra:limit=1,period=1s"),
            p("gcra:limit=5,period=1m,name=x"),
            p("gcra:limit=6,period=1m,name=x"),
        ];
        assert_eq!(
            name_policies(Some("r"), &dup),
            Err(Misnamed {
                index: 2,
                earlier: None,
                error: InvalidLayer::DuplicatePolicyName("x".into()),
            })
        );
        assert_eq!(
            name_policies(Some("\"r\""), &dup[..1]),
            Err(Misnamed {
                index: 0,
                earlier: None,
                error: InvalidLayer::InvalidPolicyName("\"r\" gcra:limit=1,period=1s".into()),
            })
        );
        assert_eq!(
            check_shared_names(&dup),
            Err(Misnamed {
                index: 2,
                earlier: Some(1),
                error: InvalidLayer::ConflictingPolicy("x".into()),
            })
        );
        assert_eq!(check_shared_names(&dup[..2]), Ok(()));
    }
}
