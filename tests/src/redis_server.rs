//! `redis-server` processes started by the tests themselves: a free port on loopback, no
//! persistence, killed (and their folder removed) on drop. Several make a Cluster.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const INSTALL_HINT: &str = "was not found. The Redis tests start their own servers; install \
Redis with `sudo apt-get install -y redis-server` (scripts/test does this on a fresh machine, and \
installs Valkey for its second pass), or set REDIS_URL to use an existing server for the tests \
that allow it.";

/// The server program the tests start: `TURNSTILE_TEST_SERVER` (a path or a name on `PATH`,
/// for example a `valkey-server`), else `redis-server`. A server with TLS arguments runs
/// `TURNSTILE_TEST_TLS_SERVER` when it is set (Valkey's wheel build has no TLS, so
/// `scripts/test` runs the TLS tests of its Valkey pass on `redis-server`).
fn server_program(tls: bool) -> String {
    let tls_program = tls
        .then(|| std::env::var("TURNSTILE_TEST_TLS_SERVER").ok())
        .flatten();
    tls_program
        .or_else(|| std::env::var("TURNSTILE_TEST_SERVER").ok())
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "redis-server".to_owned())
}

/// A `redis-server` child process on 127.0.0.1.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    extra: Vec<String>,
    tls: bool,
    child: Option<Child>,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port on 127.0.0.1")
}

fn scratch_dir(port: u16) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "turnstile-redis-{}-{}-{port}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("a scratch folder for redis-server");
    dir
}

/// Waits for `child` to exit and collects its output; kills it and panics after `limit`.
fn wait_with_deadline(mut child: Child, limit: Duration, what: &str) -> std::process::Output {
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => return child.wait_with_output().expect("the child's output"),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            _ => {
                let _ = child.kill();
                let out = child.wait_with_output().expect("the child's output");
                panic!(
                    "{what} did not finish within {limit:?}: {}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }
}

/// Sends one inline command and returns the first reply line (`+PONG`, `-ERR ...`).
pub fn command(port: u16, cmd: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(format!("{cmd}\r\n").as_bytes())?;
    let mut buf = [0u8; 4096];
    let n = s.read(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

impl RedisServer {
    /// Starts a server on a free port. Panics, with how to install Redis, when
    /// `redis-server` is missing.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server with extra command-line arguments (e.g. `--cluster-enabled yes`).
    pub fn start_with(extra: &[&str]) -> Self {
        Self::spawn(extra, false)
    }

    /// Starts a server that accepts TLS only (`--port 0 --tls-port <port>`), with extra
    /// arguments that must include `--tls-cert-file` and `--tls-key-file` (see
    /// [`crate::tls::TestPki::server_args`]).
    pub fn start_tls(extra: &[&str]) -> Self {
        Self::spawn(extra, true)
    }

    fn spawn(extra: &[&str], tls: bool) -> Self {
        let port = free_port();
        let mut server = RedisServer {
            port,
            dir: scratch_dir(port),
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
            tls,
            child: None,
        };
        server.restart();
        server
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`, or `rediss://127.0.0.1:<port>` for a TLS server.
    pub fn url(&self) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// Freezes the server (`SIGSTOP`): its connections stay open and the kernel still
    /// accepts new ones, but nothing is answered — a frozen VM, a host stalled — until
    /// [`RedisServer::thaw`]. A frozen server is killed on drop as any other.
    pub fn freeze(&self) {
        self.signal("STOP");
    }

    /// Lets a frozen server run again (`SIGCONT`).
    pub fn thaw(&self) {
        self.signal("CONT");
    }

    fn signal(&self, name: &str) {
        let pid = self
            .child
            .as_ref()
            .expect("a running redis-server to signal")
            .id();
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(pid.to_string())
            .status()
            .expect("kill(1) to run");
        assert!(status.success(), "kill -{name} {pid}: {status}");
    }

    /// Kills the server (SIGKILL: no goodbye to clients).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the server (SIGKILL), waits `pause`, and starts it again on the same port;
    /// returns once it answers `PING`: a restart that takes about `pause` longer than
    /// [`RedisServer::restart`].
    pub fn restart_after(&mut self, pause: Duration) {
        self.kill();
        std::thread::sleep(pause);
        self.restart();
    }

    /// (Re)starts the server on the same port and waits until it answers `PING`.
    pub fn restart(&mut self) {
        let port = self.port.to_string();
        let ports: &[&str] = if self.tls {
            &["--port", "0", "--tls-port", &port]
        } else {
            &["--port", &port]
        };
        let mut args: Vec<String> = ports.iter().map(|s| (*s).to_owned()).collect();
        args.extend(
            [
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "no",
            ]
            .iter()
            .map(|s| (*s).to_owned()),
        );
        args.extend(self.extra.iter().cloned());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.launch(&args);
    }

    /// Kills the server if it runs, starts the server program (see [`server_program`]) with
    /// `ARGS` in its folder and waits until it answers `PING` (a TLS server: until it accepts
    /// connections).
    fn launch(&mut self, args: &[&str]) {
        self.kill();
        let program = server_program(self.tls || args.iter().any(|a| a.starts_with("--tls")));
        let child = Command::new(&program)
            .args(args)
            .current_dir(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let child = match child {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                panic!("{program} {INSTALL_HINT}")
            }
            Err(e) => panic!("could not start {program}: {e}"),
        };
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            // Any reply means the server is up (one that needs a password answers -NOAUTH).
            // A TLS server cannot answer a plain PING: it is up once it accepts connections.
            let up = if self.tls {
                TcpStream::connect(("127.0.0.1", self.port)).is_ok()
            } else {
                command(self.port, "PING").is_ok_and(|r| r.starts_with('+') || r.starts_with('-'))
            };
            if up {
                return;
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                panic!("{program} on port {} exited at start: {status}", self.port);
            }
            assert!(
                Instant::now() < deadline,
                "{program} on port {} did not answer PING within 10 s",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A Redis to run against: `REDIS_URL` when set, else a server started for the test.
#[derive(Debug)]
pub struct TestRedis {
    url: String,
    _server: Option<RedisServer>,
}

impl TestRedis {
    /// `REDIS_URL`'s server, or a fresh one.
    pub fn get() -> Self {
        match std::env::var("REDIS_URL") {
            Ok(url) if !url.is_empty() => TestRedis { url, _server: None },
            _ => {
                let server = RedisServer::start();
                TestRedis {
                    url: server.url(),
                    _server: Some(server),
                }
            }
        }
    }

    /// The URL to connect to.
    pub fn url(&self) -> &str {
        &self.url
    }
}

/// A Redis Cluster of `n` masters (no replicas), each a [`RedisServer`], created with
/// `redis-cli --cluster create`.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// Each node's TLS port, for a Cluster started with [`RedisCluster::start_tls`].
    tls_ports: Vec<u16>,
}

impl RedisCluster {
    /// Starts `n` (≥ 3) cluster-enabled servers and joins them; waits for `cluster_state:ok`.
    pub fn start(n: usize) -> Self {
        Self::start_with(n, &["--cluster-node-timeout", "5000"])
    }

    /// As [`RedisCluster::start`], with extra arguments for every node (e.g.
    /// `--cluster-node-timeout 1000`, `--cluster-require-full-coverage no`).
    pub fn start_with(n: usize, extra: &[&str]) -> Self {
        Self::spawn(n, 0, extra, None)
    }

    /// `masters` (≥ 3) masters with one replica each, with extra arguments for every node;
    /// returns once the Cluster is ok and every replica's link to its master is up. Which
    /// node is which: [`RedisCluster::node_of_key`], [`RedisCluster::replica_of`].
    pub fn start_with_replicas(masters: usize, extra: &[&str]) -> Self {
        let cluster = Self::spawn(2 * masters, 1, extra, None);
        for node in &cluster.nodes {
            wait_for(
                Duration::from_secs(20),
                "every replica's link to its master",
                || {
                    query(node.port(), "INFO replication").is_ok_and(|i| {
                        i.contains("role:master") || i.contains("master_link_status:up")
                    })
                },
            );
        }
        cluster
    }

    /// Starts `n` (≥ 3) cluster-enabled servers that also serve TLS on ports of their own
    /// with `pki`'s certificates, requiring client certificates, their cluster bus in TLS
    /// too (`--tls-cluster yes`): Cluster commands over TLS name the TLS ports. The plain
    /// ports stay open for the tests' own commands.
    pub fn start_tls(n: usize, pki: &crate::tls::TestPki) -> Self {
        Self::spawn(n, 0, &["--cluster-node-timeout", "5000"], Some(pki))
    }

    /// `n` nodes joined by `redis-cli --cluster create` with `replicas` replicas per master.
    fn spawn(n: usize, replicas: usize, extra: &[&str], pki: Option<&crate::tls::TestPki>) -> Self {
        let mut tls_ports = Vec::new();
        let nodes: Vec<RedisServer> = (0..n)
            .map(|_| {
                let mut args: Vec<String> = [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                ]
                .map(String::from)
                .to_vec();
                args.extend(extra.iter().map(|s| (*s).to_owned()));
                if let Some(pki) = pki {
                    let port = free_port();
                    tls_ports.push(port);
                    args.extend(["--tls-port".to_owned(), port.to_string()]);
                    args.extend(["--tls-cluster".to_owned(), "yes".to_owned()]);
                    args.extend(pki.server_args(true));
                }
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                RedisServer::start_with(&args)
            })
            .collect();
        let addrs: Vec<String> = match pki {
            None => nodes
                .iter()
                .map(|s| format!("127.0.0.1:{}", s.port()))
                .collect(),
            Some(_) => tls_ports.iter().map(|p| format!("127.0.0.1:{p}")).collect(),
        };
        let mut cli = Command::new("redis-cli");
        if let Some(pki) = pki {
            cli.arg("--tls")
                .arg("--cacert")
                .arg(pki.path("ca.pem"))
                .arg("--cert")
                .arg(pki.path("client.pem"))
                .arg("--key")
                .arg(pki.path("client.key"));
        }
        let child = cli
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("redis-cli --cluster create: {e}. {INSTALL_HINT}"));
        // redis-cli waits for the nodes to join for as long as it takes: not here.
        let out = wait_with_deadline(child, Duration::from_secs(30), "redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        for node in &nodes {
            loop {
                let ok = command(node.port(), "CLUSTER INFO")
                    .is_ok_and(|r| r.contains("cluster_state:ok"));
                if ok {
                    break;
                }
                assert!(Instant::now() < deadline, "the cluster never became ok");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        RedisCluster { nodes, tls_ports }
    }

    /// Comma-separated `rediss://` URLs of every node's TLS port (a Cluster started with
    /// [`RedisCluster::start_tls`]).
    pub fn tls_urls(&self) -> String {
        self.tls_ports
            .iter()
            .map(|p| format!("rediss://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Comma-separated `redis://` URLs of every node (a Cluster URL for `RedisBackend`).
    pub fn urls(&self) -> String {
        self.nodes
            .iter()
            .map(RedisServer::url)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The nodes.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The nodes, to kill or restart one.
    pub fn nodes_mut(&mut self) -> &mut [RedisServer] {
        &mut self.nodes
    }

    /// The index in [`RedisCluster::nodes`] of the replica of the node at `master`, as the
    /// Cluster reports it (`CLUSTER NODES`, asked of another node).
    pub fn replica_of(&self, master: usize) -> usize {
        let asked = self.nodes[(master + 1) % self.nodes.len()].port();
        let nodes = query(asked, "CLUSTER NODES").unwrap();
        let rows: Vec<Vec<&str>> = nodes
            .lines()
            .map(|l| l.split(' ').collect::<Vec<_>>())
            .filter(|f| f.len() >= 8)
            .collect();
        let port_of = |f: &[&str]| -> u16 {
            f[1].split('@')
                .next()
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| p.parse().ok())
                .unwrap()
        };
        let port = self.nodes[master].port();
        let id = rows
            .iter()
            .find(|f| port_of(f) == port)
            .map(|f| f[0])
            .unwrap_or_else(|| panic!("node {port} not in CLUSTER NODES"));
        let replica = rows
            .iter()
            .find(|f| f[3] == id)
            .map(|f| port_of(f))
            .unwrap_or_else(|| panic!("no replica of {port} in CLUSTER NODES"));
        self.nodes.iter().position(|n| n.port() == replica).unwrap()
    }

    /// The index in [`RedisCluster::nodes`] of the master serving `key`'s slot, as the
    /// Cluster reports it (`CLUSTER KEYSLOT`, `CLUSTER NODES`).
    pub fn node_of_key(&self, key: &str) -> usize {
        let port = self.nodes[0].port();
        let slot: u16 = command(port, &format!("CLUSTER KEYSLOT {key}"))
            .unwrap()
            .trim()
            .trim_start_matches(':')
            .parse()
            .unwrap();
        let nodes = query(port, "CLUSTER NODES").unwrap();
        for line in nodes.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            if f.len() < 9 || !f[2].contains("master") {
                continue;
            }
            let node_port: u16 = f[1]
                .split('@')
                .next()
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| p.parse().ok())
                .unwrap();
            let serves = f[8..].iter().any(|r| {
                let (a, b) = r.split_once('-').unwrap_or((r, r));
                match (a.parse::<u16>(), b.parse::<u16>()) {
                    (Ok(a), Ok(b)) => (a..=b).contains(&slot),
                    _ => false,
                }
            });
            if serves {
                return self
                    .nodes
                    .iter()
                    .position(|n| n.port() == node_port)
                    .unwrap();
            }
        }
        panic!("no master serves slot {slot} of {key:?}");
    }
}

/// Sends one inline command and returns its whole reply as text: a bulk string's content
/// (e.g. `INFO`, `CLUSTER NODES`), or the first line of any other reply.
pub fn query(port: u16, cmd: &str) -> std::io::Result<String> {
    let s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    (&s).write_all(format!("{cmd}\r\n").as_bytes())?;
    let mut r = std::io::BufReader::new(&s);
    let mut first = String::new();
    std::io::BufRead::read_line(&mut r, &mut first)?;
    let Some(len) = first.strip_prefix('$') else {
        return Ok(first);
    };
    let len: i64 = len.trim().parse().unwrap_or(-1);
    if len < 0 {
        return Ok(String::new());
    }
    let mut body = vec![0u8; usize::try_from(len).unwrap_or(0) + 2];
    r.read_exact(&mut body)?;
    body.truncate(body.len() - 2);
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// Polls `cond` every 20 ms until it holds; panics with `what` after `within`.
pub fn wait_for(within: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !cond() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The integer `field` of the server's `INFO replication`, or `None` when it cannot be read.
fn replication_offset(port: u16, field: &str) -> Option<u64> {
    let info = query(port, "INFO replication").ok()?;
    info.lines().find_map(|l| {
        l.strip_prefix(field)?
            .strip_prefix(':')?
            .trim()
            .parse()
            .ok()
    })
}

/// Waits until the replica on `replica_port` has applied every write the primary on
/// `primary_port` had made when called: the replica's `slave_repl_offset` reaches the
/// primary's `master_repl_offset`. Panics after `within`.
///
/// `WAIT` cannot do this from a test's own connection: it waits only for the writes made
/// on the connection it is sent on, so on a fresh one it answers at once, whatever the
/// replica has.
pub fn wait_replicated(primary_port: u16, replica_port: u16, within: Duration) {
    let target = replication_offset(primary_port, "master_repl_offset")
        .expect("the primary's master_repl_offset");
    wait_for(within, "the replica to apply the primary's writes", || {
        replication_offset(replica_port, "slave_repl_offset").is_some_and(|o| o >= target)
    });
}

/// A replica of the server on `primary_port`, started with `--replicaof`; returns once its
/// link to the primary is up.
pub fn start_replica(primary_port: u16, extra: &[&str]) -> RedisServer {
    let primary = primary_port.to_string();
    let mut args = vec!["--replicaof", "127.0.0.1", primary.as_str()];
    args.extend_from_slice(extra);
    let replica = RedisServer::start_with(&args);
    wait_for(
        Duration::from_secs(10),
        "the replica's link to its primary",
        || {
            query(replica.port(), "INFO replication")
                .is_ok_and(|i| i.contains("master_link_status:up"))
        },
    );
    replica
}

/// A Redis Sentinel (`redis-server <config> --sentinel`) on a free port, monitoring the
/// primary on `primary_port` as `service` with a quorum of 1; killed on drop.
#[derive(Debug)]
pub struct RedisSentinel {
    server: RedisServer,
}

impl RedisSentinel {
    /// Starts a Sentinel that finds the primary down after `down_after_ms` without an answer
    /// and fails over within `failover_timeout_ms`; returns once it answers `PING`.
    pub fn start(
        primary_port: u16,
        service: &str,
        down_after_ms: u64,
        failover_timeout_ms: u64,
    ) -> Self {
        let port = free_port();
        let dir = scratch_dir(port);
        let config = dir.join("sentinel.conf");
        std::fs::write(
            &config,
            format!(
                "port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {dir}\n\
                 sentinel monitor {service} 127.0.0.1 {primary_port} 1\n\
                 sentinel down-after-milliseconds {service} {down_after_ms}\n\
                 sentinel failover-timeout {service} {failover_timeout_ms}\n\
                 sentinel parallel-syncs {service} 1\n",
                dir = dir.display()
            ),
        )
        .expect("a Sentinel configuration file");
        let mut server = RedisServer {
            port,
            dir,
            extra: Vec::new(),
            tls: false,
            child: None,
        };
        server.launch(&[config.to_string_lossy().as_ref(), "--sentinel"]);
        RedisSentinel { server }
    }

    /// The Sentinel's port.
    pub fn port(&self) -> u16 {
        self.server.port()
    }
}

/// The `calls` of `cmdstat_<command>` in the server's `INFO commandstats` (`fcall`,
/// `evalsha`, `function|load`, ...): 0 when the command never ran.
pub fn command_calls(port: u16, command: &str) -> u64 {
    let stats = query(port, "INFO commandstats").expect("INFO commandstats");
    let field = format!("cmdstat_{command}:");
    stats
        .lines()
        .find_map(|l| l.strip_prefix(field.as_str()))
        .and_then(|rest| rest.split(',').find_map(|kv| kv.strip_prefix("calls=")))
        .map_or(0, |n| n.trim().parse().expect("a call count"))
}
