//! The defaults of every flat key: the reference's (MADPOConfig, MARLHFConfig and the
//! iterative configs' fields), and pbrl's own.
use std::path::PathBuf;

use super::{Config, EvalSplit, LrSchedule, Modes, RewardConfig, RewardHeadKind, TaskConfig, TokenLimit};

impl Default for Config {
    fn default() -> Self {
        Self {
            run_dir: PathBuf::from("runs/default"),
            seed: 42,
            agent_model: None,
            agents: None,
            score_last_token: false,
            reward_timeout_s: 60.0,
            collect_batch_size: 1,
            eval_samples_per_item: 1,
            reward_range: None,
            log_reward_distribution: false,
            preference_replay_dir: None,
            preference_replay_mode: "current".into(),
            preference_replay_k: None,
            preference_replay_lambda: None,
            preference_replay_sample_size: None,
            checkpoint_interval: 0,
            checkpoint_total_limit: None,
            madpo_reference: false,
            reference_model_name: None,
            madpo_length_normalize: false,
            madpo_log_kl: false,
            eval_split: EvalSplit::EvalFile,
            keep_best: false,
            keep_best_tolerance: 0.0,
            lr_scheduler_type: LrSchedule::Constant,
            gradient_checkpointing: false,
            reward_eval_fraction: 0.1,
            reward_fresh_samples: 4,
            num_train_epochs: 20,
            agent_learning_rate: 5e-6,
            logging_steps: 50,
            num_agents: 2,
            collaboration_mode: "decentralized".into(),
            parallel_training: "none".into(),
            agent_devices: None,
            agent_lora: None,
            max_new_tokens: TokenLimit::One(256),
            temperature: 0.6,
            top_p: 0.6,
            top_k: Some(50),
            num_turns: 1,
            discount: 1.0,
            joint_mode: "aligned".into(),
            early_termination_threshold: None,
            external_prompt_passthrough: false,
            history_reward: "last".into(),
            rl_reward: "reward_model".into(),
            eval_interval: 16,
            eval_num_samples: 4,
            eval_batch_size: 1,
            rollout_buffer_size: 2,
            train_batch_size: None,
            advantage_normalization: true,
            advantage_mode: "mean".into(),
            reference_kl_enabled: false,
            reference_kl_coef: 0.1,
            reference_devices: None,
            frozen_dtype: None,
            preference_num_candidates: 80,
            preference_pairs_per_sample: Some(16),
            pair_selection: "reward_gap".into(),
            dpo_beta: 0.1,
            use_environment_step: true,
            environment_steps_per_pair: 2,
            rl_algorithm: "magrpo".into(),
            num_generations: 4,
            reward_model_name: None,
            reward_model_device: None,
            reward_learning_rate: 1e-5,
            reward_num_train_epochs: 1,
            reward_train_batch_size: 1,
            reward_max_length: None,
            reward_freeze_backbone: false,
            reward_lora: None,
            reward_head: RewardHeadKind::LastToken,
            reward_head_hidden: None,
            critic_model_name: None,
            critic_learning_rate: None,
            critic_devices: None,
            use_separate_critic: true,
            critic_type: "v".into(),
            value_loss_coef: 0.6,
            value_clip_range: Some(0.2),
            critic_value_head_hidden_dim: None,
            value_head_hidden_dim: None,
            iterative: false,
            modes: Modes::default(),
            num_iterations: 6,
            algorithm: "madpo".into(),
            comparator_policy: "current".into(),
            comparator_num_candidates: None,
            comparator_history_k: None,
            items_per_round: None,
            comparator_model_name: None,
            comparator_agents: None,
            comparator_devices: None,
            comparator_generation_mode: "decentralized".into(),
            comparator_centralized_agent_index: 0,
            comparator_api_url: None,
            comparator_api_format: "generic".into(),
            comparator_api_model: None,
            comparator_api_max_n_per_request: None,
            comparator_api_timeout: 120.0,
            comparator_api_headers: None,
            comparator_api_key: None,
            comparator_api_key_env: None,
            comparator_api_key_header: "Authorization".into(),
            comparator_api_key_prefix: "Bearer".into(),
            comparator_api_response_field: Some("completions".into()),
            comparator_api_extra_body: None,
            comparator_api_max_attempts: 5,
            preference_scoring_reward: "task".into(),
            task: TaskConfig::default(),
            reward: RewardConfig::default(),
            transition: None,
        }
    }
}

/// The reference's iterative defaults (MADPOIterConfig; MARLHFIterConfig's with `marlhf`), which
/// `pbrl iterate` takes for the keys its config leaves unset.
pub(super) fn iterative_defaults(marlhf: bool) -> Vec<(&'static str, toml::Value)> {
    let mut keys = vec![
        ("num_train_epochs", toml::Value::Integer(if marlhf { 2 } else { 1 })),
        ("preference_num_candidates", toml::Value::Integer(20)),
        ("preference_pairs_per_sample", toml::Value::Integer(4)),
        ("pair_selection", toml::Value::String("comparator_reward".into())),
    ];
    if marlhf {
        keys.push(("reward_num_train_epochs", toml::Value::Integer(2)));
    }
    keys
}

pub(super) fn is_last(s: &str) -> bool {
    s == "last"
}

pub(super) fn is_reward_model(s: &str) -> bool {
    s == "reward_model"
}
