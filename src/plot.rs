//! Small self-contained SVG line charts for the run directory (no plotting dependency): one
//! panel per quantity, stacked, each series a polyline over a shared x axis (update steps).
use std::fmt::Write;

/// One panel: a title and its series, each a name and (x, y) points.
pub struct Panel {
    pub title: String,
    pub series: Vec<(String, Vec<(f64, f64)>)>,
}

const COLORS: [&str; 6] = ["steelblue", "darkorange", "seagreen", "crimson", "purple", "saddlebrown"];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

fn label(x: f64) -> String {
    if x == 0.0 || (x.abs() >= 0.01 && x.abs() < 1e4) {
        format!("{:.3}", x).trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        format!("{x:.2e}")
    }
}

/// The panels stacked into one SVG, x from 0 to the largest x of any series; panels without
/// points are left out, finite points only.
pub fn line_panels(title: &str, x_label: &str, panels: &[Panel]) -> String {
    let (w, ph, left, right, top) = (520.0, 120.0, 52.0, 12.0, 22.0);
    let panels: Vec<&Panel> = panels
        .iter()
        .filter(|p| p.series.iter().any(|(_, pts)| pts.iter().any(|(x, y)| x.is_finite() && y.is_finite())))
        .collect();
    let h = top + panels.len() as f64 * (ph + 26.0) + 16.0;
    let x_max = panels
        .iter()
        .flat_map(|p| p.series.iter().flat_map(|(_, pts)| pts.iter().map(|p| p.0)))
        .filter(|x| x.is_finite())
        .fold(1.0f64, f64::max);
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif">"#
    );
    let _ = write!(s, r#"<text x="{left}" y="14" font-size="11">{}</text>"#, esc(title));
    for (k, panel) in panels.iter().enumerate() {
        let y0 = top + k as f64 * (ph + 26.0) + 12.0;
        let ys: Vec<f64> =
            panel.series.iter().flat_map(|(_, p)| p.iter().map(|p| p.1)).filter(|y| y.is_finite()).collect();
        let (mut lo, mut hi) = ys.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &y| (a.min(y), b.max(y)));
        if hi - lo < 1e-12 {
            (lo, hi) = (lo - 0.5, hi + 0.5);
        }
        let px = |x: f64| left + (w - left - right) * x / x_max;
        let py = |y: f64| y0 + ph - ph * (y - lo) / (hi - lo);
        let _ = write!(s, r#"<text x="{left}" y="{}" font-size="10">{}</text>"#, y0 - 3.0, esc(&panel.title));
        let _ = write!(
            s,
            r#"<rect x="{left}" y="{y0}" width="{}" height="{ph}" fill="none" stroke="gray" stroke-width="0.5"/>"#,
            w - left - right
        );
        let _ = write!(
            s,
            r#"<text x="{}" y="{}" font-size="8" text-anchor="end">{}</text>"#,
            left - 3.0,
            y0 + 8.0,
            label(hi)
        );
        let _ = write!(
            s,
            r#"<text x="{}" y="{}" font-size="8" text-anchor="end">{}</text>"#,
            left - 3.0,
            y0 + ph,
            label(lo)
        );
        let _ = write!(s, r#"<text x="{left}" y="{}" font-size="8">0</text>"#, y0 + ph + 10.0);
        let _ = write!(
            s,
            r#"<text x="{}" y="{}" font-size="8" text-anchor="end">{} {}</text>"#,
            w - right,
            y0 + ph + 10.0,
            esc(x_label),
            label(x_max)
        );
        for (j, (name, pts)) in panel.series.iter().enumerate() {
            let color = COLORS[j % COLORS.len()];
            let pts: Vec<String> = pts
                .iter()
                .filter(|(x, y)| x.is_finite() && y.is_finite())
                .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
                .collect();
            if pts.len() == 1 {
                let (x, y) = pts[0].split_once(',').expect("x,y");
                let _ = write!(s, r#"<circle cx="{x}" cy="{y}" r="2" fill="{color}"/>"#);
            } else {
                let _ = write!(
                    s,
                    r#"<polyline fill="none" stroke="{color}" stroke-width="1.2" points="{}"/>"#,
                    pts.join(" ")
                );
            }
            let _ = write!(
                s,
                r#"<text x="{}" y="{}" font-size="8" fill="{color}">{}</text>"#,
                left + 4.0 + 110.0 * j as f64,
                y0 + 9.0,
                esc(name)
            );
        }
    }
    s + "</svg>\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panels_draw_their_series_and_skip_empty_ones() {
        let p = vec![
            Panel { title: "eval <reward>".into(), series: vec![("mean".into(), vec![(0.0, 0.5), (10.0, 0.7)])] },
            Panel { title: "empty".into(), series: vec![("none".into(), vec![(1.0, f64::NAN)])] },
            Panel {
                title: "lengths".into(),
                series: vec![("a".into(), vec![(1.0, 3.0)]), ("b".into(), vec![(1.0, 2.0), (2.0, 4.0)])],
            },
        ];
        let s = line_panels("run", "update", &p);
        assert!(s.starts_with("<svg") && s.ends_with("</svg>\n"));
        assert!(s.contains("eval &lt;reward&gt;") && !s.contains(">empty<"));
        assert_eq!(s.matches("<polyline").count(), 2);
        assert_eq!(s.matches("<circle").count(), 1);
    }
}
