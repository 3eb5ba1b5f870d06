//! MARLHF: online RL of the agents on the joint reward model `fit-rm` fitted (reference §7.4),
//! or on the task reward itself (`rl_reward = "task"`, CoMLRL's MAGRPOTrainer); `pbrl
//! train-marlhf` and `iterate`'s MARLHF rounds run it. `setup.rs`: what every backend shares;
//! `policy_gradient.rs`: the MAGRPO family (`rl_algorithm` = magrpo | mareinforce | maremax |
//! marloo); `turns.rs`: the MAGRPO family over multi-turn discussions and cross joint actions;
//! `actor_critic.rs`: iac and maac.
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
pub mod actor_critic;
mod policy_gradient;
mod setup;
mod turns;

use anyhow::{bail, Result};

use crate::config::{MarlhfBackend, MarlhfConfig};
use crate::run::RunDir;
use crate::train::session::TrainingSummary;
use policy_gradient::train_policy_gradient;
use setup::{BatchShape, Setup};

pub struct TrainOptions {
    pub resume: bool,
}

pub struct TrainReport {
    pub num_agents: usize,
    pub algorithm: String,
    /// What RL maximized: "the reward model" or "the task reward".
    pub reward: &'static str,
    /// The train items the rollouts walk.
    pub num_items: usize,
    pub summary: TrainingSummary,
    pub secs: f64,
    pub saved_in: std::path::PathBuf,
}

impl TrainReport {
    /// What the training did, as `pbrl train-marlhf` prints it.
    pub fn describe(&self) -> String {
        let what = format!(
            "{} agents with {} on {} over {} items",
            self.num_agents, self.algorithm, self.reward, self.num_items
        );
        self.summary.describe(&what, self.secs, &self.saved_in)
    }
}

/// Train the team on the reward model in `reward_model/` and save it in `agents/`.
pub fn train(cfg: &MarlhfConfig, run_dir: &RunDir, opts: &TrainOptions) -> Result<TrainReport> {
    let backend = cfg.backend;
    if cfg.team.centralized && !matches!(backend, MarlhfBackend::PolicyGradient(_)) {
        bail!(
            "collaboration_mode = \"centralized\" with rl_algorithm = \"{}\": the actor-critic backends train \
             decentralized agents; choose a MAGRPO-family rl_algorithm (magrpo, mareinforce, maremax, marloo) for \
             a centralized actor",
            cfg.algorithm
        );
    }
    let started = std::time::Instant::now();
    let (summary, n) = match backend {
        MarlhfBackend::PolicyGradient(mode) => {
            let setup = Setup::load(
                cfg,
                run_dir,
                BatchShape {
                    items_per_buffer: cfg.rollout_buffer_size,
                    buffer_keys: "rollout_buffer_size × num_generations",
                    rows_per_update: policy_gradient::items_per_update(cfg).saturating_mul(cfg.num_generations),
                    update_keys: "train_batch_size × num_generations",
                },
            )?;
            let summary = match cfg.turns.is_some() || cfg.cross {
                true => turns::train_discussions(cfg, run_dir, &setup, mode, opts)?,
                false => train_policy_gradient(cfg, run_dir, &setup, mode, opts)?,
            };
            (summary, setup.items.len())
        }
        MarlhfBackend::Iac { .. } | MarlhfBackend::Maac => {
            let shape = BatchShape {
                items_per_buffer: actor_critic::items_per_buffer(cfg),
                buffer_keys: "rollout_buffer_size (rounded up to whole items)",
                rows_per_update: cfg.pairs_per_update.max(1),
                update_keys: "train_batch_size",
            };
            let setup = Setup::load(cfg, run_dir, shape)?;
            (actor_critic::train(cfg, run_dir, &setup, opts)?, setup.items.len())
        }
    };
    Ok(TrainReport {
        num_agents: cfg.team.num_actors,
        algorithm: cfg.algorithm.clone(),
        reward: if cfg.task_reward { "the task reward" } else { "the reward model" },
        num_items: n,
        summary,
        secs: started.elapsed().as_secs_f64(),
        saved_in: run_dir.agents(),
    })
}
