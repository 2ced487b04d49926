//! The part of a request's handling that waits: a check the backend has not answered yet (a
//! remote backend), a leaky bucket's delay, an [`Action::Delay`](crate::Action::Delay) re-check. A
//! [`ResponseFuture`](crate::ResponseFuture) boxes this state machine only when it needs it;
//! a check decided at once (in memory) never does. [`CheckCx::settle`] turns a check's
//! result into what happens next, for both.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower_service::Service;
use tracing::Span;
use turnstile_core::wrap::{FallbackFuture, Ticket};
use turnstile_core::{Backend, CheckResult, SystemClock};

use crate::body::ResponseBody;
use crate::decide::{self, Step};
use crate::headers::Prepared;
use crate::key::Key;
use crate::metrics::Outcome;
use crate::response::{unavailable, Denial, Protocol};
use crate::state::Config;
use crate::tier::Chosen;
use crate::trace::{check_span, finish_span, measure};

/// What one request's check carries from its start to its outcome.
pub(crate) struct CheckCx {
    pub(crate) key: Key,
    pub(crate) rule: usize,
    /// The policy set the request's tier selected (`None`: the rule's own).
    pub(crate) tier: Chosen,
    pub(crate) cost: u64,
    pub(crate) protocol: Protocol,
    pub(crate) deadline: Option<Instant>,
    /// The current check's span (disabled unless a subscriber wants it).
    pub(crate) span: Span,
    /// When the current check was sent, if its latency is measured.
    pub(crate) started: Option<std::time::Instant>,
    /// Whether Action::Delay held the request for a re-check.
    pub(crate) waited: bool,
    /// When the current check was sent, as far as backend incidents go.
    pub(crate) ticket: Ticket,
}

/// What happens after a check.
pub(crate) enum Next {
    /// Call the inner service now, adding these fields to its response.
    Call(Option<Prepared>),
    /// Call the inner service at `at` (a leaky bucket's delay), adding `headers`.
    Delay {
        at: Instant,
        headers: Option<Prepared>,
    },
    /// Check again at `at` (Action::Delay).
    Recheck { at: Instant },
    /// Answer this instead of calling the inner service.
    Respond(Response<Bytes>),
}

impl CheckCx {
    /// Starts a check (again, after a wait): a fresh span, latency and incident marks.
    fn restart<B: Backend, K>(&mut self, config: &Config<B, K>) {
        let settings = &*config.settings;
        let rule = &settings.rules[self.rule];
        self.span = check_span(settings, rule, &self.key, self.cost);
        self.started = measure(&self.span);
        self.ticket = config.ticket();
    }

    /// What follows the check that ended with `result` (the backend's answer, not yet
    /// relabelled for the tier): records its metrics, span and incidents, and writes the
    /// denial or the admitted response's rate-limit fields. Closes the check's span.
    pub(crate) fn settle<B: Backend, K>(
        &mut self,
        config: &Config<B, K>,
        result: CheckResult,
    ) -> Next {
        let settings = &*config.settings;
        let rule = &settings.rules[self.rule];
        let result = rule.relabel(self.tier, result);
        if let Some(started) = self.started.take() {
            let elapsed = started.elapsed();
            crate::metrics::backend_latency(elapsed);
            self.span.record(
                "backend_us",
                u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX),
            );
        }
        // The check's span closes at the end of this step.
        let span = std::mem::replace(&mut self.span, Span::none());
        match &result {
            Ok(decision) => config.backend_ok(decision, self.ticket),
            Err(e) => {
                config.backend_failed(e, &self.key, self.ticket);
                crate::metrics::backend_error(e.kind());
                if !span.is_disabled() {
                    span.record("outcome", "backend_error");
                    tracing::debug!(target: "turnstile", parent: &span, error = %e, kind = e.kind(), "rate limit: backend failed");
                }
            }
        }
        let context = decide::Context {
            action: settings.action,
            failure: settings.failure,
            headers_on_allowed: settings.headers_on_allowed,
            cost: self.cost,
            deadline: self.deadline,
            max_leaky_delay: rule.max_leaky_delay,
            waited: self.waited,
        };
        let keys = &*settings.metric_keys;
        match decide::after_check(result, &context, Instant::now) {
            Step::Call {
                at,
                headers,
                outcome,
                decision,
            } => {
                crate::metrics::decision(keys, &decision, outcome);
                finish_span(&span, outcome.as_str(), &decision);
                let headers = if headers {
                    Prepared::new(
                        rule.policy_header_for(self.tier),
                        &decision,
                        settings.legacy_headers,
                    )
                } else {
                    None
                };
                match at {
                    None => Next::Call(headers),
                    Some(at) => Next::Delay { at, headers },
                }
            }
            Step::ShadowCall { decision } => {
                config.shadow_denied();
                crate::metrics::decision(keys, &decision, Outcome::ShadowDenied);
                finish_span(&span, Outcome::ShadowDenied.as_str(), &decision);
                tracing::info!(
                    target: "turnstile::shadow",
                    key = %settings.key_logging.display(&self.key),
                    policies = ?decision.violated().map(|p| p.name()).collect::<Vec<_>>(),
                    retry_after_ms = decision.retry_after().map(|d| d.as_millis()),
                    "shadow mode: this request would have been denied"
                );
                Next::Call(None)
            }
            Step::Recheck { at, decision } => {
                self.waited = true;
                finish_span(&span, "waiting", &decision);
                Next::Recheck { at }
            }
            Step::Deny { decision } => {
                crate::metrics::decision(keys, &decision, Outcome::Denied);
                finish_span(&span, Outcome::Denied.as_str(), &decision);
                let denial = Denial {
                    decision: &decision,
                    protocol: self.protocol,
                    cost: self.cost,
                };
                Next::Respond(config.denial_response(&denial, rule.policy_header_for(self.tier)))
            }
            Step::FailOpen => Next::Call(None),
            Step::FailClosed => Next::Respond(unavailable(self.protocol)),
        }
    }
}

pin_project! {
    /// The waiting part of a request's handling (see the module): awaits the backend's
    /// decision, waits if the action or a leaky bucket says so, then calls the inner service —
    /// or answers the denial itself. Its documented behaviour is
    /// [`ResponseFuture`](crate::ResponseFuture)'s.
    pub(crate) struct SlowFuture<B, K, S, R>
    where
        B: Backend,
        S: Service<R>,
    {
        #[pin]
        state: State<FallbackFuture<B::Future, SystemClock>, S::Future>,
        config: Arc<Config<B, K>>,
        // The inner service and the request, until the inner service is called.
        inner: Option<S>,
        // Whether `inner` holds the readiness `poll_ready` reserved (else it must be driven
        // to readiness again before the call).
        reserved: bool,
        req: Option<R>,
        cx: CheckCx,
        // The fields the inner service's response gets.
        headers: Option<Prepared>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<C, F> {
        // Waiting for the backend's decision.
        Checking { #[pin] check: C },
        // Denied; waiting out `retry_after` before checking again (Action::Delay).
        Waiting { #[pin] sleep: Sleep },
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

/// Where a [`SlowFuture`] starts.
pub(crate) enum Start<C> {
    /// The backend's answer is awaited: `inner` holds the readiness `poll_ready` reserved.
    Checking(C),
    /// Denied: check again at this time (`inner` holds no readiness).
    Waiting(Instant),
    /// Admitted: call the inner service at this time (`inner` holds no readiness), adding
    /// these fields to its response.
    Delaying(Instant, Option<Prepared>),
}

impl<B, K, S, ReqBody> SlowFuture<B, K, S, Request<ReqBody>>
where
    B: Backend,
    S: Service<Request<ReqBody>>,
{
    /// The future from `start`, for `req` and the inner service `inner`.
    pub(crate) fn new(
        config: Arc<Config<B, K>>,
        inner: S,
        req: Request<ReqBody>,
        cx: CheckCx,
        start: Start<FallbackFuture<B::Future, SystemClock>>,
    ) -> Self {
        let (state, reserved, headers) = match start {
            Start::Checking(check) => (State::Checking { check }, true, None),
            Start::Waiting(at) => (
                State::Waiting {
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
        SlowFuture {
            state,
            config,
            inner: Some(inner),
            reserved,
            req: Some(req),
            cx,
            headers,
        }
    }
}

impl<B: Backend, K, S: Service<R>, R> SlowFuture<B, K, S, R> {
    /// The state's name, for `Debug`.
    pub(crate) fn state_name(&self) -> &'static str {
        match &self.state {
            State::Checking { .. } => "checking",
            State::Waiting { .. } => "waiting",
            State::Delaying { .. } => "delaying",
            State::Admitted => "admitted",
            State::Calling { .. } => "calling",
            State::Respond { .. } => "responding",
            State::Done => "done",
        }
    }

    /// The request's cost, for `Debug`.
    pub(crate) fn cost(&self) -> u64 {
        self.cx.cost
    }
}

/// An unreserved clone of the readied service `ready`, which is dropped (for
/// `ConcurrencyLimit`, its permit goes back).
pub(crate) fn without_reservation<S: Clone>(ready: S) -> S {
    let unreserved = ready.clone();
    drop(ready);
    unreserved
}

/// Calls the inner service with the request: the one place this future does.
fn call<S: Service<R>, R>(inner: &mut Option<S>, req: &mut Option<R>) -> Option<S::Future> {
    let (mut inner, req) = (inner.take()?, req.take()?);
    Some(inner.call(req))
}

/// Releases the readiness the inner service reserved, before a wait: the readied service is
/// dropped (for `ConcurrencyLimit`, its permit goes back) and an unreserved clone kept.
fn release<S: Clone>(inner: &mut Option<S>, reserved: &mut bool) {
    if std::mem::take(reserved) {
        *inner = inner.take().map(without_reservation);
    }
}

impl<B, K, S, ReqBody, ResBody> Future for SlowFuture<B, K, S, Request<ReqBody>>
where
    B: Backend,
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
{
    type Output = Result<Response<ResponseBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            let config = &**this.config;
            match this.state.as_mut().project() {
                StateProj::Checking { check } => {
                    let result = {
                        let _entered = this.cx.span.enter();
                        ready!(check.poll(cx))
                    };
                    let next = match this.cx.settle(config, result) {
                        Next::Call(headers) => {
                            *this.headers = headers;
                            State::Admitted
                        }
                        Next::Delay { at, headers } => {
                            *this.headers = headers;
                            release(this.inner, this.reserved);
                            State::Delaying {
                                sleep: tokio::time::sleep_until(at),
                            }
                        }
                        Next::Recheck { at } => {
                            release(this.inner, this.reserved);
                            State::Waiting {
                                sleep: tokio::time::sleep_until(at),
                            }
                        }
                        Next::Respond(res) => State::Respond { res: Some(res) },
                    };
                    this.state.set(next);
                }
                StateProj::Waiting { sleep } => {
                    ready!(sleep.poll(cx));
                    let settings = &*config.settings;
                    let rule = &settings.rules[this.cx.rule];
                    let next = match rule.limits_for(this.cx.tier) {
                        Some(limits) => {
                            this.cx.restart(config);
                            let check = config.backend.check_limits(
                                &this.cx.key,
                                limits,
                                this.cx.cost,
                                None,
                            );
                            State::Checking { check }
                        }
                        None => State::Admitted,
                    };
                    this.state.set(next);
                }
                StateProj::Delaying { sleep } => {
                    ready!(sleep.poll(cx));
                    this.state.set(State::Admitted);
                }
                StateProj::Admitted => {
                    // After a wait: acquire the inner service's readiness again.
                    if !*this.reserved {
                        if let Some(inner) = this.inner.as_mut() {
                            if let Err(e) = ready!(inner.poll_ready(cx)) {
                                this.state.set(State::Done);
                                return Poll::Ready(Err(e));
                            }
                        }
                        *this.reserved = true;
                    }
                    match call(this.inner, this.req) {
                        Some(fut) => this.state.set(State::Calling { fut }),
                        // Polled after the inner service was called: a contract violation
                        // by the caller. Stay pending rather than panic.
                        None => {
                            this.state.set(State::Done);
                            return Poll::Pending;
                        }
                    }
                }
                StateProj::Calling { fut } => {
                    let res = ready!(fut.poll(cx))?;
                    this.state.set(State::Done);
                    let mut res = res.map(ResponseBody::inner);
                    if let Some(h) = this.headers.take() {
                        h.insert(res.headers_mut());
                    }
                    return Poll::Ready(Ok(res));
                }
                StateProj::Respond { res } => {
                    let res = res.take();
                    this.state.set(State::Done);
                    match res {
                        Some(res) => return Poll::Ready(Ok(res.map(ResponseBody::full))),
                        None => return Poll::Pending,
                    }
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
