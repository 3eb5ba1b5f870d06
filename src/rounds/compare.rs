//! Iterate's comparison round: the current team against the comparator on the round's train
//! items, scored by the task reward (or, for MARLHF with `preference_scoring_reward =
//! "reward_model"`, by the previous round's reward model), written as the round file with both
//! sides' reward histograms.
use anyhow::Result;

use super::{build_round, RoundSpec, Scorer};
use crate::algo::trend::mean;
use crate::config::CompareConfig;
use crate::device::parse_device;
use crate::oracle::Oracle;
use crate::prefs::{round_path, PreferencePair, RoundFile};
use crate::progress;
use crate::reward_model::JointRewardModel;
use crate::run::iterate_log::RoundStats;
use crate::run::RunDir;
use crate::sources::comparator::{self, Comparator};
use crate::sources::{Agents, TeamSource};
use crate::task::TaskItem;
use crate::team::{check_fits, load_team};

/// Round `round`'s comparisons over `items` (the round's train items), written as its round file.
pub fn compare_round(
    cfg: &CompareConfig,
    run_dir: &RunDir,
    round: u32,
    items: &[(usize, TaskItem)],
) -> Result<RoundStats> {
    let team = load_team(&cfg.team, run_dir)?;
    let (n_cur, n_cmp) = (cfg.collect.candidates, cfg.collect.comparator_candidates);
    let spec = RoundSpec::of(&cfg.collect, round, n_cmp);
    let comparator = comparator::build(&cfg.comparator, run_dir, round, &team)?;
    // The team as its own comparator samples both sides' rows in one call.
    let rows = match comparator {
        Comparator::Team => (n_cur.saturating_add(n_cmp), "collect_batch_size × (both sides' candidates)"),
        Comparator::Source(_) => (n_cur.max(n_cmp), "collect_batch_size × candidates"),
    };
    let item_list: Vec<TaskItem> = items.iter().map(|(_, it)| it.clone()).collect();
    check_fits(
        &team,
        &item_list,
        &cfg.collect.max_new_tokens,
        (spec.collect.batch_items.saturating_mul(rows.0), rows.1),
        "train",
    )?;
    // MARLHF with preference_scoring_reward = "reward_model": the newest fitted reward model (the
    // previous round's) scores both sides, raw and processed alike (reference §5.2).
    let rm_dir = run_dir.reward_model();
    let mut scorer = if cfg.score_with_reward_model && JointRewardModel::exists(&rm_dir) {
        Scorer::RewardModel(Box::new(JointRewardModel::load(
            &rm_dir,
            &parse_device(&cfg.reward_model_device, "reward_model_device")?,
            crate::team::frozen_storage(cfg.frozen_dtype),
        )?))
    } else {
        Scorer::Oracle(Oracle::new(&cfg.oracle)?)
    };
    let bar = progress::bar(items.len() as u64, "iterate: compare");
    let source = TeamSource::new(Agents::Borrowed(&team), cfg.collect.sampling.clone());
    let mut built = build_round(&spec, items, &source, Some(&comparator), &mut scorer, &bar)?;
    bar.finish_and_clear();
    let stats = RoundStats {
        items: items.len(),
        pairs: built.pairs.len(),
        current_wins: built.current_wins,
        current_mean: mean(&built.raw[0]),
        comparator_mean: mean(&built.raw[1]),
        comparator_unparsed: built.unparsed,
        comparator_truncated: built.truncated,
    };
    if built.unparsed > 0 {
        tracing::warn!(
            round,
            unparsed = built.unparsed,
            "centralized comparator replies without any <agent_i> section"
        );
    }
    if built.truncated > 0 {
        tracing::warn!(
            round,
            truncated = built.truncated,
            "comparator API replies longer than max_new_tokens, cut there"
        );
    }
    RoundFile::new(round, std::mem::take(&mut built.pairs)).save_new(&round_path(run_dir.replay(), round))?;
    // Every round: both sides' histograms over `reward_range`, else over the round's own range.
    built.write_histograms(run_dir, round, cfg.collect.reward_range)?;
    Ok(stats)
}

/// The statistics of a round file written before its round was cut short (`items`: the round's
/// train items).
pub fn stats_of_file(r: &RoundFile, items: usize) -> RoundStats {
    let current_wins = r
        .pairs
        .iter()
        .filter(|p| p.target_raw_reward.zip(p.raw_rewards.as_ref()).is_some_and(|(t, w)| w[0] == t))
        .count();
    let side_mean =
        |f: &dyn Fn(&PreferencePair) -> Option<f64>| mean(&r.pairs.iter().filter_map(f).collect::<Vec<f64>>());
    RoundStats {
        items,
        pairs: r.num_pairs,
        current_wins,
        current_mean: side_mean(&|p| p.target_raw_reward),
        comparator_mean: side_mean(&|p| p.comparator_raw_reward),
        comparator_unparsed: 0,
        comparator_truncated: 0,
    }
}
