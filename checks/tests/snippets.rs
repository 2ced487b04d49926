//! Every Rust snippet a user reads is compiled with exactly the dependencies its page shows.
//!
//! The pages are `README.md`, `docs/*.md` and each crate's `README.md`. A page with a Rust
//! snippet shows a dependency block (its first ```` ```toml ```` block that starts with
//! `[dependencies]`) and is included, as doctests, by one crate of `docs/snippets/` whose
//! `[dependencies]` are that block, with `path` added to the workspace's crates and nothing
//! else. So a snippet that needs a crate or a feature the page does not show fails to
//! compile in `cargo test`, and these tests fail when a page and its crate drift apart.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use toml::{Table, Value};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

/// A fenced code block of a Markdown page: its info string and its lines.
struct Fence {
    info: String,
    line: usize,
    body: String,
}

fn fences(text: &str) -> Vec<Fence> {
    let mut out = Vec::new();
    let mut open: Option<(String, usize, usize, String)> = None; // info, indent, line, body
    for (i, raw) in text.lines().enumerate() {
        let indent = raw.len() - raw.trim_start().len();
        let line = raw.trim_start();
        match &mut open {
            None => {
                if let Some(info) = line.strip_prefix("```") {
                    open = Some((info.trim().to_owned(), indent, i + 1, String::new()));
                }
            }
            Some((info, _, start, body)) => {
                if line.starts_with("```") && line.trim() == "```" {
                    out.push(Fence {
                        info: std::mem::take(info),
                        line: *start,
                        body: std::mem::take(body),
                    });
                    open = None;
                } else {
                    body.push_str(raw);
                    body.push('\n');
                }
            }
        }
    }
    assert!(open.is_none(), "an unclosed code block");
    out
}

/// What rustdoc compiles as a doctest: a block tagged `rust` (with or without attributes
/// such as `no_run`), or untagged.
fn is_rust(info: &str) -> bool {
    let first = info.split([',', ' ']).next().unwrap_or("");
    first.is_empty() || first == "rust"
}

/// The pages users read.
fn pages() -> Vec<PathBuf> {
    let root = root();
    let mut pages = vec![root.join("README.md")];
    for dir in ["docs", "crates"] {
        for entry in fs::read_dir(root.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if dir == "docs" && path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            } else if dir == "crates" && path.join("README.md").is_file() {
                pages.push(path.join("README.md"));
            }
        }
    }
    pages.sort();
    pages
}

/// The page's dependency block, parsed: its first TOML block that starts with
/// `[dependencies]` (comments and blank lines before it aside).
fn dependency_block(page: &Path) -> Option<Table> {
    let text = fs::read_to_string(page).unwrap();
    fences(&text)
        .into_iter()
        .filter(|f| f.info == "toml")
        .find(|f| {
            f.body
                .lines()
                .map(str::trim)
                .find(|l| !l.is_empty() && !l.starts_with('#'))
                == Some("[dependencies]")
        })
        .map(|f| {
            let table: Table = toml::from_str(&f.body).unwrap_or_else(|e| {
                panic!("{}:{}: the dependency block: {e}", page.display(), f.line)
            });
            let deps = table.get("dependencies").and_then(Value::as_table).cloned();
            assert_eq!(
                table.len(),
                1,
                "{}: the dependency block holds more than [dependencies]",
                page.display()
            );
            deps.unwrap()
        })
}

/// A dependency as a table: `"1"` is `{ version = "1" }`.
fn normalised(dep: &Value) -> Table {
    match dep {
        Value::String(v) => Table::from_iter([("version".to_owned(), Value::String(v.clone()))]),
        Value::Table(t) => t.clone(),
        other => panic!("a dependency that is neither a version nor a table: {other:?}"),
    }
}

/// The crates of `docs/snippets/`: each one's manifest and the pages its `lib.rs` includes.
fn snippet_crates() -> Vec<(PathBuf, Table, Vec<PathBuf>)> {
    let dir = root().join("docs/snippets");
    let mut crates = Vec::new();
    for entry in fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if !path.join("Cargo.toml").is_file() {
            continue;
        }
        let manifest: Table =
            toml::from_str(&fs::read_to_string(path.join("Cargo.toml")).unwrap()).unwrap();
        let lib = fs::read_to_string(path.join("src/lib.rs")).unwrap();
        let pages = lib
            .split("include_str!(\"")
            .skip(1)
            .map(|rest| {
                let rel = &rest[..rest.find('"').unwrap()];
                fs::canonicalize(path.join("src").join(rel))
                    .unwrap_or_else(|e| panic!("{}: {rel}: {e}", path.display()))
            })
            .collect();
        crates.push((path, manifest, pages));
    }
    crates.sort_by(|a, b| a.0.cmp(&b.0));
    crates
}

#[test]
fn every_page_with_rust_is_compiled_by_one_snippet_crate() {
    let crates = snippet_crates();
    assert!(crates.len() >= 2, "no snippet crates found");
    let mut missing = Vec::new();
    for page in pages() {
        let text = fs::read_to_string(&page).unwrap();
        let rust: Vec<usize> = fences(&text)
            .iter()
            .filter(|f| is_rust(&f.info))
            .map(|f| f.line)
            .collect();
        if rust.is_empty() {
            continue;
        }
        let canonical = fs::canonicalize(&page).unwrap();
        let by: Vec<_> = crates
            .iter()
            .filter(|(_, _, pages)| pages.contains(&canonical))
            .map(|(dir, _, _)| dir.display().to_string())
            .collect();
        if by.len() != 1 {
            missing.push(format!(
                "{} (Rust at lines {rust:?}) is compiled by {by:?}: include it in exactly one \
                 crate of docs/snippets whose dependencies are the page's block",
                page.display()
            ));
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

#[test]
fn every_code_block_says_its_language() {
    // An untagged block is compiled as Rust by rustdoc: a shell command there fails the
    // build, and a Rust snippet there reads as plain text on the page.
    let mut untagged = Vec::new();
    for page in pages() {
        for f in fences(&fs::read_to_string(&page).unwrap()) {
            if f.info.is_empty() {
                untagged.push(format!("{}:{}", page.display(), f.line));
            }
        }
    }
    assert!(untagged.is_empty(), "untagged code blocks: {untagged:?}");
}

#[test]
fn each_snippet_crate_depends_on_exactly_the_block_its_pages_show() {
    let workspace: Table =
        toml::from_str(&fs::read_to_string(root().join("Cargo.toml")).unwrap()).unwrap();
    let version = workspace["workspace"]["package"]["version"]
        .as_str()
        .unwrap()
        .to_owned();
    for (dir, manifest, pages) in snippet_crates() {
        let name = dir.display();
        for section in ["dev-dependencies", "build-dependencies", "target"] {
            assert!(
                !manifest.contains_key(section),
                "{name}: [{section}] would add to what the snippets see"
            );
        }
        // The manifest's dependencies without the `path`s that stand for the registry.
        let mut deps: BTreeMap<String, Table> = BTreeMap::new();
        for (dep, spec) in manifest["dependencies"].as_table().unwrap() {
            let mut spec = normalised(spec);
            if let Some(path) = spec.remove("path") {
                let path = dir.join(path.as_str().unwrap());
                assert!(
                    path.join("Cargo.toml").is_file(),
                    "{name}: {dep}'s path {} is not a crate",
                    path.display()
                );
                let req = spec.get("version").and_then(Value::as_str).unwrap_or("");
                assert!(
                    version.starts_with(req) && !req.is_empty(),
                    "{name}: {dep} = \"{req}\" does not admit the workspace's version {version}"
                );
            }
            deps.insert(dep.clone(), spec);
        }
        assert!(!pages.is_empty(), "{name} includes no page");
        for page in pages {
            let block = dependency_block(&page).unwrap_or_else(|| {
                panic!(
                    "{} has Rust snippets but no [dependencies] block",
                    page.display()
                )
            });
            let shown: BTreeMap<String, Table> = block
                .iter()
                .map(|(dep, spec)| (dep.clone(), normalised(spec)))
                .collect();
            assert_eq!(
                shown,
                deps,
                "{}'s dependency block (left) differs from {name}/Cargo.toml (right)",
                page.display()
            );
        }
    }
}
