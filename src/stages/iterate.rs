//! `pbrl iterate`: iterative MADPO or MARLHF (reference §8): `num_iterations` rounds, each
//! comparing the current team with a comparator on the train items (every one, the reference's,
//! or `items_per_round` of them), then training on the replay selection.
//!
//! Before round 1: the base team evaluated (round 0). Round ν:
//! 1. compare (`rounds::compare`) on the round's train items (`task::split::items_of_round`):
//!    the current team samples `preference_num_candidates` joint responses per item, the
//!    comparator (`sources::comparator`: `current`, `current_copy`, `model`, `history`, `api`,
//!    each possibly centralized) `comparator_num_candidates`; the task reward (or, for MARLHF
//!    with `preference_scoring_reward = "reward_model"`, the previous round's reward model)
//!    scores both sides; candidate k of one side meets candidate k of the other, either side
//!    winning, ordered by `pair_selection` and cut to `preference_pairs_per_sample`; the round
//!    file `iteration_ν.json` is written whole, with both sides' reward histograms;
//! 2. train (`train::round`): MADPO on the replay selection, or a fresh reward model fitted on
//!    it and then MARLHF;
//! 3. the team kept as `policy_checkpoints/iteration_{ν−1}` (`run::team`), evaluated on the
//!    eval prompts (the same every round), and the round recorded (`run::iterate_log`): its
//!    trend over the rounds so far paired by prompt (the gain over the base team and over round
//!    1, the per-prompt slope, each ± its s.e.), its `iter/*` metrics and the plot (`report`),
//!    `iterate/round_ν.json`.
//!
//! Within one process a round's statistics and the summaries so far are passed on, not read
//! back; the disk is the resume point. `--resume` continues after the last finished round
//! (`iterate/round_ν.json` marks it); a round cut short is repeated from the team the previous
//! round left, so its pairs and agents are the ones an uninterrupted run makes. A run directory
//! that holds rounds is never reused without `--resume`, and resuming under another config is
//! refused (the number of rounds may grow).
use anyhow::{bail, Result};

use crate::config::{ComparatorPolicy, Config};
use crate::evaluation::evaluate_round;
use crate::prefs::{round_path, RoundFile};
use crate::report::{log_round_metrics, write_rounds_plot};
use crate::rounds::compare::{compare_round, stats_of_file};
use crate::run::fingerprint::Fingerprint;
use crate::run::iterate_log::{IterateLog, RoundSummary, RoundTimes};
use crate::run::team::{restore_round_input, snapshot_round_team};
use crate::run::RunDir;
use crate::task::split::{items_of_round, train_items};
use crate::train::round::train_round;

pub struct IterateOptions {
    pub resume: bool,
}

pub fn run(cfg: &Config, run_dir: &RunDir, opts: &IterateOptions) -> Result<()> {
    // Everything a round will need is checked before the run directory records anything, so a
    // mistake found here leaves it usable for the corrected command.
    let split = cfg.split();
    let items = train_items(&split)?;
    if items.is_empty() {
        bail!("no train items to compare on");
    }
    let (compare, training, evaluation) = (cfg.compare()?, cfg.round_training()?, cfg.evaluation()?);
    if compare.comparator.policy == ComparatorPolicy::Api {
        crate::sources::api::settings(&compare.comparator.api)?; // the format, the URL, the key's variable
    }
    // The setup a resumed run must share: every key but the number of rounds, which may grow.
    let mut fingerprint = Fingerprint::of_training(&cfg.fingerprinted()?, &[], &compare.team.sources)?;
    fingerprint.0.retain(|k, _| k != "num_iterations");
    let rounds = cfg.num_iterations as u32;
    let mut log = IterateLog::open(run_dir, &fingerprint, opts.resume, rounds)?;
    let history_k = match compare.comparator.policy {
        ComparatorPolicy::History(k) => Some(k as usize),
        _ => None,
    };
    let started = std::time::Instant::now();
    if !log.finished(0) {
        let eval = evaluate_round(&evaluation, run_dir)?;
        finish_round(run_dir, &mut log, RoundSummary::new(0, None, 0, eval.as_ref(), RoundTimes::default()))?;
    }
    let mut restored = !opts.resume;
    for round in 1..=rounds {
        if log.finished(round) {
            continue;
        }
        // A round cut short starts again from the team the previous round left.
        if !restored {
            restore_round_input(run_dir, round, compare.team.num_actors)?;
            restored = true;
        }
        let t = std::time::Instant::now();
        let round_items = items_of_round(&split, &items, round);
        let path = round_path(run_dir.replay(), round);
        let stats = match path.exists() {
            true => stats_of_file(&RoundFile::load(&path)?, round_items.len()),
            false => compare_round(&compare, run_dir, round, &round_items)?,
        };
        let collect_s = t.elapsed().as_secs_f64();
        let t = std::time::Instant::now();
        let train_pairs = train_round(&training, run_dir)?;
        let train_s = t.elapsed().as_secs_f64();
        snapshot_round_team(run_dir, round, compare.team.num_actors, history_k)?;
        let eval = evaluate_round(&evaluation, run_dir)?;
        let times = RoundTimes { collect_s, train_s };
        let summary = RoundSummary::new(round, Some(&stats), train_pairs, eval.as_ref(), times);
        let summary = finish_round(run_dir, &mut log, summary)?;
        println!(
            "round {round}: {} items, {} pairs (current won {}, comparator {}), trained on {train_pairs}; eval reward {}",
            stats.items,
            stats.pairs,
            stats.current_wins,
            summary.comparator_wins,
            eval.map_or("not evaluated".into(), |e| format!("{:.4} ± {:.4}", e.mean, e.stderr))
        );
        if let Some(trend) = &summary.trend {
            println!("round {round}: {}", trend.describe());
        }
    }
    println!("{rounds} rounds in {:.1} s; plot: {}", started.elapsed().as_secs_f64(), run_dir.iterate_plot().display());
    Ok(())
}

/// Mark a round finished: its trend over the rounds so far, its metrics line, its summary
/// (written last but the plot: a round whose summary exists is never repeated), the plot.
fn finish_round<'a>(run_dir: &RunDir, log: &'a mut IterateLog, mut summary: RoundSummary) -> Result<&'a RoundSummary> {
    summary.trend = log.trend_with(&summary);
    log_round_metrics(run_dir, &summary, log.total_pairs() + summary.pairs)?;
    log.record(run_dir, summary)?;
    write_rounds_plot(run_dir, &log.summaries)?;
    Ok(log.summaries.last().expect("just recorded"))
}
