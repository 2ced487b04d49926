//! Tests of the release itself, in `tests/`: every page's Rust snippets are compiled with the
//! dependency block the page shows (`snippets.rs`), no dependency in `Cargo.lock` needs a
//! newer Rust than the crate (or its feature) declares (`rust_version.rs`), and each
//! publishable crate's package carries its licenses, README and scripts (`package.rs`).
