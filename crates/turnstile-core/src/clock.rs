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
/// Every reading is W + Δ rounded down to whole ms, or a [`SystemTime::now`] reading itself. W is a
/// [`SystemTime::now`] reading taken less than 1 ms of counter time earlier, paired with the middle
/// of two counter readings around it, and Δ the counter time since that middle (all kept in units
/// of 2^-16 ms, about 15 ns, so that the reading is a shift, not a division, from them). The two
/// counter readings are at most 50 µs apart (`MAX_PAIRING`, 3,276 units), so the pairing is off by
/// at most half that, 25 µs (1,638 units); and over the ms a pairing is used, a wall clock that NTP
/// slews (by at most 500 ppm against the counter's calibrated rate) drifts from the counter by at
/// most 0.5 µs (33 units). So while the wall clock runs smoothly a reading is, before rounding,
/// within 25.5 µs of [`SystemTime::now`] read at the same moment: in whole ms it equals it, or is
/// one ms off across a millisecond's boundary — never more than 1 ms from the wall clock. When the
/// wall clock steps (set by hand, or stepped by NTP), readings follow the new time within 1 ms of
/// counter time; until then they are the old time's, as a [`SystemTime::now`] read up to 1 ms
/// earlier would be. A wall clock before the epoch reads 0.
///
/// Readings are not monotonic, even while the wall clock runs smoothly: a reading taken after
/// another (on the same thread, or after it by synchronisation) may be earlier by up to twice that
/// bound, 51 µs, when a renewal replaces a pairing that was off one way by one off the other way,
/// or one that ran ahead of a wall clock slewed slow by an exact one; in whole ms, it is then 1 ms
/// earlier when a millisecond's boundary falls in that step, never more. Readings from one pairing
/// never go back while the counter runs forward, and a renewal alone cannot avoid the step: a
/// pairing gains on a wall clock slewed slow, so one that refused to go back would run ahead of it
/// without bound; only a per-reading cost (an atomic read-modify-write, or readings that stall)
/// would make readings monotonic. Every backend treats a time earlier than a key's last update as
/// that update's time (`SEMANTICS.md`), as for a wall clock that NTP steps back: a decision is
/// taken at the reading or at the key's last update, whichever is later, so such a step gives no
/// quota back.
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

/// The clock's unit inside: 2^-16 ms (about 15 ns). A reading in these units is shifted
/// right by [`UNIT_BITS`] to whole ms (no division); u64 units reach the year 10,000.
const UNIT_BITS: u32 = 16;

/// One ms in units.
const UNITS_PER_MS: u64 = 1 << UNIT_BITS;

/// How long, in counter units, one wall-clock reading is extrapolated from before it is
/// renewed: 1 ms.
const REANCHOR: u64 = UNITS_PER_MS;

/// The widest a renewal's two counter readings around its wall reading may be apart for the
/// pair to be kept (units; 50 µs): the pairing is then off by at most half of it.
const MAX_PAIRING: u64 = UNITS_PER_MS / 20;

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

/// [`SystemClock`]'s state: the counter, its scale to units, and its offset to the wall
/// clock.
struct Wall {
    counter: quanta::Clock,
    /// Units per counter tick, with [`SCALE_BITS`] fractional bits, taken once from
    /// `quanta`'s calibration: a reading is one multiplication and one shift from the raw
    /// counter (about 1 part in 10^8 off `quanta`'s own scaling, 10 ps per ms).
    scale: u64,
    anchor: Anchor,
}

impl Wall {
    fn new() -> Self {
        let counter = quanta::Clock::new();
        Wall {
            scale: scale(counter.delta_as_nanos(0, 1 << 40)),
            counter,
            anchor: Anchor::new(),
        }
    }

    /// The counter's reading in units (from an arbitrary origin).
    #[inline]
    fn counter_units(&self) -> u64 {
        let raw = u128::from(self.counter.raw());
        ((raw * u128::from(self.scale)) >> SCALE_BITS) as u64
    }

    #[inline]
    fn now_ms(&self) -> u64 {
        self.anchor
            .now(self.counter_units(), system_units, || self.counter_units())
            >> UNIT_BITS
    }
}

/// The offset from the counter in units to the wall clock, and until when (in counter
/// units) it may be used: one acquiring load, a comparison and a relaxed load per reading
/// until then.
///
/// The offset is stored before the deadline that goes with it (which is released), so a
/// reader that sees a deadline ahead of its counter reading also sees that deadline's offset
/// or a later one: never one older than [`REANCHOR`]. Past the deadline, one reader renews
/// the offset (from a wall reading between two counter readings), and any other reads the
/// wall clock itself meanwhile — a renewal that is slow (a preempted thread) delays no one.
#[derive(Debug)]
struct Anchor {
    /// Wall units − counter units (wrapping).
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

    /// The wall clock in units at counter reading `t` (units): from the offset while it is
    /// fresh, else from `wall` (the wall clock in units), renewing the offset with `counter`
    /// (the counter in units) unless another reader is renewing it.
    #[inline]
    fn now(&self, t: u64, wall: impl FnOnce() -> u64, counter: impl FnMut() -> u64) -> u64 {
        // Fresh while until - REANCHOR <= t < until (one subtraction and one comparison): a
        // counter that went back before the pairing (a reset) renews too, instead of reading
        // behind the wall clock for as long as it went back.
        let until = self.until.load(Ordering::Acquire);
        if until.saturating_sub(t).wrapping_sub(1) < REANCHOR {
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
        if apart <= MAX_PAIRING {
            let middle = before + apart / 2;
            let until = before.saturating_add(REANCHOR);
            self.offset.store(
                within_range(w, middle, until).wrapping_sub(middle),
                Ordering::Relaxed,
            );
            self.until.store(until, Ordering::Release);
        }
        self.renewing.store(false, Ordering::Release);
        w
    }
}

/// The wall reading `w` (units) to pair with counter reading `middle` so that no reading
/// from the pair wraps: at each counter reading the pair is fresh for (`until` −
/// [`REANCHOR`] to `until` − 1) it reads within 0..=u64::MAX units. That is `w` itself,
/// except within a ms of either end of the range: near 0 (a wall clock before the epoch reads
/// 0) it is raised so that the pair's first fresh counter reading reads 0, and every reading
/// of the pair then reads 0 ms, as [`SystemClock`] promises before the epoch; near u64::MAX
/// (past the year 10,000, where the wall reading saturates) it is lowered so that the last
/// reads u64::MAX. Taken at renewal, so readings stay one addition.
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

    #[test]
    fn system_clock_is_after_2020() {
        assert!(SystemClock.now_ms() > 1_577_836_800_000);
    }

    /// Reads [`SystemClock`] `n` times, each between two system-clock readings, and asserts
    /// each is within a ms of them.
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

    /// A microsecond in units (rounded down).
    const MICROSECOND: u64 = UNITS_PER_MS / 1_000;

    /// A simulated wall clock in units: 1.7·10¹⁸ units at counter 0, running `ppm` parts per
    /// million fast against the counter, stepped by `steps` (counter units, step in units)
    /// from then on.
    fn wall_at(t: u64, ppm: i64, steps: &[(u64, i64)]) -> u64 {
        let drift = t as i64 * ppm / 1_000_000;
        let stepped: i64 = steps.iter().filter(|s| s.0 <= t).map(|s| s.1).sum();
        (1_700_000_000_000_000_000i64 + t as i64 + drift + stepped) as u64
    }

    #[test]
    fn readings_are_within_a_microsecond_of_the_wall_clock_and_follow_a_step_within_1_ms() {
        // The wall clock slewed by NTP at its limit (±500 ppm), stepped forward by an hour
        // at 10 ms and back by 5 s at 30 ms; readings at irregular counter times.
        let ms = UNITS_PER_MS as i64;
        for ppm in [-500, 0, 500] {
            let steps = [
                (10 * REANCHOR, 3_600_000 * ms),
                (30 * REANCHOR, -5_000 * ms),
            ];
            let a = Anchor::new();
            let mut t = 0u64;
            let mut renewals = 0;
            while t < 50 * REANCHOR {
                let read = a.now(
                    t,
                    || {
                        renewals += 1;
                        wall_at(t, ppm, &steps)
                    },
                    || t,
                );
                // A step within the last ms may not show yet: then the reading follows the
                // wall clock as it was before the step.
                let recent = |s: &(u64, i64)| s.0 <= t && t - s.0 < REANCHOR;
                let seen: Vec<(u64, i64)> = steps.iter().copied().filter(|s| !recent(s)).collect();
                let exact = wall_at(t, ppm, &steps);
                let before_step = wall_at(t, ppm, &seen);
                assert!(
                    read.abs_diff(exact) <= MICROSECOND
                        || read.abs_diff(before_step) <= MICROSECOND,
                    "ppm {ppm} at {t}: read {read}, wall {exact}"
                );
                if !steps.iter().any(recent) {
                    assert!(read.abs_diff(exact) <= MICROSECOND, "ppm {ppm} at {t}");
                }
                t += 1 + t % 523;
            }
            // One wall reading per ms of counter time.
            assert!((50..=51).contains(&renewals), "{renewals} renewals");
        }
    }

    #[test]
    fn the_counter_scale_agrees_with_quanta_and_readings_with_the_system_time() {
        let w = Wall::new();
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
    fn a_reader_racing_a_renewal_reads_the_wall_clock() {
        let a = Anchor::new();
        assert_eq!(a.now(0, || 5_000_000, || 0), 5_000_000);
        a.renewing.store(true, Ordering::SeqCst);
        // Past the deadline while another reader renews: the wall clock itself.
        assert_eq!(a.now(REANCHOR, || 7_000_000, || unreachable!()), 7_000_000);
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
        // Preempted between its counter readings: the wall reading is returned, not kept.
        let mut c = [REANCHOR, REANCHOR + MAX_PAIRING + 1].into_iter();
        assert_eq!(
            a.now(REANCHOR, || 9_000_000_000, || c.next().unwrap()),
            9_000_000_000
        );
        // So the next reader renews again.
        assert_eq!(
            a.now(REANCHOR + 10, || 2_000_000_000, || REANCHOR + 10),
            2_000_000_000
        );
        assert_eq!(a.now(REANCHOR + 20, || unreachable!(), || 0), 2_000_000_010);
    }

    #[test]
    fn renewals_pair_the_wall_reading_with_the_middle_of_the_counter_readings() {
        let a = Anchor::new();
        let mut c = [100, 140].into_iter();
        assert_eq!(a.now(100, || 10_000, || c.next().unwrap()), 10_000);
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
            let (counter, mock) = quanta::Clock::mock();
            let w = Wall {
                scale: scale(u64::try_from(ns).unwrap()),
                counter,
                anchor: Anchor::new(),
            };
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
        // A renewal pairing its wall reading with counter readings at the very end: its
        // deadline saturates, so the pair is fresh from counter u64::MAX - REANCHOR on, and
        // is kept exact.
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
        assert_eq!(b.now(u64::MAX - 1, || 77, || c.next().unwrap()), 77);
        assert_eq!(b.now(u64::MAX - REANCHOR, || unreachable!(), || 0), 0);
        assert_eq!(b.now(u64::MAX - 1, || unreachable!(), || 0), REANCHOR - 1);
    }

    #[test]
    fn a_pairing_skewed_to_its_limit_stays_within_a_millisecond_of_the_wall_clock() {
        // The wall reading taken just as the second counter reading (MAX_PAIRING after the
        // first): every reading from that offset is MAX_PAIRING / 2 ahead, which is under a
        // ms, so whole ms are at most one off; the next renewal is exact again.
        let wall0 = 1_700_000_000_000u64 * UNITS_PER_MS - REANCHOR;
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
    fn readings_on_many_threads_stay_between_the_wall_clock_before_and_after_them() {
        use std::sync::atomic::AtomicU64;
        // One simulated time (units) that every counter and wall reading advances; the wall
        // clock steps forward an hour at 20 ms and back 5 s at 40 ms.
        const WALL0: u64 = 1_700_000_000_000 * UNITS_PER_MS;
        const STEPS: [(u64, i64); 2] = [
            (20 * REANCHOR, 3_600_000 * UNITS_PER_MS as i64),
            (40 * REANCHOR, -5_000 * UNITS_PER_MS as i64),
        ];
        let wall_at = |x: u64, seen: &dyn Fn(u64) -> bool| {
            let stepped: i64 = STEPS.iter().filter(|s| seen(s.0)).map(|s| s.1).sum();
            WALL0.wrapping_add(x).wrapping_add_signed(stepped)
        };
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
                                wall_at(x, &|s| s <= x)
                            },
                            tick,
                        );
                        let hi = now.load(Ordering::SeqCst);
                        // Before a step, after it (once its ms has passed), or either.
                        let within = |seen: &dyn Fn(u64) -> bool| {
                            wall_at(lo, seen) - MAX_PAIRING / 2 <= read
                                && read <= wall_at(hi, seen) + MAX_PAIRING / 2
                        };
                        let known = |s: u64| s + REANCHOR <= lo;
                        let past = |s: u64| s <= hi;
                        assert!(within(&known) || within(&past), "{lo} {t} {hi}: {read}");
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
    fn the_system_clock_read_on_many_threads_is_within_a_millisecond_of_the_system_time() {
        let threads: Vec<_> = (0..4)
            .map(|_| std::thread::spawn(|| reads_within_a_millisecond_of_the_system_time(20_000)))
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }

    #[test]
    fn a_counter_that_jumps_back_renews_instead_of_reading_behind() {
        // The counter anchored at 2 h, then (a reset) an hour behind the true time: the
        // reading comes from the wall clock again, not from the stale offset.
        let hour = 3_600_000 * UNITS_PER_MS;
        let wall0 = 1_700_000_000_000u64 * UNITS_PER_MS;
        let a = Anchor::new();
        let base = 2 * hour;
        assert_eq!(a.now(base, || wall0, || base), wall0);
        let t = base + 2 * REANCHOR - hour;
        assert_eq!(
            a.now(t, || wall0 + 2 * REANCHOR, || t),
            wall0 + 2 * REANCHOR
        );
        let later = a.now(
            t + 2 * REANCHOR,
            || wall0 + 4 * REANCHOR,
            || t + 2 * REANCHOR,
        );
        assert!(
            later.abs_diff(wall0 + 4 * REANCHOR) <= UNITS_PER_MS,
            "{later} against {}",
            wall0 + 4 * REANCHOR
        );
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
        assert_eq!(b.now(0, || u64::MAX, || c.next().unwrap()), u64::MAX);
        for t in [0, 20, 21, REANCHOR - 1] {
            let read = b.now(t, || unreachable!(), || unreachable!());
            assert!(read >= u64::MAX - REANCHOR, "at {t}: {read} units");
        }
    }

    #[test]
    fn readings_go_back_at_most_twice_the_pairing_error_and_whole_ms_at_most_1() {
        // Each renewal's wall reading taken at one end of its counter readings, which are
        // MAX_PAIRING apart, the ends alternating: pairings off by MAX_PAIRING / 2 one way,
        // then the other. The wall clock runs with the counter. Around each renewal (by A,
        // at 37 units past the deadline, so that renewals come at every phase of a ms),
        // reader B reads the last counter unit of the old pairing, then a counter reading
        // taken while A renewed, from the new pairing.
        let wall0 = 1_700_000_000_000u64 * UNITS_PER_MS;
        let a = Anchor::new();
        let mut c = [0, MAX_PAIRING].into_iter();
        a.now(0, || wall0 + MAX_PAIRING, || c.next().unwrap());
        let (mut until, mut ms_back) = (REANCHOR, 0);
        for k in 0..2_000 {
            let old = a.now(until - 1, || unreachable!(), || unreachable!());
            let t = until + 37;
            let at = if k % 2 == 0 { t } else { t + MAX_PAIRING };
            let mut c = [t, t + MAX_PAIRING].into_iter();
            assert_eq!(a.now(t, || wall0 + at, || c.next().unwrap()), wall0 + at);
            let new = a.now(t + 1, || unreachable!(), || unreachable!());
            for (x, read) in [(until - 1, old), (t + 1, new)] {
                assert!(read.abs_diff(wall0 + x) <= MAX_PAIRING / 2, "{x}: {read}");
            }
            // B's readings go back by at most twice the pairing error; whole ms by at most 1.
            assert!(old <= new + MAX_PAIRING, "{t}: {new} after {old}");
            assert!(old >> UNIT_BITS <= (new >> UNIT_BITS) + 1, "{t}");
            if new >> UNIT_BITS < old >> UNIT_BITS {
                ms_back += 1;
            }
            until = t + REANCHOR;
        }
        // The bound is reached: whole ms do go back, where a boundary falls in a step.
        assert!(ms_back > 0, "{ms_back}");
    }

    #[test]
    fn readings_go_back_at_most_the_drift_of_a_ms_under_a_500_ppm_slew() {
        // The wall clock slewed by NTP at its limit against the counter, exact pairings: slow,
        // each pairing runs ahead of it by up to 500 ppm of a ms (33 units) before the next
        // renewal goes back to it; fast, readings never go back.
        let drift = REANCHOR / 2_000 + 1;
        for slow in [true, false] {
            let wall = |t: u64| {
                let w = 1_700_000_000_000u64 * UNITS_PER_MS + 40_000 + t;
                if slow {
                    w - t / 2_000
                } else {
                    w + t / 2_000
                }
            };
            let a = Anchor::new();
            let (mut t, mut last, mut ms_back) = (0u64, 0u64, 0);
            while t < 2_000 * REANCHOR {
                let read = a.now(t, || wall(t), || t);
                assert!(
                    read.abs_diff(wall(t)) <= drift,
                    "{t}: {read} vs {}",
                    wall(t)
                );
                if slow {
                    assert!(last <= read + drift, "{t}: {read} after {last}");
                    assert!(last >> UNIT_BITS <= (read >> UNIT_BITS) + 1, "{t}");
                } else {
                    assert!(last <= read, "{t}: {read} after {last}");
                }
                if read >> UNIT_BITS < last >> UNIT_BITS {
                    ms_back += 1;
                }
                last = read;
                t += 7;
            }
            // Slow, the bound is reached: whole ms do go back, where a boundary falls in a step.
            assert_eq!(ms_back > 0, slow, "{ms_back}");
        }
    }
}
