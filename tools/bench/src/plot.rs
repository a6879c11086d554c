//! PNG plots drawn without text (no font is needed on the machine): axes, a light grid and
//! coloured lines. What each axis and colour means is written next to the image in the report.

use std::path::Path;

use plotters::prelude::*;

/// Pixel size of every plot.
const SIZE: (u32, u32) = (800, 500);
/// Grid lines per axis.
const GRID_LINES: usize = 10;

/// A plot could not be drawn or written.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// The drawing backend failed (usually writing the PNG file).
    #[error("drawing {path}: {message}")]
    Draw {
        /// File being drawn.
        path: String,
        /// The backend's message.
        message: String,
    },
}

/// Colour of the first, second, … series (blue, red, green, grey).
pub const SERIES_COLOURS: [RGBColor; 4] =
    [RGBColor(31, 119, 180), RGBColor(214, 39, 40), RGBColor(44, 160, 44), RGBColor(127, 127, 127)];

/// Draws `series` (each a list of `(x, y)` points) as lines on linear axes from 0 to `x_max` and
/// 0 to `y_max`, series `i` in [`SERIES_COLOURS`]`[i % 4]`, grid lines every tenth of each axis.
pub fn line_plot(
    path: &Path,
    x_max: f64,
    y_max: f64,
    series: &[Vec<(f64, f64)>],
) -> Result<(), PlotError> {
    let err = |e: &dyn std::fmt::Display| PlotError::Draw {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    let x_max = if x_max > 0.0 && x_max.is_finite() { x_max } else { 1.0 };
    let y_max = if y_max > 0.0 && y_max.is_finite() { y_max } else { 1.0 };
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .margin(20)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(|e| err(&e))?;
    let grid = RGBColor(225, 225, 225);
    for i in 0..=GRID_LINES {
        let fx = x_max * i as f64 / GRID_LINES as f64;
        let fy = y_max * i as f64 / GRID_LINES as f64;
        let (colour, width) = if i == 0 { (BLACK, 2) } else { (grid, 1) };
        chart
            .draw_series([
                PathElement::new(vec![(fx, 0.0), (fx, y_max)], colour.stroke_width(width)),
                PathElement::new(vec![(0.0, fy), (x_max, fy)], colour.stroke_width(width)),
            ])
            .map_err(|e| err(&e))?;
    }
    for (i, points) in series.iter().enumerate() {
        let colour = SERIES_COLOURS[i % SERIES_COLOURS.len()];
        chart
            .draw_series(LineSeries::new(points.iter().copied(), colour.stroke_width(3)))
            .map_err(|e| err(&e))?;
        chart
            .draw_series(points.iter().map(|&p| Circle::new(p, 3, colour.filled())))
            .map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_png() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.png");
        line_plot(&path, 4.0, 100.0, &[vec![(1.0, 20.0), (2.0, 40.0), (4.0, 70.0)], vec![]])
            .unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        // Degenerate ranges still draw instead of failing.
        line_plot(&path, 0.0, f64::NAN, &[]).unwrap();
        assert!(line_plot(&dir.path().join("missing/dir/p.png"), 1.0, 1.0, &[]).is_err());
    }
}
