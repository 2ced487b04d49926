//! `turnstile check-config`: the example file's effective rules, and broken files named by
//! line and field.

use std::process::{Command, Output};

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_turnstile"))
        .args(args)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .output()
        .expect("the turnstile binary runs")
}

fn text(bytes: &[u8]) -> &str {
    std::str::from_utf8(bytes).expect("UTF-8 output")
}

#[test]
fn the_example_file_prints_its_effective_rules() {
    let out = run(&["check-config", "examples/turnstile.toml"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        r#"examples/turnstile.toml: valid
key: client-ip
  client-ip: the client's IP behind the trusted proxies (192.0.2.1; IPv6 by network, 2001:db8:1:2::/64)
  trusted proxies: 10.0.0.0/8
  forwarding header: the first present of forwarded, x-forwarded-for, x-real-ip
action: reject
on missing key: reject
keys without override or tier: the rule's policies
headers: RateLimit on admitted responses: yes; legacy X-RateLimit-*: no
keys in logs: hashed
backend: redis redis://127.0.0.1:6379, prefix turnstile:v1, timeout 100ms
on backend failure: local (decide in memory on each process; what that cannot decide is admitted)
rules (the first that matches applies):
  1. GET /healthz: exempt
  2. POST /login (rule "login"), cost 1:
       "login-per-ip" sliding-log:limit=5,period=1m
  3. /api/*, cost 2:
       "api-per-ip" token-bucket:limit=100,period=1m,burst=20
       "api-hourly" sliding-window:limit=2000,period=1h
  4. grpc helloworld.Greeter/SayHello, cost 1:
       "greeter-per-ip" token-bucket:limit=5,period=1m
  otherwise, cost 1:
       "per-ip" token-bucket:limit=10,period=1m
tiers (for keys set to the tier, each policy a tier names takes its parameters; every other stays in force):
  pro:
       "per-ip" token-bucket:limit=1000,period=1m
       "api-per-ip" token-bucket:limit=1000,period=1m,burst=100
"#
    );
    assert!(out.stderr.is_empty());
}

#[test]
fn a_combined_key_and_shadow_mode() {
    let dir = std::env::temp_dir().join(format!("turnstile-check-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("combined.toml");
    std::fs::write(
        &file,
        "key = [\"header:X-Api-Key\", \"ip\"]\nipv6_prefix = 56\naction = \"shadow\"\n\
         on_missing_key = { key = \"anonymous\" }\npolicies = [\"sliding-window:limit=300,period=1m\"]\n",
    )
    .unwrap();
    let out = run(&["check-config", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    for line in [
        "key: [\"header:x-api-key\", \"ip\"]\n",
        "  header:x-api-key: the value of the x-api-key header (% and bytes outside printable ASCII percent-encoded)\n",
        "  stored as the parts joined with |\n",
        "  IPv6 grouped by /56\n",
        "action: shadow (count and log, admit everything)\n",
        "on missing key: count under the key \"anonymous\"\n",
        "backend: in memory\n",
        "  otherwise, cost 1:\n       \"sliding-window:limit=300,period=1m\" sliding-window:limit=300,period=1m\n",
    ] {
        assert!(stdout.contains(line), "missing {line:?} in\n{stdout}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_broken_file_is_named_by_line_and_field() {
    let dir =
        std::env::temp_dir().join(format!("turnstile-check-config-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("turnstile.toml");
    std::fs::write(
        &file,
        "policies = [\"gcra:limit=10,period=1s\"]\n\n[[rules]]\npath = \"/a\"\npolicies = [\"gcra:limit=1,period=1s\"]\n\n[[rules]]\npath = \"/b\"\npolicies = [\"fixed-window:limit=0,period=1s\"]\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_turnstile"))
        .args(["check-config", "turnstile.toml"])
        .current_dir(&dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    assert_eq!(
        text(&out.stderr),
        "error: turnstile.toml:9:13: rules[1].policies[0]: limit 0 is out of range (1 to 4294967295)\n  |\n9 | policies = [\"fixed-window:limit=0,period=1s\"]\n  |             ^\n"
    );
    let missing = run(&["check-config", "no/such/file.toml"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(text(&missing.stderr).starts_with("error: no/such/file.toml: cannot read the file: "));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_route_key_is_valid_though_the_cli_is_built_without_axum() {
    // The services that read the file are built with axum; the checker is not.
    let dir = std::env::temp_dir().join(format!("turnstile-route-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("route.toml");
    std::fs::write(
        &file,
        "key = \"route\"\npolicies = [\"gcra:limit=5,period=1s,name=per-route\"]\n",
    )
    .unwrap();
    let out = run(&["check-config", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("key: route\n  route: the matched route (/users/{id})\n"),
        "{}",
        text(&out.stdout)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Issue 24, trap 1: a tier naming a policy no rule uses changes nothing: refused, at its line.
/// Issue 25, fault 4: a rule of more than `MAX_POLICIES` policies is refused.
#[test]
fn a_tier_naming_no_rules_policy_and_a_huge_rule_are_refused() {
    let dir = std::env::temp_dir().join(format!(
        "turnstile-check-config-tiers-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("tiers.toml");
    std::fs::write(
        &file,
        "policies = [\"token-bucket:limit=10,period=1m,name=per-ip\"]\n[tiers]\npro = [\"token-bucket:limit=100,period=1m,name=per_ip\"]\n",
    )
    .unwrap();
    let out = run(&["check-config", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("tier \"pro\" lists policy \"per_ip\""),
        "{err}"
    );
    assert!(err.contains(":3:"), "{err}");

    let many: Vec<String> = (0..1000)
        .map(|i| format!("\"fixed-window:limit=5,period=1m,name=p{i}\""))
        .collect();
    std::fs::write(&file, format!("policies = [{}]\n", many.join(", "))).unwrap();
    let out = run(&["check-config", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("1000 policies, more than the 512"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}
