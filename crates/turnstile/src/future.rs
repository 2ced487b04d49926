//! The response future of [`RateLimit`](crate::RateLimit).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower_service::Service;
use tracing::Span;
use turnstile_core::{Backend, Decision};

use crate::body::ResponseBody;
use crate::headers;
use crate::key::{KeyExtractor, MissingKey, RequestRef};
use crate::layer::{Action, Config, FailurePolicy, Settings};
use crate::metrics::Outcome;
use crate::response::{key_error, unavailable, Denial, Protocol};
use crate::rule::CompiledRule;

pin_project! {
    /// The response future of [`RateLimit`](crate::RateLimit): awaits the backend's decision,
    /// waits if the action or a leaky bucket says so, then calls the inner service — or
    /// answers the denial itself.
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
        state: State<B::Future, S, R, S::Future>,
        config: Arc<Config<B, K>>,
        key: String,
        rule: usize,
        cost: u64,
        grpc: bool,
        deadline: Option<Instant>,
        // The current check's span (disabled unless a subscriber wants it).
        span: Span,
        // When the current check was sent, if its latency is measured.
        started: Option<std::time::Instant>,
        // Whether Action::Delay held the request for a re-check.
        waited: bool,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<C, S, R, F> {
        // Waiting for the backend's decision.
        Checking {
            #[pin]
            check: C,
            inner: Option<S>,
            req: Option<R>,
        },
        // Denied; waiting out `retry_after` before checking again (Action::Delay).
        Waiting {
            #[pin]
            sleep: Sleep,
            inner: Option<S>,
            req: Option<R>,
        },
        // Admitted; waiting out a leaky bucket's delay.
        Delaying {
            #[pin]
            sleep: Sleep,
            inner: Option<S>,
            req: Option<R>,
            decision: Option<Decision>,
        },
        // Admitted (or not limited); the inner service is answering.
        Calling {
            #[pin]
            fut: F,
            decision: Option<Decision>,
        },
        // Turnstile answers itself.
        Respond {
            res: Option<Response<Bytes>>,
        },
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
    /// Starts handling `req` with the ready service `inner`.
    pub(crate) fn start(config: Arc<Config<B, K>>, inner: S, req: Request<ReqBody>) -> Self {
        let settings = &*config.settings;
        let view = RequestRef::new(&req);
        let grpc = view.is_grpc();
        let rule_index = settings.rules.iter().position(|r| r.rule.matches(&view));
        let Some(rule_index) = rule_index.filter(|&i| !settings.rules[i].rule.exempt) else {
            return Self::pass(config, inner, req, grpc);
        };
        let rule = &settings.rules[rule_index];
        let key = match config.key.extract(&req) {
            Ok(k) => k,
            Err(e) => {
                crate::metrics::missing_key(e.kind());
                match &settings.missing_key {
                    MissingKey::Allow => {
                        return Self::pass(config, inner, req, grpc);
                    }
                    MissingKey::Key(k) => String::from(&**k),
                    MissingKey::Reject => {
                        config.key_failed(&e);
                        let res = Some(key_error(&e, grpc));
                        return Self::with_state(config, State::Respond { res }, grpc);
                    }
                }
            }
        };
        if !settings.exempt_keys.is_empty() && settings.exempt_keys.contains(key.as_str()) {
            return Self::pass(config, inner, req, grpc);
        }
        let cost = config.cost(rule, &view);
        let deadline = match settings.action {
            Action::Delay { max_wait } => Instant::now().checked_add(max_wait),
            _ => None,
        };
        let Some(limits) = &rule.limits else {
            // Exempt rules never get here; stay correct if one does.
            return Self::pass(config, inner, req, grpc);
        };
        let span = check_span(settings, rule, &key, cost);
        let started = measure(&span);
        let check = config.backend.check_limits(&key, limits, cost, None);
        ResponseFuture {
            state: State::Checking {
                check,
                inner: Some(inner),
                req: Some(req),
            },
            config,
            key,
            rule: rule_index,
            cost,
            grpc,
            deadline,
            span,
            started,
            waited: false,
        }
    }

    /// Passes `req` straight to the inner service: unchecked, without rate-limit headers.
    fn pass(config: Arc<Config<B, K>>, mut inner: S, req: Request<ReqBody>, grpc: bool) -> Self {
        let fut = inner.call(req);
        Self::with_state(
            config,
            State::Calling {
                fut,
                decision: None,
            },
            grpc,
        )
    }

    fn with_state(
        config: Arc<Config<B, K>>,
        state: State<B::Future, S, Request<ReqBody>, S::Future>,
        grpc: bool,
    ) -> Self {
        ResponseFuture {
            state,
            config,
            key: String::new(),
            rule: 0,
            cost: 0,
            grpc,
            deadline: None,
            span: Span::none(),
            started: None,
            waited: false,
        }
    }
}

/// The span of one backend check: the key (as [`KeyLogging`](crate::key::KeyLogging) says),
/// the rule and its policies, the cost; the outcome, the configuration that applied, the wait
/// and the backend's latency are recorded when the check completes. Free when no subscriber
/// wants DEBUG spans of target `turnstile`.
fn check_span(settings: &Settings, rule: &CompiledRule, key: &str, cost: u64) -> Span {
    tracing::debug_span!(
        target: "turnstile",
        "rate_limit_check",
        key = %settings.key_logging.display(key),
        rule = %rule.rule.label(),
        policies = %PolicyNames(&rule.policies),
        cost,
        outcome = tracing::field::Empty,
        applied = tracing::field::Empty,
        retry_after_ms = tracing::field::Empty,
        backend_us = tracing::field::Empty,
    )
}

/// When a check starts, if its latency is wanted (for metrics or an enabled span).
fn measure(span: &Span) -> Option<std::time::Instant> {
    (crate::metrics::MEASURE || !span.is_disabled()).then(std::time::Instant::now)
}

/// Policy names, comma-separated, formatted on demand.
struct PolicyNames<'a>(&'a [turnstile_core::Policy]);

impl fmt::Display for PolicyNames<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            f.write_str(p.name())?;
        }
        Ok(())
    }
}

/// Records a finished check's outcome on its span, with a DEBUG event for denials and a
/// TRACE event otherwise.
fn finish_span(span: &Span, outcome: &'static str, decision: &Decision) {
    if span.is_disabled() {
        return;
    }
    span.record("outcome", outcome);
    span.record("applied", decision.applied().label());
    if !decision.allowed() {
        match decision.retry_after() {
            Some(d) => span.record(
                "retry_after_ms",
                u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
            ),
            None => span.record("retry_after_ms", "never"),
        };
        tracing::debug!(target: "turnstile", parent: span, outcome, "rate limit: request denied");
    } else {
        tracing::trace!(target: "turnstile", parent: span, outcome, "rate limit: request admitted");
    }
}

impl<B, K, S, ReqBody, ResBody> Future for ResponseFuture<B, K, S, Request<ReqBody>>
where
    B: Backend,
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    type Output = Result<Response<ResponseBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            let config = &**this.config;
            let settings = &*config.settings;
            match this.state.as_mut().project() {
                StateProj::Checking { check, inner, req } => {
                    let result = {
                        let _entered = this.span.enter();
                        ready!(check.poll(cx))
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
                    let rule = &settings.rules[*this.rule];
                    let keys = &*settings.metric_keys;
                    let decision = match result {
                        Ok(d) => {
                            config.backend_ok();
                            d
                        }
                        Err(e) => {
                            config.backend_failed(&e);
                            crate::metrics::backend_error(e.kind());
                            if !span.is_disabled() {
                                span.record("outcome", "backend_error");
                                tracing::debug!(target: "turnstile", parent: &span, error = %e, kind = e.kind(), "rate limit: backend failed");
                            }
                            if settings.failure == FailurePolicy::Closed {
                                let res = Some(unavailable(*this.grpc));
                                this.state.set(State::Respond { res });
                            } else {
                                let (mut inner, req) = take_both(inner, req);
                                let fut = inner.call(req);
                                this.state.set(State::Calling {
                                    fut,
                                    decision: None,
                                });
                            }
                            continue;
                        }
                    };
                    if !decision.allowed() {
                        match settings.action {
                            Action::Shadow => {
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
                                let (mut inner, req) = take_both(inner, req);
                                let fut = inner.call(req);
                                this.state.set(State::Calling {
                                    fut,
                                    decision: None,
                                });
                                continue;
                            }
                            Action::Delay { .. } => {
                                // Wait only if the re-check, plus the longest leaky-bucket
                                // delay it could then get, still ends by the deadline.
                                let fits = decision.retry_after().zip(*this.deadline).and_then(
                                    |(d, deadline)| {
                                        let end = Instant::now()
                                            .checked_add(d)?
                                            .checked_add(rule.max_leaky_delay)?;
                                        (end <= deadline).then_some(d)
                                    },
                                );
                                if let Some(d) = fits {
                                    *this.waited = true;
                                    finish_span(&span, "waiting", &decision);
                                    let (inner, req) = take_both(inner, req);
                                    this.state.set(State::Waiting {
                                        sleep: tokio::time::sleep(d),
                                        inner: Some(inner),
                                        req: Some(req),
                                    });
                                    continue;
                                }
                            }
                            _ => {}
                        }
                        crate::metrics::decision(keys, &decision, Outcome::Denied);
                        finish_span(&span, Outcome::Denied.as_str(), &decision);
                        let denial = Denial {
                            decision: &decision,
                            protocol: if *this.grpc {
                                Protocol::Grpc
                            } else {
                                Protocol::Http
                            },
                            cost: *this.cost,
                        };
                        let mut res = config.denial_response(&denial);
                        headers::insert(
                            res.headers_mut(),
                            &rule.policy_header,
                            &decision,
                            settings.legacy_headers,
                        );
                        this.state.set(State::Respond { res: Some(res) });
                        continue;
                    }
                    let shadow = settings.action == Action::Shadow;
                    let delay = if *this.cost == 0 || shadow {
                        Duration::ZERO
                    } else {
                        decision.delay()
                    };
                    let outcome = if *this.waited || !delay.is_zero() {
                        Outcome::Delayed
                    } else {
                        Outcome::Allowed
                    };
                    crate::metrics::decision(keys, &decision, outcome);
                    finish_span(&span, outcome.as_str(), &decision);
                    let decision = (settings.headers_on_allowed && !shadow).then_some(decision);
                    let (mut inner, req) = take_both(inner, req);
                    if delay.is_zero() {
                        let fut = inner.call(req);
                        this.state.set(State::Calling { fut, decision });
                    } else {
                        let mut until = Instant::now() + delay;
                        if let Some(deadline) = *this.deadline {
                            // Never past the maximum wait (the layer's build check makes
                            // this a guard against timer rounding only).
                            until = until.min(deadline);
                        }
                        this.state.set(State::Delaying {
                            sleep: tokio::time::sleep_until(until),
                            inner: Some(inner),
                            req: Some(req),
                            decision,
                        });
                    }
                }
                StateProj::Waiting { sleep, inner, req } => {
                    ready!(sleep.poll(cx));
                    let (inner, req) = take_both(inner, req);
                    let rule = &settings.rules[*this.rule];
                    let Some(limits) = &rule.limits else {
                        let (mut inner, req) = (inner, req);
                        let fut = inner.call(req);
                        this.state.set(State::Calling {
                            fut,
                            decision: None,
                        });
                        continue;
                    };
                    *this.span = check_span(settings, rule, this.key, *this.cost);
                    *this.started = measure(this.span);
                    let check = config
                        .backend
                        .check_limits(this.key, limits, *this.cost, None);
                    this.state.set(State::Checking {
                        check,
                        inner: Some(inner),
                        req: Some(req),
                    });
                }
                StateProj::Delaying {
                    sleep,
                    inner,
                    req,
                    decision,
                } => {
                    ready!(sleep.poll(cx));
                    let decision = decision.take();
                    let (mut inner, req) = take_both(inner, req);
                    let fut = inner.call(req);
                    this.state.set(State::Calling { fut, decision });
                }
                StateProj::Calling { fut, decision } => {
                    let res = ready!(fut.poll(cx))?;
                    let decision = decision.take();
                    this.state.set(State::Done);
                    let mut res = res.map(ResponseBody::inner);
                    if let Some(d) = decision {
                        let rule = &settings.rules[*this.rule];
                        headers::insert(
                            res.headers_mut(),
                            &rule.policy_header,
                            &d,
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

fn take_both<S, R>(inner: &mut Option<S>, req: &mut Option<R>) -> (S, R) {
    match (inner.take(), req.take()) {
        (Some(s), Some(r)) => (s, r),
        // Each state holds both until it moves them out and leaves the state.
        _ => unreachable!("service and request are taken exactly once"),
    }
}
