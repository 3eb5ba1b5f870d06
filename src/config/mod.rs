//! The typed configuration: a TOML file with the reference's flat field names and defaults,
//! `[task]` and `[reward]` tables, and `KEY=VALUE` overrides from the command line.
//!
//! Every mistake is reported as one line naming the file, the key and (for syntax errors and
//! unknown keys) the line: a [`ConfigError`].
//!
//! `mod.rs` is the file format (one flat serde struct, so unknown keys keep failing), with its
//! `[task]` and `[reward]` tables in `tables.rs` and its defaults in `defaults.rs`;
//! `modes.rs` the modes keys select, as types; `values.rs` the values a key may take in more than one form; `views.rs` the typed views
//! stages take; `components.rs` and `trainers.rs` the typed configs components take; `rules.rs` the reference-order validation (`iterative_rules.rs` the iterate
//! keys'); `overrides.rs` the command line's
//! `KEY=VALUE` and the one-line error messages.
use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer, Serialize};

mod components;
mod defaults;
mod iterative_rules;
mod modes;
mod overrides;
pub mod reference;
mod rules;
mod tables;
#[cfg(test)]
mod tests;
mod trainers;
mod turn_rules;
mod values;
mod views;

pub use components::{
    EvalConfig, OracleConfig, SessionConfig, SplitConfig, TeamConfig, TransitionSpec, TurnsConfig,
    DEFAULT_DEBATE_TEMPLATE,
};
pub use modes::{
    AdvantageMode, ApiFormat, ComparatorPolicy, HistoryReward, LrSchedule, MarlhfBackend, Modes, PairSelection,
    ReplayMode, RewardHeadKind,
};
pub use overrides::{closest, Override};
pub use tables::{
    AgentLora, BaseDType, ComputeDType, Modules, RewardConfig, TaskConfig, TransitionConfig, LORA_PROJECTIONS,
};
pub use trainers::{
    ApiConfig, CollectConfig, ComparatorConfig, CompareConfig, CriticConfig, EvaluationConfig, FingerprintConfig,
    MadpoConfig, MarlhfConfig, ReplayConfig, RewardFitConfig, RoundTraining, TrainingConfig,
    REFERENCE_TERMINATION_THRESHOLD,
};
pub use values::{DeviceSpec, EvalSplit, PerActor, Threshold, TokenLimit};

/// The pooled reward head's hidden layer width when `reward_head_hidden` is not set.
pub const DEFAULT_REWARD_HEAD_HIDDEN: usize = 32;
use overrides::{describe_de_error, line_of, reject_non_finite};

/// A user mistake in the configuration. Printed as one line; exit code 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

pub(crate) fn err<T>(msg: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError(msg.into()))
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

/// `Option` fields accept the TOML-less `"none"`/`"null"` string, since TOML has no null.
fn opt<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OrNone<T> {
        Value(T),
        Word(String),
    }
    match OrNone::<T>::deserialize(d)? {
        OrNone::Value(v) => Ok(Some(v)),
        OrNone::Word(w) if matches!(w.to_lowercase().as_str(), "none" | "null" | "") => Ok(None),
        OrNone::Word(w) => {
            Err(serde::de::Error::custom(format!("invalid value `{w}` (use a value of the right type, or \"none\")")))
        }
    }
}

/// The whole configuration. Flat fields carry the reference's names and defaults (MADPOConfig).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    // --- pbrl's own keys --------------------------------------------------------------------
    /// Every output of every stage goes under it (`--run-dir` overrides it).
    pub run_dir: PathBuf,
    /// Every random stream derives from it: the same config and seed give the same samples, pairs and
    /// agents on the same device.
    pub seed: u64,
    /// One model source for every agent (GGUF file, HF directory or hub id) ...
    pub agent_model: Option<String>,
    /// ... or one per agent (heterogeneous teams).
    pub agents: Option<Vec<String>>,
    /// LoRA agents: `[agent_lora]` below (absent: full fine-tuning).
    pub agent_lora: Option<AgentLora>,
    /// Score the last completion token in the decentralized scorer (the reference drops it).
    pub score_last_token: bool,
    /// Seconds to wait for a `kind = "command"` reward program's answer.
    pub reward_timeout_s: f64,
    /// Task items per sampling batch during collection (each brings all its candidates).
    pub collect_batch_size: i64,
    /// Joint responses sampled per held-out item in an evaluation (the reference samples one);
    /// more make `eval/turn_1/reward_mean` less noisy.
    pub eval_samples_per_item: i64,
    /// [min, max] of the oracle's raw rewards, for `log_reward_distribution`.
    pub reward_range: Option<[f64; 2]>,
    /// Write per-round reward histograms to `<run_dir>/reward_distributions/`.
    pub log_reward_distribution: bool,
    /// Where round files go (default `<run_dir>/preference_replay`).
    pub preference_replay_dir: Option<PathBuf>,
    /// Which stored rounds a training phase sees (reference §9; aliases accepted): "current" (the
    /// newest round), "nearest_k", "all_history" or "lambda_decay" (a sample of the rounds).
    pub preference_replay_mode: String,
    /// `nearest_k`: how many of the newest rounds training sees.
    #[serde(deserialize_with = "opt")]
    pub preference_replay_k: Option<i64>,
    /// `lambda_decay`: a round `a` rounds back (0: the newest) weighs lambda^a, normalized.
    #[serde(deserialize_with = "opt")]
    pub preference_replay_lambda: Option<f64>,
    /// Pairs in a sample of the selected rounds (default: as many as the newest round holds).
    #[serde(deserialize_with = "opt")]
    pub preference_replay_sample_size: Option<i64>,
    /// Write a resumable checkpoint every this many epochs (0: none).
    pub checkpoint_interval: i64,
    /// Keep at most this many checkpoints (the newest).
    #[serde(deserialize_with = "opt")]
    pub checkpoint_total_limit: Option<i64>,
    /// Anchored MADPO: each agent's margin is taken relative to a frozen reference policy, as in
    /// standard DPO (off: the reference's reference-free loss, exactly).
    pub madpo_reference: bool,
    /// The reference policy of anchored MADPO (one source for every actor); default: the agents
    /// as they are when training starts.
    #[serde(deserialize_with = "opt")]
    pub reference_model_name: Option<String>,
    /// MADPO margins from mean instead of summed token log-probs.
    pub madpo_length_normalize: bool,
    /// Compute the start policy's log-probs without `madpo_reference` too, to log the implied KL
    /// from the start (one forward pass per pair).
    pub madpo_log_kl: bool,
    /// Where the periodic evaluations during training take their items: "eval_file" (the task's
    /// eval file), "validation_file" (`task.validation_file`) or a share of the train items,
    /// held out from collection and training.
    pub eval_split: EvalSplit,
    /// Save the agents of the best periodic evaluation instead of the last ones.
    pub keep_best: bool,
    /// With `keep_best`: the best evaluation's agents replace the last ones only when the last
    /// evaluation is below the best by more than this many of the best's standard errors (0: the
    /// best whenever it beats the last at all). Several evaluations on one plateau differ by
    /// noise, and the highest of them is the luckiest, not the best trained.
    #[serde(skip_serializing_if = "is_zero")]
    pub keep_best_tolerance: f64,
    /// The learning rate over a training's updates: "constant" (the reference's) or "linear"
    /// (decaying to 1/U of it at the last of U updates), for every training stage.
    #[serde(skip_serializing_if = "LrSchedule::is_constant")]
    pub lr_scheduler_type: LrSchedule,
    /// Activation checkpointing when the agents, their critics or the reward model train: each
    /// decoder layer keeps its input only and is recomputed in the backward pass (transformers'
    /// `gradient_checkpointing`): less memory for about one more forward pass; the same
    /// gradients up to the order of their sums.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub gradient_checkpointing: bool,
    /// Share of the selected pairs `fit-rm` holds out to report the reward model's accuracy
    /// on pairs it was not fitted on (0: none).
    pub reward_eval_fraction: f64,
    /// Fresh joint responses the current team samples per held-out item after `fit-rm` (the
    /// held-out pairs' items and those `eval_split` holds out of collection), to measure how
    /// well the reward model orders samples of one prompt (`rm/fresh_rank_acc`, what MAGRPO's
    /// advantages read); 2 to 64, or 0: not measured.
    pub reward_fresh_samples: i64,

    // --- reference MADPOConfig fields -------------------------------------------------------
    /// Epochs over the pairs (MADPO), over the train items (MARLHF's RL), per round in `iterate`.
    pub num_train_epochs: i64,
    /// AdamW's learning rate of the agents (PyTorch defaults otherwise).
    pub agent_learning_rate: f64,
    /// Validated as the reference does (>= 1); pbrl logs every update.
    pub logging_steps: i64,
    /// Agents in the team; with a centralized actor, the number of roles it writes.
    pub num_agents: i64,
    /// "decentralized" (one actor per role) or "centralized" (one actor writes every role in one tagged
    /// reply).
    pub collaboration_mode: String,
    /// "none" or "mp" (needs `agent_devices`), validated as the reference does; the agents train in
    /// turn either way, with the same results.
    pub parallel_training: String,
    /// "cpu", "cuda:N" (build with `--features cuda`), or a list with one device per actor; default
    /// "cpu".
    pub agent_devices: Option<DeviceSpec>,
    /// Tokens each actor may generate per answer: one number, or a list with one per actor.
    pub max_new_tokens: TokenLimit,
    /// Sampling temperature; 0 samples greedily.
    pub temperature: f64,
    /// Nucleus sampling: the smallest set of tokens whose probability reaches it.
    pub top_p: f64,
    /// Sample among the k most likely tokens ("none": no limit).
    #[serde(deserialize_with = "opt")]
    pub top_k: Option<i64>,
    /// Turns of the discussion: at each turn after the first every agent reads the others'
    /// answers (through `[transition]`) and answers again. Above 1: `collect`, `train-madpo`,
    /// `train-marlhf` with the MAGRPO family, and `eval`; the other stages refuse it.
    pub num_turns: i64,
    /// Must be 1: the returns are undiscounted sums over the turns, as CoMLRL 1.4.3's trainers
    /// compute them whatever this key says.
    pub discount: f64,
    /// How the agents' completions make joint actions: "aligned" (completion k of every agent is
    /// joint action k) or, for `train-marlhf`'s MAGRPO family, "cross" (every combination:
    /// K^num_agents joint actions per node, each completion's return the sum over those it
    /// takes part in).
    pub joint_mode: String,
    /// Multi-turn RL: a branch whose node's mean reward exceeds it is not expanded further
    /// ("none": never). Unset, the reference's -0.2, which ends at turn 1 every branch of a
    /// reward that is never negative: pbrl warns when it does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub early_termination_threshold: Option<Threshold>,
    /// What the transition writes is each agent's whole prompt (before its chat template),
    /// instead of standing in the item's `prompt` under the agent's `task.formatters` template.
    pub external_prompt_passthrough: bool,
    /// A multi-turn joint history's score where one number stands for it (preferences, the
    /// evaluation's reward): "last" (its last turn's reward, the default: a discussion is worth
    /// what it concludes) or "sum" (over its turns).
    #[serde(skip_serializing_if = "defaults::is_last")]
    pub history_reward: String,
    /// What `train-marlhf` maximizes: "reward_model" (the joint reward model `fit-rm` fitted:
    /// MARLHF) or "task" (the task reward itself, as CoMLRL's MAGRPOTrainer does: the baseline a
    /// preference-trained team is compared with; no reward model needed).
    #[serde(skip_serializing_if = "defaults::is_reward_model")]
    pub rl_reward: String,
    /// Evaluate during training every this many updates (0: only at the end).
    pub eval_interval: i64,
    /// Eval items an evaluation uses, from the eval file or the held-out share (0: no evaluation).
    pub eval_num_samples: i64,
    /// Eval items per sampling batch.
    pub eval_batch_size: i64,
    /// `train-marlhf`: items (MAGRPO family) or samples (actor-critic) per rollout buffer; also the
    /// default `train_batch_size`.
    pub rollout_buffer_size: i64,
    /// MADPO: pairs per update; MARLHF: items (or samples) per update; default `rollout_buffer_size`.
    #[serde(deserialize_with = "opt")]
    pub train_batch_size: Option<i64>,
    /// `train-marlhf`: normalize each item's advantages (MAGRPO family) or each buffer's (actor-
    /// critic).
    pub advantage_normalization: bool,
    /// The MAGRPO baseline (mean, raw, max, rloo); `rl_algorithm` sets it in `train-marlhf`.
    pub advantage_mode: String,
    /// `train-marlhf`: subtract `reference_kl_coef` times each completion's k3 KL from its frozen
    /// reference from the reward (MADPO ignores it, as the reference does).
    pub reference_kl_enabled: bool,
    /// The weight of the reference KL in `train-marlhf`'s returns.
    pub reference_kl_coef: f64,
    /// Where the frozen references live (default: the actors' devices).
    pub reference_devices: Option<DeviceSpec>,
    /// How roles that only read weights store them when pbrl loads them from a model source:
    /// anchored MADPO's `reference_model_name`, `train-marlhf`'s KL reference, `iterate`'s
    /// comparators loaded from weights (`model`, `history`, `current_copy` on other devices) and
    /// the reward model's backbone where it is only read (`fit-rm` with
    /// `reward_freeze_backbone`, which still saves it as on disk; scoring in `train-marlhf` and
    /// `iterate`). "f32" (exact; the default), "bf16" or "q8_0", stored and read as
    /// `agent_lora.base_dtype` says. A role served over a LoRA agent's base in memory keeps that
    /// base's storage.
    pub frozen_dtype: Option<BaseDType>,
    /// Joint responses sampled per train item when collecting (>= 2).
    pub preference_num_candidates: i64,
    /// Pairs kept per item, in `pair_selection` order ("none": all; must be "none" with `pair_selection
    /// = "all"`).
    #[serde(deserialize_with = "opt")]
    pub preference_pairs_per_sample: Option<i64>,
    /// Which candidate pairs become preference pairs: "reward_gap" (largest gap first), "all", "random"
    /// (seeded), and in `iterate` "comparator_reward" (the comparator's best candidates first).
    pub pair_selection: String,
    /// MADPO's beta: the scale of the margins in the loss (> 0; validated for MARLHF too, which does
    /// not use it).
    pub dpo_beta: f64,
    /// Accepted for compatibility: the reference's step counter, which changes no computation.
    pub use_environment_step: bool,
    /// Accepted for compatibility (>= 1): the reference's step counter, which changes no computation.
    pub environment_steps_per_pair: i64,

    // --- reference MARLHFConfig fields --------------------------------------------------------
    /// The policy-learning backend of `train-marlhf`; the MAGRPO family sets `advantage_mode`
    /// (magrpo: mean, mareinforce: raw, maremax: max, marloo: rloo).
    pub rl_algorithm: String,
    /// Samples per agent per item in `train-marlhf`'s rollouts.
    pub num_generations: i64,
    /// The reward model's backbone (any model source); default: the first actor's source.
    #[serde(deserialize_with = "opt")]
    pub reward_model_name: Option<String>,
    /// Default: the first actor's device (the reference defaults to "cuda:0").
    #[serde(deserialize_with = "opt")]
    pub reward_model_device: Option<String>,
    /// `fit-rm`: AdamW's learning rate (weight decay 0.01).
    pub reward_learning_rate: f64,
    /// `fit-rm`: epochs over the fitted pairs.
    pub reward_num_train_epochs: i64,
    /// `fit-rm`: pairs per update.
    pub reward_train_batch_size: i64,
    /// Tokens kept of a joint text; default: the backbone's context.
    #[serde(deserialize_with = "opt")]
    pub reward_max_length: Option<i64>,
    /// `fit-rm`: train the head only (the backbone's hidden states are computed once).
    pub reward_freeze_backbone: bool,
    /// `fit-rm`: LoRA on the reward model's backbone, a `[reward_lora]` table with
    /// `[agent_lora]`'s keys (one value each): the backbone frozen (stored as its `base_dtype`
    /// says), adapters and the head trained, the fitted model saved with the adapters merged
    /// into its backbone (a whole Hugging Face directory, as every reward model). Absent: the
    /// whole backbone trains, or none of it (`reward_freeze_backbone`).
    pub reward_lora: Option<AgentLora>,
    /// The reward model's head: "last_token" (the reference's) or "pooled_mlp" (each agent's
    /// response pooled, an MLP; `reward_model.rs`).
    #[serde(skip_serializing_if = "RewardHeadKind::is_last_token")]
    pub reward_head: RewardHeadKind,
    /// The pooled head's hidden layer width; default [`DEFAULT_REWARD_HEAD_HIDDEN`].
    #[serde(deserialize_with = "opt", skip_serializing_if = "Option::is_none")]
    pub reward_head_hidden: Option<i64>,
    /// The critics' backbone of `maac` / `iac` (any model source); default: each agent's own
    /// source (`maac`: the first agent's).
    #[serde(deserialize_with = "opt")]
    pub critic_model_name: Option<String>,
    /// Default: `agent_learning_rate`.
    #[serde(deserialize_with = "opt")]
    pub critic_learning_rate: Option<f64>,
    /// Default: the actors' devices (`maac`'s one critic: the first actor's).
    pub critic_devices: Option<DeviceSpec>,
    /// `iac`: a critic model per agent (true) or a value head on each actor (false).
    pub use_separate_critic: bool,
    /// "v": the value of the prompt; "q": of the prompt and the response.
    pub critic_type: String,
    /// Actor-critic backends: the weight of the value loss in the critic's step.
    pub value_loss_coef: f64,
    /// `iac` with a shared head only (the reference uses it nowhere else).
    #[serde(deserialize_with = "opt")]
    pub value_clip_range: Option<f64>,
    /// Hidden width of the separate critics' value heads (a Linear + Tanh before the output).
    #[serde(deserialize_with = "opt")]
    pub critic_value_head_hidden_dim: Option<i64>,
    /// Hidden width of `iac`'s shared value head.
    #[serde(deserialize_with = "opt")]
    pub value_head_hidden_dim: Option<i64>,

    // --- iterative training (`pbrl iterate`, reference _IterativePreferenceConfig) -----------
    /// Set by `Config::load_iterative`: the reference's iterative defaults applied and
    /// `pair_selection = "comparator_reward"` allowed.
    #[serde(skip)]
    pub iterative: bool,
    /// The modes the string keys select, as types: set when the config loads, after its rules
    /// passed (`modes.rs`).
    #[serde(skip)]
    pub modes: Modes,
    /// `iterate`: rounds of comparison and training (a resumed run may raise it).
    pub num_iterations: i64,
    /// What each round trains: "madpo" (pbrl's; the reference has one class per algorithm).
    pub algorithm: String,
    /// `iterate`: who the team is compared with: "current", "current_copy", "model", "history" or
    /// "api".
    pub comparator_policy: String,
    /// `iterate`: the comparator's joint responses per item (default `preference_num_candidates`).
    #[serde(deserialize_with = "opt")]
    pub comparator_num_candidates: Option<i64>,
    /// `history`: compare with the team this many rounds back (the base models before there is one).
    #[serde(deserialize_with = "opt")]
    pub comparator_history_k: Option<i64>,
    /// `iterate`: the train items each round compares on (pbrl's; default all, the reference's):
    /// the next this many of one seeded shuffle of the train items, wrapping around, so the
    /// rounds take disjoint items until every item has had a turn.
    #[serde(deserialize_with = "opt")]
    pub items_per_round: Option<i64>,
    /// `model`: one model source for every comparator role.
    #[serde(deserialize_with = "opt")]
    pub comparator_model_name: Option<String>,
    /// `model`: one model source per comparator role.
    #[serde(deserialize_with = "opt")]
    pub comparator_agents: Option<Vec<String>>,
    /// Where a loaded comparator lives (default: the agents' devices).
    pub comparator_devices: Option<DeviceSpec>,
    /// "decentralized", or "centralized": one comparator actor (or one API call) writes every role in
    /// the reference's tagged prompt.
    pub comparator_generation_mode: String,
    /// The comparator actor that writes every role in the centralized mode.
    pub comparator_centralized_agent_index: i64,
    /// `api`: the endpoint.
    #[serde(deserialize_with = "opt")]
    pub comparator_api_url: Option<String>,
    /// `api`: the request format: "generic", "openai" (chat completions), "anthropic" (messages) or
    /// "openai_responses".
    pub comparator_api_format: String,
    /// `api`: the model name sent with each request.
    #[serde(deserialize_with = "opt")]
    pub comparator_api_model: Option<String>,
    /// `api` (openai): completions asked per request (default: all; DeepSeek endpoints: 1).
    #[serde(deserialize_with = "opt")]
    pub comparator_api_max_n_per_request: Option<i64>,
    /// `api`: seconds per HTTP request (at most a week).
    pub comparator_api_timeout: f64,
    /// `api`: extra request headers (a table).
    #[serde(deserialize_with = "opt")]
    pub comparator_api_headers: Option<std::collections::BTreeMap<String, String>>,
    /// Discouraged (use `comparator_api_key_env`); never written back (saved configs, logs).
    #[serde(deserialize_with = "opt", skip_serializing)]
    pub comparator_api_key: Option<String>,
    /// `api`: the environment variable that holds the key (the key never reaches a file or a log).
    #[serde(deserialize_with = "opt")]
    pub comparator_api_key_env: Option<String>,
    /// `api`: the header that carries the key.
    pub comparator_api_key_header: String,
    /// `api`: written before the key in its header.
    pub comparator_api_key_prefix: String,
    /// `api` (generic): the dotted path of the completions in the answer.
    #[serde(deserialize_with = "opt")]
    pub comparator_api_response_field: Option<String>,
    /// `api`: a table merged into every request's body last.
    #[serde(deserialize_with = "opt")]
    pub comparator_api_extra_body: Option<toml::Table>,
    /// pbrl's own: tries per API request (the reference tries once).
    pub comparator_api_max_attempts: i64,
    /// MARLHF rounds: compare with the task reward, or with the newest fitted reward model
    /// ("reward_model"; the task reward until one exists).
    pub preference_scoring_reward: String,

    /// The task: `[task]` below.
    pub task: TaskConfig,
    /// The task reward: `[reward]` below.
    pub reward: RewardConfig,
    /// The transition between turns (`num_turns` > 1): `[transition]` below.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transition: Option<TransitionConfig>,
}

impl Config {
    /// Read a config file, apply the overrides, fill defaults, normalize and validate.
    pub fn load(path: &Path, overrides: &[Override]) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError(format!("cannot read config {}: {e}", path.display())))?;
        Self::from_toml_str(&text, &path.display().to_string(), overrides)
    }

    /// Read a config for `pbrl iterate`: the reference's iterative defaults
    /// (MADPOIterConfig: `num_train_epochs` 1, `preference_num_candidates` 20,
    /// `preference_pairs_per_sample` 4, `pair_selection` "comparator_reward"; MARLHFIterConfig:
    /// `num_train_epochs` 2 and `reward_num_train_epochs` 2) for the keys the file and the
    /// overrides leave unset.
    pub fn load_iterative(path: &Path, overrides: &[Override]) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError(format!("cannot read config {}: {e}", path.display())))?;
        Self::parse(&text, &path.display().to_string(), overrides, true)
    }

    /// `origin` names the file in messages.
    pub fn from_toml_str(text: &str, origin: &str, overrides: &[Override]) -> Result<Self, ConfigError> {
        Self::parse(text, origin, overrides, false)
    }

    fn parse(text: &str, origin: &str, overrides: &[Override], iterative: bool) -> Result<Self, ConfigError> {
        let mut table: toml::Table = toml::from_str(text).map_err(|e| {
            let line = e.span().map(|s| format!(" line {}", line_of(text, s.start))).unwrap_or_default();
            ConfigError(format!("{origin}{line}: {}", e.message()))
        })?;
        for o in overrides {
            o.apply(&mut table)?;
        }
        if iterative {
            // MARLHFIterConfig's: 2 RL epochs and 2 reward-model epochs.
            let marlhf = table
                .get("algorithm")
                .and_then(|a| a.as_str())
                .is_some_and(|a| a.trim().eq_ignore_ascii_case("marlhf"));
            for (key, value) in defaults::iterative_defaults(marlhf) {
                table.entry(key).or_insert(value);
            }
        }
        reject_non_finite("", &table, text, origin, overrides)?;
        let mut cfg: Config = serde_path_to_error::deserialize(toml::Value::Table(table))
            .map_err(|e| describe_de_error(&e, text, origin, overrides))?;
        cfg.iterative = iterative;
        cfg.normalize_and_validate().and_then(|()| Modes::of(&cfg)).map(|modes| cfg.modes = modes).map_err(|e| {
            // Blame the command line when the message is about a key an override set: the key
            // the message names first is its subject (others may be named as allowed values).
            let named_at = |o: &&Override| {
                let leaf = o.key.rsplit('.').next().unwrap_or("");
                e.0.find(&o.key).or_else(|| e.0.find(leaf).filter(|_| !leaf.is_empty()))
            };
            let from = overrides.iter().filter(|o| named_at(o).is_some()).min_by_key(|o| named_at(o));
            match from {
                Some(o) => ConfigError(format!("command-line override `{}={}`: {}", o.key, o.value, e.0)),
                None => ConfigError(format!("{origin}: {}", e.0)),
            }
        })?;
        Ok(cfg)
    }

    /// The resolved configuration as TOML (all defaults filled in).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("config serializes")
    }
}
