//! Taking a shard's lock: `parking_lot`'s mutex, with a bounded spin of our own first.
//!
//! A shard is held for a lookup and a decision (well under a microsecond), never across an
//! `.await`, a system call or a callback, and a thread holds at most one shard it waits for
//! (the sweeps that look at other shards while holding one only `try_lock` them): no lock
//! order can deadlock.
//!
//! On one hot key, threads take turns on one shard. A mutex that parks its waiters at once
//! makes every release a wake-up system call and every wait a sleep, which cost more than
//! the checks themselves (on two threads, a third of the checks per second of one thread).
//! So a waiter first looks at the lock seldom, and longer apart each time: every look pulls
//! the lock's cache line from the holder, whose next check then waits for it, so the holder
//! gets runs of checks at full speed. The spin is bounded (a few thousand spin-loop hints,
//! microseconds): past it the waiter parks in `parking_lot`'s queue, which hands the lock
//! over fairly now and then, so no waiter starves and a holder that was preempted costs its
//! waiters no CPU.

use parking_lot::{Mutex, MutexGuard};

/// Looks at the lock before parking, at most this many times.
const LOOKS: u32 = 12;
/// 2^FIRST spin-loop hints before the first look, twice as many before each next look, up
/// to 2^LAST: 1,788 in all before parking.
const FIRST: u32 = 2;
const LAST: u32 = 8;

/// Locks `m`: at once when it is free; else after a bounded spin, or by parking.
#[inline]
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.try_lock() {
        Some(guard) => guard,
        None => contended(m),
    }
}

/// [`lock`] when `m` is taken.
#[cold]
#[inline(never)]
fn contended<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    for look in 0..LOOKS {
        for _ in 0..1u32 << (FIRST + look).min(LAST) {
            std::hint::spin_loop();
        }
        if !m.is_locked() {
            if let Some(guard) = m.try_lock() {
                return guard;
            }
        }
    }
    m.lock()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[test]
    fn a_waiter_gets_the_lock_after_a_long_hold() {
        // Held while the holder yields its CPU many times (longer than the spin lasts, as a
        // rule): the waiter parks, and is woken on release. Whatever the timing, it never
        // takes the lock while it is held, and takes it once released.
        let m = Mutex::new(0u32);
        let taken = AtomicBool::new(false);
        std::thread::scope(|s| {
            let mut guard = lock(&m);
            s.spawn(|| {
                *lock(&m) += 1;
                taken.store(true, Ordering::SeqCst);
            });
            for _ in 0..1_000 {
                std::thread::yield_now();
            }
            assert!(!taken.load(Ordering::SeqCst));
            *guard += 1;
            drop(guard);
        });
        assert!(taken.load(Ordering::SeqCst));
        assert_eq!(*m.lock(), 2);
    }
}
