//! Responses turnstile writes itself: the 429 denial and misconfiguration errors.

use std::fmt::Write as _;

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use turnstile_core::Decision;

use crate::body::ResponseBody;
use crate::headers::{ratelimit_value, retry_after_secs, RATELIMIT, RATELIMIT_POLICY};

/// The RFC 9457 problem type for a request over quota, registered with IANA by
/// draft-ietf-httpapi-ratelimit-headers.
pub const QUOTA_EXCEEDED_TYPE: &str =
    "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// `429 Too Many Requests` (RFC 6585) for a denied `decision`: `Retry-After` in whole seconds
/// rounded up, at least 1 (omitted when no wait can help), `RateLimit-Policy` and
/// `RateLimit`, and an RFC 9457 `application/problem+json` body naming the violated policies.
pub(crate) fn too_many_requests<B>(
    decision: &Decision,
    policy_header: &HeaderValue,
) -> Response<ResponseBody<B>> {
    let mut names = String::new();
    for (i, p) in decision.violated().enumerate() {
        if i > 0 {
            names.push(',');
        }
        // Policy names hold no '"' or '\', so they need no JSON escaping.
        let _ = write!(names, "\"{}\"", p.name());
    }
    let detail = match decision.retry_after() {
        Some(d) => format!(
            "Rate limit exceeded; retry in {} s.",
            retry_after_secs(d)
        ),
        None => "This request costs more than the policy's capacity and will never be admitted under this policy.".to_owned(),
    };
    let body = format!(
        "{{\"type\":\"{QUOTA_EXCEEDED_TYPE}\",\"title\":\"Too Many Requests\",\"status\":429,\"detail\":\"{detail}\",\"violated-policies\":[{names}]}}"
    );
    let mut res = Response::new(ResponseBody::full(Bytes::from(body)));
    *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    if let Some(d) = decision.retry_after() {
        h.insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs(d)));
    }
    h.insert(RATELIMIT_POLICY, policy_header.clone());
    h.insert(RATELIMIT, ratelimit_value(decision));
    res
}

/// A plain-text error response turnstile writes itself (misconfiguration, backend failure).
pub(crate) fn plain<B>(status: StatusCode, text: &'static str) -> Response<ResponseBody<B>> {
    let mut res = Response::new(ResponseBody::full(Bytes::from_static(text.as_bytes())));
    *res.status_mut() = status;
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    res
}
