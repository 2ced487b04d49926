//! The Redis Function library (issue 15): loaded once per node, reloaded after a flush, a
//! restart or a failover, EVALSHA where Functions are refused, older releases' libraries
//! removed — against real `redis-server` processes these tests start themselves.

use std::sync::Arc;
use std::time::Duration;

use turnstile_core::{Backend, BackendError, Policy, Quotas};
use turnstile_redis::{library, redis, RedisBackend, ScriptMode};
use turnstile_tests::proxy::Proxy;
use turnstile_tests::redis_server::{
    command, command_calls, query, start_replica, wait_for, wait_replicated, RedisCluster,
    RedisServer,
};

fn prefix(test: &str) -> String {
    format!("turnstile:test:fn:{test}:{}", std::process::id())
}

fn p(spec: &str) -> Policy {
    spec.parse().unwrap()
}

fn backend(url: &str, test: &str, mode: ScriptMode) -> RedisBackend {
    RedisBackend::builder(url)
        .prefix(prefix(test))
        .timeout(Duration::from_secs(5))
        .script_mode(mode)
        .build()
        .unwrap()
}

fn ok(reply: std::io::Result<String>) {
    let r = reply.unwrap();
    assert!(r.starts_with('+'), "{r}");
}

/// The names of the server's Function libraries.
fn libraries(port: u16) -> Vec<String> {
    let mut conn = redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .get_connection()
        .unwrap();
    let reply: redis::Value = redis::cmd("FUNCTION").arg("LIST").query(&mut conn).unwrap();
    let redis::Value::Array(libs) = reply else {
        panic!("FUNCTION LIST: {reply:?}")
    };
    let mut names: Vec<String> = libs
        .iter()
        .map(|lib| {
            let redis::Value::Array(kv) = lib else {
                panic!("{lib:?}")
            };
            redis::from_redis_value(kv[1].clone()).unwrap()
        })
        .collect();
    names.sort();
    names
}

/// Loads a library named `name` with one function, `<name>_f`.
fn load_fake_library(port: u16, name: &str) {
    let source = format!(
        "#!lua name={name}\nredis.register_function('{name}_f', function() return 1 end)\n"
    );
    let mut conn = redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .get_connection()
        .unwrap();
    let loaded: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(source)
        .query(&mut conn)
        .unwrap();
    assert_eq!(loaded, name);
}

/// The outcomes of `n` checks of cost 1 in a row: `Ok(remaining)` when admitted, `Err(..)`
/// when denied.
async fn run(b: &RedisBackend, key: &str, pol: &[Policy], n: usize) -> Vec<Result<u64, ()>> {
    let mut out = Vec::new();
    for _ in 0..n {
        let d = b.check(key, pol, 1).await.unwrap();
        out.push(if d.allowed() {
            Ok(d.remaining())
        } else {
            Err(())
        });
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_library_is_loaded_once_and_every_call_is_an_fcall() {
    let server = RedisServer::start();
    let b = backend(&server.url(), "once", ScriptMode::Auto);
    let pol = [p("fixed-window:limit=3,period=1h,name=w")];
    assert_eq!(run(&b, "k", &pol, 4).await, [Ok(2), Ok(1), Ok(0), Err(())]);
    // Configuration operations take the same path.
    b.set_override("k", &[p("fixed-window:limit=5,period=1h,name=w")])
        .await
        .unwrap();
    assert_eq!(run(&b, "k", &pol, 3).await, [Ok(1), Ok(0), Err(())]);
    let lib = library();
    assert_eq!(libraries(server.port()), [lib.name().to_owned()]);
    assert_eq!(command_calls(server.port(), "function|load"), 1);
    assert_eq!(command_calls(server.port(), "fcall"), 8);
    assert_eq!(command_calls(server.port(), "evalsha"), 0);
    assert_eq!(command_calls(server.port(), "script|load"), 0);
    assert_eq!(b.stats().script_loads, 1);
    // A second backend (another process) finds the library there and loads nothing.
    let other = backend(&server.url(), "once", ScriptMode::Auto);
    assert_eq!(run(&other, "k", &pol, 1).await, [Err(())]);
    assert_eq!(other.stats().script_loads, 0);
    assert_eq!(command_calls(server.port(), "function|load"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_that_refuses_functions_falls_back_to_evalsha() {
    let server = RedisServer::start();
    let pol = [p("fixed-window:limit=3,period=1h,name=w")];
    // Without FUNCTION (no FUNCTION LOAD): EVALSHA from the first call. Without FCALL (the
    // library loads, the call is refused): EVALSHA from the refused call on.
    for (user, rule) in [("nofunction", "-function"), ("nofcall", "-fcall")] {
        ok(command(
            server.port(),
            &format!("ACL SETUSER {user} on >pw ~* &* +@all {rule}"),
        ));
        ok(command(server.port(), "CONFIG RESETSTAT"));
        let url = format!("redis://{user}:pw@127.0.0.1:{}", server.port());
        let b = backend(&url, user, ScriptMode::Auto);
        assert_eq!(
            run(&b, "k", &pol, 4).await,
            [Ok(2), Ok(1), Ok(0), Err(())],
            "{user}"
        );
        b.set_override("k", &[p("fixed-window:limit=5,period=1h,name=w")])
            .await
            .unwrap();
        assert_eq!(
            run(&b, "k", &pol, 3).await,
            [Ok(1), Ok(0), Err(())],
            "{user}"
        );
        assert_eq!(command_calls(server.port(), "fcall"), 0, "{user}");
        assert!(command_calls(server.port(), "evalsha") >= 8, "{user}");
        // One FUNCTION LOAD sent (refused, or loaded and then FCALL refused), then the
        // check and configuration scripts loaded for EVALSHA.
        assert_eq!(b.stats().script_loads, 3, "{user}");
        ok(command(server.port(), "SCRIPT FLUSH"));
        ok(command(server.port(), "FUNCTION FLUSH"));
    }
}

/// Checks of a fixed window of `limit` from `tasks` tasks at once, `per_task` each, while
/// `flush` empties the server's library or scripts `rounds` times: every check decided, no
/// error, exactly `limit` admitted.
async fn flushes_under_load(mode: ScriptMode, flush: &'static str) {
    let server = RedisServer::start();
    let b = backend(&server.url(), &format!("flush{mode:?}"), mode);
    let (tasks, per_task, rounds, limit) = (8, 5, 10, 200);
    let pol: Arc<[Policy]> =
        Arc::from([p(&format!("fixed-window:limit={limit},period=1h,name=w"))]);
    let mut admitted = 0;
    let mut flusher = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    for _ in 0..rounds {
        let mut checks = Vec::new();
        for _ in 0..tasks {
            let (b, pol) = (b.clone(), Arc::clone(&pol));
            checks.push(tokio::spawn(async move {
                let mut out = Vec::new();
                for _ in 0..per_task {
                    out.push(b.check("k", &pol, 1).await);
                }
                out
            }));
        }
        // The flush goes out while the round's checks run.
        let words: Vec<&str> = flush.split(' ').collect();
        let flushed: String = redis::cmd(words[0])
            .arg(words[1])
            .query_async(&mut flusher)
            .await
            .unwrap();
        assert_eq!(flushed, "OK");
        for c in checks {
            for r in c.await.unwrap() {
                let d = r.unwrap_or_else(|e: BackendError| panic!("{mode:?}: {e}"));
                admitted += u64::from(d.allowed());
            }
        }
    }
    assert_eq!(admitted, limit, "{mode:?}");
    let loads = b.stats().script_loads;
    // Every round after the first begins with the library or script gone: reloaded.
    assert!(loads >= rounds, "{mode:?}: {loads} loads");
    let (fcall, evalsha) = (
        command_calls(server.port(), "fcall"),
        command_calls(server.port(), "evalsha"),
    );
    // Every call the backend made (fewer than the 400 checks when checks of the key were
    // coalesced) ran through the mode's command.
    let calls = b.stats().redis_calls;
    match mode {
        ScriptMode::Auto => assert!(fcall >= calls && evalsha == 0, "{fcall} {evalsha}"),
        _ => assert!(evalsha >= calls && fcall == 0, "{fcall} {evalsha}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn function_flush_under_load_reloads_and_every_request_is_decided() {
    flushes_under_load(ScriptMode::Auto, "FUNCTION FLUSH").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_under_load_reloads_and_every_request_is_decided() {
    flushes_under_load(ScriptMode::Eval, "SCRIPT FLUSH").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_and_restarted_redis_gets_the_library_again() {
    for mode in [ScriptMode::Auto, ScriptMode::Eval] {
        let mut server = RedisServer::start();
        let b = RedisBackend::builder(server.url())
            .prefix(prefix("restart"))
            .timeout(Duration::from_secs(2))
            .retry_interval(Duration::ZERO)
            .script_mode(mode)
            .build()
            .unwrap();
        let pol = [p("fixed-window:limit=3,period=1h,name=w")];
        assert_eq!(run(&b, "k", &pol, 2).await, [Ok(2), Ok(1)]);
        // kill -9 and start again, without persistence: no library, no script, no state.
        server.restart();
        let mut first = b.check("k", &pol, 1).await;
        if first.is_err() {
            // A RESP2 connection learns it is closed from the call that fails on it.
            first = b.check("k", &pol, 1).await;
        }
        assert_eq!(first.unwrap().remaining(), 2, "{mode:?}");
        assert_eq!(run(&b, "k", &pol, 3).await, [Ok(1), Ok(0), Err(())]);
        let fcall = command_calls(server.port(), "fcall");
        match mode {
            ScriptMode::Auto => {
                assert_eq!(fcall, 4, "{mode:?}");
                assert_eq!(libraries(server.port()), [library().name().to_owned()]);
            }
            _ => {
                assert_eq!(fcall, 0, "{mode:?}");
                assert!(libraries(server.port()).is_empty());
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_replica_without_the_library_gets_it() {
    let a = RedisServer::start();
    let b = start_replica(a.port(), &[]);
    let proxy = Proxy::start(a.port());
    let backend = backend(&proxy.url(), "promote", ScriptMode::Auto);
    let pol = [p("token-bucket:limit=100,period=1h,name=t")];
    assert_eq!(run(&backend, "k", &pol, 3).await, [Ok(99), Ok(98), Ok(97)]);
    wait_replicated(a.port(), b.port(), Duration::from_secs(10));
    // B is promoted, A demoted, the address leads to B — and B has no library (a replica
    // whose copy predates it, or one an operator flushed).
    ok(command(b.port(), "REPLICAOF NO ONE"));
    ok(command(b.port(), "FUNCTION FLUSH"));
    ok(command(
        a.port(),
        &format!("REPLICAOF 127.0.0.1 {}", b.port()),
    ));
    proxy.repoint(b.port());
    wait_for(Duration::from_secs(10), "A to refuse writes", || {
        command(a.port(), "SET x 1").is_ok_and(|r| r.starts_with("-READONLY"))
    });
    // Not one error: READONLY on the old connection, a fresh one to B, the library loaded
    // there, the state B replicated.
    assert_eq!(run(&backend, "k", &pol, 3).await, [Ok(96), Ok(95), Ok(94)]);
    assert_eq!(libraries(b.port()), [library().name().to_owned()]);
    assert_eq!(command_calls(b.port(), "fcall"), 3);
    assert_eq!(command_calls(b.port(), "evalsha"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_cluster_master_gets_the_library_and_reloads_it_alone() {
    let cluster = RedisCluster::start(3);
    let b = backend(&cluster.urls(), "cluster", ScriptMode::Auto);
    let pol = [p("sliding-window:limit=2,period=1h,name=s")];
    // One key on each master.
    let mut keys = vec![None; 3];
    for i in 0.. {
        let key = format!("client-{i}");
        let node = cluster.node_of_key(&b.state_key(&key));
        keys[node].get_or_insert(key);
        if keys.iter().all(Option::is_some) {
            break;
        }
    }
    let keys: Vec<String> = keys.into_iter().map(Option::unwrap).collect();
    for k in &keys {
        assert_eq!(run(&b, k, &pol, 3).await, [Ok(1), Ok(0), Err(())], "{k}");
    }
    for n in cluster.nodes() {
        assert_eq!(libraries(n.port()), [library().name().to_owned()]);
        // 3, or 4 when the first went out before the backend knew the slot's master (an
        // FCALL at once, "Function not found", the load, the FCALL again).
        let fcall = command_calls(n.port(), "fcall");
        assert!((3..=4).contains(&fcall), "{}: {fcall}", n.port());
        assert_eq!(command_calls(n.port(), "evalsha"), 0, "{}", n.port());
    }
    // One master loses the library: its keys reload it there, the others load nothing.
    ok(command(cluster.nodes()[1].port(), "FUNCTION FLUSH"));
    let loads = b.stats().script_loads;
    for k in &keys {
        assert_eq!(run(&b, k, &pol, 1).await, [Err(())], "{k}");
    }
    assert_eq!(b.stats().script_loads, loads + 1);
    assert_eq!(
        libraries(cluster.nodes()[1].port()),
        [library().name().to_owned()]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn older_releases_libraries_are_deleted_newer_ones_kept() {
    let server = RedisServer::start();
    let ours = library().name().to_owned();
    let release: u64 = ours
        .strip_prefix("turnstile_")
        .and_then(|r| r.split('_').next())
        .unwrap()
        .parse()
        .unwrap();
    let older = format!("turnstile_{}_0ld", release - 1);
    let newer = format!("turnstile_{}_new", release + 1);
    let sibling = format!("turnstile_{release}_0ther"); // this release, other code
    for name in [&older, &newer, &sibling, &"someone_else".to_owned()] {
        load_fake_library(server.port(), name);
    }
    let b = backend(&server.url(), "supersede", ScriptMode::Auto);
    let pol = [p("fixed-window:limit=9,period=1h,name=w")];
    assert_eq!(run(&b, "k", &pol, 1).await, [Ok(8)]);
    let mut want = vec![
        ours.clone(),
        newer.clone(),
        sibling.clone(),
        "someone_else".to_owned(),
    ];
    want.sort();
    assert_eq!(libraries(server.port()), want);
    // During a rolling deploy the older release reloads its own library on "Function not
    // found": this release deletes it only at its first load on a node, so it stays.
    load_fake_library(server.port(), &older);
    assert_eq!(run(&b, "k", &pol, 3).await, [Ok(7), Ok(6), Ok(5)]);
    want.push(older);
    want.sort();
    assert_eq!(libraries(server.port()), want);
    // The newer release's library deleted (by an operator, say): ours still works.
    ok(command(server.port(), &format!("FUNCTION DELETE {newer}")));
    assert_eq!(run(&b, "k", &pol, 1).await, [Ok(4)]);
    assert!(query(server.port(), "PING").unwrap().starts_with("+PONG"));
}
