//! PNG charts with text — title, axis labels with units, tick values, legend — drawn by
//! plotters through its `ab_glyph` renderer with a TrueType font read from the machine
//! (Debian's `fonts-dejavu-core`, which `scripts/setup.sh` installs when missing, or the file
//! named by `KJOB_BENCH_FONT`).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::coord::ranged1d::ValueFormatter;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use crate::plot::{PlotError, SERIES_COLOURS};

/// Pixel size of every chart.
const SIZE: (u32, u32) = (900, 560);
/// Font family name the charts ask plotters for.
const FAMILY: &str = "sans-serif";
/// Environment variable naming a TrueType font to use instead of the default paths.
pub const FONT_ENV: &str = "KJOB_BENCH_FONT";
/// Where Debian's font packages put a sans-serif TrueType font.
const FONT_PATHS: [&str; 3] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

/// Colours beyond the four of [`SERIES_COLOURS`] (orange, purple).
const MORE_COLOURS: [RGBColor; 2] = [RGBColor(255, 127, 14), RGBColor(148, 103, 189)];

/// Colour of series `i`.
pub fn colour(i: usize) -> RGBColor {
    let all: Vec<RGBColor> = SERIES_COLOURS.iter().chain(MORE_COLOURS.iter()).copied().collect();
    all[i % all.len()]
}

/// The font file the charts use: `KJOB_BENCH_FONT`, else the first of the Debian paths present.
pub fn font_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(FONT_ENV) {
        return Some(PathBuf::from(p));
    }
    FONT_PATHS.iter().map(PathBuf::from).find(|p| p.is_file())
}

/// Registers the font with plotters once per process; every later call returns the first
/// outcome.
pub fn ensure_font() -> Result<(), PlotError> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        let path = font_path().ok_or_else(|| {
            format!(
                "no TrueType font found (install fonts-dejavu-core or set {FONT_ENV}); looked at {}",
                FONT_PATHS.join(", ")
            )
        })?;
        let bytes = std::fs::read(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        // plotters keeps fonts for the life of the process; one leak of one file.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font(FAMILY, FontStyle::Normal, bytes)
            .map_err(|_| format!("{} is not a usable TrueType font", path.display()))
    })
    .clone()
    .map_err(|message| PlotError::Draw { path: "(font)".into(), message })
}

fn draw_err(path: &Path) -> impl Fn(&dyn std::fmt::Display) -> PlotError + '_ {
    move |e| PlotError::Draw { path: path.display().to_string(), message: e.to_string() }
}

/// A sane upper bound for an axis holding values up to `max`.
fn axis_max(max: f64) -> f64 {
    if max > 0.0 && max.is_finite() { max * 1.15 } else { 1.0 }
}

/// Height in pixels of a chart's plotting area, about: [`SIZE`] less the caption, the margins
/// and the x label area.
const PLOT_HEIGHT_PX: f64 = 440.0;

/// The y axis' top for a bar chart of `entries` bars whose tallest is `max`: above the tallest
/// bar and its value stays free room for the legend in the upper right corner (a row of about
/// 20 px per entry, its border and offset) and for the value written above the bar, so neither
/// hides the other.
fn bar_axis_max(max: f64, entries: usize) -> f64 {
    let legend_px = 20.0 * entries as f64 + 30.0;
    let value_px = 30.0;
    let free = ((legend_px + value_px) / PLOT_HEIGHT_PX).min(0.6);
    if max > 0.0 && max.is_finite() { max / (1.0 - free) } else { 1.0 }
}

type Canvas<'a> = DrawingArea<BitMapBackend<'a>, Shift>;
type Chart<'a, X> = ChartContext<'a, BitMapBackend<'a>, Cartesian2d<X, RangedCoordf64>>;

/// A white canvas for a chart at `path`, with the font registered.
fn canvas(path: &Path) -> Result<Canvas<'_>, PlotError> {
    ensure_font()?;
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| draw_err(path)(&e))?;
    Ok(root)
}

/// The chart builder every chart starts from: the title and the label areas (x, y) in pixels.
fn builder<'a, 'b>(
    root: &'a Canvas<'b>,
    title: &str,
    areas: (u32, u32),
) -> ChartBuilder<'a, 'b, BitMapBackend<'b>> {
    let mut b = ChartBuilder::on(root);
    b.caption(title, (FAMILY, 24)).margin(16).x_label_area_size(areas.0).y_label_area_size(areas.1);
    b
}

/// Draws the mesh in the charts' fonts, the y axis named `y_desc`; the x axis named `x_desc`,
/// or without x axis and vertical lines when `None` (bars carry their own legend).
fn draw_mesh<X>(
    chart: &mut Chart<'_, X>,
    x_desc: Option<&str>,
    y_desc: &str,
    err: &impl Fn(&dyn std::fmt::Display) -> PlotError,
) -> Result<(), PlotError>
where
    X: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let mut mesh = chart.configure_mesh();
    match x_desc {
        Some(d) => mesh.x_desc(d),
        None => mesh.disable_x_mesh().disable_x_axis(),
    };
    mesh.y_desc(y_desc)
        .label_style((FAMILY, 15))
        .axis_desc_style((FAMILY, 17))
        .draw()
        .map_err(|e| err(&e))
}

/// Draws the legend at `position` and writes the PNG.
fn legend_and_present<X: Ranged<ValueType = f64>>(
    root: &Canvas<'_>,
    mut chart: Chart<'_, X>,
    position: SeriesLabelPosition,
    err: impl Fn(&dyn std::fmt::Display) -> PlotError,
) -> Result<(), PlotError> {
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font((FAMILY, 15))
        .position(position)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// One bar per `(label, value)`, each its own colour and legend entry, the value written above
/// it. `y_desc` names the quantity with its unit.
pub fn bar_chart(
    path: &Path,
    title: &str,
    y_desc: &str,
    bars: &[(String, f64)],
) -> Result<(), PlotError> {
    let err = draw_err(path);
    let n = bars.len().max(1);
    let y_max = bar_axis_max(bars.iter().map(|b| b.1).fold(0.0, f64::max), bars.len());
    let root = canvas(path)?;
    let mut chart = builder(&root, title, (40, 80))
        .build_cartesian_2d(0.0..n as f64, 0.0..y_max)
        .map_err(|e| err(&e))?;
    draw_mesh(&mut chart, None, y_desc, &err)?;
    for (i, (label, value)) in bars.iter().enumerate() {
        let c = colour(i);
        let (x0, x1) = (i as f64 + 0.15, i as f64 + 0.85);
        chart
            .draw_series([Rectangle::new([(x0, 0.0), (x1, *value)], c.filled())])
            .map_err(|e| err(&e))?
            .label(label.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], c.filled()));
        chart
            .draw_series([Text::new(
                format_value(*value),
                (i as f64 + 0.3, *value + y_max * 0.05),
                (FAMILY, 15),
            )])
            .map_err(|e| err(&e))?;
    }
    legend_and_present(&root, chart, SeriesLabelPosition::UpperRight, err)
}

/// The mesh (axes named `(x_desc, y_desc)`) and one line per `(legend, points)` of a line or
/// CDF chart, the legend at `position`; with `x_floor` (a log axis' left end), points left of
/// it are drawn on it.
fn lines<X>(
    path: &Path,
    root: &Canvas<'_>,
    mut chart: Chart<'_, X>,
    (x_desc, y_desc): (&str, &str),
    series: &[(String, Vec<(f64, f64)>)],
    x_floor: Option<f64>,
    position: SeriesLabelPosition,
) -> Result<(), PlotError>
where
    X: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let err = draw_err(path);
    draw_mesh(&mut chart, Some(x_desc), y_desc, &err)?;
    for (i, (name, points)) in series.iter().enumerate() {
        let c = colour(i);
        let pts: Vec<(f64, f64)> = match x_floor {
            Some(floor) => points.iter().map(|&(x, y)| (x.max(floor), y)).collect(),
            None => points.clone(),
        };
        chart
            .draw_series(LineSeries::new(pts, c.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(3)));
    }
    legend_and_present(root, chart, position, err)
}

/// Lines with points, one per `(legend, points)`, on linear axes from 0; `x_desc` and `y_desc`
/// name the quantities with their units.
pub fn line_chart(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[(String, Vec<(f64, f64)>)],
) -> Result<(), PlotError> {
    let pts = || series.iter().flat_map(|s| s.1.iter());
    let x_max = axis_max(pts().map(|p| p.0).fold(0.0, f64::max));
    let y_max = axis_max(pts().map(|p| p.1).fold(0.0, f64::max));
    let root = canvas(path)?;
    let chart = builder(&root, title, (50, 70))
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(|e| draw_err(path)(&e))?;
    lines(path, &root, chart, (x_desc, y_desc), series, None, SeriesLabelPosition::LowerRight)
}

/// Cumulative distributions, one line per `(legend, points)` of `(value, fraction)`, on a
/// logarithmic value axis, so a configuration whose latencies are a hundred times another's
/// still shows both shapes. Values at or below zero are drawn at the axis' left end.
pub fn cdf_chart(
    path: &Path,
    title: &str,
    x_desc: &str,
    series: &[(String, Vec<(f64, f64)>)],
) -> Result<(), PlotError> {
    let xs = || series.iter().flat_map(|s| s.1.iter()).map(|p| p.0);
    let x_min = xs().filter(|x| *x > 0.0).fold(f64::INFINITY, f64::min);
    let x_min = if x_min.is_finite() { x_min / 2.0 } else { 1e-3 };
    let x_max = xs().fold(0.0, f64::max).max(x_min * 10.0) * 1.5;
    let root = canvas(path)?;
    let chart = builder(&root, title, (50, 70))
        .build_cartesian_2d((x_min..x_max).log_scale(), 0.0..1.05)
        .map_err(|e| draw_err(path)(&e))?;
    let x_desc = format!("{x_desc}, log scale");
    let y_desc = "fraction of samples";
    lines(
        path,
        &root,
        chart,
        (&x_desc, y_desc),
        series,
        Some(x_min),
        SeriesLabelPosition::UpperLeft,
    )
}

/// A value with three significant figures at most, for bar labels.
pub fn format_value(v: f64) -> String {
    let a = v.abs();
    if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_labels_keep_three_figures() {
        let labels = [1234.5, 12.345, 1.2345, 0.012345].map(format_value);
        assert_eq!(labels, ["1234", "12.3", "1.23", "0.012"]);
    }

    /// The legend (upper right) hides neither the rightmost bar, the tallest here, nor the
    /// value written above it: down the bar's middle column the legend's lowest border row
    /// comes at least a text line above the bar's first row.
    #[test]
    fn the_legend_leaves_the_tallest_bar_and_its_value_free() {
        if font_path().is_none() {
            eprintln!("SKIP: no TrueType font on this machine (scripts/setup.sh installs one)");
            return;
        }
        for n in [3usize, 5] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("bars.png");
            let bars: Vec<(String, f64)> = (0..n)
                .map(|i| (format!("({i}) a configuration"), 50.0 + 10.0 * i as f64))
                .collect();
            bar_chart(&path, "Pods created per second (burst)", "pods/s", &bars).unwrap();
            let img = image::open(&path).unwrap().to_rgb8();
            let c = colour(n - 1);
            let bar = image::Rgb([c.0, c.1, c.2]);
            // The last bar's middle column: find it as the column of bar pixels furthest right.
            let x = (0..img.width())
                .rev()
                .find(|&x| (0..img.height()).any(|y| *img.get_pixel(x, y) == bar))
                .expect("the last bar is drawn")
                - 20;
            let top = (0..img.height()).find(|&y| *img.get_pixel(x, y) == bar).unwrap();
            let dark = |p: &image::Rgb<u8>| p.0.iter().all(|&v| v < 60);
            let legend_bottom = (0..top)
                .rev()
                .find(|&y| dark(img.get_pixel(x, y)))
                .expect("the legend spans the last bar's column");
            assert!(
                top >= legend_bottom + 24,
                "{n} bars: bar top at row {top}, legend's bottom at row {legend_bottom}"
            );
        }
    }

    #[test]
    fn draws_charts_with_text_when_a_font_exists() {
        if font_path().is_none() {
            eprintln!("SKIP: no TrueType font on this machine (scripts/setup.sh installs one)");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let bars = dir.path().join("bars.png");
        bar_chart(&bars, "Pods created/s", "pods/s", &[("a".into(), 10.0), ("b".into(), 25.5)])
            .unwrap();
        let lines = dir.path().join("lines.png");
        let series = vec![("c".to_string(), vec![(0.1, 0.5), (0.3, 1.0)])];
        line_chart(&lines, "lines", "time (s)", "fraction", &series).unwrap();
        let cdf = dir.path().join("cdf.png");
        let series = vec![("c".to_string(), vec![(0.0, 0.2), (0.01, 0.5), (3.0, 1.0)])];
        cdf_chart(&cdf, "CDF", "latency (s)", &series).unwrap();
        for p in [bars, lines, cdf] {
            assert_eq!(&std::fs::read(&p).unwrap()[..8], b"\x89PNG\r\n\x1a\n");
        }
    }
}
