//! [`ConfigFileError`]: why a configuration file was refused, and where.

use std::fmt;
use std::ops::Range;

/// Why a configuration file was refused: where (file, line, column, field) and what.
///
/// Displayed as `FILE:LINE:COLUMN: FIELD: MESSAGE`, e.g.
/// `turnstile.toml:12:13: rules[1].policies[0]: limit 0 is out of range (1 to 4294967295)`;
/// parts that do not apply (an unreadable file has no line) are left out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigFileError(Box<ErrorInner>);

#[derive(Clone, Debug, PartialEq, Eq)]
struct ErrorInner {
    file: String,
    line: Option<usize>,
    column: Option<usize>,
    field: String,
    message: String,
    source_line: Option<String>,
}

impl ConfigFileError {
    pub(super) fn new(
        file: &str,
        text: &str,
        span: Option<Range<usize>>,
        field: String,
        message: String,
    ) -> Self {
        let (line, column, source_line) = match span {
            Some(span) => {
                let start = span.start.min(text.len());
                let before = &text[..floor_char(text, start)];
                let line = before.matches('\n').count() + 1;
                let line_start = before.rfind('\n').map_or(0, |i| i + 1);
                let column = before[line_start..].chars().count() + 1;
                let source_line = text[line_start..].lines().next().unwrap_or("").to_owned();
                (Some(line), Some(column), Some(source_line))
            }
            None => (None, None, None),
        };
        ConfigFileError(Box::new(ErrorInner {
            file: file.to_owned(),
            line,
            column,
            field,
            message,
            source_line,
        }))
    }

    /// The file's name as given.
    pub fn file(&self) -> &str {
        &self.0.file
    }

    /// The line (from 1), when the error has a place in the file.
    pub fn line(&self) -> Option<usize> {
        self.0.line
    }

    /// The column (from 1, in characters), when the error has a place in the file.
    pub fn column(&self) -> Option<usize> {
        self.0.column
    }

    /// The field, as a path such as `rules[1].policies[0]` (empty for the whole file).
    pub fn field(&self) -> &str {
        &self.0.field
    }

    /// What is wrong.
    pub fn message(&self) -> &str {
        &self.0.message
    }

    /// The offending line of the file with a caret under the column, for people:
    /// ```text
    ///    |
    /// 12 | policies = ["fixed-window:limit=0,period=1s"]
    ///    |             ^
    /// ```
    pub fn snippet(&self) -> Option<String> {
        let e = &self.0;
        let (line, column, text) = (e.line?, e.column?, e.source_line.as_ref()?);
        let number = line.to_string();
        let pad = " ".repeat(number.len());
        let indent: String = text
            .chars()
            .take(column.saturating_sub(1))
            .map(|c| if c == '\t' { '\t' } else { ' ' })
            .collect();
        Some(format!("{pad} |\n{number} | {text}\n{pad} | {indent}^"))
    }
}

impl fmt::Display for ConfigFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let e = &self.0;
        f.write_str(&e.file)?;
        if let Some(line) = e.line {
            write!(f, ":{line}")?;
            if let Some(column) = e.column {
                write!(f, ":{column}")?;
            }
        }
        f.write_str(": ")?;
        if !e.field.is_empty() {
            write!(f, "{}: ", e.field)?;
        }
        f.write_str(&e.message)
    }
}

impl std::error::Error for ConfigFileError {}

/// The largest char boundary at or below `i`.
fn floor_char(text: &str, mut i: usize) -> usize {
    while i > 0 && !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}
