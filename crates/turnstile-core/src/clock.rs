//! Clocks: where "now" comes from.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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

/// The system's wall clock, in whole ms since the Unix epoch, read cheaply. A time before
/// the epoch reads as 0.
///
/// Reading [`SystemTime::now`] costs a system-clock call per decision (about 50 ns on a
/// virtual machine), more than the rest of an in-memory decision. This clock reads the CPU's
/// time-stamp counter instead (through the `quanta` crate, which calibrates it against the
/// system's monotonic clock, and reads the monotonic clock where the CPU has no invariant
/// counter), plus an offset to the wall clock taken from one [`SystemTime::now`] reading,
/// renewed as soon as it is 1 ms old.
///
/// # Bound
/// Every reading is W + Δ rounded down to whole ms, where W is a [`SystemTime::now`] reading
/// taken less than 1 ms of counter time earlier and Δ the counter time since, or a
/// [`SystemTime::now`] reading itself. So while the wall clock runs smoothly (NTP slews it
/// by at most 500 ppm) the reading is within microseconds of the wall clock: it equals
/// [`SystemTime::now`] in whole ms, or is one ms off across a millisecond's boundary —
/// never more than 1 ms from the wall clock. When the wall clock steps (set by hand, or
/// stepped by NTP), readings follow the new time within 1 ms of counter time; until then
/// they are the old time's, as a [`SystemTime::now`] read up to 1 ms earlier would be.
/// Every algorithm treats a clock that steps back as the key's last update time
/// (`SEMANTICS.md`).
///
/// The first reading in a process calibrates the counter (up to 200 ms, once, shared with
/// every other `quanta` user); [`MemoryBackend::builder`](crate::MemoryBackend::builder)
/// takes it, so the first check does not wait.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[inline]
    fn now_ms(&self) -> u64 {
        static WALL: OnceLock<Wall> = OnceLock::new();
        WALL.get_or_init(Wall::new).now_ms()
    }
}

/// How long, in counter ns, one wall-clock reading is extrapolated from before it is renewed.
const REANCHOR_NS: u64 = 1_000_000;

/// The widest a renewal's two counter readings around its wall reading may be apart for the
/// pair to be kept (ns): the pairing is then off by at most half of it.
const MAX_PAIRING_NS: u64 = 50_000;

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
        Wall {
            counter: quanta::Clock::new(),
            anchor: Anchor::new(),
        }
    }

    /// The counter's reading in ns (from an arbitrary origin).
    #[inline]
    fn counter_ns(&self) -> u64 {
        self.counter.delta_as_nanos(0, self.counter.raw())
    }

    #[inline]
    fn now_ms(&self) -> u64 {
        self.anchor
            .now_ns(self.counter_ns(), system_ns, || self.counter_ns())
            / 1_000_000
    }
}

/// The offset from a counter in ns to the wall clock, and until when (in counter ns) it may
/// be used: one acquiring load, a comparison and a relaxed load per reading until then.
///
/// The offset is stored before the deadline that goes with it (which is released), so a
/// reader that sees a deadline ahead of its counter reading also sees that deadline's offset
/// or a later one: never one older than [`REANCHOR_NS`]. Past the deadline, one reader renews
/// the offset (from a wall reading between two counter readings), and any other reads the
/// wall clock itself meanwhile — a renewal that is slow (a preempted thread) delays no one.
#[derive(Debug)]
struct Anchor {
    /// Wall ns − counter ns (wrapping).
    offset: AtomicU64,
    /// The counter ns before which the offset may be used (0: not yet set).
    until: AtomicU64,
    /// Whether a reader is renewing the offset.
    renewing: AtomicBool,
}

impl Anchor {
    fn new() -> Self {
        Anchor {
            offset: AtomicU64::new(0),
            until: AtomicU64::new(0),
            renewing: AtomicBool::new(false),
        }
    }

    /// The wall clock in ns at counter reading `t` (ns): from the offset while it is fresh,
    /// else from `wall` (the wall clock in ns), renewing the offset with `counter` (the
    /// counter in ns) unless another reader is renewing it.
    #[inline]
    fn now_ns(&self, t: u64, wall: impl FnOnce() -> u64, counter: impl FnMut() -> u64) -> u64 {
        if t < self.until.load(Ordering::Acquire) {
            return t.wrapping_add(self.offset.load(Ordering::Relaxed));
        }
        self.renew(wall, counter)
    }

    /// The wall clock read now, renewing the offset with the reading unless another reader
    /// is renewing it.
    #[cold]
    #[inline(never)]
    fn renew(&self, wall: impl FnOnce() -> u64, mut counter: impl FnMut() -> u64) -> u64 {
        if self.renewing.swap(true, Ordering::Acquire) {
            return wall();
        }
        let before = counter();
        let w = wall();
        let after = counter();
        // The wall reading is paired with the middle of the counter readings around it, which
        // is at most half their distance from it: a pair further apart (the thread was
        // preempted) is not kept, and the next reader tries again.
        let apart = after.saturating_sub(before);
        if apart <= MAX_PAIRING_NS {
            self.offset
                .store(w.wrapping_sub(before + apart / 2), Ordering::Relaxed);
            self.until
                .store(before.saturating_add(REANCHOR_NS), Ordering::Release);
        }
        self.renewing.store(false, Ordering::Release);
        w
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

    /// A simulated wall clock: 1.7·10¹⁸ ns at counter 0, running `ppm` parts per million
    /// fast against the counter, stepped by `steps` (counter ns, step in ns) from then on.
    fn wall_at(t: u64, ppm: i64, steps: &[(u64, i64)]) -> u64 {
        let drift = t as i64 / 1_000_000 * ppm;
        let stepped: i64 = steps.iter().filter(|s| s.0 <= t).map(|s| s.1).sum();
        (1_700_000_000_000_000_000i64 + t as i64 + drift + stepped) as u64
    }

    #[test]
    fn readings_are_within_a_microsecond_of_the_wall_clock_and_follow_a_step_within_1_ms() {
        // The wall clock slewed by NTP at its limit (±500 ppm), stepped forward by an hour
        // at 10 ms and back by 5 s at 30 ms; readings at irregular counter times.
        for ppm in [-500, 0, 500] {
            let steps = [
                (10_000_000, 3_600_000_000_000),
                (30_000_000, -5_000_000_000),
            ];
            let a = Anchor::new();
            let mut t = 0u64;
            let mut renewals = 0;
            while t < 50_000_000 {
                let read = a.now_ns(
                    t,
                    || {
                        renewals += 1;
                        wall_at(t, ppm, &steps)
                    },
                    || t,
                );
                // A step within the last ms may not show yet: then the reading follows the
                // wall clock as it was before the step.
                let recent = |s: &(u64, i64)| s.0 <= t && t - s.0 < REANCHOR_NS;
                let seen: Vec<(u64, i64)> = steps.iter().copied().filter(|s| !recent(s)).collect();
                let exact = wall_at(t, ppm, &steps);
                let before_step = wall_at(t, ppm, &seen);
                assert!(
                    read.abs_diff(exact) <= 1_000 || read.abs_diff(before_step) <= 1_000,
                    "ppm {ppm} at {t}: read {read}, wall {exact}"
                );
                if !steps.iter().any(recent) {
                    assert!(read.abs_diff(exact) <= 1_000, "ppm {ppm} at {t}");
                }
                t += 1 + t % 7_919;
            }
            // One wall reading per ms of counter time.
            assert!((50..=51).contains(&renewals), "{renewals} renewals");
        }
    }

    #[test]
    fn a_reader_racing_a_renewal_reads_the_wall_clock() {
        let a = Anchor::new();
        assert_eq!(a.now_ns(0, || 5_000_000, || 0), 5_000_000);
        a.renewing.store(true, Ordering::SeqCst);
        // Past the deadline while another reader renews: the wall clock itself.
        assert_eq!(
            a.now_ns(REANCHOR_NS, || 7_000_000, || unreachable!()),
            7_000_000
        );
        // Before it: the offset.
        assert_eq!(
            a.now_ns(REANCHOR_NS - 1, || unreachable!(), || 0),
            5_999_999
        );
    }

    #[test]
    fn a_renewal_whose_readings_are_far_apart_is_not_kept() {
        let a = Anchor::new();
        assert_eq!(a.now_ns(0, || 1_000_000_000, || 0), 1_000_000_000);
        // Preempted between its counter readings: the wall reading is returned, not kept.
        let mut c = [REANCHOR_NS, REANCHOR_NS + MAX_PAIRING_NS + 1].into_iter();
        assert_eq!(
            a.now_ns(REANCHOR_NS, || 9_000_000_000, || c.next().unwrap()),
            9_000_000_000
        );
        // So the next reader renews again.
        assert_eq!(
            a.now_ns(REANCHOR_NS + 10, || 2_000_000_000, || REANCHOR_NS + 10),
            2_000_000_000
        );
        assert_eq!(
            a.now_ns(REANCHOR_NS + 20, || unreachable!(), || 0),
            2_000_000_010
        );
    }

    #[test]
    fn renewals_pair_the_wall_reading_with_the_middle_of_the_counter_readings() {
        let a = Anchor::new();
        let mut c = [100, 140].into_iter();
        assert_eq!(a.now_ns(100, || 10_000, || c.next().unwrap()), 10_000);
        assert_eq!(a.now_ns(120, || unreachable!(), || 0), 10_000);
        assert_eq!(a.now_ns(1_000, || unreachable!(), || 0), 10_880);
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
