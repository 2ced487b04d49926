//! Every test vector, run through the in-memory backend directly.
//!
//! Walks `tests/vectors/` (copies of the shared vectors), `tests/vectors-local/` (cases
//! written for this repository) and, when it exists, `../shared/vectors/` next to the
//! workspace, so a new vector is picked up without any change here. Each request is decided
//! with [`MemoryBackend::decide_at`] and every field of its expected decision must match
//! exactly, durations rounded up to whole milliseconds.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Map, Value};
use turnstile_core::round::ceil_ms;
use turnstile_core::{Algorithm, Backend, Decision, MemoryBackend, Policy, PolicyDecision};

/// The workspace root (this crate lives in `<root>/tests`).
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate lives inside the workspace")
        .to_path_buf()
}

/// The folders holding vectors: those of this repository always, the shared ones when
/// they are there.
fn vector_dirs() -> Vec<PathBuf> {
    let root = workspace_root();
    let mut dirs = vec![root.join("tests/vectors"), root.join("tests/vectors-local")];
    let shared = root.join("../shared/vectors");
    if shared.is_dir() {
        dirs.push(shared);
    }
    dirs
}

/// Every `*.json` file of `dir`, sorted.
fn json_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.expect("readable directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    files
}

fn u64_field(obj: &Map<String, Value>, name: &str) -> Result<Option<u64>, String> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| format!("{name} is not a non-negative integer: {v}")),
    }
}

/// A policy of a vector: `{"algorithm", "limit", "period_ms", "burst"?, "name"?}`.
fn policy(v: &Value) -> Result<Policy, String> {
    let obj = v.as_object().ok_or("a policy is not an object")?;
    let algorithm: Algorithm = obj
        .get("algorithm")
        .and_then(Value::as_str)
        .ok_or("policy without an algorithm")?
        .parse()
        .map_err(|e| format!("{e}"))?;
    let limit = u64_field(obj, "limit")?.ok_or("policy without a limit")?;
    let period_ms = u64_field(obj, "period_ms")?.ok_or("policy without period_ms")?;
    let burst = u64_field(obj, "burst")?;
    let mut p =
        Policy::from_parts(algorithm, limit, period_ms, burst).map_err(|e| e.to_string())?;
    if let Some(name) = obj.get("name").and_then(Value::as_str) {
        p = p.with_name(name).map_err(|e| e.to_string())?;
    }
    Ok(p)
}

/// The vector's policies: `"policy": {..}` or `"policies": [..]`.
fn policies(vector: &Map<String, Value>) -> Result<Vec<Policy>, String> {
    match (vector.get("policy"), vector.get("policies")) {
        (Some(p), None) => Ok(vec![policy(p)?]),
        (None, Some(Value::Array(ps))) if !ps.is_empty() => ps.iter().map(policy).collect(),
        _ => Err("needs exactly one of \"policy\" or a non-empty \"policies\"".into()),
    }
}

/// Compares one duration field of an expected object (`null` means never).
fn check_ms(obj: &Map<String, Value>, name: &str, got: Option<Duration>, errors: &mut Vec<String>) {
    let Some(want) = obj.get(name) else {
        return;
    };
    let got = got.map(ceil_ms);
    if want.as_u64() != got || (want.is_null() != got.is_none()) {
        errors.push(format!("{name}: got {got:?}, want {want}"));
    }
}

const DECISION_FIELDS: [&str; 5] = [
    "allowed",
    "remaining",
    "retry_after_ms",
    "reset_after_ms",
    "delay_ms",
];

/// The decision fields of an aggregate or of one policy's result.
struct Fields {
    allowed: bool,
    remaining: u64,
    retry: Option<Duration>,
    reset: Duration,
    delay: Duration,
}

impl From<&Decision> for Fields {
    fn from(d: &Decision) -> Self {
        Fields {
            allowed: d.allowed(),
            remaining: d.remaining(),
            retry: d.retry_after(),
            reset: d.reset_after(),
            delay: d.delay(),
        }
    }
}

impl From<&PolicyDecision> for Fields {
    fn from(d: &PolicyDecision) -> Self {
        Fields {
            allowed: d.allowed(),
            remaining: d.remaining(),
            retry: d.retry_after(),
            reset: d.reset_after(),
            delay: d.delay(),
        }
    }
}

/// Compares the decision fields an expected object holds; any field this test does not
/// know is an error too, so a new expectation can never be skipped silently.
fn check_fields(want: &Map<String, Value>, got: Fields, known: &[&str], errors: &mut Vec<String>) {
    let Fields {
        allowed,
        remaining,
        retry,
        reset,
        delay,
    } = got;
    for k in want.keys() {
        if !known.contains(&k.as_str()) {
            errors.push(format!("unknown expected field {k:?}"));
        }
    }
    if let Some(w) = want.get("allowed") {
        if w.as_bool() != Some(allowed) {
            errors.push(format!("allowed: got {allowed}, want {w}"));
        }
    }
    if let Some(w) = want.get("remaining") {
        if w.as_u64() != Some(remaining) {
            errors.push(format!("remaining: got {remaining}, want {w}"));
        }
    }
    check_ms(want, "retry_after_ms", retry, errors);
    check_ms(want, "reset_after_ms", Some(reset), errors);
    check_ms(want, "delay_ms", Some(delay), errors);
}

fn check_policy_results(want: &Value, got: &[PolicyDecision], errors: &mut Vec<String>) {
    let Some(want) = want.as_array() else {
        errors.push("expected \"policies\" is not a list".into());
        return;
    };
    if want.len() != got.len() {
        errors.push(format!("{} policy results, want {}", got.len(), want.len()));
        return;
    }
    for (i, (w, g)) in want.iter().zip(got).enumerate() {
        let Some(w) = w.as_object() else {
            errors.push(format!("expected policy result {i} is not an object"));
            continue;
        };
        let mut errs = Vec::new();
        if let Some(name) = w.get("name") {
            if name.as_str() != Some(g.name()) {
                errs.push(format!("name: got {:?}, want {name}", g.name()));
            }
        }
        let mut known = vec!["name"];
        known.extend(DECISION_FIELDS);
        check_fields(w, g.into(), &known, &mut errs);
        errors.extend(errs.into_iter().map(|e| format!("policy {i}: {e}")));
    }
}

/// Runs one vector; returns its failures (empty when it passes) and its request count.
fn run_vector(path: &Path) -> (Vec<String>, usize) {
    let fail = |e: String| (vec![format!("{}: {e}", path.display())], 0);
    let text = match fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => return fail(format!("unreadable: {e}")),
    };
    let vector: Map<String, Value> = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(e) => return fail(format!("not a JSON object: {e}")),
    };
    let policies = match policies(&vector) {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    let (Some(Value::Array(requests)), Some(Value::Array(expected))) =
        (vector.get("requests"), vector.get("expected"))
    else {
        return fail("needs \"requests\" and \"expected\" lists".into());
    };
    if requests.len() != expected.len() {
        return fail(format!(
            "{} requests but {} expected decisions",
            requests.len(),
            expected.len()
        ));
    }
    let backend = MemoryBackend::new();
    let mut errors = Vec::new();
    for (i, (req, want)) in requests.iter().zip(expected).enumerate() {
        let (Some(req), Some(want)) = (req.as_object(), want.as_object()) else {
            errors.push(format!("request {}: not an object", i + 1));
            continue;
        };
        let t_ms = req.get("t_ms").and_then(Value::as_u64);
        let key = match req.get("key") {
            None => Some(""),
            Some(k) => k.as_str(),
        };
        let cost = match req.get("cost") {
            None => Some(1),
            Some(c) => c.as_u64(),
        };
        let (Some(t_ms), Some(key), Some(cost)) = (t_ms, key, cost) else {
            errors.push(format!("request {}: malformed {req:?}", i + 1));
            continue;
        };
        let decision: Decision = match backend.check_at(key, &policies, cost, t_ms).into_inner() {
            Ok(d) => d,
            Err(e) => {
                errors.push(format!("request {}: backend error {e}", i + 1));
                continue;
            }
        };
        let mut errs = Vec::new();
        // The echoed request, with the defaults filled in.
        for (k, v) in [
            ("t_ms", Value::from(t_ms)),
            ("key", Value::from(key)),
            ("cost", Value::from(cost)),
        ] {
            if want.get(k).is_some_and(|w| *w != v) {
                errs.push(format!("{k}: echoes {v}, want {}", want[k]));
            }
        }
        let mut known = vec!["t_ms", "key", "cost", "policies"];
        known.extend(DECISION_FIELDS);
        check_fields(want, (&decision).into(), &known, &mut errs);
        if let Some(w) = want.get("policies") {
            check_policy_results(w, decision.policies(), &mut errs);
        }
        errors.extend(
            errs.into_iter()
                .map(|e| format!("{} request {} (t_ms={t_ms}): {e}", path.display(), i + 1)),
        );
    }
    (errors, requests.len())
}

#[test]
fn every_vector_passes_on_the_memory_backend() {
    let mut failures = Vec::new();
    let mut vectors = 0;
    let mut requests = 0;
    for dir in vector_dirs() {
        for path in json_files(&dir) {
            let (errors, n) = run_vector(&path);
            vectors += 1;
            requests += n;
            failures.extend(errors);
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // The repository's own copies alone hold 31 vectors; never pass by finding none.
    assert!(vectors >= 31, "only {vectors} vectors found");
    eprintln!("{vectors} vectors, {requests} requests: all pass");
}

#[test]
fn copied_vectors_match_the_shared_ones() {
    let root = workspace_root();
    let shared = root.join("../shared/vectors");
    if !shared.is_dir() {
        return;
    }
    let mut stale = Vec::new();
    for path in json_files(&root.join("tests/vectors")) {
        let theirs = shared.join(path.file_name().expect("a file name"));
        if theirs.is_file() && fs::read(&theirs).ok() != fs::read(&path).ok() {
            stale.push(path.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "copies differ from ../shared/vectors (copy them again, verbatim): {stale:?}"
    );
}
