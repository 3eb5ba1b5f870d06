//! `pbrl eval`: sample a joint response for each held-out item (the reference samples one;
//! `eval_samples_per_item` more) and score it with the task reward (after reward_processor).
//!
//! 1. load the eval items and the team (trained agents if the run has them);
//! 2. per batch of `eval_batch_size` items, each agent samples `eval_samples_per_item`
//!    completions per item, each with its own seeded stream (centralized: the one actor writes a
//!    tagged joint response, parsed into the roles' outputs);
//! 3. score each joint response; report the mean as `eval/turn_1/reward_mean` and its standard
//!    error over items (`eval/turn_1/reward_stderr`);
//! 4. write `<run_dir>/eval/eval-<UTC timestamp>.json`, a metrics line, and a table on stdout.
use anyhow::{bail, Context, Result};
use serde_json::json;

use crate::agents::{check_fits, load_team, Agent};
use crate::collab::Collaboration;
use crate::config::Config;
use crate::model::sampling::{sample, SampleRequest, SamplingParams};
use crate::progress;
use crate::rng::{derive_seed, purpose};
use crate::run::{atomic_create, RunDir};
use crate::task::reward::{build_reward, RewardProcessor, TaskReward};
use crate::task::{load_items, TaskItem};

pub struct EvalReport {
    pub reward_mean: f64,
    pub path: std::path::PathBuf,
}

pub fn sampling_params(cfg: &Config) -> SamplingParams {
    SamplingParams {
        temperature: cfg.temperature,
        top_p: cfg.top_p,
        top_k: cfg.top_k.map(|k| k as usize),
        max_new_tokens: cfg.max_new_tokens as usize,
    }
}

pub fn run(cfg: &Config, run_dir: &RunDir) -> Result<EvalReport> {
    let items = eval_items(cfg)?.context("eval_num_samples is 0: nothing to evaluate")?;
    let (mut reward, processor) = build_reward(&cfg.reward, cfg.reward_timeout_s)?;
    let team = load_team(cfg, run_dir)?;
    let started = std::time::Instant::now();
    let outcome = evaluate(cfg, &team, &items, reward.as_mut(), processor)?;
    let (mean, stderr) = (outcome.reward_mean(), outcome.reward_stderr);
    let (records, generated) = (outcome.records, outcome.tokens);

    let metrics = json!({
        "eval/turn_1/reward_mean": mean, "eval/turn_1/expected_return": mean, "eval/turn_1/reward_stderr": stderr,
    });
    let report = json!({"metrics": metrics, "items": records});
    let stem = chrono::Utc::now().format("eval-%Y%m%dT%H%M%SZ").to_string();
    let path = write_new_report(&run_dir.eval(), &stem, serde_json::to_string_pretty(&report)?.as_bytes())?;
    run_dir.log_metrics(&json!({
        "stage": "eval", "time": chrono::Utc::now().to_rfc3339(), "num_items": items.len(),
        "samples_per_item": cfg.eval_samples_per_item,
        "eval/turn_1/reward_mean": mean, "eval/turn_1/expected_return": mean, "eval/turn_1/reward_stderr": stderr,
        "tokens_per_s": generated as f64 / started.elapsed().as_secs_f64(),
    }))?;

    print_table(&records, cfg.eval_samples_per_item as usize);
    println!("eval/turn_1/reward_mean     {mean:.4}");
    println!("eval/turn_1/expected_return {mean:.4}");
    println!(
        "eval/turn_1/reward_stderr   {stderr:.4}  ({} items x {} samples)",
        items.len(),
        cfg.eval_samples_per_item
    );
    println!("report: {}", path.display());
    Ok(EvalReport { reward_mean: mean, path })
}

/// The held-out items an evaluation uses (`None` when `eval_num_samples` is 0).
pub fn eval_items(cfg: &Config) -> Result<Option<Vec<TaskItem>>> {
    if cfg.eval_num_samples == 0 {
        return Ok(None);
    }
    let eval_file =
        cfg.task.eval_file.as_ref().context("task.eval_file is not set: evaluation needs held-out items")?;
    let mut items = load_items(eval_file)?;
    items.truncate(cfg.eval_num_samples as usize);
    Ok(Some(items))
}

pub struct Evaluation {
    /// One per (item, sample), item-major.
    pub records: Vec<serde_json::Value>,
    pub rewards: Vec<f64>,
    /// Standard error of the mean over items (each item's samples averaged first, since they
    /// share a prompt); 0 with a single item.
    pub reward_stderr: f64,
    pub tokens: usize,
}

impl Evaluation {
    pub fn reward_mean(&self) -> f64 {
        self.rewards.iter().sum::<f64>() / self.rewards.len().max(1) as f64
    }
}

/// Each agent samples `eval_samples_per_item` completions per item (batches of
/// `eval_batch_size` items, a prompt's samples sharing its prefill); each joint response is
/// scored with the task reward and reward_processor. Used by `pbrl eval` and by the periodic
/// evaluation during training.
pub fn evaluate(
    cfg: &Config,
    team: &[Agent],
    items: &[TaskItem],
    reward: &mut dyn TaskReward,
    processor: RewardProcessor,
) -> Result<Evaluation> {
    check_fits(team, items, cfg.max_new_tokens as usize, cfg.eval_rows(), "eval")?;
    let params = sampling_params(cfg);
    let k = cfg.eval_samples_per_item as usize;
    let collab = Collaboration::from_config(cfg);
    let bar = progress::bar(items.len() as u64, "eval");
    let started = std::time::Instant::now();
    let mut generated = 0usize;
    let mut records = Vec::with_capacity(items.len());
    let mut rewards = Vec::with_capacity(items.len());
    for (batch_idx, batch) in items.chunks(cfg.eval_batch_size as usize).enumerate() {
        let first = batch_idx * cfg.eval_batch_size as usize;
        // prompts[a][j]: agent a, item j of the batch; completions[a][j·k + r]: its sample r.
        let mut prompts = Vec::with_capacity(team.len());
        let mut completions = Vec::with_capacity(team.len());
        for agent in team {
            let texts = batch.iter().map(|it| agent.prompt_for(it)).collect::<Result<Vec<_>>>()?;
            let mut requests = Vec::with_capacity(batch.len() * k);
            for (j, t) in texts.iter().enumerate() {
                let prompt = agent.model.tokenizer.encode(t)?;
                for r in 0..k {
                    let seed = eval_seed(cfg.seed, first + j, agent.index, r);
                    requests.push(SampleRequest { prompt: prompt.clone(), seed });
                }
            }
            let tok = &agent.model.tokenizer;
            let out = sample(&agent.model.model, &requests, &params, &tok.stop_ids, tok.pad_id, |n| {
                generated += n;
                bar.set_message(format!("{:.1} tok/s", generated as f64 / started.elapsed().as_secs_f64()));
            })?;
            completions.push(out.iter().map(|ids| tok.decode(ids)).collect::<Result<Vec<_>>>()?);
            prompts.push(texts);
        }
        for (j, item) in batch.iter().enumerate() {
            let p: Vec<String> = prompts.iter().map(|a| a[j].clone()).collect();
            let reward_prompts = collab.reward_prompts(item, &p)?;
            for draw in 0..k {
                let actor_outputs: Vec<String> = completions.iter().map(|a| a[j * k + draw].clone()).collect();
                let c = collab.role_outputs(&actor_outputs);
                let r = processor.apply(reward.score(item, &reward_prompts, &c)?);
                if !r.is_finite() {
                    bail!("the reward of eval item {} (sample {draw}) is not finite ({r})", first + j);
                }
                rewards.push(r);
                let mut record = json!({"item": item, "sample": draw, "prompts": p, "completions": c, "reward": r});
                if collab.is_centralized() {
                    record["joint_completion"] = json!(actor_outputs[0]);
                }
                records.push(record);
            }
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    let reward_stderr = stderr_over_items(&rewards, k);
    let mean = rewards.iter().sum::<f64>() / rewards.len().max(1) as f64;
    if !(mean.is_finite() && reward_stderr.is_finite()) {
        bail!("the eval rewards overflow when averaged (mean {mean}, standard error {reward_stderr}); lower reward.scale / reward.shift");
    }
    Ok(Evaluation { records, rewards, reward_stderr, tokens: generated })
}

/// The seed of agent `agent`'s sample `sample` for eval item `item`. Sample 0 keeps the
/// one-sample stream, so `eval_samples_per_item = 1` evaluates exactly as before it existed.
fn eval_seed(seed: u64, item: usize, agent: usize, sample: usize) -> u64 {
    let mut path = vec![purpose::EVAL, item as u64, agent as u64];
    if sample > 0 {
        path.push(sample as u64);
    }
    derive_seed(seed, &path)
}

/// Standard error of the mean reward over items: rewards come item-major, `k` per item; an
/// item's samples are averaged first (they share a prompt, so they are not independent).
fn stderr_over_items(rewards: &[f64], k: usize) -> f64 {
    let means: Vec<f64> = rewards.chunks(k).map(|c| c.iter().sum::<f64>() / c.len() as f64).collect();
    let n = means.len();
    if n < 2 {
        return 0.0;
    }
    let mean = means.iter().sum::<f64>() / n as f64;
    let var = means.iter().map(|m| (m - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    (var / n as f64).sqrt()
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

/// One row per joint response: the item's index (and the sample's, with several per item).
fn print_table(records: &[serde_json::Value], samples_per_item: usize) {
    println!("{:>6}  {:>8}  completion lengths (chars) and openings", "item", "reward");
    for (i, r) in records.iter().enumerate() {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stderr_averages_each_items_samples_first() {
        // Two items, two samples each: item means 0.5 and 1.0 → sd 0.3536, se 0.25.
        assert!((stderr_over_items(&[0.0, 1.0, 1.0, 1.0], 2) - 0.25).abs() < 1e-12);
        // Identical item means: no spread between items, whatever the samples do.
        assert_eq!(stderr_over_items(&[0.0, 1.0, 1.0, 0.0], 2), 0.0);
        assert_eq!(stderr_over_items(&[0.3], 1), 0.0);
    }

    #[test]
    fn the_first_sample_keeps_the_one_sample_seed() {
        assert_eq!(eval_seed(42, 3, 1, 0), derive_seed(42, &[purpose::EVAL, 3, 1]));
        assert_ne!(eval_seed(42, 3, 1, 1), eval_seed(42, 3, 1, 0));
        assert_ne!(eval_seed(42, 3, 1, 1), eval_seed(42, 3, 1, 2));
    }
}
