//! The span of each check: key hashed by default (plain or hidden on request), policies,
//! outcome and backend latency; the shadow log keys follow the same setting.

mod support;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::fmt;
use std::sync::{Arc, Mutex};

use http::{Request, Response};
use support::request;
use tower::{Layer, Service, ServiceExt};
use tower_turnstile::key::KeyLogging;
use tower_turnstile::{Action, Policy, RateLimitLayer};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

type Fields = BTreeMap<String, String>;

/// Collects every closed span's fields, and every event's, by name.
#[derive(Clone, Default)]
struct Capture {
    spans: Arc<Mutex<Vec<(String, Fields)>>>,
    events: Arc<Mutex<Vec<(String, Fields)>>>,
}

struct Fieldset(Fields);

impl Visit for Fieldset {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut f = Fieldset(Fields::new());
        attrs.record(&mut f);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(f.0);
        }
    }
    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            let mut ext = span.extensions_mut();
            if let Some(fields) = ext.get_mut::<Fields>() {
                let mut f = Fieldset(std::mem::take(fields));
                values.record(&mut f);
                *fields = f.0;
            }
        }
    }
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        let mut f = Fieldset(Fields::new());
        event.record(&mut f);
        f.0.insert("level".to_owned(), event.metadata().level().to_string());
        self.events
            .lock()
            .unwrap()
            .push((event.metadata().target().to_owned(), f.0));
    }
    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(&id) {
            let fields = span
                .extensions()
                .get::<Fields>()
                .cloned()
                .unwrap_or_default();
            self.spans
                .lock()
                .unwrap()
                .push((span.name().to_owned(), fields));
        }
    }
}

/// A capturing subscriber, this thread's default until the guard drops.
fn capturing() -> (Capture, tracing::subscriber::DefaultGuard) {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    (capture, tracing::subscriber::set_default(subscriber))
}

/// `layer` around an inner service that answers 200 with an empty body.
fn service<B, K>(
    layer: &RateLimitLayer<B, K>,
) -> impl Service<Request<()>, Response = Response<String>, Error = Infallible, Future: Send>
       + Clone
       + Send
       + 'static
where
    B: tower_turnstile::Backend,
    K: tower_turnstile::KeyExtractor,
{
    layer.layer(tower::service_fn(|_r: Request<()>| async {
        Ok::<_, Infallible>(Response::new(String::new()))
    }))
}

/// A layer of `policy` on `backend`, with `failure` when the backend cannot decide.
fn layer_on<B: tower_turnstile::Backend>(
    backend: B,
    policy: &str,
    failure: tower_turnstile::FailurePolicy,
) -> RateLimitLayer<B> {
    RateLimitLayer::builder()
        .policy(policy.parse().unwrap())
        .backend(backend)
        .on_backend_failure(failure)
        .build()
        .unwrap()
}

/// Sends `n` requests from 192.0.2.1 through `layer` under a capturing subscriber.
async fn run<B, K>(layer: RateLimitLayer<B, K>, n: usize) -> Capture
where
    B: tower_turnstile::Backend,
    K: tower_turnstile::KeyExtractor,
{
    let (capture, _guard) = capturing();
    let mut svc = service(&layer);
    for _ in 0..n {
        one(&mut svc, "192.0.2.1:1").await;
    }
    capture
}

fn policy() -> Policy {
    "fixed-window:limit=1,period=1h,name=per-ip"
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "current_thread")]
async fn a_span_per_check_with_a_hashed_key() {
    let capture = run(RateLimitLayer::new(policy()), 2).await;
    let spans = capture.spans.lock().unwrap().clone();
    assert_eq!(spans.len(), 2, "{spans:?}");
    let hashed = format!("{:016x}", KeyLogging::hash("192.0.2.1"));
    for (name, fields) in &spans {
        assert_eq!(name, "rate_limit_check");
        assert_eq!(fields["key"], hashed);
        assert_eq!(fields["policies"], "per-ip");
        assert_eq!(fields["cost"], "1");
        assert_eq!(fields["applied"], "defaults");
        assert!(fields["backend_us"].parse::<u64>().is_ok(), "{fields:?}");
    }
    assert_eq!(spans[0].1["outcome"], "allowed");
    assert_eq!(spans[1].1["outcome"], "denied");
    assert!(spans[1].1["retry_after_ms"].parse::<u64>().unwrap() > 0);
    // The denial is a DEBUG event inside the span; the plain key appears nowhere.
    let events = capture.events.lock().unwrap().clone();
    assert!(events
        .iter()
        .any(|(_, f)| f.get("message").is_some_and(|m| m.contains("denied"))));
    for (_, fields) in spans.iter().chain(events.iter()) {
        assert!(
            fields.values().all(|v| !v.contains("192.0.2.1")),
            "{fields:?}"
        );
    }
}

#[tokio::test(flavor = "current_thread")]
async fn keys_plain_or_hidden_on_request() {
    let plain = RateLimitLayer::builder()
        .policy(policy())
        .log_keys(KeyLogging::Plain)
        .build()
        .unwrap();
    let capture = run(plain, 1).await;
    assert_eq!(capture.spans.lock().unwrap()[0].1["key"], "192.0.2.1");

    let hidden = RateLimitLayer::builder()
        .policy(policy())
        .log_keys(KeyLogging::Hidden)
        .build()
        .unwrap();
    let capture = run(hidden, 1).await;
    assert_eq!(capture.spans.lock().unwrap()[0].1["key"], "hidden");
}

#[tokio::test(flavor = "current_thread")]
async fn the_shadow_log_hashes_keys_too() {
    let shadow = RateLimitLayer::builder()
        .policy(policy())
        .action(Action::Shadow)
        .build()
        .unwrap();
    let capture = run(shadow, 2).await;
    let events = capture.events.lock().unwrap().clone();
    let logged: Vec<&Fields> = events
        .iter()
        .filter(|(target, _)| target == "turnstile::shadow")
        .map(|(_, f)| f)
        .collect();
    assert_eq!(logged.len(), 1);
    assert_eq!(
        logged[0]["key"],
        format!("{:016x}", KeyLogging::hash("192.0.2.1"))
    );
    let spans = capture.spans.lock().unwrap().clone();
    assert_eq!(spans[1].1["outcome"], "shadow_denied");
}

#[test]
fn the_hash_is_stable() {
    // FNV-1a 64: the same on every build and platform.
    assert_eq!(KeyLogging::hash(""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(KeyLogging::hash("a"), 0xaf63_dc4c_8601_ec8c);
    assert_eq!(
        KeyLogging::Hashed.display("a").to_string(),
        "af63dc4c8601ec8c"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn one_incident_logs_one_warning_and_one_recovery_whatever_the_failure_policy() {
    use tower_turnstile::FailurePolicy;
    for failure in [
        FailurePolicy::Local,
        FailurePolicy::Open,
        FailurePolicy::Closed,
    ] {
        let backend = Scripted::default();
        let layer = layer_on(
            backend.clone(),
            "fixed-window:limit=1000,period=1h,name=per-ip",
            failure,
        );
        let (capture, _guard) = capturing();
        let mut svc = service(&layer);
        for (down, n) in [(false, 2), (true, 20), (false, 5)] {
            backend
                .down
                .store(down, std::sync::atomic::Ordering::Relaxed);
            for _ in 0..n {
                one(&mut svc, "192.0.2.1:1").await;
            }
        }
        let at = |level: &str| messages(&events_at(&capture, level));
        assert_eq!(at("WARN").len(), 1, "{failure}: {:?}", at("WARN"));
        assert_eq!(at("INFO").len(), 1, "{failure}: {:?}", at("INFO"));
    }
}

/// Regression: a server started without connect info explained the fix only in response
/// bodies (and only when such requests were rejected); it is logged once, whatever
/// `MissingKey` does with the requests.
#[tokio::test(flavor = "current_thread")]
async fn a_server_without_connect_info_logs_the_fix_once() {
    use tower_turnstile::MissingKey;
    for missing in [
        MissingKey::Reject,
        MissingKey::Allow,
        MissingKey::key("anon"),
    ] {
        let (capture, _guard) = capturing();
        let layer = RateLimitLayer::builder()
            .policy(policy())
            .on_missing_key(missing.clone())
            .build()
            .unwrap();
        let mut svc = service(&layer);
        let mut statuses = Vec::new();
        for _ in 0..3 {
            let res = svc
                .ready()
                .await
                .unwrap()
                .call(Request::new(()))
                .await
                .unwrap();
            statuses.push(res.status().as_u16());
        }
        let want = match missing {
            MissingKey::Reject => [500, 500, 500],
            MissingKey::Allow => [200, 200, 200],
            _ => [200, 429, 429],
        };
        assert_eq!(statuses, want, "{missing:?}");
        let errors = events_at(&capture, "ERROR");
        assert_eq!(errors.len(), 1, "{missing:?}: {errors:?}");
        assert!(
            errors[0]["message"].contains("into_make_service_with_connect_info"),
            "{errors:?}"
        );
        assert_eq!(errors[0]["kind"], "missing_peer_addr");
    }
}

/// Opens once: the checks held behind it answer then.
#[derive(Default)]
struct Gate {
    open: std::sync::atomic::AtomicBool,
    wakers: Mutex<Vec<std::task::Waker>>,
}

impl Gate {
    fn release(&self) {
        self.open.store(true, std::sync::atomic::Ordering::SeqCst);
        for w in self.wakers.lock().unwrap().drain(..) {
            w.wake();
        }
    }
}

/// A remote-looking backend over memory: down (connection refused) while `down` is set;
/// keys in `bad` have unreadable state; while `hold` is set, checks are decided at once but
/// their replies stay in flight until `gate` opens.
#[derive(Clone, Default)]
struct Scripted {
    memory: tower_turnstile::MemoryBackend,
    down: Arc<std::sync::atomic::AtomicBool>,
    bad: Arc<Mutex<Vec<String>>>,
    hold: Arc<std::sync::atomic::AtomicBool>,
    gate: Arc<Gate>,
}

type CheckResult = Result<tower_turnstile::Decision, tower_turnstile::BackendError>;

impl tower_turnstile::Backend for Scripted {
    type Future = std::pin::Pin<Box<dyn std::future::Future<Output = CheckResult> + Send>>;

    fn check_limits(
        &self,
        key: &str,
        limits: &tower_turnstile::Limits,
        cost: u64,
        now_ms: Option<u64>,
    ) -> Self::Future {
        use std::sync::atomic::Ordering::SeqCst;
        let result = if self.down.load(SeqCst) {
            Err(tower_turnstile::BackendError::Connection(
                "connection refused".into(),
            ))
        } else if self.bad.lock().unwrap().iter().any(|b| b == key) {
            Err(tower_turnstile::BackendError::InvalidState(
                "unreadable state".into(),
            ))
        } else {
            self.memory
                .check_limits(key, limits, cost, now_ms)
                .into_inner()
        };
        if !self.hold.load(SeqCst) {
            return Box::pin(std::future::ready(result));
        }
        let gate = Arc::clone(&self.gate);
        Box::pin(async move {
            std::future::poll_fn(|cx| {
                if gate.open.load(SeqCst) {
                    return std::task::Poll::Ready(());
                }
                gate.wakers.lock().unwrap().push(cx.waker().clone());
                std::task::Poll::Pending
            })
            .await;
            result
        })
    }
}

/// The events at `level` (their messages and fields).
fn events_at(capture: &Capture, level: &str) -> Vec<Fields> {
    capture
        .events
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, f)| f["level"] == level)
        .map(|(_, f)| f.clone())
        .collect()
}

fn messages(events: &[Fields]) -> Vec<String> {
    events
        .iter()
        .map(|f| f.get("message").cloned().unwrap_or_default())
        .collect()
}

/// Sends one request from `peer` through `svc` and waits for its answer.
async fn one<S>(svc: &mut S, peer: &str)
where
    S: tower::Service<Request<()>>,
    S::Error: fmt::Debug,
{
    let _ = svc
        .ready()
        .await
        .unwrap()
        .call(request("GET", "/", peer))
        .await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_reply_in_flight_and_answers_from_the_deny_cache_neither_end_an_incident() {
    // Within one incident the layer used to log up to 24 "failed"/"recovered" pairs: a
    // reply sent before the incident arriving during it, and every answer from the deny
    // cache, counted as the backend's recovery.
    use std::sync::atomic::Ordering::SeqCst;
    use tower_turnstile::wrap::DenyCache;
    use tower_turnstile::FailurePolicy;
    for failure in FailurePolicy::ALL {
        let backend = Scripted::default();
        let cached = DenyCache::with_max(backend.clone(), std::time::Duration::from_secs(3600));
        let layer = layer_on(
            cached.clone(),
            "token-bucket:limit=1,period=1h,name=per-ip",
            failure,
        );
        let (capture, _guard) = capturing();
        let mut svc = service(&layer);
        // A client uses its one unit; its next request is denied, and the denial cached.
        one(&mut svc, "192.0.2.1:1").await;
        one(&mut svc, "192.0.2.1:1").await;
        // A check sent while the backend is healthy, its reply still in flight.
        backend.hold.store(true, SeqCst);
        let mut early = svc.clone();
        let in_flight = tokio::spawn(async move { one(&mut early, "192.0.2.9:1").await });
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!in_flight.is_finished());
        backend.hold.store(false, SeqCst);
        // The backend goes down: the incident starts.
        backend.down.store(true, SeqCst);
        one(&mut svc, "192.0.2.2:1").await;
        // The reply in flight arrives; the deny cache answers the denied client; more
        // failures follow: all within the one incident.
        backend.gate.release();
        in_flight.await.unwrap();
        for _ in 0..5 {
            one(&mut svc, "192.0.2.1:1").await;
            one(&mut svc, "192.0.2.2:1").await;
        }
        assert_eq!(cached.hits(), 5, "{failure}");
        // Back: the first answer of the backend itself ends the incident.
        backend.down.store(false, SeqCst);
        for _ in 0..3 {
            one(&mut svc, "192.0.2.3:1").await;
        }
        let warn = messages(&events_at(&capture, "WARN"));
        let info = messages(&events_at(&capture, "INFO"));
        assert_eq!(warn.len(), 1, "{failure}: {warn:?}");
        assert_eq!(info.len(), 1, "{failure}: {info:?}");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_bad_key_is_logged_once_and_never_opens_an_incident() {
    // One corrupted key among good ones produced 703 lines in 10 s: its state error was
    // reported as a backend-wide incident, closed by the next good key.
    use tower_turnstile::FailurePolicy;
    for failure in FailurePolicy::ALL {
        let backend = Scripted::default();
        backend
            .bad
            .lock()
            .unwrap()
            .extend(["192.0.2.66".to_owned(), "192.0.2.77".to_owned()]);
        let layer = layer_on(
            backend.clone(),
            "fixed-window:limit=1000,period=1h,name=per-ip",
            failure,
        );
        let (capture, _guard) = capturing();
        let mut svc = service(&layer);
        for _ in 0..50 {
            one(&mut svc, "192.0.2.66:1").await;
            one(&mut svc, "192.0.2.1:1").await;
            one(&mut svc, "192.0.2.77:1").await;
            one(&mut svc, "192.0.2.2:1").await;
        }
        let warn = events_at(&capture, "WARN");
        let info = messages(&events_at(&capture, "INFO"));
        assert!(info.is_empty(), "{failure}: {info:?}");
        assert_eq!(warn.len(), 2, "{failure}: {:?}", messages(&warn));
        // One line per bad key, the key hashed as the layer's default shows it.
        let mut keys: Vec<String> = warn
            .iter()
            .map(|f| {
                f.get("key")
                    .or(f.get("key_hash"))
                    .cloned()
                    .unwrap_or_default()
            })
            .collect();
        keys.sort();
        let mut want = vec![
            format!("{:016x}", KeyLogging::hash("192.0.2.66")),
            format!("{:016x}", KeyLogging::hash("192.0.2.77")),
        ];
        want.sort();
        assert_eq!(keys, want, "{failure}");
        for m in messages(&warn) {
            assert!(m.contains("this key's state"), "{failure}: {m}");
        }
    }
}
