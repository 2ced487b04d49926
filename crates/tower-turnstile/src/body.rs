//! The response body: the layer answers in the inner service's own body type
//! ([`RateLimitBody`]), so a router does not box its body again; and the response each of
//! the inner service's answer and turnstile's own comes in.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::Response;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::headers::Prepared;

/// A response body the layer can answer in: [`RateLimit`](crate::RateLimit) gives the inner
/// service's responses unchanged (its body type, untouched) and writes its own answers (a
/// denial, an error explaining a misconfiguration, gRPC's trailers-only replies with an
/// empty body) in the same type, from complete bytes.
///
/// Implemented for axum's body (feature `axum`, so an axum `Router` needs nothing more),
/// tonic's body (feature `tonic`, for a tonic `Server`), `String` (bytes that are not UTF-8
/// are replaced, as [`String::from_utf8_lossy`] does; turnstile's own bodies are UTF-8) and
/// [`ResponseBody`], a wrapper for any other body: map the inner service's body into
/// [`ResponseBody::inner`] (for instance with tower-http's `MapResponseBodyLayer`) to put the
/// layer in front of it.
pub trait RateLimitBody: Body<Data = Bytes> + Sized {
    /// A complete body of `data` (no body at all when `data` is empty).
    fn from_bytes(data: Bytes) -> Self;
}

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl RateLimitBody for axum::body::Body {
    fn from_bytes(data: Bytes) -> Self {
        if data.is_empty() {
            axum::body::Body::empty()
        } else {
            axum::body::Body::from(data)
        }
    }
}

#[cfg(feature = "tonic")]
#[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
impl RateLimitBody for tonic::body::Body {
    fn from_bytes(data: Bytes) -> Self {
        if data.is_empty() {
            tonic::body::Body::empty()
        } else {
            tonic::body::Body::new(ResponseBody::<String>::full(data))
        }
    }
}

impl RateLimitBody for String {
    fn from_bytes(data: Bytes) -> Self {
        match String::from_utf8(Vec::from(data)) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        }
    }
}

impl<B: Body<Data = Bytes>> RateLimitBody for ResponseBody<B> {
    fn from_bytes(data: Bytes) -> Self {
        ResponseBody::full(data)
    }
}

pin_project! {
    /// A body that is either another body, untouched, or complete bytes: the
    /// [`RateLimitBody`] for an inner service whose body type is not one of those the crate
    /// implements it for (map its body with [`ResponseBody::inner`]).
    #[derive(Debug)]
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    #[derive(Debug)]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Full { data: Option<Bytes> },
    }
}

impl<B> ResponseBody<B> {
    /// Wraps the inner service's body.
    pub fn inner(body: B) -> Self {
        ResponseBody {
            kind: Kind::Inner { body },
        }
    }

    /// A complete body of `data` (no body at all when `data` is empty).
    pub fn full(data: impl Into<Bytes>) -> Self {
        let data = data.into();
        ResponseBody {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }

    /// An empty body.
    pub fn empty() -> Self {
        ResponseBody {
            kind: Kind::Full { data: None },
        }
    }
}

/// The inner service's response `res`, with the rate-limit fields `headers` added.
#[inline]
pub(crate) fn inner_response<B>(mut res: Response<B>, headers: Option<Prepared>) -> Response<B> {
    if let Some(h) = headers {
        h.insert(res.headers_mut());
    }
    res
}

/// Turnstile's own answer, taken from its state (`None`: polled after it was given, a
/// contract violation by the caller; stay pending rather than panic).
#[inline]
pub(crate) fn own_response<B: RateLimitBody, E>(
    res: Option<Response<Bytes>>,
) -> Poll<Result<Response<B>, E>> {
    match res {
        Some(res) => Poll::Ready(Ok(res.map(B::from_bytes))),
        None => Poll::Pending,
    }
}

/// An empty body, as tower-http's `Timeout` and `Cors` layers need to answer on their own
/// (`ResBody: Default`): so the layer composes with them in one `ServiceBuilder`.
impl<B> Default for ResponseBody<B> {
    fn default() -> Self {
        Self::empty()
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_written_in_each_body_type() {
        assert_eq!(
            String::from_bytes(Bytes::from_static(b"{\"a\":1}")),
            "{\"a\":1}"
        );
        assert_eq!(
            String::from_bytes(Bytes::from_static(b"a\xffb")),
            "a\u{fffd}b"
        );
        let full = ResponseBody::<String>::from_bytes(Bytes::from_static(b"x"));
        assert_eq!(full.size_hint().exact(), Some(1));
        let empty = ResponseBody::<String>::from_bytes(Bytes::new());
        assert!(empty.is_end_stream());
        #[cfg(feature = "axum")]
        {
            let b = axum::body::Body::from_bytes(Bytes::from_static(b"xyz"));
            assert_eq!(b.size_hint().exact(), Some(3));
            assert!(axum::body::Body::from_bytes(Bytes::new()).is_end_stream());
        }
        #[cfg(feature = "tonic")]
        {
            let b = tonic::body::Body::from_bytes(Bytes::from_static(b"xyz"));
            assert_eq!(b.size_hint().exact(), Some(3));
            assert!(tonic::body::Body::from_bytes(Bytes::new()).is_end_stream());
        }
    }
}
