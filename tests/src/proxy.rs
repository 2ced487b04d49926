//! A TCP proxy on loopback whose target can be switched: new connections go to the current
//! target, connections already made stay with theirs — what an application sees when the
//! address it uses is repointed at another server (DNS, a virtual IP, a load balancer).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::Arc;
use std::thread;

/// The proxy; stops accepting on drop (connections already made live until either end
/// closes).
#[derive(Debug)]
pub struct Proxy {
    port: u16,
    target: Arc<AtomicU16>,
    stop: Arc<AtomicBool>,
}

fn pipe(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
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
        let (t, s) = (Arc::clone(&target), Arc::clone(&stop));
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
                thread::spawn(move || pipe(inbound, outbound));
                thread::spawn(move || pipe(b, a));
            }
        });
        Proxy { port, target, stop }
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
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wakes the accept loop so it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}
