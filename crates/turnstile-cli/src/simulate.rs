//! `turnstile simulate`: replay a trace through a backend and report every decision.

use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use turnstile_core::{Decision, Policy};

use crate::backend;
use crate::cli::SimulateArgs;
use crate::summary::Summary;
use crate::trace::{Buffered, Request, TraceError, TraceReader};

/// Exit code for bad input data (a malformed trace, an unreadable file, a backend failure).
const EXIT_DATA: u8 = 1;

/// Runs the simulation the arguments describe against `policies`; prints decisions (or the
/// summary) on stdout and any problem on stderr.
pub(crate) fn run(args: &SimulateArgs, policies: &[Policy]) -> ExitCode {
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let result = match args.input.as_deref().filter(|p| *p != Path::new("-")) {
        Some(path) => match File::open(path) {
            Ok(file) => simulate(args, policies, BufReader::new(file), &mut out),
            Err(e) => Err(Failure::Open(path.display().to_string(), e)),
        },
        None => simulate(args, policies, BufReader::new(io::stdin().lock()), &mut out),
    };
    // Whatever happened, the decisions written so far stay written.
    let flushed = out.flush();
    match result.and(flushed.map_err(Failure::Write)) {
        Ok(()) => ExitCode::SUCCESS,
        // A closed pipe (`turnstile simulate | head`): the reader chose to stop, so say
        // nothing, but not everything was written, so do not claim success either.
        Err(Failure::Write(e)) if e.kind() == io::ErrorKind::BrokenPipe => {
            ExitCode::from(EXIT_DATA)
        }
        Err(failure) => {
            eprintln!("turnstile simulate: {failure}");
            ExitCode::from(EXIT_DATA)
        }
    }
}

/// Why a simulation stopped early.
#[derive(Debug)]
enum Failure {
    /// The input file could not be opened.
    Open(String, io::Error),
    /// The trace could not be read or a line is malformed.
    Trace(TraceError),
    /// The backend could not decide a request.
    Backend {
        /// The trace line of the request.
        line: u64,
        /// The backend's error.
        error: String,
    },
    /// Writing the output failed.
    Write(io::Error),
    /// The backend could not be set up.
    Setup(String),
    /// The backend could not clean up after the run.
    Cleanup(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Open(path, e) => write!(f, "cannot open {path}: {e}"),
            Failure::Trace(e) => e.fmt(f),
            Failure::Backend { line, error } => {
                write!(f, "backend failed on trace line {line}: {error}")
            }
            Failure::Write(e) => write!(f, "cannot write the output: {e}"),
            Failure::Setup(e) => write!(f, "cannot set up the backend: {e}"),
            Failure::Cleanup(e) => write!(f, "cannot delete the run's keys: {e}"),
        }
    }
}

/// Replays every request of `input`, writing a decision per request (or, with `--summary`,
/// the table at the end) to `out`.
fn simulate<R: BufRead + Buffered>(
    args: &SimulateArgs,
    policies: &[Policy],
    input: R,
    out: &mut impl Write,
) -> Result<(), Failure> {
    let backend = backend::open(args.backend, &args.redis_url).map_err(Failure::Setup)?;
    let result = replay(args, policies, &*backend, input, out);
    // Clean up (Redis: delete the run's keys) whether or not the replay finished.
    let cleaned = backend
        .finish()
        .map_err(|e| Failure::Cleanup(e.to_string()));
    result.and(cleaned)
}

/// The replay loop of [`simulate`].
fn replay<R: BufRead + Buffered>(
    args: &SimulateArgs,
    policies: &[Policy],
    backend: &dyn backend::SimBackend,
    input: R,
    out: &mut impl Write,
) -> Result<(), Failure> {
    let mut trace = TraceReader::new(input);
    let mut summary = args.summary.then(Summary::default);
    let mut line = 0;
    loop {
        // Flush before waiting on a slow producer, so decisions appear as requests do.
        if summary.is_none() && trace.would_block() {
            out.flush().map_err(Failure::Write)?;
        }
        let Some(request) = trace.next_request().map_err(Failure::Trace)? else {
            break;
        };
        line += 1;
        let decision = backend
            .decide(&request.key, policies, request.cost, request.t_ms)
            .map_err(|e| Failure::Backend {
                line,
                error: e.to_string(),
            })?;
        match &mut summary {
            Some(summary) => summary.record(&request, &decision),
            None => write_decision(out, &request, &decision).map_err(Failure::Write)?,
        }
    }
    if let Some(summary) = summary {
        summary.write(out).map_err(Failure::Write)?;
    }
    Ok(())
}

/// Writes one decision line in the exact format of `SEMANTICS.md`.
fn write_decision(out: &mut impl Write, request: &Request, decision: &Decision) -> io::Result<()> {
    writeln!(
        out,
        r#"{{"t_ms":{},"key":{},"cost":{},"allowed":{},"remaining":{},"retry_after_ms":{},"reset_after_ms":{},"delay_ms":{}}}"#,
        request.t_ms,
        json_string(&request.key),
        request.cost,
        decision.allowed(),
        decision.remaining(),
        decision
            .retry_after()
            .map_or_else(|| "null".to_owned(), |d| ceil_ms(d).to_string()),
        ceil_ms(decision.reset_after()),
        ceil_ms(decision.delay()),
    )
}

/// A duration rounded up to whole milliseconds. The core's durations are exact values
/// rounded up to whole nanoseconds, so this is the exact value rounded up.
pub(crate) fn ceil_ms(d: Duration) -> u128 {
    d.as_nanos().div_ceil(1_000_000)
}

/// `s` as a JSON string literal.
fn json_string(s: &str) -> String {
    // Serializing a str cannot fail.
    serde_json::to_string(s).unwrap_or_else(|_| String::from("\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceil_ms_rounds_up() {
        assert_eq!(ceil_ms(Duration::ZERO), 0);
        assert_eq!(ceil_ms(Duration::from_nanos(1)), 1);
        assert_eq!(ceil_ms(Duration::from_nanos(333_333_334)), 334);
        assert_eq!(ceil_ms(Duration::from_millis(250)), 250);
    }

    #[test]
    fn keys_are_escaped() {
        assert_eq!(json_string("a\"b\\c\n"), r#""a\"b\\c\n""#);
    }
}
