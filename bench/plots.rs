//! The report's figures, as SVG (plotters' SVG backend): per size, the reclaim-lag distribution
//! of each contender in the burst and in the churn, and the churn's lag against reads, one
//! point per build. Drawn from a run's figures alone, so `--report-from` draws them again; the
//! report (report.rs) writes the files next to RESULTS.md and links them.

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::results::{Contender, EventKind, Role, Run, SizeResult};
use crate::statistics::{Tradeoff, cdf, group, tradeoffs};
use crate::targets::{CHURN_READS_PER_CLAIM, LAG_P99_S};

/// Lags at or below this are drawn at it: a log axis has no zero, and an owner-deleted lag can
/// be slightly below zero (the report's "What limits each figure").
pub const LAG_FLOOR_S: f64 = 0.001;

/// One SVG file of the report.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    /// The size it shows.
    pub n: usize,
    pub kind: FigureKind,
    /// Its file name, next to the report.
    pub file: String,
    /// What it shows, as the report's alt text.
    pub title: String,
    pub svg: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FigureKind {
    /// The share of claims reclaimed within each lag, per contender: burst, and churn.
    LagCdf,
    /// The churn's lag p50 and p99 against reads per reclaimed claim, per build.
    LagReads,
}

const SIZE: (u32, u32) = (1200, 460);
/// The legend's column, right of the panels.
const LEGEND_WIDTH: u32 = 250;
const GRID: RGBColor = RGBColor(238, 238, 238);
const GUIDE: RGBColor = RGBColor(150, 150, 150);
/// The line through workspace-gc's builds.
const CURVE: RGBColor = RGBColor(110, 110, 110);
/// workspace-gc's builds first, then the baselines; a colour stays with its contender across
/// panels.
const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(23, 190, 207),
    RGBColor(140, 86, 75),
    RGBColor(127, 127, 127),
    RGBColor(214, 39, 40),
    RGBColor(255, 127, 14),
];
const FONT: &str = "sans-serif";

/// Every figure of `run`: the lag distributions of each size with a reclaimed claim, and the
/// lag against reads of each size whose churn ran.
pub fn figures(run: &Run) -> Result<Vec<Figure>, String> {
    type Draw = fn(&SizeResult) -> Result<Option<String>, String>;
    let kinds: [(FigureKind, Draw, &str, &str); 2] = [
        (
            FigureKind::LagCdf,
            lag_cdf,
            "lag-cdf",
            "Reclaim lag distributions",
        ),
        (
            FigureKind::LagReads,
            lag_reads,
            "lag-reads",
            "Churn lag against reads per claim",
        ),
    ];
    let mut out = Vec::new();
    for r in &run.sizes {
        for (kind, draw, stem, title) in kinds {
            if let Some(svg) = draw(r)? {
                out.push(Figure {
                    n: r.n,
                    kind,
                    file: format!("{stem}-N{}.svg", r.n),
                    title: format!("{title}, N = {}", group(r.n)),
                    svg,
                });
            }
        }
    }
    Ok(out)
}

/// The decades that hold `values` (clamped to [`LAG_FLOOR_S`]): a log axis from the power of
/// ten at or below the smallest to the one at or above the largest, at least one decade wide.
pub fn decades(values: impl IntoIterator<Item = f64>) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, 0.0_f64);
    for v in values {
        let v = v.max(LAG_FLOOR_S);
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if hi == 0.0 {
        return (LAG_FLOOR_S, 1.0);
    }
    let lo = 10f64.powf(lo.log10().floor());
    let hi = 10f64.powf(hi.log10().ceil()).max(lo * 10.0);
    (lo, hi)
}

/// A lag as an axis label: as many decimals as a decade below one second needs.
fn seconds(x: &f64) -> String {
    let decimals = if *x >= 1.0 {
        0
    } else {
        (-x.log10()).ceil().max(0.0) as usize
    };
    format!("{x:.decimals$} s")
}

fn drawn<E: std::fmt::Debug>(error: E) -> String {
    format!("drawing a figure: {error:?}")
}

/// The colour of each contender at a size, by name, in the order they were measured: the
/// baselines after workspace-gc's builds.
fn colours(r: &SizeResult) -> Vec<(String, RGBColor)> {
    let mut named: Vec<&Contender> = r.contenders.iter().collect();
    named.sort_by_key(|c| c.role != Role::Daemon);
    named
        .iter()
        .enumerate()
        .map(|(i, c)| (c.name.clone(), PALETTE[i % PALETTE.len()]))
        .collect()
}

fn colour_of(colours: &[(String, RGBColor)], name: &str) -> RGBColor {
    colours
        .iter()
        .find(|(n, _)| n == name)
        .map_or(BLACK, |(_, c)| *c)
}

/// How a legend entry is marked.
#[derive(Clone, Copy)]
enum Key {
    Line(RGBColor),
    Dashed(RGBColor),
    Dot(RGBColor),
    Triangle(RGBColor),
    /// Text alone (a note under the entries).
    None,
}

/// The legend, in its own column right of the panels, so that it hides no point.
fn legend(area: &DrawingArea<SVGBackend, Shift>, entries: &[(Key, String)]) -> Result<(), String> {
    let font = (FONT, 13).into_font();
    for (i, (key, text)) in entries.iter().enumerate() {
        let y = 50 + 22 * i as i32;
        match *key {
            Key::Line(c) => area.draw(&PathElement::new([(8, y), (32, y)], c.stroke_width(2))),
            Key::Dashed(c) => area
                .draw(&PathElement::new([(8, y), (15, y)], c.stroke_width(1)))
                .and_then(|()| area.draw(&PathElement::new([(24, y), (32, y)], c.stroke_width(1)))),
            Key::Dot(c) => area.draw(&Circle::new((20, y), 5, c.filled())),
            Key::Triangle(c) => area.draw(&TriangleMarker::new((20, y), 6, c.filled())),
            Key::None => Ok(()),
        }
        .map_err(drawn)?;
        let x = if matches!(key, Key::None) { 8 } else { 40 };
        area.draw(&Text::new(text.clone(), (x, y - 7), font.clone()))
            .map_err(drawn)?;
    }
    Ok(())
}

/// One panel's curves: (contender, its lags), each with a reclaimed claim.
type Curves<'a> = Vec<(&'a str, &'a [(EventKind, Option<f64>)])>;

fn lag_cdf(r: &SizeResult) -> Result<Option<String>, String> {
    let reclaimed = |lags: &[(EventKind, Option<f64>)]| lags.iter().any(|(_, l)| l.is_some());
    let burst: Curves = r
        .contenders
        .iter()
        .filter(|c| !c.churn_only && reclaimed(&c.lags))
        .map(|c| (c.name.as_str(), c.lags.as_slice()))
        .collect();
    let churn: Curves = r
        .contenders
        .iter()
        .filter_map(|c| Some((c.name.as_str(), c.churn.as_ref()?.lags.as_slice())))
        .filter(|(_, lags)| reclaimed(lags))
        .collect();
    if burst.is_empty() && churn.is_empty() {
        return Ok(None);
    }
    let all = burst.iter().chain(&churn).flat_map(|(_, lags)| lags.iter());
    let range = decades(all.filter_map(|(_, lag)| *lag));
    let colours = colours(r);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(drawn)?;
        let (plots, key) = root.split_horizontally(SIZE.0 - LEGEND_WIDTH);
        let panels: Vec<(String, &Curves)> = [
            (format!("Burst, N = {}", group(r.n)), &burst),
            (format!("Churn, N = {}", group(r.n)), &churn),
        ]
        .into_iter()
        .filter(|(_, curves)| !curves.is_empty())
        .collect();
        let areas = plots.split_evenly((1, panels.len()));
        for ((caption, curves), area) in panels.iter().zip(&areas) {
            cdf_panel(area, caption, curves, range, &colours)?;
        }
        let mut entries: Vec<(Key, String)> = colours
            .iter()
            .filter(|(name, _)| burst.iter().chain(&churn).any(|(n, _)| n == name))
            .map(|(name, colour)| (Key::Line(*colour), name.clone()))
            .collect();
        entries.push((Key::None, String::new()));
        entries.push((Key::None, "A curve that ends below 100 %:".into()));
        entries.push((Key::None, "claims not reclaimed.".into()));
        entries.push((
            Key::None,
            format!("Lags up to {} drawn at it.", seconds(&LAG_FLOOR_S)),
        ));
        legend(&key, &entries)?;
        root.present().map_err(drawn)?;
    }
    Ok(Some(svg))
}

fn cdf_panel(
    area: &DrawingArea<SVGBackend, Shift>,
    caption: &str,
    curves: &Curves,
    (lo, hi): (f64, f64),
    colours: &[(String, RGBColor)],
) -> Result<(), String> {
    let mut chart = ChartBuilder::on(area)
        .caption(caption, (FONT, 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d((lo..hi).log_scale(), 0.0..1.0)
        .map_err(drawn)?;
    chart
        .configure_mesh()
        .light_line_style(GRID)
        .x_desc("reclaim lag (log scale)")
        .y_desc("share of claims reclaimed")
        .x_label_formatter(&seconds)
        .y_label_formatter(&|y: &f64| format!("{:.0} %", *y * 100.0))
        .draw()
        .map_err(drawn)?;
    for (name, lags) in curves {
        let colour = colour_of(colours, name);
        let steps = cdf(lags);
        let mut points = vec![(lo, 0.0)];
        let mut below = 0.0;
        for (lag, share) in &steps {
            let x = lag.max(LAG_FLOOR_S).max(lo);
            points.push((x, below));
            points.push((x, *share));
            below = *share;
        }
        points.push((hi, below));
        chart
            .draw_series(LineSeries::new(points, colour.stroke_width(2)))
            .map_err(drawn)?;
    }
    Ok(())
}

fn lag_reads(r: &SizeResult) -> Result<Option<String>, String> {
    let points: Vec<Tradeoff> = tradeoffs(r)
        .into_iter()
        .filter(|t| t.lag.p50.is_some())
        .collect();
    if points.is_empty() {
        return Ok(None);
    }
    // A factor of two to spare either way, so that no point sits on the frame.
    let lags = points
        .iter()
        .flat_map(|t| [t.lag.p50, t.lag.p99])
        .flatten()
        .chain([LAG_P99_S])
        .flat_map(|lag| [lag / 2.0, lag * 2.0]);
    let (lo, hi) = decades(lags);
    let widest = points
        .iter()
        .map(|t| t.reads)
        .fold(CHURN_READS_PER_CLAIM, f64::max);
    let colours = colours(r);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(drawn)?;
        let (plot, key) = root.split_horizontally(SIZE.0 - LEGEND_WIDTH);
        let mut chart = ChartBuilder::on(&plot)
            .caption(
                format!(
                    "Churn, N = {}: lag against reads per reclaimed claim",
                    group(r.n)
                ),
                (FONT, 18),
            )
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..widest * 1.25, (lo..hi).log_scale())
            .map_err(drawn)?;
        chart
            .configure_mesh()
            .light_line_style(GRID)
            .x_desc("reads (GET + LIST) per reclaimed claim")
            .y_desc("reclaim lag (log scale)")
            .y_label_formatter(&seconds)
            .draw()
            .map_err(drawn)?;
        // The targets: the corner below and left of both lines meets them.
        let guide = GUIDE.stroke_width(1);
        chart
            .draw_series(DashedLineSeries::new(
                [(0.0, LAG_P99_S), (widest * 1.25, LAG_P99_S)],
                6,
                4,
                guide,
            ))
            .map_err(drawn)?;
        chart
            .draw_series(DashedLineSeries::new(
                [(CHURN_READS_PER_CLAIM, lo), (CHURN_READS_PER_CLAIM, hi)],
                6,
                4,
                guide,
            ))
            .map_err(drawn)?;
        // workspace-gc's builds, in order of reads: the curve the options trace.
        let mut builds: Vec<&Tradeoff> = points.iter().filter(|t| t.role == Role::Daemon).collect();
        builds.sort_by(|a, b| a.reads.total_cmp(&b.reads));
        for pick in [|t: &Tradeoff| t.lag.p50, |t: &Tradeoff| t.lag.p99] {
            let line: Vec<(f64, f64)> = builds
                .iter()
                .filter_map(|t| Some((t.reads, pick(t)?.max(LAG_FLOOR_S))))
                .collect();
            chart
                .draw_series(LineSeries::new(line, CURVE.stroke_width(1)))
                .map_err(drawn)?;
        }
        for t in &points {
            let colour = colour_of(&colours, &t.name);
            let p50 = t.lag.p50.map(|p| (t.reads, p.max(LAG_FLOOR_S)));
            let p99 = t.lag.p99.map(|p| (t.reads, p.max(LAG_FLOOR_S)));
            chart
                .draw_series(p50.map(|at| Circle::new(at, 5, colour.filled())))
                .map_err(drawn)?;
            chart
                .draw_series(p99.map(|at| TriangleMarker::new(at, 6, colour.filled())))
                .map_err(drawn)?;
        }
        let mut entries: Vec<(Key, String)> = points
            .iter()
            .map(|t| {
                let missing = t.lag.events - t.lag.reclaimed;
                let name = match missing {
                    0 => t.name.clone(),
                    _ => format!("{} ({missing} not reclaimed)", t.name),
                };
                (Key::Line(colour_of(&colours, &t.name)), name)
            })
            .collect();
        entries.extend([
            (Key::None, String::new()),
            (Key::Dot(BLACK), "lag p50".into()),
            (Key::Triangle(BLACK), "lag p99".into()),
            (Key::Line(CURVE), "workspace-gc's builds".into()),
            (
                Key::Dashed(GUIDE),
                format!("targets: p99 {LAG_P99_S} s, {CHURN_READS_PER_CLAIM} read"),
            ),
        ]);
        legend(&key, &entries)?;
        root.present().map_err(drawn)?;
    }
    Ok(Some(svg))
}
