//! The typed configs of the trainers, the comparator and a round's collection, built from the
//! file's flat keys by the stage that runs them (an error names the key). Each holds the smaller
//! configs of the components it drives (`components.rs`), so no function below the stages reads
//! the whole file.
use pbrl_model::SamplingParams;

use super::{
    AgentLora, ApiFormat, BaseDType, ComparatorPolicy, Config, ConfigError, DeviceSpec, EvalConfig, MarlhfBackend,
    OracleConfig, PairSelection, ReplayMode, RewardHeadKind, SessionConfig, SplitConfig, TeamConfig, TurnsConfig,
};

/// Which stored pairs a training reads (`prefs::replay`): the replay mode, the sample of it, the
/// seed of that sample.
#[derive(Debug, Clone)]
pub struct ReplayConfig {
    pub seed: u64,
    pub mode: ReplayMode,
    pub sample_size: Option<usize>,
}

/// What evaluating a team reads: its items, their reward, how the team loads and samples, and
/// the seed of the draws (`evaluation`).
#[derive(Debug, Clone)]
pub struct EvaluationConfig {
    pub split: SplitConfig,
    pub oracle: OracleConfig,
    pub team: TeamConfig,
    pub eval: EvalConfig,
    pub seed: u64,
}

/// What a resume must match (`run::fingerprint`): the config as its table, whether keep-best's
/// keys count, and a reference source whose weights count (MADPO's anchored or KL reference).
#[derive(Debug, Clone)]
pub struct FingerprintConfig {
    pub table: toml::Value,
    pub keep_best: bool,
    pub reference: Option<String>,
}

/// What any training session reads (`train::session`): its own settings, the periodic
/// evaluation's, and its fingerprint's.
#[derive(Debug, Clone)]
pub struct TrainingConfig {
    pub session: SessionConfig,
    pub evaluation: EvaluationConfig,
    pub fingerprint: FingerprintConfig,
}

/// MADPO's (`train::madpo`).
#[derive(Debug, Clone)]
pub struct MadpoConfig {
    pub training: TrainingConfig,
    pub replay: ReplayConfig,
    pub team: TeamConfig,
    /// The team's shape, for errors about rounds of another shape.
    pub team_setup: String,
    pub learning_rate: f64,
    pub beta: f64,
    pub length_normalize: bool,
    /// `madpo_reference`: margins anchored to the reference policy.
    pub anchored: bool,
    /// `madpo_log_kl`: the implied KL from the reference logged.
    pub log_kl: bool,
    /// `reference_model_name`: the reference policy, else the agents as training starts.
    pub reference_model: Option<String>,
    pub pairs_per_update: usize,
    pub score_last_token: bool,
    pub max_new_tokens: Vec<usize>,
    /// The turns of the histories it trains on (`num_turns`).
    pub num_turns: usize,
}

/// The reward model's fit (`train::reward_fit`).
#[derive(Debug, Clone)]
pub struct RewardFitConfig {
    pub training: TrainingConfig,
    pub replay: ReplayConfig,
    pub team_setup: String,
    pub seed: u64,
    pub num_roles: usize,
    /// The backbone's source and device (`reward_model_name`, `reward_model_device`).
    pub source: String,
    pub device: String,
    pub lora: Option<AgentLora>,
    pub freeze_backbone: bool,
    pub frozen_dtype: Option<BaseDType>,
    pub max_length: Option<usize>,
    pub head: RewardHeadKind,
    pub head_hidden: usize,
    pub gradient_checkpointing: bool,
    pub eval_fraction: f64,
    pub learning_rate: f64,
    pub num_train_epochs: u64,
    pub batch_size: usize,
    /// Fresh joint responses per held-out item for `rm/fresh_rank_acc` (< 2: none).
    pub fresh_samples: usize,
}

/// The critics of the actor-critic backends (`train::marlhf::actor_critic`).
#[derive(Debug, Clone)]
pub struct CriticConfig {
    /// `critic_model_name`, else each actor's own source.
    pub model: Option<String>,
    pub devices: Vec<String>,
    pub learning_rate: f64,
    /// A critic's value head width (`critic_value_head_hidden_dim`), and the actors' own value
    /// heads' (`value_head_hidden_dim`).
    pub critic_head_hidden: Option<usize>,
    pub value_head_hidden: Option<usize>,
    /// `critic_type = "q"`.
    pub q_critic: bool,
    pub value_loss_coef: f64,
    pub value_clip_range: Option<f64>,
}

/// MARLHF's RL on the reward model (`train::marlhf`).
#[derive(Debug, Clone)]
pub struct MarlhfConfig {
    pub training: TrainingConfig,
    pub team: TeamConfig,
    pub backend: MarlhfBackend,
    /// `rl_algorithm`, as written (for messages and the report).
    pub algorithm: String,
    pub seed: u64,
    pub num_generations: usize,
    pub rollout_buffer_size: usize,
    pub pairs_per_update: usize,
    pub learning_rate: f64,
    pub num_train_epochs: u64,
    pub advantage_normalization: bool,
    /// `reference_kl_coef` when `reference_kl_enabled`.
    pub reference_kl: Option<f64>,
    pub reward_model_device: String,
    pub frozen_dtype: Option<BaseDType>,
    pub max_new_tokens: Vec<usize>,
    pub sampling: Vec<SamplingParams>,
    pub critic: CriticConfig,
    /// `rl_reward = "task"`: RL on the task reward itself, no reward model.
    pub task_reward: bool,
    /// More than one turn (the discussion's transition and turns).
    pub turns: Option<TurnsConfig>,
    /// `joint_mode = "cross"`: every combination of the agents' completions is a joint action.
    pub cross: bool,
    /// The mean node reward above which a branch ends (`early_termination_threshold`; unset:
    /// the reference's -0.2; `None`: never).
    pub early_termination: Option<f64>,
}

/// The MAGRPO trainer's default `early_termination_threshold` (CoMLRL 1.4.3).
pub const REFERENCE_TERMINATION_THRESHOLD: f64 = -0.2;

/// The comparator API's settings (`sources::api`); the key is read from its variable when the
/// source is built, never stored here.
#[derive(Debug, Clone)]
pub struct ApiConfig {
    pub url: Option<String>,
    pub format: ApiFormat,
    pub model: Option<String>,
    pub max_n_per_request: Option<usize>,
    pub timeout_s: f64,
    pub headers: Vec<(String, String)>,
    /// `comparator_api_key` (discouraged), or the variable `comparator_api_key_env` names.
    pub inline_key: Option<String>,
    pub key_env: Option<String>,
    pub key_header: String,
    pub key_prefix: String,
    pub response_field: Option<String>,
    pub extra_body: Option<serde_json::Map<String, serde_json::Value>>,
    pub max_attempts: u32,
    pub sampling: Vec<SamplingParams>,
    pub role_templates: Vec<String>,
}

/// `iterate`'s comparator (`sources::comparator`).
#[derive(Debug, Clone)]
pub struct ComparatorConfig {
    pub policy: ComparatorPolicy,
    /// `comparator_generation_mode = "centralized"`: the actor that writes every role.
    pub writer: Option<usize>,
    /// `comparator_devices`, else the agents'.
    pub devices: Vec<String>,
    pub agent_devices: Vec<String>,
    pub agent_sources: Vec<String>,
    pub frozen_dtype: Option<BaseDType>,
    pub sampling: Vec<SamplingParams>,
    pub role_templates: Vec<String>,
    pub api: ApiConfig,
}

/// How a round is collected (`rounds`): its candidates, batches and pair selection.
#[derive(Debug, Clone)]
pub struct CollectConfig {
    pub seed: u64,
    /// Joint responses per item of the team, and of the comparator.
    pub candidates: usize,
    pub comparator_candidates: usize,
    pub batch_items: usize,
    pub selection: PairSelection,
    pub pairs_per_sample: Option<usize>,
    pub sampling: Vec<SamplingParams>,
    pub max_new_tokens: Vec<usize>,
    /// The histograms' range (`reward_range`), else each round's own.
    pub reward_range: Option<(f64, f64)>,
    pub log_reward_distribution: bool,
}

/// `iterate`'s comparison round (`rounds::compare`).
#[derive(Debug, Clone)]
pub struct CompareConfig {
    pub collect: CollectConfig,
    pub team: TeamConfig,
    pub oracle: OracleConfig,
    pub comparator: ComparatorConfig,
    /// `preference_scoring_reward = "reward_model"`: the newest reward model scores, on this
    /// device.
    pub score_with_reward_model: bool,
    pub reward_model_device: String,
    pub frozen_dtype: Option<BaseDType>,
}

/// An `iterate` round's training (`train::round`): MADPO, or a reward model's fit then MARLHF.
#[derive(Debug, Clone)]
pub enum RoundTraining {
    Madpo(Box<MadpoConfig>),
    Marlhf { replay: ReplayConfig, fit: Box<RewardFitConfig>, rl: Box<MarlhfConfig> },
}

impl Config {
    pub fn replay(&self) -> ReplayConfig {
        ReplayConfig { seed: self.seed, mode: self.replay_mode(), sample_size: self.replay_sample_size() }
    }

    pub fn evaluation(&self) -> Result<EvaluationConfig, ConfigError> {
        Ok(EvaluationConfig {
            split: self.split(),
            oracle: self.oracle(),
            team: self.team()?,
            eval: self.eval(),
            seed: self.seed,
        })
    }

    pub fn fingerprinted(&self) -> Result<FingerprintConfig, ConfigError> {
        let table = toml::Value::try_from(self).map_err(|e| ConfigError(format!("fingerprinting the config: {e}")))?;
        let reference = self.reference_model_name.clone().filter(|_| self.madpo_reference || self.madpo_log_kl);
        Ok(FingerprintConfig { table, keep_best: self.keep_best, reference })
    }

    pub fn training(&self) -> Result<TrainingConfig, ConfigError> {
        Ok(TrainingConfig {
            session: self.session(),
            evaluation: self.evaluation()?,
            fingerprint: self.fingerprinted()?,
        })
    }

    pub fn madpo(&self) -> Result<MadpoConfig, ConfigError> {
        self.aligned("train-madpo")?;
        Ok(MadpoConfig {
            training: self.training()?,
            replay: self.replay(),
            team: self.team()?,
            team_setup: self.team_setup(),
            learning_rate: self.agent_learning_rate,
            beta: self.dpo_beta,
            length_normalize: self.madpo_length_normalize,
            anchored: self.madpo_reference,
            log_kl: self.madpo_log_kl,
            reference_model: self.reference_model_name.clone(),
            pairs_per_update: self.pairs_per_update(),
            score_last_token: self.score_last_token,
            max_new_tokens: self.max_new_tokens(),
            num_turns: self.num_turns as usize,
        })
    }

    pub fn reward_fit(&self) -> Result<RewardFitConfig, ConfigError> {
        self.single_turn("fit-rm")?;
        let (source, device) = self.reward_model_source()?;
        Ok(RewardFitConfig {
            training: self.training()?,
            replay: self.replay(),
            team_setup: self.team_setup(),
            seed: self.seed,
            num_roles: self.num_agents as usize,
            source,
            device,
            lora: self.reward_lora.clone(),
            freeze_backbone: self.reward_freeze_backbone,
            frozen_dtype: self.frozen_dtype,
            max_length: self.reward_max_length.map(|m| m as usize),
            head: self.reward_head,
            head_hidden: self.reward_head_hidden(),
            gradient_checkpointing: self.gradient_checkpointing,
            eval_fraction: self.reward_eval_fraction,
            learning_rate: self.reward_learning_rate,
            num_train_epochs: self.reward_num_train_epochs as u64,
            batch_size: self.reward_train_batch_size as usize,
            fresh_samples: self.reward_fresh_samples as usize,
        })
    }

    pub fn marlhf(&self) -> Result<MarlhfConfig, ConfigError> {
        self.marlhf_turns()?;
        let n = self.num_actors();
        let agent_devices = DeviceSpec::resolve(self.agent_devices.as_ref(), n, "agent_devices")?;
        let critic_devices = match &self.critic_devices {
            Some(spec) => DeviceSpec::resolve(Some(spec), n, "critic_devices")?,
            None => agent_devices,
        };
        Ok(MarlhfConfig {
            training: self.training()?,
            team: self.team()?,
            backend: self.modes.marlhf,
            algorithm: self.rl_algorithm.clone(),
            seed: self.seed,
            num_generations: self.num_generations as usize,
            rollout_buffer_size: self.rollout_buffer_size as usize,
            pairs_per_update: self.pairs_per_update(),
            learning_rate: self.agent_learning_rate,
            num_train_epochs: self.num_train_epochs as u64,
            advantage_normalization: self.advantage_normalization,
            reference_kl: self.reference_kl_enabled.then_some(self.reference_kl_coef),
            reward_model_device: self.reward_model_source()?.1,
            frozen_dtype: self.frozen_dtype,
            max_new_tokens: self.max_new_tokens(),
            sampling: self.sampling(),
            critic: CriticConfig {
                model: self.critic_model_name.clone(),
                devices: critic_devices,
                learning_rate: self.critic_learning_rate.unwrap_or(self.agent_learning_rate),
                critic_head_hidden: self.critic_value_head_hidden_dim.map(|d| d as usize),
                value_head_hidden: self.value_head_hidden_dim.map(|d| d as usize),
                q_critic: self.modes.q_critic,
                value_loss_coef: self.value_loss_coef,
                value_clip_range: self.value_clip_range,
            },
            task_reward: self.rl_reward == "task",
            turns: self.turns(),
            cross: self.joint_mode == "cross",
            early_termination: match self.early_termination_threshold {
                None => Some(REFERENCE_TERMINATION_THRESHOLD),
                Some(t) => t.value(),
            },
        })
    }

    pub fn round_training(&self) -> Result<RoundTraining, ConfigError> {
        Ok(match self.modes.marlhf_rounds {
            true => RoundTraining::Marlhf {
                replay: self.replay(),
                fit: Box::new(self.reward_fit()?),
                rl: Box::new(self.marlhf()?),
            },
            false => RoundTraining::Madpo(Box::new(self.madpo()?)),
        })
    }

    pub fn api(&self) -> ApiConfig {
        ApiConfig {
            url: self.comparator_api_url.clone(),
            format: self.modes.api_format,
            model: self.comparator_api_model.clone(),
            max_n_per_request: self.comparator_api_max_n_per_request.map(|n| n as usize),
            timeout_s: self.comparator_api_timeout,
            headers: self.comparator_api_headers.clone().unwrap_or_default().into_iter().collect(),
            inline_key: self.comparator_api_key.clone(),
            key_env: self.comparator_api_key_env.clone(),
            key_header: self.comparator_api_key_header.clone(),
            key_prefix: self.comparator_api_key_prefix.clone(),
            response_field: self.comparator_api_response_field.clone(),
            // A TOML table is a JSON object.
            extra_body: self
                .comparator_api_extra_body
                .as_ref()
                .map(|t| serde_json::to_value(t).ok().and_then(|v| v.as_object().cloned()).unwrap_or_default()),
            max_attempts: self.comparator_api_max_attempts as u32,
            sampling: self.sampling(),
            role_templates: self.role_templates(),
        }
    }

    pub fn comparator(&self) -> Result<ComparatorConfig, ConfigError> {
        let n = self.num_actors();
        let agent_devices = DeviceSpec::resolve(self.agent_devices.as_ref(), n, "agent_devices")?;
        let devices = match &self.comparator_devices {
            Some(spec) => DeviceSpec::resolve(Some(spec), n, "comparator_devices")?,
            None => agent_devices.clone(),
        };
        Ok(ComparatorConfig {
            policy: self.modes.comparator.clone(),
            writer: self.modes.comparator_writer,
            devices,
            agent_devices,
            agent_sources: self.agent_sources()?,
            frozen_dtype: self.frozen_dtype,
            sampling: self.sampling(),
            role_templates: self.role_templates(),
            api: self.api(),
        })
    }

    pub fn collect(&self) -> CollectConfig {
        let candidates = self.preference_num_candidates as usize;
        CollectConfig {
            seed: self.seed,
            candidates,
            comparator_candidates: self.comparator_num_candidates.map_or(candidates, |n| n as usize),
            batch_items: self.collect_batch_size as usize,
            selection: self.modes.selection,
            pairs_per_sample: self.preference_pairs_per_sample.map(|k| k as usize),
            sampling: self.sampling(),
            max_new_tokens: self.max_new_tokens(),
            reward_range: self.reward_range.map(|[lo, hi]| (lo, hi)),
            log_reward_distribution: self.log_reward_distribution,
        }
    }

    pub fn compare(&self) -> Result<CompareConfig, ConfigError> {
        self.single_turn("iterate")?;
        Ok(CompareConfig {
            collect: self.collect(),
            team: self.team()?,
            oracle: self.oracle(),
            comparator: self.comparator()?,
            score_with_reward_model: self.modes.score_with_reward_model,
            reward_model_device: self.reward_model_source()?.1,
            frozen_dtype: self.frozen_dtype,
        })
    }
}
