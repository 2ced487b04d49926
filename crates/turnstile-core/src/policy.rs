//! Policies: which algorithm, how many units per period, what burst, under which name.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

/// The largest limit or burst a policy accepts: 2^32 − 1 units.
pub const MAX_LIMIT: u64 = u32::MAX as u64;

/// The longest period a policy accepts: 365 days, in milliseconds (31,536,000,000 ms).
pub const MAX_PERIOD_MS: u64 = 365 * 24 * 60 * 60 * 1000;

/// The largest value of max(limit, burst) × period (period in ms) a policy accepts: 2^53 − 1.
///
/// Every backend keeps its state in integers below this bound, so the Redis scripts (whose
/// numbers are IEEE doubles) stay exact and every backend accepts the same policies.
pub const MAX_EXACT: u64 = (1 << 53) - 1;

/// The largest cost or time (in ms) a request may carry: 2^53 − 1.
pub const MAX_REQUEST_VALUE: u64 = MAX_EXACT;

/// One of the six rate-limiting algorithms defined in the project's `SEMANTICS.md`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Algorithm {
    /// Token bucket: a bucket of `burst` tokens refilled at `limit` per `period`.
    TokenBucket,
    /// The generic cell rate algorithm (GCRA) of the ATM Forum's Traffic Management
    /// Specification (af-tm-0056.000, 1996): one theoretical arrival time (TAT) per key.
    /// Decides exactly as [`Algorithm::TokenBucket`] with the same parameters.
    Gcra,
    /// Leaky bucket as a queue (shaping): admits what the token bucket admits, but each
    /// admitted request is told how long to wait (`delay`) for the queue ahead of it to drain.
    LeakyBucket,
    /// Fixed window: at most `limit` units per window `[k·period, (k+1)·period)` counted from
    /// the Unix epoch.
    FixedWindow,
    /// Sliding log: at most `limit` units in any window of length `period` ending now. Keeps
    /// one log entry per distinct millisecond, so a key holds at most
    /// min(limit, period in ms) entries; prefer [`Algorithm::SlidingWindow`] for large limits.
    SlidingLog,
    /// Sliding window counter: the previous fixed window's count, weighted by how much of it
    /// still overlaps the sliding window, plus the current window's count.
    SlidingWindow,
}

impl Algorithm {
    /// Every algorithm, in the order `SEMANTICS.md` lists them.
    pub const ALL: [Algorithm; 6] = [
        Algorithm::TokenBucket,
        Algorithm::Gcra,
        Algorithm::LeakyBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
    ];

    /// The algorithm's name as written in policy strings and traces, e.g. `"token-bucket"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Algorithm::TokenBucket => "token-bucket",
            Algorithm::Gcra => "gcra",
            Algorithm::LeakyBucket => "leaky-bucket",
            Algorithm::FixedWindow => "fixed-window",
            Algorithm::SlidingLog => "sliding-log",
            Algorithm::SlidingWindow => "sliding-window",
        }
    }

    /// Whether the algorithm is a bucket (token bucket, GCRA, leaky bucket) and so takes a
    /// `burst`. Window algorithms have a capacity of exactly `limit`.
    #[inline]
    pub const fn is_bucket(self) -> bool {
        matches!(
            self,
            Algorithm::TokenBucket | Algorithm::Gcra | Algorithm::LeakyBucket
        )
    }

    /// The algorithm's stable id on the wire: 1 token bucket, 2 GCRA, 3 leaky bucket, 4 fixed
    /// window, 5 sliding log, 6 sliding window. The Redis scripts store it before every state
    /// and take it in their arguments (`ALG[id]` in `lua/prelude.lua`), and a policy's
    /// fingerprint hashes it; an id never changes meaning. The inverse is
    /// [`Algorithm::from_wire_id`].
    pub const fn wire_id(self) -> u8 {
        match self {
            Algorithm::TokenBucket => 1,
            Algorithm::Gcra => 2,
            Algorithm::LeakyBucket => 3,
            Algorithm::FixedWindow => 4,
            Algorithm::SlidingLog => 5,
            Algorithm::SlidingWindow => 6,
        }
    }

    /// The algorithm whose [`wire_id`](Algorithm::wire_id) is `id`, or `None` for an id no
    /// algorithm has.
    pub const fn from_wire_id(id: u64) -> Option<Algorithm> {
        Some(match id {
            1 => Algorithm::TokenBucket,
            2 => Algorithm::Gcra,
            3 => Algorithm::LeakyBucket,
            4 => Algorithm::FixedWindow,
            5 => Algorithm::SlidingLog,
            6 => Algorithm::SlidingWindow,
            _ => return None,
        })
    }

    /// How many integers one decision of this algorithm takes on the wire (a policy's result
    /// in the Redis check script's reply, `width` in `lua/prelude.lua`'s `ALG`): retry,
    /// remaining and reset (3); the leaky bucket adds its delay (4); the sliding window
    /// writes its retry exactly as whole, numerator and denominator (5).
    pub const fn wire_width(self) -> usize {
        match self {
            Algorithm::TokenBucket => 3,
            Algorithm::Gcra => 3,
            Algorithm::LeakyBucket => 4,
            Algorithm::FixedWindow => 3,
            Algorithm::SlidingLog => 3,
            Algorithm::SlidingWindow => 5,
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Algorithm {
    type Err = InvalidPolicy;

    /// Parses one of `token-bucket`, `gcra`, `leaky-bucket`, `fixed-window`, `sliding-log`,
    /// `sliding-window`.
    ///
    /// # Errors
    /// [`InvalidPolicy::UnknownAlgorithm`] for anything else.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.as_str() == s)
            .ok_or_else(|| InvalidPolicy::UnknownAlgorithm(s.to_owned()))
    }
}

/// Why a policy, a policy string or a duration was refused.
///
/// Every bound comes from `SEMANTICS.md`; nothing out of range is ever clamped.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum InvalidPolicy {
    /// The limit was 0 or above [`MAX_LIMIT`].
    Limit(u64),
    /// The period was 0 ms or above [`MAX_PERIOD_MS`] (the value is in ms, rounded down).
    Period(u128),
    /// The period was not a whole number of milliseconds (the value is its nanoseconds).
    PeriodNotWholeMs(u128),
    /// The burst was 0 or above [`MAX_LIMIT`].
    Burst(u64),
    /// A burst was given to a window algorithm, which has no burst.
    BurstNotAllowed(Algorithm),
    /// max(limit, burst) × period exceeds [`MAX_EXACT`] (2^53 − 1).
    TooLarge {
        /// max(limit, burst).
        capacity: u64,
        /// The period in ms.
        period_ms: u64,
    },
    /// The name was empty, longer than 200 bytes, or held a character other than printable
    /// ASCII (0x20–0x7E) or one of `"` and `\`.
    Name(String),
    /// The algorithm name was none of the six.
    UnknownAlgorithm(String),
    /// A duration string was not `<integer><unit>` with unit `ms`, `s`, `m`, `h` or `d`.
    Duration(String),
    /// A policy string did not follow `ALGORITHM:limit=L,period=DUR[,burst=B][,name=NAME]`.
    Syntax {
        /// The policy string.
        input: String,
        /// What was wrong with it.
        reason: String,
    },
}

impl fmt::Display for InvalidPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InvalidPolicy::Limit(l) => write!(f, "limit {l} is out of range (1 to {MAX_LIMIT})"),
            InvalidPolicy::Period(p) => write!(
                f,
                "period {p} ms is out of range (1 ms to {MAX_PERIOD_MS} ms, 365 days)"
            ),
            InvalidPolicy::PeriodNotWholeMs(ns) => {
                write!(f, "period {ns} ns is not a whole number of milliseconds")
            }
            InvalidPolicy::Burst(b) => write!(f, "burst {b} is out of range (1 to {MAX_LIMIT})"),
            InvalidPolicy::BurstNotAllowed(a) => {
                write!(f, "{a} is a window algorithm and takes no burst")
            }
            InvalidPolicy::TooLarge {
                capacity,
                period_ms,
            } => write!(
                f,
                "max(limit, burst) × period = {capacity} × {period_ms} ms exceeds 2^53 − 1"
            ),
            InvalidPolicy::Name(n) => write!(
                f,
                "policy name {n:?} is not 1 to 200 printable ASCII characters without '\"' or '\\'"
            ),
            InvalidPolicy::UnknownAlgorithm(a) => write!(
                f,
                "unknown algorithm {a:?} (expected token-bucket, gcra, leaky-bucket, fixed-window, sliding-log or sliding-window)"
            ),
            InvalidPolicy::Duration(d) => write!(
                f,
                "invalid duration {d:?}: expected <integer><unit> with unit ms, s, m, h or d, e.g. 250ms, 1s, 90s, 1h"
            ),
            InvalidPolicy::Syntax { input, reason } => write!(
                f,
                "invalid policy {input:?}: {reason} (expected ALGORITHM:limit=L,period=DUR[,burst=B][,name=NAME])"
            ),
        }
    }
}

impl std::error::Error for InvalidPolicy {}

/// A validated rate-limiting policy: an [`Algorithm`], a limit L per period P, a burst B
/// (bucket algorithms only) and a name.
///
/// Two checks share state exactly when their client key and policy name match. Cloning is
/// cheap (the name is reference-counted).
///
/// With burst B and L per P, a fresh key can take B at once and then L per P: up to B + L in
/// the first period. That is the definition of a bucket, not a bug. For example,
/// `token-bucket:limit=10,period=1m,burst=20` admits 20 requests at once, then one every 6 s.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use turnstile_core::{Algorithm, Policy};
///
/// # fn main() -> Result<(), turnstile_core::InvalidPolicy> {
/// let p = Policy::token_bucket(10, Duration::from_secs(60))?.with_burst(20)?;
/// assert_eq!(p.capacity(), 20);
/// assert_eq!(p.name(), "token-bucket:limit=10,period=1m,burst=20");
///
/// let q: Policy = "sliding-window:limit=100,period=1h,name=hourly".parse()?;
/// assert_eq!(q.algorithm(), Algorithm::SlidingWindow);
/// assert_eq!(q.period(), Duration::from_secs(3600));
/// assert_eq!(q.name(), "hourly");
///
/// assert!(Policy::fixed_window(0, Duration::from_secs(1)).is_err());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Policy {
    algorithm: Algorithm,
    limit: u64,
    period_ms: u64,
    burst: Option<u64>,
    /// The parameters in two words, compared at once: period ms << 8 | algorithm id, and
    /// limit << 32 | capacity (each below 2^32; the period below 2^35).
    params: [u64; 2],
    name: Arc<str>,
    named: bool,
}

/// Policies are equal when their names and parameters are (a burst given explicitly equal
/// to the limit is the same policy as the default burst).
impl PartialEq for Policy {
    #[inline]
    fn eq(&self, other: &Self) -> bool {
        // Copies of one policy share their name: no need to compare its bytes.
        (Arc::ptr_eq(&self.name, &other.name) || self.name == other.name)
            && self.same_parameters(other)
    }
}

impl Eq for Policy {}

impl std::hash::Hash for Policy {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name.hash(state);
        self.fingerprint().hash(state);
    }
}

impl fmt::Debug for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Policy")
            .field("name", &self.name)
            .field("algorithm", &self.algorithm)
            .field("limit", &self.limit)
            .field("period_ms", &self.period_ms)
            .field("burst", &self.burst)
            .finish()
    }
}

impl Policy {
    /// A policy admitting `limit` units per `period` with the given algorithm; bucket
    /// algorithms get a burst equal to `limit`.
    ///
    /// # Errors
    /// [`InvalidPolicy::Limit`] unless 1 ≤ limit ≤ 2^32 − 1; [`InvalidPolicy::Period`] unless
    /// 1 ms ≤ period ≤ 365 days; [`InvalidPolicy::PeriodNotWholeMs`] when the period has a
    /// fraction of a millisecond; [`InvalidPolicy::TooLarge`] when limit × period (in ms)
    /// exceeds 2^53 − 1.
    pub fn new(algorithm: Algorithm, limit: u64, period: Duration) -> Result<Self, InvalidPolicy> {
        let period_ms = period_to_ms(period)?;
        Self::from_parts(algorithm, limit, period_ms, None)
    }

    /// A policy from its raw parts: limit in units, period in ms, burst in units (`None`:
    /// the default, equal to the limit, for bucket algorithms; must be `None` for windows).
    ///
    /// # Errors
    /// As [`Policy::new`] and [`Policy::with_burst`].
    pub fn from_parts(
        algorithm: Algorithm,
        limit: u64,
        period_ms: u64,
        burst: Option<u64>,
    ) -> Result<Self, InvalidPolicy> {
        if limit == 0 || limit > MAX_LIMIT {
            return Err(InvalidPolicy::Limit(limit));
        }
        if period_ms == 0 || period_ms > MAX_PERIOD_MS {
            return Err(InvalidPolicy::Period(period_ms.into()));
        }
        if let Some(b) = burst {
            if !algorithm.is_bucket() {
                return Err(InvalidPolicy::BurstNotAllowed(algorithm));
            }
            if b == 0 || b > MAX_LIMIT {
                return Err(InvalidPolicy::Burst(b));
            }
        }
        let capacity = limit.max(burst.unwrap_or(limit));
        if u128::from(capacity) * u128::from(period_ms) > u128::from(MAX_EXACT) {
            return Err(InvalidPolicy::TooLarge {
                capacity,
                period_ms,
            });
        }
        let bucket_capacity = if algorithm.is_bucket() {
            burst.unwrap_or(limit)
        } else {
            limit
        };
        let mut p = Policy {
            algorithm,
            limit,
            period_ms,
            burst,
            params: [
                period_ms << 8 | u64::from(algorithm.wire_id()),
                limit << 32 | bucket_capacity,
            ],
            name: Arc::from(""),
            named: false,
        };
        p.name = Arc::from(p.spec_without_name());
        Ok(p)
    }

    /// A [`Algorithm::TokenBucket`] policy; see [`Policy::new`].
    ///
    /// # Errors
    /// As [`Policy::new`].
    pub fn token_bucket(limit: u64, period: Duration) -> Result<Self, InvalidPolicy> {
        Self::new(Algorithm::TokenBucket, limit, period)
    }

    /// A [`Algorithm::Gcra`] policy; see [`Policy::new`].
    ///
    /// # Errors
    /// As [`Policy::new`].
    pub fn gcra(limit: u64, period: Duration) -> Result<Self, InvalidPolicy> {
        Self::new(Algorithm::Gcra, limit, period)
    }

    /// A [`Algorithm::LeakyBucket`] policy; see [`Policy::new`].
    ///
    /// # Errors
    /// As [`Policy::new`].
    pub fn leaky_bucket(limit: u64, period: Duration) -> Result<Self, InvalidPolicy> {
        Self::new(Algorithm::LeakyBucket, limit, period)
    }

    /// A [`Algorithm::FixedWindow`] policy; see [`Policy::new`].
    ///
    /// # Errors
    /// As [`Policy::new`].
    pub fn fixed_window(limit: u64, period: Duration) -> Result<Self, InvalidPolicy> {
        Self::new(Algorithm::FixedWindow, limit, period)
    }

    /// A [`Algorithm::SlidingLog`] policy; see [`Policy::new`].
    ///
    /// # Errors
    /// As [`Policy::new`].
    pub fn sliding_log(limit: u64, period: Duration) -> Result<Self, InvalidPolicy> {
        Self::new(Algorithm::SlidingLog, limit, period)
    }

    /// A [`Algorithm::SlidingWindow`] policy; see [`Policy::new`].
    ///
    /// # Errors
    /// As [`Policy::new`].
    pub fn sliding_window(limit: u64, period: Duration) -> Result<Self, InvalidPolicy> {
        Self::new(Algorithm::SlidingWindow, limit, period)
    }

    /// The same policy with bucket capacity `burst` (in units). A fresh key can take `burst`
    /// units at once.
    ///
    /// # Errors
    /// [`InvalidPolicy::BurstNotAllowed`] for window algorithms; [`InvalidPolicy::Burst`]
    /// unless 1 ≤ burst ≤ 2^32 − 1; [`InvalidPolicy::TooLarge`] when burst × period exceeds
    /// 2^53 − 1.
    pub fn with_burst(self, burst: u64) -> Result<Self, InvalidPolicy> {
        let p = Self::from_parts(self.algorithm, self.limit, self.period_ms, Some(burst))?;
        Ok(if self.named {
            Policy {
                name: self.name,
                named: true,
                ..p
            }
        } else {
            p
        })
    }

    /// The same policy under another name. Two checks share state exactly when their client
    /// key and policy name match, so give two routes the same name only to share a counter.
    ///
    /// # Errors
    /// [`InvalidPolicy::Name`] unless the name is 1 to 200 printable ASCII characters
    /// (0x20–0x7E) other than `"` and `\` (it travels in HTTP structured-field strings and
    /// Redis keys).
    pub fn with_name(self, name: impl AsRef<str>) -> Result<Self, InvalidPolicy> {
        let name = name.as_ref();
        if !valid_name(name) {
            return Err(InvalidPolicy::Name(name.to_owned()));
        }
        Ok(Policy {
            name: Arc::from(name),
            named: true,
            ..self
        })
    }

    /// The algorithm.
    #[inline]
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// L: units admitted per period.
    #[inline]
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// P: the period.
    pub fn period(&self) -> Duration {
        Duration::from_millis(self.period_ms)
    }

    /// P in milliseconds.
    #[inline]
    pub fn period_ms(&self) -> u64 {
        self.period_ms
    }

    /// B: the bucket capacity in units, for bucket algorithms (defaults to the limit);
    /// `None` for window algorithms.
    #[inline]
    pub fn burst(&self) -> Option<u64> {
        if self.algorithm.is_bucket() {
            Some(self.burst.unwrap_or(self.limit))
        } else {
            None
        }
    }

    /// The most units one request can ever be admitted for: the burst B for buckets, the
    /// limit L for windows. A request costing more is denied with no retry ("never").
    #[inline]
    pub fn capacity(&self) -> u64 {
        self.params[1] & u64::from(u32::MAX)
    }

    /// The policy's name: the one given with [`Policy::with_name`] or `name=`, else the
    /// policy string of its algorithm and parameters (e.g. `fixed-window:limit=5,period=1m`).
    #[inline]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The name as a shared string (cheap to clone).
    pub fn name_arc(&self) -> &Arc<str> {
        &self.name
    }

    /// Whether the name was given explicitly rather than derived from the parameters.
    pub fn has_explicit_name(&self) -> bool {
        self.named
    }

    /// The address of the policy's name and its parameters: equal for copies of one policy
    /// (the name is shared), so a cache can tell them at once; unequal identities say
    /// nothing (compare with `==`).
    #[inline]
    pub(crate) fn identity(&self) -> (usize, [u64; 2]) {
        (Arc::as_ptr(&self.name).cast::<u8>() as usize, self.params)
    }

    /// Whether `other` has the same algorithm, limit, period and capacity (names aside).
    #[inline]
    pub fn same_parameters(&self, other: &Policy) -> bool {
        // Algorithm, limit, period and capacity.
        self.params == other.params
    }

    /// A stable 64-bit fingerprint of the algorithm and parameters (not the name): the same
    /// on every build and platform (FNV-1a). Stored state records it, so a changed policy is
    /// recognised.
    pub fn fingerprint(&self) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |bytes: &[u8]| {
            for b in bytes {
                h ^= u64::from(*b);
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
        };
        eat(&[self.algorithm.wire_id()]);
        eat(&self.limit.to_le_bytes());
        eat(&self.period_ms.to_le_bytes());
        eat(&self.capacity().to_le_bytes());
        h
    }

    /// The policy string without the name: `ALGORITHM:limit=L,period=DUR[,burst=B]`, with the
    /// burst shown only when it differs from the limit.
    pub fn spec_without_name(&self) -> String {
        let mut s = format!(
            "{}:limit={},period={}",
            self.algorithm,
            self.limit,
            format_duration_ms(self.period_ms)
        );
        if let Some(b) = self.burst.filter(|b| *b != self.limit) {
            s.push_str(&format!(",burst={b}"));
        }
        s
    }
}

impl fmt::Display for Policy {
    /// The policy string, parseable back into an equal policy.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.spec_without_name())?;
        if self.named {
            write!(f, ",name={}", self.name)?;
        }
        Ok(())
    }
}

impl FromStr for Policy {
    type Err = InvalidPolicy;

    /// Parses `ALGORITHM:limit=L,period=DUR[,burst=B][,name=NAME]` (the grammar of
    /// `SEMANTICS.md`), e.g. `token-bucket:limit=10,period=1s,burst=20,name=per-second`.
    /// Parameters may come in any order; each at most once.
    ///
    /// # Errors
    /// [`InvalidPolicy::Syntax`] for a malformed string, an unknown, repeated or missing
    /// parameter, or a number that is not a plain non-negative integer; otherwise whatever
    /// [`Policy::from_parts`] and [`Policy::with_name`] return.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let syntax = |reason: &str| InvalidPolicy::Syntax {
            input: s.to_owned(),
            reason: reason.to_owned(),
        };
        let (alg, params) = s
            .split_once(':')
            .ok_or_else(|| syntax("missing ':' after the algorithm"))?;
        let algorithm: Algorithm = alg.parse()?;
        let (mut limit, mut period, mut burst, mut name) = (None, None, None, None);
        for part in params.split(',') {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| syntax(&format!("parameter {part:?} is not KEY=VALUE")))?;
            let slot = match k {
                "limit" => &mut limit,
                "period" => &mut period,
                "burst" => &mut burst,
                "name" => &mut name,
                _ => return Err(syntax(&format!("unknown parameter {k:?}"))),
            };
            if slot.replace(v).is_some() {
                return Err(syntax(&format!("parameter {k:?} given twice")));
            }
        }
        let int = |k: &str, v: &str| -> Result<u64, InvalidPolicy> {
            parse_plain_u64(v).ok_or_else(|| syntax(&format!("{k}={v:?} is not an integer")))
        };
        let limit = int("limit", limit.ok_or_else(|| syntax("missing limit"))?)?;
        let period = parse_duration(period.ok_or_else(|| syntax("missing period"))?)?;
        let burst = burst.map(|b| int("burst", b)).transpose()?;
        let mut p = Policy::from_parts(algorithm, limit, period_to_ms(period)?, burst)?;
        if let Some(n) = name {
            p = p.with_name(n)?;
        }
        Ok(p)
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 200
        && name
            .bytes()
            .all(|b| (0x20..=0x7e).contains(&b) && b != b'"' && b != b'\\')
}

fn period_to_ms(period: Duration) -> Result<u64, InvalidPolicy> {
    let ns = period.as_nanos();
    if ns % 1_000_000 != 0 {
        return Err(InvalidPolicy::PeriodNotWholeMs(ns));
    }
    let ms = ns / 1_000_000;
    match u64::try_from(ms) {
        Ok(ms) if (1..=MAX_PERIOD_MS).contains(&ms) => Ok(ms),
        _ => Err(InvalidPolicy::Period(ms)),
    }
}

/// Parses digits only (no sign, no spaces, no leading `+`), refusing overflow.
fn parse_plain_u64(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Parses a duration of `SEMANTICS.md`: `<integer><unit>` with unit `ms`, `s`, `m` (minutes),
/// `h` or `d`, such as `250ms`, `1s`, `90s`, `1h`. Nothing else (`1.5s`, `1m30s`, a bare
/// `1500`, a sign or a space) is accepted.
///
/// The result is not checked against the period bounds; [`Policy::new`] does that.
///
/// # Errors
/// [`InvalidPolicy::Duration`] for any other input, or one whose value overflows.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// assert_eq!(turnstile_core::policy::parse_duration("90s"), Ok(Duration::from_secs(90)));
/// assert!(turnstile_core::policy::parse_duration("1.5s").is_err());
/// ```
pub fn parse_duration(s: &str) -> Result<Duration, InvalidPolicy> {
    let err = || InvalidPolicy::Duration(s.to_owned());
    let split = s.find(|c: char| !c.is_ascii_digit()).ok_or_else(err)?;
    let (digits, unit) = s.split_at(split);
    let n = parse_plain_u64(digits).ok_or_else(err)?;
    let ms_per = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(err()),
    };
    n.checked_mul(ms_per)
        .map(Duration::from_millis)
        .ok_or_else(err)
}

/// Formats a whole number of milliseconds in the largest unit of [`parse_duration`] that
/// divides it exactly: 86,400,000 → `1d`, 90,000 → `90s`, 250 → `250ms`, 0 → `0ms`.
pub fn format_duration_ms(ms: u64) -> String {
    for (unit, per) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if ms != 0 && ms % per == 0 {
            return format!("{}{unit}", ms / per);
        }
    }
    format!("{ms}ms")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_ids_are_the_scripts_and_round_trip() {
        // The ids and widths the Redis scripts use (lua/prelude.lua's ALG), fixed forever.
        let expected = [
            (Algorithm::TokenBucket, 1, 3),
            (Algorithm::Gcra, 2, 3),
            (Algorithm::LeakyBucket, 3, 4),
            (Algorithm::FixedWindow, 4, 3),
            (Algorithm::SlidingLog, 5, 3),
            (Algorithm::SlidingWindow, 6, 5),
        ];
        assert_eq!(expected.len(), Algorithm::ALL.len());
        for (a, id, width) in expected {
            assert_eq!(a.wire_id(), id, "{a}");
            assert_eq!(a.wire_width(), width, "{a}");
            assert_eq!(Algorithm::from_wire_id(u64::from(id)), Some(a), "{a}");
        }
        for id in [0, 7, 255, 256 + 1, u64::MAX] {
            assert_eq!(Algorithm::from_wire_id(id), None, "{id}");
        }
    }

    #[test]
    fn packed_parameters_are_the_parameters() {
        for alg in Algorithm::ALL {
            for (limit, period, burst) in [
                (1, 1, None),
                (MAX_LIMIT, 2_097_151, None),
                (7, 1_000, Some(3)),
            ] {
                let burst = burst.filter(|_| alg.is_bucket());
                let Ok(p) = Policy::from_parts(alg, limit, period, burst) else {
                    continue;
                };
                assert_eq!(p.capacity(), p.burst().unwrap_or(p.limit()), "{p}");
                let q = Policy::from_parts(alg, limit, period, None).unwrap();
                assert_eq!(
                    p.same_parameters(&q),
                    p.capacity() == q.capacity(),
                    "{p} {q}"
                );
                for other in Algorithm::ALL {
                    if let Ok(r) = Policy::from_parts(other, limit, period, None) {
                        assert_eq!(q.same_parameters(&r), alg == other);
                    }
                }
            }
        }
        let long = Policy::from_parts(Algorithm::FixedWindow, 1, MAX_PERIOD_MS, None).unwrap();
        let other = Policy::from_parts(Algorithm::FixedWindow, 1, MAX_PERIOD_MS - 1, None).unwrap();
        assert!(!long.same_parameters(&other));
        assert_eq!(long.period_ms(), MAX_PERIOD_MS);
    }

    #[test]
    fn bounds_are_typed_errors() {
        let s = Duration::from_secs(1);
        assert_eq!(
            Policy::token_bucket(0, s).unwrap_err(),
            InvalidPolicy::Limit(0)
        );
        assert_eq!(
            Policy::token_bucket(1 << 32, s).unwrap_err(),
            InvalidPolicy::Limit(1 << 32)
        );
        assert!(Policy::token_bucket(u32::MAX.into(), Duration::from_millis(1)).is_ok());
        assert_eq!(
            Policy::token_bucket(1, Duration::ZERO).unwrap_err(),
            InvalidPolicy::Period(0)
        );
        assert_eq!(
            Policy::token_bucket(1, Duration::from_micros(1500)).unwrap_err(),
            InvalidPolicy::PeriodNotWholeMs(1_500_000)
        );
        assert!(Policy::token_bucket(1, Duration::from_millis(MAX_PERIOD_MS)).is_ok());
        assert!(matches!(
            Policy::token_bucket(1, Duration::from_millis(MAX_PERIOD_MS + 1)),
            Err(InvalidPolicy::Period(_))
        ));
        assert!(matches!(
            Policy::token_bucket(1, Duration::MAX),
            Err(InvalidPolicy::PeriodNotWholeMs(_) | InvalidPolicy::Period(_))
        ));
        assert_eq!(
            Policy::token_bucket(1, s)
                .unwrap()
                .with_burst(0)
                .unwrap_err(),
            InvalidPolicy::Burst(0)
        );
        assert_eq!(
            Policy::fixed_window(1, s)
                .unwrap()
                .with_burst(1)
                .unwrap_err(),
            InvalidPolicy::BurstNotAllowed(Algorithm::FixedWindow)
        );
        assert!(matches!(
            Policy::token_bucket(u32::MAX.into(), Duration::from_millis(MAX_PERIOD_MS)),
            Err(InvalidPolicy::TooLarge { .. })
        ));
        assert!(matches!(
            Policy::token_bucket(1, Duration::from_millis(MAX_PERIOD_MS))
                .unwrap()
                .with_burst(u32::MAX.into()),
            Err(InvalidPolicy::TooLarge { .. })
        ));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("1d"), Ok(Duration::from_secs(86400)));
        for bad in [
            "",
            "1",
            "1500",
            "1.5s",
            "1m30s",
            "s",
            "-1s",
            "+1s",
            " 1s",
            "1s ",
            "1S",
            "1sec",
            "99999999999999999999ms",
            "18446744073709551615d",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(format_duration_ms(60_000), "1m");
        assert_eq!(format_duration_ms(90_000), "90s");
        assert_eq!(format_duration_ms(1_001), "1001ms");
    }

    #[test]
    fn policy_strings_round_trip() {
        let p: Policy = "token-bucket:limit=10,period=1s,burst=20,name=per-second"
            .parse()
            .unwrap();
        assert_eq!(p.algorithm(), Algorithm::TokenBucket);
        assert_eq!((p.limit(), p.period_ms(), p.burst()), (10, 1000, Some(20)));
        assert_eq!(p.name(), "per-second");
        assert_eq!(p.to_string().parse::<Policy>().unwrap(), p);

        let q: Policy = "fixed-window:period=250ms,limit=3".parse().unwrap();
        assert_eq!(q.name(), "fixed-window:limit=3,period=250ms");
        assert_eq!(q.burst(), None);
        assert_eq!(q.capacity(), 3);

        for bad in [
            "token-bucket",
            "token-bucket:",
            "token-bucket:limit=10",
            "token-bucket:period=1s",
            "token-bucket:limit=10,period=1s,limit=3",
            "token-bucket:limit=10,period=1s,foo=1",
            "token-bucket:limit=-1,period=1s",
            "token-bucket:limit=+1,period=1s",
            "token-bucket:limit=1.0,period=1s",
            "token-bucket:limit=10,period=1500",
            "bucket:limit=10,period=1s",
            "fixed-window:limit=10,period=1s,burst=3",
            "token-bucket:limit=10,period=1s,name=",
            "token-bucket:limit=10,period=1s,name=a\"b",
        ] {
            assert!(bad.parse::<Policy>().is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn fingerprint_depends_on_parameters_only() {
        let a = Policy::gcra(10, Duration::from_secs(1)).unwrap();
        let b = a.clone().with_name("x").unwrap();
        assert_eq!(a.fingerprint(), b.fingerprint());
        assert_ne!(
            a.fingerprint(),
            a.clone().with_burst(11).unwrap().fingerprint()
        );
        // Stable across builds: pinned value.
        assert_eq!(a.fingerprint(), a.clone().fingerprint());
    }
}
