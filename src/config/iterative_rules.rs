//! The iterative keys' rules (reference `_validate_iterative_config`, §2.3), in its order and
//! words, and pbrl's own iterative keys'.
use super::rules::MAX_SECONDS;
use super::{err, Config, ConfigError, DeviceSpec};

/// Rounds of `iterate` (each a collection and a training): far more than a run can do, few
/// enough that no count wraps.
const MAX_ITERATIONS: i64 = 100_000;
/// Tries of one comparator API request.
const MAX_API_ATTEMPTS: i64 = 100;

impl Config {
    /// The iterative keys (reference `_validate_iterative_config`, §2.3): the comparator's
    /// policy and generation mode with their aliases, and which keys each policy takes.
    pub(super) fn validate_iterative(&mut self) -> Result<(), ConfigError> {
        if !(1..=MAX_ITERATIONS).contains(&self.num_iterations) {
            return err(format!("num_iterations must be in [1, {MAX_ITERATIONS}]."));
        }
        self.algorithm = self.algorithm.trim().to_lowercase();
        if !matches!(self.algorithm.as_str(), "madpo" | "marlhf") {
            return err("algorithm must be one of: madpo, marlhf.");
        }
        self.comparator_policy = match self.comparator_policy.trim().to_lowercase().as_str() {
            "current" | "self" | "online" => "current",
            "current_copy" | "copy" | "online_copy" | "current-offload" | "current_offload" => "current_copy",
            "model" | "external" | "comparator" | "reference" | "ref" => "model",
            "history" | "checkpoint" | "previous" | "previous_iteration" => "history",
            "api" | "http" | "endpoint" => "api",
            _ => return err("comparator_policy must be one of: current, current_copy, model, history, api."),
        }
        .to_string();
        self.comparator_generation_mode = match self.comparator_generation_mode.trim().to_lowercase().as_str() {
            "decentralized" | "decentralised" | "multi_agent" | "multi-agent" => "decentralized",
            "centralized" | "centralised" | "single_agent" | "single-agent" => "centralized",
            _ => return err("comparator_generation_mode must be one of: decentralized, centralized."),
        }
        .to_string();
        if self.collaboration_mode == "centralized" {
            if self.comparator_centralized_agent_index != 0 {
                return err("Centralized collaboration has only actor index 0.");
            }
            self.comparator_generation_mode = "centralized".into();
        }
        if self.comparator_centralized_agent_index < 0 || self.comparator_centralized_agent_index >= self.num_agents {
            return err("comparator_centralized_agent_index must be in [0, num_agents).");
        }
        if self.comparator_num_candidates.is_some_and(|n| n < 1) {
            return err("comparator_num_candidates must be null or >= 1.");
        }
        if self.items_per_round.is_some_and(|n| n < 1) {
            return err("items_per_round must be null or >= 1.");
        }
        if self.comparator_api_max_n_per_request.is_some_and(|n| n < 1) {
            return err("comparator_api_max_n_per_request must be null or >= 1.");
        }
        if !(self.comparator_api_timeout > 0.0 && self.comparator_api_timeout <= MAX_SECONDS) {
            return err("comparator_api_timeout must be a positive number of seconds, at most a week (604800).");
        }
        if !(1..=MAX_API_ATTEMPTS).contains(&self.comparator_api_max_attempts) {
            return err(format!("comparator_api_max_attempts must be in [1, {MAX_API_ATTEMPTS}]."));
        }
        // An HTTP header is a token name and a value of visible characters and spaces: a line
        // break in either would be refused by the client at the first request, after the base
        // evaluation, or worse, split the request.
        let token =
            |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_graphic() && !b"()<>@,;:\\\"/[]?={}".contains(&b));
        let value = |s: &str| s.bytes().all(|b| b == b' ' || b == b'\t' || (b >= 0x21 && b != 0x7f));
        for (k, v) in self.comparator_api_headers.iter().flatten() {
            if !token(k) || !value(v) {
                return err(format!(
                    "comparator_api_headers: `{}` is not a valid HTTP header (a name of visible characters without \
                     separators, a value without line breaks or control characters)",
                    k.escape_debug()
                ));
            }
        }
        if !(token(&self.comparator_api_key_header)) {
            return err("comparator_api_key_header must be an HTTP header name (visible characters, no separators).");
        }
        if !value(&self.comparator_api_key_prefix) {
            return err("comparator_api_key_prefix must not hold line breaks or control characters.");
        }
        self.preference_scoring_reward = match self.preference_scoring_reward.trim().to_lowercase().as_str() {
            "task" | "oracle" | "environment" | "env" => "task",
            "reward_model" | "model" | "learned" => "reward_model",
            _ => return err("preference_scoring_reward must be one of: task, reward_model."),
        }
        .to_string();
        if self.preference_scoring_reward == "reward_model" && self.algorithm != "marlhf" {
            return err(
                "preference_scoring_reward = 'reward_model' needs algorithm = 'marlhf' (MADPO fits no reward model).",
            );
        }
        let has_model = self.comparator_model_name.is_some() || self.comparator_agents.is_some();
        match self.comparator_policy.as_str() {
            "model" => {
                if !has_model {
                    return err("comparator_policy='model' needs comparator_model_name or comparator_agents.");
                }
                if self.comparator_history_k.is_some() {
                    return err("comparator_history_k is only valid when comparator_policy='history'.");
                }
            }
            "history" => {
                let k = *self.comparator_history_k.get_or_insert(1);
                if k < 1 {
                    return err("comparator_history_k must be >= 1.");
                }
                if has_model {
                    return err(
                        "comparator_model_name and comparator_agents are only valid when comparator_policy='model'.",
                    );
                }
            }
            policy => {
                if self.comparator_history_k.is_some() {
                    return err("comparator_history_k is only valid when comparator_policy='history'.");
                }
                if has_model {
                    return err(
                        "comparator_model_name and comparator_agents are only valid when comparator_policy='model'.",
                    );
                }
                if policy == "api" && self.comparator_api_url.is_none() {
                    return err("comparator_policy='api' requires comparator_api_url.");
                }
                if policy == "api" && self.iterative && self.collaboration_mode == "centralized" {
                    return err(
                        "comparator_policy = \"api\" with a centralized actor: choose a model-based comparator_policy",
                    );
                }
            }
        }
        if let Some(a) = &self.comparator_agents {
            if a.len() != self.num_actors() {
                return err(format!(
                    "comparator_agents lists {} models but there are {} actors",
                    a.len(),
                    self.num_actors()
                ));
            }
        }
        if self.comparator_devices.is_some() {
            DeviceSpec::resolve(self.comparator_devices.as_ref(), self.num_actors(), "comparator_devices")?;
        }
        Ok(())
    }
}
