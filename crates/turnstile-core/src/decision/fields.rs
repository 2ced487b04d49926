//! How a policy's decision is kept: its fields packed in 48 bytes, either as exact durations
//! ([`Span`]s) or, for a bucket, as the debts the buckets' one decision answers (see
//! `debt::Debts`), worked out only when read. And the exact ratios durations
//! are made of.

use std::time::Duration;

use crate::debt::{self, Debts, Retry};
use crate::policy::Policy;

/// An exact duration rounded up to whole ns, as whole ms and the ns beyond them (below
/// 10⁶): how decisions store durations, three of them in 36 bytes of a [`PolicyDecision`]
/// (a [`Duration`] takes 16 with its padding).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Span {
    pub(crate) ms: u64,
    pub(crate) ns: u32,
}

impl Span {
    pub(crate) const ZERO: Span = Span { ms: 0, ns: 0 };

    /// `ns` nanoseconds.
    pub(crate) fn from_ns(ns: u64) -> Span {
        Span {
            ms: ns / 1_000_000,
            ns: (ns % 1_000_000) as u32,
        }
    }

    /// `d`, saturating at `u64::MAX` ms (585 million years).
    pub(crate) fn from_duration(d: Duration) -> Span {
        Span {
            ms: d
                .as_secs()
                .saturating_mul(1_000)
                .saturating_add(u64::from(d.subsec_millis())),
            ns: d.subsec_nanos() % 1_000_000,
        }
    }

    pub(crate) fn duration(self) -> Duration {
        Duration::new(
            self.ms / 1_000,
            (self.ms % 1_000) as u32 * 1_000_000 + self.ns % 1_000_000,
        )
    }

    /// The span in whole ms, rounded up.
    pub(crate) fn ceil_ms(self) -> u64 {
        self.ms.saturating_add(u64::from(self.ns != 0))
    }
}

/// How [`Fields`] keep a decision's values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    Spans,
    Bucket,
}

/// `nanos[1]`: no wait can help.
const NEVER: u32 = u32::MAX;
/// `nanos[1]` of a bucket: `retry_after` is zero.
const ZERO: u32 = 0;
/// `nanos[1]` of a bucket: `retry_after` is `words[1]` / L.
const AFTER: u32 = 1;

/// One policy's decision without its policy, in 48 bytes (a `PolicyDecision` takes 64 with
/// its shared policy). The durations of [`Layout::Spans`] are exact values rounded up to
/// whole ns; a [`Layout::Bucket`] keeps debts in units of 1/L ms and reads them through the
/// buckets' arithmetic (`remaining` = B − ⌈debt / P⌉, each duration its debt / L), so a
/// caller that only asks whether the request is admitted pays no division.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fields {
    /// [`Layout::Spans`]: `remaining`, then the ms of `reset_after`, `retry_after` and
    /// `delay`. [`Layout::Bucket`]: the debt after the decision, the debt `retry_after`
    /// waits out and the leaky bucket's queue (`delay`).
    words: [u64; 4],
    /// [`Layout::Spans`]: the ns beyond those ms, `retry_after`'s [`NEVER`] when no wait can
    /// help. [`Layout::Bucket`]: `retry_after`'s [`NEVER`], [`ZERO`] or [`AFTER`] in the
    /// middle.
    nanos: [u32; 3],
    layout: Layout,
    /// Whether the policy admits.
    pub(crate) allowed: bool,
}

impl Fields {
    /// A decision's values as exact durations; `retry` `None` when no wait can help.
    pub(crate) fn spans(
        allowed: bool,
        remaining: u64,
        retry: Option<Span>,
        reset: Span,
        delay: Span,
    ) -> Self {
        let retry = retry.unwrap_or(Span { ms: 0, ns: NEVER });
        Fields {
            words: [remaining, reset.ms, retry.ms, delay.ms],
            nanos: [reset.ns, retry.ns, delay.ns],
            layout: Layout::Spans,
            allowed,
        }
    }

    /// A bucket's decision in debts (units of 1/L ms, see [`Debts`]).
    #[inline]
    pub(crate) fn bucket(d: Debts) -> Self {
        let (retry_debt, marker) = match d.retry {
            Retry::Zero => (0, ZERO),
            Retry::Never => (0, NEVER),
            Retry::After(debt) => (debt, AFTER),
        };
        Fields {
            words: [d.after, retry_debt, d.delay, 0],
            nanos: [0, marker, 0],
            layout: Layout::Bucket,
            allowed: d.allowed,
        }
    }

    /// `debt` / L ms of `p`.
    fn per_limit(p: &Policy, debt: u64) -> Span {
        span_ratio(u128::from(debt), u128::from(p.limit()))
    }

    /// `remaining` under `p` (the policy decided).
    pub(crate) fn remaining(&self, p: &Policy) -> u64 {
        match self.layout {
            Layout::Spans => self.words[0],
            Layout::Bucket => debt::remaining(p.capacity(), p.period_ms(), self.words[0]),
        }
    }

    /// `retry_after` under `p`: `None` when no wait can help.
    pub(crate) fn retry_span(&self, p: &Policy) -> Option<Span> {
        match (self.layout, self.nanos[1]) {
            (_, NEVER) => None,
            (Layout::Spans, ns) => Some(Span {
                ms: self.words[2],
                ns,
            }),
            (Layout::Bucket, ZERO) => Some(Span::ZERO),
            (Layout::Bucket, _) => Some(Self::per_limit(p, self.words[1])),
        }
    }

    /// `reset_after` under `p`.
    pub(crate) fn reset_span(&self, p: &Policy) -> Span {
        match self.layout {
            Layout::Spans => Span {
                ms: self.words[1],
                ns: self.nanos[0],
            },
            Layout::Bucket => Self::per_limit(p, self.words[0]),
        }
    }

    /// `delay` under `p`.
    pub(crate) fn delay_span(&self, p: &Policy) -> Span {
        match self.layout {
            Layout::Spans => Span {
                ms: self.words[3],
                ns: self.nanos[2],
            },
            Layout::Bucket => Self::per_limit(p, self.words[2]),
        }
    }
}

/// The exact duration `num / den` milliseconds, rounded up to whole nanoseconds, so that
/// rounding it up again to milliseconds or seconds rounds the exact value. A `den` of 0 is
/// taken as 1; a value beyond `Duration::MAX` saturates (no policy within `SEMANTICS.md`'s
/// bounds comes near).
pub fn exact_ms(num: u128, den: u128) -> Duration {
    ms_ratio(num, den)
}

/// [`ms_ratio`] as a [`Span`]: the exact `num / den` ms rounded up to whole ns (saturating
/// at `u64::MAX` ms, which no policy within `SEMANTICS.md`'s bounds comes near).
pub(crate) fn span_ratio(num: u128, den: u128) -> Span {
    let den = den.max(1);
    if num == 0 {
        return Span::ZERO;
    }
    if let (Ok(n), Ok(d)) = (u64::try_from(num), u64::try_from(den)) {
        if let Some(scaled) = n.checked_mul(1_000_000) {
            return Span::from_ns(scaled.div_ceil(d));
        }
    }
    let Some(scaled) = num.checked_mul(1_000_000) else {
        return Span {
            ms: u64::MAX,
            ns: 0,
        };
    };
    let ns = scaled.div_ceil(den);
    match u64::try_from(ns / 1_000_000) {
        Ok(ms) => Span {
            ms,
            ns: (ns % 1_000_000) as u32,
        },
        Err(_) => Span {
            ms: u64::MAX,
            ns: 0,
        },
    }
}

pub(crate) fn ms_ratio(num: u128, den: u128) -> Duration {
    let den = den.max(1);
    if num == 0 {
        return Duration::ZERO;
    }
    // The common case in 64-bit arithmetic: 128-bit division costs several times more.
    if let (Ok(n), Ok(d)) = (u64::try_from(num), u64::try_from(den)) {
        if let Some(scaled) = n.checked_mul(1_000_000) {
            let ns = scaled.div_ceil(d);
            return Duration::new(ns / 1_000_000_000, (ns % 1_000_000_000) as u32);
        }
    }
    let Some(scaled) = num.checked_mul(1_000_000) else {
        return Duration::MAX;
    };
    let ns = scaled.div_ceil(den);
    let Ok(secs) = u64::try_from(ns / 1_000_000_000) else {
        return Duration::MAX;
    };
    let nanos = (ns % 1_000_000_000) as u32;
    Duration::new(secs, nanos)
}
