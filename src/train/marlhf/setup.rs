//! What every MARLHF backend shares: the reward model, the train items, the team and its frozen
//! references loaded and checked (`Setup`); the seeded rollouts, the reward model's scores of
//! joint responses, the reference KL of each completion, and the rollout metrics.
use std::cell::RefCell;
use std::time::Instant;

use anyhow::{bail, Result};
use serde_json::{json, Value};

use crate::algo::reference_kl::k3_sequence_kl;
use crate::config::{MarlhfConfig, TeamConfig};
use crate::device::{ensure_fits, parse_device};
use crate::oracle::Oracle;
use crate::reward_model::JointRewardModel;
use crate::rng::{derive_seed, purpose};
use crate::run::RunDir;
use crate::task::split::train_items;
use crate::task::TaskItem;
use crate::team::rollout::{rollout, Rollout};
use crate::team::{check_fits, load_reference_team, load_training_team, Agent};
use crate::train::reward_fit::{FitReportFile, FRESH_RANK_WARN};
use pbrl_model::scoring::{token_log_probs, LastToken, ScoreRow};
use pbrl_model::{LoadedModel, Mode};

/// Joint texts per reward-model forward pass.
pub(super) const SCORE_BATCH: usize = 8;

/// What scores the joint responses RL learns from (`rl_reward`).
pub(crate) enum RlReward {
    /// The joint reward model `fit-rm` fitted, with its digest (for the fingerprint).
    Model(Box<JointRewardModel>, String),
    /// The task reward itself, after reward_processor (`Oracle` takes `&mut` for a command
    /// reward's process).
    Task(RefCell<Oracle>),
}

impl RlReward {
    /// The fingerprint's entry for the reward model (none for the task reward: the config holds
    /// it).
    pub fn fingerprint(&self) -> Vec<(String, String)> {
        match self {
            RlReward::Model(_, digest) => vec![("reward model".into(), digest.clone())],
            RlReward::Task(_) => Vec::new(),
        }
    }

    /// The scores of `joints` (each the actors' texts) of `item` given the actors' `prompts`.
    pub fn score(&self, item: &TaskItem, prompts: &[String], joints: &[Vec<String>]) -> Result<Vec<f64>> {
        let scores = match self {
            RlReward::Model(rm, _) => {
                let rows = joints.iter().map(|j| rm.encode(prompts, j)).collect::<Result<Vec<_>>>()?;
                rm.score(&rows, SCORE_BATCH)?
            }
            RlReward::Task(oracle) => oracle.borrow_mut().score(item, prompts, joints)?.processed,
        };
        if let Some(bad) = scores.iter().find(|s| !s.is_finite()) {
            bail!("a joint response of this buffer scored {bad}: not a usable reward");
        }
        Ok(scores)
    }
}

/// What every backend trains on: the reward model (or the task reward), the train items (with
/// their indices in the file, which seed the rollouts), the team and its frozen references.
pub(crate) struct Setup {
    pub reward: RlReward,
    pub indices: Vec<usize>,
    pub items: Vec<TaskItem>,
    pub team: Vec<Agent>,
    pub reference: Option<Vec<Agent>>,
}

/// A buffer's rollouts with their returns and reference KLs ([`Setup::scored_rollout`]).
pub(super) struct ScoredRollout {
    pub out: Rollout,
    pub returns: Vec<Vec<f64>>,
    pub kls: Vec<Vec<Vec<f64>>>,
}

/// What a backend samples and scores at once, with the keys that set each (named in errors).
pub(super) struct BatchShape {
    /// Items sampled together (`num_generations` completions each).
    pub items_per_buffer: usize,
    pub buffer_keys: &'static str,
    /// Completions of one agent scored, with their gradient, in one update.
    pub rows_per_update: usize,
    pub update_keys: &'static str,
}

/// The reward model `fit-rm` fitted, checked to score teams of this config's size.
fn load_reward_model(cfg: &MarlhfConfig, run_dir: &RunDir) -> Result<JointRewardModel> {
    let rm_dir = run_dir.reward_model();
    if !JointRewardModel::exists(&rm_dir) {
        bail!(
            "{} holds no reward model; run `pbrl fit-rm` first (or set rl_reward = \"task\" for RL on the task \
             reward)",
            rm_dir.display()
        );
    }
    let rm = JointRewardModel::load(
        &rm_dir,
        &parse_device(&cfg.reward_model_device, "reward_model_device")?,
        crate::team::frozen_storage(cfg.frozen_dtype),
    )?;
    if rm.num_agents != cfg.team.num_roles {
        bail!("{} scores teams of {} agents, this config has {}", rm_dir.display(), rm.num_agents, cfg.team.num_roles);
    }
    warn_on_fresh_rank(run_dir);
    Ok(rm)
}

/// Warn (not refuse) when `fit-rm` measured that the reward model orders fresh samples of one
/// prompt little better than chance: group advantages then follow noise.
fn warn_on_fresh_rank(run_dir: &RunDir) {
    let report = std::fs::read(run_dir.fit_report()).ok();
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
    /// Load everything, and refuse before any work a batch `shape` whose sampling or update
    /// would not fit in memory.
    pub(super) fn load(cfg: &MarlhfConfig, run_dir: &RunDir, shape: BatchShape) -> Result<Self> {
        let reward = match cfg.task_reward {
            true => RlReward::Task(RefCell::new(Oracle::new(&cfg.training.evaluation.oracle)?)),
            false => {
                let rm = load_reward_model(cfg, run_dir)?;
                RlReward::Model(Box::new(rm), JointRewardModel::digest(&run_dir.reward_model())?)
            }
        };
        let (indices, items): (Vec<usize>, Vec<TaskItem>) =
            train_items(&cfg.training.evaluation.split)?.into_iter().unzip();
        if items.is_empty() {
            bail!("no train items to learn from");
        }
        let team = load_training_team(&cfg.team, run_dir)?;
        let rows = shape.items_per_buffer.saturating_mul(cfg.num_generations);
        check_fits(&team, &items, &cfg.max_new_tokens, (rows, shape.buffer_keys), "train")?;
        for agent in &team {
            // Only completion tokens are scored, each at most max_new_tokens long.
            let tokens = shape.rows_per_update.saturating_mul(cfg.max_new_tokens[agent.index]);
            ensure_fits(&agent.device, agent.model.model.config.logit_and_grad_bytes(tokens), |need, free| {
                format!(
                    "{}: an update scores up to {} completions of actor {} ({tokens} tokens), whose logits and their \
                     gradient alone may need {need} MiB, more than the {free} MiB of memory available; lower them",
                    shape.update_keys, shape.rows_per_update, agent.index
                )
            })?;
        }
        let reference = if cfg.reference_kl.is_some() { Some(reference_team(&cfg.team, &team)?) } else { None };
        Ok(Self { reward, indices, items, team, reference })
    }

    /// Every agent's `k` samples for the items `chunk` (indices into `items`), each request
    /// seeded by epoch, item, agent and sample; `tokens` counts the generated tokens.
    pub fn rollout(&self, cfg: &MarlhfConfig, epoch: u64, chunk: &[usize], tokens: &mut usize) -> Result<Rollout> {
        let batch: Vec<TaskItem> = chunk.iter().map(|&i| self.items[i].clone()).collect();
        let seed = |j: usize, a: usize, s: usize| {
            derive_seed(cfg.seed, &[purpose::RL_ROLLOUT, epoch, self.indices[chunk[j]] as u64, a as u64, s as u64])
        };
        rollout(&self.team, &batch, cfg.num_generations, &cfg.sampling, seed, |n| *tokens += n)
    }

    /// A buffer's rollouts ([`Setup::rollout`]) and what its advantages start from:
    /// `returns[j][s]`, the reward model's score of joint response s of item j, and `kls[a][j][s]`
    /// ([`Setup::reference_kls`]). Records the rollout metrics and where the time went:
    /// `time/rollout_s` (sampling), `time/reward_s` (the reward model and the reference KLs).
    pub fn scored_rollout(
        &self,
        cfg: &MarlhfConfig,
        (epoch, chunk): (u64, &[usize]),
        tokens: &mut usize,
        shaped: bool,
        metrics: &mut Value,
    ) -> Result<ScoredRollout> {
        let started = Instant::now();
        let out = self.rollout(cfg, epoch, chunk, tokens)?;
        metrics["time/rollout_s"] = json!(started.elapsed().as_secs_f64());
        let started = Instant::now();
        let returns = match &self.reward {
            RlReward::Model(rm, _) => joint_scores(rm, &out)?,
            RlReward::Task(_) => (0..chunk.len())
                .map(|j| {
                    let joints: Vec<Vec<String>> = (0..out.responses[j].len()).map(|s| out.texts(j, s)).collect();
                    self.reward.score(&self.items[chunk[j]], &out.prompts[j], &joints)
                })
                .collect::<Result<Vec<_>>>()?,
        };
        let kls = self.reference_kls(&out)?;
        metrics["time/reward_s"] = json!(started.elapsed().as_secs_f64());
        rollout_metrics(cfg.reference_kl, &returns, &kls, shaped, metrics);
        Ok(ScoredRollout { out, returns, kls })
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
fn rollout_metrics(
    reference_kl: Option<f64>,
    returns: &[Vec<f64>],
    kls: &[Vec<Vec<f64>>],
    shaped: bool,
    metrics: &mut Value,
) {
    let all: Vec<f64> = returns.iter().flatten().copied().collect();
    metrics["turn_1/reward_mean"] = json!(mean(&all));
    metrics["turn_1/expected_return"] = json!(match reference_kl {
        Some(coef) if shaped => {
            let shaped_returns = kls.iter().flat_map(|agent| {
                agent.iter().zip(returns).flat_map(|(k, r)| k.iter().zip(r).map(|(kl, r)| r - coef * kl))
            });
            mean(&shaped_returns.collect::<Vec<_>>())
        }
        _ => mean(&all),
    });
    if let Some(coef) = reference_kl {
        let kl_all: Vec<f64> = kls.iter().flatten().flatten().copied().collect();
        metrics["turn_1/reference_kl_mean"] = json!(mean(&kl_all));
        metrics["turn_1/reference_kl_penalty_mean"] = json!(coef * mean(&kl_all));
    }
}

/// Mean |x| (0 for none): the advantage magnitude both backends log.
pub(super) fn abs_mean(xs: &[f64]) -> f64 {
    xs.iter().map(|x| x.abs()).sum::<f64>() / xs.len().max(1) as f64
}

pub(super) use crate::algo::trend::mean;

/// The reward model's score of every joint response, `[item][sample]`, without gradients.
fn joint_scores(rm: &JointRewardModel, out: &Rollout) -> Result<Vec<Vec<f64>>> {
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
pub(super) fn reference_team(config: &TeamConfig, team: &[Agent]) -> Result<Vec<Agent>> {
    load_reference_team(config, team, &config.sources, "reference model")
}
