//! A TCP proxy on loopback whose target can be switched: new connections go to the current
//! target, connections already made stay with theirs — what an application sees when the
//! address it uses is repointed at another server (DNS, a virtual IP, a load balancer).
//!
//! It can also make the connections it carries go silent ([`Proxy::silence`]): they stay
//! open and it keeps reading them, but it forwards nothing either way, while new connections
//! pass as before — what a client sees when a NAT or conntrack entry is lost, or the host it
//! talks to died without a reset.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

/// The proxy; stops accepting on drop (connections already made live until either end
/// closes).
#[derive(Debug)]
pub struct Proxy {
    port: u16,
    target: Arc<AtomicU16>,
    stop: Arc<AtomicBool>,
    /// Per connection carried so far: whether it is silent.
    silent: Arc<Mutex<Vec<Arc<AtomicBool>>>>,
    /// Connections carried so far (made to the target).
    carried: Arc<AtomicUsize>,
}

/// Copies `from` to `to` until either closes; while `silent`, what `from` sends is read and
/// held back (never forwarded).
fn pipe(mut from: TcpStream, mut to: TcpStream, silent: &AtomicBool) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(_) if silent.load(Ordering::Acquire) => {}
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

impl Proxy {
    /// A proxy on a free port of 127.0.0.1 to `127.0.0.1:target`.
    pub fn start(target: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a free port for the proxy");
        let port = listener.local_addr().unwrap().port();
        let target = Arc::new(AtomicU16::new(target));
        let stop = Arc::new(AtomicBool::new(false));
        let silent: Arc<Mutex<Vec<Arc<AtomicBool>>>> = Arc::default();
        let carried = Arc::new(AtomicUsize::new(0));
        let (t, s) = (Arc::clone(&target), Arc::clone(&stop));
        let (all, count) = (Arc::clone(&silent), Arc::clone(&carried));
        thread::spawn(move || {
            for inbound in listener.incoming() {
                if s.load(Ordering::Acquire) {
                    break;
                }
                let Ok(inbound) = inbound else { continue };
                let Ok(outbound) = TcpStream::connect(("127.0.0.1", t.load(Ordering::Acquire)))
                else {
                    // The target is down: so is the connection.
                    continue;
                };
                let _ = inbound.set_nodelay(true);
                let _ = outbound.set_nodelay(true);
                let (a, b) = (inbound.try_clone().unwrap(), outbound.try_clone().unwrap());
                let quiet = Arc::new(AtomicBool::new(false));
                all.lock().unwrap().push(Arc::clone(&quiet));
                count.fetch_add(1, Ordering::AcqRel);
                let back = Arc::clone(&quiet);
                thread::spawn(move || pipe(inbound, outbound, &quiet));
                thread::spawn(move || pipe(b, a, &back));
            }
        });
        Proxy {
            port,
            target,
            stop,
            silent,
            carried,
        }
    }

    /// The proxy's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<proxy port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Sends new connections to `127.0.0.1:target` from now on.
    pub fn repoint(&self, target: u16) {
        self.target.store(target, Ordering::Release);
    }

    /// Makes every connection carried so far silent: it stays open, what either end sends
    /// is read and held back, nothing reaches the other end. Connections made from now on
    /// pass as before.
    pub fn silence(&self) {
        for conn in self.silent.lock().unwrap().iter() {
            conn.store(true, Ordering::Release);
        }
    }

    /// How many connections the proxy has carried to its target so far.
    pub fn carried(&self) -> usize {
        self.carried.load(Ordering::Acquire)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wakes the accept loop so it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}
