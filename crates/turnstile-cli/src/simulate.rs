//! `turnstile simulate`: replay a trace through a backend per candidate and report every
//! decision.

use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::path::Path;
use std::process::ExitCode;

use turnstile_core::round::ceil_ms;
use turnstile_core::Decision;

use crate::access_log::AccessLogReader;
use crate::backend;
use crate::candidate::Candidate;
use crate::cli::{InputFormat, SimulateArgs};
use crate::plot::{PlotData, TimeAxis};
use crate::summary::Summary;
use crate::trace::{Buffered, Request, TraceError, TraceReader};

/// Exit code for bad input data (a malformed trace, an unreadable file, a backend failure).
const EXIT_DATA: u8 = 1;

/// Runs the simulation the arguments describe against every candidate; prints decisions (or
/// the summary) on stdout, writes the plot, and prints any problem on stderr.
pub(crate) fn run(args: &SimulateArgs, candidates: &[Candidate]) -> ExitCode {
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let result = match args.input.as_deref().filter(|p| *p != Path::new("-")) {
        Some(path) => match File::open(path) {
            Ok(file) => simulate(args, candidates, BufReader::new(file), &mut out),
            Err(e) => Err(Failure::Open(path.display().to_string(), e)),
        },
        None => simulate(
            args,
            candidates,
            BufReader::new(io::stdin().lock()),
            &mut out,
        ),
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
        /// The candidate whose backend failed, with `--compare`.
        candidate: Option<String>,
        /// The backend's error.
        error: String,
    },
    /// Writing the output failed.
    Write(io::Error),
    /// The backend could not be set up.
    Setup(String),
    /// The backend could not clean up after the run.
    Cleanup(String),
    /// The plot could not be drawn or written.
    Plot(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Open(path, e) => write!(f, "cannot open {path}: {e}"),
            Failure::Trace(e) => e.fmt(f),
            Failure::Backend {
                line,
                candidate,
                error,
            } => {
                write!(f, "backend failed on trace line {line}")?;
                if let Some(name) = candidate {
                    write!(f, " (candidate {name})")?;
                }
                write!(f, ": {error}")
            }
            Failure::Write(e) => write!(f, "cannot write the output: {e}"),
            Failure::Setup(e) => write!(f, "cannot set up the backend: {e}"),
            Failure::Cleanup(e) => write!(f, "cannot delete the run's keys: {e}"),
            Failure::Plot(e) => write!(f, "cannot write the plot: {e}"),
        }
    }
}

/// Where requests come from: a JSON Lines trace or an access log.
enum Source<R> {
    /// The strict trace format.
    Jsonl(TraceReader<R>, u64),
    /// An nginx/Apache access log.
    AccessLog(AccessLogReader<R>),
}

impl<R: BufRead + Buffered> Source<R> {
    /// The source the arguments ask for, reading `input`.
    fn new(args: &SimulateArgs, input: R) -> Self {
        match args.format {
            InputFormat::Jsonl => Source::Jsonl(TraceReader::new(input), 0),
            InputFormat::Nginx => {
                Source::AccessLog(AccessLogReader::new(input, args.reorder_window_ms()))
            }
        }
    }

    /// Whether reading the next request may wait for more input.
    fn would_block(&self) -> bool {
        match self {
            Source::Jsonl(r, _) => r.would_block(),
            Source::AccessLog(r) => r.would_block(),
        }
    }

    /// The next request and its line number.
    fn next_request(&mut self) -> Result<Option<(u64, Request)>, TraceError> {
        match self {
            Source::Jsonl(r, line) => Ok(r.next_request()?.map(|request| {
                *line += 1;
                (*line, request)
            })),
            Source::AccessLog(r) => r.next_request(),
        }
    }

    /// The plot's time axis: the trace's own time for a trace, wall-clock time (at
    /// the first line's offset from UTC) for an access log.
    fn time_axis(&self) -> TimeAxis {
        match self {
            Source::Jsonl(..) => TimeAxis::TraceTime,
            Source::AccessLog(r) => TimeAxis::WallClock {
                offset_minutes: r.first_offset_minutes().unwrap_or(0),
            },
        }
    }
}

/// Replays every request of `input` against every candidate, writing a decision per request
/// and candidate (or, with `--summary`, the table at the end) to `out`, and the plot.
fn simulate<R: BufRead + Buffered>(
    args: &SimulateArgs,
    candidates: &[Candidate],
    input: R,
    out: &mut impl Write,
) -> Result<(), Failure> {
    // Each candidate decides on a backend of its own (for Redis: its own key prefix).
    let mut backends = Vec::with_capacity(candidates.len());
    let mut result = Ok(());
    for _ in candidates {
        match backend::open(args.backend, &args.redis_url, &args.tls) {
            Ok(b) => backends.push(b),
            Err(e) => {
                result = Err(Failure::Setup(e));
                break;
            }
        }
    }
    if result.is_ok() {
        result = replay(args, candidates, &backends, input, out);
    }
    // Clean up (Redis: delete the run's keys) whether or not the replay finished.
    let mut cleaned = Ok(());
    for backend in &backends {
        if let Err(e) = backend.finish() {
            cleaned = cleaned.and(Err(Failure::Cleanup(e.to_string())));
        }
    }
    result.and(cleaned)
}

/// The replay loop of [`simulate`].
fn replay<R: BufRead + Buffered>(
    args: &SimulateArgs,
    candidates: &[Candidate],
    backends: &[Box<dyn backend::SimBackend>],
    input: R,
    out: &mut impl Write,
) -> Result<(), Failure> {
    let mut source = Source::new(args, input);
    let mut summary = args
        .summary
        .then(|| Summary::new(candidates.iter().map(|c| c.name.clone()).collect()));
    let mut plot = args.plot.as_ref().map(|_| {
        PlotData::new(
            candidates.len(),
            args.bucket_ms(),
            min_bucket_ms(args.format),
        )
    });
    loop {
        // Flush before waiting on a slow producer, so decisions appear as requests do.
        if summary.is_none() && source.would_block() {
            out.flush().map_err(Failure::Write)?;
        }
        let Some((line, request)) = source.next_request().map_err(Failure::Trace)? else {
            break;
        };
        if let Some(plot) = &mut plot {
            plot.start(request.t_ms, source.time_axis());
        }
        for (i, (candidate, backend)) in candidates.iter().zip(backends).enumerate() {
            let decision = decide(&**backend, candidate, line, &request)?;
            if let Some(plot) = &mut plot {
                plot.record(i, request.t_ms, decision.allowed());
            }
            match &mut summary {
                Some(summary) => summary.record(i, &request, &decision),
                None => write_decision(out, &request, &decision, candidate.name.as_deref())
                    .map_err(Failure::Write)?,
            }
        }
    }
    if let Some(summary) = summary {
        summary.write(out).map_err(Failure::Write)?;
    }
    match (plot, &args.plot) {
        (Some(plot), Some(path)) => write_plot(&plot, candidates, path),
        _ => Ok(()),
    }
}

/// `candidate`'s decision on `backend` for `request`, read from line `line` of the trace.
fn decide(
    backend: &dyn backend::SimBackend,
    candidate: &Candidate,
    line: u64,
    request: &Request,
) -> Result<Decision, Failure> {
    backend
        .decide(
            &request.key,
            &candidate.policies,
            request.cost,
            request.t_ms,
        )
        .map_err(|e| Failure::Backend {
            line,
            candidate: candidate.name.clone(),
            error: e.to_string(),
        })
}

/// Draws `plot`, one panel per candidate, into the SVG file at `path`.
fn write_plot(plot: &PlotData, candidates: &[Candidate], path: &Path) -> Result<(), Failure> {
    let titles: Vec<String> = candidates.iter().map(Candidate::title).collect();
    let svg = plot.render(&titles).map_err(Failure::Plot)?;
    std::fs::write(path, svg).map_err(|e| Failure::Plot(format!("{}: {e}", path.display())))
}

/// The narrowest bucket a plot chooses by itself: an access log's times are whole seconds.
fn min_bucket_ms(format: InputFormat) -> u64 {
    match format {
        InputFormat::Jsonl => 1,
        InputFormat::Nginx => 1_000,
    }
}

/// Writes one decision line in the exact format of `SEMANTICS.md`; with `--compare`, the
/// candidate's name follows as a last field, `"policy"`.
fn write_decision(
    out: &mut impl Write,
    request: &Request,
    decision: &Decision,
    policy: Option<&str>,
) -> io::Result<()> {
    write!(
        out,
        r#"{{"t_ms":{},"key":{},"cost":{},"allowed":{},"remaining":{},"retry_after_ms":{},"reset_after_ms":{},"delay_ms":{}"#,
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
    )?;
    if let Some(policy) = policy {
        write!(out, r#","policy":{}"#, json_string(policy))?;
    }
    out.write_all(b"}\n")
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
    fn keys_are_escaped() {
        assert_eq!(json_string("a\"b\\c\n"), r#""a\"b\\c\n""#);
    }
}
