//! `turnstile quota`: live quotas on Redis — peek, reset, refund, and a key's override and
//! tier — as JSON.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use serde_json::{json, Value};
use tower_turnstile::config::LayerConfig;
use turnstile_core::round::ceil_ms;
use turnstile_core::{Decision, KeyConfig, Limits, Policy, Quotas};
use turnstile_redis::{KeyEncoding, RedisBackend};

/// Exit code when Redis fails or the request cannot be carried out.
const EXIT_FAILED: u8 = 1;

/// The Redis URL without --redis-url or a configuration file's `[backend] url`.
const DEFAULT_URL: &str = "redis://127.0.0.1:6379";

/// The arguments of `turnstile quota`.
#[derive(Debug, Args)]
pub(crate) struct QuotaArgs {
    /// The services' configuration file: its `[backend]` URL, prefix and TLS files (unless
    /// given here), its rules and tiers (peek and reset answer per rule; set says which
    /// rules an override's or a tier's policies reach).
    #[arg(long, value_name = "FILE", global = true)]
    pub(crate) config: Option<PathBuf>,

    /// The Redis the services use (several comma-separated URLs for a Cluster). Default:
    /// the --config file's `[backend] url`, else redis://127.0.0.1:6379.
    #[arg(long, value_name = "URL", global = true)]
    pub(crate) redis_url: Option<String>,

    /// TLS for a rediss:// --redis-url.
    #[command(flatten)]
    pub(crate) tls: crate::backend::TlsArgs,

    /// The key prefix the services use. Default: the --config file's `[backend] prefix`,
    /// else turnstile:v1 (the library's default).
    #[arg(long, global = true)]
    pub(crate) prefix: Option<String>,

    /// The services store client keys as they are (`KeyEncoding::Plain`) rather than hashed.
    #[arg(long, global = true)]
    pub(crate) plain_keys: bool,

    /// The per-call timeout.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_timeout, global = true)]
    pub(crate) timeout: Duration,

    /// What to do.
    #[command(subcommand)]
    pub(crate) command: QuotaCommand,
}

/// The policies that may apply to a key, as the service configures them: its default
/// policies and its tiers. A key's override (stored in Redis) needs neither.
#[derive(Debug, Args)]
pub(crate) struct AppPolicies {
    /// One of the service's default policies (repeat for several), as a policy string.
    #[arg(long = "policy", value_name = "SPEC")]
    pub(crate) policies: Vec<Policy>,

    /// A policy of one of the service's tiers: NAME=SPEC (repeat for several).
    #[arg(long = "tier-policy", value_name = "NAME=SPEC", value_parser = parse_tier_policy)]
    pub(crate) tier_policies: Vec<(String, Policy)>,
}

/// The subcommands of `turnstile quota`. KEY is the client key exactly as the service's key
/// extractor produces it (see the README, "Live quotas").
#[derive(Debug, Subcommand)]
pub(crate) enum QuotaCommand {
    /// Every policy's remaining and reset_after for KEY, without consuming anything.
    Peek {
        /// The client key.
        key: String,
        /// The service's policies.
        #[command(flatten)]
        app: AppPolicies,
    },
    /// Forget KEY's state under every policy that applies to it (its configuration stays).
    Reset {
        /// The client key.
        key: String,
        /// The service's policies.
        #[command(flatten)]
        app: AppPolicies,
    },
    /// Give COST units back to KEY under every policy that applies to it.
    Refund {
        /// The client key.
        key: String,
        /// Units to give back (never beyond a fresh key's capacity).
        #[arg(long)]
        cost: u64,
        /// The service's policies.
        #[command(flatten)]
        app: AppPolicies,
    },
    /// Give KEY its own policies (an override; repeat --policy) or a tier (--tier).
    Set {
        /// The client key.
        key: String,
        /// A policy of the override (repeat for several).
        #[arg(
            long = "policy",
            value_name = "SPEC",
            conflicts_with = "tier",
            required_unless_present = "tier"
        )]
        policies: Vec<Policy>,
        /// The tier to map KEY to.
        #[arg(long, value_name = "NAME")]
        tier: Option<String>,
    },
    /// KEY's stored configuration: its override, its tier, its version.
    Get {
        /// The client key.
        key: String,
    },
    /// Remove KEY's configuration: its override and its tier.
    Rm {
        /// The client key.
        key: String,
    },
}

fn parse_timeout(s: &str) -> Result<Duration, String> {
    turnstile_core::policy::parse_duration(s).map_err(|e| e.to_string())
}

fn parse_tier_policy(s: &str) -> Result<(String, Policy), String> {
    let (name, spec) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not NAME=SPEC"))?;
    turnstile_core::quota::validate_tier_name(name).map_err(|e| e.to_string())?;
    let policy = spec.parse::<Policy>().map_err(|e| e.to_string())?;
    Ok((name.to_owned(), policy))
}

/// Runs `turnstile quota`; prints one JSON object on stdout, or an error on stderr.
pub(crate) fn run(args: QuotaArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return fail(&format!("cannot start a runtime: {e}")),
    };
    match runtime.block_on(execute(args)) {
        Ok(v) => {
            println!("{v}");
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e),
    }
}

fn fail(message: &str) -> ExitCode {
    eprintln!("turnstile quota: {message}");
    ExitCode::from(EXIT_FAILED)
}

async fn execute(args: QuotaArgs) -> Result<Value, String> {
    let config = match &args.config {
        Some(file) => {
            Some(LayerConfig::from_file(file).map_err(|e| format!("{}: {e}", file.display()))?)
        }
        None => None,
    };
    let redis = open(&args, config.as_ref())?;
    let e = |e: turnstile_core::BackendError| describe(&redis, e);
    let per_rule = |app: &AppPolicies| {
        config
            .as_ref()
            .filter(|_| app.policies.is_empty() && app.tier_policies.is_empty())
    };
    match args.command {
        QuotaCommand::Peek { key, app } => match per_rule(&app) {
            Some(c) => each_rule(&redis, &key, c, Op::Peek).await,
            None => {
                let limits = limits_for(&redis, &key, app, config.as_ref()).await?;
                let d = redis.peek(&key, &limits, None).await.map_err(e)?;
                Ok(decision_json(&key, &d))
            }
        },
        QuotaCommand::Reset { key, app } => {
            warn_if_alone(&redis, &key).await;
            match per_rule(&app) {
                Some(c) => each_rule(&redis, &key, c, Op::Reset).await,
                None => {
                    let limits = limits_for(&redis, &key, app, config.as_ref()).await?;
                    let d = redis.reset(&key, &limits, None).await.map_err(e)?;
                    Ok(decision_json(&key, &d))
                }
            }
        }
        QuotaCommand::Refund { key, cost, app } => {
            if per_rule(&app).is_some() {
                // Two rules may share a policy (and its counter): a refund per rule could
                // give the same units back twice.
                return Err(
                    "refund gives units back to the policies given with --policy (and --tier-policy): name them (the rule's, as `turnstile check-config` prints them)".into(),
                );
            }
            warn_if_alone(&redis, &key).await;
            let limits = limits_for(&redis, &key, app, config.as_ref()).await?;
            let d = redis.refund(&key, &limits, cost, None).await.map_err(e)?;
            Ok(decision_json(&key, &d))
        }
        QuotaCommand::Set {
            key,
            policies,
            tier,
        } => set(&redis, &key, policies, tier, config.as_ref()).await,
        QuotaCommand::Get { key } => Ok(config_json(&key, &redis.config(&key).await.map_err(e)?)),
        QuotaCommand::Rm { key } => {
            warn_if_alone(&redis, &key).await;
            let c = redis.clear_config(&key).await.map_err(e)?;
            Ok(config_json(&key, &c))
        }
    }
}

/// The services' Redis: the flags' URL, prefix and TLS files, else `config`'s `[backend]`,
/// else the defaults.
fn open(args: &QuotaArgs, config: Option<&LayerConfig>) -> Result<RedisBackend, String> {
    let backend = config.map(LayerConfig::backend);
    let url = (args.redis_url.as_deref())
        .or_else(|| backend.and_then(|b| b.url()))
        .unwrap_or(DEFAULT_URL);
    let prefix = (args.prefix.as_deref())
        .or_else(|| backend.and_then(|b| b.prefix()))
        .unwrap_or(turnstile_redis::DEFAULT_PREFIX);
    let mut builder = args.tls.apply(RedisBackend::builder(url));
    // The service's key cap: the keys it takes, this command reaches.
    if let Some(n) = backend.and_then(|b| b.max_key_bytes()) {
        builder = builder.max_key_bytes(n);
    }
    if let Some(b) = backend.filter(|_| args.tls.is_empty()) {
        if let Some(ca) = b.tls_ca() {
            builder = builder.tls_ca_file(ca);
        }
        if let Some((cert, key)) = b.tls_client_cert() {
            builder = builder.tls_client_cert(cert, key);
        }
    }
    builder
        .prefix(prefix)
        .key_encoding(if args.plain_keys {
            KeyEncoding::Plain
        } else {
            KeyEncoding::Hashed
        })
        .timeout(args.timeout)
        .build()
        .map_err(|e| e.to_string())
}

/// `quota set`: `key`'s tier or override, and with `config` the rules each of the policies
/// it names reaches.
async fn set(
    redis: &RedisBackend,
    key: &str,
    policies: Vec<Policy>,
    tier: Option<String>,
    config: Option<&LayerConfig>,
) -> Result<Value, String> {
    let e = |e: turnstile_core::BackendError| describe(redis, e);
    warn_if_alone(redis, key).await;
    let (c, named) = match &tier {
        Some(t) => {
            let named = config.map(|c| {
                let listed = c.tiers().find(|(n, _)| n == t).map(|(_, ps)| ps.to_vec());
                if listed.is_none() {
                    eprintln!(
                        "turnstile quota: warning: the configuration defines no tier {t:?}: {key:?} keeps every rule's policies"
                    );
                }
                listed.unwrap_or_default()
            });
            (redis.set_tier(key, Some(t)).await.map_err(e)?, named)
        }
        None => (
            redis.set_override(key, &policies).await.map_err(e)?,
            config.map(|_| policies.clone()),
        ),
    };
    let mut out = config_json(key, &c);
    if let (Some(config), Some(named)) = (config, named) {
        out["reaches"] = reaches(config, &named);
    }
    Ok(out)
}

/// What `turnstile quota` does to each rule's policies.
#[derive(Clone, Copy)]
enum Op {
    Peek,
    Reset,
}

/// `op` for `key` under each rule of `config` (its policies, the file's tiers and its
/// unconfigured behaviour): one decision per rule.
async fn each_rule(
    redis: &RedisBackend,
    key: &str,
    config: &LayerConfig,
    op: Op,
) -> Result<Value, String> {
    let mut rules = Vec::new();
    for (label, policies) in config.rule_sets() {
        let mut limits = Limits::new(policies)
            .map_err(|e| format!("rule {label:?}: {e}"))?
            .when_unconfigured(config.unconfigured());
        for (name, ps) in config.tiers() {
            limits = limits
                .with_tier(name, ps.iter().cloned())
                .map_err(|e| e.to_string())?;
        }
        let d = match op {
            Op::Peek => redis.peek(key, &limits, None).await,
            Op::Reset => redis.reset(key, &limits, None).await,
        }
        .map_err(|e| describe(redis, e))?;
        let mut one = decision_json(key, &d);
        one["rule"] = Value::from(label);
        rules.push(one);
    }
    Ok(json!({ "key": key, "rules": rules }))
}

/// For each of `named` (an override's or a tier's policies), the labels of the rules of
/// `config` that have a policy of its name (whose parameters it changes); a name that
/// reaches none is warned about on stderr.
fn reaches(config: &LayerConfig, named: &[Policy]) -> Value {
    let sets = config.rule_sets();
    let mut out = serde_json::Map::new();
    for p in named {
        let rules: Vec<&str> = sets
            .iter()
            .filter(|(_, ps)| ps.iter().any(|q| q.name() == p.name()))
            .map(|(label, _)| label.as_str())
            .collect();
        if rules.is_empty() {
            eprintln!(
                "turnstile quota: warning: no rule of the configuration has a policy named {:?}: it changes nothing (a tier or an override changes the policies it names; `turnstile check-config` prints their names)",
                p.name()
            );
        }
        out.insert(p.name().to_owned(), json!(rules));
    }
    Value::Object(out)
}

/// Warns on stderr when no other client's key exists under the prefix this write lands
/// under (on a single node): the services likely use another prefix.
async fn warn_if_alone(redis: &RedisBackend, key: &str) {
    if let Ok(Some(false)) = redis.holds_other_clients(key).await {
        eprintln!(
            "turnstile quota: warning: no key of any other client exists under prefix {:?} at {}: if the services use another prefix, they will not see this change (give it with --prefix, or their configuration file with --config)",
            redis.prefix(),
            redis.node()
        );
    }
}

/// The message for `e`: an unreachable or silent Redis is named by its URL (without
/// credentials), with how to start one and the flag that points elsewhere; a failed TLS
/// handshake says so, and which flags set what it checks.
fn describe(redis: &RedisBackend, e: turnstile_core::BackendError) -> String {
    if let turnstile_core::BackendError::Connection(source) = &e {
        if let Some(tls) = source.downcast_ref::<turnstile_redis::TlsHandshakeError>() {
            return format!(
                "{tls}. Redis answered, but the TLS handshake failed: check that --tls-ca FILE (or the system trust store) holds the CA that signed the server's certificate, that the URL's host is a name in that certificate, and, when the server asks for a client certificate, --tls-cert and --tls-key"
            );
        }
    }
    match e {
        turnstile_core::BackendError::Connection(_) | turnstile_core::BackendError::Timeout { .. } => format!(
            "cannot reach Redis at {} ({e}). Start one (`redis-server --daemonize yes`; scripts/test installs it) or give the services' Redis with --redis-url URL",
            redis.node()
        ),
        other => other.to_string(),
    }
}

/// The limits to resolve `key` against: the service's defaults and tiers. Without
/// defaults, the key must have an override (or a tier given with --tier-policy).
async fn limits_for(
    redis: &RedisBackend,
    key: &str,
    app: AppPolicies,
    config: Option<&LayerConfig>,
) -> Result<Limits, String> {
    let mut tiers: Vec<(String, Vec<Policy>)> = Vec::new();
    if app.tier_policies.is_empty() {
        // The configuration file's tiers, when it is given.
        for (name, ps) in config.iter().flat_map(|c| c.tiers()) {
            tiers.push((name.to_owned(), ps.to_vec()));
        }
    }
    for (name, p) in app.tier_policies {
        match tiers.iter_mut().find(|(n, _)| *n == name) {
            Some((_, ps)) => ps.push(p),
            None => tiers.push((name, vec![p])),
        }
    }
    let config = redis.config(key).await.map_err(|e| describe(redis, e))?;
    let defaults = if !app.policies.is_empty() {
        app.policies
    } else if let Some(o) = config.policies() {
        // The override decides; the defaults are never used.
        o.to_vec()
    } else if let Some((_, ps)) = config
        .tier()
        .and_then(|t| tiers.iter().find(|(n, _)| n == t))
    {
        ps.clone()
    } else {
        return Err(match config.tier() {
            Some(t) => format!(
                "{key:?} is in tier {t:?}: give that tier's policies with --tier-policy {t}=SPEC (or the service's defaults with --policy)"
            ),
            None => format!(
                "{key:?} has no override or tier: give the service's default policies with --policy SPEC"
            ),
        });
    };
    if let Some(t) = config.tier() {
        if config.policies().is_none() && !tiers.iter().any(|(n, _)| n == t) {
            // Say so rather than silently answer for the defaults.
            eprintln!(
                "turnstile quota: note: {key:?} is in tier {t:?}, whose policies were not given (--tier-policy {t}=SPEC); answering for the default policies, as a service that does not define that tier would"
            );
        }
    }
    let mut limits = Limits::new(defaults).map_err(|e| e.to_string())?;
    for (name, ps) in tiers {
        limits = limits.with_tier(&name, ps).map_err(|e| e.to_string())?;
    }
    Ok(limits)
}

fn decision_json(key: &str, d: &Decision) -> Value {
    let tier = match d.applied() {
        turnstile_core::Applied::Tier(t) => Value::from(&**t),
        _ => Value::Null,
    };
    let policies: Vec<Value> = d
        .policies()
        .iter()
        .zip(d.sources())
        .map(|(p, source)| {
            let from = match &source {
                turnstile_core::Source::Tier(t) => format!("tier {t}"),
                other => other.label().to_owned(),
            };
            json!({
                "name": p.name(),
                "policy": p.policy().to_string(),
                "from": from,
                "remaining": p.remaining(),
                "reset_after_ms": ceil_ms(p.reset_after()),
            })
        })
        .collect();
    json!({
        "key": key,
        "applied": d.applied().label(),
        "tier": tier,
        "version": d.version(),
        "remaining": d.remaining(),
        "reset_after_ms": ceil_ms(d.reset_after()),
        "policies": policies,
    })
}

fn config_json(key: &str, c: &KeyConfig) -> Value {
    json!({
        "key": key,
        "override": c.policies().map(|ps| ps.iter().map(ToString::to_string).collect::<Vec<_>>()),
        "tier": c.tier(),
        "version": c.version(),
    })
}
