//! `quickstart --config examples/turnstile.toml`, served for real on 127.0.0.1 and asked
//! over TCP, enforces the file's rules.

mod common;

use common::{http, serve};

#[allow(dead_code)]
#[path = "../quickstart.rs"]
mod quickstart;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quickstart_enforces_a_config_file() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/turnstile.toml");
    let config = tower_turnstile::config::LayerConfig::from_file(path).unwrap();
    let addr = serve(quickstart::app(Some((std::path::Path::new(path), &config))).unwrap()).await;
    let mut statuses = Vec::new();
    for _ in 0..11 {
        statuses.push(http(addr, "GET", "/").await.0);
    }
    // The file's "per-ip": 10 per 60 s.
    assert_eq!(statuses.iter().filter(|&&s| s == 200).count(), 10);
    assert_eq!(statuses[10], 429);
    // /healthz is exempt in the file (the quickstart has no such route: 404, never 429).
    for _ in 0..3 {
        assert_eq!(http(addr, "GET", "/healthz").await.0, 404);
    }
    // Without a file, the built-in policy.
    let addr = serve(quickstart::app(None).unwrap()).await;
    assert_eq!(http(addr, "GET", "/").await.0, 200);
}
