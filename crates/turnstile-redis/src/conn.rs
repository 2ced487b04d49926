//! The connection to one node — a single Redis, or the primary Sentinel names: one
//! multiplexed (pipelined) connection shared by every call, replaced when it is known closed
//! or the node answers that it cannot serve us, and one retry of a call that provably did not
//! run.
//!
//! Why one multiplexed connection and not a pool: every call is one short script call whose
//! reply carries everything the caller needs, so calls never wait on each other's replies
//! and pipeline on one socket (redis-rs's `MultiplexedConnection` matches replies to callers
//! in order). A pool would add a checkout per call and hold N sockets that each see 1/N of
//! the traffic, without letting Redis (one thread per node) run any call sooner; it would
//! also multiply what a failover or a silent connection must replace. A Cluster uses
//! redis-rs's cluster client, which keeps one such connection per master.
//!
//! "Known closed": connections speak RESP3 when the server does (Redis 6+), with a push
//! sender that redis-rs tells when the connection's reader sees it close. A call never goes
//! out on such a connection: a fresh one is made first. On a RESP2-only server (Redis 5) a
//! closed connection is found by the call that fails on it (never retried: it may have
//! reached the server), and the next call reconnects.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use redis::aio::MultiplexedConnection;
use redis::{
    self, AsyncConnectionConfig, Client, ConnectionInfo, ErrorKind, PushInfo, PushKind,
    RedisResult, Value,
};
use turnstile_core::BackendError;

use crate::call::Call;
use crate::fault::{Failed, Fault};
use crate::library::{Path, Scripts};
use crate::server::{Refused, ServerChecks};

/// Where new connections come from.
pub(crate) enum Source {
    /// A `redis://` or `rediss://` URL.
    Url(ConnectionInfo),
    /// The primary a set of Sentinels names.
    #[cfg(feature = "sentinel")]
    Sentinel(crate::sentinel::SentinelSpec),
}

impl Source {
    async fn connect(
        &self,
        protocol: redis::ProtocolVersion,
        config: &AsyncConnectionConfig,
    ) -> RedisResult<MultiplexedConnection> {
        match self {
            Source::Url(info) => {
                let settings = info.redis_settings().clone().set_protocol(protocol);
                Client::open(info.clone().set_redis_settings(settings))?
                    .get_multiplexed_async_connection_with_config(config)
                    .await
            }
            #[cfg(feature = "sentinel")]
            Source::Sentinel(spec) => spec.connect(protocol, config).await,
        }
    }
}

/// A connection in use, and whether its reader has seen it close.
#[derive(Clone)]
pub(crate) struct Live {
    pub(crate) conn: MultiplexedConnection,
    closed: Arc<AtomicBool>,
    id: u64,
}

impl Live {
    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}

/// The connection to one node.
pub(crate) struct NodeConn {
    source: Source,
    /// The node as logs name it.
    name: String,
    config: AsyncConnectionConfig,
    current: Mutex<Option<Live>>,
    /// One connection attempt at a time: callers that find no live connection wait for it.
    connecting: tokio::sync::Mutex<()>,
    /// False once the server refused RESP3 (`HELLO`): connections speak RESP2 from then on.
    resp3: AtomicBool,
    next_id: AtomicU64,
    connects: AtomicU64,
    checks: ServerChecks,
    /// The path of the current connection's calls (see [`PathOf`]).
    path: PathOf,
}

/// The path calls take on one connection: a new connection (a restart, a failover) starts
/// unknown, so its first call loads the library (see [`Scripts::invoke`]). Packs the
/// connection's id and the path in one word.
#[derive(Default)]
struct PathOf(AtomicU64);

impl PathOf {
    fn get(&self, id: u64) -> Path {
        let v = self.0.load(Ordering::Relaxed);
        match (v >> 2 == id, v & 3) {
            (true, 1) => Path::Functions,
            (true, 2) => Path::Eval,
            _ => Path::Unknown,
        }
    }

    fn set(&self, id: u64, path: Path) {
        let code = match path {
            Path::Unknown => 0,
            Path::Functions => 1,
            Path::Eval => 2,
        };
        self.0.store(id << 2 | code, Ordering::Relaxed);
    }
}

impl NodeConn {
    pub(crate) fn new(source: Source, name: String, config: AsyncConnectionConfig) -> Self {
        NodeConn {
            source,
            name,
            config,
            current: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            resp3: AtomicBool::new(true),
            next_id: AtomicU64::new(0),
            connects: AtomicU64::new(0),
            checks: ServerChecks::default(),
            path: PathOf::default(),
        }
    }

    /// Connections made so far.
    pub(crate) fn connects(&self) -> u64 {
        self.connects.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Live>> {
        self.current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn live(&self) -> Option<Live> {
        self.lock().as_ref().filter(|l| !l.is_closed()).cloned()
    }

    /// The connection to use: the current one unless it is known closed, else a new one.
    ///
    /// # Errors
    /// [`Fault::Unreachable`] when no connection could be made; [`Fault::Unsupported`] when
    /// the server is older than the scripts need.
    pub(crate) async fn get(&self) -> Result<Live, Failed> {
        if let Some(l) = self.live() {
            return Ok(l);
        }
        let _one = self.connecting.lock().await;
        if let Some(l) = self.live() {
            return Ok(l);
        }
        // Boxed: connecting is rare, and its future (redis-rs's handshake) is kilobytes, which
        // every call's future would otherwise carry and copy.
        let live = Box::pin(self.open()).await?;
        *self.lock() = Some(live.clone());
        Ok(live)
    }

    /// Drops connection `id` if it is still the current one: the next call makes a new one.
    fn discard(&self, id: u64) {
        let mut current = self.lock();
        if current.as_ref().is_some_and(|l| l.id == id) {
            *current = None;
        }
    }

    async fn open(&self) -> Result<Live, Failed> {
        let closed = Arc::new(AtomicBool::new(false));
        let mut conn = None;
        if self.resp3.load(Ordering::Relaxed) {
            let flag = Arc::clone(&closed);
            let config = self.config.clone().set_push_sender(
                move |info: PushInfo| -> Result<(), std::convert::Infallible> {
                    if matches!(info.kind, PushKind::Disconnection) {
                        flag.store(true, Ordering::Release);
                    }
                    Ok(())
                },
            );
            match self
                .source
                .connect(redis::ProtocolVersion::RESP3, &config)
                .await
            {
                Ok(c) => conn = Some(c),
                Err(e) if e.kind() == ErrorKind::RESP3NotSupported => {
                    tracing::info!(
                        node = %self.name,
                        "Redis does not speak RESP3 (Redis 5): a closed connection is found by the call that fails on it"
                    );
                    self.resp3.store(false, Ordering::Relaxed);
                }
                Err(e) => return Err(Failed::connect(e, &self.name)),
            }
        }
        let mut conn = match conn {
            Some(c) => c,
            None => self
                .source
                .connect(redis::ProtocolVersion::RESP2, &self.config)
                .await
                .map_err(|e| Failed::connect(e, &self.name))?,
        };
        self.checks
            .run(&mut conn, &self.name)
            .await
            .map_err(|r| refused(r, &self.name))?;
        self.connects.fetch_add(1, Ordering::Relaxed);
        Ok(Live {
            conn,
            closed,
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// Runs `call` on the node: on the current connection, or a fresh one when it is known
    /// closed; once more on a fresh connection when the first try provably did not run the
    /// script (no connection could be made; `READONLY`, `LOADING`, `MASTERDOWN`; `NOSCRIPT`).
    /// A call that timed out or lost its connection after it was written is never retried.
    /// The first call on each connection loads the Function library (see
    /// [`Scripts::invoke`]).
    ///
    /// # Errors
    /// The last failure, with what it says about the node.
    pub(crate) async fn invoke(&self, call: &Call, scripts: &Scripts) -> Result<Value, Failed> {
        let mut retried = false;
        loop {
            let failed = match self.get().await {
                Ok(mut live) => {
                    let known = self.path.get(live.id);
                    let (result, path) = scripts
                        .invoke(&mut live.conn, call, known, &self.name)
                        .await;
                    if path != known {
                        self.path.set(live.id, path);
                    }
                    match result {
                        Ok(v) => return Ok(v),
                        Err(e) => {
                            let f = Failed::call(e, &self.name);
                            if f.fault.reconnects() {
                                self.discard(live.id);
                            }
                            f
                        }
                    }
                }
                Err(f) => f,
            };
            if retried || !failed.fault.retries() {
                return Err(failed);
            }
            retried = true;
        }
    }
}

/// The failure of a connection the server checks refused.
pub(crate) fn refused(r: Refused, node: &str) -> Failed {
    match r {
        Refused::Connection(e) => Failed::connect(e, node),
        Refused::Version(v) => Failed {
            error: BackendError::Connection(Box::new(v)),
            fault: Fault::Unsupported,
        },
    }
}
