//! [`Rule`]: which policies apply to which requests.

use std::fmt;
use std::sync::Arc;

use http::{HeaderValue, Method};
use turnstile_core::Policy;

use crate::key::{grpc_path, RequestRef};
use crate::tier::Chosen;

/// A function giving a request's cost in units.
pub(crate) type CostFn = Arc<dyn Fn(&RequestRef<'_>) -> u64 + Send + Sync>;

/// Which requests a rule matches and what it applies to them: its policies (checked
/// together, all-or-nothing) with a cost per request, or nothing at all (exempt).
///
/// A rule matches a request when every condition given matches (no condition: every
/// request). A layer tries its rules in order and applies the first that matches; a request
/// no rule matches gets the layer's own policies (if any).
///
/// # Policy names
/// Two checks share state exactly when key and policy name match. A policy without an
/// explicit name ([`Policy::with_name`]) is named after the rule that applies it — the
/// rule's [`Rule::name`], else a label such as `POST /login` — followed by its parameters:
/// `POST /login fixed-window:limit=5,period=1m`. So two rules never share a counter by
/// accident; give their policies the same explicit name to share one.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use http::Method;
/// use tower_turnstile::{Policy, Rule};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let login = Rule::new()
///     .method(Method::POST)
///     .path("/login")
///     .policy(Policy::sliding_log(5, Duration::from_secs(60))?);
/// let health = Rule::new().path("/healthz").exempt();
/// let greeter = Rule::new()
///     .grpc_method("helloworld.Greeter", "SayHello")
///     .policy(Policy::token_bucket(5, Duration::from_secs(60))?);
/// # let _ = (login, health, greeter); Ok(()) }
/// ```
#[derive(Clone)]
#[must_use]
pub struct Rule {
    pub(crate) name: Option<String>,
    methods: Vec<Method>,
    path: Option<PathMatch>,
    grpc: Option<(String, Option<String>)>,
    preflight: bool,
    pub(crate) policies: Vec<Policy>,
    pub(crate) exempt: bool,
    pub(crate) cost: Option<CostFn>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum PathMatch {
    Exact(String),
    Prefix(String),
}

impl fmt::Debug for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rule")
            .field("label", &self.label())
            .field("policies", &self.policies)
            .field("exempt", &self.exempt)
            .field("cost", &self.cost.as_ref().map(|_| "fn"))
            .finish()
    }
}

impl Default for Rule {
    fn default() -> Self {
        Self::new()
    }
}

impl Rule {
    /// A rule that matches every request and applies nothing yet.
    pub fn new() -> Self {
        Rule {
            name: None,
            methods: Vec::new(),
            path: None,
            grpc: None,
            preflight: false,
            policies: Vec::new(),
            exempt: false,
            cost: None,
        }
    }

    /// A rule that exempts CORS preflight requests: `OPTIONS` with an
    /// `Access-Control-Request-Method` header (the Fetch standard's CORS-preflight request),
    /// which browsers send on their own before a cross-origin call. Put it first:
    /// `builder.rule(Rule::preflight())`. In a TOML file: a rule with `preflight = true` and
    /// `exempt = true`.
    ///
    /// Preflights are not exempt by default: the layer limits every request it sees. The
    /// usual layout needs no rule at all — tower-http's `CorsLayer` *outside* the limiter
    /// answers preflights before they reach it — and an exemption by default would let
    /// anyone send unlimited requests to the inner service by adding one header wherever
    /// the CORS layer is not in front. Use this rule when the application answers preflights
    /// itself (or the CORS layer sits inside the limiter).
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tower_turnstile::{Policy, RateLimitLayer, Rule};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let layer = RateLimitLayer::builder()
    ///     .rule(Rule::preflight())
    ///     .policy(Policy::token_bucket(10, Duration::from_secs(60))?)
    ///     .build()?;
    /// # let _ = layer; Ok(()) }
    /// ```
    pub fn preflight() -> Self {
        Rule::new().cors_preflight().exempt()
    }

    /// Matches CORS preflight requests only: method `OPTIONS` and an
    /// `Access-Control-Request-Method` header. (A plain `OPTIONS` request without that header
    /// is not a preflight; match it with `method(Method::OPTIONS)`.) Combined with
    /// [`Rule::method`] it matches only if `OPTIONS` is among the methods.
    pub fn cors_preflight(mut self) -> Self {
        self.preflight = true;
        self
    }

    /// Names the rule; unnamed policies are then named `<name> <parameters>`.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Matches requests with method `method` (call again to allow several methods).
    pub fn method(mut self, method: Method) -> Self {
        if !self.methods.contains(&method) {
            self.methods.push(method);
        }
        self
    }

    /// Matches requests whose path is exactly `path` (the path as the layer sees it; a router
    /// nested under a prefix sees its own paths).
    pub fn path(mut self, path: impl Into<String>) -> Self {
        self.path = Some(PathMatch::Exact(path.into()));
        self
    }

    /// Matches requests whose path is `prefix` or lies under it, segment-wise: `/api`
    /// matches `/api`, `/api/` and `/api/users`, not `/apiary`.
    pub fn path_prefix(mut self, prefix: impl Into<String>) -> Self {
        let mut prefix = prefix.into();
        while prefix.len() > 1 && prefix.ends_with('/') {
            prefix.pop();
        }
        self.path = Some(PathMatch::Prefix(prefix));
        self
    }

    /// Matches gRPC calls to any method of `service` (fully qualified, e.g.
    /// `helloworld.Greeter`).
    pub fn grpc_service(mut self, service: impl Into<String>) -> Self {
        self.grpc = Some((service.into(), None));
        self
    }

    /// Matches gRPC calls to `service`'s `method`, e.g. `("helloworld.Greeter", "SayHello")`.
    pub fn grpc_method(mut self, service: impl Into<String>, method: impl Into<String>) -> Self {
        self.grpc = Some((service.into(), Some(method.into())));
        self
    }

    /// Adds a policy to check on matching requests (all of a rule's policies are checked
    /// together, all-or-nothing).
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policies.push(policy);
        self
    }

    /// Adds several policies.
    pub fn policies(mut self, policies: impl IntoIterator<Item = Policy>) -> Self {
        self.policies.extend(policies);
        self
    }

    /// Makes matching requests exempt: never checked, never counted, no rate-limit headers.
    pub fn exempt(mut self) -> Self {
        self.exempt = true;
        self
    }

    /// Charges matching requests `cost(request)` units instead of the layer's cost (default
    /// 1). A cost of 0 is a query: always admitted, counting nothing.
    pub fn cost<F>(mut self, cost: F) -> Self
    where
        F: Fn(&RequestRef<'_>) -> u64 + Send + Sync + 'static,
    {
        self.cost = Some(Arc::new(cost));
        self
    }

    /// Whether the rule matches `req`: at once for a rule without conditions.
    #[inline]
    pub(crate) fn matches(&self, req: &RequestRef<'_>) -> bool {
        let every = self.methods.is_empty()
            && !self.preflight
            && self.path.is_none()
            && self.grpc.is_none();
        every || self.meets_conditions(req)
    }

    /// Whether `req` meets each of the rule's conditions.
    #[inline(never)]
    fn meets_conditions(&self, req: &RequestRef<'_>) -> bool {
        if !self.methods.is_empty() && !self.methods.contains(req.method()) {
            return false;
        }
        if self.preflight
            && (req.method() != Method::OPTIONS
                || !req
                    .headers()
                    .contains_key(http::header::ACCESS_CONTROL_REQUEST_METHOD))
        {
            return false;
        }
        // The path only when a condition reads it (a rule for every path does not).
        match &self.path {
            Some(PathMatch::Exact(p)) if p != req.path() => return false,
            Some(PathMatch::Prefix(p)) if !under(req.path(), p) => return false,
            _ => {}
        }
        if let Some((service, method)) = &self.grpc {
            match grpc_path(req.path()) {
                Some((s, m)) if s == service && method.as_deref().is_none_or(|x| x == m) => {}
                _ => return false,
            }
        }
        true
    }

    /// Why no request can match the rule, if none can: its gRPC condition allows only paths
    /// `/<service>/<method>`, and its path condition (`path`, `path_prefix`) none of them,
    /// or a service or method name can be in no path at all (empty, or holding `/`).
    pub(crate) fn matches_nothing(&self) -> Option<String> {
        let (service, method) = self.grpc.as_ref()?;
        let target = match method {
            Some(m) => format!("/{service}/{m}"),
            None => format!("/{service}/<method>"),
        };
        let valid = |s: &str| !s.is_empty() && !s.contains('/');
        if !valid(service) || method.as_deref().is_some_and(|m| !valid(m)) {
            return Some(format!(
                "a gRPC service or method name is empty or holds `/`, so no request path is {target}"
            ));
        }
        let grpc = |p: &str| matches!(grpc_path(p), Some((s, m)) if s == service && method.as_deref().is_none_or(|x| x == m));
        match &self.path {
            Some(PathMatch::Exact(p)) if !grpc(p) => Some(format!(
                "path {p:?} is not a path {target} of its gRPC calls"
            )),
            Some(PathMatch::Prefix(p))
                if !(p.is_empty() || p == "/" || *p == format!("/{service}") || grpc(p)) =>
            {
                Some(format!(
                    "no path {target} of its gRPC calls lies under path_prefix {p:?}"
                ))
            }
            _ => None,
        }
    }

    /// The label unnamed policies are named after: the rule's name, else its conditions,
    /// e.g. `POST /login`, `GET,HEAD /api/*`, `grpc helloworld.Greeter/SayHello`, `*`.
    pub(crate) fn label(&self) -> String {
        match &self.name {
            Some(n) => n.clone(),
            None => self.conditions(),
        }
    }

    /// The rule's conditions, e.g. `POST /login`, `GET,HEAD /api/*`,
    /// `grpc helloworld.Greeter/SayHello`, `*` (whatever its name).
    pub(crate) fn conditions(&self) -> String {
        let mut parts = Vec::new();
        if self.preflight {
            parts.push("preflight".to_owned());
        }
        if !self.methods.is_empty() {
            let m: Vec<&str> = self.methods.iter().map(Method::as_str).collect();
            parts.push(m.join(","));
        }
        match &self.path {
            Some(PathMatch::Exact(p)) => parts.push(p.clone()),
            Some(PathMatch::Prefix(p)) if p == "/" => parts.push("/*".to_owned()),
            Some(PathMatch::Prefix(p)) => parts.push(format!("{p}/*")),
            None => {}
        }
        if let Some((s, m)) = &self.grpc {
            parts.push(match m {
                Some(m) => format!("grpc {s}/{m}"),
                None => format!("grpc {s}/*"),
            });
        }
        if parts.is_empty() {
            "*".to_owned()
        } else {
            parts.join(" ")
        }
    }
}

/// Whether `path` is `prefix` or lies under it segment-wise.
fn under(path: &str, prefix: &str) -> bool {
    if prefix == "/" {
        return path.starts_with('/');
    }
    path.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// A rule as the layer runs it: policies named, headers precomputed.
#[derive(Clone)]
pub(crate) struct CompiledRule {
    pub(crate) rule: Rule,
    pub(crate) policies: Arc<[Policy]>,
    /// The rule's policies with the layer's tiers; `None` for an exempt rule.
    pub(crate) limits: Option<turnstile_core::Limits>,
    /// The sets a request's tier selects, when the layer chooses tiers per request.
    pub(crate) tiers: Option<crate::tier::RuleTiers>,
    pub(crate) policy_header: HeaderValue,
    /// The rule's [`Rule::label`], for spans (which may read it on every request).
    pub(crate) label: Box<str>,
    /// The longest delay a leaky-bucket policy of this rule can ask for, (B − 1)·T, rounded
    /// up to whole nanoseconds; zero without a leaky bucket.
    pub(crate) max_leaky_delay: std::time::Duration,
}

impl CompiledRule {
    /// The limits to check for a request whose tier resolved to `chosen`; `None` for an
    /// exempt rule.
    pub(crate) fn limits_for(&self, chosen: Chosen) -> Option<&turnstile_core::Limits> {
        match (chosen, &self.tiers) {
            (Some(i), Some(t)) => t.limits(i),
            _ => self.limits.as_ref(),
        }
    }

    /// The `RateLimit-Policy` value of the policies `chosen` checks by default.
    pub(crate) fn policy_header_for(&self, chosen: Chosen) -> &HeaderValue {
        match (chosen, &self.tiers) {
            (Some(i), Some(t)) => t.header(i).unwrap_or(&self.policy_header),
            _ => &self.policy_header,
        }
    }

    /// `result` labelled with the request's tier when that tier decided.
    pub(crate) fn relabel(
        &self,
        chosen: Chosen,
        result: turnstile_core::CheckResult,
    ) -> turnstile_core::CheckResult {
        match &self.tiers {
            Some(t) if chosen.is_some() => t.relabel(chosen, result),
            _ => result,
        }
    }
}

impl fmt::Debug for CompiledRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompiledRule")
            .field("label", &self.rule.label())
            .field("policies", &self.policies)
            .field("exempt", &self.rule.exempt)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;

    fn req(method: Method, path: &str) -> Request<()> {
        Request::builder()
            .method(method)
            .uri(path)
            .body(())
            .unwrap()
    }

    #[test]
    fn matching() {
        let r = Rule::new().method(Method::POST).path("/login");
        assert!(r.matches(&RequestRef::new(&req(Method::POST, "/login"))));
        assert!(!r.matches(&RequestRef::new(&req(Method::GET, "/login"))));
        assert!(!r.matches(&RequestRef::new(&req(Method::POST, "/login/x"))));
        let p = Rule::new().path_prefix("/api/");
        for ok in ["/api", "/api/", "/api/users?x=1"] {
            assert!(p.matches(&RequestRef::new(&req(Method::GET, ok))), "{ok}");
        }
        assert!(!p.matches(&RequestRef::new(&req(Method::GET, "/apiary"))));
        let g = Rule::new().grpc_method("helloworld.Greeter", "SayHello");
        assert!(g.matches(&RequestRef::new(&req(
            Method::POST,
            "/helloworld.Greeter/SayHello"
        ))));
        assert!(!g.matches(&RequestRef::new(&req(
            Method::POST,
            "/helloworld.Greeter/SayBye"
        ))));
        let s = Rule::new().grpc_service("helloworld.Greeter");
        assert!(s.matches(&RequestRef::new(&req(
            Method::POST,
            "/helloworld.Greeter/SayBye"
        ))));
        assert!(Rule::new().matches(&RequestRef::new(&req(Method::PUT, "/x"))));
        let pre = Rule::preflight();
        let mut r = req(Method::OPTIONS, "/x");
        assert!(!pre.matches(&RequestRef::new(&r)));
        r.headers_mut().insert(
            http::header::ACCESS_CONTROL_REQUEST_METHOD,
            HeaderValue::from_static("POST"),
        );
        assert!(pre.matches(&RequestRef::new(&r)));
        *r.method_mut() = Method::GET;
        assert!(!pre.matches(&RequestRef::new(&r)));
        assert_eq!(pre.label(), "preflight");
    }

    #[test]
    fn a_grpc_rule_whose_path_no_grpc_call_has_matches_nothing() {
        // `path = "/"` with `grpc_service = "a.B"` was accepted, and never matched.
        let never = [
            Rule::new().grpc_service("a.B").path("/"),
            Rule::new().grpc_service("a.B").path("/a.B"),
            Rule::new().grpc_service("a.B").path("/a.C/M"),
            Rule::new().grpc_method("a.B", "M").path("/a.B/N"),
            Rule::new().grpc_service("a.B").path_prefix("/api"),
            Rule::new().grpc_service("a.B").path_prefix("/a"),
            Rule::new().grpc_method("a.B", "M").path_prefix("/a.B/N"),
            Rule::new().grpc_service(""),
            Rule::new().grpc_service("a/B"),
            Rule::new().grpc_method("a.B", ""),
            Rule::new().grpc_method("a.B", "M/N"),
        ];
        for r in &never {
            assert!(r.matches_nothing().is_some(), "{r:?}");
        }
        let some = [
            Rule::new().grpc_service("a.B"),
            Rule::new().grpc_service("a.B").path("/a.B/M"),
            Rule::new().grpc_method("a.B", "M").path("/a.B/M"),
            Rule::new().grpc_service("a.B").path_prefix("/"),
            Rule::new().grpc_service("a.B").path_prefix("/a.B"),
            Rule::new().grpc_service("a.B").path_prefix("/a.B/"),
            Rule::new().grpc_method("a.B", "M").path_prefix("/a.B/M"),
            Rule::new().path("/"),
            Rule::new().path_prefix("/api"),
        ];
        for r in &some {
            assert_eq!(r.matches_nothing(), None, "{r:?}");
        }
        // Each rule that can match does, on the path of a call it names.
        let call = req(Method::POST, "/a.B/M");
        for r in &some[..7] {
            assert!(r.matches(&RequestRef::new(&call)), "{r:?}");
        }
        assert_eq!(
            Rule::new().grpc_service("a.B").path("/").matches_nothing(),
            Some("path \"/\" is not a path /a.B/<method> of its gRPC calls".to_owned())
        );
    }

    #[test]
    fn labels() {
        assert_eq!(
            Rule::new().method(Method::POST).path("/login").label(),
            "POST /login"
        );
        assert_eq!(
            Rule::new()
                .method(Method::GET)
                .method(Method::HEAD)
                .path_prefix("/api")
                .label(),
            "GET,HEAD /api/*"
        );
        assert_eq!(Rule::new().grpc_service("a.B").label(), "grpc a.B/*");
        assert_eq!(Rule::new().label(), "*");
        assert_eq!(Rule::new().name("x").path("/").label(), "x");
    }
}
