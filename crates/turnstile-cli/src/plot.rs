//! `turnstile simulate --plot FILE.svg`: admitted and denied requests per time bucket, as an
//! SVG drawn with plotters (SVG backend only: text stays `<text>` elements, so no font
//! library is needed).
//!
//! One panel per candidate, stacked top to bottom on one time axis and one request axis, so
//! candidates compare at a glance. In each panel a bar per bucket shows the admitted requests
//! (green, from zero) with the denied ones stacked on top (red): the bar's height is the
//! traffic offered, the green part what the candidate let through.
//!
//! Counting is done while the trace streams by, in memory bounded by the number of buckets:
//! without `--bucket`, counts are kept at a resolution that coarsens as the trace grows (each
//! resolution divides the next), and the bucket width is chosen at the end from the span.

use std::collections::BTreeMap;

use plotters::backend::SVGBackend;
use plotters::coord::Shift;
use plotters::prelude::{
    BindKeyPoints, ChartBuilder, Color, DrawingArea, DrawingBackend, IntoDrawingArea, RGBColor,
    Rectangle, SeriesLabelPosition, BLACK, WHITE,
};

use crate::access_log::{civil_from_days, month_name};

/// Resolutions (ms) at which counts are kept without `--bucket`; each divides the next, and
/// past the last each is ten times the one before.
const RESOLUTIONS_MS: [u64; 9] = [
    1, 10, 100, 1_000, 10_000, 60_000, 600_000, 3_600_000, 86_400_000,
];

/// Bucket widths (and tick spacings) a person reads easily, in ms.
const NICE_MS: [u64; 31] = [
    1,
    2,
    5,
    10,
    20,
    50,
    100,
    200,
    500,
    1_000,
    2_000,
    5_000,
    10_000,
    15_000,
    30_000,
    60_000,
    120_000,
    300_000,
    600_000,
    900_000,
    1_800_000,
    3_600_000,
    7_200_000,
    10_800_000,
    21_600_000,
    43_200_000,
    86_400_000,
    172_800_000,
    604_800_000,
    1_209_600_000,
    2_419_200_000,
];

/// Counts kept at the running resolution before it coarsens (without `--bucket`).
const MAX_KEPT: i64 = 100_000;

/// The most buckets a chosen width gives.
const TARGET_BUCKETS: i64 = 120;

/// The most buckets a plot may have with `--bucket`.
pub(crate) const MAX_BUCKETS: i64 = 5_000;

/// The most ticks on the time axis.
const MAX_TICKS: i64 = 10;

/// A day in ms.
const DAY_MS: u64 = 86_400_000;

/// Width of the image in pixels.
const WIDTH: u32 = 1000;

const ADMITTED: RGBColor = RGBColor(44, 160, 44);
const DENIED: RGBColor = RGBColor(214, 39, 40);
const FONT: &str = "sans-serif";

/// How the time axis is labelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TimeAxis {
    /// The trace's own time `t_ms`, counted from the start of the day (24 h since
    /// `t_ms` = 0) of the first request, so a trace that starts near 0 keeps its own times.
    TraceTime,
    /// Wall-clock time at a fixed offset from UTC (an access log; the first line's offset).
    WallClock {
        /// The offset from UTC in minutes.
        offset_minutes: i32,
    },
}

/// Admitted and denied counts per time bucket and candidate, collected during a run.
#[derive(Debug)]
pub(crate) struct PlotData {
    candidates: usize,
    /// `--bucket`, in ms.
    fixed_ms: Option<u64>,
    /// The narrowest bucket to choose, in ms (an access log has whole seconds).
    min_ms: u64,
    /// The width of the buckets counted in, in ms.
    resolution_ms: u64,
    /// The axis and the shift added to a request's time before bucketing, set by the first
    /// request.
    axis: Option<(TimeAxis, i64)>,
    /// Per bucket index (shifted time / resolution): per candidate, [admitted, denied].
    counts: BTreeMap<i64, Vec<[u64; 2]>>,
    /// The shifted times of the first and the latest request.
    span: Option<(i64, i64)>,
}

impl PlotData {
    /// Empty counts for `candidates` candidates, in buckets of `fixed_ms` when given, else
    /// of a width chosen at the end, at least `min_ms`.
    pub(crate) fn new(candidates: usize, fixed_ms: Option<u64>, min_ms: u64) -> Self {
        PlotData {
            candidates,
            fixed_ms,
            min_ms,
            resolution_ms: fixed_ms.unwrap_or(1).max(1),
            axis: None,
            counts: BTreeMap::new(),
            span: None,
        }
    }

    /// Fixes the time axis at the first request, at `t_ms`; later calls change nothing.
    pub(crate) fn start(&mut self, t_ms: u64, axis: TimeAxis) {
        if self.axis.is_some() {
            return;
        }
        let shift = match axis {
            // Whole days, so buckets stay aligned with windows and a trace from 0 keeps its
            // own times.
            TimeAxis::TraceTime => -to_i64(t_ms - t_ms % DAY_MS),
            TimeAxis::WallClock { offset_minutes } => i64::from(offset_minutes) * 60_000,
        };
        self.axis = Some((axis, shift));
    }

    /// Counts one decision of the candidate numbered `candidate` on a request at `t_ms`.
    /// Requests come in time order.
    pub(crate) fn record(&mut self, candidate: usize, t_ms: u64, allowed: bool) {
        if self.axis.is_none() {
            self.start(t_ms, TimeAxis::TraceTime);
        }
        let shift = self.axis.map_or(0, |(_, s)| s);
        let x = to_i64(t_ms).saturating_add(shift);
        let first = self.span.map_or(x, |(f, _)| f);
        self.span = Some((first, x));
        if self.fixed_ms.is_some() && self.bucket_count(self.resolution_ms) > MAX_BUCKETS {
            // Too many to draw: `render` says so; stop counting.
            self.counts.clear();
            return;
        }
        let index = x.div_euclid(to_i64(self.resolution_ms));
        let n = self.candidates;
        let cell = self.counts.entry(index).or_insert_with(|| vec![[0, 0]; n]);
        if let Some(c) = cell.get_mut(candidate) {
            c[usize::from(!allowed)] += 1;
        }
        while self.fixed_ms.is_none() && self.bucket_count(self.resolution_ms) > MAX_KEPT {
            self.coarsen();
        }
    }

    /// How many buckets of `width_ms` the requests so far span.
    fn bucket_count(&self, width_ms: u64) -> i64 {
        let w = to_i64(width_ms);
        self.span.map_or(0, |(first, last)| {
            last.div_euclid(w) - first.div_euclid(w) + 1
        })
    }

    /// Moves the counts to the next resolution.
    fn coarsen(&mut self) {
        let from = self.resolution_ms;
        let to = RESOLUTIONS_MS
            .iter()
            .copied()
            .find(|r| *r > from)
            .unwrap_or(from.saturating_mul(10));
        self.counts = regroup(std::mem::take(&mut self.counts), from, to);
        self.resolution_ms = to;
    }

    /// The bucket width to draw with, in ms.
    fn bucket_ms(&self) -> u64 {
        if let Some(fixed) = self.fixed_ms {
            return fixed;
        }
        let r = self.resolution_ms;
        NICE_MS
            .iter()
            .copied()
            .filter(|w| *w >= r.max(self.min_ms) && w % r == 0)
            .find(|w| self.bucket_count(*w) <= TARGET_BUCKETS)
            .unwrap_or_else(|| {
                // Beyond the nice widths: a multiple of the resolution.
                let n = u64::try_from(self.bucket_count(r)).unwrap_or(1);
                r.saturating_mul(n.div_ceil(TARGET_BUCKETS as u64).max(1))
            })
    }

    /// Draws the plot, one panel per candidate titled by `titles`, as an SVG document.
    ///
    /// # Errors
    /// A message when the trace spans more buckets of `--bucket` than a plot may hold, or
    /// plotters fails.
    pub(crate) fn render(&self, titles: &[String]) -> Result<String, String> {
        let frame = self.frame()?;
        let n = self.candidates.max(1);
        let panel_h: u32 = if n == 1 { 380 } else { 210 };
        let height = 50 + panel_h * u32::try_from(n).unwrap_or(1);
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
            root.fill(&WHITE).map_err(|e| e.to_string())?;
            let title = format!(
                "Admitted and denied requests per {} (stacked)",
                human_duration(frame.width_ms)
            );
            let body = root.titled(&title, (FONT, 22)).map_err(|e| e.to_string())?;
            for (i, panel) in body.split_evenly((n, 1)).iter().enumerate() {
                let caption = titles.get(i).map_or("", String::as_str);
                frame.draw_panel(panel, i, i + 1 == n, caption)?;
            }
            root.present().map_err(|e| e.to_string())?;
        }
        Ok(svg)
    }

    /// What every panel shares: the bucket width, the counts regrouped into it, both axes.
    ///
    /// # Errors
    /// As [`PlotData::render`]: too many buckets of `--bucket`.
    fn frame(&self) -> Result<Frame, String> {
        let w = self.bucket_ms();
        let count = self.bucket_count(w);
        if count > MAX_BUCKETS {
            return Err(format!(
                "the trace spans {count} buckets of {}, more than the {MAX_BUCKETS} a plot may \
                 hold; give a wider --bucket",
                human_duration(w)
            ));
        }
        let wi = to_i64(w);
        // The buckets drawn, from the first request's to the last one's.
        let (first, last) = self
            .span
            .map_or((0, 0), |(f, l)| (f.div_euclid(wi), l.div_euclid(wi)));
        let buckets = regroup(self.counts.clone(), self.resolution_ms, w);
        let peak = buckets
            .values()
            .flat_map(|per| per.iter().map(|[a, d]| a + d))
            .max()
            .unwrap_or(0);
        let x = (first.saturating_mul(wi), (last + 1).saturating_mul(wi));
        let (axis, shift) = self.axis.unwrap_or((TimeAxis::TraceTime, 0));
        Ok(Frame {
            width_ms: w,
            buckets,
            labels: Labels::new(axis, -shift, x.0, x.1),
            x,
            // Room above the highest bar for the legend.
            y_top: (peak + peak / 4).max(peak + 1),
        })
    }
}

/// What every panel of one plot shares.
struct Frame {
    /// The bucket width in ms.
    width_ms: u64,
    /// Per bucket (its index at `width_ms`), per candidate: admitted and denied requests.
    buckets: BTreeMap<i64, Vec<[u64; 2]>>,
    /// The time axis, shifted ms, from the first request's bucket to the end of the last's.
    x: (i64, i64),
    /// The top of the request axis.
    y_top: u64,
    labels: Labels,
}

impl Frame {
    /// Draws candidate `i`'s panel, captioned `caption`: its grid (the time axis described
    /// under the `last` panel only), its bars, and their legend.
    fn draw_panel<DB: DrawingBackend>(
        &self,
        panel: &DrawingArea<DB, Shift>,
        i: usize,
        last: bool,
        caption: &str,
    ) -> Result<(), String> {
        let (x0, x1) = self.x;
        let mut chart = ChartBuilder::on(panel)
            .caption(caption, (FONT, 16))
            .margin_left(10)
            .margin_right(25)
            .margin_bottom(5)
            .x_label_area_size(if last { 45 } else { 25 })
            .y_label_area_size(70)
            .build_cartesian_2d(
                (x0..x1).with_key_points(self.labels.ticks.clone()),
                0u64..self.y_top,
            )
            .map_err(|e| e.to_string())?;
        let format_x = |x: &i64| self.labels.format(*x);
        let mut mesh = chart.configure_mesh();
        mesh.x_label_formatter(&format_x)
            .y_desc(format!("requests per {}", human_duration(self.width_ms)))
            .axis_desc_style((FONT, 14))
            .label_style((FONT, 12))
            .light_line_style(WHITE.mix(0.0))
            .bold_line_style(BLACK.mix(0.12));
        if last {
            mesh.x_desc(self.labels.description.as_str());
        }
        mesh.draw().map_err(|e| e.to_string())?;
        for (outcome, label, color) in [(0, "admitted", ADMITTED), (1, "denied", DENIED)] {
            chart
                .draw_series(self.bars(i, outcome, color))
                .map_err(|e| e.to_string())?
                .label(label)
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 6), (x + 14, y + 6)], color.filled())
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.3))
            .label_font((FONT, 13))
            .draw()
            .map_err(|e| e.to_string())
    }

    /// Candidate `i`'s bars of one outcome (0: admitted, from zero; 1: denied, stacked on
    /// the admitted), in `color`; none for an empty part.
    fn bars(
        &self,
        i: usize,
        outcome: usize,
        color: RGBColor,
    ) -> impl Iterator<Item = Rectangle<(i64, u64)>> + '_ {
        let wi = to_i64(self.width_ms);
        self.buckets.iter().filter_map(move |(index, per)| {
            let [a, d] = per.get(i).copied().unwrap_or([0, 0]);
            let (lo, hi) = if outcome == 0 { (0, a) } else { (a, a + d) };
            let left = index.saturating_mul(wi);
            (hi > lo).then(|| {
                let right = left.saturating_add(wi);
                Rectangle::new([(left, lo), (right, hi)], color.filled())
            })
        })
    }
}

/// The counts of buckets of `from` ms regrouped into buckets of `to` ms (`from` divides `to`).
fn regroup(
    counts: BTreeMap<i64, Vec<[u64; 2]>>,
    from: u64,
    to: u64,
) -> BTreeMap<i64, Vec<[u64; 2]>> {
    let (from, to) = (to_i64(from), to_i64(to));
    let mut out: BTreeMap<i64, Vec<[u64; 2]>> = BTreeMap::new();
    for (index, per) in counts {
        let new = index.saturating_mul(from).div_euclid(to);
        match out.get_mut(&new) {
            Some(acc) => {
                for (a, c) in acc.iter_mut().zip(&per) {
                    a[0] += c[0];
                    a[1] += c[1];
                }
            }
            None => {
                out.insert(new, per);
            }
        }
    }
    out
}

/// Ticks and labels of the time axis.
struct Labels {
    axis: TimeAxis,
    /// Tick positions (shifted ms).
    ticks: Vec<i64>,
    /// The spacing of the ticks in ms.
    step: i64,
    /// Whether all of the axis lies in one day (wall clock).
    one_day: bool,
    /// The axis description.
    description: String,
}

impl Labels {
    /// Ticks at a nice spacing over [x0, x1] (shifted ms) and the way to label them;
    /// `origin` is the trace time of x = 0 (trace time only).
    fn new(axis: TimeAxis, origin: i64, x0: i64, x1: i64) -> Self {
        let span = (x1 - x0).max(1);
        // Wall-clock labels show whole seconds at most.
        let finest = match axis {
            TimeAxis::TraceTime => 1,
            TimeAxis::WallClock { .. } => 1_000,
        };
        let step = NICE_MS
            .iter()
            .map(|s| to_i64(*s))
            .find(|s| *s >= finest && span / s <= MAX_TICKS)
            .unwrap_or_else(|| {
                let day = to_i64(DAY_MS);
                (span / MAX_TICKS).div_euclid(day).saturating_add(1) * day
            });
        let mut ticks = Vec::new();
        let mut t = Some(x0.div_euclid(step).saturating_mul(step));
        while let Some(tick) = t.filter(|tick| *tick <= x1) {
            if tick >= x0 {
                ticks.push(tick);
            }
            t = tick.checked_add(step);
        }
        let day = to_i64(DAY_MS);
        let one_day = x0.div_euclid(day) == (x1 - 1).div_euclid(day);
        let description = match axis {
            TimeAxis::TraceTime if origin == 0 => format!("trace time t_ms ({})", unit(step).1),
            TimeAxis::TraceTime => format!("trace time since t_ms = {origin} ({})", unit(step).1),
            TimeAxis::WallClock { offset_minutes } => {
                let zone = utc_offset(offset_minutes);
                if one_day {
                    let (y, m, d) = civil_from_days(x0.div_euclid(day));
                    format!("time on {d} {} {y} ({zone})", month_name(m))
                } else {
                    format!("date and time ({zone})")
                }
            }
        };
        Labels {
            axis,
            ticks,
            step,
            one_day,
            description,
        }
    }

    /// The label of the tick at `x` (shifted ms).
    fn format(&self, x: i64) -> String {
        match self.axis {
            TimeAxis::TraceTime => {
                let (per, _) = unit(self.step);
                let whole = x.div_euclid(per);
                let frac = x.rem_euclid(per);
                if frac == 0 {
                    return whole.to_string();
                }
                // Up to three decimals, trailing zeros dropped.
                let thousandths = frac * 1000 / per;
                let s = format!("{whole}.{thousandths:03}");
                s.trim_end_matches('0').to_owned()
            }
            TimeAxis::WallClock { .. } => {
                let day = to_i64(DAY_MS);
                let (days, in_day) = (x.div_euclid(day), x.rem_euclid(day));
                let (h, m, s) = (in_day / 3_600_000, in_day / 60_000 % 60, in_day / 1000 % 60);
                let clock = if self.step % 60_000 == 0 {
                    format!("{h:02}:{m:02}")
                } else {
                    format!("{h:02}:{m:02}:{s:02}")
                };
                if self.one_day {
                    return clock;
                }
                let (_, month, d) = civil_from_days(days);
                if self.step % day == 0 {
                    format!("{d} {}", month_name(month))
                } else {
                    format!("{d} {} {clock}", month_name(month))
                }
            }
        }
    }
}

/// The unit (ms per unit, name) to label a time axis with ticks `step` ms apart.
fn unit(step: i64) -> (i64, &'static str) {
    match step {
        ..100 => (1, "ms"),
        100..60_000 => (1_000, "s"),
        60_000..3_600_000 => (60_000, "min"),
        3_600_000..86_400_000 => (3_600_000, "h"),
        _ => (86_400_000, "d"),
    }
}

/// An offset from UTC as `UTC+hh:mm`.
fn utc_offset(minutes: i32) -> String {
    let sign = if minutes < 0 { '-' } else { '+' };
    let m = minutes.unsigned_abs();
    format!("UTC{sign}{:02}:{:02}", m / 60, m % 60)
}

/// A bucket width for people: `500 ms`, `1 s`, `5 min`, `2 h`, `1 d`.
pub(crate) fn human_duration(ms: u64) -> String {
    for (per, name) in [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "min"),
        (1_000, "s"),
    ] {
        if ms != 0 && ms.is_multiple_of(per) {
            return format!("{} {name}", ms / per);
        }
    }
    format!("{ms} ms")
}

/// A time in ms as i64 (times are at most 2^53 − 1 ms, durations saturate).
fn to_i64(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_resolution_divides_the_next() {
        for pair in RESOLUTIONS_MS.windows(2) {
            assert_eq!(pair[1] % pair[0], 0, "{pair:?}");
        }
    }

    #[test]
    fn the_width_follows_the_span() {
        let mut p = PlotData::new(1, None, 1);
        p.start(5_000, TimeAxis::TraceTime);
        for t in (5_000..65_000).step_by(7) {
            p.record(0, t, t % 2 == 0);
        }
        // 60 s in at most 120 buckets: 500 ms.
        assert_eq!(p.bucket_ms(), 500);
        let total: u64 = p.counts.values().map(|c| c[0][0] + c[0][1]).sum();
        assert_eq!(total, (5_000..65_000).step_by(7).count() as u64);

        // A week at one request a second coarsens the counts but keeps every request.
        let mut p = PlotData::new(2, None, 1);
        let week = 7 * 86_400;
        for s in 0..week {
            p.record(0, s * 1000, true);
            p.record(1, s * 1000, false);
        }
        assert!(p.counts.len() <= MAX_KEPT as usize);
        assert_eq!(p.bucket_ms(), 7_200_000);
        let (a, d) = p
            .counts
            .values()
            .fold((0, 0), |(a, d), c| (a + c[0][0], d + c[1][1]));
        assert_eq!((a, d), (week, week));
        let svg = p.render(&["a".into(), "b".into()]).expect("a plot");
        assert!(svg.contains("requests per 2 h"));
    }

    #[test]
    fn too_many_fixed_buckets_is_an_error() {
        let mut p = PlotData::new(1, Some(1), 1);
        p.record(0, 0, true);
        p.record(0, 10_000, true);
        assert!(p.counts.is_empty());
        let err = p.render(&["x".into()]).expect_err("10001 buckets");
        assert!(err.contains("--bucket"), "{err}");
    }

    #[test]
    fn labels() {
        let l = Labels::new(TimeAxis::TraceTime, 0, 0, 60_000);
        assert_eq!(l.step, 10_000);
        assert_eq!(l.format(30_000), "30");
        assert_eq!(l.description, "trace time t_ms (s)");
        let l = Labels::new(TimeAxis::TraceTime, 864_000_000, 0, 600_000);
        assert_eq!(l.description, "trace time since t_ms = 864000000 (min)");
        let l = Labels::new(TimeAxis::TraceTime, 0, 0, 3_000);
        assert_eq!(l.format(1_500), "1.5");
        // 10 Oct 2000 13:55 at UTC−7, as local ms.
        let local =
            (crate::access_log::days_from_civil(2000, 10, 10) * 86_400 + 13 * 3600 + 55 * 60)
                * 1000;
        let l = Labels::new(
            TimeAxis::WallClock {
                offset_minutes: -420,
            },
            0,
            local,
            local + 600_000,
        );
        assert_eq!(l.format(local), "13:55");
        assert_eq!(l.description, "time on 10 Oct 2000 (UTC-07:00)");
        let l = Labels::new(
            TimeAxis::WallClock { offset_minutes: 90 },
            0,
            local,
            local + 3 * 86_400_000,
        );
        assert_eq!(l.format(local + 1_700_000), "10 Oct 14:23");
        assert_eq!(l.description, "date and time (UTC+01:30)");
        assert_eq!(human_duration(500), "500 ms");
        assert_eq!(human_duration(300_000), "5 min");
    }
}
