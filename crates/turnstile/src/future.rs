//! The response future of [`RateLimit`](crate::RateLimit): a state machine that sequences
//! what [`decide`](crate::decide) says.

use std::fmt;
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
use turnstile_core::{Backend, Decision, SystemClock};

use crate::action::Action;
use crate::body::ResponseBody;
use crate::decide::{self, Step};
use crate::headers;
use crate::key::{Key, KeyExtractor, MissingKey, RequestRef};
use crate::metrics::Outcome;
use crate::response::{key_error, unavailable, Denial, Protocol};
use crate::state::Config;
use crate::tier::Chosen;
use crate::trace::{check_span, finish_span, measure};

pin_project! {
    /// The response future of [`RateLimit`](crate::RateLimit): awaits the backend's decision,
    /// waits if the action or a leaky bucket says so, then calls the inner service — or
    /// answers the denial itself.
    ///
    /// A request that must wait (a leaky bucket's delay, an [`Action::Delay`] re-check)
    /// releases the readiness it reserved from the inner service when its wait starts (it
    /// drops the service `poll_ready` readied and keeps an unreserved clone), and drives the
    /// clone's `poll_ready` again when its wait ends, before calling it: waiting holds no
    /// capacity of the inner service (a `ConcurrencyLimit` permit, a buffer slot).
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
        state: State<FallbackFuture<B::Future, SystemClock>, S::Future>,
        config: Arc<Config<B, K>>,
        // The inner service and the request, until the inner service is called.
        inner: Option<S>,
        // Whether `inner` holds the readiness `poll_ready` reserved (else it must be driven
        // to readiness again before the call).
        reserved: bool,
        req: Option<R>,
        key: Key,
        rule: usize,
        // The policy set the request's tier selected (`None`: the rule's own).
        tier: Chosen,
        cost: u64,
        protocol: Protocol,
        deadline: Option<Instant>,
        // The current check's span (disabled unless a subscriber wants it).
        span: Span,
        // When the current check was sent, if its latency is measured.
        started: Option<std::time::Instant>,
        // Whether Action::Delay held the request for a re-check.
        waited: bool,
        // When the current check was sent, as far as backend incidents go.
        ticket: Ticket,
        // The decision whose rate-limit headers the inner service's response gets (kept
        // here, not in the states, so it moves once).
        headers: Option<Decision>,
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

impl<B, K, S, R> fmt::Debug for ResponseFuture<B, K, S, R>
where
    B: Backend,
    S: Service<R>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Checking { .. } => "checking",
            State::Waiting { .. } => "waiting",
            State::Delaying { .. } => "delaying",
            State::Admitted => "admitted",
            State::Calling { .. } => "calling",
            State::Respond { .. } => "responding",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .field("cost", &self.cost)
            .finish_non_exhaustive()
    }
}

impl<B, K, S, ReqBody> ResponseFuture<B, K, S, Request<ReqBody>>
where
    B: Backend,
    K: KeyExtractor,
    S: Service<Request<ReqBody>>,
{
    /// A request the layer does not check: passed on as it is (`req`), or answered (`state`).
    fn unchecked(
        config: Arc<Config<B, K>>,
        inner: S,
        req: Option<Request<ReqBody>>,
        protocol: Protocol,
        state: State<FallbackFuture<B::Future, SystemClock>, S::Future>,
    ) -> Self {
        let ticket = config.ticket();
        ResponseFuture {
            state,
            config,
            inner: Some(inner),
            reserved: true,
            req,
            key: Key::new(),
            rule: 0,
            tier: None,
            cost: 0,
            protocol,
            deadline: None,
            span: Span::none(),
            started: None,
            waited: false,
            ticket,
            headers: None,
        }
    }

    /// Starts handling `req` with the ready service `inner`. (The future is built once, at
    /// the end: it is large, and every move of it is a copy.)
    pub(crate) fn start(config: Arc<Config<B, K>>, inner: S, req: Request<ReqBody>) -> Self {
        let settings = &*config.settings;
        let view = RequestRef::new(&req);
        let protocol = Protocol::of(&view);
        let rule_index = settings.rules.iter().position(|r| r.rule.matches(&view));
        // Exempt rules and requests no rule matches pass unchecked, without headers.
        let Some(rule_index) = rule_index.filter(|&i| !settings.rules[i].rule.exempt) else {
            return Self::unchecked(config, inner, Some(req), protocol, State::Admitted);
        };
        let rule = &settings.rules[rule_index];
        let key = match config.key.extract_key(&req) {
            Ok(k) => k,
            Err(e) => {
                crate::metrics::missing_key(e.kind());
                // A misconfiguration (no connect info) is logged once, whatever the outcome.
                config.key_failed(&e);
                match &settings.missing_key {
                    MissingKey::Allow => {
                        return Self::unchecked(
                            config,
                            inner,
                            Some(req),
                            protocol,
                            State::Admitted,
                        );
                    }
                    MissingKey::Key(k) => Key::from(Arc::clone(k)),
                    MissingKey::Reject => {
                        let res = Some(key_error(&e, protocol));
                        return Self::unchecked(
                            config,
                            inner,
                            None,
                            protocol,
                            State::Respond { res },
                        );
                    }
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
            return Self::unchecked(config, inner, Some(req), protocol, State::Admitted);
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
        ResponseFuture {
            state: State::Checking { check },
            config,
            inner: Some(inner),
            reserved: true,
            req: Some(req),
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
            headers: None,
        }
    }
}

/// Calls the inner service with the request: the one place the layer does.
fn call<S: Service<R>, R>(inner: &mut Option<S>, req: &mut Option<R>) -> Option<S::Future> {
    let (mut inner, req) = (inner.take()?, req.take()?);
    Some(inner.call(req))
}

/// Releases the readiness the inner service reserved, before a wait: the readied service is
/// dropped (for `ConcurrencyLimit`, its permit goes back) and an unreserved clone kept.
fn release<S: Clone>(inner: &mut Option<S>, reserved: &mut bool) {
    if std::mem::take(reserved) {
        if let Some(ready) = inner.take() {
            let unreserved = ready.clone();
            drop(ready);
            *inner = Some(unreserved);
        }
    }
}

impl<B, K, S, ReqBody, ResBody> Future for ResponseFuture<B, K, S, Request<ReqBody>>
where
    B: Backend,
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
{
    type Output = Result<Response<ResponseBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            let config = &**this.config;
            let settings = &*config.settings;
            let rule = &settings.rules[*this.rule];
            match this.state.as_mut().project() {
                StateProj::Checking { check } => {
                    let result = {
                        let _entered = this.span.enter();
                        rule.relabel(*this.tier, ready!(check.poll(cx)))
                    };
                    if let Some(started) = this.started.take() {
                        let elapsed = started.elapsed();
                        crate::metrics::backend_latency(elapsed);
                        this.span.record(
                            "backend_us",
                            u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX),
                        );
                    }
                    // The check's span closes at the end of this step.
                    let span = std::mem::replace(this.span, Span::none());
                    match &result {
                        Ok(decision) => config.backend_ok(decision, *this.ticket),
                        Err(e) => {
                            config.backend_failed(e, this.key, *this.ticket);
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
                        cost: *this.cost,
                        deadline: *this.deadline,
                        max_leaky_delay: rule.max_leaky_delay,
                        waited: *this.waited,
                    };
                    let keys = &*settings.metric_keys;
                    let next = match decide::after_check(result, &context, Instant::now()) {
                        Step::Call {
                            at,
                            headers,
                            outcome,
                            decision,
                        } => {
                            crate::metrics::decision(keys, &decision, outcome);
                            finish_span(&span, outcome.as_str(), &decision);
                            if headers {
                                *this.headers = Some(decision);
                            }
                            match at {
                                None => State::Admitted,
                                Some(at) => {
                                    release(this.inner, this.reserved);
                                    State::Delaying {
                                        sleep: tokio::time::sleep_until(at),
                                    }
                                }
                            }
                        }
                        Step::ShadowCall { decision } => {
                            config.shadow_denied();
                            crate::metrics::decision(keys, &decision, Outcome::ShadowDenied);
                            finish_span(&span, Outcome::ShadowDenied.as_str(), &decision);
                            tracing::info!(
                                target: "turnstile::shadow",
                                key = %settings.key_logging.display(this.key),
                                policies = ?decision.violated().map(|p| p.name()).collect::<Vec<_>>(),
                                retry_after_ms = decision.retry_after().map(|d| d.as_millis()),
                                "shadow mode: this request would have been denied"
                            );
                            State::Admitted
                        }
                        Step::Recheck { at, decision } => {
                            *this.waited = true;
                            finish_span(&span, "waiting", &decision);
                            release(this.inner, this.reserved);
                            State::Waiting {
                                sleep: tokio::time::sleep_until(at),
                            }
                        }
                        Step::Deny { decision } => {
                            crate::metrics::decision(keys, &decision, Outcome::Denied);
                            finish_span(&span, Outcome::Denied.as_str(), &decision);
                            let denial = Denial {
                                decision: &decision,
                                protocol: *this.protocol,
                                cost: *this.cost,
                            };
                            let res =
                                config.denial_response(&denial, rule.policy_header_for(*this.tier));
                            State::Respond { res: Some(res) }
                        }
                        Step::FailOpen => State::Admitted,
                        Step::FailClosed => State::Respond {
                            res: Some(unavailable(*this.protocol)),
                        },
                    };
                    this.state.set(next);
                }
                StateProj::Waiting { sleep } => {
                    ready!(sleep.poll(cx));
                    let next = match rule.limits_for(*this.tier) {
                        Some(limits) => {
                            *this.span = check_span(settings, rule, this.key, *this.cost);
                            *this.started = measure(this.span);
                            *this.ticket = config.ticket();
                            let check = config
                                .backend
                                .check_limits(this.key, limits, *this.cost, None);
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
                    if let Some(d) = this.headers.as_ref() {
                        headers::insert(
                            res.headers_mut(),
                            rule.policy_header_for(*this.tier),
                            d,
                            settings.legacy_headers,
                        );
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
