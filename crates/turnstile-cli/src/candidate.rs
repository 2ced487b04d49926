//! A candidate of `turnstile simulate`: one set of policies the trace is replayed against.

use turnstile_core::Policy;

/// One set of policies the trace is replayed against, on its own fresh backend.
#[derive(Clone, Debug)]
pub(crate) struct Candidate {
    /// The name `--compare` gives it (the policy's name), printed as the `policy` field of
    /// every output line and heading its summary column; `None` without `--compare`.
    pub(crate) name: Option<String>,
    /// Its policies, checked all-or-nothing on every request.
    pub(crate) policies: Vec<Policy>,
}

impl Candidate {
    /// How the candidate is titled in a plot: its name, or its policies' names joined.
    pub(crate) fn title(&self) -> String {
        match &self.name {
            Some(name) => name.clone(),
            None => self
                .policies
                .iter()
                .map(Policy::name)
                .collect::<Vec<_>>()
                .join(" + "),
        }
    }
}
