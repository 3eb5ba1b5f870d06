//! Per-round reward histograms (reference §9): 16 bins over `reward_range`, values clipped into
//! the range, written as JSON with a small SVG bar chart beside it.
use serde_json::{json, Value};

pub const NUM_BINS: usize = 16;

/// Counts of `values` in `NUM_BINS` equal bins over [min, max] (numpy.histogram semantics: the
/// last bin includes max; values are clipped into the range first).
pub fn histogram(values: &[f64], (min, max): (f64, f64)) -> (Vec<f64>, Vec<usize>) {
    let edges: Vec<f64> = (0..=NUM_BINS).map(|i| min + (max - min) * i as f64 / NUM_BINS as f64).collect();
    let mut counts = vec![0usize; NUM_BINS];
    for &v in values.iter().filter(|v| v.is_finite()) {
        let v = v.clamp(min, max);
        let mut bin = ((v - min) / (max - min) * NUM_BINS as f64).floor() as usize;
        bin = bin.min(NUM_BINS - 1);
        counts[bin] += 1;
    }
    (edges, counts)
}

fn series(values: &[f64], range: (f64, f64)) -> Value {
    let finite: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    let mean = if finite.is_empty() { Value::Null } else { json!(finite.iter().sum::<f64>() / finite.len() as f64) };
    let (_, counts) = histogram(&finite, range);
    json!({"sample_count": finite.len(), "mean": mean, "counts": counts, "raw_rewards": finite})
}

/// The round's distribution record (`reward_distributions/iteration_NNNN.json`) of the current
/// team (`target`) only: a collection round.
pub fn distribution_record(iteration: u32, range: (f64, f64), candidates: &[f64], selected: &[f64]) -> Value {
    record(iteration, range, &[("target", candidates)], &[("target", selected)])
}

/// The same record for an iterative round: the current team's (`target`) and the comparator's
/// rewards, each side a series (reference §9).
pub fn comparison_record(iteration: u32, range: (f64, f64), candidates: [&[f64]; 2], selected: [&[f64]; 2]) -> Value {
    let c = [("target", candidates[0]), ("comparator", candidates[1])];
    let s = [("target", selected[0]), ("comparator", selected[1])];
    record(iteration, range, &c, &s)
}

fn record(iteration: u32, range: (f64, f64), candidates: &[(&str, &[f64])], selected: &[(&str, &[f64])]) -> Value {
    let (edges, _) = histogram(&[], range);
    let centers: Vec<f64> = edges.windows(2).map(|w| (w[0] + w[1]) / 2.0).collect();
    let sides = |s: &[(&str, &[f64])]| -> serde_json::Map<String, Value> {
        s.iter().map(|(name, v)| (name.to_string(), series(v, range))).collect()
    };
    json!({
        "iteration": iteration, "reward_min": range.0, "reward_max": range.1, "num_bins": NUM_BINS,
        "bin_edges": edges, "bin_centers": centers,
        "candidate": sides(candidates), "selected": sides(selected),
    })
}

/// Tick label: integers plainly, otherwise up to 3 decimals, two significant digits below 0.1.
pub fn tick_label(x: f64) -> String {
    if x == x.trunc() {
        format!("{}", x as i64)
    } else if x.abs() < 0.1 {
        format!("{x:.3}")
    } else {
        let s = format!("{x:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// A 240×80 bar chart of the candidate histogram.
pub fn svg(title: &str, range: (f64, f64), counts: &[usize]) -> String {
    let (w, h, pad) = (240.0, 80.0, 14.0);
    let max = counts.iter().copied().max().unwrap_or(0).max(1) as f64;
    let bw = (w - 2.0 * pad) / counts.len().max(1) as f64;
    let mut s = format!(r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}">"#);
    let esc = title.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
    s += &format!(r#"<text x="{pad}" y="10" font-size="9">{esc}</text>"#);
    for (i, &c) in counts.iter().enumerate() {
        let bh = (h - 2.0 * pad - 4.0) * c as f64 / max;
        let x = pad + i as f64 * bw;
        s += &format!(
            r#"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{bh:.1}" fill="steelblue"/>"#,
            h - pad - bh,
            bw - 1.0
        );
    }
    s += &format!(r#"<text x="{pad}" y="{}" font-size="8">{}</text>"#, h - 3.0, tick_label(range.0));
    s += &format!(
        r#"<text x="{}" y="{}" font-size="8" text-anchor="end">{}</text>"#,
        w - pad,
        h - 3.0,
        tick_label(range.1)
    );
    s + "</svg>\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_uses_17_edges_clips_and_counts_everything() {
        let (edges, counts) = histogram(&[-5.0, 0.0, 0.5, 1.0, 7.0, f64::NAN], (0.0, 1.0));
        assert_eq!(edges.len(), 17);
        assert_eq!(edges[8], 0.5);
        assert_eq!(counts.iter().sum::<usize>(), 5, "NaN left out, everything else counted");
        assert_eq!(counts[0], 2); // -5 clipped to 0, and 0
        assert_eq!(counts[8], 1); // 0.5 opens bin 8
        assert_eq!(counts[15], 2); // 1.0 and 7 clipped: the last bin includes max
    }

    #[test]
    fn tick_labels() {
        assert_eq!(tick_label(2.0), "2");
        assert_eq!(tick_label(1.5), "1.5");
        assert_eq!(tick_label(0.25), "0.25");
        assert_eq!(tick_label(0.05), "0.050");
    }

    #[test]
    fn svg_escapes_the_title() {
        let s = svg("a<b & c", (0.0, 1.0), &[1, 0, 3]);
        assert!(s.contains("a&lt;b &amp; c") && s.starts_with("<svg") && s.matches("<rect").count() == 3);
    }
}
