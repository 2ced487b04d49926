//! The span of each backend check (`tracing`, target `turnstile`, level DEBUG): free when no
//! subscriber wants it.

use std::fmt;

use tracing::level_filters::LevelFilter;
use tracing::{Level, Span};
use turnstile_core::Decision;

use crate::limiter::Settings;
use crate::rule::CompiledRule;

/// The span of one backend check: the key (as [`KeyLogging`](crate::key::KeyLogging) says),
/// the rule and its policies, the cost; the outcome, the configuration that applied, the wait
/// and the backend's latency are recorded when the check completes. Free when no subscriber
/// wants DEBUG spans of target `turnstile`.
#[inline]
pub(crate) fn check_span(
    settings: &Settings,
    rule: &CompiledRule,
    key: &str,
    cost: u64,
) -> Option<Span> {
    // No subscriber enables DEBUG (the span macro's own first test), and no logger takes
    // DEBUG records (all that tracing's `log` fallback, when it is compiled in, could write
    // for this span: its fields, and its enter, exit and close at the span's level): the span
    // could do nothing, so none is made, and none is entered, recorded or closed.
    if LevelFilter::current() < Level::DEBUG && log::max_level() < log::LevelFilter::Debug {
        return None;
    }
    new_span(settings, rule, key, cost)
}

/// [`check_span`] once a subscriber or logger may want it.
#[inline(never)]
fn new_span(settings: &Settings, rule: &CompiledRule, key: &str, cost: u64) -> Option<Span> {
    let span = tracing::debug_span!(
        target: "turnstile",
        "rate_limit_check",
        key = %settings.key_logging.display(key),
        rule = %rule.label,
        policies = %PolicyNames(&rule.policies),
        cost,
        outcome = tracing::field::Empty,
        applied = tracing::field::Empty,
        retry_after_ms = tracing::field::Empty,
        backend_us = tracing::field::Empty,
    );
    // A span no subscriber takes may still be logged (its enter, exit and close) by tracing's
    // `log` fallback: kept while it has metadata.
    span.metadata().is_some().then_some(span)
}

/// When a check starts, if its latency is wanted (for metrics or an enabled span).
pub(crate) fn measure(span: Option<&Span>) -> Option<std::time::Instant> {
    (crate::metrics::MEASURE || span.is_some_and(|s| !s.is_disabled()))
        .then(std::time::Instant::now)
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
#[inline]
pub(crate) fn finish_span(span: Option<&Span>, outcome: &'static str, decision: &Decision) {
    if let Some(span) = span.filter(|s| !s.is_disabled()) {
        record_outcome(span, outcome, decision);
    }
}

/// [`finish_span`] on a span a subscriber took.
#[inline(never)]
fn record_outcome(span: &Span, outcome: &'static str, decision: &Decision) {
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
