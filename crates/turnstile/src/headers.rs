//! The rate-limit header fields: `RateLimit-Policy` and `RateLimit` of
//! draft-ietf-httpapi-ratelimit-headers-10, and `Retry-After` (RFC 9110, section 10.2.3).
//!
//! Both draft fields are RFC 9651 structured-field Lists with one member per policy, named by
//! the policy's name (a String; turnstile's policy names never hold `"` or `\`):
//!
//! - `RateLimit-Policy: "per-ip";q=10;w=60` — `q` the limit; `w` the period in seconds when
//!   it is a whole number of seconds, else `turnstile-period-ms`; a burst other than the
//!   limit as `turnstile-burst`.
//! - `RateLimit: "per-ip";r=7;t=6` — `r` the policy's `remaining`; `t` its `retry_after`
//!   when it denies, else its `reset_after`, in seconds rounded up; no `t` when no wait can
//!   help.
//!
//! Legacy, opt-in ([`RateLimitLayerBuilder::legacy_headers`](crate::RateLimitLayerBuilder::legacy_headers)):
//! `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset` of the binding
//! policy (the one with the smallest `remaining`), `Reset` as delta seconds rounded up.

use std::fmt::Write;

use http::HeaderValue;
use turnstile_core::round::ceil_secs;
use turnstile_core::{Applied, Decision, Policy};

/// The `RateLimit-Policy` header field name (lower case, as HTTP/2 requires).
pub const RATELIMIT_POLICY: http::HeaderName = http::HeaderName::from_static("ratelimit-policy");

/// The `RateLimit` header field name.
pub const RATELIMIT: http::HeaderName = http::HeaderName::from_static("ratelimit");

/// The legacy `X-RateLimit-Limit` header field name.
pub const X_RATELIMIT_LIMIT: http::HeaderName = http::HeaderName::from_static("x-ratelimit-limit");

/// The legacy `X-RateLimit-Remaining` header field name.
pub const X_RATELIMIT_REMAINING: http::HeaderName =
    http::HeaderName::from_static("x-ratelimit-remaining");

/// The legacy `X-RateLimit-Reset` header field name (delta seconds).
pub const X_RATELIMIT_RESET: http::HeaderName = http::HeaderName::from_static("x-ratelimit-reset");

/// The `RateLimit-Policy` value for `policies`, in order.
pub(crate) fn policy_value<'a>(policies: impl IntoIterator<Item = &'a Policy>) -> HeaderValue {
    let mut s = String::new();
    for (i, p) in policies.into_iter().enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        let _ = write!(s, "\"{}\";q={}", p.name(), p.limit());
        if p.period_ms() % 1000 == 0 {
            let _ = write!(s, ";w={}", p.period_ms() / 1000);
        } else {
            let _ = write!(s, ";turnstile-period-ms={}", p.period_ms());
        }
        if let Some(b) = p.burst().filter(|b| *b != p.limit()) {
            let _ = write!(s, ";turnstile-burst={b}");
        }
    }
    // Names are printable ASCII without '"' or '\', so the value is always valid.
    HeaderValue::from_str(&s).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// The `RateLimit` value of `decision`, one member per policy in order.
///
/// Formatted on the stack when it fits (it does for a few policies with names of ordinary
/// length), so building it costs one allocation: the header value's own.
pub(crate) fn ratelimit_value(decision: &Decision) -> HeaderValue {
    let mut buf = StackBuf::new();
    let fits = write_ratelimit(&mut buf, decision).is_ok();
    let value = if fits {
        HeaderValue::from_bytes(buf.as_bytes())
    } else {
        let mut s = String::with_capacity(512);
        let _ = write_ratelimit(&mut s, decision);
        HeaderValue::from_str(&s)
    };
    value.unwrap_or_else(|_| HeaderValue::from_static(""))
}

fn write_ratelimit(w: &mut impl Write, decision: &Decision) -> std::fmt::Result {
    for (i, p) in decision.policies().iter().enumerate() {
        if i > 0 {
            w.write_str(", ")?;
        }
        write!(w, "\"{}\";r={}", p.name(), p.remaining())?;
        let t = if p.allowed() {
            Some(p.reset_after())
        } else {
            p.retry_after()
        };
        if let Some(t) = t {
            write!(w, ";t={}", ceil_secs(t))?;
        }
    }
    Ok(())
}

/// A fixed buffer that formats without allocating; writing past its end is an error.
struct StackBuf {
    buf: [u8; 512],
    len: usize,
}

impl StackBuf {
    fn new() -> Self {
        StackBuf {
            buf: [0; 512],
            len: 0,
        }
    }

    fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl Write for StackBuf {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.len + s.len();
        let dst = self.buf.get_mut(self.len..end).ok_or(std::fmt::Error)?;
        dst.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// Inserts `RateLimit-Policy`, `RateLimit` and, if `legacy`, the `X-RateLimit-*` fields of
/// the binding policy into `headers`, replacing any already there. `policy_header` is the
/// precomputed `RateLimit-Policy` of the default policies, used when they decided; a key's
/// override or tier gets its own. A decision without policies (a key admitted without limit,
/// or denied for having no configuration) gets no rate-limit fields.
pub(crate) fn insert(
    headers: &mut http::HeaderMap,
    policy_header: &HeaderValue,
    decision: &Decision,
    legacy: bool,
) {
    if decision.policies().is_empty() {
        return;
    }
    let policy = match decision.applied() {
        Applied::Defaults => policy_header.clone(),
        _ => policy_value(decision.policies().iter().map(|p| p.policy())),
    };
    headers.insert(RATELIMIT_POLICY, policy);
    headers.insert(RATELIMIT, ratelimit_value(decision));
    if legacy {
        if let Some(b) = decision.binding() {
            headers.insert(X_RATELIMIT_LIMIT, HeaderValue::from(b.policy().limit()));
            headers.insert(X_RATELIMIT_REMAINING, HeaderValue::from(b.remaining()));
            headers.insert(
                X_RATELIMIT_RESET,
                HeaderValue::from(ceil_secs(b.reset_after())),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_header_shapes() {
        let ps: Vec<Policy> = [
            "token-bucket:limit=10,period=1m,name=per-ip",
            "gcra:limit=5,period=250ms,burst=8,name=fast",
        ]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
        assert_eq!(
            policy_value(&ps),
            "\"per-ip\";q=10;w=60, \"fast\";q=5;turnstile-period-ms=250;turnstile-burst=8"
        );
    }

    #[tokio::test]
    async fn deny_cache_reported_a_refilled_policy_as_violated() {
        // Two token buckets on one key, A = 2 per 60 s and B = 1 per 1 s; requests at 0, 100,
        // 1000, 1100 and 2050 ms. At 2050 ms B has refilled: the headers of the in-memory
        // backend and of the deny cache in front of it must be the same.
        use turnstile_core::wrap::DenyCache;
        use turnstile_core::{Backend, MemoryBackend};
        let ps: Vec<Policy> = [
            "token-bucket:limit=2,period=60s,name=A",
            "token-bucket:limit=1,period=1s,name=B",
        ]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
        let plain = MemoryBackend::new();
        let cached = DenyCache::new(MemoryBackend::new());
        let (mut a, mut b) = (None, None);
        for t in [0, 100, 1000, 1100, 2050] {
            a = Some(cached.check_at("k", &ps, 1, t).await.unwrap());
            b = Some(plain.check_at("k", &ps, 1, t).await.unwrap());
        }
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!(ratelimit_value(&b), "\"A\";r=0;t=28, \"B\";r=1;t=0");
        assert_eq!(ratelimit_value(&a), ratelimit_value(&b));
        let violated: Vec<&str> = a.violated().map(|p| p.name()).collect();
        assert_eq!(violated, ["A"]);
        // Within the 1100 ms denial's life the cache answers, with the same header.
        let again = cached.check_at("k", &ps, 1, 2050).await.unwrap();
        assert_eq!(cached.hits(), 1);
        assert_eq!(ratelimit_value(&again), ratelimit_value(&b));
    }
}
