//! The Redis backend against real `redis-server` processes these tests start themselves, by
//! concept: parity with the memory backend (`parity.rs`), processes, nodes and failures
//! (`processes.rs`), and what Redis holds (`stored.rs`). The helpers they share are here.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use turnstile_core::wrap::{DenyCache, Fallback};
use turnstile_core::{
    Algorithm, Backend, BackendError, Decision, KeyConfig, Limits, ManualClock, MemoryBackend,
    Policy, Unconfigured,
};
use turnstile_core::{FailurePolicy, Quotas};
use turnstile_redis::{redis, KeyEncoding, RedisBackend, ScriptMode};
use turnstile_tests::redis_server::{command, command_calls, RedisCluster, RedisServer, TestRedis};

mod coalesce;
mod parity;
mod processes;
mod stored;

fn prefix(test: &str) -> String {
    format!("turnstile:test:{test}:{}", std::process::id())
}

/// A backend that reports every Redis error and asks Redis every time (no deny cache: these
/// tests compare every field of every decision with the in-memory backend).
fn backend(url: &str, test: &str) -> RedisBackend {
    RedisBackend::builder(url)
        .prefix(prefix(test))
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

fn p(spec: &str) -> Policy {
    spec.parse().unwrap()
}

/// 2^53 − 1: the largest time, cost and max(L, B)·P the contract accepts.
const MAX_EXACT: u64 = (1 << 53) - 1;

/// Sends one command to the Redis at `url` and returns its reply.
async fn raw(url: &str, cmd: &redis::Cmd) -> redis::RedisResult<redis::Value> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    cmd.query_async(&mut conn).await
}

/// `SET key value` (any bytes), then the key holds nothing else.
async fn set_raw(url: &str, key: &str, value: &[u8]) {
    raw(url, redis::cmd("DEL").arg(key)).await.unwrap();
    raw(url, redis::cmd("SET").arg(key).arg(value))
        .await
        .unwrap();
}

fn assert_invalid_state<T: std::fmt::Debug>(r: Result<T, BackendError>, what: &str) {
    match r {
        Err(BackendError::InvalidState(_)) => {}
        other => panic!("{what}: want InvalidState, got {other:?}"),
    }
}

/// The totals of `hammer` processes (`admitted=A denied=D errors=E` each), once all exit.
fn hammer_totals(procs: Vec<std::process::Child>) -> (u64, u64, u64) {
    let (mut admitted, mut denied, mut errors) = (0, 0, 0);
    for child in procs {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        let line = String::from_utf8(out.stdout).unwrap();
        for part in line.split_whitespace() {
            let (k, v) = part.split_once('=').unwrap();
            let v: u64 = v.parse().unwrap();
            match k {
                "admitted" => admitted += v,
                "denied" => denied += v,
                "errors" => errors += v,
                _ => panic!("unexpected output {line}"),
            }
        }
    }
    (admitted, denied, errors)
}
