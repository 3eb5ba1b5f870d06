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
use anyhow::Result;

use crate::config::Config;
use crate::evaluation::{evaluate_run, RunEvaluation};
use crate::run::RunDir;
use crate::team::Members;

pub fn run(cfg: &Config, run_dir: &RunDir, members: &Members, full_table: bool) -> Result<RunEvaluation> {
    let run = evaluate_run(&cfg.evaluation()?, run_dir, members)?;
    let records = &run.evaluation.records;
    let (mean, stderr) = (run.mean(), run.evaluation.reward_stderr);
    print_table(records, cfg.eval_samples_per_item as usize, if full_table { records.len() } else { EXAMPLE_ROWS });
    let shape = format!("({} items x {} samples)", run.item_means.len(), cfg.eval_samples_per_item);
    match run.evaluation.turn_rewards.is_some() {
        false => {
            println!("eval/turn_1/reward_mean     {mean:.4}");
            println!("eval/turn_1/expected_return {mean:.4}");
            println!("eval/turn_1/reward_stderr   {stderr:.4}  {shape}");
        }
        true => {
            let m = run.evaluation.metrics();
            let at = |k: String| m[k].as_f64().unwrap_or(f64::NAN);
            for t in 1..=cfg.num_turns {
                println!(
                    "eval/turn_{t}/reward_mean     {:.4} ± {:.4}  (expected_return {:.4})",
                    at(format!("eval/turn_{t}/reward_mean")),
                    at(format!("eval/turn_{t}/reward_stderr")),
                    at(format!("eval/turn_{t}/expected_return"))
                );
            }
            println!("eval/history_reward_mean  {mean:.4} ± {stderr:.4}  ({}) {shape}", cfg.history_reward);
            println!(
                "last turn over the first   {:+.4} ± {:.4}  (paired by prompt)",
                at("eval/last_over_first_mean".into()),
                at("eval/last_over_first_stderr".into())
            );
        }
    }
    println!("report: {}", run.path.display());
    if let Some(gain) = run.history.gain_over_first() {
        println!(
            "gain over the first eval of this run directory ({}): {:+.4} ± {:.4} (paired by prompt, {} items)",
            run.history.reports[0].team,
            gain.mean,
            gain.se,
            run.item_means.len()
        );
    }
    Ok(run)
}

/// Each role's completion as a table cell: its length and opening.
fn cells(completions: &serde_json::Value) -> String {
    let cells: Vec<String> = completions
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            let s = c.as_str().unwrap_or("");
            let head: String = s.chars().take(28).collect::<String>().replace('\n', " ");
            format!("{:>4} {head:<28}", s.chars().count())
        })
        .collect();
    cells.join(" | ")
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
        println!("{label:>6}  {:>8.4}  {}", r["reward"].as_f64().unwrap_or(f64::NAN), cells(&r["completions"]));
        // A discussion: each turn's joint response and reward.
        for (t, turn) in r["turns"].as_array().into_iter().flatten().enumerate() {
            let reward = turn["reward"].as_f64().unwrap_or(f64::NAN);
            println!("{:>6}  {reward:>8.4}  {}", format!("t{}", t + 1), cells(&turn["completions"]));
        }
    }
    if records.len() > rows {
        println!("   ...  {} more in the report (`--table` prints them all)", records.len() - rows);
    }
}
