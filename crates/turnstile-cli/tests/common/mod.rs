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

/// Runs `turnstile` with `args` and no input, and checks that it refused them as a usage
/// error: exit code 2, no panic, nothing on standard output. Returns the run.
pub(crate) fn usage_error(args: &[&str]) -> Output {
    let out = run(args, b"");
    assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
    assert!(
        !stderr(&out).contains("panicked"),
        "{args:?}: {}",
        stderr(&out)
    );
    assert_eq!(stdout(&out), "", "{args:?}");
    out
}

/// The vectors of the repository (`tests/vectors` and `tests/vectors-local`), each folder's
/// in name order.
pub(crate) fn repository_vectors() -> Vec<PathBuf> {
    let mut all = Vec::new();
    for dir in ["tests/vectors", "tests/vectors-local"] {
        let mut files: Vec<PathBuf> = std::fs::read_dir(workspace_root().join(dir))
            .expect("the vectors folder")
            .map(|e| e.expect("an entry").path())
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .collect();
        files.sort();
        all.extend(files);
    }
    all
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
