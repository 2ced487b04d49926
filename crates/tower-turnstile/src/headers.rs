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
//! Layers stack: a response that already carries these Lists (from a layer further in)
//! gets this layer's members appended, so a router-wide limit around a per-route one reports
//! both (see the crate's "axum and tonic integration" notes).
//!
//! Legacy, opt-in ([`RateLimitLayerBuilder::legacy_headers`](crate::RateLimitLayerBuilder::legacy_headers)):
//! `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset` of the binding
//! policy (the one with the smallest `remaining`), `Reset` as delta seconds rounded up.

use http::HeaderValue;
use turnstile_core::round::ceil_secs;
use turnstile_core::{Applied, Decision, Policy, Source};

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

/// Where header values (and the denial body) are written: bytes and decimal integers,
/// without `core::fmt`.
pub(crate) trait Out {
    /// Appends `bytes`.
    fn put(&mut self, bytes: &[u8]);

    /// Appends `n` in decimal.
    #[inline]
    fn put_u64(&mut self, n: u64) {
        self.put(itoa::Buffer::new().format(n).as_bytes());
    }
}

impl Out for Vec<u8> {
    #[inline]
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// A header value being written: on the stack while it fits (a few policies with names of
/// ordinary length; the stack part is not zeroed first), else on the heap.
pub(crate) struct ValueBuf {
    stack: arrayvec::ArrayVec<u8, 256>,
    heap: Option<Vec<u8>>,
}

impl ValueBuf {
    pub(crate) fn new() -> Self {
        ValueBuf {
            stack: arrayvec::ArrayVec::new(),
            heap: None,
        }
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        match &self.heap {
            Some(v) => v,
            None => &self.stack,
        }
    }

    /// The bytes as a header value: one allocation, the value's own. Every value written
    /// here is visible ASCII (names are printable ASCII without `"` or `\`), so it is valid.
    pub(crate) fn to_value(&self) -> HeaderValue {
        HeaderValue::from_bytes(self.as_bytes()).unwrap_or_else(|_| HeaderValue::from_static(""))
    }
}

impl Out for ValueBuf {
    // Always inlined: most pieces are constants, whose copies then need no `memcpy` call.
    #[inline(always)]
    fn put(&mut self, bytes: &[u8]) {
        if let Some(v) = &mut self.heap {
            v.extend_from_slice(bytes);
            return;
        }
        if self.stack.try_extend_from_slice(bytes).is_err() {
            let mut v = Vec::with_capacity(2 * (self.stack.len() + bytes.len()));
            v.extend_from_slice(&self.stack);
            v.extend_from_slice(bytes);
            self.heap = Some(v);
        }
    }
}

/// The `RateLimit-Policy` value for `policies`, in order.
pub(crate) fn policy_value<'a>(policies: impl IntoIterator<Item = &'a Policy>) -> HeaderValue {
    write_policies(policies.into_iter().map(|p| (p, None)))
}

/// The `RateLimit-Policy` value for the policies of `decision`, whose parameters did not
/// all come from the rule: each item says where its parameters came from when not from
/// the rule (`turnstile-override`, or `turnstile-tier="<name>"`).
fn sourced_policy_value(decision: &Decision) -> HeaderValue {
    let policies = decision.policies().iter().map(|p| p.policy());
    write_policies(policies.zip(decision.sources().map(Some)))
}

/// The `RateLimit-Policy` value of `items`: each a policy and, when known, where its
/// parameters came from.
fn write_policies<'a>(items: impl Iterator<Item = (&'a Policy, Option<Source>)>) -> HeaderValue {
    let mut out = ValueBuf::new();
    for (i, (p, source)) in items.enumerate() {
        if i > 0 {
            out.put(b", ");
        }
        out.put(b"\"");
        out.put(p.name().as_bytes());
        out.put(b"\";q=");
        out.put_u64(p.limit());
        if p.period_ms() % 1000 == 0 {
            out.put(b";w=");
            out.put_u64(p.period_ms() / 1000);
        } else {
            out.put(b";turnstile-period-ms=");
            out.put_u64(p.period_ms());
        }
        if let Some(b) = p.burst().filter(|b| *b != p.limit()) {
            out.put(b";turnstile-burst=");
            out.put_u64(b);
        }
        match source {
            Some(Source::Override) => out.put(b";turnstile-override"),
            Some(Source::Tier(t)) => {
                // Tier names are ASCII letters, digits, '-', '_' and '.': a valid string.
                out.put(b";turnstile-tier=\"");
                out.put(t.as_bytes());
                out.put(b"\"");
            }
            _ => {}
        }
    }
    out.to_value()
}

/// The `RateLimit` value of `decision`, one member per policy in order: one allocation, the
/// header value's own.
pub(crate) fn ratelimit_value(decision: &Decision) -> HeaderValue {
    let mut out = ValueBuf::new();
    write_ratelimit(&mut out, decision);
    out.to_value()
}

/// Writes the `RateLimit` members of `decision` to `out`.
pub(crate) fn write_ratelimit(out: &mut impl Out, decision: &Decision) {
    for (i, p) in decision.policies().iter().enumerate() {
        if i > 0 {
            out.put(b", ");
        }
        out.put(b"\"");
        out.put(p.name().as_bytes());
        out.put(b"\";r=");
        out.put_u64(p.remaining());
        let t = if p.allowed() {
            Some(p.reset_after())
        } else {
            p.retry_after()
        };
        if let Some(t) = t {
            out.put(b";t=");
            out.put_u64(ceil_secs(t));
        }
    }
}

/// `n` as a header value, without `core::fmt` (one allocation, the value's own; http's
/// `HeaderValue::from(u64)` makes two).
pub(crate) fn int_value(n: u64) -> HeaderValue {
    let mut buf = itoa::Buffer::new();
    HeaderValue::from_bytes(buf.format(n).as_bytes())
        .unwrap_or_else(|_| HeaderValue::from_static("0"))
}

/// Adds this layer's `RateLimit-Policy` and `RateLimit` items to `headers` and, if `legacy`,
/// the `X-RateLimit-*` fields of the binding policy. `policy_header` is the precomputed
/// `RateLimit-Policy` of the policies the check defaulted to, used when they decided; a key's
/// override or tier gets its own. A decision without policies (a key admitted without limit,
/// or denied for having no configuration) adds nothing.
///
/// Layers stack (a router-wide limit around a tighter per-route one), so a response may
/// already carry another layer's fields: the two structured-field Lists get this layer's
/// members appended after those already there (draft-ietf-httpapi-ratelimit-headers-10
/// allows one member per policy, several policies per response), never replacing them. The
/// single-valued legacy fields are kept when present: they are the denying layer's on a
/// denial (its response is built before any outer layer sees it) and the innermost layer's
/// otherwise. (`Retry-After` is only ever written by the denial response itself.)
pub(crate) fn insert(
    headers: &mut http::HeaderMap,
    policy_header: &HeaderValue,
    decision: &Decision,
    legacy: bool,
) {
    if let Some(p) = Prepared::new(policy_header, decision, legacy) {
        p.insert(headers);
    }
}

/// As [`insert`], with the `RateLimit` value already written (`ratelimit`, of `decision`,
/// which has policies).
pub(crate) fn insert_values(
    headers: &mut http::HeaderMap,
    policy_header: &HeaderValue,
    ratelimit: HeaderValue,
    decision: &Decision,
    legacy: bool,
) {
    Prepared::with_ratelimit(policy_header, ratelimit, decision, legacy).insert(headers);
}

/// This layer's rate-limit fields for one decision, written when the decision is made and
/// added ([`Prepared::insert`], as [`insert`] says) to the response when it comes: an admitted
/// request's future then carries these values, not the decision.
pub(crate) struct Prepared {
    policy: HeaderValue,
    ratelimit: HeaderValue,
    /// The binding policy's `X-RateLimit-Limit`, `-Remaining` and `-Reset` (delta seconds),
    /// when the legacy fields are on.
    legacy: Option<[u64; 3]>,
}

impl Prepared {
    /// The fields of `decision` (`None`: it has no policies, so no fields); `policy_header`
    /// and `legacy` as [`insert`] says.
    pub(crate) fn new(
        policy_header: &HeaderValue,
        decision: &Decision,
        legacy: bool,
    ) -> Option<Self> {
        if decision.policies().is_empty() {
            return None;
        }
        Some(Self::with_ratelimit(
            policy_header,
            ratelimit_value(decision),
            decision,
            legacy,
        ))
    }

    /// As [`Prepared::new`], with the `RateLimit` value already written (`ratelimit`, of
    /// `decision`, which has policies).
    fn with_ratelimit(
        policy_header: &HeaderValue,
        ratelimit: HeaderValue,
        decision: &Decision,
        legacy: bool,
    ) -> Self {
        let policy = match decision.applied() {
            Applied::Defaults => policy_header.clone(),
            _ => sourced_policy_value(decision),
        };
        let legacy = if legacy {
            decision.binding().map(|b| {
                [
                    b.policy().limit(),
                    b.remaining(),
                    ceil_secs(b.reset_after()),
                ]
            })
        } else {
            None
        };
        Prepared {
            policy,
            ratelimit,
            legacy,
        }
    }

    /// Adds the fields to `headers`, as [`insert`] says.
    pub(crate) fn insert(self, headers: &mut http::HeaderMap) {
        append_list(headers, RATELIMIT_POLICY, self.policy);
        append_list(headers, RATELIMIT, self.ratelimit);
        if let Some([limit, remaining, reset]) = self.legacy {
            if !headers.contains_key(X_RATELIMIT_LIMIT) {
                headers.insert(X_RATELIMIT_LIMIT, int_value(limit));
                headers.insert(X_RATELIMIT_REMAINING, int_value(remaining));
                headers.insert(X_RATELIMIT_RESET, int_value(reset));
            }
        }
    }
}

/// Appends `members` (an RFC 9651 List's members, already serialised) to the List field
/// `name`: inserted as is when the field is absent (the usual case, no copy), else joined
/// after every existing field line with `", "` into one line (RFC 9651, section 3.1: a
/// List split over several lines is their comma-joined concatenation).
fn append_list(headers: &mut http::HeaderMap, name: http::HeaderName, members: HeaderValue) {
    // One lookup: the usual case (absent) inserts at once.
    if !headers.append(&name, members) {
        return;
    }
    // The field was there: `members` is its last line now. (It is never empty and has no
    // spaces around it, so trimming it changes nothing.)
    let mut joined = Vec::with_capacity(256);
    for line in headers.get_all(&name) {
        let line = trim_ows(line.as_bytes());
        if !line.is_empty() {
            if !joined.is_empty() {
                joined.extend_from_slice(b", ");
            }
            joined.extend_from_slice(line);
        }
    }
    // Joining valid field values with ", " keeps them valid.
    if let Ok(v) = HeaderValue::from_bytes(&joined) {
        headers.insert(name, v);
    }
}

/// `b` without leading and trailing spaces and tabs.
fn trim_ows(b: &[u8]) -> &[u8] {
    let start = b.iter().position(|c| !matches!(c, b' ' | b'\t'));
    let end = b.iter().rposition(|c| !matches!(c, b' ' | b'\t'));
    match (start, end) {
        (Some(s), Some(e)) => &b[s..=e],
        _ => &[],
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

    #[test]
    fn a_second_layer_appends_its_members_and_keeps_the_legacy_fields() {
        let mut h = http::HeaderMap::new();
        h.insert(RATELIMIT, HeaderValue::from_static("\"inner\";r=0;t=60"));
        h.append(RATELIMIT, HeaderValue::from_static(" \"app\";r=3 "));
        h.insert(X_RATELIMIT_LIMIT, HeaderValue::from_static("2"));
        append_list(
            &mut h,
            RATELIMIT,
            HeaderValue::from_static("\"outer\";r=98;t=60"),
        );
        assert_eq!(
            h.get_all(RATELIMIT).iter().collect::<Vec<_>>(),
            ["\"inner\";r=0;t=60, \"app\";r=3, \"outer\";r=98;t=60"]
        );
        append_list(
            &mut h,
            RATELIMIT_POLICY,
            HeaderValue::from_static("\"outer\";q=100"),
        );
        assert_eq!(h[RATELIMIT_POLICY], "\"outer\";q=100");
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
