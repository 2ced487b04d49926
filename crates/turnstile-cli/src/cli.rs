//! Command-line arguments, and turning them into validated policies.
//!
//! The argument types' doc comments are clap's help text, written for a terminal
//! (`<integer><unit>`, `[,name=NAME]`), not Markdown: rustdoc is told not to read them as HTML
//! tags or links.
#![allow(rustdoc::invalid_html_tags, rustdoc::broken_intra_doc_links)]

use std::path::PathBuf;
use std::time::Duration;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::error::ErrorKind;
use clap::{ArgGroup, Args, CommandFactory, Parser, Subcommand, ValueEnum};
use turnstile_core::policy::{parse_duration, MAX_PERIOD_MS};
use turnstile_core::{Algorithm, Policy};

use crate::access_log::DEFAULT_REORDER_WINDOW_MS;
use crate::backend::BackendKind;
use crate::candidate::Candidate;

/// Exact rate limiting: replay traffic against rate-limit policies.
#[derive(Debug, Parser)]
#[command(name = "turnstile", version, propagate_version = true)]
pub(crate) struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Replay a trace of requests (JSON Lines or an access log) and print one decision per
    /// request.
    ///
    /// With --format jsonl (the default) each input line is {"t_ms": INT, "key": STRING,
    /// "cost": INT} (key defaults to "", cost to 1; t_ms non-decreasing). With --format nginx
    /// the input is an nginx/Apache access log in the combined (or common) format: the key is
    /// the client address, t_ms the timestamp in Unix ms, the cost 1; lines out of order by up
    /// to --reorder-window are re-sorted. Each output line is
    /// {"t_ms":..,"key":..,"cost":..,"allowed":..,"remaining":..,"retry_after_ms":..,
    /// "reset_after_ms":..,"delay_ms":..}, durations rounded up to whole milliseconds and
    /// retry_after_ms null when no wait can help; with --compare, a "policy" field ends each
    /// line. A malformed line stops the run with exit code 1, naming the line; the decisions
    /// before it stay written.
    #[command(group(
        ArgGroup::new("policy-form").required(true).args(["algorithm", "policies", "compare"])
    ))]
    Simulate(SimulateArgs),

    /// Live quotas on Redis: peek at, reset or refund a client key's quota, and set, show or
    /// remove its override (its own policies) or its tier. Answers one JSON object.
    ///
    /// KEY is the client key exactly as the service's key extractor produces it: the
    /// canonical IP (`192.0.2.1`; IPv6 grouped by network, `2001:db8:1:2::/64`), a header's
    /// value with bytes outside printable ASCII and `%` percent-encoded, etc.; --prefix and
    /// --plain-keys must match the service's Redis backend.
    Quota(crate::quota::QuotaArgs),

    /// Validate a turnstile configuration file (TOML) and print the effective rules: each
    /// rule's conditions, cost and policies under the names the layer gives them, the key and
    /// what it stores, the tiers and the backend. An invalid file is reported as
    /// FILE:LINE:COLUMN: FIELD: MESSAGE with exit code 1.
    CheckConfig(crate::check_config::CheckConfigArgs),
}

/// The arguments of `turnstile simulate`.
#[derive(Debug, Args)]
pub(crate) struct SimulateArgs {
    /// The algorithm of a single policy (with --limit, --period and, for buckets, --burst).
    #[arg(
        long,
        value_name = "ALGORITHM",
        value_parser = algorithm_parser(),
        requires_all = ["limit", "period"],
        conflicts_with_all = ["policies", "compare"],
    )]
    pub(crate) algorithm: Option<Algorithm>,

    /// Units admitted per period (1 to 4294967295).
    #[arg(long, value_name = "L", value_parser = parse_count, requires = "algorithm", conflicts_with = "policies")]
    pub(crate) limit: Option<u64>,

    /// The period: <integer><unit> with unit ms, s, m, h or d (e.g. 250ms, 1s, 1h).
    #[arg(long, value_name = "DURATION", value_parser = parse_period, requires = "algorithm", conflicts_with = "policies")]
    pub(crate) period: Option<Duration>,

    /// Bucket capacity (token-bucket, gcra and leaky-bucket only; defaults to the limit).
    #[arg(long, value_name = "B", value_parser = parse_count, requires = "algorithm", conflicts_with = "policies")]
    pub(crate) burst: Option<u64>,

    /// A policy string ALGORITHM:limit=L,period=DUR[,burst=B][,name=NAME]. Repeat it to
    /// check every request against several policies at once (all-or-nothing).
    #[arg(long = "policy", value_name = "SPEC", conflicts_with = "compare")]
    pub(crate) policies: Vec<Policy>,

    /// Candidate policies (policy strings) to compare side by side: the trace is replayed
    /// against each on its own fresh backend, each candidate deciding alone. The output has one
    /// line per request per candidate (for each request, the candidates in the order given),
    /// each ending in "policy":NAME; --summary has a column per candidate, --plot a panel.
    #[arg(long, value_name = "SPEC", num_args = 1..)]
    pub(crate) compare: Vec<Policy>,

    /// The input's format: `jsonl` (the strict trace format) or `nginx` (an nginx/Apache
    /// combined access log).
    #[arg(long, value_enum, default_value_t = InputFormat::Jsonl)]
    pub(crate) format: InputFormat,

    /// With --format nginx: how far out of time order a line may be and still be re-sorted
    /// (a duration; default 5s). A line earlier than the latest time read so far by more than
    /// this is an error.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_arg)]
    pub(crate) reorder_window: Option<Duration>,

    /// Also draw admitted and denied requests per time bucket into the SVG file FILE
    /// (written at the end of a successful run).
    #[arg(long, value_name = "FILE")]
    pub(crate) plot: Option<PathBuf>,

    /// With --plot: the width of a time bucket (a duration such as 1s or 5m); chosen from the
    /// trace's span when absent.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_arg, requires = "plot")]
    pub(crate) bucket: Option<Duration>,

    /// Where rate-limit state is kept.
    #[arg(long, value_enum, default_value_t = BackendKind::Memory)]
    pub(crate) backend: BackendKind,

    /// The Redis to run on with `--backend redis` (`redis://[user:password@]host:port[/db]`;
    /// several comma-separated URLs for a Cluster). Each run uses a fresh random key prefix
    /// and deletes its keys at the end.
    #[arg(long, value_name = "URL", default_value = "redis://127.0.0.1:6379")]
    pub(crate) redis_url: String,

    /// TLS for a rediss:// --redis-url.
    #[command(flatten)]
    pub(crate) tls: crate::backend::TlsArgs,

    /// Read the trace from FILE instead of standard input ("-" is standard input).
    #[arg(long, value_name = "FILE")]
    pub(crate) input: Option<PathBuf>,

    /// Print a table per key (requests, admitted, denied, share denied, longest retry,
    /// never) and a total, instead of one decision per line.
    #[arg(long)]
    pub(crate) summary: bool,
}

/// The input formats of `turnstile simulate` (`--format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum InputFormat {
    /// JSON Lines of {"t_ms": .., "key": .., "cost": ..}, t_ms non-decreasing.
    Jsonl,
    /// An nginx/Apache access log in the combined (or common) log format.
    Nginx,
}

impl SimulateArgs {
    /// The validated candidates the arguments describe: one unnamed candidate of every
    /// `--policy` (or the `--algorithm` policy), or one named candidate per `--compare` spec.
    /// On an invalid combination or policy, prints clap's usage error and exits with code 2.
    pub(crate) fn candidates_or_exit(&self) -> Vec<Candidate> {
        self.candidates().unwrap_or_else(|(kind, message)| {
            let mut cmd = Cli::command();
            cmd.build();
            match cmd.find_subcommand_mut("simulate") {
                Some(sub) => sub.error(kind, message).exit(),
                None => Cli::command().error(kind, message).exit(),
            }
        })
    }

    /// The reorder window of an access log in ms.
    pub(crate) fn reorder_window_ms(&self) -> u64 {
        self.reorder_window.map_or(DEFAULT_REORDER_WINDOW_MS, |d| {
            u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
        })
    }

    /// The plot's bucket width in ms, when `--bucket` is given.
    pub(crate) fn bucket_ms(&self) -> Option<u64> {
        self.bucket
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    /// The validated candidates, or why the arguments describe none.
    fn candidates(&self) -> Result<Vec<Candidate>, (ErrorKind, String)> {
        if self.reorder_window.is_some() && self.format != InputFormat::Nginx {
            return Err((
                ErrorKind::ArgumentConflict,
                "--reorder-window applies to --format nginx only (a JSON Lines trace must be in \
                 order)"
                    .into(),
            ));
        }
        if self
            .bucket
            .is_some_and(|b| b.is_zero() || b > Duration::from_millis(MAX_PERIOD_MS))
        {
            return Err((
                ErrorKind::ValueValidation,
                "--bucket must be from 1ms to 365d".into(),
            ));
        }
        if !self.compare.is_empty() {
            // Candidates are told apart by name in the output.
            for (i, p) in self.compare.iter().enumerate() {
                if self.compare[..i].iter().any(|q| q.name() == p.name()) {
                    return Err((
                        ErrorKind::ArgumentConflict,
                        format!(
                            "two --compare candidates are named {:?}; give each its own name \
                             (,name=NAME)",
                            p.name()
                        ),
                    ));
                }
            }
            return Ok(self
                .compare
                .iter()
                .map(|p| Candidate {
                    name: Some(p.name().to_owned()),
                    policies: vec![p.clone()],
                })
                .collect());
        }
        let policies = self.policies()?;
        Ok(vec![Candidate {
            name: None,
            policies,
        }])
    }

    /// The validated policies of `--policy` or `--algorithm`, or why the arguments describe
    /// none.
    fn policies(&self) -> Result<Vec<Policy>, (ErrorKind, String)> {
        let Some(algorithm) = self.algorithm else {
            if self.policies.is_empty() {
                // clap's argument group already requires one form; this is belt and braces.
                return Err((
                    ErrorKind::MissingRequiredArgument,
                    "give either --algorithm with --limit and --period, or one or more --policy"
                        .into(),
                ));
            }
            // Two policies of one name would share one state: refuse them, as every backend
            // does.
            for (i, p) in self.policies.iter().enumerate() {
                if self.policies[..i].iter().any(|q| q.name() == p.name()) {
                    return Err((
                        ErrorKind::ArgumentConflict,
                        format!(
                            "two --policy are named {:?}; give each its own name (,name=NAME)",
                            p.name()
                        ),
                    ));
                }
            }
            return Ok(self.policies.clone());
        };
        if !self.policies.is_empty() {
            return Err((
                ErrorKind::ArgumentConflict,
                "--policy cannot be combined with --algorithm/--limit/--period/--burst".into(),
            ));
        }
        let (Some(limit), Some(period)) = (self.limit, self.period) else {
            return Err((
                ErrorKind::MissingRequiredArgument,
                "--algorithm needs --limit and --period".into(),
            ));
        };
        let mut policy = Policy::new(algorithm, limit, period)
            .map_err(|e| (ErrorKind::ValueValidation, format!("invalid policy: {e}")))?;
        if let Some(burst) = self.burst {
            policy = policy
                .with_burst(burst)
                .map_err(|e| (ErrorKind::ValueValidation, format!("invalid policy: {e}")))?;
        }
        Ok(vec![policy])
    }
}

/// Accepts exactly the six algorithm names, listing them in help and errors.
fn algorithm_parser() -> impl TypedValueParser<Value = Algorithm> {
    PossibleValuesParser::new(Algorithm::ALL.map(Algorithm::as_str))
        .try_map(|s| s.parse::<Algorithm>())
}

/// A count (limit or burst): digits only, no sign, no spaces, no fraction.
fn parse_count(s: &str) -> Result<u64, String> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{s:?} is not a whole number"));
    }
    s.parse()
        .map_err(|_| format!("{s} is too large (at most 4294967295)"))
}

/// A duration in the grammar of `SEMANTICS.md` (a reorder window, a bucket width).
fn parse_duration_arg(s: &str) -> Result<Duration, String> {
    parse_duration(s).map_err(|e| e.to_string())
}

/// A period in the duration grammar of `SEMANTICS.md`; its range is checked with the policy.
fn parse_period(s: &str) -> Result<Duration, String> {
    parse_duration(s).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn counts_are_plain_digits() {
        assert_eq!(parse_count("10"), Ok(10));
        for bad in ["", "+1", "-1", "1.0", " 1", "1e3", "0x10"] {
            assert!(parse_count(bad).is_err(), "{bad:?}");
        }
    }
}
