//! The small typed configs that components take, built from the file's flat keys: counts as
//! `usize`/`u64`, modes as enums, per-actor lists resolved. A component reads its own config,
//! never the whole file.
use std::path::PathBuf;

use pbrl_model::SamplingParams;

use super::{
    AgentLora, BaseDType, Config, ConfigError, DeviceSpec, EvalSplit, HistoryReward, LrSchedule, RewardConfig,
};

/// The debate transition's template when `transition.template` is not set.
pub const DEFAULT_DEBATE_TEMPLATE: &str = "{prompt}\n\nYour answer so far:\n{own}\n\nThe other agents answered:\n{others}\n\nRead their answers, then write your own improved answer.";

/// What the training session reads (`train::session`): the seed of its streams, the epochs, the
/// schedule, checkpoints, the periodic evaluation's cadence, keep-best, and how the team is saved.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    pub seed: u64,
    pub num_train_epochs: u64,
    pub lr_schedule: LrSchedule,
    /// Epochs between checkpoints (0: none).
    pub checkpoint_interval: u64,
    pub checkpoint_total_limit: Option<usize>,
    /// Updates between periodic evaluations (0: none).
    pub eval_interval: u64,
    pub keep_best: bool,
    pub keep_best_tolerance: f64,
    /// LoRA agents also saved merged into their bases.
    pub save_merged: bool,
    /// Each actor's sampling settings, saved with the team.
    pub sampling: Vec<SamplingParams>,
}

/// What an evaluation reads (`evaluation::evaluate`): each actor's sampling settings, the
/// samples per item, the batch and how many sampling rows it makes.
#[derive(Debug, Clone)]
pub struct EvalConfig {
    pub sampling: Vec<SamplingParams>,
    pub samples_per_item: usize,
    pub batch_items: usize,
    /// Sampling rows per batch, and the keys that set them (for the memory check's message).
    pub rows: (usize, &'static str),
    /// One actor writes every role (its joint completion is kept in the report).
    pub centralized: bool,
    /// More than one turn: how the discussion goes on.
    pub turns: Option<TurnsConfig>,
}

/// A multi-turn discussion (`num_turns` > 1): its turns, the transition between them, how a
/// transition's text becomes a prompt, and the history's score.
#[derive(Debug, Clone)]
pub struct TurnsConfig {
    pub num_turns: usize,
    pub transition: TransitionSpec,
    /// `external_prompt_passthrough`.
    pub passthrough: bool,
    pub history_reward: HistoryReward,
}

/// `[transition]`, validated.
#[derive(Debug, Clone)]
pub enum TransitionSpec {
    /// Each agent's template.
    Debate(Vec<String>),
    Command {
        command: Vec<String>,
        env: Vec<String>,
        timeout_s: f64,
    },
}

/// Which of the task's items each stage uses (`task::split`, `evaluation`'s items): the files,
/// the roles' prompt templates (every item must fill them), the held-out share, the eval items
/// an evaluation takes, and iterate's items per round.
#[derive(Debug, Clone)]
pub struct SplitConfig {
    pub train_file: Option<PathBuf>,
    pub eval_file: Option<PathBuf>,
    pub validation_file: Option<PathBuf>,
    /// Eval items an evaluation uses, at most (0: no evaluation).
    pub eval_num_samples: usize,
    pub role_templates: Vec<String>,
    pub eval_split: EvalSplit,
    /// The seed of the held-out choice and of the rounds' items.
    pub seed: u64,
    pub items_per_round: Option<usize>,
}

/// What the oracle reads (`oracle::Oracle`): the `[reward]` table, a `command` reward's timeout,
/// and how the roles' outputs come out of the actors' (centralized: one actor writes every role,
/// each role's template then shown to the reward).
#[derive(Debug, Clone)]
pub struct OracleConfig {
    pub reward: RewardConfig,
    pub timeout_s: f64,
    pub centralized: bool,
    pub role_templates: Vec<String>,
}

/// What loading the team reads (`team`): its roles and actors, each actor's source and device,
/// the prompt recipe (templates, system prompts, the chat template and its arguments, and
/// whether one actor writes every role), LoRA agents and how a training team is set up, and
/// where read-only references go and how they store their weights.
#[derive(Debug, Clone)]
pub struct TeamConfig {
    pub num_roles: usize,
    pub num_actors: usize,
    pub sources: Vec<String>,
    pub devices: Vec<String>,
    pub formatters: Vec<String>,
    pub system_prompts: Option<Vec<String>>,
    pub centralized: bool,
    pub role_templates: Vec<String>,
    pub chat_template: bool,
    pub chat_template_kwargs: serde_json::Map<String, serde_json::Value>,
    pub agent_lora: Option<AgentLora>,
    /// The seed of fresh adapters.
    pub seed: u64,
    pub gradient_checkpointing: bool,
    pub reference_devices: Option<DeviceSpec>,
    pub frozen_dtype: Option<BaseDType>,
}

impl EvalConfig {
    /// Each actor's `max_new_tokens`.
    pub fn max_new_tokens(&self) -> Vec<usize> {
        self.sampling.iter().map(|s| s.max_new_tokens).collect()
    }
}

impl Config {
    /// The discussion's turns beyond the first (`None`: one turn).
    pub fn turns(&self) -> Option<TurnsConfig> {
        let t = self.transition.as_ref().filter(|_| self.num_turns > 1)?;
        let transition = match t.kind.as_str() {
            "command" => {
                TransitionSpec::Command { command: t.command.clone(), env: t.env.clone(), timeout_s: t.timeout_s }
            }
            _ => TransitionSpec::Debate(match &t.template {
                Some(template) => (0..self.num_actors()).map(|a| template.of(a).clone()).collect(),
                None => vec![DEFAULT_DEBATE_TEMPLATE.to_string(); self.num_actors()],
            }),
        };
        Some(TurnsConfig {
            num_turns: self.num_turns as usize,
            transition,
            passthrough: self.external_prompt_passthrough,
            history_reward: match self.history_reward.as_str() {
                "sum" => HistoryReward::Sum,
                _ => HistoryReward::Last,
            },
        })
    }

    /// The team's settings; the sources and devices resolved (an error names the key).
    pub fn team(&self) -> Result<TeamConfig, ConfigError> {
        let num_actors = self.num_actors();
        let sources = self.agent_sources()?;
        let devices = DeviceSpec::resolve(self.agent_devices.as_ref(), num_actors, "agent_devices")?;
        let chat_template_kwargs = match serde_json::to_value(&self.task.chat_template_kwargs) {
            Ok(serde_json::Value::Object(m)) => m,
            Ok(_) => unreachable!("a TOML table serializes to a JSON object"),
            Err(e) => return Err(ConfigError(format!("task.chat_template_kwargs: {e}"))),
        };
        Ok(TeamConfig {
            num_roles: self.num_agents as usize,
            num_actors,
            sources,
            devices,
            formatters: self.task.formatters.clone(),
            system_prompts: self.task.system_prompts.clone(),
            centralized: self.modes.centralized,
            role_templates: self.role_templates(),
            chat_template: self.task.chat_template,
            chat_template_kwargs,
            agent_lora: self.agent_lora.clone(),
            seed: self.seed,
            gradient_checkpointing: self.gradient_checkpointing,
            reference_devices: self.reference_devices.clone(),
            frozen_dtype: self.frozen_dtype,
        })
    }

    pub fn oracle(&self) -> OracleConfig {
        OracleConfig {
            reward: self.reward.clone(),
            timeout_s: self.reward_timeout_s,
            centralized: self.modes.centralized,
            role_templates: self.role_templates(),
        }
    }

    pub fn split(&self) -> SplitConfig {
        SplitConfig {
            train_file: self.task.train_file.clone(),
            eval_file: self.task.eval_file.clone(),
            validation_file: self.task.validation_file.clone(),
            eval_num_samples: self.eval_num_samples as usize,
            role_templates: self.role_templates(),
            eval_split: self.eval_split,
            seed: self.seed,
            items_per_round: self.items_per_round.map(|k| k as usize),
        }
    }

    pub fn session(&self) -> SessionConfig {
        SessionConfig {
            seed: self.seed,
            num_train_epochs: self.num_train_epochs as u64,
            lr_schedule: self.lr_scheduler_type,
            checkpoint_interval: self.checkpoint_interval as u64,
            checkpoint_total_limit: self.checkpoint_total_limit.map(|l| l as usize),
            eval_interval: self.eval_interval as u64,
            keep_best: self.keep_best,
            keep_best_tolerance: self.keep_best_tolerance,
            save_merged: self.agent_lora.as_ref().is_some_and(|l| l.save_merged),
            sampling: self.sampling(),
        }
    }

    pub fn eval(&self) -> EvalConfig {
        EvalConfig {
            sampling: self.sampling(),
            samples_per_item: self.eval_samples_per_item as usize,
            batch_items: self.eval_batch_size as usize,
            rows: self.eval_rows(),
            centralized: self.modes.centralized,
            turns: self.turns(),
        }
    }
}
