//! Clocks: where "now" comes from.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
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

/// The system's wall clock, in whole ms since the Unix epoch, read cheaply: never more than
/// 1 ms from [`SystemTime::now`] while the system clock runs smoothly. A time before the epoch
/// reads as 0.
///
/// Reading [`SystemTime::now`] costs a system-clock call per decision (about 50 ns on a
/// virtual machine), more than the rest of an in-memory decision. This clock reads the CPU's
/// time-stamp counter instead (through the `quanta` crate, which calibrates it against the
/// system's monotonic clock; where the CPU has no invariant counter, `quanta` reads the
/// monotonic clock), adds an offset to the wall clock, and re-reads the wall clock every
/// 100 ms of counter time to renew the offset. So the calibration's error adds up over
/// 100 ms at most (microseconds), and a step of the system clock (set by hand, or by NTP
/// stepping rather than slewing) shows within 100 ms; until then readings follow the old
/// time, and every algorithm treats a clock that steps back as the key's last update time
/// (`SEMANTICS.md`). Decisions are in whole milliseconds, so nothing finer is needed.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[inline]
    fn now_ms(&self) -> u64 {
        static WALL: OnceLock<Wall> = OnceLock::new();
        WALL.get_or_init(Wall::new).now_ms()
    }
}

/// How long, in counter nanoseconds, one offset from the counter to the wall clock is used.
const REANCHOR_NS: u64 = 100_000_000;

/// The wall clock's ns since the epoch ([`SystemTime::now`]), 0 before the epoch.
fn system_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| {
        d.as_secs()
            .saturating_mul(1_000_000_000)
            .saturating_add(u64::from(d.subsec_nanos()))
    })
}

/// [`SystemClock`]'s state: the counter, and its offset to the wall clock.
struct Wall {
    counter: quanta::Clock,
    anchor: Anchor,
}

impl Wall {
    fn new() -> Self {
        let counter = quanta::Clock::new();
        let wall = Wall {
            anchor: Anchor::new(),
            counter,
        };
        let t = wall.counter_ns();
        wall.anchor.renew(t, system_ns, || wall.counter_ns());
        wall
    }

    /// The counter's reading in ns (from an arbitrary origin).
    #[inline]
    fn counter_ns(&self) -> u64 {
        self.counter.delta_as_nanos(0, self.counter.raw())
    }

    #[inline]
    fn now_ms(&self) -> u64 {
        let t = self.counter_ns();
        self.anchor.now_ms(t, system_ns, || self.counter_ns())
    }
}

/// The offset from a counter in ns to the wall clock, renewed by the first reader once the
/// counter passes `next`: one relaxed load and a comparison otherwise. A reader racing a
/// renewal may use the offset just replaced, which is microseconds from the new one.
#[derive(Debug)]
struct Anchor {
    /// Wall ns − counter ns (wrapping).
    offset: AtomicU64,
    /// The counter ns from which the offset is to be renewed.
    next: AtomicU64,
}

impl Anchor {
    fn new() -> Self {
        Anchor {
            offset: AtomicU64::new(0),
            next: AtomicU64::new(0),
        }
    }

    /// The wall clock in ms at counter reading `t` (ns), renewing the offset first when it is
    /// due, with `wall` (the wall clock in ns) and `counter` (the counter in ns).
    #[inline]
    fn now_ms(&self, t: u64, wall: impl FnOnce() -> u64, counter: impl Fn() -> u64) -> u64 {
        let next = self.next.load(Ordering::Relaxed);
        if t >= next
            && self
                .next
                .compare_exchange(
                    next,
                    t.saturating_add(REANCHOR_NS),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            self.renew(t, wall, counter);
        }
        t.wrapping_add(self.offset.load(Ordering::Relaxed)) / 1_000_000
    }

    /// Sets the offset from one wall reading between counter readings `t` and `counter()`.
    fn renew(&self, t: u64, wall: impl FnOnce() -> u64, counter: impl Fn() -> u64) {
        let w = wall();
        let mid = t + counter().saturating_sub(t) / 2;
        self.offset.store(w.wrapping_sub(mid), Ordering::Relaxed);
        self.next
            .fetch_max(t.saturating_add(REANCHOR_NS), Ordering::Relaxed);
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
    fn system_clock_is_within_a_millisecond_of_the_system_time() {
        for _ in 0..1_000 {
            let before = system_ns() / 1_000_000;
            let now = SystemClock.now_ms();
            let after = system_ns() / 1_000_000;
            assert!(
                before.saturating_sub(1) <= now && now <= after + 1,
                "{before} <= {now} <= {after}"
            );
        }
    }

    #[test]
    fn the_offset_is_renewed_every_100_ms_of_counter_time() {
        // A counter at 5 s and a wall clock at 1,000 s: ms follow the counter from there.
        let a = Anchor::new();
        let wall = |ns: u64| move || ns;
        let counter = |ns: u64| move || ns;
        assert_eq!(
            a.now_ms(
                5_000_000_000,
                wall(1_000_000_000_000),
                counter(5_000_000_000)
            ),
            1_000_000
        );
        assert_eq!(a.now_ms(5_099_999_999, wall(0), counter(0)), 1_000_099);
        // The wall clock stepped 1 s forward: seen at the next renewal, not before.
        assert_eq!(
            a.now_ms(
                5_100_000_000,
                wall(1_001_100_000_000),
                counter(5_100_000_000)
            ),
            1_001_100
        );
        assert_eq!(a.now_ms(5_150_000_000, wall(0), counter(0)), 1_001_150);
        // A wall reading is paired with the middle of the counter readings around it.
        assert_eq!(
            a.now_ms(
                5_200_000_000,
                wall(2_000_000_000_000),
                counter(5_200_000_002)
            ),
            1_999_999
        );
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
