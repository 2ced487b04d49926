//! The response future of [`RateLimit`](crate::RateLimit), and the start of each request's
//! handling: what [`Service::call`] does before it returns the future.
//!
//! A check the backend decides inside the call (the in-memory backend, see
//! [`Backend::ready_now`]) is settled there: an admitted request's inner service is called
//! at once, with the service `poll_ready` readied, and the future only carries the inner
//! future and the rate-limit fields for its response; a denied one carries the denial. Only
//! a request that must wait (a remote backend's answer, a leaky bucket's delay, an
//! [`Action::Delay`](crate::Action::Delay) re-check) moves the inner service and the request
//! into a boxed state machine ([`crate::slow`]).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tokio::time::Instant;
use tower_service::Service;
use turnstile_core::Backend;

use crate::action::Action;
use crate::body::ResponseBody;
use crate::headers::Prepared;
use crate::key::{Key, KeyExtractor, MissingKey, RequestRef};
use crate::response::{key_error, Protocol};
use crate::slow::{without_reservation, CheckCx, Next, SlowFuture, Start};
use crate::state::Config;
use crate::trace::{check_span, measure};

pin_project! {
    /// The response future of [`RateLimit`](crate::RateLimit): the inner service's answer
    /// with the rate-limit headers added, or turnstile's own answer (a denial) — after
    /// awaiting the backend's decision and any wait the action or a leaky bucket asks for.
    ///
    /// A check the backend decides at once (in memory) is decided in
    /// [`Service::call`](https://docs.rs/tower-service/0.3/tower_service/trait.Service.html#tymethod.call),
    /// and an admitted request's inner service is called there too.
    ///
    /// A request that must wait (a leaky bucket's delay, an [`Action::Delay`] re-check)
    /// releases the readiness it reserved from the inner service when its wait starts (it
    /// drops the service `poll_ready` readied and keeps an unreserved clone), and drives the
    /// clone's `poll_ready` again when its wait ends, before calling it: waiting holds no
    /// capacity of the inner service (a `ConcurrencyLimit` permit, a buffer slot). A denied
    /// request releases it too.
    ///
    /// # Cancellation
    /// Dropping the future leaves the limiter consistent: each check is atomic in the
    /// backend, so it either consumed quota or not, and a denied check consumes nothing (so
    /// dropping a request that [`Action::Delay`] holds for a re-check costs nothing).
    /// Dropping it after an admission (for instance during a leaky bucket's delay) does not
    /// give the quota back.
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture<B, K, S, R>
    where
        B: Backend,
        S: Service<R>,
    {
        #[pin]
        state: State<S::Future, SlowFuture<B, K, S, R>>,
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
        Slow { fut: Pin<Box<W>> },
        Done,
    }
}

impl<B, K, S, R> fmt::Debug for ResponseFuture<B, K, S, R>
where
    B: Backend,
    S: Service<R>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (state, cost) = match &self.state {
            State::Calling { .. } => ("calling", None),
            State::Respond { .. } => ("responding", None),
            State::Slow { fut } => (fut.state_name(), Some(fut.cost())),
            State::Done => ("done", None),
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
        }
    }

    /// Turnstile's own answer `res`; the readiness the inner service reserved is released
    /// (the readied service dropped, a clone kept for the next call).
    fn respond(inner: &mut S, res: Response<Bytes>) -> Self {
        drop(take_ready(inner));
        ResponseFuture {
            state: State::Respond { res: Some(res) },
        }
    }

    /// Starts handling `req` with the ready service `inner` (left ready for the next call, or
    /// replaced by a clone when the request took its readiness), under `config`.
    #[inline]
    pub(crate) fn start(config: &Arc<Config<B, K>>, inner: &mut S, req: Request<ReqBody>) -> Self {
        let settings = &*config.settings;
        let view = RequestRef::new(&req);
        let protocol = Protocol::of(&view);
        let rule_index = settings.rules.iter().position(|r| r.rule.matches(&view));
        // Exempt rules and requests no rule matches pass unchecked, without headers.
        let Some(rule_index) = rule_index.filter(|&i| !settings.rules[i].rule.exempt) else {
            return Self::call_now(inner, req, None);
        };
        let rule = &settings.rules[rule_index];
        let key = match config.key.extract_key(&req) {
            Ok(k) => k,
            Err(e) => {
                crate::metrics::missing_key(e.kind());
                // A misconfiguration (no connect info) is logged once, whatever the outcome.
                config.key_failed(&e);
                match &settings.missing_key {
                    MissingKey::Allow => return Self::call_now(inner, req, None),
                    MissingKey::Key(k) => Key::from(Arc::clone(k)),
                    MissingKey::Reject => return Self::respond(inner, key_error(&e, protocol)),
                }
            }
        };
        let key_str = key.as_str();
        let exempt_key = !settings.exempt_keys.is_empty() && settings.exempt_keys.contains(key_str);
        let tier = if exempt_key {
            None
        } else {
            config.choose_tier(settings, rule, &view)
        };
        let (Some(limits), false) = (rule.limits_for(tier), exempt_key) else {
            return Self::call_now(inner, req, None);
        };
        let cost = config.cost(rule, &view);
        let deadline = match settings.action {
            Action::Delay { max_wait } => Instant::now().checked_add(max_wait),
            _ => None,
        };
        let span = check_span(settings, rule, key_str, cost);
        let started = measure(&span);
        let ticket = config.ticket();
        let check = config.backend.check_limits(key_str, limits, cost, None);
        let mut cx = CheckCx {
            key,
            rule: rule_index,
            tier,
            cost,
            protocol,
            deadline,
            span,
            started,
            waited: false,
            ticket,
        };
        let result = match <turnstile_core::wrap::Fallback<B> as Backend>::ready_now(check) {
            Ok(result) => result,
            Err(check) => {
                // The answer is awaited: the future takes the readied service and the request.
                let ready = take_ready(inner);
                return Self::slow(config, ready, req, cx, Start::Checking(check));
            }
        };
        // As the waiting future polls a check, within the check's span.
        if cx.span.metadata().is_some() {
            let _entered = cx.span.enter();
        }
        match cx.settle(config, result) {
            Next::Call(headers) => Self::call_now(inner, req, headers),
            Next::Respond(res) => Self::respond(inner, res),
            Next::Delay { at, headers } => {
                let unreserved = unreserved(inner);
                Self::slow(config, unreserved, req, cx, Start::Delaying(at, headers))
            }
            Next::Recheck { at } => {
                let unreserved = unreserved(inner);
                Self::slow(config, unreserved, req, cx, Start::Waiting(at))
            }
        }
    }

    fn slow(
        config: &Arc<Config<B, K>>,
        inner: S,
        req: Request<ReqBody>,
        cx: CheckCx,
        start: Start<turnstile_core::wrap::FallbackFuture<B::Future, turnstile_core::SystemClock>>,
    ) -> Self {
        let fut = SlowFuture::new(Arc::clone(config), inner, req, cx, start);
        ResponseFuture {
            state: State::Slow { fut: Box::pin(fut) },
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
{
    type Output = Result<Response<ResponseBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        match this.state.as_mut().project() {
            StateProj::Calling { fut, headers } => {
                let res = ready!(fut.poll(cx));
                let headers = headers.take();
                this.state.set(State::Done);
                let mut res = res?.map(ResponseBody::inner);
                if let Some(h) = headers {
                    h.insert(res.headers_mut());
                }
                Poll::Ready(Ok(res))
            }
            StateProj::Respond { res } => {
                let res = res.take();
                this.state.set(State::Done);
                match res {
                    Some(res) => Poll::Ready(Ok(res.map(ResponseBody::full))),
                    None => Poll::Pending,
                }
            }
            StateProj::Slow { fut } => {
                let out = ready!(fut.as_mut().poll(cx));
                this.state.set(State::Done);
                Poll::Ready(out)
            }
            // Polled after completion: a contract violation by the caller. Stay pending
            // rather than panic.
            StateProj::Done => Poll::Pending,
        }
    }
}
