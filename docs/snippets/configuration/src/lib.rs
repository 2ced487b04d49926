//! The Rust snippets of the pages below, compiled as this crate's doctests (and run, unless
//! marked `no_run`) with exactly the dependencies those pages show:
//! `cargo test -p turnstile-snippets-configuration --doc`.

/// `docs/configuration.md`.
#[cfg(doctest)]
#[doc = include_str!("../../../../docs/configuration.md")]
pub struct Configuration;
