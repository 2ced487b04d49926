//! `turnstile simulate --summary`: a table per key and a total (per candidate with
//! `--compare`).

use std::collections::BTreeMap;
use std::io::{self, Write};

use turnstile_core::round::ceil_ms;
use turnstile_core::Decision;

use crate::trace::Request;

/// Counts for one key (or for all keys).
#[derive(Clone, Debug, Default)]
struct Counts {
    requests: u64,
    admitted: u64,
    denied: u64,
    /// Longest finite `retry_after` of a denied request, in ms (rounded up).
    longest_retry_ms: Option<u64>,
    /// Denied requests no wait could help (cost above capacity).
    never: u64,
}

impl Counts {
    fn record(&mut self, decision: &Decision) {
        self.requests += 1;
        if decision.allowed() {
            self.admitted += 1;
            return;
        }
        self.denied += 1;
        match decision.retry_after() {
            Some(d) => {
                let ms = ceil_ms(d);
                self.longest_retry_ms = Some(self.longest_retry_ms.map_or(ms, |m| m.max(ms)));
            }
            None => self.never += 1,
        }
    }

    fn merge(&mut self, other: &Counts) {
        self.requests += other.requests;
        self.admitted += other.admitted;
        self.denied += other.denied;
        self.never += other.never;
        self.longest_retry_ms = match (self.longest_retry_ms, other.longest_retry_ms) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }

    /// The table cells after the key.
    fn cells(&self) -> [String; 6] {
        [
            self.requests.to_string(),
            self.admitted.to_string(),
            self.denied.to_string(),
            percent(self.denied, self.requests),
            self.longest_retry_ms
                .map_or_else(|| "-".to_owned(), |ms| ms.to_string()),
            self.never.to_string(),
        ]
    }
}

/// `part / whole` as a percentage with one decimal, rounded half up; `-` when `whole` is 0.
fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "-".to_owned();
    }
    let tenths = (u128::from(part) * 1000 + u128::from(whole) / 2) / u128::from(whole);
    format!("{}.{}%", tenths / 10, tenths % 10)
}

/// How a key is shown: as is when it is plain printable text, else as a JSON string (so the
/// empty key and keys with spaces or control characters stay visible).
fn display_key(key: &str) -> String {
    let plain = !key.is_empty()
        && !key.starts_with('"')
        && key
            .chars()
            .all(|c| c.is_alphanumeric() || c.is_ascii_punctuation());
    if plain {
        key.to_owned()
    } else {
        serde_json::to_string(key).unwrap_or_default()
    }
}

/// Per-key counts of a simulation, per candidate.
#[derive(Debug)]
pub(crate) struct Summary {
    /// The candidates' names with `--compare`; one `None` without.
    candidates: Vec<Option<String>>,
    /// Per key, one count per candidate.
    keys: BTreeMap<String, Vec<Counts>>,
}

impl Summary {
    /// An empty summary of the candidates named `candidates` (`None` without `--compare`).
    pub(crate) fn new(candidates: Vec<Option<String>>) -> Self {
        Summary {
            candidates,
            keys: BTreeMap::new(),
        }
    }

    /// Counts one request as the candidate numbered `candidate` decided it.
    pub(crate) fn record(&mut self, candidate: usize, request: &Request, decision: &Decision) {
        let n = self.candidates.len();
        let counts = match self.keys.get_mut(&request.key) {
            Some(counts) => counts,
            None => self
                .keys
                .entry(request.key.clone())
                .or_insert_with(|| vec![Counts::default(); n]),
        };
        if let Some(counts) = counts.get_mut(candidate) {
            counts.record(decision);
        }
    }

    /// Writes the table: a header, one row per key in key order, and a total row. Without
    /// `--compare` the columns are the counts of the one candidate; with it, the requests
    /// and then one column per candidate, headed by its name, of requests denied (share).
    pub(crate) fn write(&self, out: &mut impl Write) -> io::Result<()> {
        let names: Option<Vec<&str>> = self.candidates.iter().map(Option::as_deref).collect();
        match names {
            Some(names) => self.write_compare(out, &names),
            None => self.write_single(out),
        }
    }

    /// The table of one candidate.
    fn write_single(&self, out: &mut impl Write) -> io::Result<()> {
        const HEADER: [&str; 7] = [
            "key",
            "requests",
            "admitted",
            "denied",
            "denied %",
            "longest retry ms",
            "never",
        ];
        let mut total = Counts::default();
        let mut rows: Vec<Vec<String>> = Vec::with_capacity(self.keys.len() + 2);
        rows.push(HEADER.map(str::to_owned).to_vec());
        for (key, counts) in &self.keys {
            let counts = counts.first().cloned().unwrap_or_default();
            total.merge(&counts);
            rows.push(row(display_key(key), &counts).to_vec());
        }
        rows.push(row("TOTAL".to_owned(), &total).to_vec());
        write_table(out, &rows)
    }

    /// The side-by-side table of `--compare`.
    fn write_compare(&self, out: &mut impl Write, names: &[&str]) -> io::Result<()> {
        let mut header = vec!["key".to_owned(), "requests".to_owned()];
        header.extend(names.iter().map(|n| (*n).to_owned()));
        let mut totals = vec![Counts::default(); names.len()];
        let mut rows = vec![header];
        let compare_row = |key: String, counts: &[Counts]| {
            let mut r = vec![key, counts.first().map_or(0, |c| c.requests).to_string()];
            r.extend(
                counts
                    .iter()
                    .map(|c| format!("{} ({})", c.denied, percent(c.denied, c.requests))),
            );
            r
        };
        for (key, counts) in &self.keys {
            for (t, c) in totals.iter_mut().zip(counts) {
                t.merge(c);
            }
            rows.push(compare_row(display_key(key), counts));
        }
        rows.push(compare_row("TOTAL".to_owned(), &totals));
        writeln!(
            out,
            "requests denied (share of the key's requests) by each candidate:"
        )?;
        write_table(out, &rows)
    }
}

/// Writes `rows` aligned in columns, the first left-aligned and the others right-aligned,
/// with a rule above the last row.
fn write_table(out: &mut impl Write, rows: &[Vec<String>]) -> io::Result<()> {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut widths = vec![0; columns];
    for r in rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    for (i, r) in rows.iter().enumerate() {
        if i + 1 == rows.len() {
            let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
            writeln!(out, "{}", rule.join("  "))?;
        }
        let mut line = String::new();
        for (j, (cell, w)) in r.iter().zip(&widths).enumerate() {
            let pad = w - cell.chars().count();
            if j == 0 {
                // The key column is left-aligned, numbers right-aligned.
                line.push_str(cell);
                line.push_str(&" ".repeat(pad));
            } else {
                line.push_str("  ");
                line.push_str(&" ".repeat(pad));
                line.push_str(cell);
            }
        }
        writeln!(out, "{}", line.trim_end())?;
    }
    Ok(())
}

/// One table row: the key as shown, then its counts.
fn row(key: String, counts: &Counts) -> [String; 7] {
    let [a, b, c, d, e, f] = counts.cells();
    [key, a, b, c, d, e, f]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentages_round_half_up() {
        assert_eq!(percent(0, 0), "-");
        assert_eq!(percent(1, 3), "33.3%");
        assert_eq!(percent(2, 3), "66.7%");
        assert_eq!(percent(1, 8), "12.5%");
        assert_eq!(percent(5, 5), "100.0%");
    }

    #[test]
    fn keys_are_shown_unambiguously() {
        assert_eq!(display_key("alice"), "alice");
        assert_eq!(display_key(""), "\"\"");
        assert_eq!(display_key("a b"), "\"a b\"");
        assert_eq!(display_key("TOTAL"), "TOTAL");
    }
}
