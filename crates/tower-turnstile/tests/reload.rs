//! Live reload of a layer built from a TOML file: limits changed under load, a bad file mid-run
//! and a changed `[backend]` are handled without losing a count.
#![cfg(feature = "config")]

mod support;

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use tower::{Layer, Service, ServiceExt};
use tower_turnstile::config::{ConfigReload, LayerConfig, ReloadError};
use tower_turnstile::{ManualClock, MemoryBackend};

/// A fresh directory for one test's file.
fn file(test: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("turnstile-reload-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("turnstile.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn request(peer: &str, api_key: Option<&str>) -> Request<()> {
    let mut r = support::request("GET", "/", peer);
    if let Some(k) = api_key {
        r.headers_mut().insert("x-api-key", k.parse().unwrap());
    }
    r
}

async fn hello(_: Request<()>) -> Result<Response<String>, Infallible> {
    Ok(Response::new(String::new()))
}

/// The layer of the file at `path`, in memory at a frozen time, made reloadable.
fn reloadable(
    path: &PathBuf,
) -> (
    tower_turnstile::RateLimitLayer<MemoryBackend<ManualClock>, tower_turnstile::config::ConfigKey>,
    ConfigReload<MemoryBackend<ManualClock>>,
) {
    let config = LayerConfig::from_file(path).unwrap();
    let layer = config
        .builder()
        .backend(MemoryBackend::builder().clock(ManualClock::new(0)).build())
        .build()
        .unwrap();
    ConfigReload::new(path, &config, layer)
}

fn policy_file(limit: u32) -> String {
    format!("policies = [\"fixed-window:limit={limit},period=1h,name=per-ip\"]\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_change_under_load_and_a_bad_file_mid_run_loses_nothing() {
    let path = file("load", &policy_file(100));
    let (layer, reload) = reloadable(&path);
    let svc = layer.layer(tower::service_fn(hello));
    let (admitted, denied, other) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (svc, admitted, denied, other, stop) = (
            svc.clone(),
            Arc::clone(&admitted),
            Arc::clone(&denied),
            Arc::clone(&other),
            Arc::clone(&stop),
        );
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let res = svc
                    .clone()
                    .oneshot(request("192.0.2.1:4000", None))
                    .await
                    .unwrap();
                match res.status().as_u16() {
                    200 => admitted.fetch_add(1, Ordering::Relaxed),
                    429 => denied.fetch_add(1, Ordering::Relaxed),
                    _ => other.fetch_add(1, Ordering::Relaxed),
                };
                tokio::task::yield_now().await;
            }
        }));
    }
    // Waits until `n` more denials have been answered.
    let denials_after = |n: u64| {
        let denied = Arc::clone(&denied);
        async move {
            let start = denied.load(Ordering::Relaxed);
            while denied.load(Ordering::Relaxed) < start + n {
                tokio::task::yield_now().await;
            }
        }
    };
    while admitted.load(Ordering::Relaxed) < 100 {
        tokio::task::yield_now().await;
    }
    denials_after(50).await;
    assert_eq!(admitted.load(Ordering::Relaxed), 100);

    // Raised to 150 under the same name while the load runs: the count carries over.
    std::fs::write(&path, policy_file(150)).unwrap();
    reload.reload().unwrap();
    while admitted.load(Ordering::Relaxed) < 150 {
        tokio::task::yield_now().await;
    }
    denials_after(50).await;
    assert_eq!(admitted.load(Ordering::Relaxed), 150);

    // A bad file: refused with the error check-config prints; the 150 stays in force.
    std::fs::write(
        &path,
        "policies = [\"fixed-window:limit=0,period=1h,name=per-ip\"]\n",
    )
    .unwrap();
    let want = LayerConfig::from_file(&path).unwrap_err().to_string();
    match reload.reload() {
        Err(e @ ReloadError::Invalid(_)) => assert_eq!(e.to_string(), want),
        other => panic!("{other:?}"),
    }
    assert_eq!(reload.current().policies()[0].limit(), 150);
    denials_after(50).await;

    // Lowered to 120: 150 already used, so nothing more is admitted.
    std::fs::write(&path, policy_file(120)).unwrap();
    reload.reload().unwrap();
    denials_after(50).await;

    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(admitted.load(Ordering::Relaxed), 150);
    assert_eq!(other.load(Ordering::Relaxed), 0);
    // The last responses carry the policy in force.
    let res = svc.oneshot(request("192.0.2.1:4000", None)).await.unwrap();
    assert_eq!(res.status(), 429);
    assert_eq!(res.headers()["ratelimit-policy"], "\"per-ip\";q=120;w=3600");
    assert_eq!(res.headers()["ratelimit"], "\"per-ip\";r=0;t=3600");
}

#[tokio::test]
async fn key_rules_tiers_and_action_are_swapped_and_the_shadow_count_survives() {
    let path = file(
        "swap",
        "action = \"shadow\"\npolicies = [\"fixed-window:limit=1,period=1h,name=per-ip\"]\n",
    );
    let (layer, reload) = reloadable(&path);
    let mut svc = layer.clone().layer(tower::service_fn(hello));
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let res = svc
            .ready()
            .await
            .unwrap()
            .call(request("192.0.2.1:4000", None))
            .await
            .unwrap();
        statuses.push(res.status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 200]);
    assert_eq!(layer.shadow_denied(), 2);

    // Same policy, still shadow: the count goes on from 2.
    std::fs::write(
        &path,
        "action = \"shadow\"\npolicies = [\"fixed-window:limit=1,period=1h,name=per-ip\"]\nlegacy_headers = true\n",
    )
    .unwrap();
    reload.reload().unwrap();
    let res = svc
        .ready()
        .await
        .unwrap()
        .call(request("192.0.2.1:4000", None))
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(layer.shadow_denied(), 3);

    // Keyed by an API key now, enforcing, an exempt path, a tier per request.
    std::fs::write(
        &path,
        r#"
key = "header:x-api-key"
tier_header = "x-plan"
policies = ["fixed-window:limit=1,period=1h,name=per-key"]
[tiers]
pro = ["fixed-window:limit=2,period=1h,name=per-key"]
[[rules]]
path = "/healthz"
exempt = true
"#,
    )
    .unwrap();
    reload.reload().unwrap();
    let mut got = Vec::new();
    for (key, plan, path) in [
        (Some("a"), None, "/"),
        (Some("a"), None, "/"),
        (Some("b"), Some("pro"), "/"),
        (Some("b"), Some("pro"), "/"),
        (Some("b"), Some("pro"), "/"),
        (None, None, "/"),
        (None, None, "/healthz"),
    ] {
        let mut req = request("192.0.2.1:4000", key);
        *req.uri_mut() = path.parse().unwrap();
        if let Some(plan) = plan {
            req.headers_mut().insert("x-plan", plan.parse().unwrap());
        }
        let res = svc.ready().await.unwrap().call(req).await.unwrap();
        got.push(res.status().as_u16());
    }
    assert_eq!(got, [200, 429, 200, 200, 429, 400, 200]);
    assert_eq!(layer.shadow_denied(), 3);
}

#[tokio::test]
async fn a_changed_backend_section_is_refused_and_needs_a_restart() {
    let path = file("backend", &policy_file(1));
    let (layer, reload) = reloadable(&path);
    let svc = layer.layer(tower::service_fn(hello));
    std::fs::write(
        &path,
        format!("{}[backend]\nmax_keys = 10\n", policy_file(5)),
    )
    .unwrap();
    let err = reload.reload().unwrap_err();
    assert!(matches!(err, ReloadError::BackendChanged { .. }), "{err:?}");
    assert!(err.to_string().contains("restart"), "{err}");
    let mut statuses = Vec::new();
    for _ in 0..2 {
        let res = svc
            .clone()
            .oneshot(request("192.0.2.1:4000", None))
            .await
            .unwrap();
        statuses.push(res.status().as_u16());
    }
    assert_eq!(statuses, [200, 429], "the limit of 1 stays in force");
    assert_eq!(reload.current().policies()[0].limit(), 1);
}

#[tokio::test(start_paused = true)]
async fn watch_reloads_when_the_file_changes() {
    let path = file("watch", &policy_file(1));
    let (_layer, reload) = reloadable(&path);
    let watcher = tokio::spawn(reload.clone().watch(Duration::from_secs(1)));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(reload.current().policies()[0].limit(), 1);
    std::fs::write(&path, policy_file(7)).unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(reload.current().policies()[0].limit(), 7);
    // A bad version is refused; a good one after it is taken.
    std::fs::write(&path, "policies = [").unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(reload.current().policies()[0].limit(), 7);
    std::fs::write(&path, policy_file(9)).unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(reload.current().policies()[0].limit(), 9);
    watcher.abort();
}
