//! `turnstile quota`: live quotas on Redis — peek, reset, refund, and a key's override and
//! tier — as JSON.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use serde_json::{json, Value};
use turnstile_core::round::ceil_ms;
use turnstile_core::{Decision, KeyConfig, Limits, Policy, Quotas};
use turnstile_redis::{KeyEncoding, RedisBackend};

/// Exit code when Redis fails or the request cannot be carried out.
const EXIT_FAILED: u8 = 1;

/// The arguments of `turnstile quota`.
#[derive(Debug, Args)]
pub(crate) struct QuotaArgs {
    /// The Redis the services use (several comma-separated URLs for a Cluster).
    #[arg(
        long,
        value_name = "URL",
        default_value = "redis://127.0.0.1:6379",
        global = true
    )]
    pub(crate) redis_url: String,

    /// TLS for a rediss:// --redis-url.
    #[command(flatten)]
    pub(crate) tls: crate::backend::TlsArgs,

    /// The key prefix the services use.
    #[arg(long, default_value = turnstile_redis::DEFAULT_PREFIX, global = true)]
    pub(crate) prefix: String,

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
    let redis = args
        .tls
        .apply(RedisBackend::builder(args.redis_url.as_str()))
        .prefix(args.prefix.as_str())
        .key_encoding(if args.plain_keys {
            KeyEncoding::Plain
        } else {
            KeyEncoding::Hashed
        })
        .timeout(args.timeout)
        .build()
        .map_err(|e| e.to_string())?;
    let e = |e: turnstile_core::BackendError| describe(&redis, e);
    match args.command {
        QuotaCommand::Peek { key, app } => {
            let limits = limits_for(&redis, &key, app).await?;
            let d = redis.peek(&key, &limits, None).await.map_err(e)?;
            Ok(decision_json(&key, &d))
        }
        QuotaCommand::Reset { key, app } => {
            let limits = limits_for(&redis, &key, app).await?;
            let d = redis.reset(&key, &limits, None).await.map_err(e)?;
            Ok(decision_json(&key, &d))
        }
        QuotaCommand::Refund { key, cost, app } => {
            let limits = limits_for(&redis, &key, app).await?;
            let d = redis.refund(&key, &limits, cost, None).await.map_err(e)?;
            Ok(decision_json(&key, &d))
        }
        QuotaCommand::Set {
            key,
            policies,
            tier,
        } => {
            let c = match tier {
                Some(t) => redis.set_tier(&key, Some(&t)).await.map_err(e)?,
                None => redis.set_override(&key, &policies).await.map_err(e)?,
            };
            Ok(config_json(&key, &c))
        }
        QuotaCommand::Get { key } => Ok(config_json(&key, &redis.config(&key).await.map_err(e)?)),
        QuotaCommand::Rm { key } => {
            let c = redis.clear_config(&key).await.map_err(e)?;
            Ok(config_json(&key, &c))
        }
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
async fn limits_for(redis: &RedisBackend, key: &str, app: AppPolicies) -> Result<Limits, String> {
    let mut tiers: Vec<(String, Vec<Policy>)> = Vec::new();
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
        .map(|p| {
            json!({
                "name": p.name(),
                "policy": p.policy().to_string(),
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
