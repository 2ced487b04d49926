//! The check script's arguments and the configuration script's override, encoded (see
//! `mod.rs` for the protocol).

use turnstile_core::policy::MAX_EXACT;
use turnstile_core::{Policy, Unconfigured};

use super::encoded::encoded_set;
use crate::call::Call;

/// What a call of the check script does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Check,
    Refund,
    Reset,
}

/// The policy sets a call carries: the defaults, the tiers, the unconfigured behaviour.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sets<'a> {
    pub(crate) defaults: &'a [Policy],
    pub(crate) tiers: &'a [(&'a str, &'a [Policy])],
    pub(crate) unconfigured: Unconfigured,
    /// Only the policies the key's stored configuration lists apply
    /// (`Limits::stored_only`; mode `stored`).
    pub(crate) stored_only: bool,
}

/// Adds one call's arguments to `inv` (see `lua/check.lua` for the layout).
pub(crate) fn check_args(
    inv: &mut Call,
    sets: Sets<'_>,
    op: Op,
    cost: u64,
    now_ms: Option<u64>,
    min_ttl_ms: u64,
) {
    // Any cost above 2^53 − 1 is above every capacity: the answer ("never") is the same.
    let cost = cost.min(MAX_EXACT);
    let op = match op {
        Op::Check => "check",
        Op::Refund => "refund",
        Op::Reset => "reset",
    };
    let unconfigured = unconfigured_word(sets);
    let formatted;
    let head: &str = match (now_ms, op, unconfigured, min_ttl_ms, cost) {
        // The most common call, spelled out rather than formatted.
        (None, "check", "defaults", 0, 1) => "check defaults 0 1",
        (None, ..) => {
            formatted = format!("{op} {unconfigured} {min_ttl_ms} {cost}");
            &formatted
        }
        (Some(t), ..) => {
            formatted = format!("{op} {unconfigured} {min_ttl_ms} {cost} {t}");
            &formatted
        }
    };
    inv.arg(head);
    set_args(inv, sets);
}

/// The scripts' word for what happens to a key without configuration (`stored`: only the
/// policies the key's stored configuration names apply).
fn unconfigured_word(sets: Sets<'_>) -> &'static str {
    match sets.unconfigured {
        _ if sets.stored_only => "stored",
        Unconfigured::Deny => "deny",
        Unconfigured::Allow => "allow",
        _ => "defaults",
    }
}

/// Adds the policy sets' arguments to `inv`, the defaults first, then each tier (see
/// `lua/check.lua`).
fn set_args(inv: &mut Call, sets: Sets<'_>) {
    inv.arg(&*encoded_set("", sets.defaults, || {
        policy_set("", sets.defaults)
    }));
    for (tier, policies) in sets.tiers {
        inv.arg(&*encoded_set(tier, policies, || policy_set(tier, policies)));
    }
}

/// Adds the arguments of a batch of checks to `inv` (see `lua/batch.lua` for the layout):
/// the checks' costs in order, at most `budget` policy evaluations, at the server's time
/// (`now_ms` `None`) or an explicit one.
pub(crate) fn batch_args(
    inv: &mut Call,
    sets: Sets<'_>,
    costs: &[u64],
    budget: usize,
    now_ms: Option<u64>,
    min_ttl_ms: u64,
) {
    use std::fmt::Write as _;
    let unconfigured = unconfigured_word(sets);
    let mut head = String::with_capacity(32 + 2 * costs.len());
    // (Writing to a String cannot fail.)
    let _ = write!(head, "{budget} check {unconfigured} {min_ttl_ms} ");
    for (i, cost) in costs.iter().enumerate() {
        if i > 0 {
            head.push(',');
        }
        // As for a lone check: any cost above 2^53 − 1 is above every capacity.
        let _ = write!(head, "{}", (*cost).min(MAX_EXACT));
    }
    if let Some(t) = now_ms {
        let _ = write!(head, " {t}");
    }
    inv.arg(head);
    set_args(inv, sets);
}

/// A policy set as the check script takes it (one argument): the tier's name (empty for the
/// defaults), then a line `\n<alg.L.P.B> <name>` per policy. Names and tier names hold no
/// line break (a policy name is printable ASCII; a tier name letters, digits, `-`, `_` and
/// `.`).
pub(crate) fn policy_set(tier: &str, policies: &[Policy]) -> String {
    let mut s = String::with_capacity(tier.len() + 40 * policies.len());
    s.push_str(tier);
    for p in policies {
        s.push('\n');
        s.push_str(&params(p));
        s.push(' ');
        s.push_str(p.name());
    }
    s
}

/// A policy's parameters as the check script takes them and stores them before every
/// state: `alg.L.P.B` in decimal (the algorithm's wire id, limit, period in ms, capacity).
pub(crate) fn params(p: &Policy) -> String {
    format!(
        "{}.{}.{}.{}",
        p.algorithm().wire_id(),
        p.limit(),
        p.period_ms(),
        p.capacity()
    )
}

/// An override as the configuration script stores it: one line "alg L P B name" per policy
/// (the algorithm's wire id, limit, period in ms, capacity, name).
pub(crate) fn encode_override(policies: &[Policy]) -> String {
    let lines: Vec<String> = policies
        .iter()
        .map(|p| {
            format!(
                "{} {} {} {} {}",
                p.algorithm().wire_id(),
                p.limit(),
                p.period_ms(),
                p.capacity(),
                p.name()
            )
        })
        .collect();
    lines.join("\n")
}
