//! End-to-end tests of turnstile live in `tests/`; this library is empty.
