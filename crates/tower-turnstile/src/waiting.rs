//! The path of a request that waits: for a check the backend has not answered yet (a remote
//! backend), for a leaky bucket's delay, or for an [`Action::Delay`](crate::Action::Delay)
//! re-check — then calls the inner service, or answers itself. A
//! [`ResponseFuture`](crate::ResponseFuture) boxes this state machine only when a request
//! waits; a check decided at once (in memory) never does. Both settle their checks with
//! [`Check::settle`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower_service::Service;
use turnstile_core::wrap::FallbackFuture;
use turnstile_core::{Backend, SystemClock};

use crate::body::{inner_response, own_response, RateLimitBody};
use crate::check::{Check, Next};
use crate::headers::Prepared;
use crate::limiter::Limiter;
use crate::response::Protocol;

/// The future of a check the backend answers later.
pub(crate) type Reply<B> = FallbackFuture<<B as Backend>::Future, SystemClock>;

pin_project! {
    /// A request that waits (see the module): awaits the backend's decision, waits if the
    /// action or a leaky bucket says so, then calls the inner service — or answers the
    /// denial itself. Its documented behaviour is [`ResponseFuture`](crate::ResponseFuture)'s.
    pub(crate) struct WaitingFuture<B, K, S, R>
    where
        B: Backend,
        S: Service<R>,
    {
        #[pin]
        state: State<Reply<B>, S::Future>,
        limiter: Arc<Limiter<B, K>>,
        // The inner service and the request, until the inner service is called.
        inner: Option<S>,
        // Whether `inner` holds the readiness `poll_ready` reserved (else it must be driven
        // to readiness again before the call).
        reserved: bool,
        req: Option<R>,
        check: Check,
        // The fields the inner service's response gets.
        headers: Option<Prepared>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<C, F> {
        // Waiting for the backend's decision.
        Checking { #[pin] reply: C },
        // Denied; waiting out `retry_after` before checking again (Action::Delay).
        AwaitingRecheck { #[pin] sleep: Sleep },
        // Admitted; waiting out a leaky bucket's delay.
        Delaying { #[pin] sleep: Sleep },
        // Admitted (or not limited): the inner service is called next.
        Admitted,
        // The inner service is answering.
        Calling { #[pin] fut: F },
        // Turnstile answers itself.
        Respond { res: Option<Response<Bytes>> },
        Done,
    }
}

/// Where a [`WaitingFuture`] starts.
pub(crate) enum Start<C> {
    /// The backend's answer is awaited: `inner` holds the readiness `poll_ready` reserved.
    Checking(C),
    /// Denied: check again at this time (`inner` holds no readiness).
    AwaitingRecheck(Instant),
    /// Admitted: call the inner service at this time (`inner` holds no readiness), adding
    /// these fields to its response.
    Delaying(Instant, Option<Prepared>),
}

impl<B, K, S, ReqBody> WaitingFuture<B, K, S, Request<ReqBody>>
where
    B: Backend,
    S: Service<Request<ReqBody>>,
{
    /// The future from `start`, for `req` and the inner service `inner`.
    pub(crate) fn new(
        limiter: Arc<Limiter<B, K>>,
        inner: S,
        req: Request<ReqBody>,
        check: Check,
        start: Start<Reply<B>>,
    ) -> Self {
        let (state, reserved, headers) = match start {
            Start::Checking(reply) => (State::Checking { reply }, true, None),
            Start::AwaitingRecheck(at) => (
                State::AwaitingRecheck {
                    sleep: tokio::time::sleep_until(at),
                },
                false,
                None,
            ),
            Start::Delaying(at, headers) => (
                State::Delaying {
                    sleep: tokio::time::sleep_until(at),
                },
                false,
                headers,
            ),
        };
        WaitingFuture {
            state,
            limiter,
            inner: Some(inner),
            reserved,
            req: Some(req),
            check,
            headers,
        }
    }
}

impl<B: Backend, K, S: Service<R>, R> WaitingFuture<B, K, S, R> {
    /// The state's name, for `Debug`.
    pub(crate) fn state_name(&self) -> &'static str {
        match &self.state {
            State::Checking { .. } => "checking",
            State::AwaitingRecheck { .. } => "waiting",
            State::Delaying { .. } => "delaying",
            State::Admitted => "admitted",
            State::Calling { .. } => "calling",
            State::Respond { .. } => "responding",
            State::Done => "done",
        }
    }

    /// The request's cost, for `Debug`.
    pub(crate) fn cost(&self) -> u64 {
        self.check.cost
    }
}

/// An unreserved clone of the readied service `ready`, which is dropped (for
/// `ConcurrencyLimit`, its permit goes back).
pub(crate) fn without_reservation<S: Clone>(ready: S) -> S {
    let unreserved = ready.clone();
    drop(ready);
    unreserved
}

/// Releases the readiness the inner service reserved, before a wait: the readied service is
/// dropped (for `ConcurrencyLimit`, its permit goes back) and an unreserved clone kept.
fn release<S: Clone>(inner: &mut Option<S>, reserved: &mut bool) {
    if std::mem::take(reserved) {
        *inner = inner.take().map(without_reservation);
    }
}

/// The state after the backend's answer, settled as `next`: the inner service is called,
/// after a wait (which releases the readiness it reserved), or turnstile answers itself.
fn after_reply<S: Clone, C, F>(
    next: Next,
    inner: &mut Option<S>,
    reserved: &mut bool,
    headers: &mut Option<Prepared>,
) -> State<C, F> {
    match next {
        Next::Call(fields) => {
            *headers = fields;
            State::Admitted
        }
        Next::Delay {
            at,
            headers: fields,
        } => {
            *headers = fields;
            release(inner, reserved);
            State::Delaying {
                sleep: tokio::time::sleep_until(at),
            }
        }
        Next::Recheck { at } => {
            release(inner, reserved);
            State::AwaitingRecheck {
                sleep: tokio::time::sleep_until(at),
            }
        }
        Next::Respond(res) => State::Respond { res: Some(res) },
    }
}

/// The state once an [`Action::Delay`](crate::Action::Delay) wait ends: the request is
/// checked again (with its tier's limits), or admitted if it has none.
fn recheck<B: Backend, K, F>(limiter: &Limiter<B, K>, check: &mut Check) -> State<Reply<B>, F> {
    let rule = &limiter.settings.rules[check.rule];
    match rule.limits_for(check.tier) {
        Some(limits) => {
            check.restart(limiter);
            let reply = limiter
                .backend
                .check_limits(&check.key, limits, check.cost, None);
            State::Checking { reply }
        }
        None => State::Admitted,
    }
}

/// Calls the inner service with the request — after a wait, once it is ready again: the one
/// place this future does. `Ok(None)` when it was called before.
fn poll_call<S: Service<R>, R>(
    inner: &mut Option<S>,
    reserved: &mut bool,
    req: &mut Option<R>,
    cx: &mut Context<'_>,
) -> Poll<Result<Option<S::Future>, S::Error>> {
    if !*reserved {
        if let Some(inner) = inner.as_mut() {
            ready!(inner.poll_ready(cx))?;
        }
        *reserved = true;
    }
    let (Some(mut inner), Some(req)) = (inner.take(), req.take()) else {
        return Poll::Ready(Ok(None));
    };
    Poll::Ready(Ok(Some(inner.call(req))))
}

impl<B, K, S, ReqBody, ResBody> Future for WaitingFuture<B, K, S, Request<ReqBody>>
where
    B: Backend,
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    ResBody: RateLimitBody,
{
    type Output = Result<Response<ResBody>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            let limiter = &**this.limiter;
            let next = match this.state.as_mut().project() {
                StateProj::Checking { reply } => {
                    let result = {
                        let _entered = this.check.span.as_ref().map(tracing::Span::enter);
                        ready!(reply.poll(cx))
                    };
                    let req = this.req.as_ref();
                    let protocol = || req.map_or(Protocol::Http, |r| Protocol::of(r.headers()));
                    let next = this.check.settle(limiter, result, protocol);
                    after_reply(next, this.inner, this.reserved, this.headers)
                }
                StateProj::AwaitingRecheck { sleep } => {
                    ready!(sleep.poll(cx));
                    recheck(limiter, this.check)
                }
                StateProj::Delaying { sleep } => {
                    ready!(sleep.poll(cx));
                    State::Admitted
                }
                StateProj::Admitted => {
                    match ready!(poll_call(this.inner, this.reserved, this.req, cx)) {
                        Ok(Some(fut)) => State::Calling { fut },
                        // Polled after the inner service was called: a contract violation
                        // by the caller. Stay pending rather than panic.
                        Ok(None) => {
                            this.state.set(State::Done);
                            return Poll::Pending;
                        }
                        Err(e) => {
                            this.state.set(State::Done);
                            return Poll::Ready(Err(e));
                        }
                    }
                }
                StateProj::Calling { fut } => {
                    let res = ready!(fut.poll(cx));
                    this.state.set(State::Done);
                    return Poll::Ready(res.map(|res| inner_response(res, this.headers.take())));
                }
                StateProj::Respond { res } => {
                    let res = res.take();
                    this.state.set(State::Done);
                    return own_response(res);
                }
                // Polled after completion: a contract violation by the caller. Stay pending
                // rather than panic.
                StateProj::Done => return Poll::Pending,
            };
            this.state.set(next);
        }
    }
}
