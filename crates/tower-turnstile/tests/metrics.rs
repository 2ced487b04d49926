//! Metrics recorded by a test recorder after real requests through the layer.
#![cfg(feature = "metrics")]

mod support;

use std::convert::Infallible;
use std::time::Duration;

use http::{Request, Response};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use support::{p, request, tokio_backend};
use tower::{Layer, Service, ServiceExt};
use tower_turnstile::key::HeaderKey;
use tower_turnstile::metrics::*;
use tower_turnstile::{
    Action, MemoryBackend, MissingKey, Quotas, RateLimitLayer, Rule, Unconfigured,
};

async fn send<B, K>(
    layer: &RateLimitLayer<B, K>,
    reqs: impl IntoIterator<Item = Request<()>>,
) -> Vec<u16>
where
    B: tower_turnstile::Backend,
    K: tower_turnstile::KeyExtractor,
{
    let inner = tower::service_fn(|_r: Request<()>| async {
        Ok::<_, Infallible>(Response::new(String::new()))
    });
    let mut svc = layer.layer(inner);
    let mut out = Vec::new();
    for r in reqs {
        let res = svc.ready().await.unwrap().call(r).await.unwrap();
        out.push(res.status().as_u16());
    }
    out
}

/// One series: name, sorted labels, value.
type Series = (String, Vec<(String, String)>, DebugValue);

/// Every metric in the snapshot: (name, sorted labels, value).
fn snapshot(s: &Snapshotter) -> Vec<Series> {
    let mut out: Vec<_> = s
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(k, _, _, v)| {
            let key = k.key();
            let mut labels: Vec<(String, String)> = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            (key.name().to_owned(), labels, v)
        })
        .collect();
    out.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
    out
}

fn counter(snap: &[Series], name: &str, labels: &[(&str, &str)]) -> u64 {
    let mut want: Vec<(String, String)> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    want.sort();
    snap.iter()
        .find(|(n, l, _)| n == name && *l == want)
        .map_or(0, |(_, _, v)| match v {
            DebugValue::Counter(c) => *c,
            _ => 0,
        })
}

fn histogram_samples(snap: &[Series], name: &str) -> usize {
    snap.iter()
        .filter(|(n, _, _)| n == name)
        .map(|(_, _, v)| match v {
            DebugValue::Histogram(h) => h.len(),
            _ => 0,
        })
        .sum()
}

fn decisions(snap: &[Series], policy: &str, outcome: &str) -> u64 {
    counter(
        snap,
        DECISIONS_TOTAL,
        &[(LABEL_POLICY, policy), (LABEL_OUTCOME, outcome)],
    )
}

#[tokio::test(flavor = "current_thread")]
async fn allowed_and_denied_per_policy_with_backend_latency() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);

    // Two policies: the per-second one binds first.
    let layer = RateLimitLayer::with_policies([
        p("fixed-window:limit=2,period=1h,name=small"),
        p("fixed-window:limit=100,period=1h,name=large"),
    ])
    .unwrap();
    let statuses = send(&layer, (0..3).map(|_| request("GET", "/", "192.0.2.1:1"))).await;
    assert_eq!(statuses, [200, 200, 429]);

    let snap = snapshot(&snapshotter);
    assert_eq!(decisions(&snap, "small", OUTCOME_ALLOWED), 2);
    assert_eq!(decisions(&snap, "large", OUTCOME_ALLOWED), 2);
    assert_eq!(decisions(&snap, "small", OUTCOME_DENIED), 1);
    // "large" admitted the third request; it consumed nothing and is not counted.
    assert_eq!(decisions(&snap, "large", OUTCOME_DENIED), 0);
    assert_eq!(histogram_samples(&snap, BACKEND_CHECK_DURATION_SECONDS), 3);
    // Bounded labels: never the client key.
    for (_, labels, _) in &snap {
        assert!(
            labels.iter().all(|(_, v)| !v.contains("192.0.2.1")),
            "{labels:?}"
        );
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn delayed_and_shadow_denied() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);

    // A leaky bucket shapes its second request: delayed.
    let shaping = RateLimitLayer::new(p("leaky-bucket:limit=10,period=1s,name=shape"))
        .backend(tokio_backend());
    assert_eq!(
        send(&shaping, (0..2).map(|_| request("GET", "/", "192.0.2.1:1"))).await,
        [200, 200]
    );

    // Action::Delay holds the second request for a re-check: one decision, delayed; two
    // checks measured.
    let waiting = RateLimitLayer::builder()
        .backend(tokio_backend())
        .policy(p("fixed-window:limit=1,period=1s,name=wait"))
        .action(Action::delay(Duration::from_secs(5)))
        .build()
        .unwrap();
    assert_eq!(
        send(&waiting, (0..2).map(|_| request("GET", "/", "192.0.2.1:1"))).await,
        [200, 200]
    );

    // Shadow: admitted, counted as shadow_denied.
    let shadow = RateLimitLayer::builder()
        .policy(p("fixed-window:limit=1,period=1h,name=dry"))
        .action(Action::Shadow)
        .build()
        .unwrap();
    assert_eq!(
        send(&shadow, (0..3).map(|_| request("GET", "/", "192.0.2.1:1"))).await,
        [200, 200, 200]
    );

    let snap = snapshot(&snapshotter);
    assert_eq!(decisions(&snap, "shape", OUTCOME_ALLOWED), 1);
    assert_eq!(decisions(&snap, "shape", OUTCOME_DELAYED), 1);
    assert_eq!(decisions(&snap, "wait", OUTCOME_ALLOWED), 1);
    assert_eq!(decisions(&snap, "wait", OUTCOME_DELAYED), 1);
    assert_eq!(decisions(&snap, "wait", OUTCOME_DENIED), 0);
    assert_eq!(decisions(&snap, "dry", OUTCOME_ALLOWED), 1);
    assert_eq!(decisions(&snap, "dry", OUTCOME_SHADOW_DENIED), 2);
    assert_eq!(
        histogram_samples(&snap, BACKEND_CHECK_DURATION_SECONDS),
        2 + 3 + 3
    );
}

#[tokio::test(flavor = "current_thread")]
async fn backend_errors_and_missing_keys() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);

    // A backend capped at one key: the second client's check fails (fail open).
    let capped = RateLimitLayer::new(p("gcra:limit=5,period=1s,name=capped"))
        .backend(MemoryBackend::builder().max_keys(1).build());
    let statuses = send(
        &capped,
        [
            request("GET", "/", "192.0.2.1:1"),
            request("GET", "/", "192.0.2.2:1"),
        ],
    )
    .await;
    assert_eq!(statuses, [200, 200]);

    // Keyed by a header the request lacks: rejected (400), or counted under a shared key.
    let header = RateLimitLayer::builder()
        .key(HeaderKey::named("x-api-key").unwrap())
        .policy(p("gcra:limit=5,period=1s,name=api"))
        .build()
        .unwrap();
    assert_eq!(
        send(&header, [request("GET", "/", "192.0.2.1:1")]).await,
        [400]
    );
    let shared = RateLimitLayer::builder()
        .key(HeaderKey::named("x-api-key").unwrap())
        .policy(p("gcra:limit=5,period=1s,name=api"))
        .on_missing_key(MissingKey::key("anonymous"))
        .build()
        .unwrap();
    assert_eq!(
        send(&shared, [request("GET", "/", "192.0.2.1:1")]).await,
        [200]
    );

    let snap = snapshot(&snapshotter);
    assert_eq!(
        counter(
            &snap,
            BACKEND_ERRORS_TOTAL,
            &[(LABEL_KIND, "capacity_exceeded")]
        ),
        1
    );
    assert_eq!(decisions(&snap, "capped", OUTCOME_ALLOWED), 1);
    assert_eq!(
        counter(
            &snap,
            MISSING_KEY_TOTAL,
            &[(LABEL_REASON, "missing_header")]
        ),
        2
    );
    assert_eq!(decisions(&snap, "api", OUTCOME_ALLOWED), 1);
}

#[tokio::test(flavor = "current_thread")]
async fn tiers_overrides_and_unconfigured_keys() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);

    let backend = MemoryBackend::new();
    backend.set_tier("192.0.2.1", Some("pro")).await.unwrap();
    backend
        .set_override("192.0.2.2", &[p("fixed-window:limit=1,period=1h,name=std")])
        .await
        .unwrap();
    let layer = RateLimitLayer::builder()
        .backend(backend)
        .rule(
            Rule::new()
                .path("/x")
                .policy(p("fixed-window:limit=5,period=1h,name=std")),
        )
        .tier("pro", [p("fixed-window:limit=50,period=1h,name=std")])
        .when_unconfigured(Unconfigured::Deny)
        .build()
        .unwrap();
    let statuses = send(
        &layer,
        [
            request("GET", "/x", "192.0.2.1:1"),
            request("GET", "/x", "192.0.2.2:1"),
            request("GET", "/x", "192.0.2.2:1"),
            request("GET", "/x", "192.0.2.3:1"),
        ],
    )
    .await;
    assert_eq!(statuses, [200, 200, 429, 429]);
    let snap = snapshot(&snapshotter);
    // A tier and an override change the parameters of the policy they name: its decisions
    // count under its name (the tier's for 192.0.2.1, the override's for 192.0.2.2).
    assert_eq!(decisions(&snap, "std", OUTCOME_ALLOWED), 2);
    assert_eq!(decisions(&snap, "std", OUTCOME_DENIED), 1);
    assert_eq!(decisions(&snap, UNCONFIGURED_POLICY, OUTCOME_DENIED), 1);
}

#[test]
fn describe_registers_every_metric() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, describe);
    // Descriptions alone create no series.
    assert!(snapshotter.snapshot().into_vec().is_empty());
}
