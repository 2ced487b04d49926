//! Responses turnstile writes itself: denials (HTTP 429 or gRPC `RESOURCE_EXHAUSTED`),
//! fail-closed backend failures (503 / `UNAVAILABLE`) and requests without a key.

use std::fmt;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use turnstile_core::round::retry_after_secs;
use turnstile_core::{Decision, Policy};

use crate::grpc::{self, Code};
use crate::headers::{self, Out};
use crate::key::KeyError;

/// The RFC 9457 problem type for a request over quota, registered with IANA by
/// draft-ietf-httpapi-ratelimit-headers.
pub const QUOTA_EXCEEDED_TYPE: &str =
    "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// The protocol a request speaks, as far as denial responses go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Protocol {
    /// Plain HTTP: denied with `429 Too Many Requests`.
    Http,
    /// gRPC (`content-type: application/grpc*`): denied with a trailers-only
    /// `RESOURCE_EXHAUSTED`.
    Grpc,
}

impl Protocol {
    /// The protocol of a request with `headers`: gRPC when its `content-type` starts with
    /// `application/grpc`.
    pub(crate) fn of(headers: &http::HeaderMap) -> Self {
        if crate::key::is_grpc(headers) {
            Protocol::Grpc
        } else {
            Protocol::Http
        }
    }
}

/// What a custom denial response function is told about a denied request.
#[derive(Debug)]
pub struct Denial<'a> {
    pub(crate) decision: &'a Decision,
    pub(crate) protocol: Protocol,
    pub(crate) cost: u64,
}

impl<'a> Denial<'a> {
    /// The backend's decision: every policy's result, the binding one, the retry delay.
    pub fn decision(&self) -> &'a Decision {
        self.decision
    }

    /// The policies that were checked, in order: the rule's, or the key's own override or
    /// tier (see [`Decision::applied`]). Empty when the key was denied for having no
    /// configuration.
    pub fn policies(&self) -> impl Iterator<Item = &'a Policy> {
        self.decision.policies().iter().map(|p| p.policy())
    }

    /// The request's protocol.
    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// Whether the request is a gRPC call (and so expects a gRPC status, not an HTTP error).
    pub fn is_grpc(&self) -> bool {
        self.protocol == Protocol::Grpc
    }

    /// The request's cost in units.
    pub fn cost(&self) -> u64 {
        self.cost
    }

    /// How long until the same request would be admitted; `None` when it never can be (its
    /// cost exceeds a policy's capacity).
    pub fn retry_after(&self) -> Option<Duration> {
        self.decision.retry_after()
    }

    /// The response turnstile sends by default: an RFC 9457 problem (HTTP) or a trailers-only
    /// `RESOURCE_EXHAUSTED` with `RetryInfo` and `QuotaFailure` (gRPC), without the
    /// rate-limit headers (the layer adds them).
    pub fn default_response(&self) -> Response<Bytes> {
        default_denial(self)
    }
}

/// A user's denial response function.
pub(crate) type DenialFn = Arc<dyn Fn(&Denial<'_>) -> Response<Bytes> + Send + Sync>;

/// A body a custom denial response may have
/// ([`RateLimitLayerBuilder::denial_response`](crate::RateLimitLayerBuilder::denial_response)):
/// anything that is complete bytes when the denial is built — `Bytes`, `String`, `Vec<u8>`,
/// `&'static str`, `&'static [u8]`, `Cow<'static, str>`, `()` (no body), and with the `axum`
/// feature `axum::body::Body` (so an `axum::response::Response`, what
/// `IntoResponse::into_response` gives).
pub trait DenialBody {
    /// The body's bytes, or `None` when it has no complete value now (a streaming body that
    /// is not ready at once, a body that fails, or trailers, which a denial cannot carry).
    fn into_denial_bytes(self) -> Option<Bytes>;
}

impl DenialBody for Bytes {
    fn into_denial_bytes(self) -> Option<Bytes> {
        Some(self)
    }
}

impl DenialBody for String {
    fn into_denial_bytes(self) -> Option<Bytes> {
        Some(Bytes::from(self))
    }
}

impl DenialBody for Vec<u8> {
    fn into_denial_bytes(self) -> Option<Bytes> {
        Some(Bytes::from(self))
    }
}

impl DenialBody for &'static str {
    fn into_denial_bytes(self) -> Option<Bytes> {
        Some(Bytes::from_static(self.as_bytes()))
    }
}

impl DenialBody for &'static [u8] {
    fn into_denial_bytes(self) -> Option<Bytes> {
        Some(Bytes::from_static(self))
    }
}

impl DenialBody for std::borrow::Cow<'static, str> {
    fn into_denial_bytes(self) -> Option<Bytes> {
        Some(match self {
            std::borrow::Cow::Borrowed(s) => Bytes::from_static(s.as_bytes()),
            std::borrow::Cow::Owned(s) => Bytes::from(s),
        })
    }
}

impl DenialBody for () {
    fn into_denial_bytes(self) -> Option<Bytes> {
        Some(Bytes::new())
    }
}

/// axum's body: its frames are read at once (a `Json`, `String` or `Bytes` response is
/// complete); a body that would have to wait gives `None`.
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl DenialBody for axum::body::Body {
    fn into_denial_bytes(self) -> Option<Bytes> {
        collect_now(self)
    }
}

/// The data of `body` if every frame is ready at once, without a runtime.
#[cfg(feature = "axum")]
fn collect_now<B: http_body::Body<Data = Bytes>>(body: B) -> Option<Bytes> {
    use std::task::{Context, Poll, Waker};
    let mut body = std::pin::pin!(body);
    let mut cx = Context::from_waker(Waker::noop());
    let mut out: Option<bytes::BytesMut> = None;
    let mut first: Option<Bytes> = None;
    loop {
        match body.as_mut().poll_frame(&mut cx) {
            Poll::Ready(None) => break,
            Poll::Ready(Some(Ok(frame))) => {
                let data = frame.into_data().ok()?;
                match (&mut out, first.take()) {
                    (None, None) => first = Some(data),
                    (None, Some(f)) => {
                        let mut b = bytes::BytesMut::from(&f[..]);
                        b.extend_from_slice(&data);
                        out = Some(b);
                    }
                    (Some(b), _) => b.extend_from_slice(&data),
                }
            }
            Poll::Ready(Some(Err(_))) | Poll::Pending => return None,
        }
    }
    Some(match out {
        Some(b) => b.freeze(),
        None => first.unwrap_or_default(),
    })
}

/// Turns a user's denial function returning any [`DenialBody`] into a [`DenialFn`]. A body
/// with no complete value is replaced by the default denial, with one error logged per
/// layer: the client still gets a correct denial.
pub(crate) fn denial_fn<F, T>(f: F) -> DenialFn
where
    F: Fn(&Denial<'_>) -> Response<T> + Send + Sync + 'static,
    T: DenialBody,
{
    let warned = std::sync::atomic::AtomicBool::new(false);
    Arc::new(move |d: &Denial<'_>| {
        let (parts, body) = f(d).into_parts();
        match body.into_denial_bytes() {
            Some(bytes) => Response::from_parts(parts, bytes),
            None => {
                if !warned.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::error!(target: "turnstile", "the custom denial response's body is not complete when built (a stream, an error or trailers); sending the default denial instead");
                }
                default_denial(d)
            }
        }
    })
}

/// Wraps a `DenialFn` for `Debug` output.
pub(crate) struct DenialFnDebug<'a>(pub(crate) &'a Option<DenialFn>);

impl fmt::Debug for DenialFnDebug<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "custom"
        } else {
            "default"
        })
    }
}

/// The human-readable reason for a denial.
fn detail(decision: &Decision) -> String {
    let mut s = Vec::with_capacity(112);
    write_detail(&mut s, decision);
    // Written from ASCII text and digits only.
    String::from_utf8(s).unwrap_or_default()
}

fn write_detail(w: &mut impl Out, decision: &Decision) {
    match decision.retry_after() {
        Some(d) => {
            w.put(b"Rate limit exceeded; retry in ");
            w.put_u64(retry_after_secs(d));
            w.put(b" s.");
        }
        None => w.put(b"This request costs more than the policy's capacity and will never be admitted under this policy."),
    }
}

/// The default denial for `d`'s protocol, without rate-limit headers.
pub(crate) fn default_denial(d: &Denial<'_>) -> Response<Bytes> {
    match d.protocol {
        Protocol::Grpc => grpc::resource_exhausted(d.decision, &detail(d.decision), d.cost),
        Protocol::Http => too_many_requests(d.decision, None),
    }
}

/// The default denial for `d`'s protocol with the layer's rate-limit headers
/// ([`headers::insert`]: `policy_header` for the policies the check defaulted to, the legacy
/// fields if `legacy`).
pub(crate) fn default_denial_with_headers(
    d: &Denial<'_>,
    policy_header: &HeaderValue,
    legacy: bool,
) -> Response<Bytes> {
    match d.protocol {
        Protocol::Grpc => {
            let mut res = default_denial(d);
            headers::insert(res.headers_mut(), policy_header, d.decision, legacy);
            res
        }
        Protocol::Http => too_many_requests(d.decision, Some((policy_header, legacy))),
    }
}

/// `429 Too Many Requests` (RFC 6585) for a denied `decision`: `Retry-After` in whole seconds
/// rounded up, at least 1 (omitted when no wait can help), an RFC 9457
/// `application/problem+json` body naming the violated policies, and with `headers` (the
/// precomputed `RateLimit-Policy` value and whether to add the legacy fields) the
/// rate-limit headers of [`headers::insert`].
///
/// The body, the `RateLimit` value and the `Retry-After` value are written into one buffer
/// and share it (two allocations for the three: the buffer and its reference count).
fn too_many_requests(
    decision: &Decision,
    headers: Option<(&HeaderValue, bool)>,
) -> Response<Bytes> {
    let names: usize = decision.policies().iter().map(|p| p.name().len()).sum();
    let mut buf: Vec<u8> = Vec::with_capacity(384 + 2 * names + 64 * decision.policies().len());
    buf.put(b"{\"type\":\"");
    buf.put(QUOTA_EXCEEDED_TYPE.as_bytes());
    buf.put(b"\",\"title\":\"Too Many Requests\",\"status\":429,\"detail\":\"");
    write_detail(&mut buf, decision);
    buf.put(b"\",\"violated-policies\":[");
    for (i, p) in decision.violated().enumerate() {
        if i > 0 {
            buf.put(b",");
        }
        // Policy names hold no '"' or '\', so they need no JSON escaping.
        buf.put(b"\"");
        buf.put(p.name().as_bytes());
        buf.put(b"\"");
    }
    buf.put(b"]}");
    let body_end = buf.len();
    let headers = headers.filter(|_| !decision.policies().is_empty());
    if headers.is_some() {
        headers::write_ratelimit(&mut buf, decision);
    }
    let ratelimit_end = buf.len();
    let retry_after = decision.retry_after().map(retry_after_secs);
    if let Some(secs) = retry_after {
        buf.put_u64(secs);
    }
    let all = Bytes::from(buf);
    let mut res = Response::new(all.slice(..body_end));
    *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    // Both values are digits and visible ASCII: valid.
    if retry_after.is_some() {
        if let Ok(v) = HeaderValue::from_maybe_shared(all.slice(ratelimit_end..)) {
            h.insert(header::RETRY_AFTER, v);
        }
    }
    if let Some((policy_header, legacy)) = headers {
        if let Ok(ratelimit) = HeaderValue::from_maybe_shared(all.slice(body_end..ratelimit_end)) {
            headers::insert_values(h, policy_header, ratelimit, decision, legacy);
        }
    }
    res
}

/// The fail-closed answer when the backend cannot decide: `503` with an RFC 9457 problem
/// body, or gRPC `UNAVAILABLE`.
pub(crate) fn unavailable(protocol: Protocol) -> Response<Bytes> {
    const MSG: &str = "The rate limiter is unavailable; try again later.";
    if protocol == Protocol::Grpc {
        grpc::status_only(Code::Unavailable, MSG)
    } else {
        problem(StatusCode::SERVICE_UNAVAILABLE, MSG)
    }
}

/// The answer to a request whose key cannot be extracted: `500` (the server's
/// misconfiguration) or `400` (the request lacks what it is keyed by) with an RFC 9457
/// problem body whose `detail` says what is missing and how to fix it; gRPC `INTERNAL` or
/// `INVALID_ARGUMENT`.
pub(crate) fn key_error(e: &KeyError, protocol: Protocol) -> Response<Bytes> {
    let msg = e.message();
    let msg = msg.trim_end();
    match (protocol == Protocol::Grpc, e.is_misconfiguration()) {
        (true, true) => grpc::status_only(Code::Internal, msg),
        (true, false) => grpc::status_only(Code::InvalidArgument, msg),
        (false, true) => problem(StatusCode::INTERNAL_SERVER_ERROR, msg),
        (false, false) => problem(StatusCode::BAD_REQUEST, msg),
    }
}

/// An RFC 9457 `application/problem+json` response of type `about:blank` (the problem is
/// what the status code says; RFC 9457, section 4.2.1), titled with the status's reason
/// phrase, with `detail` as the explanation — the shape of the `429`'s body, so a client
/// reads every error turnstile writes the same way.
pub(crate) fn problem(status: StatusCode, detail: &str) -> Response<Bytes> {
    let mut body = String::with_capacity(96 + detail.len());
    let _ = write!(
        body,
        "{{\"type\":\"about:blank\",\"title\":\"{}\",\"status\":{},\"detail\":\"",
        status.canonical_reason().unwrap_or(""),
        status.as_u16()
    );
    json_escape_into(&mut body, detail);
    body.push_str("\"}");
    let mut res = Response::new(Bytes::from(body));
    *res.status_mut() = status;
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    res
}

/// Appends `s` to `out` as the inside of a JSON string (RFC 8259, section 7).
fn json_escape_into(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problem_details_escape_their_detail() {
        let res = problem(StatusCode::BAD_REQUEST, "a \"b\" \\ c\n\u{1}");
        assert_eq!(
            res.headers()[header::CONTENT_TYPE],
            "application/problem+json"
        );
        assert_eq!(
            res.body(),
            "{\"type\":\"about:blank\",\"title\":\"Bad Request\",\"status\":400,\"detail\":\"a \\\"b\\\" \\\\ c\\n\\u0001\"}"
        );
    }
}
