//! Helpers shared by the examples' tests: serve an app on 127.0.0.1 (the tests' own
//! [`serve`]) and ask it over TCP.

#![allow(dead_code)] // each test file uses its own subset

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
pub(crate) use turnstile_tests::app_server::serve;

/// One HTTP/1.1 request over a fresh connection: (status, body).
pub(crate) async fn http(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-length: 0\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text[9..12].parse().unwrap();
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    (status, body)
}
