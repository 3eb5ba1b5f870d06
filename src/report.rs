//! What iterate reports of each finished round: its `iter/*` metrics line in metrics.jsonl and
//! the plot of every round's evaluation (`iterate/eval_reward.svg`).
use anyhow::Result;
use serde_json::json;

use crate::algo::trend::RoundTrend;
use crate::plot::{line_panels, short_path, Panel, Series};
use crate::run::iterate_log::RoundSummary;
use crate::run::{atomic_write, RunDir};

/// Round `s`'s metrics line; `total_pairs`: the pairs of every round file so far, this round's
/// included.
pub fn log_round_metrics(run_dir: &RunDir, s: &RoundSummary, total_pairs: usize) -> Result<()> {
    let trend = |pick: fn(&RoundTrend) -> [f64; 2]| s.trend.as_ref().map(pick);
    run_dir.log_metrics(&json!({
        "stage": "iterate", "time": chrono::Utc::now().to_rfc3339(),
        "iter/current_iteration": s.round, "iter/current_preference_pairs": s.pairs,
        "iter/total_preference_pairs": total_pairs, "iter/train_preference_pairs": s.train_pairs,
        "iter/current_wins": s.current_wins, "iter/comparator_wins": s.comparator_wins,
        "iter/current_reward_mean": s.current_reward_mean, "iter/comparator_reward_mean": s.comparator_reward_mean,
        "iter/eval_reward_mean": s.eval_reward_mean, "iter/eval_reward_stderr": s.eval_reward_stderr,
        "iter/round_s": s.collect_s + s.train_s + s.eval_s, "iter/comparator_unparsed": s.comparator_unparsed,
        "iter/comparator_truncated": s.comparator_truncated,
        "iter/eval_gain": trend(|t| t.gain).map(|v| v[0]), "iter/eval_gain_stderr": trend(|t| t.gain).map(|v| v[1]),
        "iter/eval_gain_after_round_1": trend(|t| t.gain_after_round_1).map(|v| v[0]),
        "iter/eval_gain_after_round_1_stderr": trend(|t| t.gain_after_round_1).map(|v| v[1]),
        "iter/eval_slope": trend(|t| t.slope_per_round).map(|v| v[0]),
        "iter/eval_slope_stderr": trend(|t| t.slope_per_round).map(|v| v[1]),
    }))
}

/// The evaluations of `rounds` (round 0: the base team) as mean ± s.e. over the eval prompts,
/// titled with the slope over the rounds of the last one's trend.
pub fn write_rounds_plot(run_dir: &RunDir, rounds: &[RoundSummary]) -> Result<()> {
    // (round, mean, s.e.) of every evaluated round
    let evaluated: Vec<(f64, f64, f64)> = rounds
        .iter()
        .filter_map(|r| r.eval_reward_mean.map(|m| (r.round as f64, m, r.eval_reward_stderr.unwrap_or(0.0))))
        .collect();
    let series = Series {
        name: "eval reward".into(),
        points: evaluated.iter().map(|&(x, m, _)| (x, m)).collect(),
        band: Some(evaluated.iter().map(|&(_, _, se)| se).collect()),
    };
    let panel = Panel { title: "eval reward (mean; band: ± s.e. over prompts)".into(), series: vec![series] };
    let title = match rounds.last().and_then(|r| r.trend.as_ref()) {
        Some(t) => format!(
            "pbrl iterate: {} (slope {:+.3} ± {:.3} per round)",
            short_path(&run_dir.root),
            t.slope_per_round[0],
            t.slope_per_round[1]
        ),
        None => format!("pbrl iterate: {}", short_path(&run_dir.root)),
    };
    atomic_write(&run_dir.iterate_plot(), line_panels(&title, "round", &[panel]).as_bytes())
}
