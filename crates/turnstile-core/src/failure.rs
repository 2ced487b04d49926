//! What happens when the backend cannot decide: one operator choice, one table.

use crate::backend::BackendError;

/// What a check gets when the backend cannot decide it: the operator's one choice, made
/// once for every check (named in configuration files and flags by
/// [`FailurePolicy::as_str`]).
///
/// | error ([`BackendError`]) | `Open` | `Closed` | `Local` (default) | counts as down |
/// | --- | --- | --- | --- | --- |
/// | unreachable (an endpoint that is not the backend included: the Redis backend says "not a Redis server at …"), timed out, or failed running the check ([`BackendError::is_unavailable`]: `Connection`, `Timeout`, `Script`) | admitted, without a decision | denied as unavailable | decided by the local fallback | yes, on the backend's evidence (the Redis backend: per node) |
/// | one key's stored state or configuration unreadable (`InvalidState`) | admitted | denied as unavailable | decided by the local fallback | no |
/// | the in-memory key cap reached (`CapacityExceeded`) | admitted | denied as unavailable | admitted (as `Open`: the fallback is memory too) | no |
/// | the request cannot be represented (`InvalidRequest`), or its key is longer than the backend takes (`KeyTooLong`) | admitted | denied as unavailable | admitted (as `Open`) | no |
///
/// [`FailurePolicy::on_error`] is this table as a function, [`OnError`] its outcomes. What
/// an outcome becomes for a client — what an admitted request carries, how a refusal is
/// answered — is the front end's to say.
///
/// Under `Local`, a failure of the fallback itself (its own key cap) is handled as `Open`.
/// The local fallback (`wrap::Fallback`) limits each process on its
/// own: a fleet of N processes admits up to N times the limit while the backend is away.
/// Every incident is logged once when it starts and once when it ends (an answer from a
/// deny cache or a fallback, or a reply in flight from before the incident, ends none); one
/// key's unreadable state starts no incident and is logged at most once per key per minute
/// (`wrap::IncidentLog`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Admit the request without a decision: a limiter failure does not take the service
    /// down.
    Open,
    /// Deny the request as unavailable: nothing is admitted that the backend did not decide.
    Closed,
    /// Decide in memory on this process with the same policies until the backend answers
    /// again (the default); whatever the fallback cannot decide is admitted, as `Open`.
    #[default]
    Local,
}

/// What [`FailurePolicy::on_error`] gives a request whose check failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnError {
    /// Admit it, without a decision (so with no policy's state to report).
    Admit,
    /// Deny it as unavailable: the limiter cannot serve it (not a rate-limit denial, so no
    /// wait to report).
    Refuse,
    /// Decide it with the local fallback.
    DecideLocally,
}

impl FailurePolicy {
    /// Every value, in declaration order.
    pub const ALL: [FailurePolicy; 3] = [
        FailurePolicy::Open,
        FailurePolicy::Closed,
        FailurePolicy::Local,
    ];

    /// The table above: what a request whose check failed with `error` gets.
    pub fn on_error(self, error: &BackendError) -> OnError {
        match self {
            FailurePolicy::Open => OnError::Admit,
            FailurePolicy::Closed => OnError::Refuse,
            FailurePolicy::Local => {
                if error.is_unavailable() || matches!(error, BackendError::InvalidState(_)) {
                    OnError::DecideLocally
                } else {
                    OnError::Admit
                }
            }
        }
    }

    /// What a request gets when its error reached the caller: under `Local` that is the
    /// fallback's own failure (or an error the fallback does not stand in for), handled as
    /// `Open`.
    pub fn on_unhandled_error(self) -> OnError {
        match self {
            FailurePolicy::Closed => OnError::Refuse,
            _ => OnError::Admit,
        }
    }

    /// The name used in configuration files and flags: `open`, `closed` or `local`.
    pub fn as_str(self) -> &'static str {
        match self {
            FailurePolicy::Open => "open",
            FailurePolicy::Closed => "closed",
            FailurePolicy::Local => "local",
        }
    }

    /// What the policy does with a request the backend cannot decide, in words.
    pub fn describe(self) -> &'static str {
        match self {
            FailurePolicy::Open => "admit the request",
            FailurePolicy::Closed => "deny the request as unavailable",
            FailurePolicy::Local => {
                "decide in memory on each process; what that cannot decide is admitted"
            }
        }
    }
}

impl std::fmt::Display for FailurePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for FailurePolicy {
    type Err = UnknownFailurePolicy;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        FailurePolicy::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| UnknownFailurePolicy(s.to_owned()))
    }
}

/// A failure policy name other than `open`, `closed` or `local`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownFailurePolicy(pub String);

impl std::fmt::Display for UnknownFailurePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "unknown failure policy {:?}: expected open, closed or local",
            self.0
        )
    }
}

impl std::error::Error for UnknownFailurePolicy {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_table() {
        let errors = [
            BackendError::Connection("down".into()),
            BackendError::Timeout {
                after: Duration::from_millis(100),
            },
            BackendError::Script("BUSY".into()),
            BackendError::InvalidState("garbage".into()),
            BackendError::CapacityExceeded { max_keys: 1 },
            BackendError::InvalidRequest("t".into()),
            BackendError::KeyTooLong { len: 600, max: 512 },
        ];
        let local: Vec<OnError> = errors
            .iter()
            .map(|e| FailurePolicy::Local.on_error(e))
            .collect();
        use OnError::*;
        assert_eq!(
            local,
            [
                DecideLocally,
                DecideLocally,
                DecideLocally,
                DecideLocally,
                Admit,
                Admit,
                Admit
            ]
        );
        for e in &errors {
            assert_eq!(FailurePolicy::Open.on_error(e), Admit);
            assert_eq!(FailurePolicy::Closed.on_error(e), Refuse);
        }
        assert_eq!(FailurePolicy::Local.on_unhandled_error(), Admit);
        assert_eq!(FailurePolicy::Closed.on_unhandled_error(), Refuse);
        for p in FailurePolicy::ALL {
            assert_eq!(p.as_str().parse::<FailurePolicy>(), Ok(p));
        }
        assert!("off".parse::<FailurePolicy>().is_err());
    }
}
