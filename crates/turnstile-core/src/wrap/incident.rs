//! [`IncidentLog`]: when a backend incident starts and ends, and when a key's bad state is
//! worth a line, so each is logged once.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

/// How often one key's unreadable state is logged at most: once a minute (60,000 ms).
pub const BAD_KEY_LOG_INTERVAL_MS: u64 = 60_000;

/// How many keys with unreadable state are remembered at once; beyond it, the lines of new
/// keys are dropped until remembered ones are a minute old.
pub const MAX_BAD_KEYS_LOGGED: usize = 1024;

/// When a check was sent, as far as incidents go: a check sent before an incident started
/// (a reply in flight) neither ends it nor, failing late, starts a new one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket(u64);

/// Tells the one check that starts a backend incident, the one that ends it, and the keys
/// whose bad state should be logged now, so that one incident gives one warning and one
/// recovery, and a bad key at most one line a minute.
///
/// - An incident starts with the first failure of a check sent while the backend was
///   healthy ([`IncidentLog::failed`]); failures of checks sent before the last recovery
///   (replies in flight) start nothing.
/// - It ends with the first answer **of the backend** to a check sent during the incident
///   ([`IncidentLog::answered`]): an answer in flight from before it, a deny cache's or a
///   fallback's answer ([`Origin`](crate::Origin)) is no evidence the backend is back.
/// - One key's unreadable state (`BackendError::InvalidState`) is the key's fault, not the
///   backend's: it never starts or ends an incident, and [`IncidentLog::bad_key`] says to
///   log it at most once per key per [`BAD_KEY_LOG_INTERVAL_MS`], over at most
///   [`MAX_BAD_KEYS_LOGGED`] keys at once.
///
/// Each wrapper keeps one, and so does whatever answers for the backend's failures to its
/// own callers; the owner writes the lines.
///
/// # Examples
/// ```
/// use turnstile_core::wrap::IncidentLog;
///
/// let log = IncidentLog::new();
/// let before = log.ticket();
/// let during = {
///     assert!(log.failed(log.ticket())); // the incident starts: warn
///     log.ticket()
/// };
/// assert!(!log.failed(during)); // the same incident: no line
/// assert!(!log.answered(before)); // a reply in flight from before it: no line
/// assert!(log.answered(during)); // the backend answers a check sent during it: recovered
/// assert!(!log.is_open());
/// ```
pub struct IncidentLog {
    /// Even: healthy; odd: an incident is open. Each start and end adds one.
    state: AtomicU64,
    /// Keys with unreadable state and when each was last logged (ms).
    bad_keys: Mutex<HashMap<Box<str>, u64>>,
}

impl fmt::Debug for IncidentLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IncidentLog")
            .field("open", &self.is_open())
            .finish_non_exhaustive()
    }
}

impl Default for IncidentLog {
    fn default() -> Self {
        Self::new()
    }
}

impl IncidentLog {
    /// No incident, no bad key.
    pub fn new() -> Self {
        IncidentLog {
            state: AtomicU64::new(0),
            bad_keys: Mutex::default(),
        }
    }

    /// The ticket of a check sent now: pass it to [`IncidentLog::failed`] or
    /// [`IncidentLog::answered`] when it ends.
    pub fn ticket(&self) -> Ticket {
        Ticket(self.state.load(Ordering::Acquire))
    }

    /// Whether an incident is open.
    pub fn is_open(&self) -> bool {
        self.state.load(Ordering::Acquire) % 2 == 1
    }

    /// Notes that the backend failed a check sent with `sent`: `true` exactly once per
    /// incident, for the failure that starts it (log the warning then).
    pub fn failed(&self, sent: Ticket) -> bool {
        // Only a check sent while healthy, since the last recovery, is evidence of a new
        // incident.
        sent.0 % 2 == 0
            && self
                .state
                .compare_exchange(sent.0, sent.0 + 1, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
    }

    /// Notes that the backend itself answered a check sent with `sent`: `true` exactly once
    /// per incident, for the answer that ends it (log the recovery then).
    #[inline]
    pub fn answered(&self, sent: Ticket) -> bool {
        sent.0 % 2 == 1
            && self
                .state
                .compare_exchange(sent.0, sent.0 + 1, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
    }

    /// Whether to log now, at `now_ms`, that `key`'s stored state is unreadable: `true` the
    /// first time, then again only once [`BAD_KEY_LOG_INTERVAL_MS`] have passed since it was
    /// last logged. At most [`MAX_BAD_KEYS_LOGGED`] keys are remembered; while that many
    /// were logged within the interval, a new key is not logged.
    pub fn bad_key(&self, key: &str, now_ms: u64) -> bool {
        let mut keys = self.bad_keys.lock().unwrap_or_else(PoisonError::into_inner);
        let due = |last: u64| now_ms.saturating_sub(last) >= BAD_KEY_LOG_INTERVAL_MS;
        if let Some(last) = keys.get_mut(key) {
            if !due(*last) {
                return false;
            }
            *last = now_ms;
            return true;
        }
        if keys.len() >= MAX_BAD_KEYS_LOGGED {
            keys.retain(|_, last| !due(*last));
            if keys.len() >= MAX_BAD_KEYS_LOGGED {
                return false;
            }
        }
        keys.insert(Box::from(key), now_ms);
        true
    }
}

/// The stable hash a client key is logged under, so logs hold no key itself: FNV-1a (64 bits)
/// of its bytes, the same on every build, platform and node, shown as 16 hex digits. The
/// wrappers' warnings show keys so, and so does the `tower-turnstile` crate's default
/// `KeyLogging::Hashed`.
///
/// # Examples
/// ```
/// use turnstile_core::wrap::key_hash;
/// assert_eq!(format!("{:016x}", key_hash("a")), "af63dc4c8601ec8c");
/// ```
pub fn key_hash(key: &str) -> u64 {
    key.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_start_and_one_end_per_incident_whatever_arrives_late() {
        let log = IncidentLog::new();
        let healthy = log.ticket();
        assert!(log.failed(healthy));
        assert!(
            !log.failed(healthy),
            "a second failure of the same incident"
        );
        let during = log.ticket();
        assert!(!log.answered(healthy), "a reply in flight from before");
        assert!(!log.failed(during));
        assert!(log.is_open());
        assert!(log.answered(during));
        assert!(!log.answered(during), "the incident already ended");
        // A failure in flight from the incident, arriving after the recovery: nothing.
        assert!(!log.failed(during));
        assert!(!log.is_open());
        // A new failure of a check sent since: a new incident.
        assert!(log.failed(log.ticket()));
    }

    #[test]
    fn a_bad_key_is_logged_once_a_minute_over_a_bounded_set() {
        let log = IncidentLog::new();
        assert!(log.bad_key("a", 0));
        assert!(!log.bad_key("a", 59_999));
        assert!(log.bad_key("b", 59_999));
        assert!(log.bad_key("a", 60_000));
        assert!(!log.bad_key("a", 60_001));
        // The bad keys never touch the incident.
        assert!(!log.is_open());
        // A full set logs no new key until its entries are a minute old.
        let log = IncidentLog::new();
        for i in 0..MAX_BAD_KEYS_LOGGED {
            assert!(log.bad_key(&format!("k{i}"), 1_000));
        }
        assert!(!log.bad_key("late", 1_000));
        assert!(!log.bad_key("late", 60_999));
        assert!(log.bad_key("late", 61_000));
        // The entries a minute old were forgotten to make room: k0 is logged anew.
        assert!(log.bad_key("k0", 61_000));
    }

    #[test]
    fn the_key_hash_is_fnv1a() {
        assert_eq!(format!("{:016x}", key_hash("")), "cbf29ce484222325");
        assert_eq!(format!("{:016x}", key_hash("a")), "af63dc4c8601ec8c");
    }
}
