//! Helpers for turnstile's end-to-end tests: an app served on loopback, `redis-server`
//! processes the tests start themselves, a TCP proxy to repoint an address at another
//! server, the certificates of the TLS tests, and the shape of a stored state string.

pub mod app_server;
pub mod proxy;
pub mod redis_server;
pub mod state_string;
pub mod tls;
