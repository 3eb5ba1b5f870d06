//! The reference's validation rules (CoMLRL `MADPOConfig.__post_init__`), in its order and
//! words, and pbrl's own, applied after every default and override is in place.
use super::RewardHeadKind;
use super::{err, Config, ConfigError, DeviceSpec, EvalSplit};

/// The longest wait any timeout may ask for: a week (a `Duration` holds it; 1e20 s it cannot).
pub(super) const MAX_SECONDS: f64 = 604_800.0;
/// The widest hidden layer of a head (a value or reward head): 65,536 units are already
/// hundreds of MB of weights on a 4k-wide backbone, and a typo (1e11) must not reach an
/// allocation of terabytes.
const MAX_HEAD_WIDTH: i64 = 65_536;
/// Epochs of any training: far more than a run can do; a typo (4294967297) must be refused, not
/// run for ever.
const MAX_EPOCHS: i64 = 100_000;

impl Config {
    /// Reference §2.3 replay rules (aliases normalized), in the reference's order and words.
    fn validate_replay(&mut self) -> Result<(), ConfigError> {
        let mode = match self.preference_replay_mode.trim().to_lowercase().as_str() {
            "current" | "latest" | "new" => "current",
            "nearest_k" | "recent_k" | "last_k" | "k" => "nearest_k",
            "all_history" => "all_history",
            "lambda" | "lambda_decay" | "td_lambda" | "td-lambda" => "lambda_decay",
            _ => return err("preference_replay_mode must be one of: current, nearest_k, all_history, lambda_decay."),
        };
        self.preference_replay_mode = mode.to_string();
        let (k, lambda, size) =
            (self.preference_replay_k, self.preference_replay_lambda, self.preference_replay_sample_size);
        let size_ok = || match size {
            Some(s) if s < 1 => err("preference_replay_sample_size must be null or >= 1."),
            _ => Ok(()),
        };
        let no_lambda = || match lambda {
            Some(_) => err("preference_replay_lambda is only valid when preference_replay_mode='lambda_decay'."),
            None => Ok(()),
        };
        match mode {
            "current" => {
                if k.is_some_and(|k| k != 1) {
                    return err("preference_replay_k must be null or 1 when preference_replay_mode='current'.");
                }
                no_lambda()?;
                if size.is_some() {
                    return err("preference_replay_sample_size is only valid when preference_replay_mode is 'nearest_k', 'all_history', or 'lambda_decay'.");
                }
            }
            "nearest_k" => {
                match k {
                    None => return err("preference_replay_k is required when preference_replay_mode='nearest_k'."),
                    Some(k) if k < 1 => return err("preference_replay_k must be >= 1."),
                    _ => {}
                }
                no_lambda()?;
                size_ok()?;
            }
            "all_history" => {
                if k.is_some() {
                    return err("preference_replay_k is only valid when preference_replay_mode='nearest_k'.");
                }
                no_lambda()?;
                size_ok()?;
            }
            _ => {
                if k.is_some() {
                    return err("preference_replay_k is only valid when preference_replay_mode='nearest_k'.");
                }
                match lambda {
                    None => {
                        return err("preference_replay_lambda is required when preference_replay_mode='lambda_decay'.")
                    }
                    Some(l) if !(0.0..=1.0).contains(&l) => return err("preference_replay_lambda must be in [0, 1]."),
                    _ => {}
                }
                size_ok()?;
            }
        }
        Ok(())
    }

    /// Reference validation (MADPOConfig.__post_init__), in the reference's order, plus pbrl's.
    pub(super) fn normalize_and_validate(&mut self) -> Result<(), ConfigError> {
        if !matches!(self.collaboration_mode.as_str(), "decentralized" | "centralized") {
            return err("collaboration_mode must be 'decentralized' or 'centralized'.");
        }
        if self.num_train_epochs < 1 {
            return err("num_train_epochs must be >= 1.");
        }
        if self.num_train_epochs > MAX_EPOCHS {
            return err(format!("num_train_epochs must be <= {MAX_EPOCHS}."));
        }
        if self.num_agents < 1 {
            return err("num_agents must be >= 1.");
        }
        if self.rollout_buffer_size < 1 {
            return err("rollout_buffer_size must be >= 1.");
        }
        if self.eval_interval < 0 {
            return err("eval_interval must be >= 0.");
        }
        if self.eval_num_samples < 0 {
            return err("eval_num_samples must be >= 0.");
        }
        if self.eval_batch_size < 1 {
            return err("eval_batch_size must be >= 1.");
        }
        if self.eval_samples_per_item < 1 {
            return err("eval_samples_per_item must be >= 1.");
        }
        if self.num_turns < 1 {
            return err("num_turns must be >= 1.");
        }
        if self.logging_steps < 1 {
            return err("logging_steps must be >= 1.");
        }
        if self.train_batch_size.is_some_and(|b| b < 1) {
            return err("train_batch_size must be >= 1.");
        }
        let pt = self.parallel_training.trim().to_lowercase();
        self.parallel_training = if pt == "null" { "none".into() } else { pt };
        if !matches!(self.parallel_training.as_str(), "none" | "mp") {
            return err("parallel_training must be one of: none, mp.");
        }
        if self.parallel_training == "mp" && self.agent_devices.is_none() {
            return err("parallel_training='mp' requires agent_devices.");
        }
        if self.reference_kl_coef < 0.0 {
            return err("reference_kl_coef must be >= 0.");
        }
        if self.preference_num_candidates < 2 {
            return err("preference_num_candidates must be >= 2.");
        }
        if self.preference_pairs_per_sample.is_some_and(|p| p < 1) {
            return err("preference_pairs_per_sample must be null or >= 1.");
        }
        if self.dpo_beta <= 0.0 {
            return err("dpo_beta must be > 0.");
        }
        if self.environment_steps_per_pair < 1 {
            return err("environment_steps_per_pair must be >= 1.");
        }
        self.pair_selection = self.pair_selection.trim().to_lowercase();
        if self.iterative && self.pair_selection == "comparator_reward" {
            // the iterative trainers' own mode (reference §5.2)
        } else if !matches!(self.pair_selection.as_str(), "reward_gap" | "all" | "random") {
            return err(if self.iterative {
                "pair_selection must be one of: reward_gap, all, random, comparator_reward."
            } else {
                "pair_selection must be one of: reward_gap, all, random."
            });
        }
        if self.pair_selection == "all" && self.preference_pairs_per_sample.is_some() {
            return err("preference_pairs_per_sample must be null when pair_selection='all'.");
        }
        if !matches!(self.advantage_mode.as_str(), "mean" | "raw" | "max" | "rloo") {
            return err("advantage_mode must be one of: mean, raw, max, rloo.");
        }
        // pbrl's own rules.
        self.max_new_tokens.resolve(self.num_actors())?;
        if self.temperature < 0.0 {
            return err("temperature must be >= 0 (0 means greedy decoding).");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return err("top_p must be in (0, 1].");
        }
        if self.top_k.is_some_and(|k| k < 1) {
            return err("top_k must be null or >= 1.");
        }
        let n = self.num_agents as usize;
        let f = self.task.formatters.len();
        if f != 1 && f != n {
            return err(format!("task.formatters has {f} templates; give one shared template or one per agent ({n})"));
        }
        if let Some(i) = self.task.formatters.iter().position(|t| t.trim().is_empty()) {
            return err(format!("task.formatters[{i}] is empty: an agent's prompt would be nothing"));
        }
        if let Some(s) = &self.task.system_prompts {
            if s.len() != 1 && s.len() != n {
                return err(format!("task.system_prompts has {} entries; give one or one per agent ({n})", s.len()));
            }
        }
        if let Some(k) =
            self.task.chat_template_kwargs.keys().find(|k| *k == "messages" || *k == "add_generation_prompt")
        {
            return err(format!("task.chat_template_kwargs.{k} is set by pbrl itself; remove it"));
        }
        if !self.reward.scale.is_finite() || !self.reward.shift.is_finite() {
            return err("reward.scale and reward.shift must be finite numbers.");
        }
        if !(self.reward_timeout_s > 0.0 && self.reward_timeout_s <= MAX_SECONDS) {
            return err("reward_timeout_s must be a positive number of seconds, at most a week (604800).");
        }
        if self.agent_learning_rate <= 0.0 {
            return err("agent_learning_rate must be > 0.");
        }
        if self.agent_model.is_some() && self.agents.is_some() {
            return err(
                "agent_model and agents are both set; give one model for all agents or one per agent, not both",
            );
        }
        if self.collect_batch_size < 1 {
            return err("collect_batch_size must be >= 1.");
        }
        if let Some([lo, hi]) = self.reward_range {
            // The histogram's bins are (hi - lo) / bins wide: that width must be a finite number.
            if !(lo < hi && (hi - lo).is_finite()) {
                return err("reward_range must be [min, max] with min < max and max - min finite.");
            }
        }
        if let (Some(key), Some(toml::Value::Array(names))) =
            (&self.comparator_api_key_env, self.reward.params.get("env"))
        {
            if self.reward.kind == "command" && names.iter().any(|n| n.as_str() == Some(key.as_str())) {
                return err(format!(
                    "reward.env names `{key}`, the comparator's API key variable: a reward program never gets it."
                ));
            }
        }
        if self.log_reward_distribution && self.reward_range.is_none() {
            return err("log_reward_distribution needs reward_range = [min, max] (the histogram's range).");
        }
        self.validate_replay()?;
        if self.checkpoint_interval < 0 {
            return err("checkpoint_interval must be >= 0 (0 writes no checkpoints).");
        }
        if self.checkpoint_total_limit.is_some_and(|l| l < 1) {
            return err("checkpoint_total_limit must be null or >= 1.");
        }
        DeviceSpec::resolve(self.agent_devices.as_ref(), self.num_actors(), "agent_devices")?;
        self.validate_reward_model()?;
        self.validate_training_extras()?;
        self.validate_turns()
    }

    /// Reference MARLHFConfig rules (§2.2, its order and words), plus pbrl's held-out share.
    fn validate_reward_model(&mut self) -> Result<(), ConfigError> {
        let algorithm = match self.rl_algorithm.trim().to_lowercase().as_str() {
            "mareforce" => "mareinforce".to_string(),
            a => a.to_string(),
        };
        if !matches!(algorithm.as_str(), "magrpo" | "mareinforce" | "maremax" | "marloo" | "maac" | "iac") {
            return err("rl_algorithm must be one of: magrpo, mareinforce, maremax, marloo, maac, iac.");
        }
        self.rl_algorithm = algorithm;
        let magrpo_family = !matches!(self.rl_algorithm.as_str(), "maac" | "iac");
        if magrpo_family && self.num_generations < 2 {
            return err("num_generations must be >= 2 for MAGRPO-family MARLHF backends.");
        }
        if !magrpo_family && self.num_generations < 1 {
            return err("num_generations must be >= 1.");
        }
        if self.reward_learning_rate <= 0.0 {
            return err("reward_learning_rate must be > 0.");
        }
        if self.reward_num_train_epochs < 1 {
            return err("reward_num_train_epochs must be >= 1.");
        }
        if self.reward_num_train_epochs > MAX_EPOCHS {
            return err(format!("reward_num_train_epochs must be <= {MAX_EPOCHS}."));
        }
        if self.reward_train_batch_size < 1 {
            return err("reward_train_batch_size must be >= 1.");
        }
        if self.reward_max_length.is_some_and(|m| m < 1) {
            return err("reward_max_length must be >= 1 or null.");
        }
        match (self.reward_head, self.reward_head_hidden) {
            (RewardHeadKind::LastToken, Some(_)) => {
                return err("reward_head_hidden sets the hidden layer of reward_head = \"pooled_mlp\"; the last-token head has none.");
            }
            (_, Some(d)) if !(1..=MAX_HEAD_WIDTH).contains(&d) => {
                return err(format!("reward_head_hidden must be in [1, {MAX_HEAD_WIDTH}]."));
            }
            _ => {}
        }
        if !(self.reward_fresh_samples == 0 || (2..=64).contains(&self.reward_fresh_samples)) {
            return err("reward_fresh_samples must be 0 (not measured) or in [2, 64]: an order needs two samples.");
        }
        if !(0.0..1.0).contains(&self.reward_eval_fraction) {
            return err("reward_eval_fraction must be in [0, 1) (0 holds no pairs out).");
        }
        self.validate_critics()?;
        self.validate_iterative()
    }

    /// The actor-critic keys (reference MARLHFConfig, §2.2).
    fn validate_critics(&mut self) -> Result<(), ConfigError> {
        if self.critic_learning_rate.is_some_and(|lr| !(lr > 0.0 && lr.is_finite())) {
            return err("critic_learning_rate must be > 0 or null.");
        }
        self.critic_type = self.critic_type.trim().to_lowercase();
        if !matches!(self.critic_type.as_str(), "v" | "q") {
            return err("critic_type must be one of: v, q.");
        }
        if !(self.value_loss_coef > 0.0 && self.value_loss_coef.is_finite()) {
            return err("value_loss_coef must be > 0.");
        }
        if self.value_clip_range.is_some_and(|c| !(c > 0.0 && c.is_finite())) {
            return err("value_clip_range must be > 0 or null.");
        }
        for (key, dim) in [
            ("critic_value_head_hidden_dim", self.critic_value_head_hidden_dim),
            ("value_head_hidden_dim", self.value_head_hidden_dim),
        ] {
            if dim.is_some_and(|d| !(1..=MAX_HEAD_WIDTH).contains(&d)) {
                return err(format!("{key} must be in [1, {MAX_HEAD_WIDTH}] or null (null: no hidden layer)."));
            }
        }
        if self.critic_devices.is_some() {
            DeviceSpec::resolve(self.critic_devices.as_ref(), self.num_actors(), "critic_devices")?;
        }
        Ok(())
    }

    /// pbrl's anchored MADPO and keep-best rules.
    fn validate_training_extras(&self) -> Result<(), ConfigError> {
        if let Some(lora) = &self.agent_lora {
            lora.validate(self.num_actors(), "agent_lora")?;
        }
        if let Some(lora) = &self.reward_lora {
            if lora.per_agent() {
                return err("reward_lora takes one value per key: the reward model has one backbone");
            }
            lora.validate(1, "reward_lora")?;
            if self.reward_freeze_backbone {
                return err(
                    "reward_lora trains adapters on the reward model's backbone, which reward_freeze_backbone \
                            = true freezes: set one of them",
                );
            }
            if lora.save_merged {
                return err("reward_lora.save_merged: a reward model is always saved merged into its backbone");
            }
        }
        if self.reference_model_name.is_some() && !self.madpo_reference && !self.madpo_log_kl {
            return err(
                "reference_model_name is set but unused: it is anchored MADPO's reference (set madpo_reference \
                        = true, or madpo_log_kl = true to only log the KL against it)",
            );
        }
        if self.reference_model_name.is_some() {
            DeviceSpec::resolve(self.reference_devices.as_ref(), self.num_actors(), "reference_devices")?;
        }
        if matches!(self.eval_split, EvalSplit::TrainShare(x) if !(x > 0.0 && x < 1.0)) {
            return err(
                "eval_split must be \"eval_file\", \"validation_file\" or a share of the train items in (0, 1).",
            );
        }
        if self.eval_split == EvalSplit::ValidationFile && self.task.validation_file.is_none() {
            return err("eval_split = \"validation_file\" needs task.validation_file (a JSONL of items)");
        }
        if !(self.keep_best_tolerance >= 0.0 && self.keep_best_tolerance.is_finite()) {
            return err("keep_best_tolerance must be a number >= 0 (standard errors of the best evaluation).");
        }
        if self.keep_best_tolerance > 0.0 && !self.keep_best {
            return err("keep_best_tolerance is set but keep_best is false: it only decides what keep_best saves");
        }
        if self.keep_best && (self.eval_interval == 0 || self.eval_num_samples == 0) {
            return err("keep_best needs periodic evaluations: set eval_interval >= 1 and eval_num_samples >= 1");
        }
        Ok(())
    }
}
