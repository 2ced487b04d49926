//! The scripts, composed from the pieces in `lua/`, their arguments and their replies.

use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::redis::{Script, ScriptInvocation, Value};
use turnstile_core::{
    exact_ms, Algorithm, Applied, BackendError, Decision, KeyConfig, Policy, PolicyDecision,
    Unconfigured, MAX_EXACT,
};

/// The Lua source of the check script (check, refund, reset): `lua/prelude.lua`, the
/// per-algorithm pieces and `lua/check.lua`, concatenated in that order.
pub const CHECK_SCRIPT: &str = concat!(
    include_str!("../lua/prelude.lua"),
    "\n",
    include_str!("../lua/bucket.lua"),
    "\n",
    include_str!("../lua/gcra.lua"),
    "\n",
    include_str!("../lua/fixed_window.lua"),
    "\n",
    include_str!("../lua/sliding_window.lua"),
    "\n",
    include_str!("../lua/sliding_log.lua"),
    "\n",
    include_str!("../lua/check.lua"),
);

/// The Lua source of the configuration script (`lua/config.lua`).
pub const CONFIG_SCRIPT: &str = include_str!("../lua/config.lua");

pub(crate) fn check_script() -> Script {
    Script::new(CHECK_SCRIPT)
}

pub(crate) fn config_script() -> Script {
    Script::new(CONFIG_SCRIPT)
}

/// The algorithm's id in the scripts.
pub(crate) fn algorithm_id(a: Algorithm) -> u8 {
    match a {
        Algorithm::TokenBucket => 1,
        Algorithm::Gcra => 2,
        Algorithm::LeakyBucket => 3,
        Algorithm::FixedWindow => 4,
        Algorithm::SlidingLog => 5,
        // Algorithm is non-exhaustive; SlidingWindow and any later one map to their own id.
        _ => 6,
    }
}

fn algorithm_of(id: i64) -> Option<Algorithm> {
    Some(match id {
        1 => Algorithm::TokenBucket,
        2 => Algorithm::Gcra,
        3 => Algorithm::LeakyBucket,
        4 => Algorithm::FixedWindow,
        5 => Algorithm::SlidingLog,
        6 => Algorithm::SlidingWindow,
        _ => return None,
    })
}

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
}

/// Adds one call's arguments to `inv` (see `lua/check.lua` for the layout).
pub(crate) fn check_args(
    inv: &mut ScriptInvocation<'_>,
    base: &str,
    sets: Sets<'_>,
    op: Op,
    cost: u64,
    now_ms: Option<u64>,
    min_ttl_ms: u64,
) {
    // Any cost above 2^53 − 1 is above every capacity: the answer ("never") is the same.
    let cost = cost.min(MAX_EXACT);
    inv.arg(now_ms.map_or_else(String::new, |t| t.to_string()))
        .arg(cost)
        .arg(min_ttl_ms)
        .arg(match sets.unconfigured {
            Unconfigured::Deny => "deny",
            Unconfigured::Allow => "allow",
            _ => "defaults",
        })
        .arg(match op {
            Op::Check => "check",
            Op::Refund => "refund",
            Op::Reset => "reset",
        })
        .arg(base)
        .arg(1 + sets.tiers.len());
    let mut set = |tier: &str, policies: &[Policy]| {
        inv.arg(tier).arg(policies.len());
        for p in policies {
            inv.arg(algorithm_id(p.algorithm()))
                .arg(p.limit())
                .arg(p.period_ms())
                .arg(p.capacity())
                .arg(p.name());
        }
    };
    set("", sets.defaults);
    for (tier, policies) in sets.tiers {
        set(tier, policies);
    }
}

/// Integers and strings per policy in the check script's reply.
const PER_POLICY: usize = 16;

fn bad(what: &str) -> BackendError {
    BackendError::Script(format!("unexpected reply from the check script: {what}"))
}

fn int(v: &Value) -> Result<i64, BackendError> {
    match v {
        Value::Int(i) => Ok(*i),
        other => Err(bad(&format!("{other:?} is not an integer"))),
    }
}

fn text(v: &Value) -> Result<String, BackendError> {
    match v {
        Value::BulkString(b) => {
            String::from_utf8(b.clone()).map_err(|_| bad("a name is not UTF-8"))
        }
        Value::SimpleString(s) => Ok(s.clone()),
        other => Err(bad(&format!("{other:?} is not a string"))),
    }
}

fn nat(v: &Value) -> Result<u64, BackendError> {
    u64::try_from(int(v)?).map_err(|_| bad("a negative count"))
}

/// A policy from the parts the scripts store and return.
pub(crate) fn policy_from_parts(
    alg: i64,
    limit: u64,
    period_ms: u64,
    capacity: u64,
    name: &str,
) -> Option<Policy> {
    let algorithm = algorithm_of(alg)?;
    let burst = algorithm.is_bucket().then_some(capacity);
    let p = Policy::from_parts(algorithm, limit, period_ms, burst).ok()?;
    if p.capacity() != capacity {
        return None;
    }
    p.with_name(name).ok()
}

/// Parses the check script's reply into the time it used and a decision. Policies the
/// caller passed are reused as they are (the reply names them); an override's are rebuilt.
pub(crate) fn parse_reply(
    reply: &[Value],
    sets: Sets<'_>,
) -> Result<(u64, Decision), BackendError> {
    if reply.len() < 5 {
        return Err(bad("too short"));
    }
    let now = nat(&reply[0])?;
    let applied = int(&reply[1])?;
    let tier = text(&reply[2])?;
    let version = nat(&reply[3])?;
    let count = usize::try_from(nat(&reply[4])?).map_err(|_| bad("count"))?;
    if reply.len() != 5 + PER_POLICY * count {
        return Err(bad("length"));
    }
    let dur = |w: &Value, n: &Value, d: &Value| -> Result<Duration, BackendError> {
        let (w, n, d) = (
            u128::from(nat(w)?),
            u128::from(nat(n)?),
            u128::from(nat(d)?),
        );
        if d == 0 || n >= d {
            return Err(bad("a duration"));
        }
        Ok(exact_ms(w * d + n, d))
    };
    let known = |name: &str| -> Option<&Policy> {
        match applied {
            0 => sets.defaults.iter().find(|p| p.name() == name),
            2 => sets
                .tiers
                .iter()
                .find(|(t, _)| *t == tier)
                .and_then(|(_, ps)| ps.iter().find(|p| p.name() == name)),
            _ => None,
        }
    };
    let mut decisions = Vec::with_capacity(count);
    for r in reply[5..].chunks_exact(PER_POLICY) {
        let name = text(&r[4])?;
        let (alg, limit, period, cap) = (int(&r[0])?, nat(&r[1])?, nat(&r[2])?, nat(&r[3])?);
        let policy = match known(&name) {
            Some(p) => p.clone(),
            None => policy_from_parts(alg, limit, period, cap, &name).ok_or_else(|| {
                BackendError::InvalidState(format!("stored override policy {name:?} is invalid"))
            })?,
        };
        let allowed = match int(&r[5])? {
            0 => false,
            1 => true,
            _ => return Err(bad("allowed")),
        };
        let remaining = nat(&r[6])?;
        let retry = if int(&r[7])? == -1 {
            None
        } else {
            Some(dur(&r[7], &r[8], &r[9])?)
        };
        decisions.push(PolicyDecision::new(
            policy,
            allowed,
            remaining,
            retry,
            dur(&r[10], &r[11], &r[12])?,
            dur(&r[13], &r[14], &r[15])?,
        ));
    }
    let decision = match applied {
        0 => Decision::from_policies(decisions).with_applied(Applied::Defaults, version),
        1 => Decision::from_policies(decisions).with_applied(Applied::Override, version),
        2 => Decision::from_policies(decisions)
            .with_applied(Applied::Tier(Arc::from(tier.as_str())), version),
        3 => Decision::unconfigured_denied(version),
        4 => Decision::unlimited(version),
        _ => return Err(bad("applied")),
    };
    Ok((now, decision))
}

/// An override as stored: one line "alg L P B name" per policy.
pub(crate) fn encode_override(policies: &[Policy]) -> String {
    policies
        .iter()
        .map(|p| {
            format!(
                "{} {} {} {} {}",
                algorithm_id(p.algorithm()),
                p.limit(),
                p.period_ms(),
                p.capacity(),
                p.name()
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Parses the configuration script's reply.
pub(crate) fn parse_config(reply: &[Value], key: &str) -> Result<KeyConfig, BackendError> {
    let [o, t, v] = reply else {
        return Err(BackendError::Script(
            "unexpected reply from the configuration script".into(),
        ));
    };
    let (o, t, v) = (text(o)?, text(t)?, nat(v)?);
    let invalid =
        || BackendError::InvalidState(format!("the stored override of {key:?} is invalid"));
    let policies = if o.is_empty() {
        None
    } else {
        let mut ps = Vec::new();
        for line in o.split('\n') {
            let mut f = line.splitn(5, ' ');
            let mut num = || f.next().and_then(|s| s.parse::<u64>().ok());
            let (a, l, p, b) = (num(), num(), num(), num());
            let name = f.next();
            let (Some(a), Some(l), Some(p), Some(b), Some(name)) = (a, l, p, b, name) else {
                return Err(invalid());
            };
            let a = i64::try_from(a).map_err(|_| invalid())?;
            ps.push(policy_from_parts(a, l, p, b, name).ok_or_else(invalid)?);
        }
        Some(ps)
    };
    Ok(KeyConfig::new(policies, (!t.is_empty()).then_some(t), v))
}
