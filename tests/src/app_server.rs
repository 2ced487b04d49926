//! An axum app served for real on a free port of 127.0.0.1, for tests that ask it over TCP.

use std::net::SocketAddr;

use axum::Router;

/// Serves `app` on a free port of 127.0.0.1, with each connection's peer address as
/// `ConnectInfo` (what the layer keys by), until the test's runtime ends. Returns the address.
///
/// # Panics
/// When no port can be bound, or the server fails.
pub async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a free port of 127.0.0.1");
    let addr = listener.local_addr().expect("the listener's address");
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .expect("the app serves");
    });
    addr
}
