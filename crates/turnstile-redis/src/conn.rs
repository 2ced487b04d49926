//! The connection to one node — a single Redis, or the primary Sentinel names: one
//! multiplexed (pipelined) connection shared by every call, made in the background (see
//! [`connector`](crate::connector)), replaced when it is known closed, when the node answers
//! that it cannot serve us, or when calls on it time out round after round, and one retry of a
//! call that provably did not run.
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
//!
//! A connection that stops answering without being closed (a lost NAT or conntrack entry, a
//! host gone without a reset, a frozen VM) is never known closed; TCP keepalive would take
//! minutes to tell. Its calls time out instead, and the backend replaces it (see
//! `RedisBackend::run`): at the second timed-out round in a row, and whenever the node comes
//! to count as down or a probe times out, so the probe goes out on a fresh connection.
//!
//! Each new connection is made ready before any call uses it: the server checked
//! ([`ServerChecks`]) and the Function library loaded ([`Scripts::first_load`]), so a burst of
//! calls on a fresh connection (a cold start, a restart) finds it warm.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{
    self, AsyncConnectionConfig, Client, ConnectionInfo, ErrorKind, PushInfo, PushKind,
    RedisResult, Value,
};
use tokio::time::Instant;

use crate::call::Call;
use crate::connector::{self, Connect, Held, Slot};
use crate::fault::{Failed, NoConnection};
use crate::library::{Path, Scripts};
use crate::server::{is_connection_failure, ServerChecks};

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

/// A connection in use: whether its reader has seen it close, and the path its calls take.
#[derive(Clone)]
pub(crate) struct Live {
    pub(crate) conn: MultiplexedConnection,
    closed: Arc<AtomicBool>,
    /// [`Path`] as a number (see [`path_code`]): a new connection (a restart, a failover)
    /// learns it when it is made ready.
    path: Arc<AtomicU8>,
}

impl Live {
    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    fn path(&self) -> Path {
        match self.path.load(Ordering::Relaxed) {
            1 => Path::Functions,
            2 => Path::Eval,
            _ => Path::Unknown,
        }
    }

    fn set_path(&self, path: Path) {
        self.path.store(path_code(path), Ordering::Relaxed);
    }
}

fn path_code(path: Path) -> u8 {
    match path {
        Path::Unknown => 0,
        Path::Functions => 1,
        Path::Eval => 2,
    }
}

/// The connection to one node.
pub(crate) struct NodeConn(Arc<Node>);

struct Node {
    source: Source,
    /// The node as logs name it.
    name: String,
    config: AsyncConnectionConfig,
    /// Bounds one connection attempt: connecting, the checks, the library's load.
    attempt_limit: Duration,
    slot: Slot<Live>,
    /// False once the server refused RESP3 (`HELLO`): connections speak RESP2 from then on.
    resp3: AtomicBool,
    connects: AtomicU64,
    checks: ServerChecks,
    scripts: Arc<Scripts>,
}

impl Connect for Node {
    type Conn = Live;

    fn slot(&self) -> &Slot<Live> {
        &self.slot
    }

    fn open(&self) -> impl std::future::Future<Output = Result<Live, NoConnection>> + Send {
        // Boxed: its future (redis-rs's handshake) is kilobytes.
        Box::pin(self.open_live())
    }

    fn attempt_limit(&self) -> Duration {
        self.attempt_limit
    }

    fn usable(live: &Live) -> bool {
        !live.is_closed()
    }
}

impl NodeConn {
    pub(crate) fn new(
        source: Source,
        name: String,
        config: AsyncConnectionConfig,
        scripts: Arc<Scripts>,
        attempt_limit: Duration,
    ) -> Self {
        NodeConn(Arc::new(Node {
            source,
            name,
            config,
            attempt_limit,
            slot: Slot::new(),
            resp3: AtomicBool::new(true),
            connects: AtomicU64::new(0),
            checks: ServerChecks::default(),
            scripts,
        }))
    }

    /// Connections made so far.
    pub(crate) fn connects(&self) -> u64 {
        self.0.connects.load(Ordering::Relaxed)
    }

    /// See [`Slot::generation`].
    pub(crate) fn generation(&self) -> u64 {
        self.0.slot.generation()
    }

    /// See [`connector::probe_ready`].
    pub(crate) fn probe_ready(&self) -> bool {
        connector::probe_ready(&self.0)
    }

    /// Drops the connection a call that began at `started` used, unless a newer one replaced
    /// it, and makes a new one in the background.
    pub(crate) fn replace(&self, started: u64) {
        connector::replace(&self.0, started, true);
    }

    /// Makes the first connection in the background.
    pub(crate) fn warm(&self) {
        connector::warm(&self.0);
    }

    /// Why there is no connection, when an attempt failed (see [`connector::unconnected`]).
    pub(crate) fn unconnected(&self) -> Option<Failed> {
        connector::unconnected(&*self.0)
    }

    /// A connection for commands of our own, waited for until `deadline`.
    ///
    /// # Errors
    /// What [`connector::get`] says.
    pub(crate) async fn connection(
        &self,
        deadline: Instant,
    ) -> Result<MultiplexedConnection, Failed> {
        Ok(connector::get(&self.0, deadline).await?.conn.conn)
    }

    /// Runs `call` on the node: on the current connection, or a fresh one when it is known
    /// closed; once more on a fresh connection when the first try provably did not run the
    /// script (no connection could be made; `READONLY`, `LOADING`, `MASTERDOWN`; `NOSCRIPT`)
    /// and `deadline` has not passed. A call that timed out or lost its connection after it was
    /// written is never retried. No call is sent after `deadline`.
    ///
    /// # Errors
    /// The last failure, with what it says about the node.
    pub(crate) async fn invoke(&self, call: &Call, deadline: Instant) -> Result<Value, Failed> {
        let node = &*self.0;
        let mut retried = false;
        loop {
            let failed = match connector::get(&self.0, deadline).await {
                Ok(Held { id, conn: live }) => {
                    let known = live.path();
                    let mut conn = live.conn.clone();
                    let (result, path) = node
                        .scripts
                        .invoke(&mut conn, call, known, &node.name)
                        .await;
                    if path != known {
                        live.set_path(path);
                    }
                    match result {
                        Ok(v) => return Ok(v),
                        Err(e) => {
                            let f = Failed::call(e, &node.name);
                            if f.fault.reconnects() {
                                node.slot.discard(id);
                            }
                            f
                        }
                    }
                }
                Err(f) => f,
            };
            if retried || !failed.fault.retries() || Instant::now() >= deadline {
                return Err(failed);
            }
            retried = true;
        }
    }
}

impl Node {
    /// One connection, checked, its library loaded.
    async fn open_live(&self) -> Result<Live, NoConnection> {
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
                Err(e) => return Err(NoConnection::connect(e, &self.name)),
            }
        }
        let mut conn = match conn {
            Some(c) => c,
            None => self
                .source
                .connect(redis::ProtocolVersion::RESP2, &self.config)
                .await
                .map_err(|e| NoConnection::connect(e, &self.name))?,
        };
        self.checks
            .run(&mut conn, &self.name)
            .await
            .map_err(|r| NoConnection::refused(r, &self.name))?;
        let path = match self.scripts.path(Path::Unknown) {
            Path::Unknown => match self.scripts.first_load(&mut conn, &self.name).await {
                Ok(path) => path,
                Err(e) if is_connection_failure(&e) => {
                    return Err(NoConnection::connect(e, &self.name))
                }
                // The node's state (READONLY, LOADING, OOM): the first call meets it too, and
                // is handled as any call.
                Err(_) => Path::Unknown,
            },
            path => path,
        };
        self.connects.fetch_add(1, Ordering::Relaxed);
        Ok(Live {
            conn,
            closed,
            path: Arc::new(AtomicU8::new(path_code(path))),
        })
    }
}
