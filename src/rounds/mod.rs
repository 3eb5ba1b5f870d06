//! One round builder for `collect` and `iterate`: (the team's source, an optional comparator
//! source, the scorer, the pair selection) → the round's preference pairs and its rewards;
//! iterate's comparison round around it in `compare.rs`.
//!
//! Per batch of `batch_items` items:
//! 1. the team answers each item `candidates` times (streams `[COLLECT, round, item, actor, k]`),
//!    the comparator `comparator_candidates` times (`[COMPARATOR, round, item, actor, k]`); when
//!    the comparator is the team itself, both sides' rows go through one sampling call (a row's
//!    tokens depend on its stream and its logits only);
//! 2. the scorer scores every joint response: the task reward on the roles' outputs, then
//!    `reward_processor` (or a fitted reward model, raw and processed alike); a non-finite score,
//!    or scores whose mean or spread overflow, stop the round before anything is written;
//! 3. pairs (stream `[PAIRS, round, item]`): without a comparator, among the team's candidates
//!    (`select_pairs`); with one, candidate k of one side against candidate k of the other, either
//!    side winning (`select_comparison_pairs`); ordered by `pair_selection`, cut to
//!    `preference_pairs_per_sample`.
pub mod compare;
pub mod discussions;

use anyhow::{bail, Context, Result};
use indicatif::ProgressBar;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::config::CollectConfig;
use crate::oracle::{Oracle, Scores};
use crate::prefs::distribution::{comparison_record, distribution_record, histogram, svg};
use crate::prefs::selection::{select_comparison_pairs, select_pairs, Winner};
use crate::prefs::PreferencePair;
use crate::reward_model::JointRewardModel;
use crate::rng::{derive_seed, purpose};
use crate::run::{atomic_write, RunDir};
use crate::sources::comparator::Comparator;
use crate::sources::{JointResponses, ResponseSource};
use crate::task::TaskItem;

/// What scores a joint response in a round.
pub enum Scorer {
    /// The task reward on the roles' outputs, then the reward processor.
    Oracle(Oracle),
    /// A fitted joint reward model (MARLHF's `preference_scoring_reward = "reward_model"`).
    RewardModel(Box<JointRewardModel>),
}

impl Scorer {
    /// (raw, processed) scores of an item's joint responses; `prompts` are the team's actors'.
    fn score(
        &mut self,
        item: &TaskItem,
        item_index: u64,
        prompts: &[String],
        joints: &[Vec<String>],
    ) -> Result<(Vec<f64>, Vec<f64>)> {
        match self {
            Scorer::RewardModel(rm) => {
                let rows = joints.iter().map(|x| rm.encode(prompts, x)).collect::<Result<Vec<_>>>()?;
                let s = rm.score(&rows, rows.len())?;
                if let Some(bad) = s.iter().find(|v| !v.is_finite()) {
                    bail!("the reward model scored a candidate of train item {item_index} {bad}");
                }
                Ok((s.clone(), s))
            }
            Scorer::Oracle(oracle) => {
                let Scores { raw, processed } = oracle.score(item, prompts, joints)?;
                if let Some(bad) = processed.iter().find(|s| !s.is_finite()) {
                    bail!("the reward of train item {item_index} is not finite ({bad})");
                }
                Ok((raw, processed))
            }
        }
    }
}

/// How a round is built: its number, the comparator's joint responses per item (0 without
/// one), and the collection's settings (seed, candidates, batches, pair selection).
pub struct RoundSpec<'c> {
    pub round: u32,
    pub comparator_candidates: usize,
    pub collect: &'c CollectConfig,
}

impl<'c> RoundSpec<'c> {
    /// Round `round` as the config sets it, with `comparator_candidates` joint responses per
    /// item from the comparator (0 without one).
    pub fn of(cfg: &'c CollectConfig, round: u32, comparator_candidates: usize) -> Self {
        Self { round, comparator_candidates, collect: cfg }
    }
}

/// A built round: its pairs, and each side's rewards (`[team, comparator]`).
#[derive(Default)]
pub struct Round {
    pub pairs: Vec<PreferencePair>,
    /// Every candidate's raw reward, and its processed score.
    pub raw: [Vec<f64>; 2],
    pub processed: [Vec<f64>; 2],
    /// The raw rewards of the candidates that went into pairs (comparison rounds).
    pub selected_raw: [Vec<f64>; 2],
    /// Items whose candidates all tied (no pair).
    pub tied_items: usize,
    /// Pairs the team's candidate won (comparison rounds).
    pub current_wins: usize,
    /// The comparator's tagged replies without any role section, and its replies cut at
    /// `max_new_tokens`.
    pub unparsed: usize,
    pub truncated: usize,
    /// Tokens the sources decoded, and the seconds the round took.
    pub tokens: usize,
    pub secs: f64,
}

/// Build round `spec.round` over `items` (each with its index in the task file, which seeds it).
pub fn build_round(
    spec: &RoundSpec,
    items: &[(usize, TaskItem)],
    team: &dyn ResponseSource,
    comparator: Option<&Comparator>,
    scorer: &mut Scorer,
    bar: &ProgressBar,
) -> Result<Round> {
    let started = std::time::Instant::now();
    let mut out = Round::default();
    for batch in items.chunks(spec.collect.batch_items.max(1)) {
        let batch_items: Vec<TaskItem> = batch.iter().map(|(_, it)| it.clone()).collect();
        let index = |j: usize| batch[j].0 as u64;
        let seed = |p: u64| {
            move |j: usize, a: usize, k: usize| {
                derive_seed(spec.collect.seed, &[p, spec.round as u64, index(j), a as u64, k as u64])
            }
        };
        let pairs_so_far = out.pairs.len();
        let mut tokens = out.tokens;
        let mut on_tokens = |n: usize| {
            tokens += n;
            let rate = tokens as f64 / started.elapsed().as_secs_f64();
            bar.set_message(format!("{pairs_so_far} pairs, {rate:.1} tok/s"));
        };
        let (n, collect, compare) = (spec.collect.candidates, seed(purpose::COLLECT), seed(purpose::COMPARATOR));
        let (current, other): (JointResponses, Option<Vec<Vec<Vec<String>>>>) = match comparator {
            None => (team.sample(&batch_items, n, &collect, &mut on_tokens)?, None),
            Some(Comparator::Team) => {
                // Responses 0..n are the team's, n.. the comparator's, each under its own stream.
                let both = |j: usize, a: usize, k: usize| if k < n { collect(j, a, k) } else { compare(j, a, k - n) };
                let mut all = team.sample(&batch_items, n + spec.comparator_candidates, &both, &mut on_tokens)?;
                let other = all.texts.iter_mut().map(|texts| texts.split_off(n)).collect();
                if let Some(rollout) = all.rollout.as_mut() {
                    rollout.responses.iter_mut().for_each(|r| r.truncate(n));
                }
                (all, Some(other))
            }
            Some(Comparator::Source(c)) => {
                let current = team.sample(&batch_items, n, &collect, &mut on_tokens)?;
                let r = c.sample(&batch_items, spec.comparator_candidates, &compare, &mut on_tokens)?;
                out.unparsed += r.unparsed;
                out.truncated += r.truncated;
                (current, Some(r.texts))
            }
        };
        out.tokens = tokens;
        let rollout = current.rollout.as_ref().expect("the team's source samples its actors");
        for (j, item) in batch_items.iter().enumerate() {
            let prompts = &rollout.prompts[j];
            let cur = &current.texts[j];
            let (rc, pc) = scorer.score(item, index(j), prompts, cur)?;
            let cmp = other.as_ref().map(|texts| &texts[j]);
            let (rm, pm) = match cmp {
                Some(texts) => scorer.score(item, index(j), prompts, texts)?,
                None => (vec![], vec![]),
            };
            let all: Vec<f64> = pc.iter().chain(&pm).copied().collect();
            let mean = all.iter().sum::<f64>() / all.len() as f64;
            let (lo, hi) = all.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| (a.min(x), b.max(x)));
            if !mean.is_finite() || !(hi - lo).is_finite() {
                bail!(
                    "train item {}: its processed rewards (up to {hi:e}) overflow when averaged or compared; lower \
                     reward.scale / reward.shift (nothing was written)",
                    index(j)
                );
            }
            let mut rng = ChaCha8Rng::seed_from_u64(derive_seed(
                spec.collect.seed,
                &[purpose::PAIRS, spec.round as u64, index(j)],
            ));
            let before = out.pairs.len();
            match cmp {
                None => {
                    for (w, l) in select_pairs(&pc, spec.collect.selection, spec.collect.pairs_per_sample, &mut rng) {
                        let finished = |k: usize| Some(rollout.responses[j][k].iter().map(|c| c.finished).collect());
                        out.pairs.push(PreferencePair {
                            prompts: prompts.clone(),
                            winner_completions: cur[w].clone(),
                            loser_completions: cur[l].clone(),
                            winner_reward: pc[w],
                            loser_reward: pc[l],
                            candidate_reward_mean: mean,
                            raw_rewards: None,
                            target_raw_reward: None,
                            comparator_raw_reward: None,
                            winner_finished: finished(w),
                            loser_finished: finished(l),
                            winner_turns: None,
                            loser_turns: None,
                        });
                    }
                }
                Some(cmp) => {
                    for (k, winner) in select_comparison_pairs(
                        &pc,
                        &pm,
                        spec.collect.selection,
                        spec.collect.pairs_per_sample,
                        &mut rng,
                    ) {
                        let (w, l, (wr, lr), (wraw, lraw)) = match winner {
                            Winner::Current => (&cur[k], &cmp[k], (pc[k], pm[k]), (rc[k], rm[k])),
                            Winner::Comparator => (&cmp[k], &cur[k], (pm[k], pc[k]), (rm[k], rc[k])),
                        };
                        out.pairs.push(PreferencePair {
                            prompts: prompts.clone(),
                            winner_completions: w.clone(),
                            loser_completions: l.clone(),
                            winner_reward: wr,
                            loser_reward: lr,
                            candidate_reward_mean: mean,
                            raw_rewards: Some(vec![wraw, lraw]),
                            target_raw_reward: Some(rc[k]),
                            comparator_raw_reward: Some(rm[k]),
                            winner_finished: None,
                            loser_finished: None,
                            winner_turns: None,
                            loser_turns: None,
                        });
                        out.selected_raw[0].push(rc[k]);
                        out.selected_raw[1].push(rm[k]);
                        out.current_wins += usize::from(winner == Winner::Current);
                    }
                }
            }
            out.tied_items += usize::from(out.pairs.len() == before);
            out.raw[0].extend(rc);
            out.processed[0].extend(pc);
            out.raw[1].extend(rm);
            out.processed[1].extend(pm);
            bar.inc(1);
        }
    }
    out.secs = started.elapsed().as_secs_f64();
    Ok(out)
}

impl Round {
    /// The round's reward histograms (reference §9) in `reward_distributions/`: a collection
    /// round's candidates over `range`; a comparison round's two sides, over `range` or else
    /// the round's own range.
    pub fn write_histograms(&self, run_dir: &RunDir, round: u32, range: Option<(f64, f64)>) -> Result<()> {
        let json = |rec: serde_json::Value| -> Result<()> {
            atomic_write(
                &run_dir.reward_distribution(round, "", "json"),
                serde_json::to_string_pretty(&rec)?.as_bytes(),
            )
        };
        let chart = |side: &str, values: &[f64], range: (f64, f64)| -> Result<()> {
            let (_, counts) = histogram(values, range);
            let (title, suffix) = match side {
                "" => (format!("round {round}: candidate rewards"), String::new()),
                side => (format!("round {round}: {side} candidate rewards"), format!("_{side}")),
            };
            atomic_write(&run_dir.reward_distribution(round, &suffix, "svg"), svg(&title, range, &counts).as_bytes())
        };
        let [raw_cur, raw_cmp] = &self.raw;
        if raw_cmp.is_empty() {
            let range = range.context("a collection round's histogram needs reward_range")?;
            json(distribution_record(round, range, raw_cur, &[]))?;
            return chart("", raw_cur, range);
        }
        let range = range.unwrap_or_else(|| {
            let all = raw_cur.iter().chain(raw_cmp).copied().filter(|v| v.is_finite());
            let (lo, hi) = all.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| (a.min(x), b.max(x)));
            if lo < hi {
                (lo, hi)
            } else if lo.is_finite() {
                (lo - 0.5, lo + 0.5)
            } else {
                (0.0, 1.0)
            }
        });
        let [sel_cur, sel_cmp] = &self.selected_raw;
        json(comparison_record(round, range, [raw_cur, raw_cmp], [sel_cur, sel_cmp]))?;
        chart("target", raw_cur, range)?;
        chart("comparator", raw_cmp, range)
    }
}
