//! The scripts' replies, parsed and checked (see `mod.rs` for the protocol).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use turnstile_core::decision::exact_ms;
use turnstile_core::policy::MAX_EXACT;
use turnstile_core::{
    Algorithm, Applied, BackendError, Decision, KeyConfig, Policy, PolicyDecision, Source,
};

use super::args::Sets;
use crate::fault::redis_error;

/// Values per policy of an override in the check script's reply before its result: its
/// parameters and name (the caller does not know them).
const OVERRIDE_PARTS: usize = 5;

fn bad(what: &str) -> BackendError {
    BackendError::Script(format!("unexpected reply from the check script: {what}"))
}

/// A script's reply as the array every script returns.
///
/// # Errors
/// [`BackendError::Script`] for any other reply.
pub(crate) fn array(reply: Value, script: &str) -> Result<Vec<Value>, BackendError> {
    match reply {
        Value::Array(v) => Ok(v),
        other => Err(BackendError::Script(format!(
            "unexpected reply from the {script} script: {other:?} is not an array"
        ))),
    }
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
///
/// # Errors
/// What is wrong with the parts: an unknown algorithm id, or parameters no policy has.
pub(crate) fn policy_from_parts(
    alg: i64,
    limit: u64,
    period_ms: u64,
    capacity: u64,
    name: &str,
) -> Result<Policy, String> {
    let algorithm = u64::try_from(alg)
        .ok()
        .and_then(Algorithm::from_wire_id)
        .ok_or_else(|| format!("algorithm id {alg} is not one the Redis scripts know"))?;
    let burst = algorithm.is_bucket().then_some(capacity);
    let p = Policy::from_parts(algorithm, limit, period_ms, burst).map_err(|e| e.to_string())?;
    if p.capacity() != capacity {
        return Err(format!("capacity {capacity} does not match the policy's"));
    }
    p.with_name(name).map_err(|e| e.to_string())
}

/// Parses the check script's reply (see `lua/check.lua`'s header) into the time it used and
/// a decision. Policies the caller passed are reused as they are (the reply gives their
/// results in the caller's order, or marks which source each default policy's parameters
/// came from); an override's are rebuilt from the parameters and names the reply carries.
/// Every value is checked: a reply of another shape is a [`BackendError::Script`]. Linear
/// in the policies.
pub(crate) fn parse_reply(
    reply: &[Value],
    sets: Sets<'_>,
) -> Result<(u64, Decision), BackendError> {
    // The compact reply of the common case: -1 - now, then the defaults' results (version 0).
    if let [Value::Int(head), rest @ ..] = reply {
        if *head < 0 {
            let now = u64::try_from(-1 - *head).map_err(|_| bad("now"))?;
            return Ok((now, policy_results(sets.defaults, rest, 0)?));
        }
    }
    let [now, version, applied, rest @ ..] = reply else {
        return Err(bad("too short"));
    };
    let (now, version, applied) = (nat(now)?, nat(version)?, int(applied)?);
    let decision = match (applied, rest) {
        (0, _) => policy_results(sets.defaults, rest, version)?,
        (1 | 2, [tier, rest @ ..]) => marked_results(sets, &text(tier)?, rest, version)?,
        (1 | 2, []) => return Err(bad("no tier name")),
        (3, []) => Decision::unconfigured_denied(version),
        (4, []) => Decision::unlimited(version),
        _ => return Err(bad("applied")),
    };
    Ok((now, decision))
}

/// One check's outcome in a batch's reply: the time the script used and the decision, or the
/// check's own error.
pub(crate) type Decided = Result<(u64, Decision), BackendError>;

/// Parses the batch script's reply (see `lua/batch.lua`) to a call of `count` checks whose
/// keys are on `node`: the outcomes of the checks it decided, in order — the first ones, at
/// least one and at most `count`; the caller sends the others again. A check's reply of
/// another shape is that check's [`BackendError::Script`]; a reply whose lengths do not add
/// up is the call's.
pub(crate) fn parse_batch(
    reply: &[Value],
    sets: Sets<'_>,
    count: usize,
    node: &str,
) -> Result<Vec<Decided>, BackendError> {
    let mut out = Vec::with_capacity(count);
    let mut at = 0;
    while at < reply.len() {
        if out.len() == count {
            return Err(bad("more checks decided than sent"));
        }
        let n = int(&reply[at])?;
        at += 1;
        if n == -1 {
            let why = text(reply.get(at).ok_or_else(|| bad("length"))?)?;
            at += 1;
            out.push(Err(check_error(&why, node)));
            continue;
        }
        let n = usize::try_from(n).map_err(|_| bad("a check's length"))?;
        let one = reply.get(at..at + n).ok_or_else(|| bad("length"))?;
        at += n;
        out.push(parse_reply(one, sets));
    }
    if out.is_empty() {
        return Err(bad("no check decided"));
    }
    Ok(out)
}

/// The error of a check in a batch whose error reply's text is `why`: what the same error
/// reply gets when the check is sent alone (see `fault::redis_error`).
fn check_error(why: &str, node: &str) -> BackendError {
    let line = format!("-{}\r\n", why.replace(['\r', '\n'], " "));
    match redis::parse_redis_value(line.as_bytes()).map(Value::extract_error) {
        Ok(Err(e)) => redis_error(e, node),
        _ => BackendError::Script(why.to_owned()),
    }
}

/// The decision from the reply's results `rest` of `known`, the caller's own policies, in
/// order.
fn policy_results(
    known: &[Policy],
    rest: &[Value],
    version: u64,
) -> Result<Decision, BackendError> {
    let mut at = 0;
    let decision = known
        .iter()
        .map(|p| next_result(p.clone(), rest, &mut at))
        .collect::<Result<Decision, BackendError>>()?;
    if at != rest.len() {
        return Err(bad("length"));
    }
    Ok(decision.with_applied(Applied::Defaults, version))
}

/// The decision from a reply whose values `rest` mark, for each default policy, where its
/// parameters came from (-1: it does not apply; 0: the default; 1: the key's override, whose
/// parameters and name follow; 2: the key's stored tier `tier`, a set the call carried),
/// each followed by its result.
fn marked_results(
    sets: Sets<'_>,
    tier: &str,
    rest: &[Value],
    version: u64,
) -> Result<Decision, BackendError> {
    let tier_set = match tier {
        "" => None,
        t => Some(
            sets.tiers
                .iter()
                .find(|(n, _)| *n == t)
                .map(|(_, ps)| ByName::new(ps))
                .ok_or_else(|| bad("a tier the call did not carry"))?,
        ),
    };
    let mut at = 0;
    let mut results = Vec::with_capacity(sets.defaults.len());
    let mut sources = Vec::with_capacity(sets.defaults.len());
    for d in sets.defaults {
        let mark = int(rest.get(at).ok_or_else(|| bad("length"))?)?;
        at += 1;
        let (policy, source) = match mark {
            -1 => continue,
            0 => (d.clone(), Source::Defaults),
            1 => (override_policy(rest, &mut at, d.name())?, Source::Override),
            2 => {
                let p = tier_set
                    .as_ref()
                    .and_then(|t| t.get(d.name()))
                    .ok_or_else(|| bad("a tier policy the call did not carry"))?;
                (p.clone(), Source::Tier(Arc::from(tier)))
            }
            _ => return Err(bad("a mark")),
        };
        results.push(next_result(policy, rest, &mut at)?);
        sources.push(source);
    }
    if at != rest.len() || results.is_empty() {
        return Err(bad("length"));
    }
    Ok(Decision::from_policies(results)
        .with_applied(Applied::Defaults, version)
        .with_sources(sources))
}

/// The policies of a set by name: a scan for a few, a map for more (linear look-ups).
enum ByName<'a> {
    Few(&'a [Policy]),
    Many(HashMap<&'a str, &'a Policy>),
}

impl<'a> ByName<'a> {
    fn new(set: &'a [Policy]) -> Self {
        if set.len() <= 8 {
            ByName::Few(set)
        } else {
            ByName::Many(set.iter().map(|p| (p.name(), p)).collect())
        }
    }

    fn get(&self, name: &str) -> Option<&'a Policy> {
        match self {
            ByName::Few(set) => set.iter().find(|p| p.name() == name),
            ByName::Many(map) => map.get(name).copied(),
        }
    }
}

/// An override's policy read from `rest[at..]` (its parameters and name), which must be
/// named `name`; `at` moves past it.
fn override_policy(rest: &[Value], at: &mut usize, name: &str) -> Result<Policy, BackendError> {
    let r = rest
        .get(*at..*at + OVERRIDE_PARTS)
        .ok_or_else(|| bad("length"))?;
    let stored = text(&r[4])?;
    if stored != name {
        return Err(bad("an override policy of another name"));
    }
    let (alg, limit, period, cap) = (int(&r[0])?, nat(&r[1])?, nat(&r[2])?, nat(&r[3])?);
    *at += OVERRIDE_PARTS;
    policy_from_parts(alg, limit, period, cap, &stored).map_err(|why| {
        BackendError::InvalidState(format!("stored override policy {name:?} is invalid: {why}"))
    })
}

/// The result of `policy` from `rest[at..]`; `at` moves past what was read.
fn next_result(
    policy: Policy,
    rest: &[Value],
    at: &mut usize,
) -> Result<PolicyDecision, BackendError> {
    let width = policy.algorithm().wire_width();
    let r = rest.get(*at..*at + width).ok_or_else(|| bad("length"))?;
    *at += width;
    policy_result(policy, r)
}

/// One policy's result from its `Algorithm::wire_width` values (see `lua/check.lua`'s
/// header): durations are numerators over L ms for the buckets, whole ms for the windows,
/// and the sliding window's retry is whole + num / den ms; retry -1 is never, and the
/// policy admits exactly when its retry is 0.
fn policy_result(policy: Policy, r: &[Value]) -> Result<PolicyDecision, BackendError> {
    let den = if policy.algorithm().is_bucket() {
        u128::from(policy.limit())
    } else {
        1
    };
    let over =
        |v: &Value| -> Result<Duration, BackendError> { Ok(exact_ms(u128::from(nat(v)?), den)) };
    let (retry, r) = if policy.algorithm() == Algorithm::SlidingWindow {
        let (w, n, d) = (int(&r[0])?, nat(&r[1])?, nat(&r[2])?);
        let retry = match w {
            -1 if n == 0 && d == 1 => None,
            _ => {
                let w = u64::try_from(w).map_err(|_| bad("a retry"))?;
                if d == 0 || n >= d {
                    return Err(bad("a retry"));
                }
                let (w, n, d) = (u128::from(w), u128::from(n), u128::from(d));
                Some(exact_ms(w * d + n, d))
            }
        };
        (retry, &r[2..])
    } else {
        let retry = match int(&r[0])? {
            -1 => None,
            _ => Some(over(&r[0])?),
        };
        (retry, r)
    };
    // r: [_, remaining, reset, (delay)]
    let allowed = retry == Some(Duration::ZERO);
    let delay = if policy.algorithm() == Algorithm::LeakyBucket {
        over(&r[3])?
    } else {
        Duration::ZERO
    };
    let remaining = nat(&r[1])?;
    let reset = over(&r[2])?;
    Ok(PolicyDecision::new(
        policy, allowed, remaining, retry, reset, delay,
    ))
}

/// A non-negative integer as the scripts store it: decimal digits only, at most 2^53 − 1 (the
/// scripts' `nat` in `lua/prelude.lua`). `u64::from_str` alone would also take `+5`.
fn stored_integer(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok().filter(|n| *n <= MAX_EXACT)
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
            let mut num = || f.next().and_then(stored_integer);
            let (a, l, p, b) = (num(), num(), num(), num());
            let name = f.next();
            let (Some(a), Some(l), Some(p), Some(b), Some(name)) = (a, l, p, b, name) else {
                return Err(invalid());
            };
            let a = i64::try_from(a).map_err(|_| invalid())?;
            let policy = policy_from_parts(a, l, p, b, name).map_err(|why| {
                BackendError::InvalidState(format!(
                    "the stored override of {key:?} is invalid: {why}"
                ))
            })?;
            ps.push(policy);
        }
        turnstile_core::quota::validate_policy_set(&ps).map_err(|why| {
            BackendError::InvalidState(format!("the stored override of {key:?} is invalid: {why}"))
        })?;
        Some(ps)
    };
    Ok(KeyConfig::new(policies, (!t.is_empty()).then_some(t), v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::args::encode_override;
    use turnstile_core::Unconfigured;

    #[test]
    fn unknown_script_ids_are_typed_errors() {
        for id in [0, 7, -1, i64::MAX] {
            let err = policy_from_parts(id, 5, 1000, 5, "p").unwrap_err();
            assert!(err.contains(&format!("algorithm id {id}")), "{id}: {err}");
        }
        let reply = [
            Value::BulkString(b"7 5 1000 5 p".to_vec()),
            Value::BulkString(Vec::new()),
            Value::Int(1),
        ];
        let err = parse_config(&reply, "k").unwrap_err();
        assert!(matches!(err, BackendError::InvalidState(_)), "{err}");
        assert!(err.to_string().contains("algorithm id 7"), "{err}");
        // A check reply naming an override policy (applied 1) of an unknown algorithm id.
        let s = |v: &str| Value::BulkString(v.as_bytes().to_vec());
        // applied 1, no stored tier (''), policy p marked 1: the override's.
        let mut reply = vec![
            Value::Int(0),
            Value::Int(1),
            Value::Int(1),
            s(""),
            Value::Int(1),
        ];
        reply.extend([
            Value::Int(7),
            Value::Int(5),
            Value::Int(1000),
            Value::Int(5),
            s("p"),
        ]);
        reply.extend([Value::Int(0), Value::Int(4), Value::Int(200)]);
        let p = [Policy::token_bucket(5, Duration::from_secs(1))
            .unwrap()
            .with_name("p")
            .unwrap()];
        let sets = Sets {
            defaults: &p,
            tiers: &[],
            unconfigured: Unconfigured::Defaults,
            stored_only: false,
        };
        let err = parse_reply(&reply, sets).unwrap_err();
        assert!(matches!(err, BackendError::InvalidState(_)), "{err}");
        assert!(err.to_string().contains("algorithm id 7"), "{err}");
    }

    #[test]
    fn a_batch_reply_is_each_checks_reply_after_its_length_or_its_own_error() {
        let a = Policy::fixed_window(3, Duration::from_secs(60))
            .unwrap()
            .with_name("a")
            .unwrap();
        let defaults = [a];
        let sets = Sets {
            defaults: &defaults,
            tiers: &[],
            unconfigured: Unconfigured::Defaults,
            stored_only: false,
        };
        let s = |v: &str| Value::BulkString(v.as_bytes().to_vec());
        let i = Value::Int;
        // Two compact replies (-1 - now, then retry, remaining, reset), an error between.
        let one = |left| [i(4), i(-8), i(0), i(left), i(60_000)];
        let mut reply = one(2).to_vec();
        reply.extend([i(-1), s("TURNSTILE_STATE bad state at k")]);
        reply.extend(one(1));
        let got = parse_batch(&reply, sets, 3, "n").unwrap();
        assert_eq!(got.len(), 3);
        let (now, d) = got[0].as_ref().unwrap();
        assert_eq!((*now, d.remaining()), (7, 2));
        assert!(got[1].is_err());
        assert_eq!(got[2].as_ref().unwrap().1.remaining(), 1);
        // Fewer decided than sent: the first ones; more, or lengths that do not add up, or
        // none: the call's error.
        assert_eq!(parse_batch(&reply, sets, 4, "n").unwrap().len(), 3);
        assert!(parse_batch(&reply, sets, 2, "n").is_err());
        assert!(parse_batch(&reply[..4], sets, 3, "n").is_err());
        assert!(parse_batch(&[], sets, 3, "n").is_err());
    }

    #[test]
    fn a_compact_reply_gives_the_callers_own_policies_their_results_in_order() {
        // applied 2 (a tier): no parameters or names, each default policy marked 2 (the
        // tier's policy of its name) then its result: a token bucket's retry, remaining and
        // reset as numerators over L ms, a fixed window's in whole ms.
        let a = Policy::token_bucket(5, Duration::from_secs(1))
            .unwrap()
            .with_name("a")
            .unwrap();
        let b = Policy::fixed_window(3, Duration::from_secs(60))
            .unwrap()
            .with_name("b")
            .unwrap();
        let gold = [b.clone(), a.clone()];
        let tiers = [("gold", &gold[..])];
        let defaults = [
            Policy::token_bucket(1, Duration::from_secs(1))
                .unwrap()
                .with_name("a")
                .unwrap(),
            Policy::fixed_window(1, Duration::from_secs(60))
                .unwrap()
                .with_name("b")
                .unwrap(),
        ];
        let sets = Sets {
            defaults: &defaults,
            tiers: &tiers,
            unconfigured: Unconfigured::Defaults,
            stored_only: false,
        };
        let s = |v: &str| Value::BulkString(v.as_bytes().to_vec());
        let i = Value::Int;
        // header: now 7, version 3, applied 2, the tier's name
        let mut reply = vec![i(7), i(3), i(2), s("gold")];
        // a: admitted, 4 left, reset 1001 / 5 ms; b: denied, retry 30 s, 2 left, reset 30 s
        reply.extend([i(2), i(0), i(4), i(1001)]);
        reply.extend([i(2), i(30_000), i(2), i(30_000)]);
        let (now, d) = parse_reply(&reply, sets).unwrap();
        assert_eq!(now, 7);
        assert_eq!(d.version(), 3);
        assert_eq!(d.policies().len(), 2);
        assert_eq!(d.applied(), &Applied::Tier("gold".into()));
        let (pa, pb) = (&d.policies()[0], &d.policies()[1]);
        assert_eq!(pa.policy(), &a);
        assert!(pa.allowed());
        assert_eq!(pa.remaining(), 4);
        assert_eq!(pa.retry_after(), Some(Duration::ZERO));
        assert_eq!(pa.reset_after(), Duration::from_micros(200_200));
        assert_eq!(pb.policy(), &b);
        assert!(!pb.allowed());
        assert_eq!(pb.remaining(), 2);
        assert_eq!(pb.retry_after(), Some(Duration::from_secs(30)));
        assert!(!d.allowed());
        // One value short, one too many, or a count other than the tier's policy count.
        let mut short = reply.clone();
        short.truncate(reply.len() - 1);
        let mut long = reply.clone();
        long.push(i(0));
        let one = reply[..8].to_vec();
        for bad in [short, long, one] {
            assert!(matches!(
                parse_reply(&bad, sets),
                Err(BackendError::Script(_))
            ));
        }
        // A tier the call did not carry; no tier name; an unknown applied.
        let mut other = reply.clone();
        other[3] = s("silver");
        assert!(matches!(
            parse_reply(&other, sets),
            Err(BackendError::Script(_))
        ));
        for bad in [vec![i(7), i(3), i(2)], vec![i(7), i(3), i(5)]] {
            assert!(matches!(
                parse_reply(&bad, sets),
                Err(BackendError::Script(_))
            ));
        }
        // Negative values other than retry's -1 (never), and a sliding window's retry whose
        // fraction is not below its denominator.
        let mut neg = reply.clone();
        neg[5] = i(-2);
        assert!(parse_reply(&neg, sets).is_err());
        let sw = [Policy::sliding_window(3, Duration::from_secs(1))
            .unwrap()
            .with_name("w")
            .unwrap()];
        let sw_sets = Sets {
            defaults: &sw,
            tiers: &[],
            unconfigured: Unconfigured::Defaults,
            stored_only: false,
        };
        let head = [i(7), i(0), i(0)];
        let mut ok = head.to_vec();
        ok.extend([i(333), i(1), i(3), i(0), i(1500)]);
        let (_, d) = parse_reply(&ok, sw_sets).unwrap();
        assert_eq!(
            d.policies()[0].retry_after(),
            Some(Duration::from_nanos(333_333_334))
        );
        let mut never = head.to_vec();
        never.extend([i(-1), i(0), i(1), i(0), i(1500)]);
        assert_eq!(
            parse_reply(&never, sw_sets).unwrap().1.policies()[0].retry_after(),
            None
        );
        for r in [[333, 3, 3], [333, 1, 0], [-1, 1, 1]] {
            let mut bad = head.to_vec();
            bad.extend([i(r[0]), i(r[1]), i(r[2]), i(0), i(1500)]);
            assert!(parse_reply(&bad, sw_sets).is_err(), "{r:?}");
        }
    }

    #[test]
    fn stored_integers_are_digits_only_up_to_2_53_minus_1() {
        for (text, want) in [
            ("0", Some(0)),
            ("007", Some(7)),
            ("9007199254740991", Some(MAX_EXACT)),
            ("9007199254740992", None),
            ("+1", None),
            ("-0", None),
            (" 1", None),
            ("1 ", None),
            ("0x10", None),
            ("1e3", None),
            ("1.0", None),
            ("inf", None),
            ("", None),
            ("١", None), // an Arabic-Indic digit
        ] {
            assert_eq!(stored_integer(text), want, "{text:?}");
        }
    }

    #[test]
    fn stored_overrides_are_read_as_strictly_as_the_scripts_read_them() {
        // The same refusals as parse_override in lua/prelude.lua.
        for o in [
            "+1 5 1000 5 t",
            "1 5 +1000 5 t",
            "1 5 1000 5",
            "1 5 1000 5 ",
            "1 5 1000 5 t\n",
            "1 5 1000 5 t\n\n1 5 1000 5 u",
            "1 5 1000 5 t\n1 5 1000 5 t",
            "1 5 1000 5 a\"b",
            "4 5 1000 6 w",
            "1 4294967295 31536000000 4294967295 t",
        ] {
            let reply = [
                Value::BulkString(o.as_bytes().to_vec()),
                Value::BulkString(Vec::new()),
                Value::Int(1),
            ];
            let err = parse_config(&reply, "k").unwrap_err();
            assert!(matches!(err, BackendError::InvalidState(_)), "{o:?}: {err}");
        }
    }

    #[test]
    fn a_reply_that_is_not_an_array_is_a_script_error() {
        for v in [Value::Nil, Value::Int(1), Value::Okay] {
            let err = array(v, "check").unwrap_err();
            assert!(matches!(err, BackendError::Script(_)), "{err}");
        }
        assert_eq!(array(Value::Array(vec![]), "check").unwrap(), vec![]);
    }

    #[test]
    fn an_override_round_trips_for_every_algorithm() {
        let policies: Vec<Policy> = Algorithm::ALL
            .into_iter()
            .map(|a| {
                Policy::new(a, 5, Duration::from_secs(1))
                    .unwrap()
                    .with_name(a.as_str())
                    .unwrap()
            })
            .collect();
        // Each policy spelled with its algorithm's wire id, in a set and in an override.
        let (mut set, mut lines) = (String::from("gold"), Vec::new());
        for a in Algorithm::ALL {
            set.push_str(&format!("\n{}.5.1000.5 {a}", a.wire_id()));
            lines.push(format!("{} 5 1000 5 {a}", a.wire_id()));
        }
        assert_eq!(crate::wire::args::policy_set("gold", &policies), set);
        assert_eq!(encode_override(&policies), lines.join("\n"));
        let reply = [
            Value::BulkString(encode_override(&policies).into_bytes()),
            Value::BulkString(Vec::new()),
            Value::Int(1),
        ];
        let config = parse_config(&reply, "k").unwrap();
        assert_eq!(config.policies(), Some(policies.as_slice()));
    }
}
