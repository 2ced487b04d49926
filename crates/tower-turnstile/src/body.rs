//! The response body: the inner service's, or turnstile's own for a denial; and the
//! response each of them comes in.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::Response;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::headers::Prepared;

pin_project! {
    /// The body of a response from [`RateLimit`](crate::RateLimit): either the inner
    /// service's body, untouched, or a complete body turnstile wrote (a denial, or an error
    /// explaining a misconfiguration).
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
pub(crate) fn inner_response<B>(
    res: Response<B>,
    headers: Option<Prepared>,
) -> Response<ResponseBody<B>> {
    let mut res = res.map(ResponseBody::inner);
    if let Some(h) = headers {
        h.insert(res.headers_mut());
    }
    res
}

/// Turnstile's own answer, taken from its state (`None`: polled after it was given, a
/// contract violation by the caller; stay pending rather than panic).
#[inline]
pub(crate) fn own_response<B, E>(
    res: Option<Response<Bytes>>,
) -> Poll<Result<Response<ResponseBody<B>>, E>> {
    match res {
        Some(res) => Poll::Ready(Ok(res.map(ResponseBody::full))),
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
