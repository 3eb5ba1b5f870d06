//! `pbrl collect`: sample candidates from the current agents, score each joint response with
//! the oracle, build preference pairs, and write the next round file.
//!
//! 1. load the train items and the team (trained agents if the run has them);
//! 2. per batch of `collect_batch_size` items, each agent samples `preference_num_candidates`
//!    completions per item (all of them in one batched call); candidate k of every agent is
//!    joint response k (centralized: candidate k of the one actor, a tagged joint text);
//! 3. the oracle scores each joint response: the task reward on the roles' outputs (centralized:
//!    parsed from the joint text), then reward_processor;
//! 4. pairs: every ordered pair with a positive score gap, ordered by `pair_selection` and cut
//!    to `preference_pairs_per_sample` (reference §5.1);
//! 5. write `<replay dir>/iteration_NNNN.json` atomically (and the reward histogram when asked).
use anyhow::{bail, Result};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::json;

use crate::config::Config;
use crate::prefs::distribution::{distribution_record, histogram, svg};
use crate::prefs::selection::{select_pairs, PairSelection};
use crate::prefs::{existing_rounds, round_path, PreferencePair, RoundFile};
use crate::progress;
use crate::rng::{derive_seed, purpose};
use crate::run::{atomic_write, RunDir};
use crate::task::split::train_items;
use crate::task::{reward::build_reward, TaskItem};
use crate::team::collab::Collaboration;
use crate::team::rollout::rollout;
use crate::team::{check_fits, load_team};

pub struct CollectOptions {
    /// Write this round number instead of the next free one.
    pub round: Option<u32>,
    /// Replace an existing round file.
    pub force: bool,
}

pub struct CollectReport {
    pub path: std::path::PathBuf,
    pub num_pairs: usize,
}

/// Sampling requests per collection batch: every candidate of every item in it.
fn batch_rows(cfg: &Config) -> usize {
    (cfg.collect_batch_size as usize).saturating_mul(cfg.preference_num_candidates as usize)
}

pub fn run(cfg: &Config, run_dir: &RunDir, opts: &CollectOptions) -> Result<CollectReport> {
    // With `eval_split = x` the held-out items are left out; the others keep their file index.
    let (indices, items): (Vec<usize>, Vec<TaskItem>) = train_items(cfg)?.into_iter().unzip();
    let replay_dir = cfg.replay_dir();
    let round = match opts.round {
        Some(0) => bail!("--round counts from 1"),
        Some(n) => n,
        None => existing_rounds(&replay_dir)?.last().map_or(1, |n| n + 1),
    };
    let path = round_path(&replay_dir, round);
    if path.exists() && !opts.force {
        bail!("{} exists; pass --force to replace it, or --round N for another round", path.display());
    }
    let mode = PairSelection::parse(&cfg.pair_selection).expect("validated pair_selection");
    let per_sample = cfg.preference_pairs_per_sample.map(|k| k as usize);
    let n_cand = cfg.preference_num_candidates as usize;
    let (mut reward, processor) = build_reward(&cfg.reward, cfg.reward_timeout_s)?;
    let team = load_team(cfg, run_dir)?;
    let rows = (batch_rows(cfg), "collect_batch_size × preference_num_candidates");
    check_fits(&team, &items, &cfg.max_new_tokens(), rows, "train")?;
    let collab = Collaboration::from_config(cfg);
    let params = cfg.sampling();

    let bar = progress::bar(items.len() as u64, "collect");
    let started = std::time::Instant::now();
    let mut generated = 0usize;
    let mut pairs = Vec::new();
    let mut all_raw = Vec::new();
    let mut all_scores = Vec::new();
    let mut tied_items = 0usize;
    let batch_items = cfg.collect_batch_size as usize;
    for (b, batch) in items.chunks(batch_items).enumerate() {
        let first = b * batch_items;
        let item_index = |j: usize| indices[first + j] as u64;
        let seed = |j: usize, a: usize, k: usize| {
            derive_seed(cfg.seed, &[purpose::COLLECT, round as u64, item_index(j), a as u64, k as u64])
        };
        let out = rollout(&team, batch, n_cand, &params, seed, |n| {
            generated += n;
            let rate = generated as f64 / started.elapsed().as_secs_f64();
            bar.set_message(format!("{} pairs, {rate:.1} tok/s", pairs.len()));
        })?;
        for (j, item) in batch.iter().enumerate() {
            let item_prompts = out.prompts[j].clone();
            let joints: Vec<Vec<String>> = (0..n_cand).map(|k| out.texts(j, k)).collect();
            let roles: Vec<Vec<String>> = joints.iter().map(|j| collab.role_outputs(j)).collect();
            let raw = reward.score_batch(item, &collab.reward_prompts(item, &item_prompts)?, &roles)?;
            let scores: Vec<f64> = raw.iter().map(|&r| processor.apply(r)).collect();
            if let Some(bad) = scores.iter().find(|s| !s.is_finite()) {
                bail!("the reward of train item {} is not finite ({bad})", item_index(j));
            }
            let mean = scores.iter().sum::<f64>() / scores.len() as f64;
            let (lo, hi) = scores.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| (a.min(x), b.max(x)));
            if !mean.is_finite() || !(hi - lo).is_finite() {
                bail!(
                    "train item {}: its processed rewards (up to {hi:e}) overflow when averaged or compared; lower \
                     reward.scale / reward.shift (nothing was written)",
                    item_index(j)
                );
            }
            let mut rng =
                ChaCha8Rng::seed_from_u64(derive_seed(cfg.seed, &[purpose::PAIRS, round as u64, item_index(j)]));
            let chosen = select_pairs(&scores, mode, per_sample, &mut rng);
            if chosen.is_empty() {
                tied_items += 1;
            }
            for (w, l) in chosen {
                pairs.push(PreferencePair {
                    prompts: item_prompts.clone(),
                    winner_completions: joints[w].clone(),
                    loser_completions: joints[l].clone(),
                    winner_reward: scores[w],
                    loser_reward: scores[l],
                    candidate_reward_mean: mean,
                    raw_rewards: None,
                    target_raw_reward: None,
                    comparator_raw_reward: None,
                    winner_finished: Some(out.responses[j][w].iter().map(|c| c.finished).collect()),
                    loser_finished: Some(out.responses[j][l].iter().map(|c| c.finished).collect()),
                });
            }
            all_raw.extend(raw);
            all_scores.extend(scores);
            bar.inc(1);
        }
    }
    bar.finish_and_clear();

    let num_pairs = pairs.len();
    if num_pairs == 0 {
        tracing::warn!("no non-tied preference pairs: every item's candidates scored the same");
        eprintln!("warning: no non-tied preference pairs in this round (every item's candidates tied)");
    }
    let round_file = RoundFile::new(round, pairs);
    if opts.force {
        round_file.save(&path)?;
    } else {
        round_file.save_new(&path)?;
    }
    if cfg.log_reward_distribution {
        let [lo, hi] = cfg.reward_range.expect("validated: reward_range is set");
        let dir = run_dir.root.join("reward_distributions");
        let rec = distribution_record(round, (lo, hi), &all_raw, &[]);
        atomic_write(&dir.join(format!("iteration_{round:04}.json")), serde_json::to_string_pretty(&rec)?.as_bytes())?;
        let (_, counts) = histogram(&all_raw, (lo, hi));
        let title = format!("round {round}: candidate rewards");
        atomic_write(&dir.join(format!("iteration_{round:04}.svg")), svg(&title, (lo, hi), &counts).as_bytes())?;
    }
    let secs = started.elapsed().as_secs_f64();
    let reward_mean = all_scores.iter().sum::<f64>() / all_scores.len().max(1) as f64;
    run_dir.log_metrics(&json!({
        "stage": "collect", "time": chrono::Utc::now().to_rfc3339(), "iteration": round,
        "collect/num_pairs": num_pairs, "collect/reward_mean": reward_mean,
        "collect/tied_items": tied_items, "collect/tokens_per_s": generated as f64 / secs,
    }))?;
    println!(
        "round {round}: {num_pairs} pairs from {} items ({tied_items} tied), candidate reward mean {reward_mean:.4}",
        items.len()
    );
    println!("wrote {} in {secs:.1} s ({:.1} tok/s)", path.display(), generated as f64 / secs);
    Ok(CollectReport { path, num_pairs })
}
