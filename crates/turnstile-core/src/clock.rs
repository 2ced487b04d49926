//! Clocks: where "now" comes from.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of the current time, in whole milliseconds since the Unix epoch.
///
/// Fixed and sliding windows are aligned to the epoch, so a clock must count from it. A
/// clock may read earlier than it read before (a test's [`ManualClock`] set back, a clock
/// of your own that follows a wall clock NTP steps back); every algorithm then uses the
/// key's last update time instead, so nothing panics and no quota is given back — but keys
/// written at the later time stay at it until the clock catches up. [`SystemClock`] never
/// reads earlier than before, and a step of the wall clock does not move it.
pub trait Clock: Send + Sync + 'static {
    /// The current time in ms since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// The system's time for rate limiting: whole ms since the Unix epoch, anchored to the wall
/// clock ([`SystemTime::now`]) at its first reading and advanced from then on by a
/// monotonic counter, read cheaply. It never goes back, and a step of the wall clock (set by
/// hand, or stepped by NTP) is not followed: it is taken in by slewing, at most 1/512 of the
/// time passing (about 2 ms per second). A wall clock before the epoch reads as 0.
///
/// Why: a limiter's state records when each key was last updated. A clock stepped forward
/// (a day, say) and back would leave every key touched in between a day in its future,
/// denied until real time caught up, whatever its `Retry-After` said; a clock that only
/// slews changes no decision by more than the slew rate, and windows stay aligned to the
/// epoch as the wall clock had it.
///
/// Reading [`SystemTime::now`] costs a system-clock call per decision (about 50 ns on a
/// virtual machine), more than the rest of an in-memory decision. This clock reads the CPU's
/// time-stamp counter instead (through the `quanta` crate, which calibrates it against the
/// system's monotonic clock, and reads the monotonic clock where the CPU has no invariant
/// counter), plus an offset to the wall clock, compared with one [`SystemTime::now`]
/// reading every millisecond of counter time.
///
/// # Bound
/// Every reading is T + Δ rounded down to whole ms, never less than any earlier reading: T a
/// time paired, less than 1 ms of counter time earlier, with the middle of two counter
/// readings around a [`SystemTime::now`] reading, and Δ the counter time since that middle
/// (all kept in units of 2^-16 ms, about 15 ns, so that the reading is a shift, not a
/// division, from them). The first pairing takes the wall reading as T (the two counter
/// readings are at most 50 µs apart, `MAX_PAIRING`, so it is off by at most 25 µs); every
/// later one moves T from where the previous pairing's line reaches toward its wall reading
/// by at most 1/512 of the counter time since the previous pairing (2 µs per ms). So:
/// - while the wall clock runs smoothly (NTP slews it by at most 500 ppm against the
///   counter), readings follow it within about 25 µs plus what the slew has not yet taken
///   in: in whole ms they equal it or are one ms off across a millisecond's boundary;
/// - when the wall clock steps by S, readings move on at the counter's rate, converging on
///   the new wall time at 2 ms per second: a step of S is taken in after S · 512 of
///   counter time (a 1 s step in 8.5 minutes); a step back leaves readings ahead of the wall
///   clock meanwhile, never behind their own past;
/// - readings never go back: in whole ms, a reading taken after another (on the same
///   thread, or after it by synchronisation) is never earlier.
///
/// The first reading in a process calibrates the counter (up to 200 ms, once, shared with
/// every other `quanta` user) and anchors the clock; [`MemoryBackend::builder`](crate::MemoryBackend::builder)
/// (crate::MemoryBackend::builder) takes it, so the first check does not wait.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[inline]
    fn now_ms(&self) -> u64 {
        static WALL: OnceLock<Wall> = OnceLock::new();
        WALL.get_or_init(|| Wall::new(system_units)).now_ms()
    }
}

/// The clock's unit inside: 2^-16 ms (about 15 ns). A reading in these units is shifted
/// right by [`UNIT_BITS`] to whole ms (no division); u64 units reach the year 10,000.
const UNIT_BITS: u32 = 16;

/// One ms in units.
const UNITS_PER_MS: u64 = 1 << UNIT_BITS;

/// How long, in counter units, one pairing is used before the wall clock is read again:
/// 1 ms.
const REANCHOR: u64 = UNITS_PER_MS;

/// The widest a renewal's two counter readings around its wall reading may be apart for the
/// pair to be kept (units; 50 µs): the pairing is then off by at most half of it.
const MAX_PAIRING: u64 = UNITS_PER_MS / 20;

/// A renewal moves the clock toward the wall clock by at most 1/2^`SLEW_SHIFT` of the
/// counter time since the previous pairing: 1/512, about 2 ms per second (2,000 ppm, four
/// times the most NTP slews a wall clock, so a slewed wall clock is tracked).
const SLEW_SHIFT: u32 = 9;

/// The fractional bits of [`Wall::scale`].
const SCALE_BITS: u32 = 32;

/// The wall clock in units since the epoch ([`SystemTime::now`]), 0 before the epoch,
/// saturating past the year 10,000.
fn system_units() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| {
        let units = d.as_nanos() * u128::from(UNITS_PER_MS) / 1_000_000;
        u64::try_from(units).unwrap_or(u64::MAX)
    })
}

/// [`Wall::scale`] of a counter whose 2^40 ticks (hours of any counter) last `ns`: in units
/// per tick scaled by 2^[`SCALE_BITS`], ns · 2^16 / 10^6 per 2^40 ticks, times 2^32.
fn scale(ns: u64) -> u64 {
    let scale = (u128::from(ns) * u128::from(UNITS_PER_MS) / 1_000_000) >> (40 - SCALE_BITS);
    u64::try_from(scale).unwrap_or(u64::MAX)
}

/// [`SystemClock`]'s state: the counter, its scale to units, its offset to the wall clock,
/// where the wall clock is read from, and the latest reading in ms.
struct Wall {
    counter: quanta::Clock,
    /// Units per counter tick, with [`SCALE_BITS`] fractional bits, taken once from
    /// `quanta`'s calibration: a reading is one multiplication and one shift from the raw
    /// counter (about 1 part in 10^8 off `quanta`'s own scaling, 10 ps per ms).
    scale: u64,
    anchor: Anchor,
    /// The wall clock in units ([`system_units`]; tests give their own).
    wall: fn() -> u64,
    /// The latest reading in whole ms: no reading is earlier.
    last_ms: AtomicU64,
}

impl Wall {
    fn new(wall: fn() -> u64) -> Self {
        let counter = quanta::Clock::new();
        Wall {
            scale: scale(counter.delta_as_nanos(0, 1 << 40)),
            counter,
            anchor: Anchor::new(),
            wall,
            last_ms: AtomicU64::new(0),
        }
    }

    /// The counter's reading in units (from an arbitrary origin).
    #[inline]
    fn counter_units(&self) -> u64 {
        let raw = u128::from(self.counter.raw());
        ((raw * u128::from(self.scale)) >> SCALE_BITS) as u64
    }

    /// The reading in whole ms, never earlier than the latest: a load and a comparison, and
    /// a read-modify-write only when the ms moves on.
    #[inline]
    fn now_ms(&self) -> u64 {
        let units = self
            .anchor
            .now(self.counter_units(), self.wall, || self.counter_units());
        let ms = units >> UNIT_BITS;
        let last = self.last_ms.load(Ordering::Relaxed);
        if ms <= last {
            return last;
        }
        ms.max(self.last_ms.fetch_max(ms, Ordering::Relaxed))
    }
}

/// The offset from the counter in units to the clock's time, and until when (in counter
/// units) it may be used: one acquiring load, a comparison and a relaxed load per reading
/// until then.
///
/// The offset is stored before the deadline that goes with it (which is released), so a
/// reader that sees a deadline ahead of its counter reading also sees that deadline's offset
/// or a later one, which differs from it by at most the slew of one renewal. Past the
/// deadline, one reader renews the offset (from a wall reading between two counter
/// readings), and any other reads on with the offset as it is meanwhile — a renewal that is
/// slow (a preempted thread) delays no one.
#[derive(Debug)]
struct Anchor {
    /// Clock units − counter units (wrapping).
    offset: AtomicU64,
    /// The counter units before which the offset may be used (0: not yet set).
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

    /// The clock in units at counter reading `t` (units): from the offset while it is fresh,
    /// else renewing it with `wall` (the wall clock in units) and `counter` (the counter in
    /// units) unless another reader is renewing it.
    #[inline]
    fn now(&self, t: u64, wall: impl FnOnce() -> u64, counter: impl FnMut() -> u64) -> u64 {
        // Fresh while until - REANCHOR <= t < until (one subtraction and one comparison): a
        // counter that went back before the pairing (a reset) renews too.
        let until = self.until.load(Ordering::Acquire);
        if until.saturating_sub(t).wrapping_sub(1) < REANCHOR {
            return t.wrapping_add(self.offset.load(Ordering::Relaxed));
        }
        self.renew(t, until, wall, counter)
    }

    /// The clock at counter reading `t`, renewing the offset (whose deadline was `until`)
    /// unless another reader is renewing it.
    #[cold]
    #[inline(never)]
    fn renew(
        &self,
        t: u64,
        until: u64,
        wall: impl FnOnce() -> u64,
        mut counter: impl FnMut() -> u64,
    ) -> u64 {
        let anchored = until != 0;
        if self.renewing.swap(true, Ordering::Acquire) {
            // Before the first pairing there is nothing to read on from but the wall clock.
            return if anchored {
                t.wrapping_add(self.offset.load(Ordering::Relaxed))
            } else {
                wall()
            };
        }
        let before = counter();
        let w = wall();
        let after = counter();
        // The wall reading is paired with the middle of the counter readings around it, which
        // is at most half their distance from it: a pair further apart (the thread was
        // preempted) is not kept, and the next reader tries again.
        let apart = after.saturating_sub(before);
        let offset = if apart <= MAX_PAIRING {
            let middle = before + apart / 2;
            let next = before.saturating_add(REANCHOR);
            let time = if anchored {
                let old = self.offset.load(Ordering::Relaxed);
                slewed(old, w.wrapping_sub(middle), until - REANCHOR, middle).wrapping_add(middle)
            } else {
                w
            };
            let offset = within_range(time, middle, next).wrapping_sub(middle);
            self.offset.store(offset, Ordering::Relaxed);
            self.until.store(next, Ordering::Release);
            Some(offset)
        } else {
            anchored.then(|| self.offset.load(Ordering::Relaxed))
        };
        self.renewing.store(false, Ordering::Release);
        offset.map_or(w, |o| t.wrapping_add(o))
    }
}

/// The offset `old` (clock − counter units), last paired in the window that began at counter
/// reading `start`, moved toward `target` (the wall clock − counter units at counter reading
/// `middle`) by at most 1/2^[`SLEW_SHIFT`] of the counter time from `start` to `middle`. A
/// counter that went back before `start` (a reset) moves the offset the other way by as much,
/// so the clock goes on from where the old pairing began instead of falling back with it.
fn slewed(old: u64, target: u64, start: u64, middle: u64) -> u64 {
    let Some(elapsed) = middle.checked_sub(start) else {
        return old.wrapping_add(start - middle);
    };
    let most = i64::try_from(elapsed >> SLEW_SHIFT).unwrap_or(i64::MAX);
    let step = (target.wrapping_sub(old) as i64).clamp(-most, most);
    old.wrapping_add_signed(step)
}

/// The time `w` (units) to pair with counter reading `middle` so that no reading from the
/// pair wraps: at each counter reading the pair is fresh for (`until` − [`REANCHOR`] to
/// `until` − 1) it reads within 0..=u64::MAX units. That is `w` itself, except within a ms
/// of either end of the range: near 0 (a wall clock before the epoch reads 0) it is raised
/// so that the pair's first fresh counter reading reads 0, and every reading of the pair
/// then reads 0 ms, as [`SystemClock`] promises before the epoch; near u64::MAX (past the
/// year 10,000, where the wall reading saturates) it is lowered so that the last reads
/// u64::MAX. Taken at renewal, so readings stay one addition.
fn within_range(w: u64, middle: u64, until: u64) -> u64 {
    let first = until - REANCHOR;
    let last = until - 1;
    w.max(middle.saturating_sub(first))
        .min(u64::MAX - last.saturating_sub(middle))
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
    use crate::backend::Backend;
    use crate::policy::Policy;
    use crate::MemoryBackend;

    #[test]
    fn system_clock_is_after_2020() {
        assert!(SystemClock.now_ms() > 1_577_836_800_000);
    }

    /// Reads [`SystemClock`] `n` times, each between two system-clock readings, and asserts
    /// each is within a ms of them (the system's wall clock runs smoothly under tests).
    fn reads_within_a_millisecond_of_the_system_time(n: usize) {
        for _ in 0..n {
            let before = system_units() >> UNIT_BITS;
            let now = SystemClock.now_ms();
            let after = system_units() >> UNIT_BITS;
            assert!(
                before.saturating_sub(1) <= now && now <= after + 1,
                "{before} <= {now} <= {after}"
            );
        }
    }

    #[test]
    fn system_clock_is_within_a_millisecond_of_the_system_time() {
        reads_within_a_millisecond_of_the_system_time(1_000);
    }

    #[test]
    fn the_system_clock_read_on_many_threads_is_within_a_millisecond_of_the_system_time() {
        let threads: Vec<_> = (0..4)
            .map(|_| std::thread::spawn(|| reads_within_a_millisecond_of_the_system_time(20_000)))
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }

    /// A microsecond in units (rounded down).
    const MICROSECOND: u64 = UNITS_PER_MS / 1_000;

    /// 2023-11-14 in units: where the simulated wall clocks start.
    const WALL0: u64 = 1_700_000_000_000 * UNITS_PER_MS;

    /// A day in units.
    const DAY: u64 = 86_400_000 * UNITS_PER_MS;

    /// A simulated wall clock in units: [`WALL0`] at counter 0, running `ppm` parts per
    /// million fast against the counter, stepped by `steps` (counter units, step in units)
    /// from then on.
    fn wall_at(t: u64, ppm: i64, steps: &[(u64, i64)]) -> u64 {
        let drift = t as i64 * ppm / 1_000_000;
        let stepped: i64 = steps.iter().filter(|s| s.0 <= t).map(|s| s.1).sum();
        WALL0.wrapping_add_signed(t as i64 + drift + stepped)
    }

    #[test]
    fn a_smoothly_running_wall_clock_is_followed_within_a_few_microseconds() {
        // The wall clock slewed by NTP at its limit (±500 ppm) against the counter: the
        // clock's own slew (2,000 ppm) keeps up, so readings stay within a renewal's slew of
        // it; one wall reading per ms of counter time.
        for ppm in [-500, 0, 500] {
            let a = Anchor::new();
            let (mut t, mut renewals) = (0u64, 0);
            while t < 200 * REANCHOR {
                let read = a.now(
                    t,
                    || {
                        renewals += 1;
                        wall_at(t, ppm, &[])
                    },
                    || t,
                );
                let wall = wall_at(t, ppm, &[]);
                assert!(
                    read.abs_diff(wall) <= MICROSECOND,
                    "ppm {ppm} at {t}: {read} vs {wall}"
                );
                t += 1 + t % 523;
            }
            assert!((200..=201).contains(&renewals), "{renewals} renewals");
        }
    }

    #[test]
    fn a_stepped_wall_clock_is_slewed_toward_never_followed() {
        // Stepped forward a day at 10 ms and back a day and 5 s at 30 ms: the clock goes on
        // at the counter's rate, moving toward each new wall time by at most 1/512 of the
        // time passing, so after 100 ms it is within 100 / 512 ms of where it would be with
        // no step at all.
        let steps = [
            (10 * REANCHOR, DAY as i64),
            (30 * REANCHOR, -(DAY as i64) - 5_000 * UNITS_PER_MS as i64),
        ];
        let a = Anchor::new();
        let mut t = 0u64;
        while t < 100 * REANCHOR {
            let read = a.now(t, || wall_at(t, 0, &steps), || t);
            let unstepped = WALL0 + t;
            assert!(
                read.abs_diff(unstepped) <= (t >> SLEW_SHIFT) + 1,
                "at {t}: {read} vs {unstepped}"
            );
            t += 1 + t % 331;
        }
        // Toward the wall clock: ahead of it after the step back, by nearly 5 s.
        let read = a.now(t, || wall_at(t, 0, &steps), || t);
        assert!(read > wall_at(t, 0, &steps) + 4_999 * UNITS_PER_MS);
    }

    /// A [`Wall`] on a mock counter, reading its wall clock from `wall`.
    fn mock_wall(wall: fn() -> u64) -> (Wall, Arc<quanta::Mock>) {
        let (counter, mock) = quanta::Clock::mock();
        // 1 counter tick = 1 ns.
        let w = Wall {
            scale: scale(1 << 40),
            counter,
            anchor: Anchor::new(),
            wall,
            last_ms: AtomicU64::new(0),
        };
        (w, mock)
    }

    #[test]
    fn readings_in_whole_ms_never_go_back() {
        // The wall clock stepped back a day: every renewal moves the clock back toward it by
        // a renewal's slew (about 2 µs), so a reading just after a renewal is behind one just
        // before it, and where a millisecond's boundary falls between them the anchor's
        // reading goes back a whole ms. Readings never do.
        static WALL: AtomicU64 = AtomicU64::new(WALL0 + DAY);
        let (w, mock) = mock_wall(|| WALL.load(Ordering::SeqCst));
        w.now_ms();
        WALL.fetch_sub(DAY, Ordering::SeqCst);
        let (mut last, mut last_raw, mut raw_back) = (0, 0, 0);
        for i in 0..20_000u64 {
            // The counter (1 tick = 1 ns) to a little before the next renewal, then µs by µs
            // across it.
            let until = w.anchor.until.load(Ordering::SeqCst);
            let ticks = |units: u64| units * 1_000_000 / UNITS_PER_MS;
            let to = ticks(until).saturating_sub(3_000 + i % 997);
            mock.increment(to.saturating_sub(mock.value()));
            for _ in 0..8 {
                mock.increment(1_000);
                WALL.store(
                    WALL0 + mock.value() * UNITS_PER_MS / 1_000_000,
                    Ordering::SeqCst,
                );
                let now = w.now_ms();
                let raw = w.anchor.now(w.counter_units(), || unreachable!(), || 0) >> UNIT_BITS;
                assert!(now >= last, "{i}: {now} after {last}");
                if raw < last_raw {
                    raw_back += 1;
                }
                (last, last_raw) = (now, raw);
            }
        }
        // The case is met: the anchor's readings do go back a whole ms.
        assert!(raw_back > 0, "{raw_back}");
    }

    /// The clock of a [`MemoryBackend`] under test: a [`Wall`] on a mock counter and a wall
    /// clock of the test's.
    struct Stepped(Arc<Wall>);

    impl Clock for Stepped {
        fn now_ms(&self) -> u64 {
            self.0.now_ms()
        }
    }

    #[test]
    fn a_wall_clock_stepped_forward_a_day_and_back_locks_no_key_out() {
        // The reproducer of a memory backend on the wall clock: keys used while the wall
        // clock was a day ahead stayed denied for a day once it was set back.
        static WALL: AtomicU64 = AtomicU64::new(WALL0);
        let (w, mock) = mock_wall(|| WALL.load(Ordering::SeqCst));
        let wall = Arc::new(w);
        let b = MemoryBackend::builder()
            .clock(Stepped(Arc::clone(&wall)))
            .build();
        let p = [Policy::token_bucket(2, Duration::from_secs(60)).unwrap()];
        // Advances the counter and the wall clock by `ms`.
        let pass = |ms: u64| {
            for _ in 0..ms {
                mock.increment(1_000_000);
                WALL.fetch_add(UNITS_PER_MS, Ordering::SeqCst);
                wall.now_ms();
            }
        };
        pass(5);
        assert!(b.check("k", &p, 1).into_inner().unwrap().allowed());
        // A day ahead: one more request.
        WALL.fetch_add(DAY, Ordering::SeqCst);
        pass(1_000);
        assert!(b.check("k", &p, 1).into_inner().unwrap().allowed());
        // Back: 30 s on, one token is back (2 per 60 s), as with no step at all.
        WALL.fetch_sub(DAY, Ordering::SeqCst);
        pass(1_000);
        let denied = b.check("k", &p, 1).into_inner().unwrap();
        assert!(!denied.allowed());
        let wait = denied.retry_after().unwrap();
        assert!(wait <= Duration::from_secs(30), "{wait:?}");
        pass(30_000);
        assert!(b.check("k", &p, 1).into_inner().unwrap().allowed());
    }

    #[test]
    fn the_counter_scale_agrees_with_quanta_and_readings_with_the_system_time() {
        let w = Wall::new(system_units);
        // The units of 2^40 ticks by the scale and by quanta's own scaling.
        let ticks = 1u64 << 40;
        let ns = w.counter.delta_as_nanos(0, ticks);
        let units = ((u128::from(ticks) * u128::from(w.scale)) >> SCALE_BITS) as u64;
        let expected = (u128::from(ns) * u128::from(UNITS_PER_MS) / 1_000_000) as u64;
        assert!(
            units.abs_diff(expected) <= expected / 10_000_000 + 1,
            "{units} vs {expected}"
        );
        for _ in 0..1_000 {
            let before = system_units() >> UNIT_BITS;
            let now = w.now_ms();
            let after = system_units() >> UNIT_BITS;
            assert!(before.saturating_sub(1) <= now && now <= after + 1);
        }
    }

    #[test]
    fn a_reader_racing_a_renewal_reads_on_with_the_offset() {
        let a = Anchor::new();
        a.renewing.store(true, Ordering::SeqCst);
        // Before the first pairing: the wall clock itself.
        assert_eq!(a.now(0, || 5_000_000, || unreachable!()), 5_000_000);
        a.renewing.store(false, Ordering::SeqCst);
        assert_eq!(a.now(0, || 5_000_000, || 0), 5_000_000);
        a.renewing.store(true, Ordering::SeqCst);
        // Past the deadline while another reader renews: the offset as it is.
        assert_eq!(
            a.now(REANCHOR, || unreachable!(), || unreachable!()),
            5_000_000 + REANCHOR
        );
        // Before it: the offset.
        assert_eq!(
            a.now(REANCHOR - 1, || unreachable!(), || 0),
            5_000_000 + REANCHOR - 1
        );
    }

    #[test]
    fn a_renewal_whose_readings_are_far_apart_is_not_kept() {
        let a = Anchor::new();
        assert_eq!(a.now(0, || 1_000_000_000, || 0), 1_000_000_000);
        // Preempted between its counter readings: the offset read on, nothing kept.
        let mut c = [REANCHOR, REANCHOR + MAX_PAIRING + 1].into_iter();
        assert_eq!(
            a.now(REANCHOR, || 9_000_000_000, || c.next().unwrap()),
            1_000_000_000 + REANCHOR
        );
        // So the next reader renews again, slewing toward its wall reading.
        let t = REANCHOR + 10;
        let read = a.now(t, || 2_000_000_000, || t);
        assert_eq!(read, 1_000_000_000 + t + (t >> SLEW_SHIFT));
        assert_eq!(a.now(t + 10, || unreachable!(), || 0), read + 10);
    }

    #[test]
    fn renewals_pair_the_wall_reading_with_the_middle_of_the_counter_readings() {
        let a = Anchor::new();
        let mut c = [100, 140].into_iter();
        assert_eq!(a.now(100, || 10_000, || c.next().unwrap()), 9_980);
        assert_eq!(a.now(120, || unreachable!(), || 0), 10_000);
        assert_eq!(a.now(1_000, || unreachable!(), || 0), 10_880);
    }

    #[test]
    fn manual_clock_saturates() {
        let c = ManualClock::new(u64::MAX - 1);
        c.advance(Duration::from_secs(10));
        assert_eq!(c.now_ms(), u64::MAX);
        c.set_ms(5);
        assert_eq!(c.now_ms(), 5);
    }

    #[test]
    fn counters_of_any_rate_are_scaled_to_units_within_a_part_in_ten_million() {
        // From a 32 kHz crystal and ARM's 24 MHz timer to a 5.5 GHz TSC; 1 GHz is the
        // monotonic clock's ns.
        for rate in [
            32_768u64,
            1_000_000,
            19_200_000,
            24_000_000,
            65_536_000,
            1_000_000_000,
            2_100_000_000,
            5_500_000_000,
        ] {
            let ns = (1u128 << 40) * 1_000_000_000 / u128::from(rate);
            let (mut w, mock) = mock_wall(system_units);
            w.scale = scale(u64::try_from(ns).unwrap());
            let per_ms = rate / 1_000;
            let mut last = 0;
            // Ticks of nothing, 1 ms, 1 s, a day, a year and a century (a century's fits
            // every rate's u64 counter; its units too).
            for ticks in [0, 1, per_ms, rate, rate * 86_400, rate * 86_400 * 365] {
                let at = ticks.saturating_mul(100).min(u64::MAX - per_ms);
                for raw in [ticks, at] {
                    mock.decrement(mock.value());
                    mock.increment(raw);
                    let units = w.counter_units();
                    let exact =
                        u128::from(raw) * u128::from(UNITS_PER_MS) * 1_000 / u128::from(rate);
                    let exact = u64::try_from(exact).unwrap();
                    assert!(units <= exact + 1, "{rate} Hz, {raw}: {units} > {exact}");
                    assert!(
                        exact - units <= exact / 10_000_000 + 1,
                        "{rate} Hz, {raw}: {units} vs {exact}"
                    );
                    // A ms of ticks later: a ms of units, within two.
                    mock.increment(per_ms);
                    let ms = w.counter_units() - units;
                    let want = per_ms * 1_000 * UNITS_PER_MS / rate;
                    assert!(ms.abs_diff(want) <= 2, "{rate} Hz at {raw}: {ms} vs {want}");
                    if raw == ticks {
                        assert!(units >= last, "{rate} Hz: {units} < {last}");
                        last = units;
                    }
                }
            }
        }
        // No rate makes the scale overflow.
        assert!(scale(u64::MAX) > 0);
        assert_eq!(scale(0), 0);
    }

    #[test]
    fn huge_counter_and_wall_readings_neither_overflow_nor_stick() {
        // The counter's last ms of range and a wall clock at the end of u64 units.
        let wall0 = u64::MAX - 4 * REANCHOR;
        let start = u64::MAX - 3 * REANCHOR;
        let a = Anchor::new();
        let mut renewals = 0;
        let mut t = start;
        loop {
            let read = a.now(
                t,
                || {
                    renewals += 1;
                    wall0 + (t - start)
                },
                || t,
            );
            assert_eq!(read, wall0 + (t - start), "at {t}");
            if t == u64::MAX {
                break;
            }
            t = t.saturating_add(1 + t % 997);
        }
        // One renewal per ms, and each reading at the counter's last value renews.
        assert!((3..=5).contains(&renewals), "{renewals}");
        // A first pairing at the very end of the counter: its deadline saturates, so the
        // pair is fresh from counter u64::MAX - REANCHOR on, and is kept exact.
        let mut c = [u64::MAX - 1, u64::MAX].into_iter();
        let b = Anchor::new();
        let w = 2 * REANCHOR + 77;
        assert_eq!(b.now(u64::MAX - 1, || w, || c.next().unwrap()), w);
        assert_eq!(b.now(u64::MAX - 1, || unreachable!(), || 0), w);
        assert_eq!(
            b.now(u64::MAX - REANCHOR, || unreachable!(), || 0),
            w + 1 - REANCHOR
        );
        // A wall reading of 77 units there would read before 0 at the pair's first fresh
        // counter reading: it is paired to read 0 there instead (and 0 ms at the pairing, as
        // 77 units is), not wrapped.
        let mut c = [u64::MAX - 1, u64::MAX].into_iter();
        let b = Anchor::new();
        assert_eq!(
            b.now(u64::MAX - 1, || 77, || c.next().unwrap()),
            REANCHOR - 1
        );
        assert_eq!(b.now(u64::MAX - REANCHOR, || unreachable!(), || 0), 0);
        assert_eq!(b.now(u64::MAX - 1, || unreachable!(), || 0), REANCHOR - 1);
    }

    #[test]
    fn a_pairing_skewed_to_its_limit_stays_within_a_millisecond_of_the_wall_clock() {
        // Every wall reading taken just as the second counter reading (MAX_PAIRING after
        // the first): readings are MAX_PAIRING / 2 ahead, which is under a ms, so whole ms
        // are at most one off.
        let wall0 = WALL0 - REANCHOR;
        let a = Anchor::new();
        let mut t = 0u64;
        while t < 20 * REANCHOR {
            let mut c = [t, t + MAX_PAIRING].into_iter();
            let read = a.now(t, || wall0 + t + MAX_PAIRING, || c.next().unwrap());
            let wall = wall0 + t;
            assert!(
                read >= wall && read - wall <= MAX_PAIRING,
                "{t}: {read} vs {wall}"
            );
            assert!((read >> UNIT_BITS) - (wall >> UNIT_BITS) <= 1, "{t}");
            t += 1 + t % 331;
        }
    }

    #[test]
    fn readings_on_many_threads_stay_on_the_counters_line() {
        use std::sync::atomic::AtomicU64;
        // One simulated time (units) that every counter and wall reading advances; the wall
        // clock steps forward an hour at 20 ms and back 5 s at 40 ms, which the clock slews
        // toward: every reading stays within the pairing's error and the slew of the time
        // passed of the unstepped wall clock between the counter readings around it.
        const STEPS: [(u64, i64); 2] = [
            (20 * REANCHOR, 3_600_000 * UNITS_PER_MS as i64),
            (40 * REANCHOR, -5_000 * UNITS_PER_MS as i64),
        ];
        let now = Arc::new(AtomicU64::new(0));
        let anchor = Arc::new(Anchor::new());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (now, anchor) = (Arc::clone(&now), Arc::clone(&anchor));
                std::thread::spawn(move || {
                    let tick = || now.fetch_add(3, Ordering::SeqCst);
                    let mut n = 0u64;
                    while now.load(Ordering::SeqCst) < 60 * REANCHOR {
                        let lo = now.load(Ordering::SeqCst);
                        let t = tick();
                        let read = anchor.now(
                            t,
                            || {
                                let x = tick();
                                wall_at(x, 0, &STEPS)
                            },
                            tick,
                        );
                        let hi = now.load(Ordering::SeqCst);
                        let slack = MAX_PAIRING + (hi >> SLEW_SHIFT);
                        assert!(
                            WALL0 + lo - slack <= read && read <= WALL0 + hi + slack,
                            "{lo} {t} {hi}: {read}"
                        );
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        let reads: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert!(reads > 1_000, "{reads}");
    }

    #[test]
    fn a_counter_that_jumps_back_goes_on_from_where_it_was() {
        // The counter anchored at 2 h, then (a reset) an hour behind: the clock goes on from
        // the old pairing's time, not an hour behind it, and slews toward the wall clock.
        let hour = 3_600_000 * UNITS_PER_MS;
        let a = Anchor::new();
        let base = 2 * hour;
        assert_eq!(a.now(base, || WALL0, || base), WALL0);
        let t = base + 2 * REANCHOR - hour;
        let read = a.now(t, || WALL0 + 2 * REANCHOR, || t);
        assert_eq!(read, WALL0);
        let later = a.now(t + REANCHOR, || WALL0 + 3 * REANCHOR, || t + REANCHOR);
        assert_eq!(later, WALL0 + REANCHOR + (REANCHOR >> SLEW_SHIFT));
    }

    #[test]
    fn a_wall_clock_at_the_epoch_reads_0_not_a_wrapped_time() {
        // A wall clock before the epoch reads 0 units. Paired with the middle of counter
        // readings 40 units apart, a reading at the first of them (fresh) would be 20 units
        // before 0: it reads 0 ms, not a time wrapped to the year 10,000.
        let a = Anchor::new();
        let mut c = [1_000, 1_040].into_iter();
        assert_eq!(a.now(1_000, || 0, || c.next().unwrap()), 0);
        for t in [1_000, 1_019, 1_020, 1_000 + REANCHOR - 1] {
            let read = a.now(t, || unreachable!(), || unreachable!());
            assert_eq!(read >> UNIT_BITS, 0, "at {t}: {read} units");
        }
        // A wall clock saturated at the end of u64 units reads there, not wrapped to 0.
        let b = Anchor::new();
        let mut c = [0, 40].into_iter();
        assert!(b.now(0, || u64::MAX, || c.next().unwrap()) >= u64::MAX - REANCHOR);
        for t in [0, 20, 21, REANCHOR - 1] {
            let read = b.now(t, || unreachable!(), || unreachable!());
            assert!(read >= u64::MAX - REANCHOR, "at {t}: {read} units");
        }
    }
}
