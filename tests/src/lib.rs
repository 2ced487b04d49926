//! Helpers for turnstile's end-to-end tests: `redis-server` processes the tests start
//! themselves, and a TCP proxy to repoint an address at another server.

pub mod proxy;
pub mod redis_server;
