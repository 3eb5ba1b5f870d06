//! `pbrl train-marlhf`: online RL of the agents on the joint reward model `fit-rm` fitted
//! (reference §7.4). This file: the shared setup and the MAGRPO family of policy-gradient
//! backends (`rl_algorithm` = magrpo | mareinforce | maremax | marloo); the actor-critic
//! backends (iac, maac) are in `marlhf_actor_critic.rs`.
//!
//! 1. load the reward model from `<run_dir>/reward_model/` (on `reward_model_device`) and the
//!    team; with `reference_kl_enabled`, each agent's configured model as its frozen reference
//!    (on `reference_devices`);
//! 2. open a training session over the train items, in file order as the reference walks them,
//!    `rollout_buffer_size` items per buffer (one AdamW per agent, lr `agent_learning_rate`;
//!    state in `<run_dir>/marlhf_training/`);
//! 3. per buffer: every agent samples `num_generations` completions per item (seeded by epoch,
//!    item, agent and sample); joint response k is every agent's k-th; the reward model scores
//!    each joint text (no gradients); with the reference KL, each completion's k3 KL (up to its
//!    first pad token) under the agent and its reference;
//! 4. per agent: each item's advantages (R − c·KL, the mode's baseline, normalized); the buffer
//!    shuffled (seeded) and cut into chunks of `train_batch_size` items; per chunk: the mean over
//!    its items of mean_k −A_k · log π(completion row k), the rows padded to the item's longest
//!    with the pad token and scored without their last position, as the reference does;
//!    backward, AdamW step (a non-finite loss skips it);
//! 5. metrics with the reference's names; periodic evaluations with the task reward; the agents
//!    saved whole to `<run_dir>/agents/`.
use std::path::PathBuf;

use anyhow::{bail, Result};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};

use crate::algo::advantages::{group_advantages, AdvantageMode, AdvantageRule};
use crate::algo::policy_gradient::{chunk_loss, group_loss};
use crate::algo::reference_kl::k3_sequence_kl;
use crate::config::Config;
use crate::device::parse_device;
use crate::model::scoring::{sequence_log_probs, token_log_probs, LastToken, ScoreRow};
use crate::model::{LoadedModel, Mode};
use crate::reward_model::JointRewardModel;
use crate::rng::{derive_seed, purpose};
use crate::run::fingerprint::{file_digest, source_digest};
use crate::run::RunDir;
use crate::stages::fit_rm::{fit_report_path, reward_model_dir, FitReportFile, FRESH_RANK_WARN};
use crate::task::split::train_items;
use crate::task::TaskItem;
use crate::team::rollout::{rollout, Rollout};
use crate::team::{check_fits, load_reference_team, load_team, Agent};
use crate::train::session::{all_weights, Plan, Session, TrainingData, TrainingSummary};

pub struct TrainOptions {
    pub resume: bool,
}

pub struct TrainReport {
    pub updates: u64,
}

/// Where `train-marlhf` keeps its checkpoints, summary and plot.
pub fn state_dir(run_dir: &RunDir) -> PathBuf {
    run_dir.root.join("marlhf_training")
}

/// Joint texts per reward-model forward pass.
const SCORE_BATCH: usize = 8;

/// What every backend trains on: the reward model, the train items (with their indices in
/// the file, which seed the rollouts), the team and its frozen references.
pub(super) struct Setup {
    pub rm: JointRewardModel,
    /// The reward model's digest, for the fingerprint.
    pub rm_digest: String,
    pub indices: Vec<usize>,
    pub items: Vec<TaskItem>,
    pub team: Vec<Agent>,
    pub reference: Option<Vec<Agent>>,
}

/// Warn (not refuse) when `fit-rm` measured that the reward model orders fresh samples of one
/// prompt little better than chance: group advantages then follow noise.
fn warn_on_fresh_rank(run_dir: &RunDir) {
    let report = std::fs::read(fit_report_path(run_dir)).ok();
    let report = report.and_then(|b| serde_json::from_slice::<FitReportFile>(&b).ok());
    let acc = report.and_then(|r| r.fresh_rank).map(|f| f.fresh_rank_acc);
    if let Some(acc) = acc.filter(|&a| a < FRESH_RANK_WARN) {
        tracing::warn!("rm/fresh_rank_acc {acc:.3} < {FRESH_RANK_WARN}");
        eprintln!(
            "warning: the reward model orders fresh samples of one prompt the task reward's way only {:.0}% of the \
             time (rm/fresh_rank_acc {acc:.3} < {FRESH_RANK_WARN}); MARLHF's advantages will be mostly noise",
            acc * 100.0
        );
    }
}

impl Setup {
    /// Load everything; `items_per_buffer` items are sampled at once (`num_generations` each).
    fn load(cfg: &Config, run_dir: &RunDir, items_per_buffer: usize, buffer_keys: &str) -> Result<Self> {
        let rm_dir = reward_model_dir(run_dir);
        if !rm_dir.join("reward_model.json").is_file() {
            bail!("{} holds no reward model; run `pbrl fit-rm` first", rm_dir.display());
        }
        let (_, rm_device) = cfg.reward_model_source()?;
        let rm = JointRewardModel::load(&rm_dir, &parse_device(&rm_device, "reward_model_device")?)?;
        if rm.num_agents != cfg.num_agents as usize {
            bail!("{} scores teams of {} agents, this config has {}", rm_dir.display(), rm.num_agents, cfg.num_agents);
        }
        warn_on_fresh_rank(run_dir);
        let (indices, items): (Vec<usize>, Vec<TaskItem>) = train_items(cfg)?.into_iter().unzip();
        if items.is_empty() {
            bail!("no train items to learn from");
        }
        let team = load_team(cfg, run_dir)?;
        let rows = items_per_buffer * cfg.num_generations as usize;
        check_fits(&team, &items, &cfg.max_new_tokens(), (rows, buffer_keys), "train")?;
        let reference = if cfg.reference_kl_enabled { Some(reference_team(cfg, &team)?) } else { None };
        let head = rm_dir.join("reward_head.safetensors");
        let rm_digest =
            format!("{}+{}", file_digest(&head)?, source_digest(&rm_dir.join("backbone").display().to_string())?);
        Ok(Self { rm, rm_digest, indices, items, team, reference })
    }

    /// Every agent's `k` samples for the items `chunk` (indices into `items`), each request
    /// seeded by epoch, item, agent and sample; `tokens` counts the generated tokens.
    pub fn rollout(&self, cfg: &Config, epoch: u64, chunk: &[usize], tokens: &mut usize) -> Result<Rollout> {
        let batch: Vec<TaskItem> = chunk.iter().map(|&i| self.items[i].clone()).collect();
        let seed = |j: usize, a: usize, s: usize| {
            derive_seed(cfg.seed, &[purpose::RL_ROLLOUT, epoch, self.indices[chunk[j]] as u64, a as u64, s as u64])
        };
        rollout(&self.team, &batch, cfg.num_generations as usize, &cfg.sampling(), seed, |n| *tokens += n)
    }

    /// `kls[a][j][s]`: agent a's reference KL on its completion in joint response s of item j
    /// (zeros without the reference KL).
    pub fn reference_kls(&self, out: &Rollout) -> Result<Vec<Vec<Vec<f64>>>> {
        match &self.reference {
            Some(refs) => self.team.iter().zip(refs).map(|(a, r)| reference_kls(a, r, out)).collect(),
            None => {
                let k = out.responses.first().map_or(0, Vec::len);
                Ok(vec![vec![vec![0.0; k]; out.responses.len()]; self.team.len()])
            }
        }
    }
}

/// The reference's metrics of a buffer's rollouts: reward-model scores and reference KLs.
/// `expected_return` is the mean return the advantages start from: the raw scores for the
/// MAGRPO family (whose KL enters its advantages), the KL-shaped ones for the actor-critic
/// backends (`shaped`).
pub(super) fn rollout_metrics(
    cfg: &Config,
    returns: &[Vec<f64>],
    kls: &[Vec<Vec<f64>>],
    shaped: bool,
    metrics: &mut Value,
) {
    let all: Vec<f64> = returns.iter().flatten().copied().collect();
    metrics["turn_1/reward_mean"] = json!(mean(&all));
    let shaped_returns = kls.iter().flat_map(|agent| {
        agent.iter().zip(returns).flat_map(|(k, r)| k.iter().zip(r).map(|(kl, r)| r - cfg.reference_kl_coef * kl))
    });
    metrics["turn_1/expected_return"] =
        json!(if shaped && cfg.reference_kl_enabled { mean(&shaped_returns.collect::<Vec<_>>()) } else { mean(&all) });
    if cfg.reference_kl_enabled {
        let kl_all: Vec<f64> = kls.iter().flatten().flatten().copied().collect();
        metrics["turn_1/reference_kl_mean"] = json!(mean(&kl_all));
        metrics["turn_1/reference_kl_penalty_mean"] = json!(cfg.reference_kl_coef * mean(&kl_all));
    }
}

pub fn run(cfg: &Config, run_dir: &RunDir, opts: &TrainOptions) -> Result<TrainReport> {
    if cfg.collaboration_mode == "centralized" && cfg.marlhf_advantage_mode().is_none() {
        bail!(
            "collaboration_mode = \"centralized\" with rl_algorithm = \"{}\": the actor-critic backends train \
             decentralized agents; choose a MAGRPO-family rl_algorithm (magrpo, mareinforce, maremax, marloo) for \
             a centralized actor",
            cfg.rl_algorithm
        );
    }
    let started = std::time::Instant::now();
    let (summary, n) = match cfg.marlhf_advantage_mode() {
        Some(mode) => {
            let setup =
                Setup::load(cfg, run_dir, cfg.rollout_buffer_size as usize, "rollout_buffer_size × num_generations")?;
            (train_policy_gradient(cfg, run_dir, &setup, mode, opts)?, setup.items.len())
        }
        None => {
            let per_buffer = super::marlhf_actor_critic::items_per_buffer(cfg);
            let setup = Setup::load(cfg, run_dir, per_buffer, "rollout_buffer_size (rounded up to whole items)")?;
            (super::marlhf_actor_critic::train(cfg, run_dir, &setup, opts)?, setup.items.len())
        }
    };
    println!(
        "trained {} agents with {} on the reward model over {} items: {} updates in {:.1} s; agents saved in {}",
        cfg.num_actors(),
        cfg.rl_algorithm,
        n,
        summary.updates,
        started.elapsed().as_secs_f64(),
        run_dir.agents().display()
    );
    if let (Some(f), Some(b)) = (&summary.final_eval, &summary.best_eval) {
        println!(
            "eval reward (task reward): final {:.4} ± {:.4} after update {}; best {:.4} ± {:.4} after update {}",
            f.reward_mean, f.reward_stderr, f.update, b.reward_mean, b.reward_stderr, b.update
        );
    }
    Ok(TrainReport { updates: summary.updates })
}

/// The MAGRPO family: group advantages per item, the policy-gradient loss on padded rows.
fn train_policy_gradient(
    cfg: &Config,
    run_dir: &RunDir,
    setup: &Setup,
    mode: &str,
    opts: &TrainOptions,
) -> Result<TrainingSummary> {
    let rule = AdvantageRule {
        mode: AdvantageMode::parse(mode)?,
        normalize: cfg.advantage_normalization,
        kl_coef: cfg.reference_kl_enabled.then_some(cfg.reference_kl_coef),
    };
    let Setup { team, items, rm, .. } = setup;
    let buffer = cfg.rollout_buffer_size as usize;
    let chunk_items = cfg.pairs_per_update().min(buffer).max(1);
    let centralized = cfg.collaboration_mode == "centralized";
    let plan = Plan {
        stage: "train-marlhf",
        models: team.iter().map(|a| &a.model).collect(),
        params: team.iter().map(|a| all_weights(&a.model)).collect(),
        sources: cfg.agent_sources()?,
        learning_rates: vec![cfg.agent_learning_rate; team.len()],
        epochs: cfg.num_train_epochs as u64,
        state_dir: state_dir(run_dir),
        shuffle: None,
        fingerprint_extra: vec![("reward model".into(), setup.rm_digest.clone())],
    };
    let data = TrainingData { rounds: &[], num_examples: items.len() };
    let mut session = Session::open_plan(cfg, run_dir, plan, Some(team), data, opts.resume)?;

    session.run(items.len(), buffer, |step, chunk, metrics| {
        let epoch = step.epoch;
        let out = setup.rollout(cfg, epoch, chunk, step.tokens)?;
        // returns[j][s]: the reward model's score of joint response s of item j.
        let returns = joint_scores(rm, &out)?;
        // kls[a][j][s]: agent a's reference KL on its completion in joint response s of item j.
        let kls = setup.reference_kls(&out)?;
        rollout_metrics(cfg, &returns, &kls, false, metrics);
        for (a, agent) in team.iter().enumerate() {
            let advantages: Vec<Vec<f64>> =
                (0..chunk.len()).map(|j| group_advantages(&returns[j], &kls[a][j], rule)).collect();
            let flat: Vec<f64> = advantages.iter().flatten().copied().collect();
            metrics[format!("marlhf/advantage_mean/agent_{a}")] = json!(mean(&flat));
            metrics[format!("marlhf/advantage_abs_mean/agent_{a}")] = json!(abs_mean(&flat));
            // The buffer in a seeded order, cut into the chunks of one update each.
            let mut order: Vec<usize> = (0..chunk.len()).collect();
            let update = step.progress.updates;
            order.shuffle(&mut ChaCha8Rng::seed_from_u64(derive_seed(
                cfg.seed,
                &[purpose::RL_BUFFER, epoch, update, a as u64],
            )));
            let mut losses = Vec::new();
            for part in order.chunks(chunk_items) {
                let groups = part
                    .iter()
                    .map(|&j| {
                        let (rows, scored, last) = if centralized {
                            let rows = joint_rows(agent, &out, j);
                            let scored = vec![true; rows.len()];
                            (rows, scored, LastToken::Include)
                        } else {
                            let (rows, scored) = padded_rows(agent, &out, j);
                            (rows, scored, LastToken::Exclude)
                        };
                        let pad = agent.model.tokenizer.pad_id;
                        let lp = sequence_log_probs(&agent.model.model, &rows, last, pad, Mode::Train)?;
                        group_loss(&lp, &advantages[j], &scored)
                    })
                    .collect::<Result<Vec<_>>>()?;
                let Some(loss) = chunk_loss(groups)? else { continue };
                if let Some((value, grad_norm)) = step.apply(a, loss, || {})? {
                    losses.push(value);
                    metrics[format!("marlhf/grad_norm/agent_{a}")] = json!(grad_norm);
                }
            }
            if !losses.is_empty() {
                metrics[format!("marlhf/loss/agent_{a}")] = json!(mean(&losses));
            }
        }
        metrics["marlhf/skipped_nonfinite"] = json!(step.progress.skipped_nonfinite.iter().sum::<u64>());
        Ok(())
    })?;
    session.finish()
}

/// Mean |x| (0 for none): the advantage magnitude both backends log.
pub(super) fn abs_mean(xs: &[f64]) -> f64 {
    xs.iter().map(|x| x.abs()).sum::<f64>() / xs.len().max(1) as f64
}

pub(super) fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len().max(1) as f64
}

/// The reward model's score of every joint response, `[item][sample]`, without gradients.
pub(super) fn joint_scores(rm: &JointRewardModel, out: &Rollout) -> Result<Vec<Vec<f64>>> {
    let mut rows = Vec::new();
    for (j, responses) in out.responses.iter().enumerate() {
        for s in 0..responses.len() {
            rows.push(rm.encode(&out.prompts[j], &out.texts(j, s))?);
        }
    }
    let scores = rm.score(&rows, SCORE_BATCH)?;
    if let Some(bad) = scores.iter().position(|s| !s.is_finite()) {
        bail!("the reward model scored joint response {bad} of this buffer {}: not a usable reward", scores[bad]);
    }
    let k = out.responses.first().map_or(0, Vec::len);
    Ok(scores.chunks(k.max(1)).map(<[f64]>::to_vec).collect())
}

/// The token generation pads an agent's rows with: the model's pad token (transformers'
/// `generate` pads with it), else its first stop token.
pub(super) fn rollout_pad(agent: &Agent) -> u32 {
    agent.model.model.config.pad_token_id.unwrap_or(agent.model.tokenizer.stop_ids[0])
}

/// Agent `a`'s completion rows of item `j` as the reference scores them: each completion (with
/// its stop token when it ended) padded with the pad token to the item's longest; and whether a
/// row has anything to score (more than one token: the last position is left out).
fn padded_rows(agent: &Agent, out: &Rollout, j: usize) -> (Vec<ScoreRow>, Vec<bool>) {
    let a = agent.index;
    let longest = out.responses[j].iter().map(|joint| joint[a].ids.len()).max().unwrap_or(0);
    let pad = rollout_pad(agent);
    let rows: Vec<ScoreRow> = out.responses[j]
        .iter()
        .map(|joint| {
            let mut completion = joint[a].ids.clone();
            completion.resize(longest, pad);
            ScoreRow { prompt: out.prompt_ids[j][a].clone(), completion }
        })
        .collect();
    let scored = rows.iter().map(|r| r.completion.len() > 1).collect();
    (rows, scored)
}

/// The centralized actor's rows of item `j` as the joint scorer reads them (reference §6.3):
/// each completion cut at its first pad token, which is kept when it is the end-of-turn token,
/// every token scored (an empty row scores 0 and still counts in the group's mean).
fn joint_rows(agent: &Agent, out: &Rollout, j: usize) -> Vec<ScoreRow> {
    let pad = rollout_pad(agent);
    let pad_ends_turn = agent.model.tokenizer.stop_ids.contains(&pad);
    out.responses[j]
        .iter()
        .map(|joint| {
            let ids = &joint[agent.index].ids;
            let end = ids.iter().position(|&t| t == pad).map_or(ids.len(), |p| p + usize::from(pad_ends_turn));
            ScoreRow { prompt: out.prompt_ids[j][agent.index].clone(), completion: ids[..end].to_vec() }
        })
        .collect()
}

/// Agent `a`'s k3 reference KL on each of its completions, `[item][sample]`: over the response
/// up to its first pad token (where the reference measures a response's length), under the
/// agent and its frozen reference, without gradients.
pub(super) fn reference_kls(agent: &Agent, reference: &Agent, out: &Rollout) -> Result<Vec<Vec<f64>>> {
    let a = agent.index;
    let pad = rollout_pad(agent);
    let mut rows = Vec::new();
    for (j, responses) in out.responses.iter().enumerate() {
        for joint in responses {
            let ids = &joint[a].ids;
            let len = ids.iter().position(|&t| t == pad).unwrap_or(ids.len());
            rows.push(ScoreRow { prompt: out.prompt_ids[j][a].clone(), completion: ids[..len].to_vec() });
        }
    }
    let per_token =
        |m: &LoadedModel| token_log_probs(&m.model, &rows, LastToken::Include, m.tokenizer.pad_id, Mode::Infer);
    let (p, r) = (per_token(&agent.model)?, per_token(&reference.model)?);
    let mut kls = Vec::with_capacity(rows.len());
    for (i, row) in rows.iter().enumerate() {
        kls.push(match (&p, &r) {
            (Some(p), Some(r)) if !row.completion.is_empty() => k3_sequence_kl(&p.row(i)?, &r.row(i)?),
            _ => 0.0,
        });
    }
    let k = out.responses.first().map_or(0, Vec::len);
    Ok(kls.chunks(k.max(1)).map(<[f64]>::to_vec).collect())
}

/// The frozen reference of each agent: its configured model (`agent_model` / `agents`), as
/// the reference's MARLHF starts from it. Not the team in `agents/`: a resumed or extended run
/// has overwritten that with its own agents.
pub(super) fn reference_team(cfg: &Config, team: &[Agent]) -> Result<Vec<Agent>> {
    load_reference_team(cfg, team, &cfg.agent_sources()?, "reference model")
}
