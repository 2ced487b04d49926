//! Each publishable crate's `rust-version` is true for the committed `Cargo.lock`: no
//! dependency it builds (normal and build dependencies, transitively, on this platform) needs
//! a newer Rust than the crate declares — with its default features, with none, and with
//! each feature alone. A feature that needs more than the crate (tonic 0.14 needs 1.88, say)
//! says so in `[package.metadata.turnstile.feature-rust-version]`, and the README's table
//! repeats it.
//!
//! Which packages a crate builds with a feature set is asked of `cargo tree` (it resolves
//! features for that crate alone, as `cargo build -p` does); each package's own
//! `rust-version` comes from `cargo metadata`. Both run `--locked`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// A Rust version as `major.minor.patch` (missing parts are 0).
fn version(s: &str) -> (u64, u64, u64) {
    let mut parts = s
        .split('.')
        .map(|p| p.parse::<u64>().expect("a Rust version"));
    (
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
    )
}

fn cargo(args: &[&str]) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let out = Command::new(env!("CARGO"))
        .args(args)
        .current_dir(root)
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn host() -> String {
    let out = Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()))
        .arg("-vV")
        .output()
        .expect("rustc runs");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
        .expect("rustc -vV names the host")
}

struct Crate {
    name: String,
    declared: String,
    features: Vec<String>,
    by_feature: BTreeMap<String, String>,
}

#[test]
fn no_dependency_needs_a_newer_rust_than_its_crate_declares() {
    let metadata: Value = serde_json::from_str(&cargo(&[
        "metadata",
        "--locked",
        "--format-version",
        "1",
        "--filter-platform",
        &host(),
    ]))
    .unwrap();
    let packages = metadata["packages"].as_array().unwrap();
    // (name, version) → rust-version, for every package of the lock on this platform.
    let rust_version: BTreeMap<(String, String), Option<String>> = packages
        .iter()
        .map(|p| {
            (
                (
                    p["name"].as_str().unwrap().to_owned(),
                    p["version"].as_str().unwrap().to_owned(),
                ),
                p["rust_version"].as_str().map(str::to_owned),
            )
        })
        .collect();
    let members: BTreeSet<&str> = metadata["workspace_members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    let publishable: Vec<Crate> = packages
        .iter()
        .filter(|p| members.contains(p["id"].as_str().unwrap()))
        // `publish = false` is an empty list of registries.
        .filter(|p| p["publish"].as_array().is_none_or(|r| !r.is_empty()))
        .map(|p| Crate {
            name: p["name"].as_str().unwrap().to_owned(),
            declared: p["rust_version"]
                .as_str()
                .unwrap_or_else(|| panic!("{} declares no rust-version", p["name"]))
                .to_owned(),
            features: p["features"]
                .as_object()
                .unwrap()
                .keys()
                .filter(|f| *f != "default")
                .cloned()
                .collect(),
            by_feature: p["metadata"]["turnstile"]["feature-rust-version"]
                .as_object()
                .map(|t| {
                    t.iter()
                        .map(|(f, v)| (f.clone(), v.as_str().unwrap().to_owned()))
                        .collect()
                })
                .unwrap_or_default(),
        })
        .collect();
    let names: BTreeSet<&str> = publishable.iter().map(|c| c.name.as_str()).collect();
    for want in [
        "tower-turnstile",
        "turnstile-core",
        "turnstile-redis",
        "turnstile-cli",
    ] {
        assert!(names.contains(want), "{want} is not a publishable member");
    }

    let mut wrong = Vec::new();
    for krate in &publishable {
        for feature in krate.by_feature.keys() {
            assert!(
                krate.features.contains(feature),
                "{}: feature-rust-version names `{feature}`, which is no feature",
                krate.name
            );
        }
        let mut sets: Vec<(String, Vec<&str>)> = vec![
            ("default features".into(), vec![]),
            ("no features".into(), vec!["--no-default-features"]),
        ];
        for f in &krate.features {
            sets.push((
                format!("feature `{f}`"),
                vec!["--no-default-features", "--features", f],
            ));
        }
        for (label, flags) in sets {
            let mut args = vec![
                "tree",
                "--locked",
                "-p",
                &krate.name,
                "-e",
                "normal,build",
                "--prefix",
                "none",
                "--format",
                "{p}",
            ];
            args.extend(flags.iter().copied());
            let allowed = flags
                .last()
                .filter(|_| flags.len() == 3)
                .and_then(|f| krate.by_feature.get(*f))
                .unwrap_or(&krate.declared);
            for line in cargo(&args).lines() {
                let mut words = line.split_whitespace();
                let (Some(name), Some(v)) = (words.next(), words.next()) else {
                    continue;
                };
                if name == krate.name {
                    continue;
                }
                let key = (name.to_owned(), v.trim_start_matches('v').to_owned());
                let Some(Some(needs)) = rust_version.get(&key) else {
                    continue;
                };
                if version(needs) > version(allowed) {
                    wrong.push(format!(
                        "{} with {label} declares Rust {allowed}, but {name} {} needs {needs}",
                        krate.name, key.1
                    ));
                }
            }
        }
    }
    wrong.sort();
    wrong.dedup();
    assert!(
        wrong.is_empty(),
        "raise the crate's rust-version, or list the feature under \
         [package.metadata.turnstile.feature-rust-version] (and in the README):\n{}",
        wrong.join("\n")
    );
}
