//! Issue 24, trap 1, on Redis: the check script resolves a key's policies as the in-memory
//! backend does, per policy (`lua/general.lua`'s `applying`, `turnstile_core::quota`'s
//! `resolve`): for each default policy, the key's override's policy of its name, else its
//! stored tier's, else the default. Every decision (with where each policy's parameters
//! came from) is the in-memory backend's, through `FCALL` and `EVALSHA`.

use turnstile_core::{
    Applied, Backend, Limits, MemoryBackend, Policy, Quotas, Source, Unconfigured,
};
use turnstile_redis::{RedisBackend, ScriptMode};
use turnstile_tests::redis_server::RedisServer;

fn p(spec: &str) -> Policy {
    spec.parse().unwrap()
}

fn limits() -> Limits {
    Limits::new([
        p("fixed-window:limit=2,period=1m,name=api"),
        p("sliding-log:limit=3,period=1m,name=login"),
        p("token-bucket:limit=4,period=1m,name=writes"),
    ])
    .unwrap()
    .with_tier("pro", [p("fixed-window:limit=6,period=1m,name=api")])
    .unwrap()
    .with_tier(
        "elsewhere",
        [p("fixed-window:limit=9,period=1m,name=unrelated")],
    )
    .unwrap()
}

#[tokio::test(flavor = "current_thread")]
async fn each_policy_takes_its_parameters_from_the_first_source_that_names_it() {
    let server = RedisServer::start();
    let t0 = 1_700_000_040_000u64;
    for mode in [ScriptMode::Auto, ScriptMode::Eval] {
        let redis = RedisBackend::builder(server.url())
            .prefix(format!(
                "turnstile:test:live-{mode:?}:{}",
                std::process::id()
            ))
            .script_mode(mode)
            .build()
            .unwrap();
        let memory = MemoryBackend::new();
        // "pro": api lifted; "both": pro's api, and an override of writes (and a name no
        // policy has); "over": an override of api beats the tier; "odd": a tier that lists
        // none of these policies; "plain": nothing.
        for b in [&redis as &dyn Configure, &memory] {
            b.tier("pro", "pro").await;
            b.tier("both", "pro").await;
            b.over(
                "both",
                &[
                    p("token-bucket:limit=1,period=1m,name=writes"),
                    p("gcra:limit=1,period=1m,name=nothing"),
                ],
            )
            .await;
            b.tier("over", "pro").await;
            b.over("over", &[p("fixed-window:limit=1,period=1m,name=api")])
                .await;
            b.tier("odd", "elsewhere").await;
        }
        let base = limits();
        let variants = [
            ("defaults", base.clone()),
            ("deny", base.clone().when_unconfigured(Unconfigured::Deny)),
            ("allow", base.clone().when_unconfigured(Unconfigured::Allow)),
            ("stored", base.clone().stored_only()),
        ];
        for (label, limits) in &variants {
            for key in ["pro", "both", "over", "odd", "plain"] {
                for i in 0..8u64 {
                    let now = Some(t0 + i);
                    let m = memory.check_limits(key, limits, 1, now).await.unwrap();
                    let r = redis.check_limits(key, limits, 1, now).await.unwrap();
                    assert_eq!(r, m, "{mode:?} {label} key {key} check {i}");
                    let ms: Vec<Source> = m.sources().collect();
                    let rs: Vec<Source> = r.sources().collect();
                    assert_eq!(rs, ms, "{mode:?} {label} key {key} check {i}");
                }
            }
            // Every key's state starts over for the next variant.
            for key in ["pro", "both", "over", "odd", "plain"] {
                memory.reset(key, &base, Some(t0)).await.unwrap();
                redis.reset(key, &base, Some(t0)).await.unwrap();
            }
        }
        // What the sources say, once.
        let d = redis
            .check_limits("both", &base, 0, Some(t0))
            .await
            .unwrap();
        assert_eq!(d.applied(), &Applied::Override);
        assert_eq!(
            d.sources().collect::<Vec<_>>(),
            [
                Source::Tier("pro".into()),
                Source::Defaults,
                Source::Override
            ]
        );
        let d = redis
            .check_limits("over", &base.clone().stored_only(), 0, Some(t0))
            .await
            .unwrap();
        assert_eq!(d.policies().len(), 1, "stored only: api, from the override");
        assert_eq!(d.policies()[0].policy().limit(), 1);
    }
}

/// Sets a key's configuration on either backend.
trait Configure {
    fn tier<'a>(&'a self, key: &'a str, tier: &'a str) -> Boxed<'a>;
    fn over<'a>(&'a self, key: &'a str, policies: &'a [Policy]) -> Boxed<'a>;
}

/// A configuration change's future.
type Boxed<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + 'a>>;

impl<Q: Quotas> Configure for Q {
    fn tier<'a>(&'a self, key: &'a str, tier: &'a str) -> Boxed<'a> {
        Box::pin(async move {
            self.set_tier(key, Some(tier)).await.unwrap();
        })
    }
    fn over<'a>(&'a self, key: &'a str, policies: &'a [Policy]) -> Boxed<'a> {
        Box::pin(async move {
            self.set_override(key, policies).await.unwrap();
        })
    }
}
