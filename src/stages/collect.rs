//! `pbrl collect`: sample candidates from the current agents, score each joint response with
//! the oracle, build preference pairs, and write the next round file.
//!
//! 1. load the train items and the team (trained agents if the run has them);
//! 2. the round (`rounds::build_round`, the team as its only source): per batch of
//!    `collect_batch_size` items, each agent samples `preference_num_candidates` completions per
//!    item (all of them in one batched call); candidate k of every agent is joint response k
//!    (centralized: candidate k of the one actor, a tagged joint text); the oracle scores each
//!    joint response (the task reward on the roles' outputs, then reward_processor); pairs are
//!    every ordered pair with a positive score gap, ordered by `pair_selection` and cut to
//!    `preference_pairs_per_sample` (reference §5.1); with `num_turns` > 1
//!    (`rounds::discussions::build_history_round`) the candidates are whole discussions, each
//!    scored by its history's score, and every pair holds every turn of both sides;
//! 3. write `<replay dir>/iteration_NNNN.json` atomically (and the reward histogram when asked).
use anyhow::{bail, Result};
use serde_json::json;

use crate::algo::trend::mean;
use crate::config::Config;
use crate::oracle::Oracle;
use crate::prefs::{existing_rounds, round_path, RoundFile};
use crate::progress;
use crate::rounds::discussions::build_history_round;
use crate::rounds::{build_round, RoundSpec, Scorer};
use crate::run::RunDir;
use crate::sources::{Agents, TeamSource};
use crate::task::split::train_items;
use crate::task::TaskItem;
use crate::team::discussion::check_discussion_fits;
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

pub fn run(cfg: &Config, run_dir: &RunDir, opts: &CollectOptions) -> Result<CollectReport> {
    let replay_dir = run_dir.replay().to_path_buf();
    let round = match opts.round {
        Some(0) => bail!("--round counts from 1"),
        Some(n) => n,
        None => existing_rounds(&replay_dir)?.last().map_or(1, |n| n + 1),
    };
    let path = round_path(&replay_dir, round);
    if path.exists() && !opts.force {
        bail!("{} exists; pass --force to replace it, or --round N for another round", path.display());
    }
    cfg.aligned("collect")?;
    let collect = cfg.collect();
    let turns = cfg.turns();
    let spec = RoundSpec::of(&collect, round, 0);
    let mut oracle = Oracle::new(&cfg.oracle())?;
    let team = load_team(&cfg.team()?, run_dir)?;
    // Sampling requests per collection batch: every candidate of every item in it.
    let rows = (
        spec.collect.batch_items.saturating_mul(spec.collect.candidates),
        "collect_batch_size × preference_num_candidates",
    );
    let items: Vec<(usize, TaskItem)> = train_items(&cfg.split())?;
    let item_list: Vec<TaskItem> = items.iter().map(|(_, it)| it.clone()).collect();
    check_fits(&team, &item_list, &collect.max_new_tokens, rows, "train")?;

    let bar = progress::bar(items.len() as u64, "collect");
    let mut built = match &turns {
        // Discussions: preferences between whole joint histories (`rounds::discussions`).
        Some(turns) => {
            check_discussion_fits(&team, &item_list, &collect.max_new_tokens, rows, "train", turns)?;
            build_history_round(&spec, &items, &team, &collect.sampling, turns, &mut oracle, &bar)?
        }
        None => {
            let source = TeamSource::new(Agents::Borrowed(&team), collect.sampling.clone());
            build_round(&spec, &items, &source, None, &mut Scorer::Oracle(oracle), &bar)?
        }
    };
    bar.finish_and_clear();
    let pairs = std::mem::take(&mut built.pairs);
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
    if collect.log_reward_distribution {
        built.write_histograms(run_dir, round, collect.reward_range)?;
    }
    let (secs, tied_items, generated) = (built.secs, built.tied_items, built.tokens);
    let reward_mean = mean(&built.processed[0]);
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
