//! A run directory's evaluations: `evaluate_run` evaluates one of its teams and records it
//! (`eval/eval-<UTC time>.json`, a metrics line, the plot); `EvalHistory` reads them back, oldest
//! first, for the gain over the first evaluation paired by prompt and the plot.
use anyhow::{Context, Result};
use serde_json::json;

use super::{eval_items, evaluate, Evaluation};
use crate::algo::trend::{paired_gain, MeanSe};
use crate::config::EvaluationConfig;
use crate::oracle::Oracle;
use crate::run::iterate_log::RoundEval;
use crate::run::{atomic_create, atomic_write, RunDir};
use crate::team::{load_members, Members};

/// One `pbrl eval` report as the history reads it.
pub struct PastEval {
    pub team: String,
    pub reward_mean: f64,
    pub reward_stderr: f64,
    /// Each item's mean over its samples, with the item (what pairs two evaluations).
    pub item_means: Vec<(String, f64)>,
    pub samples_per_item: u64,
}

/// An evaluation of a run directory's team, recorded there.
pub struct RunEvaluation {
    pub evaluation: Evaluation,
    /// Each eval item's mean reward over its samples, in the eval file's order.
    pub item_means: Vec<f64>,
    /// The report written (`eval/eval-<time>.json`).
    pub path: std::path::PathBuf,
    /// The run directory's evaluations so far, this one last.
    pub history: EvalHistory,
}

impl RunEvaluation {
    pub fn mean(&self) -> f64 {
        self.evaluation.reward_mean()
    }
}

/// Evaluate a team of the run directory (`members`) on the eval items, and record it there: the
/// report `eval/eval-<UTC time>.json` (every joint response), a metrics line, and the plot of
/// the run directory's evaluations so far (`eval/eval_reward.svg`).
pub fn evaluate_run(cfg: &EvaluationConfig, run_dir: &RunDir, members: &Members) -> Result<RunEvaluation> {
    let items = eval_items(&cfg.split)?.context("eval_num_samples is 0: nothing to evaluate")?;
    let mut oracle = Oracle::new(&cfg.oracle)?;
    let team = load_members(&cfg.team, run_dir, members)?;
    let started = std::time::Instant::now();
    let evaluation = evaluate(&cfg.eval, &team, &items, &mut oracle, cfg.seed)?;
    let team_label = match members {
        Members::Base => "base".to_string(),
        Members::Current if run_dir.agents().is_dir() => "agents".to_string(),
        Members::Current => "base".to_string(),
        Members::Saved(dir) => dir.display().to_string(),
    };
    let report = json!({"metrics": evaluation.metrics(), "team": team_label,
        "samples_per_item": cfg.eval.samples_per_item, "items": evaluation.records});
    let stem = chrono::Utc::now().format("eval-%Y%m%dT%H%M%SZ").to_string();
    let path = write_new_report(&run_dir.eval(), &stem, serde_json::to_string_pretty(&report)?.as_bytes())?;
    run_dir.log_metrics(&evaluation.with_metrics(json!({
        "stage": "eval", "time": chrono::Utc::now().to_rfc3339(), "num_items": items.len(),
        "samples_per_item": cfg.eval.samples_per_item,
        "tokens_per_s": evaluation.tokens as f64 / started.elapsed().as_secs_f64(),
    })))?;
    let item_means = evaluation.item_means(cfg.eval.samples_per_item);
    let history = EvalHistory::read(&run_dir.eval())?;
    atomic_write(&run_dir.eval_plot(), history.svg(&run_dir.root).as_bytes())?;
    Ok(RunEvaluation { evaluation, item_means, path, history })
}

/// Write `<dir>/<stem>.json`, or `<stem>-2.json`, ... when a report of the same second exists;
/// each name is created exclusively, so two evals never write the same report.
fn write_new_report(dir: &std::path::Path, stem: &str, bytes: &[u8]) -> Result<std::path::PathBuf> {
    for k in 1.. {
        let p = if k == 1 { dir.join(format!("{stem}.json")) } else { dir.join(format!("{stem}-{k}.json")) };
        if p.exists() {
            continue;
        }
        match atomic_create(&p, bytes) {
            Ok(()) => return Ok(p),
            Err(_) if p.exists() => continue,
            Err(e) => return Err(e),
        }
    }
    unreachable!("an unused report name exists")
}

/// The current team's evaluation after an iterate round, when there are eval items.
pub fn evaluate_round(cfg: &EvaluationConfig, run_dir: &RunDir) -> Result<Option<RoundEval>> {
    if cfg.split.eval_num_samples == 0 || cfg.split.eval_file.is_none() {
        return Ok(None);
    }
    let t = std::time::Instant::now();
    let run = evaluate_run(cfg, run_dir, &Members::Current)?;
    let secs = t.elapsed().as_secs_f64();
    let (mean, stderr) = (run.mean(), run.evaluation.reward_stderr);
    Ok(Some(RoundEval { mean, stderr, item_means: run.item_means, secs }))
}

/// The evaluations of a run directory (`<run_dir>/eval/eval-*.json`), oldest first.
pub struct EvalHistory {
    pub reports: Vec<PastEval>,
}

impl EvalHistory {
    pub fn read(dir: &std::path::Path) -> Result<Self> {
        let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("eval-") && n.ends_with(".json"))
            })
            .collect();
        // Names are UTC timestamps (`eval-20261204T011712Z[-k].json`): their order is the runs' order.
        files.sort_by_key(|p| report_order(p));
        let mut reports = Vec::with_capacity(files.len());
        for f in files {
            let bytes = std::fs::read(&f).with_context(|| format!("reading {}", f.display()))?;
            let v: serde_json::Value =
                serde_json::from_slice(&bytes).with_context(|| format!("{}: not an eval report", f.display()))?;
            reports.push(PastEval::of(&v));
        }
        Ok(Self { reports })
    }

    /// The last evaluation's gain over the first, paired by prompt: when both scored the same
    /// items, as many samples each.
    pub fn gain_over_first(&self) -> Option<MeanSe> {
        let (first, last) = (self.reports.first()?, self.reports.last()?);
        let same_items = first.item_means.len() == last.item_means.len()
            && first.item_means.iter().zip(&last.item_means).all(|(a, b)| a.0 == b.0)
            && first.samples_per_item == last.samples_per_item;
        (self.reports.len() >= 2 && same_items && !first.item_means.is_empty()).then(|| {
            let values = |r: &PastEval| r.item_means.iter().map(|m| m.1).collect::<Vec<f64>>();
            paired_gain(&values(first), &values(last))
        })
    }

    /// Each evaluation's mean ± s.e. in order; the title names the first and the last team and
    /// the paired gain between them.
    pub fn svg(&self, run_dir: &std::path::Path) -> String {
        let x = |i: usize| (i + 1) as f64;
        let line = |f: &dyn Fn(&PastEval) -> f64| -> Vec<(f64, f64)> {
            self.reports.iter().enumerate().map(|(i, r)| (x(i), f(r))).collect()
        };
        let panel = crate::plot::Panel {
            title: "eval/turn_1/reward_mean (band: ± s.e. over items)".into(),
            series: vec![crate::plot::Series {
                name: "mean".into(),
                points: line(&|r| r.reward_mean),
                band: Some(self.reports.iter().map(|r| r.reward_stderr).collect()),
            }],
        };
        let describe = |r: &PastEval| format!("{} {:.3}", r.team, r.reward_mean);
        let mut title = format!("pbrl eval: {}", crate::plot::short_path(run_dir));
        if let (Some(first), Some(last)) = (self.reports.first(), self.reports.last()) {
            title += &format!(": {} -> {}", describe(first), describe(last));
        }
        if let Some(g) = self.gain_over_first() {
            title += &format!(" (paired gain {:+.3} ± {:.3})", g.mean, g.se);
        }
        crate::plot::line_panels(&title, "evaluation", &[panel])
    }
}

impl PastEval {
    /// From a report's JSON; fields a report of an older pbrl lacks read as unknown.
    fn of(v: &serde_json::Value) -> Self {
        let mut item_means: Vec<(String, f64, usize)> = Vec::new();
        for r in v["items"].as_array().into_iter().flatten() {
            let (item, reward) = (r["item"].to_string(), r["reward"].as_f64().unwrap_or(f64::NAN));
            // Records are item-major: an item's samples are consecutive.
            match item_means.last_mut() {
                Some(last) if last.0 == item => {
                    last.1 += reward;
                    last.2 += 1;
                }
                _ => item_means.push((item, reward, 1)),
            }
        }
        Self {
            team: v["team"].as_str().unwrap_or("?").to_string(),
            // A multi-turn evaluation's headline is the history's score.
            reward_mean: headline(v, "mean"),
            reward_stderr: headline(v, "stderr"),
            item_means: item_means.into_iter().map(|(i, s, n)| (i, s / n as f64)).collect(),
            samples_per_item: v["samples_per_item"].as_u64().unwrap_or(0),
        }
    }
}

/// An eval report's reward `stat` ("mean", "stderr"): the history score's
/// (`eval/history_reward_*`) in a multi-turn report, else `eval/turn_1/reward_*`.
fn headline(report: &serde_json::Value, stat: &str) -> f64 {
    let m = &report["metrics"];
    m[format!("eval/history_reward_{stat}")]
        .as_f64()
        .or_else(|| m[format!("eval/turn_1/reward_{stat}")].as_f64())
        .unwrap_or(f64::NAN)
}

/// A report's place in time: its timestamp, then its `-k` suffix (`eval-T.json` before `eval-T-2.json`).
fn report_order(p: &std::path::Path) -> (String, u64) {
    let stem = p.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    match stem.rsplit_once('-') {
        Some((t, k)) if t.contains('T') && k.chars().all(|c| c.is_ascii_digit()) => {
            (t.to_string(), k.parse().unwrap_or(0))
        }
        _ => (stem.to_string(), 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_history_pairs_the_last_evaluation_with_the_first_by_item() {
        let dir = tempfile::tempdir().unwrap();
        let report = |team: &str, rewards: [f64; 4]| {
            let items: Vec<serde_json::Value> = rewards
                .iter()
                .enumerate()
                .map(|(k, r)| json!({"item": {"prompt": format!("p{}", k / 2)}, "sample": k % 2, "reward": r}))
                .collect();
            let mean = rewards.iter().sum::<f64>() / 4.0;
            json!({"metrics": {"eval/turn_1/reward_mean": mean, "eval/turn_1/reward_stderr": 0.1}, "team": team,
                "samples_per_item": 2, "items": items})
        };
        let write = |name: &str, v: serde_json::Value| std::fs::write(dir.path().join(name), v.to_string()).unwrap();
        // Named out of order on purpose: `-2` is the second report of the same second.
        write("eval-20261204T010000Z-2.json", report("agents", [1.0, 1.0, 0.5, 0.7]));
        write("eval-20261204T010000Z.json", report("base", [0.2, 0.4, 0.5, 0.5]));
        std::fs::write(dir.path().join("eval_reward.svg"), "not a report").unwrap();
        let h = EvalHistory::read(dir.path()).unwrap();
        assert_eq!(h.reports.iter().map(|r| r.team.as_str()).collect::<Vec<_>>(), ["base", "agents"]);
        // Item means 0.3, 0.5 then 1.0, 0.6: gains 0.7 and 0.1, mean 0.4, s.e. 0.3.
        let g = h.gain_over_first().unwrap();
        assert!((g.mean - 0.4).abs() < 1e-12 && (g.se - 0.3).abs() < 1e-12, "{g:?}");
        let svg = h.svg(std::path::Path::new("runs/x"));
        assert!(svg.contains("base 0.400 -&gt; agents 0.800 (paired gain +0.400 ± 0.300)"), "{svg}");
        // Other items (or sample counts) are not paired.
        write("eval-20261204T020000Z.json", json!({"metrics": {}, "items": [{"item": "q", "reward": 1.0}]}));
        assert!(EvalHistory::read(dir.path()).unwrap().gain_over_first().is_none());
    }
}
