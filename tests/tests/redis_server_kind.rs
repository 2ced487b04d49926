//! The test servers are the ones asked for: `scripts/test` runs the Redis-backed tests a second
//! time with `TURNSTILE_TEST_SERVER` naming a `valkey-server`, and that pass must run on Valkey,
//! not silently on a `redis-server` again.

use turnstile_tests::redis_server::{query, RedisServer};

#[test]
fn the_servers_started_are_the_program_asked_for() {
    let server = RedisServer::start();
    let info = query(server.port(), "INFO server").expect("INFO server");
    let asked = std::env::var("TURNSTILE_TEST_SERVER").unwrap_or_default();
    let valkey = info.lines().any(|l| l.starts_with("valkey_version:"));
    if asked.contains("valkey") {
        assert!(
            valkey,
            "TURNSTILE_TEST_SERVER={asked} but the server is not Valkey:\n{info}"
        );
    } else if asked.is_empty() {
        assert!(
            !valkey,
            "without TURNSTILE_TEST_SERVER the tests start redis-server:\n{info}"
        );
    }
    let version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .expect("every server reports redis_version");
    eprintln!("test server: {asked:?} reports redis_version {version}, valkey: {valkey}");
}
