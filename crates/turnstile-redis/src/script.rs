//! The check script, composed from the per-algorithm pieces in `lua/`, and its replies.

use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::redis::Script;
use turnstile_core::{exact_ms, Algorithm, BackendError, Decision, Policy, PolicyDecision};

/// The Lua source of the check script: `lua/prelude.lua`, the per-algorithm pieces and
/// `lua/check.lua`, concatenated in that order.
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

pub(crate) fn check_script() -> Script {
    Script::new(CHECK_SCRIPT)
}

/// The algorithm's id in the script's arguments.
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

/// Integers per policy in the script's reply.
const PER_POLICY: usize = 11;

/// Parses the script's reply into the time it used and a decision.
pub(crate) fn parse_reply(
    reply: &[i64],
    policies: &[Policy],
) -> Result<(u64, Decision), BackendError> {
    let bad = || {
        BackendError::Script(format!(
            "unexpected reply from the check script ({} integers for {} policies)",
            reply.len(),
            policies.len()
        ))
    };
    if reply.len() != 1 + PER_POLICY * policies.len() {
        return Err(bad());
    }
    let now = u64::try_from(reply[0]).map_err(|_| bad())?;
    let dur = |w: i64, n: i64, d: i64| -> Result<Duration, BackendError> {
        let (w, n, d) = (
            u128::try_from(w).map_err(|_| bad())?,
            u128::try_from(n).map_err(|_| bad())?,
            u128::try_from(d).map_err(|_| bad())?,
        );
        if d == 0 || n >= d {
            return Err(bad());
        }
        Ok(exact_ms(w * d + n, d))
    };
    let decisions = policies
        .iter()
        .zip(reply[1..].chunks_exact(PER_POLICY))
        .map(|(p, r)| {
            let allowed = match r[0] {
                0 => false,
                1 => true,
                _ => return Err(bad()),
            };
            let remaining = u64::try_from(r[1]).map_err(|_| bad())?;
            let retry = if r[2] == -1 {
                None
            } else {
                Some(dur(r[2], r[3], r[4])?)
            };
            Ok(PolicyDecision::new(
                Arc::clone(p.name_arc()),
                allowed,
                remaining,
                retry,
                dur(r[5], r[6], r[7])?,
                dur(r[8], r[9], r[10])?,
            ))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((now, Decision::from_policies(decisions)))
}
