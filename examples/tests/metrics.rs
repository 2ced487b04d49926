//! The `metrics` example, served for real on 127.0.0.1 and asked over TCP: `/metrics`
//! answers with turnstile's metrics after real traffic, and is not itself limited. (Its own
//! test binary: the Prometheus recorder is global to the process.)

mod common;

use common::{http, serve};

#[allow(dead_code)]
#[path = "../metrics.rs"]
mod metrics_example;

/// The sample of `series` (name and labels exactly as rendered) in Prometheus text.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_scraped_after_real_traffic() {
    let handle = metrics_example::install_recorder().unwrap();
    let addr = serve(metrics_example::app(handle).unwrap()).await;
    let mut statuses = Vec::new();
    for _ in 0..12 {
        statuses.push(http(addr, "GET", "/").await.0);
    }
    assert_eq!(
        statuses,
        [200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 429, 429]
    );
    // /metrics is not limited: scrape it more often than the limit allows.
    let mut body = String::new();
    for _ in 0..12 {
        let (status, b) = http(addr, "GET", "/metrics").await;
        assert_eq!(status, 200);
        body = b;
    }
    let decisions = |outcome: &str| {
        sample(
            &body,
            &format!("turnstile_decisions_total{{policy=\"per-ip\",outcome=\"{outcome}\"}}"),
        )
    };
    assert_eq!(decisions("allowed"), Some(10.0), "{body}");
    assert_eq!(decisions("denied"), Some(2.0), "{body}");
    assert_eq!(
        sample(&body, "turnstile_backend_check_duration_seconds_count"),
        Some(12.0),
        "{body}"
    );
    assert!(
        body.contains("turnstile_backend_check_duration_seconds_bucket{le=\"0.0001\"}"),
        "{body}"
    );
    assert!(body.contains("# HELP turnstile_decisions_total "), "{body}");
    assert!(
        !body.contains("127.0.0.1"),
        "no client key in the metrics: {body}"
    );
}
