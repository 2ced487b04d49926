//! Helpers for turnstile's end-to-end tests: `redis-server` processes the tests start
//! themselves.

pub mod redis_server;
