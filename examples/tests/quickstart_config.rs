//! `quickstart --config examples/turnstile.toml`, served for real on 127.0.0.1 and asked
//! over TCP, enforces the file's rules.

use std::net::SocketAddr;

use axum::Router;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[allow(dead_code)]
#[path = "../quickstart.rs"]
mod quickstart;

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    addr
}

/// One HTTP/1.1 request over a fresh connection: (status, body).
async fn http(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quickstart_enforces_a_config_file() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/turnstile.toml");
    let config = turnstile::config::LayerConfig::from_file(path).unwrap();
    let addr = serve(quickstart::app(Some(&config)).unwrap()).await;
    let mut statuses = Vec::new();
    for _ in 0..11 {
        statuses.push(http(addr, "GET", "/").await.0);
    }
    // The file's "per-ip": 10 per 60 s.
    assert_eq!(statuses.iter().filter(|&&s| s == 200).count(), 10);
    assert_eq!(statuses[10], 429);
    // /healthz is exempt in the file (the quickstart has no such route: 404, never 429).
    for _ in 0..3 {
        assert_eq!(http(addr, "GET", "/healthz").await.0, 404);
    }
    // Without a file, the built-in policy.
    let addr = serve(quickstart::app(None).unwrap()).await;
    assert_eq!(http(addr, "GET", "/").await.0, 200);
}
