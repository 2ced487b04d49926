//! Strict parsing of simulation traces: JSON Lines of `{"t_ms": .., "key": .., "cost": ..}`.
//!
//! Each line must be one JSON object with only the fields `t_ms` (an integer literal,
//! required), `key` (a string, default `""`) and `cost` (an integer literal, default 1), each at
//! most once; integers are 0 to 2^53 − 1 and `t_ms` never decreases from one line to the
//! next. Lines end in LF or CRLF; the last may have no line ending. Nothing is guessed:
//! anything else is a [`TraceError::Malformed`] naming the line.

use std::fmt;
use std::io::{self, BufRead};

use serde::de::{self, Deserialize, DeserializeSeed, Deserializer, MapAccess, Visitor};
use turnstile_core::policy::MAX_REQUEST_VALUE;

/// One request of a trace, with the defaults filled in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Request {
    /// The request's time in ms since the trace's epoch.
    pub(crate) t_ms: u64,
    /// The client key.
    pub(crate) key: String,
    /// The request's cost in units.
    pub(crate) cost: u64,
}

/// Why a trace could not be read further.
#[derive(Debug)]
pub(crate) enum TraceError {
    /// Reading the input failed.
    Io(io::Error),
    /// A line is not a valid request.
    Malformed {
        /// The line's number, from 1.
        line: u64,
        /// What is wrong with it.
        problem: String,
    },
    /// An access-log line is malformed, or out of order by more than the reorder window.
    AccessLog {
        /// The line's number, from 1.
        line: u64,
        /// What is wrong with it.
        problem: String,
    },
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TraceError::Io(e) => write!(f, "cannot read the trace: {e}"),
            TraceError::Malformed { line, problem } => {
                write!(f, "malformed trace line {line}: {problem}")
            }
            TraceError::AccessLog { line, problem } => {
                write!(f, "access-log line {line}: {problem}")
            }
        }
    }
}

/// Reads requests from a JSON Lines trace, one line at a time.
#[derive(Debug)]
pub(crate) struct TraceReader<R> {
    input: R,
    line: u64,
    last_t_ms: Option<u64>,
    buf: Vec<u8>,
}

impl<R: BufRead> TraceReader<R> {
    /// A reader of the trace `input`.
    pub(crate) fn new(input: R) -> Self {
        TraceReader {
            input,
            line: 0,
            last_t_ms: None,
            buf: Vec::new(),
        }
    }

    /// Whether reading the next line would wait for more input (nothing is buffered), so
    /// that output written so far should be flushed first.
    pub(crate) fn would_block(&self) -> bool
    where
        R: Buffered,
    {
        self.input.is_drained()
    }

    /// The next request, `Ok(None)` at the end of the input.
    ///
    /// # Errors
    /// [`TraceError::Io`] when the input cannot be read; [`TraceError::Malformed`] for a line
    /// that is not a valid request, or whose `t_ms` is earlier than the line before.
    pub(crate) fn next_request(&mut self) -> Result<Option<Request>, TraceError> {
        self.buf.clear();
        if self
            .input
            .read_until(b'\n', &mut self.buf)
            .map_err(TraceError::Io)?
            == 0
        {
            return Ok(None);
        }
        self.line += 1;
        let malformed = |problem: String| TraceError::Malformed {
            line: self.line,
            problem,
        };
        let mut bytes = self.buf.as_slice();
        if let Some(rest) = bytes.strip_suffix(b"\n") {
            bytes = rest.strip_suffix(b"\r").unwrap_or(rest);
        }
        let text =
            std::str::from_utf8(bytes).map_err(|e| malformed(format!("not valid UTF-8 ({e})")))?;
        let request = parse_line(text).map_err(malformed)?;
        if let Some(last) = self.last_t_ms.filter(|last| request.t_ms < *last) {
            return Err(malformed(format!(
                "t_ms {} is earlier than the previous line's {last} (t_ms must never decrease)",
                request.t_ms
            )));
        }
        self.last_t_ms = Some(request.t_ms);
        Ok(Some(request))
    }
}

/// Input whose internal buffer can be inspected.
pub(crate) trait Buffered {
    /// Whether no read-ahead input is left in memory.
    fn is_drained(&self) -> bool;
}

impl<R> Buffered for io::BufReader<R> {
    fn is_drained(&self) -> bool {
        self.buffer().is_empty()
    }
}

impl Buffered for &[u8] {
    fn is_drained(&self) -> bool {
        self.is_empty()
    }
}

/// Parses one line (without its line ending) into a request.
///
/// # Errors
/// A description of what is wrong with the line.
pub(crate) fn parse_line(text: &str) -> Result<Request, String> {
    if text.trim_matches([' ', '\t', '\r', '\n']).is_empty() {
        return Err("empty line (every line must be one JSON object)".into());
    }
    serde_json::from_str::<Request>(text).map_err(|e| {
        // serde_json says "... at line 1 column N"; the trace's line number is given by the
        // caller, so keep only the column.
        let message = e.to_string();
        let message = message
            .rsplit_once(" at line ")
            .map_or(message.as_str(), |(m, _)| m);
        format!("{message} (column {})", e.column())
    })
}

const FIELDS: &[&str] = &["t_ms", "key", "cost"];

impl<'de> Deserialize<'de> for Request {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(RequestVisitor)
    }
}

/// Accepts only a JSON object of the three fields, each at most once.
struct RequestVisitor;

impl<'de> Visitor<'de> for RequestVisitor {
    type Value = Request;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(r#"a JSON object like {"t_ms": 1500, "key": "alice", "cost": 1}"#)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Request, A::Error> {
        let (mut t_ms, mut key, mut cost) = (None, None, None);
        while let Some(field) = map.next_key::<String>()? {
            match field.as_str() {
                "t_ms" => set(&mut t_ms, "t_ms", map.next_value_seed(Integer("t_ms"))?)?,
                "key" => set(&mut key, "key", map.next_value_seed(KeyString)?)?,
                "cost" => set(&mut cost, "cost", map.next_value_seed(Integer("cost"))?)?,
                other => return Err(de::Error::unknown_field(other, FIELDS)),
            }
        }
        Ok(Request {
            t_ms: t_ms.ok_or_else(|| de::Error::missing_field("t_ms"))?,
            key: key.unwrap_or_default(),
            cost: cost.unwrap_or(1),
        })
    }
}

/// Stores a field's value, refusing a second one.
fn set<T, E: de::Error>(slot: &mut Option<T>, name: &'static str, value: T) -> Result<(), E> {
    if slot.replace(value).is_some() {
        return Err(E::duplicate_field(name));
    }
    Ok(())
}

/// An integer literal from 0 to 2^53 − 1 for the named field. serde_json hands a literal
/// with a fraction or an exponent (`1500.0`, `1e3`) or one beyond u64 to `visit_f64`, a
/// negative one to `visit_i64` (or to `visit_f64` for `-0`), and only a plain non-negative
/// integer literal to `visit_u64`.
struct Integer(&'static str);

impl<'de> DeserializeSeed<'de> for Integer {
    type Value = u64;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<u64, D::Error> {
        deserializer.deserialize_u64(self)
    }
}

impl Visitor<'_> for Integer {
    type Value = u64;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}` as an integer literal from 0 to {MAX_REQUEST_VALUE}",
            self.0
        )
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
        if v > MAX_REQUEST_VALUE {
            return Err(E::custom(format_args!(
                "`{}` is {v}, above the largest allowed value 2^53 - 1 = {MAX_REQUEST_VALUE}",
                self.0
            )));
        }
        Ok(v)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
        if let Ok(v) = u64::try_from(v) {
            // serde_json never does this, but another format might.
            return self.visit_u64(v);
        }
        Err(E::custom(format_args!("`{}` is negative ({v})", self.0)))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<u64, E> {
        Err(E::custom(format_args!(
            "`{}` must be an integer literal from 0 to {MAX_REQUEST_VALUE}, not a number with a \
             fraction, an exponent or a sign, nor one that large (read as {v})",
            self.0
        )))
    }
}

/// The `key` field: a JSON string.
struct KeyString;

impl<'de> DeserializeSeed<'de> for KeyString {
    type Value = String;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<String, D::Error> {
        deserializer.deserialize_string(self)
    }
}

impl Visitor<'_> for KeyString {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("`key` as a string")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        Ok(v.to_owned())
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<String, E> {
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(t_ms: u64, key: &str, cost: u64) -> Request {
        Request {
            t_ms,
            key: key.into(),
            cost,
        }
    }

    #[test]
    fn accepts_objects_with_defaults() {
        assert_eq!(
            parse_line(r#"{"t_ms": 1500, "key": "alice", "cost": 1}"#),
            Ok(req(1500, "alice", 1))
        );
        assert_eq!(parse_line(r#"{"t_ms":0}"#), Ok(req(0, "", 1)));
        assert_eq!(
            parse_line(r#"{"cost":0,"t_ms":9007199254740991}"#),
            Ok(req(MAX_REQUEST_VALUE, "", 0))
        );
        assert_eq!(
            parse_line(r#" {"key":"\u00e9\n","t_ms":2} "#),
            Ok(req(2, "é\n", 1))
        );
    }

    #[test]
    fn rejects_everything_else() {
        for (line, needle) in [
            ("", "empty line"),
            ("   ", "empty line"),
            (r#"{"t_ms": 1500.0}"#, "integer literal"),
            (r#"{"t_ms": 1e3}"#, "integer literal"),
            (r#"{"t_ms": 1E3}"#, "integer literal"),
            (r#"{"t_ms": -0}"#, "integer literal"),
            (r#"{"t_ms": -5}"#, "negative"),
            (r#"{"t_ms": true}"#, "boolean"),
            (r#"{"t_ms": "15"}"#, "string"),
            (r#"{"t_ms": null}"#, "null"),
            (r#"{"t_ms": 9007199254740992}"#, "above"),
            (r#"{"t_ms": 18446744073709551616}"#, "integer literal"),
            (r#"{"t_ms": 1, "cost": 9007199254740992}"#, "above"),
            (r#"{"t_ms": 1, "cost": 2.5}"#, "cost"),
            (r#"{"t_ms": 1, "cost": null}"#, "null"),
            (r#"{"key": "a"}"#, "missing field `t_ms`"),
            (r#"{"t_ms": 1, "t_ms": 2}"#, "duplicate field `t_ms`"),
            (
                r#"{"t_ms": 1, "key": "a", "key": "a"}"#,
                "duplicate field `key`",
            ),
            (r#"{"t_ms": 1, "extra": 0}"#, "unknown field `extra`"),
            (r#"{"t_ms": 1, "key": 5}"#, "`key` as a string"),
            (r#"{"t_ms": 1, "key": null}"#, "`key` as a string"),
            (r#"[1500, "a", 1]"#, "JSON object"),
            ("1500", "JSON object"),
            ("null", "JSON object"),
            (r#"{"t_ms": 1} {"t_ms": 2}"#, "trailing"),
            (r#"{"t_ms": 1"#, "EOF"),
            (r#"{"t_ms": 01}"#, "column"),
        ] {
            let err = parse_line(line).expect_err(line);
            assert!(err.contains(needle), "{line:?}: {err:?} lacks {needle:?}");
        }
    }

    #[test]
    fn line_endings_numbers_and_order() {
        let input: &[u8] = b"{\"t_ms\":1}\r\n{\"t_ms\":1,\"key\":\"b\"}\n{\"t_ms\":3}";
        let mut r = TraceReader::new(input);
        assert_eq!(r.next_request().unwrap(), Some(req(1, "", 1)));
        assert_eq!(r.next_request().unwrap(), Some(req(1, "b", 1)));
        assert_eq!(r.next_request().unwrap(), Some(req(3, "", 1)));
        assert_eq!(r.next_request().unwrap(), None);

        let input: &[u8] = b"{\"t_ms\":5}\n{\"t_ms\":4}\n";
        let mut r = TraceReader::new(input);
        assert!(r.next_request().unwrap().is_some());
        match r.next_request() {
            Err(TraceError::Malformed { line: 2, problem }) => {
                assert!(problem.contains("earlier"), "{problem}")
            }
            other => panic!("{other:?}"),
        }

        let input: &[u8] = b"{\"t_ms\":5}\n\n{\"t_ms\":6}\n";
        let mut r = TraceReader::new(input);
        assert!(r.next_request().unwrap().is_some());
        assert!(matches!(
            r.next_request(),
            Err(TraceError::Malformed { line: 2, .. })
        ));

        let input: &[u8] = b"{\"t_ms\":5,\"key\":\"\xff\"}\n";
        assert!(matches!(
            TraceReader::new(input).next_request(),
            Err(TraceError::Malformed { line: 1, .. })
        ));
    }
}
