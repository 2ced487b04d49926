//! Helpers shared by the `turnstile` binary's end-to-end tests.

#![allow(dead_code)] // each test file uses its own subset

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// Runs `turnstile` with `args`, feeding `stdin`.
pub(crate) fn run(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_turnstile"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the turnstile binary starts");
    let mut input = child.stdin.take().expect("piped stdin");
    // The binary may stop reading early (a malformed line); a broken pipe is fine then.
    let _ = input.write_all(stdin);
    drop(input);
    child.wait_with_output().expect("the binary finishes")
}

/// The standard output, as text.
pub(crate) fn stdout(o: &Output) -> &str {
    std::str::from_utf8(&o.stdout).expect("UTF-8 output")
}

/// The standard error, as text.
pub(crate) fn stderr(o: &Output) -> &str {
    std::str::from_utf8(&o.stderr).expect("UTF-8 errors")
}

/// The workspace root.
pub(crate) fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}
