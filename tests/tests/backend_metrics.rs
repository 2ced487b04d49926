//! The backends' own metrics: keys tracked in memory, deny-cache hits, local fallback
//! activations and decisions, recorded through the `metrics` facade.

use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use turnstile_core::wrap::{DenyCache, Fallback};
use turnstile_core::{Backend, FailurePolicy, MemoryBackend, Policy};
use turnstile_redis::RedisBackend;
use turnstile_tests::redis_server::RedisServer;

/// Every metric of a snapshot by name, labels ignored (counters and gauges summed). Taken
/// once: a snapshot drains what it reports.
fn values(recorder: &DebuggingRecorder) -> std::collections::HashMap<String, f64> {
    let mut out = std::collections::HashMap::new();
    for (k, _, _, v) in recorder.snapshotter().snapshot().into_vec() {
        let v = match v {
            DebugValue::Counter(c) => c as f64,
            DebugValue::Gauge(g) => g.into_inner(),
            DebugValue::Histogram(h) => h.len() as f64,
        };
        *out.entry(k.key().name().to_owned()).or_default() += v;
    }
    out
}

#[test]
fn backends_report_keys_cache_hits_and_fallbacks() {
    let recorder = DebuggingRecorder::new();
    let mut server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || {
        let memory = MemoryBackend::new();
        let pol = [Policy::gcra(1, Duration::from_secs(3600)).unwrap()];
        for k in ["a", "b", "c"] {
            memory.check_at(k, &pol, 1, 1_000).into_inner().unwrap();
        }

        runtime.block_on(async {
            let redis = RedisBackend::builder(server.url())
                .prefix("turnstile:test:metrics")
                .timeout(Duration::from_millis(300))
                .build()
                .unwrap();
            let redis = Fallback::new(DenyCache::new(redis), FailurePolicy::Local);
            for _ in 0..5 {
                redis.check("k", &pol, 1).await.unwrap();
            }
            server.kill();
            for _ in 0..3 {
                redis.check("other", &pol, 1).await.unwrap();
            }
        });
    });
    let v = values(&recorder);
    // Three keys in the memory backend, one in the Redis backend's local fallback.
    assert_eq!(v.get("turnstile_memory_keys"), Some(&4.0), "{v:?}");
    // One request admitted, one denied by Redis, three denied by the cache.
    assert_eq!(
        v.get("turnstile_deny_cache_hits_total"),
        Some(&3.0),
        "{v:?}"
    );
    assert_eq!(
        v.get("turnstile_fallback_activations_total"),
        Some(&1.0),
        "{v:?}"
    );
    assert_eq!(
        v.get("turnstile_fallback_decisions_total"),
        Some(&3.0),
        "{v:?}"
    );
}
