//! A switchable TCP proxy on loopback for the chaos runs (`scripts/chaos.sh`): what an
//! application sees when the address it uses for Redis is repointed at another server (DNS, a
//! virtual IP, a load balancer).
//!
//! `proxy TARGET_PORT`
//!
//! Listens on a free port of 127.0.0.1 and forwards each new connection to
//! `127.0.0.1:TARGET_PORT` ([`turnstile_tests::proxy::Proxy`]); connections already made stay
//! with their server. Prints one line, `PROXY_PORT CONTROL_PORT`, then serves until killed.
//! The control port (also 127.0.0.1) takes one command a line: `repoint PORT` sends new
//! connections to `127.0.0.1:PORT` from then on and answers `ok PORT`; `silence` makes every
//! connection carried so far silent — open, read, nothing forwarded either way, what a lost
//! NAT entry does — while new ones pass, and answers `ok silent`; anything else is answered
//! `error ...`.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;

use turnstile_tests::proxy::Proxy;

/// The reply to one control line.
fn command(proxy: &Proxy, line: &str) -> String {
    let mut words = line.split_whitespace();
    match (words.next(), words.next(), words.next()) {
        (Some("repoint"), Some(port), None) => match port.parse::<u16>() {
            Ok(port) if port > 0 => {
                proxy.repoint(port);
                format!("ok {port}")
            }
            _ => format!("error {port:?} is not a port (1 to 65535)"),
        },
        (Some("silence"), None, None) => {
            proxy.silence();
            "ok silent".to_owned()
        }
        _ => format!("error unknown command {line:?}; expected `repoint PORT` or `silence`"),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let target = match args.as_slice() {
        [port] => match port.parse::<u16>() {
            Ok(p) if p > 0 => p,
            _ => {
                eprintln!("proxy: {port:?} is not a port (1 to 65535)");
                std::process::exit(2);
            }
        },
        _ => {
            eprintln!("usage: proxy TARGET_PORT");
            std::process::exit(2);
        }
    };
    let control = match TcpListener::bind("127.0.0.1:0") {
        Ok(l) => l,
        Err(e) => {
            eprintln!("proxy: no port for the control listener: {e}");
            std::process::exit(1);
        }
    };
    let control_port = match control.local_addr() {
        Ok(a) => a.port(),
        Err(e) => {
            eprintln!("proxy: {e}");
            std::process::exit(1);
        }
    };
    let proxy = Proxy::start(target);
    println!("{} {control_port}", proxy.port());
    let _ = std::io::stdout().flush();
    for conn in control.incoming() {
        let Ok(conn) = conn else { continue };
        let Ok(mut out) = conn.try_clone() else {
            continue;
        };
        for line in BufReader::new(conn).lines() {
            let Ok(line) = line else { break };
            if writeln!(out, "{}", command(&proxy, &line)).is_err() {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_lines_repoint_or_say_what_is_wrong() {
        let proxy = Proxy::start(1);
        assert_eq!(command(&proxy, "repoint 6380"), "ok 6380");
        assert_eq!(command(&proxy, "  repoint   7000 "), "ok 7000");
        assert_eq!(
            command(&proxy, "repoint 0"),
            "error \"0\" is not a port (1 to 65535)"
        );
        assert_eq!(
            command(&proxy, "repoint 70000"),
            "error \"70000\" is not a port (1 to 65535)"
        );
        assert_eq!(
            command(&proxy, "repoint 1 2"),
            "error unknown command \"repoint 1 2\"; expected `repoint PORT` or `silence`"
        );
        assert_eq!(
            command(&proxy, "stop"),
            "error unknown command \"stop\"; expected `repoint PORT` or `silence`"
        );
        assert_eq!(command(&proxy, " silence "), "ok silent");
    }
}
