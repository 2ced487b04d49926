//! Reading nginx/Apache access logs (`turnstile simulate --format nginx`).
//!
//! A line is in the combined log format, the default of nginx (`log_format combined`) and
//! Apache (`LogFormat ... combined`):
//!
//! ```text
//! 203.0.113.7 - frank [10/Oct/2000:13:55:36 -0700] "GET /a.gif HTTP/1.0" 200 2326 "http://example.com/" "Mozilla/4.08"
//! ```
//!
//! that is `ADDRESS IDENT USER [TIME] "REQUEST" STATUS BYTES "REFERER" "USER-AGENT"`, single
//! spaces between fields. The common log format (the same without referer and user agent) is
//! accepted too, and so is anything after the user agent (formats that extend combined, e.g.
//! with `$request_time`), which is ignored. Every request is one [`Request`]: the key is the
//! client address (the first field) as the middleware's IP keys make it (IPv6 grouped by /64,
//! IPv4-mapped addresses as IPv4; a host name as written), the time is the timestamp in ms since the
//! Unix epoch (its offset applied; logs have whole seconds, so times are multiples of 1000) and
//! the cost is 1.
//!
//! Lines may be out of time order by up to a reorder window (Apache logs the time a request
//! started, but writes the line when it ends): they are re-sorted, ties kept in line order.
//! A line earlier than the latest time read so far by more than the window is an error, as is
//! any malformed line. Nothing is guessed.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::BufRead;

use crate::trace::{Buffered, Request, TraceError};

/// The key of a logged client address, as the middleware's IP keys make it: an IP address
/// canonical (IPv4-mapped as IPv4, IPv6 grouped by its /64 network), anything else as written.
fn client_key(address: String) -> String {
    match address.parse() {
        Ok(ip) => turnstile_core::ip::ip_key(ip, turnstile_core::ip::DEFAULT_IPV6_PREFIX),
        Err(_) => address,
    }
}

/// The default reorder window, in ms: 5 s.
pub(crate) const DEFAULT_REORDER_WINDOW_MS: u64 = 5_000;

/// One parsed line: its time and its offset from UTC, and the client address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LogLine {
    /// The time in ms since the Unix epoch.
    pub(crate) t_ms: u64,
    /// The timestamp's offset from UTC, in minutes (−0700 is −420).
    pub(crate) offset_minutes: i32,
    /// The client address, the line's first field.
    pub(crate) address: String,
}

/// A buffered request, ordered by time and then by line.
type Pending = Reverse<(u64, u64, String)>;

/// Reads requests from an access log, re-sorting lines that are out of order by at most the
/// reorder window.
#[derive(Debug)]
pub(crate) struct AccessLogReader<R> {
    input: R,
    window_ms: u64,
    line: u64,
    buf: Vec<u8>,
    /// Lines read but not yet handed out: (time, line number, address), earliest first.
    pending: BinaryHeap<Pending>,
    /// The latest time read so far and its line number.
    latest: Option<(u64, u64)>,
    /// The offset from UTC of the first line, in minutes.
    first_offset: Option<i32>,
    /// An error to report once the lines before it have been handed out.
    failed: Option<TraceError>,
    /// Whether the input is exhausted.
    eof: bool,
}

impl<R: BufRead> AccessLogReader<R> {
    /// A reader of the log `input` that re-sorts lines up to `window_ms` out of order.
    pub(crate) fn new(input: R, window_ms: u64) -> Self {
        AccessLogReader {
            input,
            window_ms,
            line: 0,
            buf: Vec::new(),
            pending: BinaryHeap::new(),
            latest: None,
            first_offset: None,
            failed: None,
            eof: false,
        }
    }

    /// The offset from UTC of the log's first line, in minutes, once a line has been read.
    pub(crate) fn first_offset_minutes(&self) -> Option<i32> {
        self.first_offset
    }

    /// Whether reading the next request may wait for more input.
    pub(crate) fn would_block(&self) -> bool
    where
        R: Buffered,
    {
        self.input.is_drained()
    }

    /// The next request in time order with its line number, `Ok(None)` at the end of the log.
    ///
    /// A request is handed out once no line still to come may precede it: when a line later
    /// than it by the reorder window has been read, or at the end of the input. When a line
    /// is malformed or out of order by more than the window, the valid lines before it are
    /// handed out first, then the error.
    ///
    /// # Errors
    /// [`TraceError::Io`] when the input cannot be read; [`TraceError::AccessLog`] for a
    /// malformed line or one beyond the reorder window.
    pub(crate) fn next_request(&mut self) -> Result<Option<(u64, Request)>, TraceError> {
        loop {
            let done = self.eof || self.failed.is_some();
            let latest = self.latest.map_or(0, |(t, _)| t);
            let ready = self.pending.peek().is_some_and(|Reverse((t, _, _))| {
                done || t.saturating_add(self.window_ms) <= latest
            });
            if ready {
                if let Some(Reverse((t_ms, line, key))) = self.pending.pop() {
                    return Ok(Some((line, Request { t_ms, key, cost: 1 })));
                }
            }
            if let Some(e) = self.failed.take() {
                return Err(e);
            }
            if self.eof {
                return Ok(None);
            }
            self.read_line();
        }
    }

    /// Reads one line into the buffer of pending requests, or records the end of the input
    /// or the line's error.
    fn read_line(&mut self) {
        self.buf.clear();
        match self.input.read_until(b'\n', &mut self.buf) {
            Ok(0) => {
                self.eof = true;
                return;
            }
            Ok(_) => {}
            Err(e) => {
                self.failed = Some(TraceError::Io(e));
                return;
            }
        }
        self.line += 1;
        let line = self.line;
        let mut bytes = self.buf.as_slice();
        if let Some(rest) = bytes.strip_suffix(b"\n") {
            bytes = rest.strip_suffix(b"\r").unwrap_or(rest);
        }
        let parsed = match parse_line(bytes) {
            Ok(parsed) => parsed,
            Err(problem) => {
                self.failed = Some(TraceError::AccessLog { line, problem });
                return;
            }
        };
        if let Some((latest, latest_line)) = self.latest {
            if parsed.t_ms.saturating_add(self.window_ms) < latest {
                self.failed = Some(TraceError::AccessLog {
                    line,
                    problem: format!(
                        "its time is {} ms before line {latest_line}'s, more than the reorder \
                         window of {} ms allows (--reorder-window)",
                        latest - parsed.t_ms,
                        self.window_ms
                    ),
                });
                return;
            }
        }
        if self.latest.is_none_or(|(t, _)| parsed.t_ms > t) {
            self.latest = Some((parsed.t_ms, line));
        }
        self.first_offset.get_or_insert(parsed.offset_minutes);
        self.pending
            .push(Reverse((parsed.t_ms, line, client_key(parsed.address))));
    }
}

/// A cursor over one line's bytes.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    /// The next byte, if any, without consuming it.
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    /// Consumes `byte`, or says which field lacks it.
    fn expect(&mut self, byte: u8, what: &str) -> Result<(), String> {
        match self.peek() {
            Some(b) if b == byte => {
                self.pos += 1;
                Ok(())
            }
            Some(b) => Err(format!(
                "expected {:?} {what} at column {}, found {:?}",
                char::from(byte),
                self.pos + 1,
                char::from(b)
            )),
            None => Err(format!(
                "the line ends at column {} where {:?} {what} was expected",
                self.pos + 1,
                char::from(byte)
            )),
        }
    }

    /// A field of printable, non-space bytes, up to the next space or the end of the line.
    fn token(&mut self, what: &str) -> Result<&'a [u8], String> {
        let start = self.pos;
        while let Some(b) = self.peek().filter(|b| *b != b' ') {
            if !b.is_ascii_graphic() && b < 0x80 {
                return Err(format!(
                    "the {what} contains a control character at column {}",
                    self.pos + 1
                ));
            }
            self.pos += 1;
        }
        if self.pos == start {
            return Err(format!("the {what} is empty (column {})", start + 1));
        }
        Ok(&self.bytes[start..self.pos])
    }

    /// A double-quoted field, whose `\"` and `\\` escapes (Apache's) are skipped over.
    fn quoted(&mut self, what: &str) -> Result<(), String> {
        self.expect(b'"', &format!("opening the {what}"))?;
        let start = self.pos;
        loop {
            match self.peek() {
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(());
                }
                Some(b'\\') => self.pos += 2,
                Some(_) => self.pos += 1,
                None => break,
            }
        }
        Err(format!(
            "the {what} opened at column {start} has no closing '\"'"
        ))
    }

    /// `n` ASCII digits as a number.
    fn digits(&mut self, n: usize, what: &str) -> Result<u32, String> {
        let field = self
            .bytes
            .get(self.pos..self.pos + n)
            .filter(|f| f.iter().all(u8::is_ascii_digit))
            .ok_or_else(|| {
                format!(
                    "expected {n} digits of the {what} at column {}",
                    self.pos + 1
                )
            })?;
        self.pos += n;
        Ok(field
            .iter()
            .fold(0, |acc, d| acc * 10 + u32::from(d - b'0')))
    }

    /// Whether the whole line has been read.
    fn at_end(&self) -> bool {
        self.pos >= self.bytes.len()
    }
}

const MONTHS: [&[u8; 3]; 12] = [
    b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov", b"Dec",
];

/// Parses one access-log line (without its line ending).
///
/// # Errors
/// A description of what is wrong with the line.
pub(crate) fn parse_line(bytes: &[u8]) -> Result<LogLine, String> {
    if bytes.iter().all(|b| matches!(b, b' ' | b'\t' | b'\r')) {
        return Err("empty line (every line must be one request)".into());
    }
    let mut c = Cursor { bytes, pos: 0 };
    let address = c.token("client address (first field)")?;
    let address = std::str::from_utf8(address)
        .map_err(|_| "the client address (first field) is not valid UTF-8".to_owned())?
        .to_owned();
    c.expect(b' ', "after the client address")?;
    c.token("identity (second field, usually \"-\")")?;
    c.expect(b' ', "after the identity")?;
    c.token("user (third field, usually \"-\")")?;
    c.expect(b' ', "after the user")?;
    c.expect(b'[', "opening the timestamp")?;
    let (t_ms, offset_minutes) = timestamp(&mut c)?;
    c.expect(b']', "closing the timestamp")?;
    c.expect(b' ', "after the timestamp")?;
    c.quoted("request line")?;
    c.expect(b' ', "after the request line")?;
    c.digits(3, "status code")?;
    c.expect(b' ', "after the status code")?;
    let size = c.token("response size")?;
    if size != b"-" && !size.iter().all(u8::is_ascii_digit) {
        return Err(format!(
            "the response size {:?} is neither digits nor \"-\"",
            String::from_utf8_lossy(size)
        ));
    }
    if c.at_end() {
        // The common log format.
        return Ok(LogLine {
            t_ms,
            offset_minutes,
            address,
        });
    }
    c.expect(b' ', "after the response size")?;
    c.quoted("referer")?;
    c.expect(b' ', "after the referer")?;
    c.quoted("user agent")?;
    if !c.at_end() {
        // Fields a format appends to combined are separated by a space, and ignored.
        c.expect(b' ', "after the user agent")?;
    }
    Ok(LogLine {
        t_ms,
        offset_minutes,
        address,
    })
}

/// `dd/Mon/yyyy:HH:MM:SS +hhmm` as ms since the Unix epoch and the offset in minutes.
fn timestamp(c: &mut Cursor<'_>) -> Result<(u64, i32), String> {
    let start = c.pos;
    let day = c.digits(2, "timestamp's day")?;
    c.expect(b'/', "after the timestamp's day")?;
    let month = c
        .bytes
        .get(c.pos..c.pos + 3)
        .and_then(|m| MONTHS.iter().position(|name| name.as_slice() == m))
        .ok_or_else(|| {
            format!(
                "expected a month (Jan, Feb, ... Dec) at column {}",
                c.pos + 1
            )
        })?;
    c.pos += 3;
    c.expect(b'/', "after the timestamp's month")?;
    let year = c.digits(4, "timestamp's year")?;
    c.expect(b':', "after the timestamp's year")?;
    let hour = c.digits(2, "timestamp's hour")?;
    c.expect(b':', "after the timestamp's hour")?;
    let minute = c.digits(2, "timestamp's minute")?;
    c.expect(b':', "after the timestamp's minute")?;
    let second = c.digits(2, "timestamp's second")?;
    c.expect(b' ', "before the timestamp's offset")?;
    let sign: i64 = match c.peek() {
        Some(b'+') => 1,
        Some(b'-') => -1,
        _ => {
            return Err(format!(
                "expected the offset's sign ('+' or '-') at column {}",
                c.pos + 1
            ))
        }
    };
    c.pos += 1;
    let offset_hours = c.digits(2, "offset's hours")?;
    let offset_minutes = c.digits(2, "offset's minutes")?;
    let text = String::from_utf8_lossy(&c.bytes[start..c.pos]).into_owned();
    let month = u32::try_from(month + 1).unwrap_or(1);
    if day == 0 || day > days_in_month(year, month) {
        return Err(format!("{text:?} has no such day"));
    }
    if hour > 23 || minute > 59 || second > 59 {
        return Err(format!("{text:?} has no such time of day"));
    }
    if offset_hours > 23 || offset_minutes > 59 {
        return Err(format!("{text:?} has an offset beyond ±23:59"));
    }
    let offset = sign * i64::from(offset_hours * 60 + offset_minutes);
    let local_s = days_from_civil(i64::from(year), month, day) * 86_400
        + i64::from(hour * 3600 + minute * 60 + second);
    let utc_s = local_s - offset * 60;
    let t_ms = u64::try_from(utc_s)
        .map_err(|_| format!("{text:?} is before the Unix epoch (1970-01-01 00:00 UTC)"))?
        * 1000;
    // |offset| < 24 h, so it fits.
    Ok((t_ms, i32::try_from(offset).unwrap_or(0)))
}

/// Whether `year` is a leap year of the Gregorian calendar.
fn is_leap(year: u32) -> bool {
    year.is_multiple_of(4) && (!year.is_multiple_of(100) || year.is_multiple_of(400))
}

/// The number of days of `month` (1 to 12) in `year`.
fn days_in_month(year: u32, month: u32) -> u32 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to the Gregorian date `year-month-day` (month 1 to 12), negative
/// before it.
pub(crate) fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    // Count years from March, so the leap day ends a year.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let m = i64::from(month);
    let day_of_year = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The Gregorian date (year, month 1 to 12, day 1 to 31) `days` after 1970-01-01.
pub(crate) fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    // day is 1 to 31 and month 1 to 12 by construction.
    (
        year,
        u32::try_from(month).unwrap_or(1),
        u32::try_from(day).unwrap_or(1),
    )
}

/// The English abbreviation of `month` (1 to 12).
pub(crate) fn month_name(month: u32) -> &'static str {
    MONTHS
        .get(month.wrapping_sub(1) as usize)
        .and_then(|m| std::str::from_utf8(m.as_slice()).ok())
        .unwrap_or("???")
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &str = r#"127.0.0.1 - frank [10/Oct/2000:13:55:36 -0700] "GET /apache_pb.gif HTTP/1.0" 200 2326 "http://www.example.com/start.html" "Mozilla/4.08 [en] (Win98; I ;Nav)""#;

    fn parse(s: &str) -> Result<LogLine, String> {
        parse_line(s.as_bytes())
    }

    #[test]
    fn the_apache_documentation_example() {
        // 2000-10-10 13:55:36 at UTC−7 is 20:55:36 UTC, 971211336 s after the epoch.
        assert_eq!(
            parse(LINE),
            Ok(LogLine {
                t_ms: 971_211_336_000,
                offset_minutes: -420,
                address: "127.0.0.1".into(),
            })
        );
    }

    #[test]
    fn offsets_common_format_and_extra_fields() {
        let at = |ts: &str| {
            parse(&format!(r#"::1 - - [{ts}] "GET / HTTP/1.1" 204 -"#)).map(|l| l.t_ms / 1000)
        };
        assert_eq!(at("01/Jan/1970:00:00:00 +0000"), Ok(0));
        assert_eq!(at("01/Jan/1970:01:00:00 +0100"), Ok(0));
        assert_eq!(at("31/Dec/1969:19:00:00 -0500"), Ok(0));
        assert_eq!(at("29/Feb/2024:12:00:00 +0530"), Ok(1_709_188_200));
        assert_eq!(at("01/Mar/2000:00:00:00 +0000"), Ok(951_868_800));
        assert!(at("31/Dec/1969:23:59:59 +0000").is_err());
        assert!(at("01/Jan/1970:00:30:00 +0100").is_err());
        for bad in [
            "29/Feb/2023:00:00:00 +0000",
            "31/Apr/2023:00:00:00 +0000",
            "00/Jan/2023:00:00:00 +0000",
            "10/oct/2000:13:55:36 -0700",
            "10/Oct/2000:24:00:00 -0700",
            "10/Oct/2000:13:60:00 -0700",
            "10/Oct/2000:13:55:60 -0700",
            "10/Oct/2000:13:55:36 0700",
            "10/Oct/2000:13:55:36 -07:00",
            "10/Oct/2000:13:55:36 -2400",
            "10/Oct/2000 13:55:36 -0700",
            "2000-10-10T13:55:36Z",
        ] {
            assert!(at(bad).is_err(), "{bad}");
        }
        let extended = format!("{LINE} 0.005 \"-\"");
        assert_eq!(parse(&extended).map(|l| l.t_ms), Ok(971_211_336_000));
        let escaped = r#"2001:db8::1 - - [10/Oct/2000:13:55:36 +0000] "GET /\"q\" HTTP/1.1" 400 0 "-" "a \"b\" c""#;
        assert_eq!(parse(escaped).map(|l| l.address), Ok("2001:db8::1".into()));
    }

    #[test]
    fn malformed_lines_say_what_is_wrong() {
        for (line, needle) in [
            ("", "empty line"),
            ("  ", "empty line"),
            ("127.0.0.1", "ends"),
            (
                r#"127.0.0.1 - - 10/Oct/2000:13:55:36 -0700 "GET /" 200 1"#,
                "'['",
            ),
            (
                r#"127.0.0.1 - - [10/Oct/2000:13:55:36 -0700] GET / 200 1"#,
                "request line",
            ),
            (
                r#"127.0.0.1 - - [10/Oct/2000:13:55:36 -0700] "GET / 200 1"#,
                "no closing",
            ),
            (
                r#"127.0.0.1 - - [10/Oct/2000:13:55:36 -0700] "GET /" OK 1"#,
                "status",
            ),
            (
                r#"127.0.0.1 - - [10/Oct/2000:13:55:36 -0700] "GET /" 200 12k"#,
                "response size",
            ),
            (
                r#"127.0.0.1 - - [10/Oct/2000:13:55:36 -0700] "GET /" 200 1 "-""#,
                "after the referer",
            ),
            (
                r#"127.0.0.1 - - [10/Oct/2000:13:55:36 -0700] "GET /" 200 1 "-" "ua"x"#,
                "after the user agent",
            ),
            (
                r#"127.0.0.1  - - [10/Oct/2000:13:55:36 -0700] "GET /" 200 1"#,
                "identity",
            ),
            ("{\"t_ms\": 1}", "ends"),
            (
                "127.0.0.1\t- - [10/Oct/2000:13:55:36 -0700] \"GET /\" 200 1",
                "control character",
            ),
        ] {
            let err = parse(line).expect_err(line);
            assert!(err.contains(needle), "{line:?}: {err:?} lacks {needle:?}");
        }
    }

    #[test]
    fn dates_round_trip() {
        for days in [
            -719_468, -1, 0, 1, 59, 365, 10_957, 11_016, 19_782, 2_932_896,
        ] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days, "{y}-{m}-{d}");
        }
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(month_name(10), "Oct");
        assert_eq!(month_name(0), "???");
    }

    fn log(lines: &[(&str, &str)]) -> String {
        lines
            .iter()
            .map(|(addr, ts)| format!("{addr} - - [{ts}] \"GET / HTTP/1.1\" 200 5\n"))
            .collect()
    }

    fn drain<R: BufRead>(r: &mut AccessLogReader<R>) -> (Vec<(u64, u64, String)>, Option<String>) {
        let mut got = Vec::new();
        loop {
            match r.next_request() {
                Ok(Some((line, req))) => got.push((line, req.t_ms / 1000 % 60, req.key)),
                Ok(None) => return (got, None),
                Err(e) => return (got, Some(e.to_string())),
            }
        }
    }

    #[test]
    fn reorders_within_the_window_and_refuses_beyond_it() {
        let text = log(&[
            ("a", "01/Jan/2024:00:00:10 +0000"),
            ("b", "01/Jan/2024:00:00:08 +0000"),
            ("c", "01/Jan/2024:00:00:12 +0000"),
            ("d", "01/Jan/2024:00:00:10 +0000"),
            ("e", "01/Jan/2024:00:00:16 +0000"),
            ("f", "01/Jan/2024:00:00:10 +0000"),
        ]);
        let mut r = AccessLogReader::new(text.as_bytes(), 5_000);
        let (got, err) = drain(&mut r);
        // Every line before the late one is handed out, in time order, then the error.
        let order: Vec<&str> = got.iter().map(|(_, _, k)| k.as_str()).collect();
        assert_eq!(order, ["b", "a", "d", "c", "e"]);
        let err = err.expect("line 6 is 6 s late");
        assert!(
            err.contains("line 6") && err.contains("6000 ms before line 5"),
            "{err}"
        );

        let mut r = AccessLogReader::new(text.as_bytes(), 6_000);
        let (got, err) = drain(&mut r);
        assert_eq!(err, None);
        let order: Vec<&str> = got.iter().map(|(_, _, k)| k.as_str()).collect();
        assert_eq!(order, ["b", "a", "d", "f", "c", "e"]);
        assert_eq!(got[3].0, 6);

        // A zero window: the log must be in order.
        let mut r = AccessLogReader::new(text.as_bytes(), 0);
        let (got, err) = drain(&mut r);
        assert_eq!(got.len(), 1);
        assert!(err.is_some_and(|e| e.contains("line 2")));
    }

    #[test]
    fn lines_before_a_malformed_one_are_handed_out_first() {
        let mut text = log(&[
            ("a", "01/Jan/2024:00:00:10 +0000"),
            ("b", "01/Jan/2024:00:00:09 +0000"),
        ]);
        text.push_str("garbage\n");
        text.push_str(&log(&[("c", "01/Jan/2024:00:00:11 +0000")]));
        let mut r = AccessLogReader::new(text.as_bytes(), 5_000);
        let (got, err) = drain(&mut r);
        assert_eq!(got, [(2, 9, "b".into()), (1, 10, "a".into())]);
        assert!(err.is_some_and(|e| e.contains("access-log line 3")));
        assert_eq!(r.first_offset_minutes(), Some(0));
    }
}
