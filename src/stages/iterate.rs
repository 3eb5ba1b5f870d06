//! `pbrl iterate`: iterative MADPO or MARLHF (reference §8): `num_iterations` rounds, each
//! comparing the current team with a comparator on every train item, then training on the replay
//! selection.
//!
//! Before round 1: the base team evaluated (round 0 of the plot). Round ν:
//! 1. the current team samples `preference_num_candidates` joint responses per item, the
//!    comparator `comparator_num_candidates` (default the same): `current` (the same agents
//!    under their own seeded stream), `current_copy` (the agents as they are, copied onto
//!    `comparator_devices`), `model` (`comparator_agents` / `comparator_model_name`), `history`
//!    (the team `comparator_history_k` rounds back, the base models before there is one; the
//!    snapshots are kept in `policy_checkpoints/`), or `api` (an HTTP endpoint,
//!    `comparator::api`); with `comparator_generation_mode = "centralized"`, the comparator's
//!    actor `comparator_centralized_agent_index` (or one API call) writes every role in the
//!    reference's tagged prompt, parsed into the roles' outputs;
//! 2. the task reward scores both sides (MARLHF with `preference_scoring_reward =
//!    "reward_model"`: the previous round's reward model, once there is one); candidate idx of
//!    one side meets candidate idx of the other (never across indices), either side winning,
//!    ordered by `pair_selection` (default `comparator_reward`) and cut to
//!    `preference_pairs_per_sample`; the round file `iteration_ν.json` is written whole (with the
//!    raw rewards of both sides);
//! 3. `algorithm = "madpo"`: `train-madpo` on the replay selection (`preference_replay_mode`);
//!    `"marlhf"`: a fresh reward model fitted on it (`fit-rm`), then `train-marlhf`;
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
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::algo::trend::RoundTrend;
use crate::comparator::api::{ApiComparator, ApiFormat, ApiKey, ApiSettings, RequestSampling, RetryPolicy};
use crate::config::{Config, DeviceSpec};
use crate::device::parse_device;
use crate::prefs::distribution::{comparison_record, histogram, svg};
use crate::prefs::selection::{select_comparison_pairs, PairSelection, Winner};
use crate::prefs::{existing_rounds, round_path, PreferencePair, RoundFile};
use crate::progress;
use crate::reward_model::JointRewardModel;
use crate::rng::{derive_seed, purpose};
use crate::run::fingerprint::Fingerprint;
use crate::run::team::{copy_team, saved_team};
use crate::run::{atomic_write, RunDir};
use crate::task::reward::build_reward;
use crate::task::split::train_items;
use crate::task::{render_template, TaskItem};
use crate::team::collab::{centralized_comparator_prompt, has_any_section, parse_joint_response, Collaboration};
use crate::team::rollout::{rollout, rollout_prompts, Rollout};
use crate::team::{check_fits, load_as, load_team, Agent, Members};

pub struct IterateOptions {
    pub resume: bool,
}

/// `iterate/round_NNNN.json`: what a finished round did (its existence marks it finished).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RoundSummary {
    pub round: u32,
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

fn state_dir(run_dir: &RunDir) -> PathBuf {
    run_dir.root.join("iterate")
}

fn summary_path(run_dir: &RunDir, round: u32) -> PathBuf {
    state_dir(run_dir).join(format!("round_{round:04}.json"))
}

fn snapshot_dir(run_dir: &RunDir, label: usize) -> PathBuf {
    run_dir.root.join("policy_checkpoints").join(format!("iteration_{label:04}"))
}

/// Who the current team is compared with in one round.
enum Comparator<'a> {
    /// Sampled from a team (the current one, a copy, other models or a snapshot).
    Team(TeamRef<'a>),
    Api(Box<ApiComparator>),
}

enum TeamRef<'a> {
    Current(&'a [Agent]),
    Loaded(Vec<Agent>),
}

impl TeamRef<'_> {
    fn agents(&self) -> &[Agent] {
        match self {
            TeamRef::Current(t) => t,
            TeamRef::Loaded(t) => t,
        }
    }
}

pub fn run(cfg: &Config, run_dir: &RunDir, opts: &IterateOptions) -> Result<()> {
    if cfg.comparator_policy == "api" && cfg.collaboration_mode == "centralized" {
        bail!("comparator_policy = \"api\" with a centralized actor: choose a model-based comparator_policy");
    }
    // Everything a round will need is checked before the run directory records anything, so a
    // mistake found here leaves it usable for the corrected command.
    let items = train_items(cfg)?;
    if items.is_empty() {
        bail!("no train items to compare on");
    }
    if cfg.comparator_policy == "api" {
        api_settings(cfg)?; // the format, the URL, the key's variable
    }
    let state = state_dir(run_dir);
    let fingerprint = iterate_fingerprint(cfg)?;
    let fingerprint_path = state.join("fingerprint.json");
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
        let last = existing_rounds(&cfg.replay_dir())?.into_iter().max().unwrap_or(0);
        let done = (1..=last).rev().find(|&r| summary_path(run_dir, r).exists()).unwrap_or(0);
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
        if fingerprint_path.exists() || run_dir.agents().exists() || !existing_rounds(&cfg.replay_dir())?.is_empty() {
            bail!(
                "{} already holds rounds or trained agents; pass --resume to continue an iterate run there, or \
                 choose another run_dir",
                run_dir.root.display()
            );
        }
        atomic_write(&fingerprint_path, &serde_json::to_vec_pretty(&fingerprint)?)?;
    }
    let started = std::time::Instant::now();
    if !summary_path(run_dir, 0).exists() {
        let eval = evaluate_round(cfg, run_dir)?;
        let summary = RoundSummary {
            round: 0,
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
        finish_round(cfg, run_dir, summary)?;
    }
    let mut restored = !opts.resume;
    for round in 1..=cfg.num_iterations as u32 {
        if summary_path(run_dir, round).exists() {
            continue;
        }
        // A round cut short starts again from the team the previous round left.
        if !restored {
            restore_round_input(cfg, run_dir, round)?;
            restored = true;
        }
        let t = std::time::Instant::now();
        let path = round_path(&cfg.replay_dir(), round);
        let stats = if path.exists() {
            RoundFile::load(&path)?;
            round_stats_from_file(&path)?
        } else {
            compare_round(cfg, run_dir, round, &items)?
        };
        let collect_s = t.elapsed().as_secs_f64();
        let t = std::time::Instant::now();
        let train_pairs = train_round(cfg, run_dir)?;
        let train_s = t.elapsed().as_secs_f64();
        save_snapshot(cfg, run_dir, round)?;
        let eval = evaluate_round(cfg, run_dir)?;
        let summary = RoundSummary {
            round,
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
        let summary = finish_round(cfg, run_dir, summary)?;
        println!(
            "round {round}: {} pairs (current won {}, comparator {}), trained on {}; eval reward {}",
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
        state.join("eval_reward.svg").display()
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
    if cfg.algorithm == "marlhf" {
        let (pairs, _) = crate::prefs::replay::training_pairs(
            &cfg.replay_dir(),
            cfg.seed,
            cfg.replay_mode(),
            cfg.replay_sample_size(),
        )?;
        if pairs.is_empty() {
            println!("no non-tied preference pairs in the selected rounds; the agents are unchanged");
            return Ok(0);
        }
        let resume = unfinished(&run_dir.root.join("reward_model_training"))?;
        let fit = super::fit_rm::run(cfg, run_dir, &super::fit_rm::FitOptions { resume })?;
        let resume = unfinished(&super::train_marlhf::state_dir(run_dir))?;
        super::train_marlhf::run(cfg, run_dir, &super::train_marlhf::TrainOptions { resume })?;
        return Ok(fit.num_pairs);
    }
    let resume = unfinished(&run_dir.root)?;
    Ok(super::train_madpo::run(cfg, run_dir, &super::train_madpo::TrainOptions { resume })?.num_pairs)
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
    let previous = snapshot_dir(run_dir, round as usize - 2);
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
    copy_team(&run_dir.agents(), &snapshot_dir(run_dir, label))?;
    let mut keep_from = label.saturating_sub(1);
    if let (Some(k), "history") = (cfg.comparator_history_k, cfg.comparator_policy.as_str()) {
        keep_from = keep_from.min((label + 1).saturating_sub(k as usize));
    }
    let root = run_dir.root.join("policy_checkpoints");
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
    let report = super::eval::run(cfg, run_dir, &Members::Current, false)?;
    let secs = t.elapsed().as_secs_f64();
    Ok(Some(RoundEval { mean: report.reward_mean, stderr: report.reward_stderr, item_means: report.item_means, secs }))
}

/// Write the round's summary (marking it finished) with its trend over the rounds before it,
/// its metrics line and the plot.
fn finish_round(cfg: &Config, run_dir: &RunDir, mut s: RoundSummary) -> Result<RoundSummary> {
    let dir = state_dir(run_dir);
    let mut earlier = Vec::new();
    for round in 0..s.round {
        earlier.push(serde_json::from_slice::<RoundSummary>(&std::fs::read(summary_path(run_dir, round))?)?);
    }
    let series: Option<Vec<Vec<f64>>> = earlier.iter().chain([&s]).map(|r| r.eval_item_means.clone()).collect();
    s.trend =
        series.filter(|rounds| rounds.iter().all(|r| r.len() == rounds[0].len())).and_then(|r| RoundTrend::of(&r));
    let trend = |pick: fn(&RoundTrend) -> [f64; 2]| s.trend.as_ref().map(pick);
    run_dir.log_metrics(&json!({
        "stage": "iterate", "time": chrono::Utc::now().to_rfc3339(),
        "iter/current_iteration": s.round, "iter/current_preference_pairs": s.pairs,
        "iter/total_preference_pairs": total_pairs(cfg)?, "iter/train_preference_pairs": s.train_pairs,
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
    atomic_write(&summary_path(run_dir, s.round), &serde_json::to_vec_pretty(&s)?)?;
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
    atomic_write(&dir.join("eval_reward.svg"), crate::plot::line_panels(&title, "round", &[panel]).as_bytes())?;
    Ok(s)
}

fn total_pairs(cfg: &Config) -> Result<usize> {
    let dir = cfg.replay_dir();
    existing_rounds(&dir)?.iter().map(|&n| Ok(RoundFile::load(&round_path(&dir, n))?.num_pairs)).sum()
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
    let mean = |f: &dyn Fn(&PreferencePair) -> Option<f64>| {
        let v: Vec<f64> = r.pairs.iter().filter_map(f).collect();
        v.iter().sum::<f64>() / v.len().max(1) as f64
    };
    Ok(RoundStats {
        pairs: r.num_pairs,
        current_wins,
        comparator_wins: r.num_pairs - current_wins,
        current_mean: mean(&|p| p.target_raw_reward),
        comparator_mean: mean(&|p| p.comparator_raw_reward),
        comparator_unparsed: 0,
        comparator_truncated: 0,
    })
}

/// Round `round`'s comparisons over every train item, written as its round file.
fn compare_round(cfg: &Config, run_dir: &RunDir, round: u32, items: &[(usize, TaskItem)]) -> Result<RoundStats> {
    let team = load_team(cfg, run_dir)?;
    let n_cur = cfg.preference_num_candidates as usize;
    let n_cmp = cfg.comparator_num_candidates.map_or(n_cur, |n| n as usize);
    let batch_items = cfg.collect_batch_size as usize;
    let rows = batch_items.saturating_mul(n_cur.max(n_cmp));
    let item_list: Vec<TaskItem> = items.iter().map(|(_, it)| it.clone()).collect();
    check_fits(&team, &item_list, &cfg.max_new_tokens(), (rows, "collect_batch_size × candidates"), "train")?;
    let comparator = build_comparator(cfg, run_dir, round, &team)?;
    let (mut reward, processor) = build_reward(&cfg.reward, cfg.reward_timeout_s)?;
    // MARLHF with preference_scoring_reward = "reward_model": the newest fitted reward model (the
    // previous round's) scores both sides, raw and processed alike (reference §5.2).
    let rm_dir = super::fit_rm::reward_model_dir(run_dir);
    let scorer_rm = if cfg.preference_scoring_reward == "reward_model" && rm_dir.join("reward_model.json").is_file() {
        let (_, device) = cfg.reward_model_source()?;
        Some(JointRewardModel::load(&rm_dir, &parse_device(&device, "reward_model_device")?)?)
    } else {
        None
    };
    let collab = Collaboration::from_config(cfg);
    let mode = PairSelection::parse(&cfg.pair_selection).expect("validated pair_selection");
    let per_sample = cfg.preference_pairs_per_sample.map(|k| k as usize);
    let params = cfg.sampling();
    let bar = progress::bar(items.len() as u64, "iterate: compare");
    let (mut pairs, mut raw_cur, mut raw_cmp, mut sel_cur, mut sel_cmp) = (vec![], vec![], vec![], vec![], vec![]);
    let mut current_wins = 0;
    let (mut unparsed, mut truncated) = (0usize, 0usize);
    let centralized_cmp = cfg.comparator_generation_mode == "centralized" && cfg.collaboration_mode != "centralized";
    for (b, batch) in items.chunks(batch_items).enumerate() {
        let first = b * batch_items;
        let batch_items: Vec<TaskItem> = batch.iter().map(|(_, it)| it.clone()).collect();
        let index = |j: usize| items[first + j].0 as u64;
        let seed = |p: u64| {
            move |j: usize, a: usize, k: usize| derive_seed(cfg.seed, &[p, round as u64, index(j), a as u64, k as u64])
        };
        let cur = rollout(&team, &batch_items, n_cur, &params, seed(purpose::COLLECT), |_| {})?;
        let cmp: Vec<Vec<Vec<String>>> = match &comparator {
            _ if centralized_cmp => {
                let idx = cfg.comparator_centralized_agent_index as usize;
                let prompts = batch_items
                    .iter()
                    .map(|it| Ok(centralized_comparator_prompt(&role_prompts(cfg, it, team.len())?)))
                    .collect::<Result<Vec<_>>>()?;
                let joints: Vec<Vec<String>> = match &comparator {
                    Comparator::Team(t) => {
                        let one = &t.agents()[idx..idx + 1];
                        let texts =
                            vec![prompts.iter().map(|p| one[0].format_user_prompt(p)).collect::<Result<Vec<_>>>()?];
                        let out = rollout_prompts(one, &texts, n_cmp, &params, seed(purpose::COMPARATOR), |_| {})?;
                        out.responses.iter().map(|r| r.iter().map(|joint| joint[0].text.clone()).collect()).collect()
                    }
                    Comparator::Api(api) => prompts
                        .iter()
                        .zip(&batch_items)
                        .map(|(p, it)| {
                            let mut texts =
                                api.complete(p, idx, &serde_json::to_value(it)?, n_cmp, request_sampling(cfg, idx))?;
                            texts.resize(n_cmp, String::new());
                            Ok(texts)
                        })
                        .collect::<Result<Vec<_>>>()?,
                };
                joints
                    .iter()
                    .map(|per_item| {
                        per_item
                            .iter()
                            .map(|text| {
                                // The reference aborts the round on a reply without any section; pbrl
                                // scores its roles as empty and counts it.
                                unparsed += usize::from(!has_any_section(text, team.len()));
                                parse_joint_response(text, team.len())
                            })
                            .collect()
                    })
                    .collect()
            }
            Comparator::Team(t) => {
                let out = rollout(t.agents(), &batch_items, n_cmp, &params, seed(purpose::COMPARATOR), |_| {})?;
                joint_texts(&out, n_cmp)
            }
            Comparator::Api(api) => api_texts(cfg, api, &team, &batch_items, n_cmp, &mut truncated)?,
        };
        let cur_joints = joint_texts(&cur, n_cur);
        for (j, item) in batch_items.iter().enumerate() {
            let prompts = &cur.prompts[j];
            let reward_prompts = collab.reward_prompts(item, prompts)?;
            let mut score = |joints: &[Vec<String>]| -> Result<(Vec<f64>, Vec<f64>)> {
                if let Some(rm) = &scorer_rm {
                    let rows = joints.iter().map(|x| rm.encode(prompts, x)).collect::<Result<Vec<_>>>()?;
                    let s = rm.score(&rows, rows.len())?;
                    if let Some(bad) = s.iter().find(|v| !v.is_finite()) {
                        bail!("the reward model scored a candidate of train item {} {bad}", index(j));
                    }
                    return Ok((s.clone(), s));
                }
                let roles: Vec<Vec<String>> = joints.iter().map(|x| collab.role_outputs(x)).collect();
                let raw = reward.score_batch(item, &reward_prompts, &roles)?;
                let processed: Vec<f64> = raw.iter().map(|&r| processor.apply(r)).collect();
                if let Some(bad) = processed.iter().find(|s| !s.is_finite()) {
                    bail!("the reward of train item {} is not finite ({bad})", index(j));
                }
                Ok((raw, processed))
            };
            let cur_joints = &cur_joints[j];
            // (raw, processed) scores of the current team's and the comparator's candidates
            let (rc, pc) = score(cur_joints)?;
            let (rm, pm) = score(&cmp[j])?;
            let mut rng = ChaCha8Rng::seed_from_u64(derive_seed(cfg.seed, &[purpose::PAIRS, round as u64, index(j)]));
            let all: Vec<f64> = pc.iter().chain(&pm).copied().collect();
            let mean = all.iter().sum::<f64>() / all.len() as f64;
            for (idx, winner) in select_comparison_pairs(&pc, &pm, mode, per_sample, &mut rng) {
                let (w, l, (wr, lr), (wraw, lraw)) = match winner {
                    Winner::Current => (&cur_joints[idx], &cmp[j][idx], (pc[idx], pm[idx]), (rc[idx], rm[idx])),
                    Winner::Comparator => (&cmp[j][idx], &cur_joints[idx], (pm[idx], pc[idx]), (rm[idx], rc[idx])),
                };
                pairs.push(PreferencePair {
                    prompts: prompts.clone(),
                    winner_completions: w.clone(),
                    loser_completions: l.clone(),
                    winner_reward: wr,
                    loser_reward: lr,
                    candidate_reward_mean: mean,
                    raw_rewards: Some(vec![wraw, lraw]),
                    target_raw_reward: Some(rc[idx]),
                    comparator_raw_reward: Some(rm[idx]),
                    winner_finished: None,
                    loser_finished: None,
                });
                sel_cur.push(rc[idx]);
                sel_cmp.push(rm[idx]);
                current_wins += usize::from(winner == Winner::Current);
            }
            raw_cur.extend(rc);
            raw_cmp.extend(rm);
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    let stats = RoundStats {
        pairs: pairs.len(),
        current_wins,
        comparator_wins: pairs.len() - current_wins,
        current_mean: raw_cur.iter().sum::<f64>() / raw_cur.len().max(1) as f64,
        comparator_mean: raw_cmp.iter().sum::<f64>() / raw_cmp.len().max(1) as f64,
        comparator_unparsed: unparsed,
        comparator_truncated: truncated,
    };
    if unparsed > 0 {
        tracing::warn!(round, unparsed, "centralized comparator replies without any <agent_i> section");
    }
    if truncated > 0 {
        tracing::warn!(round, truncated, "comparator API replies longer than max_new_tokens, cut there");
    }
    RoundFile::new(round, pairs).save_new(&round_path(&cfg.replay_dir(), round))?;
    // Every round: both sides' histograms over `reward_range`, else over the round's own range.
    let range = match cfg.reward_range {
        Some([lo, hi]) => (lo, hi),
        None => {
            let all = raw_cur.iter().chain(&raw_cmp).copied().filter(|v| v.is_finite());
            let (lo, hi) = all.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| (a.min(x), b.max(x)));
            if lo < hi {
                (lo, hi)
            } else if lo.is_finite() {
                (lo - 0.5, lo + 0.5)
            } else {
                (0.0, 1.0)
            }
        }
    };
    write_distributions(run_dir, round, range, [&raw_cur, &raw_cmp], [&sel_cur, &sel_cmp])?;
    Ok(stats)
}

/// `[item][candidate]` joint texts (every actor's text of candidate k).
fn joint_texts(out: &Rollout, n: usize) -> Vec<Vec<Vec<String>>> {
    (0..out.responses.len()).map(|j| (0..n).map(|k| out.texts(j, k)).collect()).collect()
}

/// The API's `n` candidates per item: one call per agent with its rendered task prompt (its
/// `formatters` template, without the chat template: the endpoint applies its own).
fn api_texts(
    cfg: &Config,
    api: &ApiComparator,
    team: &[Agent],
    items: &[TaskItem],
    n: usize,
    truncated: &mut usize,
) -> Result<Vec<Vec<Vec<String>>>> {
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let mut per_agent = Vec::with_capacity(team.len());
        for (a, prompt) in role_prompts(cfg, item, team.len())?.iter().enumerate() {
            let item_json = serde_json::to_value(item)?;
            let sampling = request_sampling(cfg, a);
            let mut texts = api.complete(prompt, a, &item_json, n, sampling)?;
            // Fewer answers than asked would leave empty responses in the round as if written.
            if texts.len() < n {
                bail!(
                    "the comparator API returned {} completions for agent {a}, {n} were asked (prompt `{}`)",
                    texts.len(),
                    prompt.chars().take(60).collect::<String>()
                );
            }
            texts.truncate(n);
            // An answer may not be longer than the team's may: cut at max_new_tokens of the
            // actor's own tokenizer (the round then compares like with like, and stays small).
            for text in &mut texts {
                let ids = team[a].model.tokenizer.encode(text)?;
                if ids.len() > sampling.max_new_tokens {
                    *text = team[a].model.tokenizer.decode(&ids[..sampling.max_new_tokens])?;
                    *truncated += 1;
                }
            }
            per_agent.push(texts);
        }
        out.push((0..n).map(|k| per_agent.iter().map(|t| t[k].clone()).collect()).collect());
    }
    Ok(out)
}

/// Each role's rendered `formatters` template for an item (the prompts an API or a centralized
/// comparator is given: no system prompt, no chat template).
fn role_prompts(cfg: &Config, item: &TaskItem, roles: usize) -> Result<Vec<String>> {
    let templates = &cfg.task.formatters;
    (0..roles).map(|a| render_template(&templates[if templates.len() == 1 { 0 } else { a }], item)).collect()
}

/// What an API request for actor `actor`'s role asks for.
fn request_sampling(cfg: &Config, actor: usize) -> RequestSampling {
    RequestSampling {
        max_new_tokens: cfg.max_new_tokens()[actor],
        temperature: cfg.temperature,
        top_p: cfg.top_p,
        top_k: cfg.top_k.map(|k| k as usize),
    }
}

/// The comparator of round `round`.
fn build_comparator<'a>(cfg: &Config, run_dir: &RunDir, round: u32, team: &'a [Agent]) -> Result<Comparator<'a>> {
    let devices = match &cfg.comparator_devices {
        Some(spec) => DeviceSpec::resolve(Some(spec), team.len(), "comparator_devices")?,
        None => DeviceSpec::resolve(cfg.agent_devices.as_ref(), team.len(), "agent_devices")?,
    };
    let load = |sources: &[String]| load_as(team, sources, &devices, "comparator");
    let agent_devices = DeviceSpec::resolve(cfg.agent_devices.as_ref(), team.len(), "agent_devices")?;
    Ok(match cfg.comparator_policy.as_str() {
        "current" => Comparator::Team(TeamRef::Current(team)),
        "current_copy" if devices == agent_devices => Comparator::Team(TeamRef::Current(team)),
        "current_copy" => {
            let sources = match saved_team(&run_dir.agents(), team.len())? {
                Some(dirs) => dirs.iter().map(|d| d.display().to_string()).collect(),
                None => cfg.agent_sources()?,
            };
            Comparator::Team(TeamRef::Loaded(load(&sources)?))
        }
        "model" => {
            let sources = match (&cfg.comparator_agents, &cfg.comparator_model_name) {
                (Some(a), _) => a.clone(),
                (None, Some(m)) => vec![m.clone(); team.len()],
                (None, None) => unreachable!("validated: the model policy names its models"),
            };
            Comparator::Team(TeamRef::Loaded(load(&sources)?))
        }
        "history" => {
            let k = cfg.comparator_history_k.expect("validated: history has k");
            let target = round as i64 - 1 - k;
            let snapshot = (0..=target.max(-1))
                .rev()
                .filter(|&j| j >= 0)
                .map(|j| snapshot_dir(run_dir, j as usize))
                .find(|d| d.join("team.json").is_file());
            let sources = match snapshot.map(|d| saved_team(&d, team.len())).transpose()?.flatten() {
                Some(dirs) => dirs.iter().map(|d| d.display().to_string()).collect(),
                None => cfg.agent_sources()?, // the initial policy: the base models
            };
            Comparator::Team(TeamRef::Loaded(load(&sources)?))
        }
        "api" => Comparator::Api(Box::new(ApiComparator::new(api_settings(cfg)?))),
        other => bail!("comparator_policy = \"{other}\" is not a comparator pbrl knows"),
    })
}

/// The API comparator's settings; the key from `comparator_api_key_env` (or the discouraged
/// `comparator_api_key`), never shown.
fn api_settings(cfg: &Config) -> Result<ApiSettings> {
    let key = match (&cfg.comparator_api_key, &cfg.comparator_api_key_env) {
        (Some(k), _) => {
            tracing::warn!("comparator_api_key is set in the config; prefer comparator_api_key_env");
            ApiKey::new(k.clone())
        }
        (None, Some(var)) => {
            let k = std::env::var(var)
                .with_context(|| format!("comparator_api_key_env = \"{var}\": the environment variable is not set"))?;
            Some(ApiKey::new(k).with_context(|| format!("the environment variable {var} is empty"))?)
        }
        (None, None) => None,
    };
    let extra_body = match &cfg.comparator_api_extra_body {
        Some(t) => Some(serde_json::to_value(t)?.as_object().cloned().unwrap_or_default()),
        None => None,
    };
    Ok(ApiSettings {
        url: cfg.comparator_api_url.clone().expect("validated: the api policy has a url"),
        format: ApiFormat::parse(&cfg.comparator_api_format)?,
        model: cfg.comparator_api_model.clone(),
        max_n_per_request: cfg.comparator_api_max_n_per_request.map(|n| n as usize),
        // Validated: positive, at most a week.
        timeout: std::time::Duration::from_secs_f64(cfg.comparator_api_timeout),
        headers: cfg.comparator_api_headers.clone().unwrap_or_default().into_iter().collect(),
        key,
        key_header: cfg.comparator_api_key_header.clone(),
        key_prefix: cfg.comparator_api_key_prefix.clone(),
        response_field: cfg.comparator_api_response_field.clone(),
        extra_body,
        retry: RetryPolicy { max_attempts: cfg.comparator_api_max_attempts as u32, ..RetryPolicy::default() },
    })
}

/// Both sides' reward histograms (reference §9's record, with the comparator's series).
fn write_distributions(
    run_dir: &RunDir,
    round: u32,
    range: (f64, f64),
    candidates: [&[f64]; 2],
    selected: [&[f64]; 2],
) -> Result<()> {
    let rec = comparison_record(round, range, candidates, selected);
    let dir = run_dir.root.join("reward_distributions");
    atomic_write(&dir.join(format!("iteration_{round:04}.json")), serde_json::to_string_pretty(&rec)?.as_bytes())?;
    for (side, values) in [("target", candidates[0]), ("comparator", candidates[1])] {
        let (_, counts) = histogram(values, range);
        let title = format!("round {round}: {side} candidate rewards");
        atomic_write(&dir.join(format!("iteration_{round:04}_{side}.svg")), svg(&title, range, &counts).as_bytes())?;
    }
    Ok(())
}
