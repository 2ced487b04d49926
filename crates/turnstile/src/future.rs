//! The response future of [`RateLimit`](crate::RateLimit).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use http::{HeaderValue, Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tower_service::Service;
use turnstile_core::{BackendError, Decision};

use crate::body::ResponseBody;
use crate::headers::{ratelimit_value, RATELIMIT, RATELIMIT_POLICY};
use crate::key::KeyError;
use crate::layer::{FailurePolicy, Shared};
use crate::response::{plain, too_many_requests};

pin_project! {
    /// The response future of [`RateLimit`](crate::RateLimit): awaits the backend's decision,
    /// waits out a leaky bucket's delay if any, then calls the inner service — or answers the
    /// denial itself.
    ///
    /// # Cancellation
    /// Dropping the future before the decision arrives leaves the limiter consistent: the
    /// check is atomic in the backend, so it either consumed quota or not. Dropping it after
    /// an admission does not give the quota back.
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture<C, S, R, F> {
        #[pin]
        state: State<C, S, R, F>,
        shared: Arc<Shared>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<C, S, R, F> {
        Checking {
            #[pin]
            check: C,
            inner: Option<S>,
            req: Option<R>,
        },
        Delaying {
            #[pin]
            sleep: Sleep,
            inner: Option<S>,
            req: Option<R>,
            header: Option<HeaderValue>,
        },
        Calling {
            #[pin]
            fut: F,
            header: Option<HeaderValue>,
        },
        KeyFailed {
            error: KeyError,
        },
        Done,
    }
}

impl<C, S, R, F> fmt::Debug for ResponseFuture<C, S, R, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Checking { .. } => "checking",
            State::Delaying { .. } => "delaying",
            State::Calling { .. } => "calling",
            State::KeyFailed { .. } => "key_failed",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

impl<C, S, R, F> ResponseFuture<C, S, R, F> {
    pub(crate) fn checking(check: C, inner: S, req: R, shared: Arc<Shared>) -> Self {
        ResponseFuture {
            state: State::Checking {
                check,
                inner: Some(inner),
                req: Some(req),
            },
            shared,
        }
    }

    pub(crate) fn key_failed(error: KeyError, shared: Arc<Shared>) -> Self {
        ResponseFuture {
            state: State::KeyFailed { error },
            shared,
        }
    }
}

impl<C, S, ReqBody, F, ResBody, E> Future for ResponseFuture<C, S, Request<ReqBody>, F>
where
    C: Future<Output = Result<Decision, BackendError>>,
    S: Service<Request<ReqBody>, Response = Response<ResBody>, Error = E, Future = F>,
    F: Future<Output = Result<Response<ResBody>, E>>,
{
    type Output = Result<Response<ResponseBody<ResBody>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Checking { check, inner, req } => {
                    let decision = match ready!(check.poll(cx)) {
                        Ok(d) => {
                            this.shared.backend_ok();
                            d
                        }
                        Err(e) => {
                            this.shared.backend_failed(&e);
                            match this.shared.failure {
                                FailurePolicy::Closed => {
                                    this.state.set(State::Done);
                                    return Poll::Ready(Ok(plain(
                                        StatusCode::SERVICE_UNAVAILABLE,
                                        "The rate limiter is unavailable; try again later.\n",
                                    )));
                                }
                                FailurePolicy::Open => {
                                    let (mut inner, req) = take_both(inner, req);
                                    let fut = inner.call(req);
                                    this.state.set(State::Calling { fut, header: None });
                                    continue;
                                }
                            }
                        }
                    };
                    if !decision.allowed() {
                        this.state.set(State::Done);
                        return Poll::Ready(Ok(too_many_requests(
                            &decision,
                            &this.shared.policy_header,
                        )));
                    }
                    let header = Some(ratelimit_value(&decision));
                    let delay = decision.delay();
                    let (mut inner, req) = take_both(inner, req);
                    if delay.is_zero() {
                        let fut = inner.call(req);
                        this.state.set(State::Calling { fut, header });
                    } else {
                        this.state.set(State::Delaying {
                            sleep: tokio::time::sleep(delay),
                            inner: Some(inner),
                            req: Some(req),
                            header,
                        });
                    }
                }
                StateProj::Delaying {
                    sleep,
                    inner,
                    req,
                    header,
                } => {
                    ready!(sleep.poll(cx));
                    let header = header.take();
                    let (mut inner, req) = take_both(inner, req);
                    let fut = inner.call(req);
                    this.state.set(State::Calling { fut, header });
                }
                StateProj::Calling { fut, header } => {
                    let res = ready!(fut.poll(cx))?;
                    let header = header.take();
                    this.state.set(State::Done);
                    let mut res = res.map(ResponseBody::inner);
                    if let Some(h) = header {
                        let headers = res.headers_mut();
                        headers.insert(RATELIMIT_POLICY, this.shared.policy_header.clone());
                        headers.insert(RATELIMIT, h);
                    }
                    return Poll::Ready(Ok(res));
                }
                StateProj::KeyFailed { error } => {
                    let msg = error.message();
                    this.state.set(State::Done);
                    return Poll::Ready(Ok(plain(StatusCode::INTERNAL_SERVER_ERROR, msg)));
                }
                StateProj::Done => {
                    // Polled after completion: a contract violation by the caller. Stay
                    // pending rather than panic.
                    return Poll::Pending;
                }
            }
        }
    }
}

fn take_both<S, R>(inner: &mut Option<S>, req: &mut Option<R>) -> (S, R) {
    match (inner.take(), req.take()) {
        (Some(s), Some(r)) => (s, r),
        // Each state holds both until it moves them out and leaves the state.
        _ => unreachable!("service and request are taken exactly once"),
    }
}
