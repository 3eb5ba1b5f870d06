//! `pbrl iterate`: iterative MADPO or MARLHF (reference §8): `num_iterations` rounds, each
//! comparing the current team with a comparator on the train items (every one, the reference's,
//! or `items_per_round` of them), then training on the replay selection.
//!
//! Before round 1: the base team evaluated (round 0 of the plot). Round ν:
//! 1. the round (`rounds::build_round`) on the train items (all, or with `items_per_round` the
//!    round's share, `task::split::round_items`): the current team samples
//!    `preference_num_candidates` joint responses per item, the comparator (`sources::comparator`)
//!    `comparator_num_candidates` (default the same): `current` (the same agents
//!    under their own seeded stream), `current_copy` (the agents as they are, copied onto
//!    `comparator_devices`), `model` (`comparator_agents` / `comparator_model_name`), `history`
//!    (the team `comparator_history_k` rounds back, the base models before there is one; the
//!    snapshots are kept in `policy_checkpoints/`), or `api` (an HTTP endpoint,
//!    `sources::api`); with `comparator_generation_mode = "centralized"`, the comparator's
//!    actor `comparator_centralized_agent_index` (or one API call) writes every role in the
//!    reference's tagged prompt, parsed into the roles' outputs;
//! 2. the task reward scores both sides (MARLHF with `preference_scoring_reward =
//!    "reward_model"`: the previous round's reward model, once there is one); candidate idx of
//!    one side meets candidate idx of the other (never across indices), either side winning,
//!    ordered by `pair_selection` (default `comparator_reward`) and cut to
//!    `preference_pairs_per_sample`; the round file `iteration_ν.json` is written whole (with the
//!    raw rewards of both sides);
//! 3. `algorithm = "madpo"`: MADPO on the replay selection (`train::madpo`,
//!    `preference_replay_mode`); `"marlhf"`: a fresh reward model fitted on it
//!    (`reward_model::fit`), then MARLHF (`train::marlhf`);
//! 4. the team saved as `policy_checkpoints/iteration_{ν−1}`; evaluated with the task reward;
//!    `iter/*` metrics, `iterate/round_ν.json`, the plot `iterate/eval_reward.svg`, and both
//!    sides' reward histograms (`reward_distributions/`). Every round is evaluated on the same
//!    eval prompts, so the summary, the metrics and stdout carry the learning so far paired by
//!    prompt (`algo::trend`): the gain over the base team and over round 1, and the per-prompt
//!    slope of reward over the rounds, each ± its standard error over prompts.
//!
//! `--resume` continues after the last finished round (`iterate/round_ν.json` marks it); a round
//! cut short is repeated from the team the previous round left, so its pairs and agents are the
//! ones an uninterrupted run makes. A run directory that holds rounds is never reused without
//! `--resume`, and resuming under another config is refused (the number of rounds may grow).
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::algo::trend::mean;
use crate::algo::trend::RoundTrend;
use crate::config::{ComparatorPolicy, Config};
use crate::device::parse_device;
use crate::evaluation::evaluate_run;
use crate::oracle::Oracle;
use crate::prefs::{existing_rounds, round_path, PreferencePair, RoundFile};
use crate::progress;
use crate::reward_model::fit::{fit, FitOptions};
use crate::reward_model::JointRewardModel;
use crate::rounds::{build_round, RoundSpec, Scorer};
use crate::run::fingerprint::Fingerprint;
use crate::run::team::{copy_team, saved_team};
use crate::run::{atomic_write, RunDir};
use crate::sources::comparator::{self, Comparator};
use crate::sources::{Agents, TeamSource};
use crate::task::split::{items_of_round, train_items};
use crate::task::TaskItem;
use crate::team::{check_fits, load_team, Members};

pub struct IterateOptions {
    pub resume: bool,
}

/// `iterate/round_NNNN.json`: what a finished round did (its existence marks it finished).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RoundSummary {
    pub round: u32,
    /// Train items the round compared on (all of them, or `items_per_round`).
    #[serde(default)]
    pub items: usize,
    pub pairs: usize,
    pub current_wins: usize,
    pub comparator_wins: usize,
    /// Mean raw task reward of each side's candidates (none for round 0).
    pub current_reward_mean: Option<f64>,
    pub comparator_reward_mean: Option<f64>,
    pub train_pairs: usize,
    /// Centralized comparator replies without any role section.
    #[serde(default)]
    pub comparator_unparsed: usize,
    /// API comparator replies longer than `max_new_tokens`, cut there.
    #[serde(default)]
    pub comparator_truncated: usize,
    pub eval_reward_mean: Option<f64>,
    pub eval_reward_stderr: Option<f64>,
    /// Each eval prompt's mean reward, in the eval file's order (absent in summaries written
    /// before pbrl kept them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_item_means: Option<Vec<f64>>,
    /// Learning so far, paired by prompt (from round 1 on, when every round up to this one
    /// kept its prompts' means).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trend: Option<RoundTrend>,
    pub collect_s: f64,
    pub train_s: f64,
    pub eval_s: f64,
}

pub fn run(cfg: &Config, run_dir: &RunDir, opts: &IterateOptions) -> Result<()> {
    let api = cfg.modes.comparator == ComparatorPolicy::Api;
    // Everything a round will need is checked before the run directory records anything, so a
    // mistake found here leaves it usable for the corrected command.
    let items = train_items(cfg)?;
    if items.is_empty() {
        bail!("no train items to compare on");
    }
    if api {
        crate::sources::api::settings(cfg)?; // the format, the URL, the key's variable
    }
    let fingerprint = iterate_fingerprint(cfg)?;
    let fingerprint_path = run_dir.iterate_fingerprint();
    if opts.resume {
        let saved: Fingerprint = serde_json::from_slice(
            &std::fs::read(&fingerprint_path)
                .with_context(|| format!("--resume: {} holds no iterate run", run_dir.root.display()))?,
        )
        .with_context(|| format!("{}: not a pbrl fingerprint", fingerprint_path.display()))?;
        let changed = saved.differences(&fingerprint);
        if !changed.is_empty() {
            bail!("--resume: the run was started under a different setup ({})", changed.join("; "));
        }
        // Rounds only add up: the team on disk is the last round's, which fewer rounds cannot undo.
        let last = existing_rounds(run_dir.replay())?.into_iter().max().unwrap_or(0);
        let done = (1..=last).rev().find(|&r| run_dir.round_summary(r).exists()).unwrap_or(0);
        if u64::from(last.max(done)) > cfg.num_iterations as u64 {
            bail!(
                "--resume: the run already has {} rounds, more than num_iterations = {}; resume with num_iterations >= {} \
                 (the rounds only add up)",
                last.max(done),
                cfg.num_iterations,
                last.max(done)
            );
        }
    } else {
        // (a start killed before its fingerprint was written left nothing to continue)
        if fingerprint_path.exists() || run_dir.agents().exists() || !existing_rounds(run_dir.replay())?.is_empty() {
            bail!(
                "{} already holds rounds or trained agents; pass --resume to continue an iterate run there, or \
                 choose another run_dir",
                run_dir.root.display()
            );
        }
        atomic_write(&fingerprint_path, &serde_json::to_vec_pretty(&fingerprint)?)?;
    }
    let started = std::time::Instant::now();
    if !run_dir.round_summary(0).exists() {
        let eval = evaluate_round(cfg, run_dir)?;
        let summary = RoundSummary {
            round: 0,
            items: 0,
            pairs: 0,
            current_wins: 0,
            comparator_wins: 0,
            current_reward_mean: None,
            comparator_reward_mean: None,
            train_pairs: 0,
            comparator_unparsed: 0,
            comparator_truncated: 0,
            eval_reward_mean: eval.as_ref().map(|e| e.mean),
            eval_reward_stderr: eval.as_ref().map(|e| e.stderr),
            eval_item_means: eval.as_ref().map(|e| e.item_means.clone()),
            trend: None,
            collect_s: 0.0,
            train_s: 0.0,
            eval_s: eval.as_ref().map_or(0.0, |e| e.secs),
        };
        finish_round(run_dir, summary)?;
    }
    let mut restored = !opts.resume;
    for round in 1..=cfg.num_iterations as u32 {
        if run_dir.round_summary(round).exists() {
            continue;
        }
        // A round cut short starts again from the team the previous round left.
        if !restored {
            restore_round_input(cfg, run_dir, round)?;
            restored = true;
        }
        let t = std::time::Instant::now();
        let path = round_path(run_dir.replay(), round);
        let round_items = items_of_round(cfg, &items, round);
        let stats = if path.exists() {
            RoundFile::load(&path)?;
            round_stats_from_file(&path)?
        } else {
            compare_round(cfg, run_dir, round, &round_items)?
        };
        let collect_s = t.elapsed().as_secs_f64();
        let t = std::time::Instant::now();
        let train_pairs = train_round(cfg, run_dir)?;
        let train_s = t.elapsed().as_secs_f64();
        save_snapshot(cfg, run_dir, round)?;
        let eval = evaluate_round(cfg, run_dir)?;
        let summary = RoundSummary {
            round,
            items: round_items.len(),
            pairs: stats.pairs,
            current_wins: stats.current_wins,
            comparator_wins: stats.comparator_wins,
            current_reward_mean: Some(stats.current_mean),
            comparator_reward_mean: Some(stats.comparator_mean),
            train_pairs,
            comparator_unparsed: stats.comparator_unparsed,
            comparator_truncated: stats.comparator_truncated,
            eval_reward_mean: eval.as_ref().map(|e| e.mean),
            eval_reward_stderr: eval.as_ref().map(|e| e.stderr),
            eval_item_means: eval.as_ref().map(|e| e.item_means.clone()),
            trend: None,
            collect_s,
            train_s,
            eval_s: eval.as_ref().map_or(0.0, |e| e.secs),
        };
        let summary = finish_round(run_dir, summary)?;
        println!(
            "round {round}: {} items, {} pairs (current won {}, comparator {}), trained on {}; eval reward {}",
            round_items.len(),
            stats.pairs,
            stats.current_wins,
            stats.comparator_wins,
            train_pairs,
            eval.map_or("not evaluated".into(), |e| format!("{:.4} ± {:.4}", e.mean, e.stderr))
        );
        if let Some(trend) = summary.trend {
            println!("round {round}: {}", trend.describe());
        }
    }
    println!(
        "{} rounds in {:.1} s; plot: {}",
        cfg.num_iterations,
        started.elapsed().as_secs_f64(),
        run_dir.iterate_plot().display()
    );
    Ok(())
}

/// Round training on the replay selection: MADPO (`train-madpo`), or MARLHF (a fresh reward model
/// fitted by `fit-rm`, then `train-marlhf`); a training cut short resumes from its checkpoint.
/// Returns the pairs it trained on.
fn train_round(cfg: &Config, run_dir: &RunDir) -> Result<usize> {
    let unfinished = |dir: &Path| -> Result<bool> {
        Ok(crate::run::checkpoint::list(dir)?.last().is_some() && crate::run::checkpoint::finished(dir)?.is_none())
    };
    if cfg.modes.marlhf_rounds {
        let (pairs, _) = crate::prefs::replay::training_pairs(
            run_dir.replay(),
            cfg.seed,
            cfg.replay_mode(),
            cfg.replay_sample_size(),
        )?;
        if pairs.is_empty() {
            println!("no non-tied preference pairs in the selected rounds; the agents are unchanged");
            return Ok(0);
        }
        let resume = unfinished(&run_dir.reward_model_state())?;
        let Some(fit) = fit(cfg, run_dir, &FitOptions { resume })? else { return Ok(0) };
        println!("{}", fit.describe());
        let resume = unfinished(&run_dir.marlhf_state())?;
        let trained = crate::train::marlhf::train(cfg, run_dir, &crate::train::marlhf::TrainOptions { resume })?;
        println!("{}", trained.describe());
        return Ok(fit.num_pairs);
    }
    let resume = unfinished(&run_dir.root)?;
    let Some(trained) = crate::train::madpo::train(cfg, run_dir, &crate::train::madpo::TrainOptions { resume })? else {
        println!("no non-tied preference pairs in the selected rounds; the agents are unchanged");
        return Ok(0);
    };
    println!("{}", trained.describe());
    Ok(trained.num_pairs)
}

/// The setup a resumed run must share (every key but the number of rounds, which may grow).
fn iterate_fingerprint(cfg: &Config) -> Result<Fingerprint> {
    let mut f = Fingerprint::of_training(cfg, &[], &cfg.agent_sources()?)?;
    f.0.retain(|k, _| k != "num_iterations");
    Ok(f)
}

/// Put back the team round `round` starts from: the previous round's snapshot, or for round 1
/// (or when nothing was trained before) the base models (an `agents/` left by a training cut
/// short is removed).
fn restore_round_input(cfg: &Config, run_dir: &RunDir, round: u32) -> Result<()> {
    if round == 1 {
        if run_dir.agents().exists() {
            std::fs::remove_dir_all(run_dir.agents())
                .with_context(|| format!("removing {} of the interrupted round 1", run_dir.agents().display()))?;
        }
        return Ok(());
    }
    let previous = run_dir.policy_snapshot(round as usize - 2);
    if saved_team(&previous, cfg.num_actors())?.is_none() {
        // No team was trained before that round (no pairs yet): it starts from the base models.
        return restore_round_input(cfg, run_dir, 1);
    }
    copy_team(&previous, &run_dir.agents())
}

/// Keep the team as `policy_checkpoints/iteration_{round−1}`, and only the snapshots a later
/// round can still need: this round's input until its summary is written (a resume repeats the
/// round from it), and for `history` the last k.
fn save_snapshot(cfg: &Config, run_dir: &RunDir, round: u32) -> Result<()> {
    let label = round as usize - 1;
    if saved_team(&run_dir.agents(), cfg.num_actors())?.is_none() {
        return Ok(()); // nothing trained yet: the base models are the snapshot
    }
    copy_team(&run_dir.agents(), &run_dir.policy_snapshot(label))?;
    let mut keep_from = label.saturating_sub(1);
    if let ComparatorPolicy::History(k) = cfg.modes.comparator {
        keep_from = keep_from.min((label + 1).saturating_sub(k as usize));
    }
    let root = run_dir.policy_checkpoints();
    for e in std::fs::read_dir(&root).with_context(|| format!("reading {}", root.display()))? {
        let name = e?.file_name().to_string_lossy().to_string();
        let Some(j) = name.strip_prefix("iteration_").and_then(|n| n.parse::<usize>().ok()) else { continue };
        if j < keep_from {
            std::fs::remove_dir_all(root.join(&name))
                .with_context(|| format!("pruning {}", root.join(&name).display()))?;
        }
    }
    Ok(())
}

struct RoundEval {
    mean: f64,
    stderr: f64,
    item_means: Vec<f64>,
    secs: f64,
}

/// The current team's evaluation, when there are eval items.
fn evaluate_round(cfg: &Config, run_dir: &RunDir) -> Result<Option<RoundEval>> {
    if cfg.eval_num_samples == 0 || cfg.task.eval_file.is_none() {
        return Ok(None);
    }
    let t = std::time::Instant::now();
    let run = evaluate_run(cfg, run_dir, &Members::Current)?;
    let secs = t.elapsed().as_secs_f64();
    let (mean, stderr) = (run.mean(), run.evaluation.reward_stderr);
    Ok(Some(RoundEval { mean, stderr, item_means: run.item_means, secs }))
}

/// Write the round's summary (marking it finished) with its trend over the rounds before it,
/// its metrics line and the plot.
fn finish_round(run_dir: &RunDir, mut s: RoundSummary) -> Result<RoundSummary> {
    let mut earlier = Vec::new();
    for round in 0..s.round {
        earlier.push(serde_json::from_slice::<RoundSummary>(&std::fs::read(run_dir.round_summary(round))?)?);
    }
    let series: Option<Vec<Vec<f64>>> = earlier.iter().chain([&s]).map(|r| r.eval_item_means.clone()).collect();
    s.trend =
        series.filter(|rounds| rounds.iter().all(|r| r.len() == rounds[0].len())).and_then(|r| RoundTrend::of(&r));
    let trend = |pick: fn(&RoundTrend) -> [f64; 2]| s.trend.as_ref().map(pick);
    run_dir.log_metrics(&json!({
        "stage": "iterate", "time": chrono::Utc::now().to_rfc3339(),
        "iter/current_iteration": s.round, "iter/current_preference_pairs": s.pairs,
        "iter/total_preference_pairs": total_pairs(run_dir)?, "iter/train_preference_pairs": s.train_pairs,
        "iter/current_wins": s.current_wins, "iter/comparator_wins": s.comparator_wins,
        "iter/current_reward_mean": s.current_reward_mean, "iter/comparator_reward_mean": s.comparator_reward_mean,
        "iter/eval_reward_mean": s.eval_reward_mean, "iter/eval_reward_stderr": s.eval_reward_stderr,
        "iter/round_s": s.collect_s + s.train_s + s.eval_s, "iter/comparator_unparsed": s.comparator_unparsed,
        "iter/comparator_truncated": s.comparator_truncated,
        "iter/eval_gain": trend(|t| t.gain).map(|v| v[0]), "iter/eval_gain_stderr": trend(|t| t.gain).map(|v| v[1]),
        "iter/eval_gain_after_round_1": trend(|t| t.gain_after_round_1).map(|v| v[0]),
        "iter/eval_gain_after_round_1_stderr": trend(|t| t.gain_after_round_1).map(|v| v[1]),
        "iter/eval_slope": trend(|t| t.slope_per_round).map(|v| v[0]),
        "iter/eval_slope_stderr": trend(|t| t.slope_per_round).map(|v| v[1]),
    }))?;
    atomic_write(&run_dir.round_summary(s.round), &serde_json::to_vec_pretty(&s)?)?;
    let points: Vec<(f64, f64)> =
        earlier.iter().chain([&s]).filter_map(|r| r.eval_reward_mean.map(|m| (r.round as f64, m))).collect();
    let panel = crate::plot::Panel { title: "eval reward (mean)".into(), series: vec![("reward".into(), points)] };
    let title = match &s.trend {
        Some(t) => format!(
            "pbrl iterate: {} (slope {:+.3} ± {:.3} per round)",
            run_dir.root.display(),
            t.slope_per_round[0],
            t.slope_per_round[1]
        ),
        None => format!("pbrl iterate: {}", run_dir.root.display()),
    };
    atomic_write(&run_dir.iterate_plot(), crate::plot::line_panels(&title, "round", &[panel]).as_bytes())?;
    Ok(s)
}

fn total_pairs(run_dir: &RunDir) -> Result<usize> {
    let dir = run_dir.replay();
    existing_rounds(dir)?.iter().map(|&n| Ok(RoundFile::load(&round_path(dir, n))?.num_pairs)).sum()
}

/// What a round's comparisons gave.
struct RoundStats {
    pairs: usize,
    current_wins: usize,
    comparator_wins: usize,
    current_mean: f64,
    comparator_mean: f64,
    /// Centralized comparator replies without any role section (scored as empty roles).
    comparator_unparsed: usize,
    /// API replies cut at `max_new_tokens`.
    comparator_truncated: usize,
}

/// The statistics of a round file written before a cut-short round was resumed.
fn round_stats_from_file(path: &Path) -> Result<RoundStats> {
    let r = RoundFile::load(path)?;
    let current_wins = r
        .pairs
        .iter()
        .filter(|p| p.target_raw_reward.zip(p.raw_rewards.as_ref()).is_some_and(|(t, w)| w[0] == t))
        .count();
    let side_mean =
        |f: &dyn Fn(&PreferencePair) -> Option<f64>| mean(&r.pairs.iter().filter_map(f).collect::<Vec<f64>>());
    Ok(RoundStats {
        pairs: r.num_pairs,
        current_wins,
        comparator_wins: r.num_pairs - current_wins,
        current_mean: side_mean(&|p| p.target_raw_reward),
        comparator_mean: side_mean(&|p| p.comparator_raw_reward),
        comparator_unparsed: 0,
        comparator_truncated: 0,
    })
}

/// Round `round`'s comparisons over its train items (`items_of_round`), written as its round file.
fn compare_round(cfg: &Config, run_dir: &RunDir, round: u32, items: &[(usize, TaskItem)]) -> Result<RoundStats> {
    let team = load_team(cfg, run_dir)?;
    let n_cur = cfg.preference_num_candidates as usize;
    let n_cmp = cfg.comparator_num_candidates.map_or(n_cur, |n| n as usize);
    let spec = RoundSpec {
        round,
        seed: cfg.seed,
        candidates: n_cur,
        comparator_candidates: n_cmp,
        batch_items: cfg.collect_batch_size as usize,
        selection: cfg.modes.selection,
        pairs_per_sample: cfg.preference_pairs_per_sample.map(|k| k as usize),
    };
    let comparator = comparator::build(cfg, run_dir, round, &team)?;
    // The team as its own comparator samples both sides' rows in one call.
    let rows = match comparator {
        Comparator::Team => (n_cur.saturating_add(n_cmp), "collect_batch_size × (both sides' candidates)"),
        Comparator::Source(_) => (n_cur.max(n_cmp), "collect_batch_size × candidates"),
    };
    let item_list: Vec<TaskItem> = items.iter().map(|(_, it)| it.clone()).collect();
    check_fits(&team, &item_list, &cfg.max_new_tokens(), (spec.batch_items.saturating_mul(rows.0), rows.1), "train")?;
    // MARLHF with preference_scoring_reward = "reward_model": the newest fitted reward model (the
    // previous round's) scores both sides, raw and processed alike (reference §5.2).
    let rm_dir = run_dir.reward_model();
    let mut scorer = if cfg.modes.score_with_reward_model && JointRewardModel::exists(&rm_dir) {
        let (_, device) = cfg.reward_model_source()?;
        Scorer::RewardModel(Box::new(JointRewardModel::load(
            &rm_dir,
            &parse_device(&device, "reward_model_device")?,
            crate::team::frozen_storage(cfg.frozen_dtype),
        )?))
    } else {
        Scorer::Oracle(Oracle::new(cfg)?)
    };
    let bar = progress::bar(items.len() as u64, "iterate: compare");
    let source = TeamSource::new(Agents::Borrowed(&team), cfg.sampling());
    let mut built = build_round(&spec, items, &source, Some(&comparator), &mut scorer, &bar)?;
    bar.finish_and_clear();
    let stats = RoundStats {
        pairs: built.pairs.len(),
        current_wins: built.current_wins,
        comparator_wins: built.pairs.len() - built.current_wins,
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
    built.write_histograms(run_dir, round, cfg.reward_range.map(|[lo, hi]| (lo, hi)))?;
    Ok(stats)
}
