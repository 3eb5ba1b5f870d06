//! `collect`'s round over multi-turn discussions (`num_turns` > 1): preferences between whole
//! joint histories of one item.
//!
//! Per batch of `batch_items` items: the team holds `candidates` discussions of each item
//! (`team::discussion::discuss`: turn 1 from the one-turn streams `[COLLECT, round, item,
//! actor, k]`, later turns from `[COLLECT_TURN, round, item, actor, k, turn]`), each a single
//! branch of `num_turns` turns; the task reward scores every turn's joint response; a history's
//! score is `history_reward`'s (its last turn's, or the sum); pairs among the item's histories
//! as among one-turn candidates (`select_pairs`, stream `[PAIRS, round, item]`), each holding
//! every turn of both sides.
use anyhow::{bail, Result};
use indicatif::ProgressBar;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::{Round, RoundSpec};
use crate::config::TurnsConfig;
use crate::oracle::Oracle;
use crate::prefs::selection::select_pairs;
use crate::prefs::{PreferencePair, TurnRecord};
use crate::rng::{derive_seed, purpose};
use crate::task::transition::Transition;
use crate::task::TaskItem;
use crate::team::discussion::{discuss, DiscussionSeeds, Turn};
use crate::team::Agent;
use pbrl_model::sampling::SamplingParams;

/// Build round `spec.round` of discussions over `items` (each with its index in the task file).
pub fn build_history_round(
    spec: &RoundSpec,
    items: &[(usize, TaskItem)],
    team: &[Agent],
    params: &[SamplingParams],
    turns: &TurnsConfig,
    oracle: &mut Oracle,
    bar: &ProgressBar,
) -> Result<Round> {
    let started = std::time::Instant::now();
    let mut transition = Transition::of(&turns.transition)?;
    let mut out = Round::default();
    for batch in items.chunks(spec.collect.batch_items.max(1)) {
        let batch_items: Vec<TaskItem> = batch.iter().map(|(_, it)| it.clone()).collect();
        let indices: Vec<usize> = batch.iter().map(|(i, _)| *i).collect();
        let round = spec.round as u64;
        let seeds = DiscussionSeeds {
            first: &|j, a, k| {
                derive_seed(spec.collect.seed, &[purpose::COLLECT, round, indices[j] as u64, a as u64, k as u64])
            },
            later: &|j, a, k, t| {
                let path = [purpose::COLLECT_TURN, round, indices[j] as u64, a as u64, k as u64, t as u64];
                derive_seed(spec.collect.seed, &path)
            },
        };
        let mut tokens = out.tokens;
        let discussions = discuss(
            team,
            &mut transition,
            turns,
            &batch_items,
            &indices,
            spec.collect.candidates,
            params,
            &seeds,
            |n| {
                tokens += n;
                bar.set_message(format!("{:.1} tok/s", tokens as f64 / started.elapsed().as_secs_f64()));
            },
        )?;
        out.tokens = tokens;
        for ((index, item), histories) in batch.iter().zip(&discussions) {
            let (raw, records) = score_histories(oracle, item, *index, histories)?;
            let score = |r: &[TurnRecord]| turns.history_reward.score(&r.iter().map(|t| t.reward).collect::<Vec<_>>());
            let processed: Vec<f64> = records.iter().map(|r| score(r)).collect();
            let raw: Vec<f64> = raw.iter().map(|r| turns.history_reward.score(r)).collect();
            let mean = processed.iter().sum::<f64>() / processed.len() as f64;
            if !mean.is_finite() {
                bail!("train item {index}: its histories' scores overflow when averaged; lower reward.scale / reward.shift");
            }
            let mut rng =
                ChaCha8Rng::seed_from_u64(derive_seed(spec.collect.seed, &[purpose::PAIRS, round, *index as u64]));
            let before = out.pairs.len();
            for (w, l) in select_pairs(&processed, spec.collect.selection, spec.collect.pairs_per_sample, &mut rng) {
                let (win, lose) = (&histories[w], &histories[l]);
                let last = |h: &[Turn]| h.last().expect("a history has a turn").texts();
                let finished = |h: &[Turn]| h.last().map(|t| t.completions.iter().map(|c| c.finished).collect());
                out.pairs.push(PreferencePair {
                    prompts: win[0].prompts.clone(),
                    winner_completions: last(win),
                    loser_completions: last(lose),
                    winner_reward: processed[w],
                    loser_reward: processed[l],
                    candidate_reward_mean: mean,
                    raw_rewards: None,
                    target_raw_reward: None,
                    comparator_raw_reward: None,
                    winner_finished: finished(win),
                    loser_finished: finished(lose),
                    winner_turns: Some(records[w].clone()),
                    loser_turns: Some(records[l].clone()),
                });
            }
            out.tied_items += usize::from(out.pairs.len() == before);
            out.raw[0].extend(raw);
            out.processed[0].extend(processed);
            bar.inc(1);
        }
    }
    out.secs = started.elapsed().as_secs_f64();
    Ok(out)
}

/// Per history, each turn's raw reward, and its turns as round records (the processed reward
/// of each turn).
type ScoredHistories = (Vec<Vec<f64>>, Vec<Vec<TurnRecord>>);

/// Score every history's turns. Turn 1's joint responses share their prompts: one call scores
/// them.
fn score_histories(
    oracle: &mut Oracle,
    item: &TaskItem,
    index: usize,
    histories: &[Vec<Turn>],
) -> Result<ScoredHistories> {
    let joints: Vec<Vec<String>> = histories.iter().map(|h| h[0].texts()).collect();
    let first = oracle.score(item, &histories[0][0].prompts, &joints)?;
    let (mut raw, mut records) = (Vec::new(), Vec::new());
    for (k, history) in histories.iter().enumerate() {
        let mut r = vec![first.raw[k]];
        let mut rec = Vec::with_capacity(history.len());
        for (t, turn) in history.iter().enumerate() {
            let processed = match t {
                0 => first.processed[k],
                _ => {
                    let s = oracle.score(item, &turn.prompts, &[turn.texts()])?;
                    r.push(s.raw[0]);
                    s.processed[0]
                }
            };
            if !processed.is_finite() {
                bail!("the reward of train item {index} (discussion {k}, turn {}) is not finite ({processed})", t + 1);
            }
            let finished = turn.completions.iter().map(|c| c.finished).collect();
            rec.push(TurnRecord {
                prompts: turn.prompts.clone(),
                completions: turn.texts(),
                finished,
                reward: processed,
            });
        }
        raw.push(r);
        records.push(rec);
    }
    Ok((raw, records))
}
