//! The typed views of the config that stages take: per-actor settings, counts as `usize`,
//! modes resolved, sources with their defaults filled in.
use super::{err, Config, ConfigError, DeviceSpec, ReplayMode, TokenLimit, DEFAULT_REWARD_HEAD_HIDDEN};

impl Config {
    /// Each actor's `max_new_tokens` (one entry per actor and each >= 1: checked when the
    /// config loads).
    pub fn max_new_tokens(&self) -> Vec<usize> {
        match &self.max_new_tokens {
            TokenLimit::One(t) => vec![*t as usize; self.num_actors()],
            TokenLimit::PerActor(v) => v.iter().map(|&t| t as usize).collect(),
        }
    }

    /// Each actor's sampling settings, as every stage uses them (collection, evaluation,
    /// exported agents): the same but for `max_new_tokens`, which may be per actor.
    pub fn sampling(&self) -> Vec<pbrl_model::SamplingParams> {
        self.max_new_tokens()
            .into_iter()
            .map(|max_new_tokens| pbrl_model::SamplingParams {
                temperature: self.temperature,
                top_p: self.top_p,
                top_k: self.top_k.map(|k| k as usize),
                max_new_tokens,
            })
            .collect()
    }

    /// `preference_replay_sample_size` as a count.
    pub fn replay_sample_size(&self) -> Option<usize> {
        self.preference_replay_sample_size.map(|s| s as usize)
    }

    /// Sampling requests per evaluation batch, and the keys that set it.
    pub fn eval_rows(&self) -> (usize, &'static str) {
        let rows = (self.eval_batch_size as usize).saturating_mul(self.eval_samples_per_item as usize);
        (rows, "eval_batch_size × eval_samples_per_item")
    }

    /// Pairs per preference update (train_batch_size, defaulting to rollout_buffer_size).
    pub fn pairs_per_update(&self) -> usize {
        self.train_batch_size.unwrap_or(self.rollout_buffer_size) as usize
    }

    /// The replay mode with its parameter (validated).
    pub fn replay_mode(&self) -> ReplayMode {
        match self.preference_replay_mode.as_str() {
            "nearest_k" => ReplayMode::NearestK(self.preference_replay_k.unwrap_or(1) as usize),
            "all_history" => ReplayMode::AllHistory,
            "lambda_decay" => ReplayMode::LambdaDecay(self.preference_replay_lambda.unwrap_or(1.0)),
            _ => ReplayMode::Current,
        }
    }

    /// How many models act: one per agent, or the one centralized actor writing every role.
    pub fn num_actors(&self) -> usize {
        if self.collaboration_mode == "centralized" {
            1
        } else {
            self.num_agents as usize
        }
    }

    /// Each role's `formatters` template (one template serves every role).
    pub fn role_templates(&self) -> Vec<String> {
        let f = &self.task.formatters;
        (0..self.num_agents as usize).map(|a| f[if f.len() == 1 { 0 } else { a }].clone()).collect()
    }

    /// The team's shape, for errors: "num_agents 2, collaboration_mode decentralized".
    pub fn team_setup(&self) -> String {
        format!("num_agents {}, collaboration_mode {}", self.num_agents, self.collaboration_mode)
    }

    /// The reward head's hidden layer width (pooled head).
    pub fn reward_head_hidden(&self) -> usize {
        self.reward_head_hidden.map_or(DEFAULT_REWARD_HEAD_HIDDEN, |d| d as usize)
    }

    /// The reward model's backbone source and device (reference §7.1: `reward_model_name`, else
    /// the actors' model; the device: `reward_model_device`, else the first actor's).
    pub fn reward_model_source(&self) -> Result<(String, String), ConfigError> {
        let source = match &self.reward_model_name {
            Some(s) => s.clone(),
            None => self.agent_sources()?.swap_remove(0),
        };
        let device = match &self.reward_model_device {
            Some(d) => d.clone(),
            None => {
                DeviceSpec::resolve(self.agent_devices.as_ref(), self.num_actors(), "agent_devices")?.swap_remove(0)
            }
        };
        Ok((source, device))
    }

    /// The model source of each actor.
    pub fn agent_sources(&self) -> Result<Vec<String>, ConfigError> {
        let n = self.num_actors();
        match (&self.agents, &self.agent_model) {
            (Some(a), _) if a.len() == n => Ok(a.clone()),
            (Some(_), _) if self.collaboration_mode == "centralized" => {
                err("Centralized collaboration requires exactly one actor model: `agents` must list one model.")
            }
            (Some(a), _) => err(format!("agents lists {} models but num_agents is {n}", a.len())),
            (None, Some(m)) => Ok(vec![m.clone(); n]),
            (None, None) => err("no model: set `agent_model` (one source for all agents) or `agents` (one per agent)"),
        }
    }
}
