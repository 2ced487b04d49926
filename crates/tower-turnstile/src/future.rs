//! The response future of [`RateLimit`](crate::RateLimit), and the start of each request's
//! handling: what [`Service::call`] does before it returns the future.
//!
//! A check the backend decides inside the call (the in-memory backend, see
//! [`Backend::ready_now`]) is settled there: an admitted request's inner service is called
//! at once, with the service `poll_ready` readied, and the future only carries the inner
//! future and the rate-limit fields for its response; a denied one carries the denial. Only
//! a request that must wait (a remote backend's answer, a leaky bucket's delay, an
//! [`Action::Delay`](crate::Action::Delay) re-check) moves the inner service and the request
//! into a boxed state machine ([`crate::waiting`]).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;
use turnstile_core::wrap::Fallback;
use turnstile_core::Backend;

use crate::body::{inner_response, own_response, RateLimitBody};
use crate::check::{Check, Next, Plan};
use crate::headers::Prepared;
use crate::key::KeyExtractor;
use crate::limiter::Limiter;
use crate::response::Protocol;
use crate::waiting::{without_reservation, Reply, Start, WaitingFuture};

pin_project! {
    /// The response future of [`RateLimit`](crate::RateLimit): the inner service's answer
    /// with the rate-limit headers added, or turnstile's own answer (a denial) — after
    /// awaiting the backend's decision and any wait the action or a leaky bucket asks for.
    ///
    /// A check the backend decides at once (in memory) is decided in
    /// [`Service::call`](https://docs.rs/tower-service/0.3/tower_service/trait.Service.html#tymethod.call),
    /// and an admitted request's inner service is called there too.
    ///
    /// A request that must wait (a leaky bucket's delay, an [`Action::Delay`](crate::Action::Delay) re-check)
    /// releases the readiness it reserved from the inner service when its wait starts (it
    /// drops the service `poll_ready` readied and keeps an unreserved clone), and drives the
    /// clone's `poll_ready` again when its wait ends, before calling it: waiting holds no
    /// capacity of the inner service (a `ConcurrencyLimit` permit, a buffer slot). A denied
    /// request releases it too.
    ///
    /// # Cancellation
    /// Dropping the future leaves the limiter consistent: each check is atomic in the
    /// backend, so it either consumed quota or not, and a denied check consumes nothing (so
    /// dropping a request that [`Action::Delay`](crate::Action::Delay) holds for a re-check costs nothing).
    /// Dropping it after an admission (for instance during a leaky bucket's delay) does not
    /// give the quota back.
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture<B, K, S, R>
    where
        B: Backend,
        S: Service<R>,
    {
        #[pin]
        state: State<S::Future, WaitingFuture<B, K, S, R>>,
        // Whether the future has completed: polled again, it stays pending (the finished
        // state is dropped with the future, not replaced when it completes).
        done: bool,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, W> {
        // The inner service is answering; its response gets these fields.
        Calling { #[pin] fut: F, headers: Option<Prepared> },
        // Turnstile answers itself.
        Respond { res: Option<Response<Bytes>> },
        // A request that waits.
        Waiting { fut: Pin<Box<W>> },
    }
}

impl<B, K, S, R> fmt::Debug for ResponseFuture<B, K, S, R>
where
    B: Backend,
    S: Service<R>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (state, cost) = match &self.state {
            _ if self.done => ("done", None),
            State::Calling { .. } => ("calling", None),
            State::Respond { .. } => ("responding", None),
            State::Waiting { fut } => (fut.state_name(), Some(fut.cost())),
        };
        let mut d = f.debug_struct("ResponseFuture");
        d.field("state", &state);
        if let Some(cost) = cost {
            d.field("cost", &cost);
        }
        d.finish_non_exhaustive()
    }
}

/// Swaps a clone of `inner` in and returns the service `poll_ready` readied (with the
/// readiness it reserved).
fn take_ready<S: Clone>(inner: &mut S) -> S {
    let clone = inner.clone();
    std::mem::replace(inner, clone)
}

impl<B, K, S, ReqBody> ResponseFuture<B, K, S, Request<ReqBody>>
where
    B: Backend,
    K: KeyExtractor,
    S: Service<Request<ReqBody>> + Clone,
{
    /// The inner service called with `req` now (it is ready), its response getting `headers`.
    #[inline]
    fn call_now(inner: &mut S, req: Request<ReqBody>, headers: Option<Prepared>) -> Self {
        ResponseFuture {
            state: State::Calling {
                fut: inner.call(req),
                headers,
            },
            done: false,
        }
    }

    /// Turnstile's own answer `res`; the readiness the inner service reserved is released
    /// (the readied service dropped, a clone kept for the next call).
    fn respond(inner: &mut S, res: Response<Bytes>) -> Self {
        drop(take_ready(inner));
        ResponseFuture {
            state: State::Respond { res: Some(res) },
            done: false,
        }
    }

    /// Starts handling `req` with the ready service `inner` (left ready for the next call, or
    /// replaced by a clone when the request took its readiness), under `limiter`.
    #[inline]
    pub(crate) fn start(
        limiter: &Arc<Limiter<B, K>>,
        inner: &mut S,
        req: Request<ReqBody>,
    ) -> Self {
        let (mut check, limits) = match Check::plan(limiter, &req) {
            Plan::Pass => return Self::call_now(inner, req, None),
            Plan::Respond(res) => return Self::respond(inner, res),
            Plan::Check(check, limits) => (check, limits),
        };
        // The check within its span, as the waiting future polls one.
        let answer = {
            let _entered = check.span.as_ref().map(tracing::Span::enter);
            let reply = limiter
                .backend
                .check_limits(&check.key, limits, check.cost, None);
            <Fallback<B> as Backend>::ready_now(reply)
        };
        let result = match answer {
            Ok(result) => result,
            Err(reply) => {
                // The answer is awaited: the future takes the readied service and the request.
                let ready = take_ready(inner);
                return Self::waiting(limiter, ready, req, check, Start::Checking(reply));
            }
        };
        match check.settle(limiter, result, || Protocol::of(req.headers())) {
            Next::Call(headers) => Self::call_now(inner, req, headers),
            Next::Respond(res) => Self::respond(inner, res),
            Next::Delay { at, headers } => {
                let start = Start::Delaying(at, headers);
                Self::waiting(limiter, unreserved(inner), req, check, start)
            }
            Next::Recheck { at } => {
                let start = Start::AwaitingRecheck(at);
                Self::waiting(limiter, unreserved(inner), req, check, start)
            }
        }
    }

    /// A request that waits, from `start`: the inner service `inner` and `req` move into
    /// the boxed [`WaitingFuture`].
    fn waiting(
        limiter: &Arc<Limiter<B, K>>,
        inner: S,
        req: Request<ReqBody>,
        check: Check,
        start: Start<Reply<B>>,
    ) -> Self {
        let fut = WaitingFuture::new(Arc::clone(limiter), inner, req, check, start);
        ResponseFuture {
            state: State::Waiting { fut: Box::pin(fut) },
            done: false,
        }
    }
}

/// Releases the readiness `inner` reserved (the readied service is dropped, a clone left for
/// the next call) and returns an unreserved clone for a request that waits.
fn unreserved<S: Clone>(inner: &mut S) -> S {
    without_reservation(take_ready(inner))
}

impl<B, K, S, ReqBody, ResBody> Future for ResponseFuture<B, K, S, Request<ReqBody>>
where
    B: Backend,
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    ResBody: RateLimitBody,
{
    type Output = Result<Response<ResBody>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        // Polled after completion: a contract violation by the caller. Stay pending rather
        // than poll a finished future again (which may panic).
        if *this.done {
            return Poll::Pending;
        }
        let out = match this.state.project() {
            StateProj::Calling { fut, headers } => {
                ready!(fut.poll(cx)).map(|res| inner_response(res, headers.take()))
            }
            StateProj::Respond { res } => ready!(own_response(res.take())),
            StateProj::Waiting { fut } => ready!(fut.as_mut().poll(cx)),
        };
        // Done with an error too.
        *this.done = true;
        Poll::Ready(out)
    }
}
