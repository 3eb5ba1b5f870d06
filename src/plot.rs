//! SVG line charts for the run directory, drawn with `plotters`' SVG backend: one chart per
//! quantity, stacked under a title, each with ticks and rounded labels on both axes, its series
//! as lines (the points of a short one marked) and an optional ± band around a series.
use plotters::prelude::*;

/// One series: a name, its (x, y) points and, optionally, a half-width per point drawn as a
/// band around it (a standard error).
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    pub band: Option<Vec<f64>>,
}

impl Series {
    pub fn line(name: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Self { name: name.into(), points, band: None }
    }
}

/// One chart: a title and its series.
pub struct Panel {
    pub title: String,
    pub series: Vec<Series>,
}

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];
const WIDTH: u32 = 640;
const PANEL_HEIGHT: u32 = 220;
const TITLE_HEIGHT: u32 = 28;
const TITLE_FONT: u32 = 14;
/// Series of at most this many points have each point marked.
const MARKED_POINTS: usize = 30;

/// The panels stacked into one SVG under `title`, sharing the x label; panels without finite
/// points are left out.
pub fn line_panels(title: &str, x_label: &str, panels: &[Panel]) -> String {
    let panels: Vec<&Panel> = panels.iter().filter(|p| p.series.iter().any(|s| finite(s).next().is_some())).collect();
    let height = TITLE_HEIGHT + PANEL_HEIGHT * panels.len().max(1) as u32;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        // Drawing into a String cannot fail but for a bad range, which `axis_range` rules out.
        let _ = draw(&root, title, x_label, &panels);
        let _ = root.present();
    }
    svg.truncate(svg.trim_end().len());
    svg.push('\n');
    svg
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

fn draw(root: &Area, title: &str, x_label: &str, panels: &[&Panel]) -> Result<(), Box<dyn std::error::Error>> {
    root.fill(&WHITE)?;
    let (head, body) = root.split_vertically(TITLE_HEIGHT);
    head.draw(&Text::new(fit(title, WIDTH - 16, TITLE_FONT), (8, 8), ("sans-serif", TITLE_FONT).into_font()))?;
    for (panel, area) in panels.iter().zip(body.split_evenly((panels.len().max(1), 1))) {
        draw_panel(&area, panel, x_label)?;
    }
    Ok(())
}

fn draw_panel(area: &Area, panel: &Panel, x_label: &str) -> Result<(), Box<dyn std::error::Error>> {
    let xs: Vec<f64> = panel.series.iter().flat_map(|s| finite(s).map(|p| p.0)).collect();
    let ys: Vec<f64> = panel
        .series
        .iter()
        .flat_map(|s| finite_with_band(s).flat_map(|(p, h)| [p.1 - h, p.1 + h]))
        .filter(|y| y.is_finite())
        .collect();
    let (x_lo, x_hi) = axis_range(&xs, 0.0);
    let (x_lo, x_hi) = match xs.iter().all(|x| x.fract() == 0.0) {
        true => (x_lo.floor(), x_hi.ceil()),
        false => (x_lo, x_hi),
    };
    let (y_lo, y_hi) = axis_range(&ys, 0.08);
    let mut chart = ChartBuilder::on(area)
        .caption(fit(&panel.title, WIDTH - 80, 12), ("sans-serif", 12))
        .margin(8)
        .x_label_area_size(34)
        .y_label_area_size(56)
        .build_cartesian_2d(x_lo..x_hi, y_lo..y_hi)?;
    // Steps, rounds and evaluations are counts: their axis is labelled at whole numbers only.
    let whole = xs.iter().all(|x| x.fract() == 0.0);
    let x_labels = if whole { ((x_hi - x_lo).round() as usize + 1).clamp(2, 9) } else { 9 };
    let (x_step, y_step) = ((x_hi - x_lo) / (x_labels - 1) as f64, (y_hi - y_lo) / 5.0);
    chart
        .configure_mesh()
        .x_labels(x_labels)
        .y_labels(6)
        .x_label_formatter(&|v| tick_label(*v, x_step))
        .y_label_formatter(&|v| tick_label(*v, y_step))
        .x_desc(x_label)
        .light_line_style(WHITE.mix(0.0))
        .label_style(("sans-serif", 10))
        .draw()?;
    for (j, s) in panel.series.iter().enumerate() {
        let color = COLORS[j % COLORS.len()];
        if s.band.is_some() {
            let pts: Vec<((f64, f64), f64)> = finite_with_band(s).collect();
            let upper = pts.iter().map(|&((x, y), h)| (x, y + h));
            let lower = pts.iter().rev().map(|&((x, y), h)| (x, y - h));
            chart
                .draw_series(std::iter::once(Polygon::new(upper.chain(lower).collect::<Vec<_>>(), color.mix(0.18))))?;
        }
        let pts: Vec<(f64, f64)> = finite(s).collect();
        // A few points (evaluations, rounds) are marked each, so a reader sees where they lie.
        if pts.len() <= MARKED_POINTS {
            chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
        }
        let drawn = chart.draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))?;
        if panel.series.len() > 1 {
            drawn
                .label(&s.name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 14, y)], color.stroke_width(2)));
        }
    }
    if panel.series.len() > 1 {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.3))
            .label_font(("sans-serif", 10))
            .draw()?;
    }
    Ok(())
}

fn finite(s: &Series) -> impl Iterator<Item = (f64, f64)> + '_ {
    s.points.iter().copied().filter(|(x, y)| x.is_finite() && y.is_finite())
}

/// The finite points with their band's half-width (0 without a band, or where it is not finite).
fn finite_with_band(s: &Series) -> impl Iterator<Item = ((f64, f64), f64)> + '_ {
    s.points.iter().enumerate().filter(|(_, (x, y))| x.is_finite() && y.is_finite()).map(|(i, &p)| {
        let h = s.band.as_ref().and_then(|b| b.get(i)).copied().filter(|h| h.is_finite()).unwrap_or(0.0);
        (p, h.abs())
    })
}

/// An axis over `values`, widened by `pad` of its span on each side; a single value (or none)
/// gets a span of its own, so a lone point sits inside the axis, not on its edge.
fn axis_range(values: &[f64], pad: f64) -> (f64, f64) {
    let (lo, hi) = values.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &v| (a.min(v), b.max(v)));
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    let span = hi - lo;
    if span <= 1e-12 * lo.abs().max(1.0) {
        let half = (lo.abs() * 0.1).max(0.5);
        return (lo - half, hi + half);
    }
    (lo - pad * span, hi + pad * span)
}

/// A tick's label, rounded to the digits the tick spacing `step` shows (trailing zeros dropped),
/// or in scientific notation for very large or small values.
fn tick_label(v: f64, step: f64) -> String {
    let magnitude = v.abs().max(step.abs());
    if magnitude != 0.0 && !(1e-3..1e6).contains(&magnitude) {
        return format!("{v:.1e}");
    }
    let digits = if step > 0.0 { (-step.log10().floor()).clamp(0.0, 6.0) as usize + 1 } else { 3 };
    let s = format!("{v:.digits$}");
    let s = if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s };
    if s == "-0" {
        "0".into()
    } else {
        s
    }
}

/// A run directory as a chart's title names it: whole when short, else its last two components
/// (`…/runs/quickstart-20261207T120000Z`), so that the figures beside it in the title fit.
pub fn short_path(path: &std::path::Path) -> String {
    let full = path.display().to_string();
    if full.chars().count() <= 40 {
        return full;
    }
    let tail: Vec<String> = path.iter().rev().take(2).map(|c| c.to_string_lossy().into_owned()).collect();
    format!("…/{}", tail.into_iter().rev().collect::<Vec<_>>().join("/"))
}

/// `text` cut to what fits in `width` pixels at `font_size` (plotters draws it at
/// `font_size / 1.24` pixels, about 0.55 em a character in a sans-serif font), its middle
/// replaced by an ellipsis.
fn fit(text: &str, width: u32, font_size: u32) -> String {
    let max = ((width as f64) / (0.55 * font_size as f64 / 1.24)) as usize;
    let chars: Vec<char> = text.chars().collect();
    if chars.len() <= max || max < 8 {
        return text.to_string();
    }
    let keep = max - 1;
    let (head, tail) = (keep / 2, keep - keep / 2);
    chars[..head].iter().chain(std::iter::once(&'…')).chain(&chars[chars.len() - tail..]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panels_draw_their_series_and_skip_empty_ones() {
        let p = vec![
            Panel {
                title: "eval <reward>".into(),
                series: vec![Series {
                    name: "mean".into(),
                    points: vec![(0.0, 0.5), (10.0, 0.7)],
                    band: Some(vec![0.05, 0.04]),
                }],
            },
            Panel { title: "empty".into(), series: vec![Series::line("none", vec![(1.0, f64::NAN)])] },
            Panel {
                title: "lengths".into(),
                series: vec![Series::line("a", vec![(1.0, 3.0)]), Series::line("b", vec![(1.0, 2.0), (2.0, 4.0)])],
            },
        ];
        let s = line_panels("run", "update", &p);
        assert!(s.starts_with("<svg") && s.ends_with("</svg>\n"), "{s}");
        assert!(s.contains("eval &lt;reward&gt;") && !s.contains("\nempty\n"));
        assert!(s.matches("<polyline").count() >= 2, "the two lines");
        assert_eq!(s.matches("<polygon").count(), 1, "one band");
        assert_eq!(s.matches("<circle").count(), 2 + 1 + 2, "each point of a short series marked");
        assert!(s.contains("\nupdate\n"), "the x label");
    }

    #[test]
    fn tick_labels_are_rounded_to_their_spacing() {
        assert_eq!(tick_label(0.30000000000000004, 0.1), "0.3");
        assert_eq!(tick_label(549.969, 100.0), "550");
        assert_eq!(tick_label(12.0, 2.0), "12");
        assert_eq!(tick_label(-0.0001, 0.05), "0");
        assert_eq!(tick_label(0.425, 0.025), "0.425");
        assert_eq!(tick_label(2.5e-5, 1e-5), "2.5e-5");
    }

    #[test]
    fn a_lone_point_sits_inside_its_axis_and_long_titles_fit() {
        let (lo, hi) = axis_range(&[1.0], 0.0);
        assert!(lo < 1.0 && hi > 1.0 && ((lo + hi) / 2.0 - 1.0).abs() < 1e-12);
        assert_eq!(axis_range(&[], 0.0), (0.0, 1.0));
        let title = format!("pbrl eval: /{}/run: base 0.400 -> current 0.800", "very-long-directory".repeat(10));
        let cut = fit(&title, WIDTH - 16, TITLE_FONT);
        assert!(cut.chars().count() <= 101 && cut.contains('…') && cut.ends_with("current 0.800"), "{cut}");
        assert_eq!(fit("short", 600, 14), "short");
        assert_eq!(short_path(std::path::Path::new("runs/q")), "runs/q");
        let long = std::path::Path::new("/home/someone/work/projects/pbrl/runs/quickstart-20261207T120000Z");
        assert_eq!(short_path(long), "…/runs/quickstart-20261207T120000Z");
    }
}
