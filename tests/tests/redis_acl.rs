//! The ACL of `docs/redis.md` (its "ACL" item) is enough: a Redis user granted exactly the
//! commands it lists, on exactly the key pattern it gives, runs every operation the backend
//! has — checks of every algorithm (admitted and denied, the fast path and the general one),
//! refunds, resets, overrides, tiers, configuration reads and clears — through Redis
//! Functions and through `EVALSHA`, with no error. The commands are read from the page
//! itself, so the two cannot drift apart; the optional `INFO` and `CONFIG GET` are not
//! granted (the backend skips its checks when they are refused).

use std::time::Duration;

use turnstile_core::{Backend, Limits, Policy, Quotas};
use turnstile_redis::{RedisBackend, ScriptMode};
use turnstile_tests::redis_server::RedisServer;

fn p(spec: &str) -> Policy {
    spec.parse().unwrap()
}

/// The backquoted ACL rules (`+...`) of the "ACL" item of `docs/redis.md`: those for Functions, those
/// for `EVALSHA`, and those of the commands the Lua calls; and the key pattern (`~...`).
fn readme_acl() -> (Vec<String>, Vec<String>, Vec<String>, String) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/redis.md");
    let readme = std::fs::read_to_string(path).unwrap();
    let start = readme
        .find("- **ACL**")
        .expect("docs/redis.md has an ACL item");
    let item = &readme[start..];
    let item = &item[..item[1..].find("\n- ").map_or(item.len(), |i| i + 1)];
    let quoted: Vec<&str> = item.split('`').skip(1).step_by(2).collect();
    let rules = |s: &str| -> Vec<String> { s.split_whitespace().map(str::to_owned).collect() };
    let with = |first: &str| {
        quoted
            .iter()
            .find(|q| q.starts_with(first))
            .unwrap_or_else(|| panic!("no `{first} ...` in the ACL item of docs/redis.md"))
    };
    let keys = quoted
        .iter()
        .find(|q| q.starts_with('~'))
        .expect("a key pattern in the ACL item of docs/redis.md");
    (
        rules(with("+fcall")),
        rules(with("+evalsha")),
        rules(with("+time")),
        (*keys).to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_acl_runs_every_operation_through_functions_and_evalsha() {
    let (functions, evalsha, lua, keys) = readme_acl();
    assert!(lua.iter().any(|r| r == "+psetex"), "{lua:?}");
    let user = |name: &str, own: &[String]| {
        let mut rules = vec![
            "ACL".to_owned(),
            "SETUSER".into(),
            name.into(),
            "on".into(),
            ">pw".into(),
            "resetkeys".into(),
            keys.clone(),
            "-@all".into(),
        ];
        rules.extend(own.iter().cloned());
        rules.extend(lua.iter().cloned());
        rules
    };
    let server = RedisServer::start();
    let url = server.url();
    let client = turnstile_redis::redis::Client::open(url.as_str()).unwrap();
    let mut admin = client.get_multiplexed_async_connection().await.unwrap();
    for (name, own) in [("fn", &functions), ("eval", &evalsha)] {
        let rules = user(name, own);
        let mut cmd = turnstile_redis::redis::cmd(&rules[0]);
        for r in &rules[1..] {
            cmd.arg(r);
        }
        let () = cmd.query_async(&mut admin).await.unwrap();
    }

    let every = [
        p("token-bucket:limit=3,period=1s,name=tb"),
        p("gcra:limit=3,period=1s,name=gcra"),
        p("leaky-bucket:limit=3,period=1s,name=leaky"),
        p("fixed-window:limit=3,period=1s,name=fixed"),
        p("sliding-window:limit=3,period=1s,name=sw"),
        p("sliding-log:limit=3,period=1s,name=log"),
    ];
    let limits = Limits::new(every[..1].to_vec())
        .unwrap()
        .with_tier("pro", every[1..3].to_vec())
        .unwrap();
    for (name, mode) in [("fn", ScriptMode::Auto), ("eval", ScriptMode::Eval)] {
        let b = RedisBackend::builder(format!("redis://{name}:pw@127.0.0.1:{}", server.port()))
            .timeout(Duration::from_secs(5))
            .script_mode(mode)
            .build()
            .unwrap();
        let what = format!("user {name} ({mode:?})");
        let t = 1_700_000_000_000u64;
        // Each algorithm alone (the fast path; the sliding log's general one), then all six
        // at once: admitted until the limit, then denied.
        for (i, pol) in every
            .iter()
            .map(std::slice::from_ref)
            .chain([&every[..]])
            .enumerate()
        {
            let key = format!("{name}-{i}");
            for n in 0..4u64 {
                let d = b.check_at(&key, pol, 1, t + n).await;
                let d = d.unwrap_or_else(|e| panic!("{what}, {key}, request {n}: {e}"));
                assert_eq!(d.allowed(), n < 3, "{what}, {key}, request {n}");
            }
        }
        // Configuration: an override, a tier, reads, a refund and a reset under each, a clear.
        let key = format!("{name}-cfg");
        b.set_override(&key, &every[3..5]).await.unwrap();
        let d = b.check_limits(&key, &limits, 1, Some(t)).await.unwrap();
        assert!(d.allowed(), "{what}: override");
        b.refund(&key, &limits, 1, Some(t)).await.unwrap();
        b.set_tier(&key, Some("pro")).await.unwrap();
        b.remove_override(&key).await.unwrap();
        let d = b.check_limits(&key, &limits, 1, Some(t)).await.unwrap();
        assert!(d.allowed(), "{what}: tier");
        assert_eq!(b.config(&key).await.unwrap().tier(), Some("pro"), "{what}");
        b.reset(&key, &limits, Some(t)).await.unwrap();
        b.clear_config(&key).await.unwrap();
        let d = b.check_limits(&key, &limits, 1, Some(t)).await.unwrap();
        assert!(d.allowed(), "{what}: cleared");
        // A refund and a reset of a client without configuration (a version bump alone).
        b.refund(&format!("{name}-0"), &limits, 1, Some(t))
            .await
            .unwrap();
        b.reset(&format!("{name}-1"), &limits, Some(t))
            .await
            .unwrap();
    }
}
