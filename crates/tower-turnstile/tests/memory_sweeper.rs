//! `MemoryBackend::spawn_sweeper`: expired keys go on a timer, without traffic, in virtual
//! time (`tokio::time::pause`) on a manual clock.

mod support;

use std::time::Duration;

use support::settle;
use tower_turnstile::{Backend, ManualClock, MemoryBackend, Policy, SpawnSweeperError};

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
