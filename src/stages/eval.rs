//! `pbrl eval`: sample a joint response for each held-out item (the reference samples one;
//! `eval_samples_per_item` more) and score it with the task reward (after reward_processor).
//!
//! 1. load the eval items and the team (`--team`: the run's trained agents if it has them, the
//!    base models, or a saved team directory);
//! 2. per batch of `eval_batch_size` items, each agent samples `eval_samples_per_item`
//!    completions per item, each with its own seeded stream (centralized: the one actor writes a
//!    tagged joint response, parsed into the roles' outputs);
//! 3. score each joint response; report the mean as `eval/turn_1/reward_mean` and its standard
//!    error over items (`eval/turn_1/reward_stderr`);
//! 4. write `<run_dir>/eval/eval-<UTC timestamp>.json` (every joint response), a metrics line,
//!    and on stdout the first few joint responses (`--table`: all of them) and the mean;
//! 5. the run directory's evaluations so far, in order (the quickstart's: the base team, then the
//!    trained one): `<run_dir>/eval/eval_reward.svg` (each one's mean ± s.e.), and, when the
//!    first one scored the same items with as many samples, the gain over it paired by prompt.
use anyhow::{Context, Result};
use serde_json::json;

use crate::config::Config;
use crate::evaluation::{eval_items, evaluate, EvalHistory};
use crate::run::{atomic_create, atomic_write, RunDir};
use crate::task::reward::build_reward;
use crate::team::{load_members, Members};

pub struct EvalReport {
    pub reward_mean: f64,
    pub reward_stderr: f64,
    /// Each eval item's mean reward over its samples, in the eval file's order.
    pub item_means: Vec<f64>,
    pub path: std::path::PathBuf,
}

pub fn run(cfg: &Config, run_dir: &RunDir, members: &Members, full_table: bool) -> Result<EvalReport> {
    let items = eval_items(cfg)?.context("eval_num_samples is 0: nothing to evaluate")?;
    let (mut reward, processor) = build_reward(&cfg.reward, cfg.reward_timeout_s)?;
    let team = load_members(cfg, run_dir, members)?;
    let started = std::time::Instant::now();
    let outcome = evaluate(cfg, &team, &items, reward.as_mut(), processor, cfg.seed)?;
    let (mean, stderr) = (outcome.reward_mean(), outcome.reward_stderr);
    let team_label = match members {
        Members::Base => "base".to_string(),
        Members::Current if run_dir.root.join("agents").is_dir() => "agents".to_string(),
        Members::Current => "base".to_string(),
        Members::Saved(dir) => dir.display().to_string(),
    };
    let report = json!({"metrics": outcome.metrics(), "team": team_label,
        "samples_per_item": cfg.eval_samples_per_item, "items": outcome.records});
    let stem = chrono::Utc::now().format("eval-%Y%m%dT%H%M%SZ").to_string();
    let path = write_new_report(&run_dir.eval(), &stem, serde_json::to_string_pretty(&report)?.as_bytes())?;
    run_dir.log_metrics(&outcome.with_metrics(json!({
        "stage": "eval", "time": chrono::Utc::now().to_rfc3339(), "num_items": items.len(),
        "samples_per_item": cfg.eval_samples_per_item,
        "tokens_per_s": outcome.tokens as f64 / started.elapsed().as_secs_f64(),
    })))?;
    let records = &outcome.records;

    print_table(records, cfg.eval_samples_per_item as usize, if full_table { records.len() } else { EXAMPLE_ROWS });
    println!("eval/turn_1/reward_mean     {mean:.4}");
    println!("eval/turn_1/expected_return {mean:.4}");
    println!(
        "eval/turn_1/reward_stderr   {stderr:.4}  ({} items x {} samples)",
        items.len(),
        cfg.eval_samples_per_item
    );
    println!("report: {}", path.display());
    let item_means = outcome.item_means(cfg.eval_samples_per_item as usize);
    let history = EvalHistory::read(&run_dir.eval())?;
    if let Some(gain) = history.gain_over_first() {
        println!(
            "gain over the first eval of this run directory ({}): {:+.4} ± {:.4} (paired by prompt, {} items)",
            history.reports[0].team,
            gain.mean,
            gain.se,
            items.len()
        );
    }
    atomic_write(&run_dir.eval().join("eval_reward.svg"), history.svg(&run_dir.root).as_bytes())?;
    Ok(EvalReport { reward_mean: mean, reward_stderr: stderr, item_means, path })
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

/// Joint responses `pbrl eval` prints without `--table`.
const EXAMPLE_ROWS: usize = 4;

/// One row per joint response, the first `rows` of them: the item's index (and the sample's,
/// with several per item).
fn print_table(records: &[serde_json::Value], samples_per_item: usize, rows: usize) {
    println!("{:>6}  {:>8}  completion lengths (chars) and openings", "item", "reward");
    for (i, r) in records.iter().enumerate().take(rows) {
        let label = if samples_per_item > 1 {
            format!("{}.{}", i / samples_per_item, i % samples_per_item)
        } else {
            i.to_string()
        };
        let comps = r["completions"].as_array().cloned().unwrap_or_default();
        let cells: Vec<String> = comps
            .iter()
            .map(|c| {
                let s = c.as_str().unwrap_or("");
                let head: String = s.chars().take(28).collect::<String>().replace('\n', " ");
                format!("{:>4} {head:<28}", s.chars().count())
            })
            .collect();
        println!("{label:>6}  {:>8.4}  {}", r["reward"].as_f64().unwrap_or(f64::NAN), cells.join(" | "));
    }
    if records.len() > rows {
        println!("   ...  {} more in the report (`--table` prints them all)", records.len() - rows);
    }
}
