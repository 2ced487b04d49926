//! Configuration files: the example file builds a working layer, broken files are named by
//! line and field, and what the file says is what the layer does.
#![cfg(feature = "config")]

mod support;

use std::convert::Infallible;

use http::{Request, Response, StatusCode};
use support::request;
use tower::{Layer, Service, ServiceExt};
use tower_turnstile::config::LayerConfig;
use tower_turnstile::{Action, FailurePolicy, Unconfigured};

const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/turnstile.toml");

fn err(text: &str) -> String {
    LayerConfig::from_toml("turnstile.toml", text)
        .unwrap_err()
        .to_string()
}

async fn status<S>(svc: &mut S, req: Request<()>) -> StatusCode
where
    S: Service<Request<()>, Response = Response<String>, Error = Infallible>,
{
    svc.ready().await.unwrap().call(req).await.unwrap().status()
}

fn inner(
) -> impl Service<Request<()>, Response = Response<String>, Error = Infallible, Future = impl Send> + Clone
{
    tower::service_fn(|_r: Request<()>| async { Ok::<_, Infallible>(Response::new(String::new())) })
}

#[test]
fn the_example_file_parses_and_builds() {
    let config = LayerConfig::from_file(EXAMPLE).unwrap();
    assert_eq!(config.key().spec(), "client-ip");
    assert_eq!(config.rules().len(), 4);
    assert_eq!(config.policies()[0].name(), "per-ip");
    assert_eq!(config.tiers().next().map(|(n, _)| n), Some("pro"));
    assert_eq!(config.action(), Action::Reject);
    assert_eq!(config.unconfigured(), Unconfigured::Defaults);
    assert_eq!(config.backend().url(), Some("redis://127.0.0.1:6379"));
    assert_eq!(config.backend().failure(), FailurePolicy::Local);
    assert_eq!(config.failure_policy(), FailurePolicy::Local);
    let layer = config.builder().build().unwrap();
    assert_eq!(layer.policies().len(), 1);
    let text = config.to_string();
    assert!(text.contains("  3. /api/*, cost 2:\n"), "{text}");
    assert!(
        text.contains("\"api-per-ip\" token-bucket:limit=100,period=1m,burst=20"),
        "{text}"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn the_example_file_limits_as_it_says() {
    let layer = LayerConfig::from_file(EXAMPLE)
        .unwrap()
        .builder()
        .build()
        .unwrap();
    let mut svc = layer.layer(inner());
    // /healthz is exempt.
    for _ in 0..20 {
        assert_eq!(
            status(&mut svc, request("GET", "/healthz", "192.0.2.1:1")).await,
            StatusCode::OK
        );
    }
    // POST /login: 5 per minute.
    let mut login = Vec::new();
    for _ in 0..6 {
        login.push(
            status(&mut svc, request("POST", "/login", "192.0.2.1:1"))
                .await
                .as_u16(),
        );
    }
    assert_eq!(login, [200, 200, 200, 200, 200, 429]);
    // GET /: 10 per minute, another client; the first client's logins did not count.
    let mut index = Vec::new();
    for _ in 0..11 {
        index.push(
            status(&mut svc, request("GET", "/", "192.0.2.2:1"))
                .await
                .as_u16(),
        );
    }
    assert_eq!(index.iter().filter(|&&s| s == 200).count(), 10);
    assert_eq!(index[10], 429);
    // /api costs 2 against a burst of 20: ten requests.
    let mut api = Vec::new();
    for _ in 0..11 {
        api.push(
            status(&mut svc, request("GET", "/api/users", "192.0.2.3:1"))
                .await
                .as_u16(),
        );
    }
    assert_eq!(api.iter().filter(|&&s| s == 200).count(), 10);
}

/// Issue 24, trap 1: with the shipped file, `turnstile quota set 127.0.0.1 --tier pro` lifts
/// that client's general and /api limits, never its POST /login guard.
#[tokio::test(flavor = "current_thread")]
async fn a_tier_set_for_a_client_keeps_its_login_guard() {
    let backend = tower_turnstile::MemoryBackend::new();
    tower_turnstile::Quotas::set_tier(&backend, "127.0.0.1", Some("pro"))
        .await
        .unwrap();
    let layer = LayerConfig::from_file(EXAMPLE)
        .unwrap()
        .builder()
        .backend(backend)
        .build()
        .unwrap();
    let mut svc = layer.layer(inner());
    let mut login = Vec::new();
    for _ in 0..6 {
        login.push(
            status(&mut svc, request("POST", "/login", "127.0.0.1:1"))
                .await
                .as_u16(),
        );
    }
    assert_eq!(
        login,
        [200, 200, 200, 200, 200, 429],
        "the login guard holds"
    );
    // The tier names per-ip: 1000 per minute instead of 10.
    for _ in 0..30 {
        assert_eq!(
            status(&mut svc, request("GET", "/", "127.0.0.1:1")).await,
            StatusCode::OK
        );
    }
    // ... and api-per-ip (a burst of 100 instead of 20), at cost 2.
    for _ in 0..30 {
        assert_eq!(
            status(&mut svc, request("GET", "/api/users", "127.0.0.1:1")).await,
            StatusCode::OK
        );
    }
}

#[test]
fn a_bad_limit_is_named_by_line_and_field() {
    let text = "policies = [\"gcra:limit=10,period=1s\"]\n\n[[rules]]\npath = \"/a\"\npolicies = [\"gcra:limit=1,period=1s\"]\n\n[[rules]]\npath = \"/b\"\npolicies = [\n  \"fixed-window:limit=0,period=1s\",\n]\n";
    assert_eq!(
        err(text),
        "turnstile.toml:10:3: rules[1].policies[0]: limit 0 is out of range (1 to 4294967295)"
    );
    let e = LayerConfig::from_toml("turnstile.toml", text).unwrap_err();
    assert_eq!(e.line(), Some(10));
    assert_eq!(e.field(), "rules[1].policies[0]");
    assert_eq!(
        e.snippet().unwrap(),
        "   |\n10 |   \"fixed-window:limit=0,period=1s\",\n   |   ^"
    );
}

#[test]
fn a_table_policy_names_its_field() {
    let text = "[[rules]]\npath = \"/a\"\npolicies = [{ algorithm = \"gcra\", limit = 0, period = \"1s\" }]\n";
    assert_eq!(
        err(text),
        "turnstile.toml:3:43: rules[0].policies[0].limit: limit 0 is out of range (1 to 4294967295)"
    );
    let text = "policies = [{ algorithm = \"gcra\", limit = 5, period = \"1.5s\" }]\n";
    assert!(
        err(text).starts_with("turnstile.toml:1:55: policies[0].period: invalid duration \"1.5s\""),
        "{}",
        err(text)
    );
    let text =
        "policies = [{ algorithm = \"fixed-window\", limit = 5, period = \"1s\", burst = 9 }]\n";
    assert_eq!(
        err(text),
        "turnstile.toml:1:13: policies[0]: fixed-window is a window algorithm and takes no burst"
    );
    let text = "policies = [{ algorithm = \"gcra\", limit = 5, period = \"1s\", brust = 9 }]\n";
    assert!(
        err(text).starts_with("turnstile.toml:1:61: policies[0].brust: unknown field `brust`"),
        "{}",
        err(text)
    );
}

#[test]
fn broken_files_say_what_and_where() {
    let cases: &[(&str, &str)] = &[
        ("policies = [\"gcra:limit=5,period=1s\"\n", "turnstile.toml:1:"),
        (
            "key = \"cookie\"\npolicies = [\"gcra:limit=5,period=1s\"]\n",
            "turnstile.toml:1:7: key: unknown key source \"cookie\"",
        ),
        (
            "key = \"ip\"\ntrusted_proxies = [\"10.0.0.0/8\"]\npolicies = [\"gcra:limit=5,period=1s\"]\n",
            "turnstile.toml:2:19: trusted_proxies: trusted_proxies applies to the client-ip key only",
        ),
        (
            "key = \"client-ip\"\ntrusted_proxies = [\"10.0.0.0/33\"]\npolicies = [\"gcra:limit=5,period=1s\"]\n",
            "turnstile.toml:2:20: trusted_proxies[0]: \"10.0.0.0/33\" is not a network",
        ),
        (
            "[[rules]]\nmethods = [\"get\"]\npolicies = [\"gcra:limit=5,period=1s\"]\n",
            "turnstile.toml:2:12: rules[0].methods[0]: method \"get\" has lowercase letters",
        ),
        (
            "[[rules]]\npath = \"/a\"\nexempt = true\npolicies = [\"gcra:limit=5,period=1s\"]\n",
            "turnstile.toml:1:1: rules[0]: an exempt rule takes no policies",
        ),
        (
            "[[rules]]\npath = \"/a\"\n",
            "turnstile.toml:1:1: rules[0]: the rule has no policies",
        ),
        (
            "[[rules]]\npath = \"/a\"\npolicies = [\"gcra:limit=5,period=1s,name=x\", \"gcra:limit=6,period=1s,name=x\"]\n",
            "turnstile.toml:3:46: rules[0].policies[1]: another policy of this set is named \"x\"",
        ),
        (
            "[[rules]]\npath = \"/a\"\npolicies = [\"gcra:limit=5,period=1s,name=x\"]\n[[rules]]\npath = \"/b\"\npolicies = [\"gcra:limit=6,period=1s,name=x\"]\n",
            "turnstile.toml:6:13: rules[1].policies[0]: rules[0].policies[0] also has a policy named \"x\", with different parameters",
        ),
        (
            "policies = [\"gcra:limit=5,period=1s\"]\n[tiers]\n\"gold star\" = [\"gcra:limit=5,period=1s\"]\n",
            "turnstile.toml:3:15: tiers.gold star: tier name \"gold star\" is not",
        ),
        (
            "policies = [\"gcra:limit=5,period=1s\"]\naction = { delay = \"soon\" }\n",
            "turnstile.toml:2:20: action.delay: invalid duration \"soon\"",
        ),
        (
            "policies = [\"gcra:limit=5,period=1s\"]\naction = \"drop\"\n",
            "turnstile.toml:2:10: action: unknown variant `drop`, expected one of `reject`, `shadow`, `delay`",
        ),
        (
            "policies = [\"leaky-bucket:limit=5,period=1s\"]\naction = { delay = \"100ms\" }\n",
            "turnstile.toml:1:13: policies[0]: leaky-bucket policy \"leaky-bucket:limit=5,period=1s\" can delay a request by up to 800 ms, more than the maximum wait of 100 ms",
        ),
        (
            "[backend]\nurl = \"http://x\"\n",
            "turnstile.toml:2:7: backend.url: \"http://x\" is not a Redis URL",
        ),
        (
            "[[rules]]\npath = \"/\"\ngrpc_service = \"a.B\"\npolicies = [\"gcra:limit=5,period=1s\"]\n",
            "turnstile.toml:1:1: rules[0]: no request can match this rule: path \"/\" is not a path /a.B/<method> of its gRPC calls",
        ),
        (
            "[[rules]]\npath_prefix = \"/api\"\ngrpc_method = \"a.B/M\"\nexempt = true\n",
            "turnstile.toml:1:1: rules[0]: no request can match this rule: no path /a.B/M of its gRPC calls lies under path_prefix \"/api\"",
        ),
        ("key = \"ip\"\n", "turnstile.toml: no policy applies to any request"),
        (
            "policies = [\"gcra:limit=5,period=1s\"]\ntier_header = \"x-plan\"\n",
            "turnstile.toml:2:15: tier_header: the header names a tier per request, but the file defines no `[tiers]`",
        ),
        (
            "policies = [\"gcra:limit=5,period=1s\"]\ntier_header = \"x plan\"\n[tiers]\npro = [\"gcra:limit=9,period=1s\"]\n",
            "turnstile.toml:2:15: tier_header: \"x plan\" is not a header name",
        ),
        (
            "policies = [\"gcra:limit=5,period=1s\"]\n[[rules]]\npreflight = true\nmethods = [\"OPTIONS\"]\nexempt = true\n",
            "turnstile.toml:2:1: rules[0]: `preflight = true` matches OPTIONS requests only; drop `methods`",
        ),
        (
            "polices = [\"gcra:limit=5,period=1s\"]\n",
            "turnstile.toml:1:1: polices: unknown field `polices`",
        ),
    ];
    let wrong: Vec<String> = cases
        .iter()
        .filter_map(|(text, want)| {
            let got = err(text);
            (!got.starts_with(want)).then(|| format!("{text:?}\n got: {got}\nwant: {want}"))
        })
        .collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn keys_map_as_documented() {
    let key = |spec: &str| {
        let text = format!("key = {spec}\npolicies = [\"gcra:limit=5,period=1s\"]\n");
        LayerConfig::from_toml("t.toml", &text)
            .unwrap()
            .key()
            .clone()
    };
    use tower_turnstile::KeyExtractor;
    let mut req = request(
        "POST",
        "/helloworld.Greeter/SayHello",
        "[2001:db8:1:2::7]:1",
    );
    req.headers_mut()
        .insert("x-api-key", "k|1".parse().unwrap());
    assert_eq!(key("\"ip\"").extract(&req).unwrap(), "2001:db8:1:2::/64");
    assert_eq!(key("\"header:x-api-key\"").extract(&req).unwrap(), "k|1");
    assert_eq!(
        key("\"grpc-method\"").extract(&req).unwrap(),
        "helloworld.Greeter/SayHello"
    );
    assert_eq!(key("\"global\"").extract(&req).unwrap(), "global");
    assert_eq!(
        key("[\"header:x-api-key\", \"ip\"]").extract(&req).unwrap(),
        "k%7C1|2001:db8:1:2::/64"
    );
    assert_eq!(
        key("[\"grpc-method\", \"client-ip\", \"global\"]")
            .extract(&req)
            .unwrap(),
        "helloworld.Greeter/SayHello|2001:db8:1:2::/64|global"
    );
    // client-ip believes the proxy.
    let text = "key = \"client-ip\"\ntrusted_proxies = [\"2001:db8::/32\"]\nforwarded_header = \"x-forwarded-for\"\nipv6_prefix = 128\npolicies = [\"gcra:limit=5,period=1s\"]\n";
    let k = LayerConfig::from_toml("t.toml", text)
        .unwrap()
        .key()
        .clone();
    req.headers_mut()
        .insert("x-forwarded-for", "192.0.2.9".parse().unwrap());
    assert_eq!(k.extract(&req).unwrap(), "192.0.2.9");
    assert!(err("key = [\"ip\", \"ip\"]\n").contains("key source \"ip\" is given twice"));
}

#[tokio::test(flavor = "current_thread")]
async fn settings_reach_the_layer() {
    let text = r#"
key = "header:x-api-key"
on_missing_key = { key = "anonymous" }
action = "shadow"
cost = 3
policies = [{ algorithm = "fixed-window", limit = 6, period = "1h", name = "api" }]
[backend]
failure = "closed"
max_keys = 10
"#;
    let config = LayerConfig::from_toml("t.toml", text).unwrap();
    assert_eq!(config.failure_policy(), FailurePolicy::Closed);
    let layer = config.builder().build().unwrap();
    let mut svc = layer.clone().layer(inner());
    // Shadow: all admitted, but the third request without a key would have been denied
    // (cost 3 against 6 per hour under the shared key "anonymous").
    for _ in 0..3 {
        assert_eq!(
            status(&mut svc, request("GET", "/", "192.0.2.1:1")).await,
            StatusCode::OK
        );
    }
    assert_eq!(layer.shadow_denied(), 1);
}

#[tokio::test(flavor = "current_thread")]
async fn a_preflight_rule_in_the_file_exempts_cors_preflights() {
    let config = LayerConfig::from_toml(
        "t.toml",
        "policies = [\"fixed-window:limit=1,period=1m,name=per-ip\"]\n[[rules]]\npreflight = true\nexempt = true\n",
    )
    .unwrap();
    assert!(config.to_string().contains("preflight: exempt"), "{config}");
    let mut svc = config.builder().build().unwrap().layer(inner());
    for _ in 0..3 {
        let mut req = request("OPTIONS", "/", "192.0.2.1:4000");
        req.headers_mut().insert(
            http::header::ACCESS_CONTROL_REQUEST_METHOD,
            http::HeaderValue::from_static("GET"),
        );
        assert_eq!(status(&mut svc, req).await, StatusCode::OK);
    }
    let get = || request("GET", "/", "192.0.2.1:4000");
    assert_eq!(status(&mut svc, get()).await, StatusCode::OK);
    assert_eq!(status(&mut svc, get()).await, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test(flavor = "current_thread")]
async fn a_tier_header_names_each_requests_tier() {
    let config = LayerConfig::from_toml(
        "t.toml",
        r#"
key = "header:x-api-key"
tier_header = "x-plan"
policies = ["fixed-window:limit=1,period=1h,name=per-user"]
[tiers]
premium = ["fixed-window:limit=3,period=1h,name=per-user"]
"#,
    )
    .unwrap();
    assert_eq!(config.tier_header().map(|h| h.as_str()), Some("x-plan"));
    assert!(
        config
            .to_string()
            .contains("tier per request: named by the x-plan header"),
        "{config}"
    );
    let mut svc = config.builder().build().unwrap().layer(inner());
    let send = |key: &str, plan: Option<&str>| {
        let mut r = request("GET", "/", "192.0.2.1:4000");
        r.headers_mut().insert("x-api-key", key.parse().unwrap());
        if let Some(plan) = plan {
            r.headers_mut().insert("x-plan", plan.parse().unwrap());
        }
        r
    };
    let mut got = Vec::new();
    for (key, plan, n) in [
        ("a", None, 2),
        ("b", Some("premium"), 4),
        ("c", Some("platinum"), 2),
        ("d", Some(""), 2),
    ] {
        let mut s = Vec::new();
        for _ in 0..n {
            s.push(status(&mut svc, send(key, plan)).await.as_u16());
        }
        got.push(s);
    }
    assert_eq!(
        got,
        [
            vec![200, 429],
            vec![200, 200, 200, 429],
            vec![200, 429],
            vec![200, 429]
        ]
    );
}

#[test]
fn tls_files_come_from_the_backend_table() {
    let text = r#"
policies = ["gcra:limit=5,period=1s"]
[backend]
url = "rediss://redis.internal:6380"
tls_ca = "/etc/turnstile/ca.pem"
tls_cert = "certs/client.pem"
tls_key = "certs/client.key"
"#;
    let config = LayerConfig::from_toml("t.toml", text).unwrap();
    let b = config.backend();
    assert_eq!(b.url(), Some("rediss://redis.internal:6380"));
    assert_eq!(
        b.tls_ca(),
        Some(std::path::Path::new("/etc/turnstile/ca.pem"))
    );
    assert_eq!(
        b.tls_client_cert(),
        Some((
            std::path::Path::new("certs/client.pem"),
            std::path::Path::new("certs/client.key")
        ))
    );
    let shown = config.to_string();
    assert!(
        shown.contains("backend: redis rediss://redis.internal:6380, TLS CA /etc/turnstile/ca.pem, TLS client certificate certs/client.pem (key certs/client.key)"),
        "{shown}"
    );
    // Without TLS files: none.
    let plain = LayerConfig::from_toml(
        "t.toml",
        "policies = [\"gcra:limit=5,period=1s\"]\n[backend]\nurl = \"rediss://r:6380\"\n",
    )
    .unwrap();
    assert_eq!(plain.backend().tls_ca(), None);
    assert_eq!(plain.backend().tls_client_cert(), None);
}

#[test]
fn tls_misconfigurations_are_named_by_line_and_field() {
    let head = "policies = [\"gcra:limit=5,period=1s\"]\n[backend]\n";
    let cases = [
        (
            "url = \"rediss://r:6380\"\ntls_key = \"c.key\"\n",
            "turnstile.toml:4:11: backend.tls_key: tls_key needs tls_cert, the client certificate it belongs to",
        ),
        (
            "url = \"rediss://r:6380\"\ntls_cert = \"c.pem\"\n",
            "turnstile.toml:4:12: backend.tls_cert: tls_cert needs tls_key, the certificate's private key",
        ),
        (
            "url = \"redis://r:6379\"\ntls_ca = \"ca.pem\"\n",
            "turnstile.toml:4:10: backend.tls_ca: TLS files need a rediss:// url (TLS) for every node",
        ),
        (
            "tls_cert = \"c.pem\"\ntls_key = \"c.key\"\n",
            "turnstile.toml:3:12: backend.tls_cert: TLS files need a rediss:// url (TLS) for every node",
        ),
        (
            "url = \"rediss://a:7000,redis://b:7001\"\ntls_ca = \"ca.pem\"\n",
            "turnstile.toml:4:10: backend.tls_ca: TLS files need a rediss:// url (TLS) for every node",
        ),
        (
            "url = \"rediss://r:6380/#insecure\"\ntls_ca = \"ca.pem\"\n",
            "turnstile.toml:4:10: backend.tls_ca: the url's #insecure turns certificate verification off",
        ),
        (
            "url = \"rediss://r:6380\"\ntls_ca = \"\"\n",
            "turnstile.toml:4:10: backend.tls_ca: \"\" is not a file path",
        ),
        (
            "url = \"rediss://r:6380\"\ntls_ca = 3\n",
            "turnstile.toml:4:10: backend.tls_ca: invalid type: integer `3`, expected a string (file path)",
        ),
        (
            "url = \"rediss://r:6380\"\ntls_crt = \"c.pem\"\n",
            "turnstile.toml:4:1: backend.tls_crt: unknown field `tls_crt`",
        ),
    ];
    let wrong: Vec<String> = cases
        .iter()
        .filter_map(|(text, want)| {
            let got = err(&format!("{head}{text}"));
            (!got.starts_with(want)).then(|| format!("{text:?}\n got: {got}\nwant: {want}"))
        })
        .collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
