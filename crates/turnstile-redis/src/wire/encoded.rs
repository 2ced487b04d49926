//! The check script's policy-set arguments, encoded once: a call under a policy set it has
//! seen on this thread before copies that set's text rather than formatting every policy's
//! parameters again (the encoding itself is `args::policy_set`).

use std::cell::RefCell;
use std::sync::Arc;

use turnstile_core::Policy;

/// How many policy sets each thread keeps encoded; past it, the oldest is dropped.
const KEPT: usize = 16;

/// One encoded set: its tier's name, its policies, the argument.
type Entry = (Box<str>, Vec<Policy>, Arc<str>);

thread_local! {
    static ENCODED: RefCell<Vec<Entry>> = const { RefCell::new(Vec::new()) };
}

/// `encode()`, the argument of the set `tier`, `policies`, from this thread's cache when an
/// equal set (same tier, policies equal in order: names and parameters, all the argument
/// holds) was encoded before. `encode` must depend on the set only.
pub(crate) fn encoded_set(
    tier: &str,
    policies: &[Policy],
    encode: impl FnOnce() -> String,
) -> Arc<str> {
    ENCODED.with(|cache| {
        let mut cache = cache.borrow_mut();
        if let Some((_, _, text)) = cache
            .iter()
            .find(|(t, ps, _)| **t == *tier && ps.as_slice() == policies)
        {
            return Arc::clone(text);
        }
        let text: Arc<str> = encode().into();
        if cache.len() >= KEPT {
            cache.remove(0);
        }
        cache.push((tier.into(), policies.to_vec(), Arc::clone(&text)));
        text
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use turnstile_core::Algorithm;

    /// A stand-in for `args::policy_set`: the set's tier and policies, spelled out.
    fn spelled(tier: &str, policies: &[Policy]) -> String {
        let mut s = tier.to_string();
        for p in policies {
            s.push_str(&format!("\n{} {} {}", p.name(), p.limit(), p.period_ms()));
        }
        s
    }

    fn cached(tier: &str, policies: &[Policy]) -> String {
        encoded_set(tier, policies, || spelled(tier, policies)).to_string()
    }

    fn policy(name: &str, limit: u64) -> Policy {
        Policy::new(Algorithm::TokenBucket, limit, Duration::from_secs(1))
            .unwrap()
            .with_name(name)
            .unwrap()
    }

    #[test]
    fn an_encoded_set_is_the_sets_own_text_whatever_the_cache_holds() {
        let a = [policy("a", 10), policy("b", 20)];
        // More sets than the cache keeps, each asked twice: always its own text.
        for round in 0..2 {
            for limit in 1..=(KEPT as u64 + 4) {
                let set = [policy("a", limit)];
                assert_eq!(cached("", &set), spelled("", &set), "round {round}");
            }
            assert_eq!(cached("", &a), spelled("", &a));
            assert_eq!(cached("pro", &a), spelled("pro", &a));
        }
        // Another name or another order is another set.
        assert_eq!(cached("x", &a), spelled("x", &a));
        let renamed = [policy("a", 10), policy("c", 20)];
        assert_eq!(cached("", &renamed), spelled("", &renamed));
        let swapped = [policy("b", 20), policy("a", 10)];
        assert_eq!(cached("", &swapped), spelled("", &swapped));
    }
}
