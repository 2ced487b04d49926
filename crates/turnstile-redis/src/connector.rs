//! Connections made in the background: one attempt at a time per target, shared by every
//! call, and never cut short by a caller's timeout.
//!
//! A call that finds no usable connection waits for the attempt in progress (starting one if
//! none runs) until its own deadline. The attempt itself runs in a task of its own, bounded
//! only by the connection's limit: a slow first connection (a cold process, a loaded machine)
//! completes for the calls after it even when the first callers gave up, where an attempt
//! made by the caller would be dropped with it and started over by the next.
//!
//! An attempt refused outright while there is no connection (a restarting server, a primary
//! the Sentinels do not name yet) is made again soon — after a tenth of how long the target
//! has been refusing, between 5 and 100 ms ([`soon_after`]) — so a server back after a
//! restart is reached within moments, and the callers waiting meanwhile get it. Any other
//! failure ends the attempts: the next call starts a new one.
//!
//! A target may also be *replaced*: a new connection made while the current one keeps serving
//! (a Cluster), or after dropping it (a single node whose connection went silent). See
//! [`replace`].

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::instrument::WithSubscriber;

use crate::fault::{Failed, Fault, NoConnection};

/// The least wait before trying again a target that is away for a moment.
const SOON_MIN: Duration = Duration::from_millis(5);

/// The longest wait before trying again a target that is away for a moment.
const SOON_MAX: Duration = Duration::from_millis(100);

/// How long to wait before trying again a target that has been away (refusing connections,
/// restarting, failing over) for `away`: a tenth of it, between 5 and 100 ms. Cheap to find
/// out, and a restart is over in moments; a long outage is not tried more than ten times a
/// second.
pub(crate) fn soon_after(away: Duration) -> Duration {
    (away / 10).clamp(SOON_MIN, SOON_MAX)
}

/// Makes connections for a [`Slot`].
pub(crate) trait Connect: Send + Sync + Sized + 'static {
    /// A connection; clones share it.
    type Conn: Clone + Send + Sync + 'static;

    /// The slot the connections go to.
    fn slot(&self) -> &Slot<Self::Conn>;

    /// One attempt: a connection checked and ready for calls.
    fn open(&self) -> impl Future<Output = Result<Self::Conn, NoConnection>> + Send;

    /// The longest one attempt may take.
    fn attempt_limit(&self) -> Duration;

    /// Whether `conn` may still take calls (a connection known closed may not).
    fn usable(_conn: &Self::Conn) -> bool {
        true
    }
}

/// A connection with its number: connections are numbered in the order they were made.
#[derive(Clone)]
pub(crate) struct Held<T> {
    pub(crate) id: u64,
    pub(crate) conn: T,
}

/// The connection of one target, and the attempt to make one.
pub(crate) struct Slot<T> {
    state: Mutex<State<T>>,
    /// Woken at the end of every attempt.
    changed: Notify,
    /// The number the next connection gets (written under `state`'s lock).
    next_id: AtomicU64,
}

struct State<T> {
    live: Option<Held<T>>,
    /// An attempt (or a series of them) runs.
    connecting: bool,
    /// The last attempt's failure, until a connection is made.
    failure: Option<NoConnection>,
    /// Attempts ended so far.
    attempts: u64,
}

impl<T: Clone> Slot<T> {
    pub(crate) fn new() -> Self {
        Slot {
            state: Mutex::new(State {
                live: None,
                connecting: false,
                failure: None,
                attempts: 0,
            }),
            changed: Notify::new(),
            next_id: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The number the next connection will get: a call that began when this was `g` used a
    /// connection numbered below `g`, or one made while it waited.
    pub(crate) fn generation(&self) -> u64 {
        self.next_id.load(Ordering::Acquire)
    }

    /// Drops connection `id` if it is still the current one: the next call makes another.
    pub(crate) fn discard(&self, id: u64) {
        let mut s = self.lock();
        if s.live.as_ref().is_some_and(|l| l.id == id) {
            s.live = None;
        }
    }
}

/// The current connection of `owner`, if it may take calls.
pub(crate) fn current<C: Connect>(owner: &C) -> Option<Held<C::Conn>> {
    let s = owner.slot().lock();
    s.live.as_ref().filter(|l| C::usable(&l.conn)).cloned()
}

/// Why `owner` has no connection, when it has none and an attempt has failed (`None`
/// otherwise): the failure of a call that timed out waiting for a connection.
pub(crate) fn unconnected<C: Connect>(owner: &C) -> Option<Failed> {
    let s = owner.slot().lock();
    if s.live.as_ref().is_some_and(|l| C::usable(&l.conn)) {
        return None;
    }
    s.failure.as_ref().map(NoConnection::failed)
}

/// A connection of `owner` to call on: the current one, or the one the attempt in progress (or
/// a new attempt) makes, waited for until `deadline`.
///
/// # Errors
/// The failure of the attempt waited for, when no further attempt follows it on its own; at
/// `deadline`, the last attempt's failure, else a timeout.
pub(crate) async fn get<C: Connect>(
    owner: &Arc<C>,
    deadline: Instant,
) -> Result<Held<C::Conn>, Failed> {
    if let Some(live) = current(&**owner) {
        return Ok(live);
    }
    let slot = owner.slot();
    let began = Instant::now();
    // The attempts that had ended when this call began waiting.
    let mut seen = None;
    loop {
        let changed = slot.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        {
            let mut s = slot.lock();
            match &s.live {
                Some(l) if C::usable(&l.conn) => return Ok(l.clone()),
                Some(_) => s.live = None,
                None => {}
            }
            match seen {
                Some(n) if s.attempts > n && !s.connecting => match &s.failure {
                    Some(f) => return Err(f.failed()),
                    // Made and already lost: try again.
                    None => seen = None,
                },
                _ => {}
            }
            if seen.is_none() {
                seen = Some(s.attempts);
                if !s.connecting {
                    s.connecting = true;
                    drop(s);
                    spawn(owner);
                }
            }
        }
        if tokio::time::timeout_at(deadline, changed).await.is_err() {
            return Err(unconnected(&**owner)
                .unwrap_or_else(|| Failed::timeout(deadline.saturating_duration_since(began))));
        }
    }
}

/// Whether the probe of a node that counts as down may go now: a connection is ready and
/// none is being made. With neither, starts making one: the probe waits for it (failing
/// fast meanwhile) rather than making it within its own timeout.
pub(crate) fn probe_ready<C: Connect>(owner: &Arc<C>) -> bool {
    let mut s = owner.slot().lock();
    if s.connecting {
        return false;
    }
    if s.live.as_ref().is_some_and(|l| C::usable(&l.conn)) {
        return true;
    }
    s.connecting = true;
    drop(s);
    spawn(owner);
    false
}

/// Starts an attempt unless one runs (a backend warming up as it is built).
pub(crate) fn warm<C: Connect>(owner: &Arc<C>) {
    let mut s = owner.slot().lock();
    if s.connecting || s.live.is_some() {
        return;
    }
    s.connecting = true;
    drop(s);
    spawn(owner);
}

/// Replaces the connection a call that began at generation `started` used (see
/// [`Slot::generation`]): unless the current connection is newer than the call, a new one is
/// made in the background; with `drop_current`, the current one is dropped at once (calls wait
/// for the new one), else it serves until the new one replaces it. Nothing is done while an
/// attempt runs.
pub(crate) fn replace<C: Connect>(owner: &Arc<C>, started: u64, drop_current: bool) {
    let mut s = owner.slot().lock();
    if s.live.as_ref().is_some_and(|l| l.id >= started) {
        return;
    }
    if drop_current {
        s.live = None;
    }
    if s.connecting {
        return;
    }
    s.connecting = true;
    drop(s);
    spawn(owner);
}

/// Runs the attempts in a task of their own (`connecting` is set), logging to the subscriber
/// of the code that asked for them.
fn spawn<C: Connect>(owner: &Arc<C>) {
    let weak = Arc::downgrade(owner);
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => {
            rt.spawn(attempts(weak).with_current_subscriber());
        }
        Err(_) => {
            // No runtime (a backend built outside one): the first call's `get` starts it.
            owner.slot().lock().connecting = false;
        }
    }
}

/// Attempts until one succeeds, or fails in a way that is not worth repeating at once, or
/// the owner is gone.
async fn attempts<C: Connect>(weak: Weak<C>) {
    let began = Instant::now();
    loop {
        let Some(owner) = weak.upgrade() else { return };
        let limit = owner.attempt_limit();
        let result = tokio::time::timeout(limit, owner.open())
            .await
            .unwrap_or(Err(NoConnection::Unanswered(limit)));
        let slot = owner.slot();
        let again = {
            let mut s = slot.lock();
            s.attempts += 1;
            match result {
                Ok(conn) => {
                    let id = slot.next_id.fetch_add(1, Ordering::AcqRel);
                    s.live = Some(Held { id, conn });
                    s.failure = None;
                    s.connecting = false;
                    false
                }
                Err(f) => {
                    // Refused outright with nothing to serve meanwhile: soon again.
                    let again = f.fault() == Fault::Unreachable && s.live.is_none();
                    s.failure = Some(f);
                    s.connecting = again;
                    again
                }
            }
        };
        slot.changed.notify_waiters();
        if !again {
            return;
        }
        drop(owner);
        tokio::time::sleep(soon_after(began.elapsed())).await;
    }
}
