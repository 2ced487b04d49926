//! The sliding log on Redis (algorithm id 5): the fast path (`lua/fast.lua`'s `fast_log`)
//! against the general path (`sliding_log.lua`, `check.lua`) and the memory backend.
//!
//! Each trace runs every operation three times: in memory (the reference for decisions), on
//! a Redis client key `A-<k>` that the fast path may decide (it is kept without a
//! configuration hash whenever the trace has configured nothing for it: a configuration
//! holding only a version expires after a day, which is dropped here at once), and on a
//! client key `B-<k>` that always holds a version in its configuration hash, so every check
//! takes the general path. After every operation both keys must hold the same state string
//! (but for its header), the same log entries, and expiry times that differ by no more than
//! the real time between the two calls; within each key every log with a line in the string
//! expires with the string, and its entries add up to the line's total, one per millisecond,
//! oldest first, none after the line's update.

mod harness;

use harness::*;
use std::time::Instant;

use turnstile_core::{Backend, Decision, Limits, MemoryBackend, Quotas};
use turnstile_redis::{redis, ScriptMode};
use turnstile_tests::redis_server::{RedisCluster, RedisServer};

/// The traces' seed: `TURNSTILE_SEED=n` runs another trace (the default is fixed, so a
/// failure repeats). Not every seed passes, for a reason outside the sliding log: the traces
/// run on explicit times, which step back now and then, and the two backends forget a state
/// at different moments. Memory drops a state once the trace's clock passes its
/// `reset_after`; Redis expires it on its own clock, and simulations give every key at least
/// 600 s (the least TTL). Both are what SEMANTICS.md allows (a backend *may* drop a state once
/// its `reset_after` has elapsed). They part only when the trace's clock then steps back to
/// before the moment memory dropped the state: Redis still holds it and decides on it (at its
/// last update's time when that is later; a sliding log's entries live again), memory as for a
/// fresh key. `TURNSTILE_SEED=13` reaches that at step 2,258 (decided at the update's time),
/// `TURNSTILE_SEED=24` at step 2,250 (a query 1 ms past the log's expiry, then a check 560 ms
/// before it: Redis denies on the entries, memory admits). The same holds for every
/// algorithm; with `SystemClock` on a live server no state outlives its `reset_after` by more
/// than a millisecond, so it does not arise there.
fn seed() -> u64 {
    std::env::var("TURNSTILE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x2545_f491_4f6c_dd1d)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dense_sliding_log_traces_store_on_the_fast_path_what_the_general_path_stores() {
    let server = RedisServer::start();
    for (i, mode) in [ScriptMode::Auto, ScriptMode::Eval].into_iter().enumerate() {
        let raw = Raw::single(&server);
        let trace = Trace {
            b: backend(&raw.seed_url(), "dense", mode, false),
            raw,
            memory: MemoryBackend::new(),
            seed: seed().rotate_left(7 * i as u32) | 1,
            slack: 0,
        };
        trace.run(2_500).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dense_sliding_log_traces_on_a_cluster_match_too() {
    let raw = Raw::cluster(RedisCluster::start(3));
    let trace = Trace {
        b: backend(&raw.seed_url(), "cluster", ScriptMode::Auto, true),
        raw,
        memory: MemoryBackend::new(),
        seed: seed().rotate_left(29) | 1,
        slack: 0,
    };
    trace.run(600).await;
}

/// Found by the trace above: a refund at a time before the key's last update (the clock
/// stepped back) is made at the last update's time; when it leaves nothing in use, Redis
/// drops the state, so the next request at the earlier time starts from that time, where
/// memory keeps the state (its expiry, the update's time, is after the clock) and decides
/// from the update's time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_before_the_last_update_that_empties_the_state_keeps_its_time() {
    let server = RedisServer::start();
    for mode in [ScriptMode::Auto, ScriptMode::Eval] {
        let b = backend(&server.url(), "refund-back", mode, false);
        let memory = MemoryBackend::new();
        for spec in [
            "token-bucket:limit=5,period=1s",
            "fixed-window:limit=5,period=1s",
            "sliding-window:limit=5,period=1s",
            "sliding-log:limit=5,period=1s",
        ] {
            let limits = Limits::new([p(spec)]).unwrap();
            let key = format!("k-{spec}");
            let mut steps = Vec::new();
            for (op, t, cost) in [
                ("check", 1_000, 1),
                ("refund", 500, 1),
                ("check", 500, 5),
                ("check", 1_400, 1),
            ] {
                let (got, want) = if op == "check" {
                    (
                        b.check_limits(&key, &limits, cost, Some(t)).await.unwrap(),
                        memory
                            .check_limits(&key, &limits, cost, Some(t))
                            .into_inner()
                            .unwrap(),
                    )
                } else {
                    (
                        b.refund(&key, &limits, cost, Some(t)).await.unwrap(),
                        memory.refund(&key, &limits, cost, Some(t)).await.unwrap(),
                    )
                };
                steps.push(format!("{op} {cost} at {t}"));
                assert_eq!(nv(got), nv(want), "{mode:?} {spec}: {steps:?}");
            }
        }
        b.delete_prefix().await.unwrap();
    }
}

/// Entries that expire exactly now (now − t = P: the general path prunes them), the entry of
/// this very millisecond grown (LSET) or a new one added, and costs of exactly what remains,
/// the limit, one more, and 2^53 − 1, alone and among other policies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_expiring_exactly_now_and_costs_at_the_edges_decide_and_store_alike() {
    let server = RedisServer::start();
    for mode in [ScriptMode::Auto, ScriptMode::Eval] {
        let mut tr = single_trace(&server, "edges", mode);
        for (k, set) in [
            vec![p("sliding-log:limit=3,period=1s,name=a")],
            vec![
                p("token-bucket:limit=10,period=1s,name=b"),
                p("sliding-log:limit=3,period=1s,name=a"),
            ],
            vec![
                p("sliding-log:limit=3,period=1s,name=a"),
                p("fixed-window:limit=4,period=2s,name=b"),
                p("sliding-log:limit=4,period=700ms,name=c"),
            ],
        ]
        .into_iter()
        .enumerate()
        {
            let limits = Limits::new(set).unwrap();
            let client = format!("edge{k}");
            let t0 = 1_700_000_000_000;
            tr.start(&client, &limits, t0).await;
            for (dt, cost) in [
                (0, 2),
                (0, 1),
                (0, 1),
                (500, 1),
                (999, 1),
                (1_000, 1),
                (1_000, 1),
                (1_000, 1),
                (1_499, 1),
                (1_500, 0),
                (1_500, 1),
                (1_500, 4),
                (1_500, MAX_EXACT),
                (2_000, 1),
                (2_000, 2),
                (2_700, 3),
                (3_699, 1),
                (3_700, 3),
                (3_700, 0),
            ] {
                tr.check(&client, &limits, cost, t0 + dt).await;
            }
            // Whatever remains, exactly, then one more.
            let t = t0 + 10_000;
            let d = tr.check(&client, &limits, 1, t).await;
            tr.check(&client, &limits, d.remaining(), t).await;
            tr.check(&client, &limits, 1, t).await;
            // One unit at a time, each entry expiring exactly when the next request comes.
            for dt in [
                20_000, 21_000, 21_000, 22_000, 22_999, 23_999, 23_999, 24_999,
            ] {
                tr.check(&client, &limits, 1, t0 + dt).await;
            }
        }
        tr.b.delete_prefix().await.unwrap();
    }
}

/// A state string whose log is gone (deleted) or is another type: invalid state on the fast
/// key as on the general key, in the millisecond of the last entry (the fast path reads the
/// newest entry) and after, nothing written; a reset repairs it. On a fresh key (no state
/// string) a log of another type is dropped by the first admission, on both paths.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_gone_or_of_another_type_is_invalid_state_on_both_paths_and_nothing_is_written() {
    let server = RedisServer::start();
    let url = server.url();
    for mode in [ScriptMode::Auto, ScriptMode::Eval] {
        let mut tr = single_trace(&server, "gone", mode);
        let sets = [
            vec![p("sliding-log:limit=5,period=1s,name=a")],
            vec![
                p("token-bucket:limit=9,period=1s,name=b"),
                p("sliding-log:limit=5,period=1s,name=a"),
            ],
            vec![
                p("sliding-log:limit=5,period=1s,name=a"),
                p("sliding-window:limit=9,period=1s,name=c"),
            ],
        ];
        let t = 1_700_000_000_000;
        for (k, set) in sets.iter().enumerate() {
            let limits = Limits::new(set.clone()).unwrap();
            for (g, garbage) in ["del", "string", "hash", "zset"].into_iter().enumerate() {
                let client = format!("gone{k}-{g}");
                tr.start(&client, &limits, t).await;
                tr.check(&client, &limits, 1, t).await;
                tr.check(&client, &limits, 1, t).await;
                let mut held = Vec::new();
                for key in ["A", "B"] {
                    let keys = keys_of(&tr.b, &format!("{key}-{client}"));
                    let log = keys.logs[0].clone();
                    let mut c = redis::cmd("DEL");
                    c.arg(&log);
                    tr.raw.cmd(&log, &c).await.unwrap();
                    let c = match garbage {
                        "del" => None,
                        "string" => Some(redis::cmd("SET").arg(&log).arg(format!("{t}:2")).clone()),
                        "hash" => Some(
                            redis::cmd("HSET")
                                .arg(&log)
                                .arg("0")
                                .arg(format!("{t}:2"))
                                .clone(),
                        ),
                        _ => Some(
                            redis::cmd("ZADD")
                                .arg(&log)
                                .arg(1)
                                .arg(format!("{t}:2"))
                                .clone(),
                        ),
                    };
                    if let Some(c) = c {
                        tr.raw.cmd(&log, &c).await.unwrap();
                    }
                    held.push(tr.raw.snapshot(&keys).await);
                }
                for (dt, cost) in [(0, 1), (1, 1), (0, 0), (0, 9)] {
                    for (i, key) in ["A", "B"].into_iter().enumerate() {
                        let who = format!("{mode:?} set {k} {garbage}: {key} at +{dt} cost {cost}");
                        let r = tr
                            .b
                            .check_limits(&format!("{key}-{client}"), &limits, cost, Some(t + dt))
                            .await;
                        // A query or a denial by another policy need not read the log.
                        if cost == 1 {
                            assert!(
                                matches!(r, Err(turnstile_core::BackendError::InvalidState(_))),
                                "{who}: {r:?}"
                            );
                        }
                        let keys = keys_of(&tr.b, &format!("{key}-{client}"));
                        assert_eq!(
                            tr.raw.snapshot(&keys).await,
                            held[i],
                            "{who}: nothing written"
                        );
                    }
                }
                // A reset repairs both; then every answer is memory's again.
                for key in ["A", "B"] {
                    tr.b.reset(&format!("{key}-{client}"), &limits, Some(t))
                        .await
                        .unwrap();
                }
                tr.memory.reset(&client, &limits, Some(t)).await.unwrap();
                let a = keys_of(&tr.b, &format!("A-{client}"));
                tr.raw
                    .cmd(&a.cfg, redis::cmd("DEL").arg(&a.cfg))
                    .await
                    .unwrap();
                tr.check(&client, &limits, 2, t + 1).await;
                tr.check(&client, &limits, 3, t + 1).await;
                tr.check(&client, &limits, 1, t + 1).await;
            }
            // A fresh key whose log key holds another type: dropped by the first admission.
            let client = format!("fresh{k}");
            tr.start(&client, &limits, t).await;
            for key in ["A", "B"] {
                let log = keys_of(&tr.b, &format!("{key}-{client}")).logs[0].clone();
                raw(&url, redis::cmd("SET").arg(&log).arg("garbage"))
                    .await
                    .unwrap();
            }
            tr.check(&client, &limits, 0, t).await;
            tr.check(&client, &limits, 2, t).await;
            tr.check(&client, &limits, 2, t).await;
        }
        tr.b.delete_prefix().await.unwrap();
    }
}

impl Trace {
    /// A fresh trace's keys for `client`: the general key given a version (a refund of
    /// nothing), as the trace does.
    async fn start(&mut self, client: &str, limits: &Limits, t: u64) {
        self.b
            .refund(&format!("B-{client}"), limits, 0, Some(t))
            .await
            .unwrap();
    }

    /// One check on the fast key, the general key and in memory: equal decisions (but for the
    /// version), then equal stored states.
    async fn check(&mut self, client: &str, limits: &Limits, cost: u64, t: u64) -> Decision {
        let ctx = format!("{client}: check {cost} at {t}");
        let started = Instant::now();
        let ga = self
            .b
            .check_limits(&format!("A-{client}"), limits, cost, Some(t))
            .await;
        let gb = self
            .b
            .check_limits(&format!("B-{client}"), limits, cost, Some(t))
            .await;
        self.slack = self.slack.max(started.elapsed().as_millis() as i64 + 2);
        let want = self
            .memory
            .check_limits(client, limits, cost, Some(t))
            .into_inner()
            .unwrap();
        assert_eq!(nv(ga.unwrap()), nv(want.clone()), "{ctx}: fast key");
        assert_eq!(nv(gb.unwrap()), nv(want.clone()), "{ctx}: general key");
        self.compare_stored(client, &ctx).await;
        want
    }
}

fn single_trace(server: &RedisServer, test: &str, mode: ScriptMode) -> Trace {
    let raw = Raw::single(server);
    Trace {
        b: backend(&raw.seed_url(), test, mode, false),
        raw,
        memory: MemoryBackend::new(),
        seed: 1,
        slack: 0,
    }
}

/// Sends `cmd` to the single server at `url`.
async fn raw(url: &str, cmd: &redis::Cmd) -> redis::RedisResult<redis::Value> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    cmd.query_async(&mut conn).await
}
