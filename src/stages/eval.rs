//! `pbrl eval`: sample one completion per agent for each held-out item and score the joint
//! response with the task reward (after reward_processor).
//!
//! 1. load the eval items and the team (trained agents if the run has them);
//! 2. per batch of `eval_batch_size` items, each agent samples one completion per item
//!    (centralized: the one actor writes a tagged joint response, parsed into the roles' outputs);
//! 3. score each joint response; report the mean as `eval/turn_1/reward_mean`;
//! 4. write `<run_dir>/eval/eval-<UTC timestamp>.json`, a metrics line, and a table on stdout.
use anyhow::{bail, Context, Result};
use serde_json::json;

use crate::agents::{load_team, Agent};
use crate::collab::Collaboration;
use crate::config::Config;
use crate::model::sampling::{sample, SampleRequest, SamplingParams};
use crate::progress;
use crate::rng::{derive_seed, purpose};
use crate::run_dir::{atomic_write, RunDir};
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
    let (records, rewards, generated) = (outcome.records, outcome.rewards, outcome.tokens);

    let mean = rewards.iter().sum::<f64>() / rewards.len() as f64;
    let metrics = json!({"eval/turn_1/reward_mean": mean, "eval/turn_1/expected_return": mean});
    let report = json!({"metrics": metrics, "items": records});
    let path = unused_path(&run_dir.eval(), &chrono::Utc::now().format("eval-%Y%m%dT%H%M%SZ").to_string());
    atomic_write(&path, serde_json::to_string_pretty(&report)?.as_bytes())?;
    run_dir.log_metrics(&json!({
        "stage": "eval", "time": chrono::Utc::now().to_rfc3339(), "num_items": rewards.len(),
        "eval/turn_1/reward_mean": mean, "eval/turn_1/expected_return": mean,
        "tokens_per_s": generated as f64 / started.elapsed().as_secs_f64(),
    }))?;

    print_table(&records);
    println!("eval/turn_1/reward_mean     {mean:.4}");
    println!("eval/turn_1/expected_return {mean:.4}");
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
    pub records: Vec<serde_json::Value>,
    pub rewards: Vec<f64>,
    pub tokens: usize,
}

impl Evaluation {
    pub fn reward_mean(&self) -> f64 {
        self.rewards.iter().sum::<f64>() / self.rewards.len().max(1) as f64
    }
}

/// Each agent samples one completion per item (batches of `eval_batch_size` items); each joint
/// response is scored with the task reward and reward_processor. Used by `pbrl eval` and by the
/// periodic evaluation during training.
pub fn evaluate(
    cfg: &Config,
    team: &[Agent],
    items: &[TaskItem],
    reward: &mut dyn TaskReward,
    processor: RewardProcessor,
) -> Result<Evaluation> {
    let params = sampling_params(cfg);
    let collab = Collaboration::from_config(cfg);
    let bar = progress::bar(items.len() as u64, "eval");
    let started = std::time::Instant::now();
    let mut generated = 0usize;
    let mut records = Vec::with_capacity(items.len());
    let mut rewards = Vec::with_capacity(items.len());
    for (batch_idx, batch) in items.chunks(cfg.eval_batch_size as usize).enumerate() {
        let first = batch_idx * cfg.eval_batch_size as usize;
        // prompts[a][j], completions[a][j]: agent a, item j of the batch.
        let mut prompts = Vec::with_capacity(team.len());
        let mut completions = Vec::with_capacity(team.len());
        for agent in team {
            let texts = batch.iter().map(|it| agent.prompt_for(it)).collect::<Result<Vec<_>>>()?;
            let requests = texts
                .iter()
                .enumerate()
                .map(|(j, t)| {
                    let seed = derive_seed(cfg.seed, &[purpose::EVAL, (first + j) as u64, agent.index as u64]);
                    Ok(SampleRequest { prompt: agent.model.tokenizer.encode(t)?, seed })
                })
                .collect::<Result<Vec<_>>>()?;
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
            let actor_outputs: Vec<String> = completions.iter().map(|a| a[j].clone()).collect();
            let c = collab.role_outputs(&actor_outputs);
            let r = processor.apply(reward.score(item, &collab.reward_prompts(item, &p)?, &c)?);
            if !r.is_finite() {
                bail!("the reward of eval item {} is not finite ({r})", first + j);
            }
            rewards.push(r);
            let mut record = json!({"item": item, "prompts": p, "completions": c, "reward": r});
            if collab.is_centralized() {
                record["joint_completion"] = json!(actor_outputs[0]);
            }
            records.push(record);
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    Ok(Evaluation { records, rewards, tokens: generated })
}

/// `<dir>/<stem>.json`, or `<stem>-2.json`, ... if a report of the same second exists.
fn unused_path(dir: &std::path::Path, stem: &str) -> std::path::PathBuf {
    let mut p = dir.join(format!("{stem}.json"));
    let mut k = 2;
    while p.exists() {
        p = dir.join(format!("{stem}-{k}.json"));
        k += 1;
    }
    p
}

fn print_table(records: &[serde_json::Value]) {
    println!("{:>4}  {:>8}  completion lengths (chars) and openings", "item", "reward");
    for (i, r) in records.iter().enumerate() {
        let comps = r["completions"].as_array().cloned().unwrap_or_default();
        let cells: Vec<String> = comps
            .iter()
            .map(|c| {
                let s = c.as_str().unwrap_or("");
                let head: String = s.chars().take(28).collect::<String>().replace('\n', " ");
                format!("{:>4} {head:<28}", s.chars().count())
            })
            .collect();
        println!("{i:>4}  {:>8.4}  {}", r["reward"].as_f64().unwrap_or(f64::NAN), cells.join(" | "));
    }
}
