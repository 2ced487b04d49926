//! One request's check against the backend, and what follows it: [`Check`] carries what the
//! request's checks need from the first to the last (a request [`Action::Delay`] holds is
//! checked again), and [`Check::settle`] turns the backend's answer into what happens next
//! ([`Next`]), recording its metrics, span and backend incidents on the way. Both the request
//! decided inside [`Service::call`](tower_service::Service::call) (in memory) and the one
//! that waits (the `waiting` module) settle their checks here.
//!
//! [`Action::Delay`]: crate::Action::Delay

use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use tokio::time::Instant;
use tracing::Span;
use turnstile_core::wrap::Ticket;
use turnstile_core::{Backend, CheckResult, Decision, Limits};

use crate::action::Action;
use crate::decide::{self, Step};
use crate::headers::Prepared;
use crate::key::{Key, KeyError, KeyExtractor, MissingKey, RequestRef};
use crate::limiter::{Limiter, Settings};
use crate::metrics::Outcome;
use crate::response::{key_error, unavailable, Denial, Protocol};
use crate::rule::CompiledRule;
use crate::tier::Chosen;
use crate::trace::{check_span, finish_span, measure};

/// What one request's check carries from its start to its outcome.
pub(crate) struct Check {
    pub(crate) key: Key,
    pub(crate) rule: usize,
    /// The policy set the request's tier selected (`None`: the rule's own).
    pub(crate) tier: Chosen,
    pub(crate) cost: u64,
    pub(crate) deadline: Option<Instant>,
    /// The current check's span (disabled unless a subscriber wants it).
    pub(crate) span: Option<Span>,
    /// When the current check was sent, if its latency is measured.
    pub(crate) started: Option<std::time::Instant>,
    /// Whether Action::Delay held the request for a re-check.
    pub(crate) waited: bool,
    /// When the current check was sent, as far as backend incidents go.
    pub(crate) ticket: Ticket,
}

/// What a request gets before any check: passed unchecked, answered, or checked.
pub(crate) enum Plan<'a> {
    /// Call the inner service without a check and without rate-limit fields (an exempt rule
    /// or key, no rule matched, a missing key allowed, an unlimited tier).
    Pass,
    /// Answer this instead of calling the inner service (a missing key, refused).
    Respond(Response<Bytes>),
    /// Check the request against these limits.
    Check(Check, &'a Limits),
}

/// The key of `req`; without one, what [`MissingKey`] says: a shared key, or `Err(None)` to
/// pass the request unchecked, or `Err(Some(e))` to refuse it for `e`. A key longer than the
/// layer takes is refused whatever [`MissingKey`] says. A misconfiguration (no connect
/// info) is logged once, whatever the outcome.
#[inline]
fn key_of<B, K: KeyExtractor, ReqBody>(
    limiter: &Limiter<B, K>,
    req: &Request<ReqBody>,
) -> Result<Key, Option<KeyError>> {
    let e = match limiter.key.extract_key(req) {
        Ok(key) if key.len() <= limiter.settings.max_key_bytes => return Ok(key),
        Ok(key) => KeyError::TooLong {
            len: key.len(),
            max: limiter.settings.max_key_bytes,
        },
        Err(e) => e,
    };
    crate::metrics::missing_key(e.kind());
    limiter.key_failed(&e);
    match (&limiter.settings.missing_key, &e) {
        (_, KeyError::TooLong { .. }) | (MissingKey::Reject, _) => Err(Some(e)),
        (MissingKey::Allow, _) => Err(None),
        (MissingKey::Key(k), _) => Ok(Key::from(Arc::clone(k))),
    }
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

impl Check {
    /// What `req` gets under `limiter` before any check: its rule (the first that matches),
    /// its key, tier and cost, and the check's span and marks.
    #[inline]
    pub(crate) fn plan<'a, B, K: KeyExtractor, ReqBody>(
        limiter: &'a Limiter<B, K>,
        req: &Request<ReqBody>,
    ) -> Plan<'a> {
        let settings = &*limiter.settings;
        let view = RequestRef::new(req);
        let rule_index = settings.rules.iter().position(|r| r.rule.matches(&view));
        // Exempt rules and requests no rule matches pass unchecked, without headers.
        let Some(rule_index) = rule_index.filter(|&i| !settings.rules[i].rule.exempt) else {
            return Plan::Pass;
        };
        let rule = &settings.rules[rule_index];
        let key = match key_of(limiter, req) {
            Ok(key) => key,
            Err(None) => return Plan::Pass,
            Err(Some(e)) => return Plan::Respond(key_error(&e, Protocol::of(req.headers()))),
        };
        let exempt_key = !settings.exempt_keys.is_empty() && settings.exempt_keys.contains(&*key);
        let tier = if exempt_key {
            None
        } else {
            limiter.choose_tier(settings, rule, &view)
        };
        let (Some(limits), false) = (rule.limits_for(tier), exempt_key) else {
            return Plan::Pass;
        };
        let cost = limiter.cost(rule, &view);
        let deadline = match settings.action {
            Action::Delay { max_wait } => Instant::now().checked_add(max_wait),
            _ => None,
        };
        let span = check_span(settings, rule, &key, cost);
        let check = Check {
            started: measure(span.as_ref()),
            ticket: limiter.ticket(),
            key,
            rule: rule_index,
            tier,
            cost,
            deadline,
            span,
            waited: false,
        };
        Plan::Check(check, limits)
    }

    /// Starts a check (again, after a wait): a fresh span, latency and incident marks.
    pub(crate) fn restart<B: Backend, K>(&mut self, limiter: &Limiter<B, K>) {
        let settings = &*limiter.settings;
        let rule = &settings.rules[self.rule];
        self.span = check_span(settings, rule, &self.key, self.cost);
        self.started = measure(self.span.as_ref());
        self.ticket = limiter.ticket();
    }

    /// What follows the check that ended with `result` (the backend's answer, not yet
    /// relabelled for the tier): records its metrics, span and incidents, and writes the
    /// denial or the admitted response's rate-limit fields. Closes the check's span.
    /// `protocol` tells the request's protocol, read only for a response of the layer's own.
    #[inline]
    pub(crate) fn settle<B: Backend, K>(
        &mut self,
        limiter: &Limiter<B, K>,
        result: CheckResult,
        protocol: impl FnOnce() -> Protocol,
    ) -> Next {
        let settings = &*limiter.settings;
        let rule = &settings.rules[self.rule];
        // Only a tier relabels: the usual request's result is used as it is (not moved).
        let relabelled;
        let result = match self.tier {
            Some(_) => {
                relabelled = rule.relabel(self.tier, result);
                &relabelled
            }
            None => &result,
        };
        // The check's span closes at the end of this step.
        let span = self.observe(limiter, result);
        let step = decide::after_check(result, &self.context(settings, rule), Instant::now);
        match result {
            Ok(decision) => {
                self.carry_out(limiter, rule, (step, decision), span.as_ref(), protocol)
            }
            Err(_) => failed(step, protocol),
        }
    }

    /// Records what `result` says about the backend — its latency, the incident it starts or
    /// ends, its error — and takes the check's span out of `self`.
    #[inline(always)]
    fn observe<B: Backend, K>(
        &mut self,
        limiter: &Limiter<B, K>,
        result: &CheckResult,
    ) -> Option<Span> {
        let span = self.span.take();
        if let Some(started) = self.started.take() {
            let elapsed = started.elapsed();
            crate::metrics::backend_latency(elapsed);
            if let Some(span) = &span {
                span.record(
                    "backend_us",
                    u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX),
                );
            }
        }
        match result {
            Ok(decision) => limiter.backend_ok(decision, self.ticket),
            Err(e) => {
                limiter.backend_failed(e, &self.key, self.ticket);
                crate::metrics::backend_error(e.kind());
                if let Some(span) = span.as_ref().filter(|s| !s.is_disabled()) {
                    span.record("outcome", "backend_error");
                    tracing::debug!(target: "turnstile", parent: span, error = %e, kind = e.kind(), "rate limit: backend failed");
                }
            }
        }
        span
    }

    /// What [`decide::after_check`] needs to know of this request besides the answer.
    #[inline(always)]
    fn context(&self, settings: &Settings, rule: &CompiledRule) -> decide::Context {
        decide::Context {
            action: settings.action,
            failure: settings.failure,
            headers_on_allowed: settings.headers_on_allowed,
            cost: self.cost,
            deadline: self.deadline,
            max_leaky_delay: rule.max_leaky_delay,
            waited: self.waited,
        }
    }

    /// Carries out `step`, which followed `decision` under `rule`: its metrics and its
    /// outcome on `span`, and what the request gets.
    #[inline(always)]
    fn carry_out<B: Backend, K>(
        &mut self,
        limiter: &Limiter<B, K>,
        rule: &CompiledRule,
        (step, decision): (Step, &Decision),
        span: Option<&Span>,
        protocol: impl FnOnce() -> Protocol,
    ) -> Next {
        let settings = &*limiter.settings;
        let keys = &*settings.metric_keys;
        match step {
            Step::Call {
                at,
                headers,
                outcome,
            } => {
                crate::metrics::decision(keys, decision, outcome);
                finish_span(span, outcome.as_str(), decision);
                let headers = if headers {
                    let policy_header = rule.policy_header_for(self.tier);
                    Prepared::new(policy_header, decision, settings.legacy_headers)
                } else {
                    None
                };
                match at {
                    None => Next::Call(headers),
                    Some(at) => Next::Delay { at, headers },
                }
            }
            Step::ShadowCall => {
                self.shadow_denied(limiter, decision, span);
                Next::Call(None)
            }
            Step::Recheck { at } => {
                self.waited = true;
                finish_span(span, "waiting", decision);
                Next::Recheck { at }
            }
            Step::Deny => {
                crate::metrics::decision(keys, decision, Outcome::Denied);
                finish_span(span, Outcome::Denied.as_str(), decision);
                let denial = Denial {
                    decision,
                    protocol: protocol(),
                    cost: self.cost,
                };
                Next::Respond(limiter.denial_response(&denial, rule.policy_header_for(self.tier)))
            }
            Step::FailOpen | Step::FailClosed => failed(step, protocol),
        }
    }

    /// Counts, records and logs a request shadow mode admits although enforcing would have
    /// denied it with `decision`.
    fn shadow_denied<B, K>(
        &self,
        limiter: &Limiter<B, K>,
        decision: &Decision,
        span: Option<&Span>,
    ) {
        let settings = &*limiter.settings;
        limiter.shadow_denied();
        crate::metrics::decision(&settings.metric_keys, decision, Outcome::ShadowDenied);
        finish_span(span, Outcome::ShadowDenied.as_str(), decision);
        tracing::info!(
            target: "turnstile::shadow",
            key = %settings.key_logging.display(&self.key),
            policies = ?decision.violated().map(|p| p.name()).collect::<Vec<_>>(),
            retry_after_ms = decision.retry_after().map(|d| d.as_millis()),
            "shadow mode: this request would have been denied"
        );
    }
}

/// What a request whose check failed gets (`step`: open or closed).
fn failed(step: Step, protocol: impl FnOnce() -> Protocol) -> Next {
    match step {
        Step::FailClosed => Next::Respond(unavailable(protocol())),
        _ => Next::Call(None),
    }
}
