//! Evaluation with the task reward: every held-out item answered `eval_samples_per_item` times
//! by the team, each joint response scored (after reward_processor); the mean and its standard
//! error over items. Used by the periodic evaluation during training (`evaluate`), and by
//! `pbrl eval` and `iterate` through `history.rs` (`evaluate_run`: a team of the run directory,
//! recorded there; `EvalHistory`: the run directory's evaluations read back).
mod history;
mod turns;

pub use turns::TurnRewards;

pub use history::{evaluate_round, evaluate_run, EvalHistory, PastEval, RunEvaluation};

use anyhow::{bail, Context, Result};
use serde_json::json;

use crate::algo::trend::{item_means, MeanSe};
use crate::config::{EvalConfig, EvalSplit, EvaluationConfig, SplitConfig};
use crate::oracle::Oracle;
use crate::progress;
use crate::rng::{derive_seed, purpose};
use crate::task::split::held_out_items;
use crate::task::{load_items, TaskItem};
use crate::team::rollout::rollout;
use crate::team::{check_fits, Agent};

/// The first `eval_num_samples` items of a held-out file (`split` names it in errors), each
/// checked to give every role a prompt.
fn held_out_file_items(
    cfg: &SplitConfig,
    file: Option<&std::path::PathBuf>,
    key: &str,
    split: &str,
) -> Result<Vec<TaskItem>> {
    let file = file.with_context(|| format!("{key} is not set: this evaluation needs its items"))?;
    let mut items = load_items(file)?;
    items.truncate(cfg.eval_num_samples);
    crate::task::check_prompts(&cfg.role_templates, items.iter().enumerate(), split)?;
    Ok(items)
}

/// The held-out items an evaluation uses (`None` when `eval_num_samples` is 0).
pub fn eval_items(cfg: &SplitConfig) -> Result<Option<Vec<TaskItem>>> {
    if cfg.eval_num_samples == 0 {
        return Ok(None);
    }
    Ok(Some(held_out_file_items(cfg, cfg.eval_file.as_ref(), "task.eval_file", "eval")?))
}

/// The items of the periodic evaluation during training: the eval file's (as `pbrl eval`), the
/// validation file's, or with `eval_split = x` the held-out train items; at most `eval_num_samples`.
pub fn periodic_eval_items(cfg: &SplitConfig) -> Result<Option<Vec<TaskItem>>> {
    if cfg.eval_num_samples == 0 {
        return Ok(None);
    }
    Ok(Some(match cfg.eval_split {
        EvalSplit::EvalFile => return eval_items(cfg),
        EvalSplit::ValidationFile => {
            held_out_file_items(cfg, cfg.validation_file.as_ref(), "task.validation_file", "validation")?
        }
        EvalSplit::TrainShare(_) => {
            let mut items = held_out_items(cfg)?;
            items.truncate(cfg.eval_num_samples);
            items
        }
    }))
}

pub struct Evaluation {
    /// One per (item, sample), item-major.
    pub records: Vec<serde_json::Value>,
    pub rewards: Vec<f64>,
    /// Standard error of the mean over items (each item's samples averaged first, since they
    /// share a prompt); 0 with a single item.
    pub reward_stderr: f64,
    pub tokens: usize,
    /// A multi-turn evaluation's rewards turn by turn (`rewards` then holds each history's
    /// score, `history_reward`).
    pub turn_rewards: Option<TurnRewards>,
}

impl Evaluation {
    pub fn reward_mean(&self) -> f64 {
        crate::algo::trend::mean(&self.rewards)
    }

    /// Each item's mean reward over its samples, in item order (what paired comparisons
    /// between two evaluations of the same items read).
    pub fn item_means(&self, samples_per_item: usize) -> Vec<f64> {
        item_means(&self.rewards, samples_per_item)
    }

    /// Mean length in characters of each role's responses.
    pub fn response_chars_mean(&self) -> Vec<f64> {
        let mut sums: Vec<f64> = Vec::new();
        for r in &self.records {
            for (a, c) in r["completions"].as_array().into_iter().flatten().enumerate() {
                if sums.len() <= a {
                    sums.resize(a + 1, 0.0);
                }
                sums[a] += c.as_str().map_or(0, |c| c.chars().count()) as f64;
            }
        }
        sums.iter().map(|s| s / self.records.len().max(1) as f64).collect()
    }

    /// `line` (an object) with [`Evaluation::metrics`] added: a metrics.jsonl line.
    pub fn with_metrics(&self, mut line: serde_json::Value) -> serde_json::Value {
        if let (Some(l), serde_json::Value::Object(m)) = (line.as_object_mut(), self.metrics()) {
            l.extend(m);
        }
        line
    }

    /// The metrics every evaluation logs: reward mean, its standard error, each role's response
    /// length.
    pub fn metrics(&self) -> serde_json::Value {
        let mean = self.reward_mean();
        let mut m = match &self.turn_rewards {
            None => json!({"eval/turn_1/reward_mean": mean, "eval/turn_1/expected_return": mean,
                "eval/turn_1/reward_stderr": self.reward_stderr}),
            Some(turns) => turns.metrics(mean, self.reward_stderr),
        };
        for (a, chars) in self.response_chars_mean().iter().enumerate() {
            m[format!("eval/agent_{a}/response_chars_mean")] = json!(chars);
        }
        m
    }
}

/// Each agent samples `eval_samples_per_item` completions per item (batches of
/// `eval_batch_size` items, a prompt's samples sharing its prefill); each joint response is
/// scored with the task reward and reward_processor. The draws come from the streams under
/// `stream` (`cfg.seed` for `pbrl eval`; see [`periodic_eval_stream`]). Used by `pbrl eval` and
/// by the periodic evaluation during training.
pub fn evaluate(
    cfg: &EvalConfig,
    team: &[Agent],
    items: &[TaskItem],
    oracle: &mut Oracle,
    stream: u64,
) -> Result<Evaluation> {
    if let Some(turns) = &cfg.turns {
        return turns::evaluate_discussions(cfg, turns, team, items, oracle, stream);
    }
    check_fits(team, items, &cfg.max_new_tokens(), cfg.rows, "eval")?;
    let params = &cfg.sampling;
    let k = cfg.samples_per_item;
    let centralized = cfg.centralized;
    let bar = progress::bar(items.len() as u64, "eval");
    let started = std::time::Instant::now();
    let mut generated = 0usize;
    let mut records = Vec::with_capacity(items.len());
    let mut rewards = Vec::with_capacity(items.len());
    for (batch_idx, batch) in items.chunks(cfg.batch_items).enumerate() {
        let first = batch_idx * cfg.batch_items;
        let seed = |j: usize, a: usize, r: usize| eval_seed(stream, first + j, a, r);
        let out = rollout(team, batch, k, params, seed, |n| {
            generated += n;
            bar.set_message(format!("{:.1} tok/s", generated as f64 / started.elapsed().as_secs_f64()));
        })?;
        for (j, item) in batch.iter().enumerate() {
            let p = out.prompts[j].clone();
            let joints: Vec<Vec<String>> = (0..k).map(|draw| out.texts(j, draw)).collect();
            let scores = oracle.score(item, &p, &joints)?.processed;
            for (draw, (actor_outputs, r)) in joints.iter().zip(scores).enumerate() {
                let c = oracle.role_outputs(actor_outputs);
                if !r.is_finite() {
                    bail!("the reward of eval item {} (sample {draw}) is not finite ({r})", first + j);
                }
                rewards.push(r);
                let mut record = json!({"item": item, "sample": draw, "prompts": p, "completions": c, "reward": r});
                if centralized {
                    record["joint_completion"] = json!(actor_outputs[0]);
                }
                records.push(record);
            }
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    Evaluation::of(records, rewards, k, generated, None)
}

impl Evaluation {
    /// The evaluation of these records and rewards (item-major, `k` samples per item), refused
    /// when their mean or its standard error overflows.
    fn of(
        records: Vec<serde_json::Value>,
        rewards: Vec<f64>,
        k: usize,
        tokens: usize,
        turn_rewards: Option<TurnRewards>,
    ) -> Result<Self> {
        let reward_stderr = stderr_over_items(&rewards, k);
        let out = Evaluation { records, rewards, reward_stderr, tokens, turn_rewards };
        let mean = out.reward_mean();
        if !(mean.is_finite() && reward_stderr.is_finite()) {
            bail!(
                "the eval rewards overflow when averaged (mean {mean}, standard error {reward_stderr}); lower \
                 reward.scale / reward.shift"
            );
        }
        Ok(out)
    }
}

/// The evaluation during a training: its items, their reward, its settings and the seed of its
/// draws ([`periodic_eval_stream`]).
pub struct PeriodicEval {
    pub items: Vec<TaskItem>,
    pub oracle: Oracle,
    pub config: EvalConfig,
    pub stream: u64,
}

/// The periodic evaluation of `team` in a training on `rounds` (`None` without eval items),
/// checked to fit the team's context and memory before any training.
pub fn periodic_eval(cfg: &EvaluationConfig, team: &[Agent], rounds: &[u32]) -> Result<Option<PeriodicEval>> {
    let Some(items) = periodic_eval_items(&cfg.split)? else { return Ok(None) };
    check_fits(team, &items, &cfg.eval.max_new_tokens(), cfg.eval.rows, "eval")?;
    Ok(Some(PeriodicEval {
        items,
        oracle: Oracle::new(&cfg.oracle)?,
        config: cfg.eval.clone(),
        stream: periodic_eval_stream(cfg.seed, rounds),
    }))
}

/// The stream of the periodic evaluations of a training on `rounds`: `seed`'s (that of
/// `pbrl eval`) up to round 1, a stream of its own for each later round. Within one training
/// every evaluation draws the same samples, so keep-best compares its checkpoints on common
/// random numbers; across rounds the streams differ, so a round's starting team, which the
/// previous round kept *because* it scored best on its stream, is scored afresh instead of
/// carrying that selected (optimistic) score as the bar the next round must beat.
pub fn periodic_eval_stream(seed: u64, rounds: &[u32]) -> u64 {
    match rounds.iter().max() {
        Some(&newest) if newest > 1 => derive_seed(seed, &[purpose::EVAL_ROUND, newest as u64]),
        _ => seed,
    }
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
    let means = item_means(rewards, k);
    if means.len() < 2 {
        return 0.0;
    }
    MeanSe::of(&means).se
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn stderr_averages_each_items_samples_first() {
        // Two items, two samples each: item means 0.5 and 1.0 → sd 0.3536, se 0.25.
        assert!((stderr_over_items(&[0.0, 1.0, 1.0, 1.0], 2) - 0.25).abs() < 1e-12);
        // Identical item means: no spread between items, whatever the samples do.
        assert_eq!(stderr_over_items(&[0.0, 1.0, 1.0, 0.0], 2), 0.0);
        assert_eq!(stderr_over_items(&[0.3], 1), 0.0);
    }

    #[test]
    fn periodic_evaluations_draw_a_fresh_stream_after_round_one() {
        assert_eq!(periodic_eval_stream(42, &[]), 42);
        assert_eq!(periodic_eval_stream(42, &[1]), 42);
        let (r2, r3) = (periodic_eval_stream(42, &[1, 2]), periodic_eval_stream(42, &[3]));
        assert!(r2 != 42 && r3 != 42 && r2 != r3);
        assert_eq!(periodic_eval_stream(42, &[2, 1]), r2);
    }

    /// Each `eval_split` takes the periodic evaluation's items from its own place, and only a
    /// share takes them out of the train items.
    #[test]
    fn each_eval_split_evaluates_its_own_items() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, n: usize| {
            let path = dir.path().join(name);
            let lines: Vec<String> = (0..n).map(|i| json!({"prompt": format!("{name} {i}")}).to_string()).collect();
            std::fs::write(&path, lines.join("\n")).unwrap();
            path
        };
        let mut cfg = Config::default();
        cfg.task.train_file = Some(file("train", 10));
        cfg.task.eval_file = Some(file("eval", 6));
        cfg.task.validation_file = Some(file("validation", 5));
        cfg.eval_num_samples = 4;
        let prompts = |cfg: &Config| -> Vec<String> {
            periodic_eval_items(&cfg.split()).unwrap().unwrap().iter().map(|it| it["prompt"].to_string()).collect()
        };
        let trained = |cfg: &Config| crate::task::split::train_items(&cfg.split()).unwrap().len();
        cfg.eval_split = EvalSplit::ValidationFile;
        assert_eq!(prompts(&cfg), ["\"validation 0\"", "\"validation 1\"", "\"validation 2\"", "\"validation 3\""]);
        assert_eq!(trained(&cfg), 10, "every train item is trained on");
        cfg.eval_split = EvalSplit::EvalFile;
        assert!(prompts(&cfg).iter().all(|p| p.contains("eval")));
        assert_eq!(trained(&cfg), 10);
        cfg.eval_split = EvalSplit::TrainShare(0.3);
        assert!(prompts(&cfg).len() == 3 && prompts(&cfg).iter().all(|p| p.contains("train")));
        assert_eq!(trained(&cfg), 7, "the held-out share is not trained on");
        cfg.eval_num_samples = 0;
        assert!(periodic_eval_items(&cfg.split()).unwrap().is_none());
    }

    #[test]
    fn the_first_sample_keeps_the_one_sample_seed() {
        assert_eq!(eval_seed(42, 3, 1, 0), derive_seed(42, &[purpose::EVAL, 3, 1]));
        assert_ne!(eval_seed(42, 3, 1, 1), eval_seed(42, 3, 1, 0));
        assert_ne!(eval_seed(42, 3, 1, 1), eval_seed(42, 3, 1, 2));
    }
}
