//! The layer's decision, as a pure function: given the backend's answer, the action, the
//! request's cost, its deadline and the time, what happens next — call the inner service
//! (now or after a leaky bucket's delay), check again later, deny, or fail. No runtime, no
//! service, no side effects: [`ResponseFuture`](crate::ResponseFuture) carries the step out
//! (and records metrics and spans for it).

use std::time::Duration;

use tokio::time::Instant;
use turnstile_core::{Algorithm, BackendError, Decision, FailurePolicy, OnError};

use crate::action::Action;
use crate::metrics::Outcome;

/// What a checked request is, apart from the backend's answer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Context {
    pub(crate) action: Action,
    pub(crate) failure: FailurePolicy,
    pub(crate) headers_on_allowed: bool,
    pub(crate) cost: u64,
    /// The latest time the request may reach the inner service ([`Action::Delay`]).
    pub(crate) deadline: Option<Instant>,
    /// The longest delay a leaky bucket of the request's rule can give.
    pub(crate) max_leaky_delay: Duration,
    /// Whether [`Action::Delay`] already held the request for a re-check.
    pub(crate) waited: bool,
}

/// What happens next, after a decision (which the caller keeps: a step never moves it).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Step {
    /// Call the inner service — at `at`, if a leaky bucket's delay must be waited out first —
    /// and, if `headers`, add the decision's rate-limit headers to its response.
    Call {
        at: Option<Instant>,
        headers: bool,
        outcome: Outcome,
    },
    /// [`Action::Shadow`]: call the inner service without headers, and count and log that
    /// enforcing would have denied the decision.
    ShadowCall,
    /// [`Action::Delay`]: check again at `at`.
    Recheck { at: Instant },
    /// Answer the denial.
    Deny,
    /// The backend could not decide: admit without headers (fail open).
    FailOpen,
    /// The backend could not decide: answer `503` / `UNAVAILABLE` (fail closed).
    FailClosed,
}

/// The step after a check that ended with `result`; `now` reads the time (only when a wait
/// is to be scheduled: most steps need none).
#[inline(always)]
pub(crate) fn after_check(
    result: &Result<Decision, BackendError>,
    cx: &Context,
    now: impl FnOnce() -> Instant,
) -> Step {
    match result {
        Ok(d) => after_decision(d, cx, now),
        // Under `Local` an error that reaches the layer is the fallback's own failure (or one
        // it does not stand in for): handled as open.
        Err(_) => match cx.failure.on_unhandled_error() {
            OnError::Refuse => Step::FailClosed,
            _ => Step::FailOpen,
        },
    }
}

#[inline(always)]
fn after_decision(decision: &Decision, cx: &Context, now: impl FnOnce() -> Instant) -> Step {
    if !decision.allowed() {
        match cx.action {
            Action::Shadow => return Step::ShadowCall,
            Action::Delay { .. } => {
                // Wait only if the re-check, plus the longest leaky-bucket delay it could
                // then get, still ends by the deadline.
                let now = now();
                let fits = decision
                    .retry_after()
                    .zip(cx.deadline)
                    .and_then(|(d, deadline)| {
                        let end = now.checked_add(d)?.checked_add(cx.max_leaky_delay)?;
                        (end <= deadline).then(|| now + d)
                    });
                if let Some(at) = fits {
                    return Step::Recheck { at };
                }
            }
            Action::Reject => {}
        }
        return Step::Deny;
    }
    let shadow = cx.action == Action::Shadow;
    // Only a leaky bucket delays an admitted request (`Decision::delay`): without one, the
    // delay is zero and is not computed.
    let leaky = decision
        .policies()
        .iter()
        .any(|p| p.policy().algorithm() == Algorithm::LeakyBucket);
    let delay = if cx.cost == 0 || shadow || !leaky {
        Duration::ZERO
    } else {
        decision.delay()
    };
    let outcome = if cx.waited || !delay.is_zero() {
        Outcome::Delayed
    } else {
        Outcome::Allowed
    };
    let at = (!delay.is_zero()).then(|| {
        let until = now() + delay;
        // Never past the maximum wait (the layer's build check makes this a guard against
        // timer rounding only).
        cx.deadline.map_or(until, |deadline| until.min(deadline))
    });
    Step::Call {
        at,
        headers: cx.headers_on_allowed && !shadow,
        outcome,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use turnstile_core::{Backend, MemoryBackend, Policy};

    fn cx(action: Action) -> Context {
        Context {
            action,
            failure: FailurePolicy::Local,
            headers_on_allowed: true,
            cost: 1,
            deadline: None,
            max_leaky_delay: Duration::ZERO,
            waited: false,
        }
    }

    /// The decisions of `n` requests of cost 1 at time 0 against `policy`.
    fn decisions(policy: &str, n: usize) -> Vec<Decision> {
        let b = MemoryBackend::new();
        let p: Policy = policy.parse().unwrap();
        (0..n)
            .map(|_| {
                b.check_at("k", std::slice::from_ref(&p), 1, 0)
                    .into_inner()
                    .unwrap()
            })
            .collect()
    }

    #[test]
    fn admitted_requests_are_called_with_headers() {
        let now = Instant::now();
        let d = decisions("fixed-window:limit=1,period=1s", 1).remove(0);
        match after_check(&Ok(d), &cx(Action::Reject), || now) {
            Step::Call {
                at: None,
                headers: true,
                outcome: Outcome::Allowed,
                ..
            } => {}
            other => panic!("{other:?}"),
        }
        let mut no_headers = cx(Action::Reject);
        no_headers.headers_on_allowed = false;
        let d = decisions("fixed-window:limit=1,period=1s", 1).remove(0);
        assert!(matches!(
            after_check(&Ok(d), &no_headers, || now),
            Step::Call { headers: false, .. }
        ));
    }

    #[test]
    fn a_leaky_bucket_delay_is_waited_out_within_the_deadline() {
        let now = Instant::now();
        // T = 100 ms: the second request waits 100 ms.
        let d = decisions("leaky-bucket:limit=10,period=1s", 2).remove(1);
        match after_check(&Ok(d), &cx(Action::Reject), || now) {
            Step::Call {
                at: Some(at),
                outcome: Outcome::Delayed,
                ..
            } => assert_eq!(at - now, Duration::from_millis(100)),
            other => panic!("{other:?}"),
        }
        let mut capped = cx(Action::delay(Duration::from_secs(1)));
        capped.deadline = Some(now + Duration::from_millis(30));
        let d = decisions("leaky-bucket:limit=10,period=1s", 2).remove(1);
        match after_check(&Ok(d), &capped, || now) {
            Step::Call { at: Some(at), .. } => assert_eq!(at - now, Duration::from_millis(30)),
            other => panic!("{other:?}"),
        }
        // A query (cost 0) and shadow mode never wait.
        let mut query = cx(Action::Reject);
        query.cost = 0;
        let d = decisions("leaky-bucket:limit=10,period=1s", 2).remove(1);
        assert!(matches!(
            after_check(&Ok(d), &query, || now),
            Step::Call { at: None, .. }
        ));
    }

    #[test]
    fn denials_are_rejected_rechecked_or_shadowed_by_the_action() {
        let now = Instant::now();
        let denied = || decisions("fixed-window:limit=1,period=1s", 2).remove(1);
        assert!(matches!(
            after_check(&Ok(denied()), &cx(Action::Reject), || now),
            Step::Deny
        ));
        assert!(matches!(
            after_check(&Ok(denied()), &cx(Action::Shadow), || now),
            Step::ShadowCall
        ));
        // Delay: re-checked when the wait fits the deadline, else denied at once.
        let mut delay = cx(Action::delay(Duration::from_secs(2)));
        delay.deadline = Some(now + Duration::from_secs(2));
        match after_check(&Ok(denied()), &delay, || now) {
            Step::Recheck { at, .. } => assert_eq!(at - now, Duration::from_secs(1)),
            other => panic!("{other:?}"),
        }
        delay.deadline = Some(now + Duration::from_millis(999));
        assert!(matches!(
            after_check(&Ok(denied()), &delay, || now),
            Step::Deny
        ));
        // A request that can never fit is denied at once.
        delay.deadline = Some(now + Duration::from_secs(3600));
        let b = MemoryBackend::new();
        let p: Policy = "fixed-window:limit=1,period=1s".parse().unwrap();
        let never = b.check_at("k", &[p], 2, 0).into_inner().unwrap();
        assert!(matches!(
            after_check(&Ok(never), &delay, || now),
            Step::Deny
        ));
        // After a re-check, an admission counts as delayed.
        let mut waited = cx(Action::Reject);
        waited.waited = true;
        let d = decisions("fixed-window:limit=1,period=1s", 1).remove(0);
        assert!(matches!(
            after_check(&Ok(d), &waited, || now),
            Step::Call {
                outcome: Outcome::Delayed,
                ..
            }
        ));
    }

    #[test]
    fn errors_follow_the_failure_policy() {
        let now = Instant::now();
        let err = || Err(BackendError::Connection("refused".into()));
        for (failure, open) in [
            (FailurePolicy::Open, true),
            (FailurePolicy::Local, true),
            (FailurePolicy::Closed, false),
        ] {
            let mut c = cx(Action::Reject);
            c.failure = failure;
            let step = after_check(&err(), &c, || now);
            assert_eq!(matches!(step, Step::FailOpen), open, "{failure}");
            assert_eq!(matches!(step, Step::FailClosed), !open, "{failure}");
        }
    }
}
