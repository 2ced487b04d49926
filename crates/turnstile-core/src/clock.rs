//! Clocks: where "now" comes from.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of the current time, in whole milliseconds since the Unix epoch.
///
/// Fixed and sliding windows are aligned to the epoch, so a clock must count from it. Clocks
/// may step backwards (a wall clock corrected by NTP); every algorithm then uses the key's
/// last update time instead, so nothing panics and no quota is given back.
pub trait Clock: Send + Sync + 'static {
    /// The current time in ms since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// The system's wall clock ([`SystemTime`]), in ms since the Unix epoch. A time before the
/// epoch reads as 0.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        // 64-bit arithmetic: `as_millis` returns a u128, whose division costs more than the
        // clock read itself.
        SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| {
            d.as_secs()
                .saturating_mul(1000)
                .saturating_add(u64::from(d.subsec_millis()))
        })
    }
}

/// A clock that moves only when told to, for tests and simulations. Clones share one time.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use turnstile_core::{Clock, ManualClock};
///
/// let clock = ManualClock::new(1_000);
/// let other = clock.clone();
/// clock.advance(Duration::from_millis(250));
/// assert_eq!(other.now_ms(), 1_250);
/// ```
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    now_ms: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock reading `start_ms` ms since the epoch.
    pub fn new(start_ms: u64) -> Self {
        ManualClock {
            now_ms: Arc::new(AtomicU64::new(start_ms)),
        }
    }

    /// Moves the clock forward by `by`, rounded down to whole ms; saturates at `u64::MAX` ms.
    pub fn advance(&self, by: Duration) {
        let ms = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        let _ = self
            .now_ms
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| {
                Some(t.saturating_add(ms))
            });
    }

    /// Sets the clock to `ms` since the epoch (it may go backwards).
    pub fn set_ms(&self, ms: u64) {
        self.now_ms.store(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now_ms.load(Ordering::SeqCst)
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now_ms(&self) -> u64 {
        (**self).now_ms()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_clock_is_after_2020() {
        assert!(SystemClock.now_ms() > 1_577_836_800_000);
    }

    #[test]
    fn manual_clock_saturates() {
        let c = ManualClock::new(u64::MAX - 1);
        c.advance(Duration::from_secs(10));
        assert_eq!(c.now_ms(), u64::MAX);
        c.set_ms(5);
        assert_eq!(c.now_ms(), 5);
    }
}
