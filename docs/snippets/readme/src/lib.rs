//! The Rust snippets of the pages below, compiled as this crate's doctests (and run, unless
//! marked `no_run`) with exactly the dependencies those pages show:
//! `cargo test -p turnstile-snippets-readme --doc`.

/// `README.md`.
#[cfg(doctest)]
#[doc = include_str!("../../../../README.md")]
pub struct Readme;

/// `docs/keys-and-rules.md`.
#[cfg(doctest)]
#[doc = include_str!("../../../../docs/keys-and-rules.md")]
pub struct KeysAndRules;

/// `crates/tower-turnstile/README.md`.
#[cfg(doctest)]
#[doc = include_str!("../../../../crates/tower-turnstile/README.md")]
pub struct TurnstileReadme;
