//! The Redis load generator `scripts/bench-redis.sh` runs: decisions through `RedisBackend`
//! from N concurrent tasks, or the composed check script for `redis-benchmark`.
//!
//! ```text
//! redis_bench script > check.lua            # turnstile_redis::CHECK_SCRIPT, verbatim
//! redis_bench library > library.lua        # turnstile_redis::library().source(), verbatim
//! redis_bench run --url redis://127.0.0.1:6379 --concurrency 64 --duration-ms 5000
//! redis_bench run --url ... --concurrency 64 --flood --deny-cache off
//! redis_bench run --url ... --concurrency 64 --keys 1 --coalesce on   # one hot key
//! redis_bench run --url ... --concurrency 1 --raw   # diagnosis: redis-rs alone, no backend
//! ```
//!
//! `run` prints one line of `name=value` fields: decisions, decisions per second, latency
//! percentiles (µs, each decision timed from its call to its answer), how many were admitted
//! and denied, the server's counts of `EVALSHA`, `FCALL` (and their sum, `script_calls`) and `PING` calls over the measured part
//! (`INFO commandstats` before and after, on a connection of its own), the server's CPU in
//! those scripts (`script_usec`), the warm-up's decisions, and the backend's own counts of
//! Redis calls and of calls that carried several checks (`batches`). Errors are not hidden: the backend
//! has no local fallback (it would decide in memory and inflate the rate), and any error
//! fails the run.

use std::collections::HashMap;
use std::io::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand, ValueEnum};
use turnstile_core::wrap::DenyCache;
use turnstile_core::Limits;
use turnstile_core::{Backend, Policy};
use turnstile_redis::{library, redis, RedisBackend, CHECK_SCRIPT};

/// Loads Redis through turnstile's `RedisBackend`.
#[derive(Parser, Debug)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Prints the composed check script (`turnstile_redis::CHECK_SCRIPT`).
    Script,
    /// Prints the Redis Function library (`turnstile_redis::library().source()`): its first
    /// line names it (`#!lua name=<library>`); the check function is `<library>_check`.
    Library,
    /// Runs checks from concurrent tasks and prints the figures.
    Run(Run),
}

/// Whether the backend's local deny cache is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Switch {
    /// The deny cache in front of Redis (`DenyCache::new`, 1 s cap), as the examples use it.
    On,
    /// No deny cache: every check is one Redis call.
    Off,
}

#[derive(Parser, Debug)]
struct Run {
    /// Redis URL.
    #[arg(long)]
    url: String,
    /// Concurrent tasks, each checking one request at a time.
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// Ignored, kept so scripts that pass it still run: the backend has no pool since issue
    /// 12 (every task shares one multiplexed connection per node).
    #[arg(long)]
    pool: Option<usize>,
    /// Measured time in ms (after a 500 ms warm-up).
    #[arg(long, default_value_t = 5000)]
    duration_ms: u64,
    /// Instead of a duration: exactly this many checks per task (after a warm-up of 200 per
    /// task), so two runs of different counts give the cost of one decision by difference
    /// (`scripts/redis-client-count.sh`, under callgrind, where time is meaningless).
    #[arg(long)]
    count: Option<u64>,
    /// Distinct client keys, walked by every task (ignored with --flood).
    #[arg(long, default_value_t = 10_000)]
    keys: usize,
    /// The policy of every check. Default: a token bucket that admits everything (1 per
    /// second, burst 10^9: each key's state stays in Redis, so every check reads, decides and
    /// writes it); with --flood: 10 per second.
    #[arg(long)]
    policy: Option<String>,
    /// One key far over its limit from every task.
    #[arg(long)]
    flood: bool,
    /// The local deny cache.
    #[arg(long, value_enum, default_value_t = Switch::Off)]
    deny_cache: Switch,
    /// Coalescing of concurrent checks of one key (`RedisBackendBuilder::coalesce`); the
    /// builder's default when not given.
    #[arg(long, value_enum)]
    coalesce: Option<Switch>,
    /// A current-thread runtime instead of a multi-thread one: for comparison only (a
    /// service runs the multi-thread runtime).
    #[arg(long)]
    current_thread: bool,
    /// Diagnosis only: no `RedisBackend`; each task sends redis-benchmark's `FCALL` of the
    /// check function straight through one redis-rs `MultiplexedConnection` (commands built
    /// before the run), to tell redis-rs's and tokio's share of a decision from the backend's.
    #[arg(long)]
    raw: bool,
    /// With --raw: each call bounded by `tokio::time::timeout` (10 s), as the backend's is.
    #[arg(long)]
    raw_timeout: bool,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    // A multi-thread runtime, as a service has (its workers: the CPUs the process may use);
    // --current-thread for comparison only.
    let current = matches!(&args.command, Command::Run(r) if r.current_thread);
    let runtime = if current {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
    };
    runtime.block_on(run_command(args))
}

async fn run_command(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    match args.command {
        Command::Script => {
            std::io::stdout().write_all(CHECK_SCRIPT.as_bytes())?;
            Ok(())
        }
        Command::Library => {
            std::io::stdout().write_all(library().source().as_bytes())?;
            Ok(())
        }
        Command::Run(run) if run.raw => raw(run).await,
        Command::Run(run) => bench(run).await,
    }
}

/// What one task measured.
#[derive(Default)]
struct Tally {
    latencies_ns: Vec<u64>,
    allowed: u64,
    denied: u64,
}

async fn bench(run: Run) -> Result<(), Box<dyn std::error::Error>> {
    let spec = run.policy.clone().unwrap_or_else(|| {
        if run.flood {
            "token-bucket:limit=10,period=1s,name=flood".to_owned()
        } else {
            "token-bucket:limit=1,period=1s,burst=1000000000,name=bench".to_owned()
        }
    });
    let policies: Arc<[Policy]> = Arc::from([spec.parse::<Policy>()?]);
    // The default prefix and hashed keys: the key names redis-benchmark is given have the
    // same shape and length.
    let _ignored = run.pool;
    let mut builder = RedisBackend::builder(run.url.clone())
        // Long enough that a loaded single core never times a call out.
        .timeout(Duration::from_secs(10));
    if let Some(on) = run.coalesce {
        builder = builder.coalesce(on == Switch::On);
    }
    let backend = builder.build()?;
    // The deny cache as the examples use it: `DenyCache::new`, capped at 1 s.
    let cached = DenyCache::new(backend.clone());
    let limits = Limits::new(policies.iter().cloned())?;
    let keys: Arc<[String]> = if run.flood {
        Arc::from(["flood".to_owned()])
    } else {
        (0..run.keys.max(1))
            .map(|i| format!("client-{i}"))
            .collect()
    };

    // Warm-up: connections opened, the script loaded, keys written.
    let run_phase = |dur: Length| {
        let (backend, cached, limits, keys) = (
            backend.clone(),
            cached.clone(),
            limits.clone(),
            Arc::clone(&keys),
        );
        let (cache, concurrency) = (run.deny_cache, run.concurrency);
        async move {
            match cache {
                Switch::On => phase(&cached, &limits, &keys, concurrency, dur).await,
                Switch::Off => phase(&backend, &limits, &keys, concurrency, dur).await,
            }
        }
    };
    let warm_up = run_phase(match run.count {
        Some(_) => Length::Checks(200),
        None => Length::Time(Duration::from_millis(500)),
    })
    .await?;
    let warm_up: u64 = warm_up.iter().map(|t| t.allowed + t.denied).sum();
    let info = InfoConn::open(&run.url).await?;
    let stats_before = info.calls().await?;
    let before = backend.stats();
    let hits_before = cached.hits();
    let t0 = Instant::now();
    let tallies = run_phase(match run.count {
        Some(n) => Length::Checks(n),
        None => Length::Time(Duration::from_millis(run.duration_ms)),
    })
    .await?;
    let secs = t0.elapsed().as_secs_f64();
    let after = backend.stats();
    let stats_after = info.calls().await?;
    let delta = |cmd: &str| {
        let at = |stats: &HashMap<String, (u64, u64)>| stats.get(cmd).map_or(0, |c| c.0);
        at(&stats_after) - at(&stats_before)
    };
    // The server's CPU in the scripts (µs, INFO commandstats' usec).
    let usec = |cmd: &str| {
        let at = |stats: &HashMap<String, (u64, u64)>| stats.get(cmd).map_or(0, |c| c.1);
        at(&stats_after) - at(&stats_before)
    };
    let script_usec = usec("evalsha") + usec("fcall");
    let evalsha = delta("evalsha");
    // The backend calls its Function library (FCALL) where Redis offers Functions.
    let fcall = delta("fcall");
    // Commands the client sends besides the script (a connection pool's health checks would
    // show here; the backend's shared connection sends none).
    let ping = delta("ping");

    let mut lat: Vec<u64> = Vec::new();
    let (mut allowed, mut denied) = (0, 0);
    for t in tallies {
        lat.extend(t.latencies_ns);
        allowed += t.allowed;
        denied += t.denied;
    }
    lat.sort_unstable();
    let pct = |p: f64| -> f64 {
        if lat.is_empty() {
            return 0.0;
        }
        let i = ((lat.len() as f64 * p).ceil() as usize).clamp(1, lat.len()) - 1;
        lat[i] as f64 / 1000.0
    };
    let n = lat.len() as u64;
    let calls = after.redis_calls - before.redis_calls;
    println!(
        "decisions={n} seconds={secs:.3} per_sec={:.0} p50_us={:.1} p99_us={:.1} allowed={allowed} denied={denied} evalsha_calls={evalsha} fcall_calls={fcall} script_calls={} ping_calls={ping} backend_redis_calls={calls} deny_cache_hits={} fallback={} script_usec={script_usec} warm_up_decisions={warm_up} batches={}",
        n as f64 / secs,
        pct(0.50),
        pct(0.99),
        evalsha + fcall,
        cached.hits() - hits_before,
        0,
        after.batches - before.batches,
    );
    Ok(())
}

/// A connection of its own for `INFO commandstats`.
struct InfoConn(redis::aio::MultiplexedConnection);

impl InfoConn {
    async fn open(url: &str) -> Result<Self, Box<dyn std::error::Error>> {
        let client = redis::Client::open(url)?;
        Ok(InfoConn(client.get_multiplexed_async_connection().await?))
    }

    /// Every command's `calls` and `usec` from `INFO commandstats`
    /// (`cmdstat_<name>:calls=N,usec=U,...`): what the server ran, from any client. Only this
    /// benchmark uses its private server.
    async fn calls(&self) -> Result<HashMap<String, (u64, u64)>, Box<dyn std::error::Error>> {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut self.0.clone())
            .await?;
        Ok(info
            .lines()
            .filter_map(|l| {
                let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(":calls=")?;
                let mut fields = rest.split(',');
                let n = fields.next()?.parse().ok()?;
                let usec = fields.find_map(|f| f.strip_prefix("usec="))?.parse().ok()?;
                Some((name.to_owned(), (n, usec)))
            })
            .collect())
    }
}

/// How long a phase runs: a time, or a number of checks per task.
#[derive(Clone, Copy, Debug)]
enum Length {
    Time(Duration),
    Checks(u64),
}

/// Runs `concurrency` tasks for `len`, each checking one request at a time, walking `keys`.
async fn phase<B: Backend>(
    backend: &B,
    limits: &Limits,
    keys: &Arc<[String]>,
    concurrency: usize,
    len: Length,
) -> Result<Vec<Tally>, Box<dyn std::error::Error>> {
    let (deadline, checks) = match len {
        Length::Time(d) => (Instant::now() + d, u64::MAX),
        // Far enough that only the count ends the phase.
        Length::Checks(n) => (Instant::now() + Duration::from_secs(86_400), n),
    };
    let mut tasks = Vec::new();
    for t in 0..concurrency.max(1) {
        let (backend, limits, keys) = (backend.clone(), limits.clone(), Arc::clone(keys));
        tasks.push(tokio::spawn(async move {
            let mut tally = Tally::default();
            let mut i = t.wrapping_mul(7919);
            loop {
                let start = Instant::now();
                if start >= deadline || tally.allowed + tally.denied >= checks {
                    return Ok::<_, turnstile_core::BackendError>(tally);
                }
                let key = &keys[i % keys.len()];
                i = i.wrapping_add(1);
                let d = backend.check_limits(key, &limits, 1, None).await?;
                tally
                    .latencies_ns
                    .push(u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX));
                if d.allowed() {
                    tally.allowed += 1;
                } else {
                    tally.denied += 1;
                }
            }
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await??);
    }
    Ok(out)
}

/// `run --raw`: redis-benchmark's `FCALL` through a bare `MultiplexedConnection` (see `Run::raw`).
async fn raw(run: Run) -> Result<(), Box<dyn std::error::Error>> {
    let source = library().source();
    let name = source
        .lines()
        .next()
        .and_then(|l| l.split("name=").nth(1))
        .ok_or("the library names itself on its first line")?
        .trim()
        .to_owned();
    let client = redis::Client::open(run.url.as_str())?;
    let conn = client.get_multiplexed_async_connection().await?;
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(source)
        .query_async(&mut conn.clone())
        .await?;
    let function = format!("{name}_check");
    let cmds: Arc<[redis::Cmd]> = (0..run.keys.max(1))
        .map(|i| {
            let mut c = redis::cmd("FCALL");
            c.arg(&function)
                .arg(1)
                .arg(format!("turnstile:v1:{{{i:032}}}:f4"))
                .arg("check defaults 0 1")
                .arg("\n1.1.1000.1000000000 bench");
            c
        })
        .collect();
    let go = |dur: Duration| {
        let mut tasks = Vec::new();
        for t in 0..run.concurrency.max(1) {
            let (mut conn, cmds, timed) = (conn.clone(), Arc::clone(&cmds), run.raw_timeout);
            tasks.push(tokio::spawn(async move {
                let deadline = Instant::now() + dur;
                let mut lat = Vec::new();
                let mut i = t.wrapping_mul(7919);
                loop {
                    let start = Instant::now();
                    if start >= deadline {
                        return Ok::<_, redis::RedisError>(lat);
                    }
                    let cmd = &cmds[i % cmds.len()];
                    i = i.wrapping_add(1);
                    let v: redis::Value = if timed {
                        tokio::time::timeout(Duration::from_secs(10), conn.send_packed_command(cmd))
                            .await
                            .map_err(|_| {
                                redis::RedisError::from((redis::ErrorKind::Io, "timeout"))
                            })??
                    } else {
                        conn.send_packed_command(cmd).await?
                    };
                    std::hint::black_box(v);
                    lat.push(u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX));
                }
            }));
        }
        tasks
    };
    for t in go(Duration::from_millis(500)) {
        t.await??;
    }
    let t0 = Instant::now();
    let mut lat = Vec::new();
    for t in go(Duration::from_millis(run.duration_ms)) {
        lat.extend(t.await??);
    }
    let secs = t0.elapsed().as_secs_f64();
    lat.sort_unstable();
    let p50 = lat.get(lat.len() / 2).copied().unwrap_or(0) as f64 / 1000.0;
    println!(
        "decisions={} seconds={secs:.3} per_sec={:.0} p50_us={p50:.1}",
        lat.len(),
        lat.len() as f64 / secs
    );
    Ok(())
}
