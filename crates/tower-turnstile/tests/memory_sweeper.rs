//! `MemoryBackend::spawn_sweeper`: expired keys go on a timer, without traffic, in virtual
//! time (`tokio::time::pause`) on a manual clock; the layer's own in-memory backend and a
//! backend built with `sweep_every` start theirs by themselves.

mod support;

use std::time::Duration;

use support::{hello, settle};
use tower::{service_fn, Layer, ServiceExt};
use tower_turnstile::key::HeaderKey;
use tower_turnstile::{
    Backend, Clock, ManualClock, MemoryBackend, Policy, RateLimitLayer, SpawnSweeperError,
    SystemClock,
};

/// Tasks alive on the current runtime.
fn tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

/// A request from the client `id` (keyed by its `x-client` header).
fn from_client(id: usize) -> http::Request<()> {
    http::Request::builder()
        .uri("/")
        .header("x-client", format!("c{id}"))
        .body(())
        .unwrap()
}

/// Regression (issue 25, fault 7): a flood of one-off clients on a layer's default in-memory
/// backend left their keys (and the memory they took) in place until more traffic came. The
/// backend now starts a sweeper of its own on the first key, which drops them without any
/// request, and ends once the layer is gone.
#[tokio::test(start_paused = true)]
async fn the_layers_own_memory_drops_a_floods_keys_without_traffic() {
    // One request takes a client's only token: fresh again 1 s later.
    let layer = RateLimitLayer::builder()
        .key(HeaderKey::named("x-client").unwrap())
        .policy("token-bucket:limit=1,period=1s".parse::<Policy>().unwrap())
        .build()
        .unwrap();
    let backend = layer.backend_ref().clone();
    let svc = layer.layer(service_fn(hello));
    let before = tasks();
    for id in 0..1000 {
        let res = svc.clone().oneshot(from_client(id)).await.unwrap();
        assert_eq!(res.status(), 200);
    }
    let flood_ended = SystemClock.now_ms();
    assert_eq!(backend.len(), 1000);
    assert_eq!(tasks(), before + 1, "the first key started the sweeper");

    // The backend measures time on the system clock: every key is fresh again once it has
    // moved 1 s past the flood's end (a wait for that reading, not for a task).
    while SystemClock.now_ms() <= flood_ended + 1000 {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        backend.len(),
        1000,
        "nothing sweeps before the sweeper's tick"
    );
    // The sweeper's next tick, in virtual time, with no request at all.
    tokio::time::advance(Duration::from_secs(1)).await;
    settle().await;
    assert_eq!(backend.len(), 0);

    // The sweeper ends with the layer's backend.
    drop((svc, layer, backend));
    tokio::time::advance(Duration::from_secs(1)).await;
    settle().await;
    assert_eq!(tasks(), before);
}

/// A backend built with `sweep_every` starts its sweeper when its first key is added inside a
/// runtime, once, and never outside one.
#[tokio::test(start_paused = true)]
async fn sweep_every_starts_one_sweeper_with_the_first_key() {
    let clock = ManualClock::new(1_700_000_000_000);
    let backend = MemoryBackend::builder()
        .clock(clock.clone())
        .sweep_every(Duration::from_secs(2))
        .build();
    let per_minute = [Policy::token_bucket(10, Duration::from_secs(60)).unwrap()];
    let before = tasks();
    // Outside any runtime (a plain thread): no sweeper yet.
    let b = backend.clone();
    let p = per_minute.clone();
    std::thread::spawn(move || {
        assert!(b.check("outside", &p, 1).into_inner().unwrap().allowed());
    })
    .join()
    .unwrap();
    settle().await;
    assert_eq!(tasks(), before);
    for i in 0..100 {
        assert!(backend
            .check(&format!("client-{i}"), &per_minute, 1)
            .await
            .unwrap()
            .allowed());
    }
    settle().await;
    assert_eq!(tasks(), before + 1, "one sweeper, started by the first key");
    assert_eq!(backend.len(), 101);
    // Fresh 6 s later; the sweeps every 2 s drop them at the first tick after that.
    clock.advance(Duration::from_secs(6));
    tokio::time::advance(Duration::from_secs(2)).await;
    settle().await;
    assert_eq!(backend.len(), 0);
    drop(backend);
    tokio::time::advance(Duration::from_secs(2)).await;
    settle().await;
    assert_eq!(tasks(), before);
}

#[tokio::test(start_paused = true)]
async fn the_sweeper_drops_expired_keys_without_traffic_and_never_simulated_ones() {
    let clock = ManualClock::new(1_700_000_000_000);
    let backend = MemoryBackend::builder().clock(clock.clone()).build();
    let per_minute = [Policy::token_bucket(10, Duration::from_secs(60)).unwrap()];
    for i in 0..1000 {
        let d = backend
            .check(&format!("client-{i}"), &per_minute, 1)
            .await
            .unwrap();
        assert!(d.allowed());
        // One token of ten per minute: fresh again 6 s later.
        assert_eq!(d.reset_after(), Duration::from_secs(6));
    }
    // A simulation's keys, at trace time 0: never swept by the clock.
    for i in 0..10 {
        assert!(backend
            .check_at(&format!("sim-{i}"), &per_minute, 1, 0)
            .await
            .unwrap()
            .allowed());
    }
    let sweeper = backend.spawn_sweeper(Duration::from_secs(1)).unwrap();
    settle().await;
    assert_eq!(backend.len(), 1010);

    // 5 s later nothing has expired yet.
    clock.advance(Duration::from_secs(5));
    tokio::time::advance(Duration::from_secs(5)).await;
    settle().await;
    assert_eq!(backend.len(), 1010);
    // At 6 s every client key has; the next tick drops them all, with no request at all.
    clock.advance(Duration::from_secs(1));
    tokio::time::advance(Duration::from_secs(1)).await;
    settle().await;
    assert_eq!(backend.len(), 10, "only the simulation's keys are left");
    // The simulation's state is intact: at trace time 0 one token of ten was taken.
    assert_eq!(
        backend
            .check_at("sim-3", &per_minute, 0, 0)
            .await
            .unwrap()
            .remaining(),
        9
    );

    // The task ends by itself once the backend is gone.
    assert!(!sweeper.is_finished());
    drop(backend);
    tokio::time::advance(Duration::from_secs(1)).await;
    settle().await;
    assert!(sweeper.is_finished());
}

#[tokio::test]
async fn a_zero_interval_is_an_error() {
    assert_eq!(
        MemoryBackend::new()
            .spawn_sweeper(Duration::ZERO)
            .unwrap_err(),
        SpawnSweeperError::ZeroInterval
    );
}

#[test]
fn outside_a_runtime_is_an_error() {
    assert_eq!(
        MemoryBackend::new()
            .spawn_sweeper(Duration::from_secs(1))
            .unwrap_err(),
        SpawnSweeperError::NoRuntime
    );
}
