//! The evaluation of multi-turn discussions (CoMLRL 1.4.3's `MAGRPOTrainer.evaluate`): each
//! sample of an item is one branch of a discussion, every agent answering once per turn, the
//! transition writing the next turn's prompts from that branch; the task reward scores each
//! turn's joint response. Early termination does not apply: every discussion runs all turns.
//!
//! Turn 1 draws from the one-turn evaluation's streams, so its rewards are what a one-turn
//! evaluation of the same team gives; later turns from streams of their own. Every turn samples
//! all branches of a batch in one call per actor.
use anyhow::{bail, Result};
use serde_json::{json, Value};

use super::{eval_seed, stderr_over_items, Evaluation};
use crate::algo::trend::{item_means, paired_gain};
use crate::config::{EvalConfig, TurnsConfig};
use crate::oracle::Oracle;
use crate::progress;
use crate::rng::{derive_seed, purpose};
use crate::task::transition::Transition;
use crate::task::TaskItem;
use crate::team::discussion::{check_discussion_fits, discuss, DiscussionSeeds};
use crate::team::Agent;

/// A multi-turn evaluation's rewards: `rewards[t][r]`, record r's reward at turn t + 1.
#[derive(Debug, Clone)]
pub struct TurnRewards {
    pub rewards: Vec<Vec<f64>>,
    pub samples_per_item: usize,
}

impl TurnRewards {
    /// The reference's per-turn metrics (`eval/turn_t/reward_mean`, `eval/turn_t/expected_return`:
    /// the mean undiscounted sum of the rewards from turn t on), each turn's standard error over
    /// items, the history score's mean and standard error, and the last turn's gain over the
    /// first, paired by item.
    pub fn metrics(&self, history_mean: f64, history_stderr: f64) -> Value {
        let k = self.samples_per_item;
        let mut m = json!({"eval/history_reward_mean": history_mean, "eval/history_reward_stderr": history_stderr});
        let records = self.rewards.first().map_or(0, Vec::len);
        for t in 0..self.rewards.len() {
            let rewards = &self.rewards[t];
            let to_go: Vec<f64> = (0..records).map(|r| self.rewards[t..].iter().map(|turn| turn[r]).sum()).collect();
            m[format!("eval/turn_{}/reward_mean", t + 1)] = json!(crate::algo::trend::mean(rewards));
            m[format!("eval/turn_{}/reward_stderr", t + 1)] = json!(stderr_over_items(rewards, k));
            m[format!("eval/turn_{}/expected_return", t + 1)] = json!(crate::algo::trend::mean(&to_go));
        }
        if let (Some(first), Some(last)) = (self.rewards.first(), self.rewards.last()) {
            let gain = paired_gain(&item_means(first, k), &item_means(last, k));
            m["eval/last_over_first_mean"] = json!(gain.mean);
            m["eval/last_over_first_stderr"] = json!(gain.se);
        }
        m
    }
}

/// The seed of agent `agent`'s answer at turn `turn` (from 2) of sample `sample` of eval item
/// `item`.
fn turn_seed(stream: u64, item: usize, agent: usize, sample: usize, turn: usize) -> u64 {
    derive_seed(stream, &[purpose::EVAL_TURN, item as u64, agent as u64, sample as u64, turn as u64])
}

/// Evaluate `team` on `items` in discussions of `turns.num_turns` turns.
pub(super) fn evaluate_discussions(
    cfg: &EvalConfig,
    turns: &TurnsConfig,
    team: &[Agent],
    items: &[TaskItem],
    oracle: &mut Oracle,
    stream: u64,
) -> Result<Evaluation> {
    check_discussion_fits(team, items, &cfg.max_new_tokens(), cfg.rows, "eval", turns)?;
    let mut transition = Transition::of(&turns.transition)?;
    let k = cfg.samples_per_item;
    let bar = progress::bar(items.len() as u64, "eval");
    let mut generated = 0usize;
    let (mut records, mut rewards) = (Vec::new(), Vec::new());
    let mut turn_rewards = vec![Vec::new(); turns.num_turns];
    for (batch_idx, batch) in items.chunks(cfg.batch_items).enumerate() {
        let first = batch_idx * cfg.batch_items;
        let indices: Vec<usize> = (first..first + batch.len()).collect();
        let seeds = DiscussionSeeds {
            first: &|j, a, s| eval_seed(stream, first + j, a, s),
            later: &|j, a, s, turn| turn_seed(stream, first + j, a, s, turn),
        };
        let discussions =
            discuss(team, &mut transition, turns, batch, &indices, k, &cfg.sampling, &seeds, |n| generated += n)?;
        for (j, (item, samples)) in batch.iter().zip(&discussions).enumerate() {
            // Turn 1's samples share their prompts: one call scores them all.
            let joints: Vec<Vec<String>> = samples.iter().map(|h| h[0].texts()).collect();
            let first_turn = oracle.score(item, &samples[0][0].prompts, &joints)?.processed;
            for (s, history) in samples.iter().enumerate() {
                let mut score = vec![first_turn[s]];
                for turn in &history[1..] {
                    score.push(oracle.score(item, &turn.prompts, &[turn.texts()])?.processed[0]);
                }
                if let Some(bad) = score.iter().find(|r| !r.is_finite()) {
                    bail!("the reward of eval item {} (sample {s}) is not finite ({bad})", first + j);
                }
                let record_turns: Vec<Value> = history
                    .iter()
                    .zip(&score)
                    .map(|(t, r)| json!({"prompts": t.prompts, "completions": t.texts(), "reward": r}))
                    .collect();
                let total = turns.history_reward.score(&score);
                score.iter().enumerate().for_each(|(t, r)| turn_rewards[t].push(*r));
                rewards.push(total);
                let last = record_turns.last().cloned().unwrap_or_default();
                records.push(json!({"item": item, "sample": s, "prompts": last["prompts"],
                    "completions": last["completions"], "reward": total, "turns": record_turns}));
            }
        }
        bar.inc(batch.len() as u64);
    }
    bar.finish_and_clear();
    let turn_rewards = Some(TurnRewards { rewards: turn_rewards, samples_per_item: k });
    Evaluation::of(records, rewards, k, generated, turn_rewards)
}
