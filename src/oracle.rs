//! The oracle: what scores a joint response with the task reward, everywhere pbrl does (rounds,
//! evaluations, `fit-rm`'s fresh samples): the roles' outputs from the actors' outputs
//! (centralized: parsed from the tagged joint text), the task reward on them with the prompts
//! the roles were given, then `reward_processor`.
use anyhow::Result;

use crate::config::OracleConfig;
use crate::task::configured::build_reward;
use crate::task::reward::{RewardProcessor, TaskReward};
use crate::task::TaskItem;
use crate::team::collab::Collaboration;

pub struct Oracle {
    reward: Box<dyn TaskReward>,
    processor: RewardProcessor,
    collab: Collaboration,
}

/// An item's joint responses scored: the task reward's raw values, and after the processor.
pub struct Scores {
    pub raw: Vec<f64>,
    pub processed: Vec<f64>,
}

impl Oracle {
    /// The config's task reward (a `command` reward's program is started here).
    pub fn new(cfg: &OracleConfig) -> Result<Self> {
        let (reward, processor) = build_reward(&cfg.reward, cfg.timeout_s)?;
        Ok(Self { reward, processor, collab: Collaboration::new(cfg.centralized, cfg.role_templates.clone()) })
    }

    /// Score an item's joint responses (`joints[k]`: each actor's output), given each actor's
    /// prompt; one request to a `command` reward per item. Non-finite values are the caller's
    /// to refuse, naming what it scored.
    pub fn score(&mut self, item: &TaskItem, actor_prompts: &[String], joints: &[Vec<String>]) -> Result<Scores> {
        let roles: Vec<Vec<String>> = joints.iter().map(|j| self.collab.role_outputs(j)).collect();
        let raw = self.reward.score_batch(item, &self.collab.reward_prompts(item, actor_prompts)?, &roles)?;
        let processed = raw.iter().map(|&r| self.processor.apply(r)).collect();
        Ok(Scores { raw, processed })
    }

    /// The roles' outputs of one joint response (what the reward reads, and reports show).
    pub fn role_outputs(&self, actor_outputs: &[String]) -> Vec<String> {
        self.collab.role_outputs(actor_outputs)
    }
}
