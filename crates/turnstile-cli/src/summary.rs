//! `turnstile simulate --summary`: a table per key and a total.

use std::collections::BTreeMap;
use std::io::{self, Write};

use turnstile_core::Decision;

use crate::simulate::ceil_ms;
use crate::trace::Request;

/// Counts for one key (or for all keys).
#[derive(Clone, Debug, Default)]
struct Counts {
    requests: u64,
    admitted: u64,
    denied: u64,
    /// Longest finite `retry_after` of a denied request, in ms (rounded up).
    longest_retry_ms: Option<u128>,
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

/// Per-key counts of a simulation.
#[derive(Debug, Default)]
pub(crate) struct Summary {
    keys: BTreeMap<String, Counts>,
}

impl Summary {
    /// Counts one decided request.
    pub(crate) fn record(&mut self, request: &Request, decision: &Decision) {
        match self.keys.get_mut(&request.key) {
            Some(counts) => counts.record(decision),
            None => {
                let mut counts = Counts::default();
                counts.record(decision);
                self.keys.insert(request.key.clone(), counts);
            }
        }
    }

    /// Writes the table: a header, one row per key in key order, and a total row.
    pub(crate) fn write(&self, out: &mut impl Write) -> io::Result<()> {
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
        let mut rows: Vec<[String; 7]> = Vec::with_capacity(self.keys.len() + 2);
        rows.push(HEADER.map(str::to_owned));
        for (key, counts) in &self.keys {
            total.merge(counts);
            rows.push(row(display_key(key), counts));
        }
        rows.push(row("TOTAL".to_owned(), &total));

        let mut widths = [0; 7];
        for r in &rows {
            for (w, cell) in widths.iter_mut().zip(r) {
                *w = (*w).max(cell.chars().count());
            }
        }
        for (i, r) in rows.iter().enumerate() {
            if i == rows.len() - 1 {
                let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
                writeln!(out, "{}", rule.join("  "))?;
            }
            let mut line = String::new();
            for (j, (cell, w)) in r.iter().zip(widths).enumerate() {
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
