//! Each publishable crate's package (`cargo package --list`) carries what the registry and a
//! build from it need: both license files, the crate's README, and for `turnstile-redis`
//! every Lua script its source includes.

use std::fs;
use std::path::Path;
use std::process::Command;

fn listed(krate: &str) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let out = Command::new(env!("CARGO"))
        .args([
            "package",
            "--list",
            "--allow-dirty",
            "--locked",
            "-p",
            krate,
        ])
        .current_dir(root)
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo package --list -p {krate}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_package_carries_its_licenses_and_readme() {
    for krate in [
        "tower-turnstile",
        "turnstile-core",
        "turnstile-redis",
        "turnstile-cli",
    ] {
        let files = listed(krate);
        for want in [
            "LICENSE-MIT",
            "LICENSE-APACHE",
            "README.md",
            "Cargo.toml",
            "src/lib.rs",
        ] {
            let want = if krate == "turnstile-cli" && want == "src/lib.rs" {
                "src/main.rs"
            } else {
                want
            };
            assert!(
                files.iter().any(|f| f == want),
                "{krate}'s package lacks {want}: {files:?}"
            );
        }
    }
}

#[test]
fn the_redis_package_carries_every_script_its_source_includes() {
    let files = listed("turnstile-redis");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates/turnstile-redis/src");
    let mut included = Vec::new();
    includes(&src, Path::new("src"), &mut included);
    assert!(
        included.iter().any(|f| f == "lua/check.lua"),
        "no script found: {included:?}"
    );
    for script in included {
        assert!(
            files.contains(&script),
            "turnstile-redis's package lacks {script}, which its source includes"
        );
    }
}

/// Every file the sources below `dir` (the crate's `at`) include with `include_str!`, as a
/// path from the crate's root (`lua/check.lua`), read lexically (`lua` is a link).
fn includes(dir: &Path, at: &Path, found: &mut Vec<String>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = at.join(path.file_name().unwrap());
        if path.is_dir() {
            includes(&path, &name, found);
            continue;
        }
        let text = fs::read_to_string(&path).unwrap();
        for rest in text.split("include_str!(\"").skip(1) {
            let mut parts: Vec<&str> = at.iter().map(|p| p.to_str().unwrap()).collect();
            for part in rest[..rest.find('"').unwrap()].split('/') {
                match part {
                    ".." => {
                        parts.pop();
                    }
                    part => parts.push(part),
                }
            }
            found.push(parts.join("/"));
        }
    }
}
