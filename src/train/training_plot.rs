//! A training stage's plot (`training_plot.svg`): its latest run's metrics, one panel per
//! quantity, a line per agent.
use anyhow::Result;
use serde_json::Value;

use crate::run::RunDir;

/// The plot of this stage's latest run in metrics.jsonl (from its last "start" line, the
/// newest line of each update): eval reward, then every per-update series a stage logs under
/// the plotted prefixes, one panel per quantity with a line per agent.
pub fn training_plot(run_dir: &RunDir, stage: &str) -> Result<String> {
    let text = std::fs::read_to_string(run_dir.metrics()).unwrap_or_default();
    let lines: Vec<Value> = text.lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()).collect();
    let mine = |v: &&Value| v["stage"] == stage;
    let start = lines.iter().rposition(|v| mine(&v) && v["event"] == "start").unwrap_or(0);
    // (quantity, series) -> update -> value, later lines replacing earlier ones.
    let mut points: std::collections::BTreeMap<(String, String), std::collections::BTreeMap<u64, f64>> =
        Default::default();
    // The evaluations' standard errors, drawn as a band around their means.
    let mut eval_stderr: std::collections::BTreeMap<u64, f64> = Default::default();
    for v in lines[start..].iter().filter(mine).filter(|v| v.get("event").is_none()) {
        let Some(update) = v["update"].as_u64() else { continue };
        // A multi-turn evaluation's reward is its histories' score; one turn's, turn 1's.
        let (mean_key, stderr_key) = match v.get("eval/history_reward_mean") {
            Some(_) => ("eval/history_reward_mean", "eval/history_reward_stderr"),
            None => ("eval/turn_1/reward_mean", "eval/turn_1/reward_stderr"),
        };
        for (k, x) in v.as_object().into_iter().flatten() {
            let Some(x) = x.as_f64() else { continue };
            let (quantity, series) = match k.as_str() {
                k if k == stderr_key => {
                    eval_stderr.insert(update, x);
                    continue;
                }
                k if k == mean_key => (EVAL_REWARD.to_string(), "reward".to_string()),
                k if k.starts_with("eval/agent_") => {
                    let (agent, what) = k["eval/".len()..].split_once('/').unwrap_or((k, ""));
                    (format!("eval {}", what.replace('_', " ")), agent.to_string())
                }
                k if PLOTTED.iter().any(|p| k.starts_with(p)) => match k.rsplit_once("/agent_") {
                    Some((q, a)) => (q.to_string(), format!("agent_{a}")),
                    None => (k.to_string(), k.rsplit('/').next().unwrap_or(k).to_string()),
                },
                _ => continue,
            };
            points.entry((quantity, series)).or_default().insert(update, x);
        }
    }
    let mut panels: Vec<crate::plot::Panel> = Vec::new();
    for ((quantity, name), pts) in points {
        let mut series = crate::plot::Series::line(name, pts.iter().map(|(&u, &x)| (u as f64, x)).collect());
        if quantity == EVAL_REWARD {
            series.band = Some(pts.keys().map(|u| eval_stderr.get(u).copied().unwrap_or(0.0)).collect());
        }
        match panels.iter_mut().find(|p| p.title == quantity) {
            Some(p) => p.series.push(series),
            None => panels.push(crate::plot::Panel { title: quantity, series: vec![series] }),
        }
    }
    // Eval reward first.
    panels.sort_by_key(|p| p.title != EVAL_REWARD);
    Ok(crate::plot::line_panels(&format!("{stage}: {}", crate::plot::short_path(&run_dir.root)), "update", &panels))
}

/// The evaluations' panel: their mean reward, the band ± its standard error over prompts.
const EVAL_REWARD: &str = "eval reward (mean; band: ± s.e. over prompts)";

/// The per-update metrics the training plot shows (besides the evaluations).
const PLOTTED: &[&str] = &[
    "madpo/loss",
    "madpo/joint_margin_mean",
    "madpo/winner_tokens",
    "madpo/loser_tokens",
    "madpo/winner_shorter",
    "madpo/implied_kl",
    "rm/loss",
    "rm/accuracy",
    "rm/eval_accuracy",
    "rm/eval_margin_mean",
    "turn_1/reward_mean",
    "turn_1/reference_kl_mean",
    "marlhf/loss",
];
