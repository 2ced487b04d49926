//! gRPC responses: trailers-only `RESOURCE_EXHAUSTED` (with `google.rpc.RetryInfo` and
//! `google.rpc.QuotaFailure` details) and `UNAVAILABLE`.
//!
//! With feature `tonic` the details are built with tonic-types and the response with
//! `tonic::Status::into_http`; without it the same bytes are encoded here (a handful of
//! protobuf fields), so a plain hyper or axum gRPC server gets the same answer.

use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use turnstile_core::round::ceil_ms;
use turnstile_core::Decision;

/// gRPC status codes turnstile answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Code {
    InvalidArgument = 3,
    #[cfg_attr(feature = "tonic", allow(dead_code))]
    ResourceExhausted = 8,
    Internal = 13,
    Unavailable = 14,
}

impl Code {
    /// The code's number, as `grpc-status` carries it.
    fn as_str(self) -> &'static str {
        match self {
            Code::InvalidArgument => "3",
            Code::ResourceExhausted => "8",
            Code::Internal => "13",
            Code::Unavailable => "14",
        }
    }
}

/// The retry delay a `RetryInfo` carries: `retry_after` rounded up to whole milliseconds.
pub(crate) fn retry_delay(d: Duration) -> Duration {
    Duration::from_millis(ceil_ms(d))
}

/// One `QuotaFailure` violation per denying policy: (subject = policy name, description).
pub(crate) fn violations(decision: &Decision, cost: u64) -> Vec<(String, String)> {
    decision
        .violated()
        .map(|p| {
            let description = match p.retry_after() {
                Some(_) => format!("quota exhausted: {} remaining", p.remaining()),
                None => format!("a cost of {cost} exceeds this policy's capacity"),
            };
            (p.name().to_owned(), description)
        })
        .collect()
}

/// The trailers-only `RESOURCE_EXHAUSTED` answer to a denied gRPC call.
pub(crate) fn resource_exhausted(decision: &Decision, message: &str, cost: u64) -> Response<Bytes> {
    let retry = decision.retry_after().map(retry_delay);
    let violations = violations(decision, cost);
    #[cfg(feature = "tonic")]
    {
        use tonic_types::{ErrorDetails, QuotaViolation, StatusExt};
        let mut details = ErrorDetails::new();
        if let Some(r) = retry {
            details.set_retry_info(Some(r));
        }
        details.set_quota_failure(
            violations
                .into_iter()
                .map(|(s, d)| QuotaViolation::new(s, d))
                .collect::<Vec<_>>(),
        );
        let status =
            tonic::Status::with_error_details(tonic::Code::ResourceExhausted, message, details);
        let mut res = status.into_http::<Bytes>();
        // The `Status` tonic leaves in the extensions is of no use past this layer.
        res.extensions_mut().clear();
        res
    }
    #[cfg(not(feature = "tonic"))]
    {
        let details = encode::status(Code::ResourceExhausted, message, retry, &violations);
        trailers_only(Code::ResourceExhausted, message, Some(&details))
    }
}

/// A trailers-only gRPC response with `code` and `message` and no details.
pub(crate) fn status_only(code: Code, message: &str) -> Response<Bytes> {
    trailers_only(code, message, None)
}

/// A trailers-only gRPC response: HTTP 200, `content-type: application/grpc`, `grpc-status`,
/// a percent-encoded `grpc-message`, and `grpc-status-details-bin` if `details` is given.
pub(crate) fn trailers_only(code: Code, message: &str, details: Option<&[u8]>) -> Response<Bytes> {
    let mut res = Response::new(Bytes::new());
    *res.status_mut() = StatusCode::OK;
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    h.insert("grpc-status", HeaderValue::from_static(code.as_str()));
    if !message.is_empty() {
        if let Ok(v) = HeaderValue::from_maybe_shared(Bytes::from(percent_encode(message))) {
            h.insert("grpc-message", v);
        }
    }
    if let Some(d) = details {
        if let Ok(v) = HeaderValue::from_maybe_shared(Bytes::from(encode::base64_no_pad(d))) {
            h.insert("grpc-status-details-bin", v);
        }
    }
    res
}

/// Percent-encodes a `grpc-message` as tonic does (every byte outside 0x21–0x7E, and
/// `"#<>`?{}`), and `%` too, so the same message reads the same with or without feature
/// `tonic`.
///
/// Sized exactly, so the bytes become a header value without another allocation.
fn percent_encode(s: &str) -> String {
    let keep = |b: u8| (0x21..=0x7e).contains(&b) && !b"%\"#<>`?{}".contains(&b);
    let len = s.bytes().map(|b| if keep(b) { 1 } else { 3 }).sum();
    let mut out = Vec::with_capacity(len);
    for b in s.bytes() {
        if keep(b) {
            out.push(b);
        } else {
            const HEX: &[u8; 16] = b"0123456789ABCDEF";
            out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
        }
    }
    // ASCII only.
    String::from_utf8(out).unwrap_or_default()
}

/// A minimal protobuf encoder for `google.rpc.Status` with `RetryInfo` and `QuotaFailure`
/// details, byte for byte what prost and tonic-types write.
pub(crate) mod encode {
    use super::Code;
    use std::time::Duration;

    const RETRY_INFO_URL: &str = "type.googleapis.com/google.rpc.RetryInfo";
    const QUOTA_FAILURE_URL: &str = "type.googleapis.com/google.rpc.QuotaFailure";

    fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    fn bytes_field(out: &mut Vec<u8>, field: u8, data: &[u8]) {
        out.push((field << 3) | 2);
        varint(out, data.len() as u64);
        out.extend_from_slice(data);
    }

    fn varint_field(out: &mut Vec<u8>, field: u8, v: u64) {
        if v != 0 {
            out.push(field << 3);
            varint(out, v);
        }
    }

    fn any(out: &mut Vec<u8>, type_url: &str, value: &[u8]) {
        let mut a = Vec::with_capacity(type_url.len() + value.len() + 4);
        bytes_field(&mut a, 1, type_url.as_bytes());
        if !value.is_empty() {
            bytes_field(&mut a, 2, value);
        }
        bytes_field(out, 3, &a);
    }

    /// `google.rpc.Status { code, message, details: [RetryInfo?, QuotaFailure] }`.
    #[cfg_attr(feature = "tonic", allow(dead_code))]
    pub(crate) fn status(
        code: Code,
        message: &str,
        retry: Option<Duration>,
        violations: &[(String, String)],
    ) -> Vec<u8> {
        let mut out = Vec::new();
        varint_field(&mut out, 1, code as u64);
        if !message.is_empty() {
            bytes_field(&mut out, 2, message.as_bytes());
        }
        if let Some(r) = retry {
            // google.protobuf.Duration { seconds = 1, nanos = 2 } inside RetryInfo { 1 }.
            let mut d = Vec::new();
            varint_field(&mut d, 1, r.as_secs());
            varint_field(&mut d, 2, u64::from(r.subsec_nanos()));
            let mut ri = Vec::new();
            bytes_field(&mut ri, 1, &d);
            any(&mut out, RETRY_INFO_URL, &ri);
        }
        let mut qf = Vec::new();
        for (subject, description) in violations {
            let mut v = Vec::new();
            if !subject.is_empty() {
                bytes_field(&mut v, 1, subject.as_bytes());
            }
            if !description.is_empty() {
                bytes_field(&mut v, 2, description.as_bytes());
            }
            bytes_field(&mut qf, 1, &v);
        }
        any(&mut out, QUOTA_FAILURE_URL, &qf);
        out
    }

    /// Standard base64 without padding, as gRPC writes binary metadata (sized exactly).
    pub(crate) fn base64_no_pad(data: &[u8]) -> String {
        const ALPHABET: &[u8; 64] =
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut out = String::with_capacity((data.len() * 4).div_ceil(3));
        for chunk in data.chunks(3) {
            let b = [
                chunk[0],
                chunk.get(1).copied().unwrap_or(0),
                chunk.get(2).copied().unwrap_or(0),
            ];
            let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
            let chars = chunk.len() + 1;
            for i in 0..chars {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64() {
        assert_eq!(encode::base64_no_pad(b""), "");
        assert_eq!(encode::base64_no_pad(b"f"), "Zg");
        assert_eq!(encode::base64_no_pad(b"fo"), "Zm8");
        assert_eq!(encode::base64_no_pad(b"foo"), "Zm9v");
        assert_eq!(encode::base64_no_pad(b"foob"), "Zm9vYg");
        assert_eq!(encode::base64_no_pad(&[0xff, 0xfe]), "//4");
    }

    #[test]
    fn retry_delay_rounds_up_to_ms() {
        assert_eq!(
            retry_delay(Duration::from_nanos(1)),
            Duration::from_millis(1)
        );
        assert_eq!(
            retry_delay(Duration::from_micros(6_000_001)),
            Duration::from_millis(6001)
        );
        assert_eq!(retry_delay(Duration::from_secs(6)), Duration::from_secs(6));
    }

    #[test]
    fn message_is_percent_encoded() {
        assert_eq!(percent_encode("50% off ☃?"), "50%25%20off%20%E2%98%83%3F");
    }

    /// The hand encoder writes exactly what tonic-types writes.
    #[cfg(feature = "tonic")]
    #[test]
    fn hand_encoding_matches_tonic_types() {
        use tonic_types::{ErrorDetails, QuotaViolation, StatusExt};
        let violations = vec![
            (
                "per-ip".to_owned(),
                "quota exhausted: 0 remaining".to_owned(),
            ),
            ("per-hour".to_owned(), "x".to_owned()),
        ];
        for retry in [
            None,
            Some(Duration::from_millis(6001)),
            Some(Duration::from_secs(3)),
        ] {
            let mut details = ErrorDetails::new();
            if let Some(r) = retry {
                details.set_retry_info(Some(r));
            }
            details.set_quota_failure(
                violations
                    .iter()
                    .map(|(s, d)| QuotaViolation::new(s.clone(), d.clone()))
                    .collect::<Vec<_>>(),
            );
            let st = tonic::Status::with_error_details(
                tonic::Code::ResourceExhausted,
                "Rate limit exceeded",
                details,
            );
            let ours = encode::status(
                Code::ResourceExhausted,
                "Rate limit exceeded",
                retry,
                &violations,
            );
            assert_eq!(st.details(), &ours[..], "retry {retry:?}");
        }
        // The trailers-only headers match too.
        let msg = "Rate limit exceeded; retry in 6 s. {50% \"off\"} ☃";
        let theirs = tonic::Status::new(tonic::Code::Unavailable, msg).into_http::<()>();
        let ours = status_only(Code::Unavailable, msg);
        for h in ["content-type", "grpc-status", "grpc-message"] {
            assert_eq!(theirs.headers()[h], ours.headers()[h], "{h}");
        }
    }
}
