//! The contract's rounding of reported durations (`SEMANTICS.md`, "Reported durations are
//! exact values rounded **up**"), in one place for every front end.
//!
//! A [`Decision`](crate::Decision)'s durations are exact values rounded up to whole
//! nanoseconds (see [`exact_ms`](crate::decision::exact_ms)), so rounding them up again here rounds the
//! exact value: a client told to wait is never told a wait shorter than the real one.
//!
//! | function | unit | used for |
//! | --- | --- | --- |
//! | [`ceil_ms`] | whole milliseconds | waits reported in ms (`turnstile simulate`, `turnstile quota`, an RPC's retry information) |
//! | [`ceil_secs`] | whole seconds | waits and resets reported in seconds |
//! | [`retry_after_secs`] | whole seconds, at least 1 | a denial's wait in seconds, when a client is told when to retry |
//!
//! ```
//! use std::time::Duration;
//! use turnstile_core::round::{ceil_ms, ceil_secs, retry_after_secs};
//!
//! let d = Duration::from_micros(1_000_001);
//! assert_eq!(ceil_ms(d), 1_001);
//! assert_eq!(ceil_secs(d), 2);
//! assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
//! ```

use std::time::Duration;

/// `d` in whole milliseconds, rounded up (1 ns → 1 ms); `u64::MAX` ms when `d` is longer
/// than that (no decision within `SEMANTICS.md`'s bounds comes near).
pub fn ceil_ms(d: Duration) -> u64 {
    // A whole second is a whole number of ms, so only the sub-second part rounds.
    let sub_ms = u64::from(d.subsec_nanos().div_ceil(1_000_000));
    d.as_secs().saturating_mul(1_000).saturating_add(sub_ms)
}

/// `d` in whole seconds, rounded up (1 ns → 1 s; zero stays 0 s); `u64::MAX` s at most.
pub fn ceil_secs(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

/// A denial's wait as a client is told it in whole seconds: `d` in whole seconds, rounded
/// up, and at least 1 s, so a client never retries before the real wait has passed.
pub fn retry_after_secs(d: Duration) -> u64 {
    ceil_secs(d).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceil_ms_rounds_up() {
        assert_eq!(ceil_ms(Duration::ZERO), 0);
        assert_eq!(ceil_ms(Duration::from_nanos(1)), 1);
        assert_eq!(ceil_ms(Duration::from_nanos(333_333_334)), 334);
        assert_eq!(ceil_ms(Duration::from_millis(250)), 250);
    }

    #[test]
    fn rounding_is_up_and_retry_after_at_least_one() {
        assert_eq!(ceil_secs(Duration::ZERO), 0);
        assert_eq!(ceil_secs(Duration::from_nanos(1)), 1);
        assert_eq!(ceil_secs(Duration::from_secs(6)), 6);
        assert_eq!(ceil_secs(Duration::from_millis(6001)), 7);
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
    }

    #[test]
    fn whole_seconds_and_the_largest_durations() {
        assert_eq!(ceil_ms(Duration::new(2, 1)), 2_001);
        assert_eq!(ceil_ms(Duration::MAX), u64::MAX);
        assert_eq!(ceil_secs(Duration::MAX), u64::MAX);
        assert_eq!(retry_after_secs(Duration::MAX), u64::MAX);
    }
}
