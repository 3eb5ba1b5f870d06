//! The typed configuration: a TOML file with the reference's flat field names and defaults,
//! `[task]` and `[reward]` tables, and `KEY=VALUE` overrides from the command line.
//!
//! Every mistake is reported as one line naming the file, the key and (for syntax errors and
//! unknown keys) the line: a [`ConfigError`].
use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer, Serialize};

/// A user mistake in the configuration. Printed as one line; exit code 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

fn err<T>(msg: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError(msg.into()))
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

/// One device string for every actor, or one per actor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum DeviceSpec {
    One(String),
    PerActor(Vec<String>),
}

impl DeviceSpec {
    /// The device string of each of `n` actors.
    pub fn resolve(spec: Option<&DeviceSpec>, n: usize, key: &str) -> Result<Vec<String>, ConfigError> {
        match spec {
            None => Ok(vec!["cpu".to_string(); n]),
            Some(DeviceSpec::One(s)) if s == "auto" => Ok(vec!["cpu".to_string(); n]),
            Some(DeviceSpec::One(s)) => Ok(vec![s.clone(); n]),
            Some(DeviceSpec::PerActor(v)) if v.len() == n => Ok(v.clone()),
            Some(DeviceSpec::PerActor(v)) => err(format!("{key} has {} entries but there are {n} actors", v.len())),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TaskConfig {
    /// JSONL: one task item (a JSON object) per line.
    pub train_file: Option<PathBuf>,
    pub eval_file: Option<PathBuf>,
    /// One prompt template per agent; `{field}` is replaced by the item's field.
    pub formatters: Vec<String>,
    /// Optional per-agent system prompts for the chat template.
    pub system_prompts: Option<Vec<String>>,
    /// Wrap each prompt in the model's chat template.
    pub chat_template: bool,
    /// Extra variables for the chat template, as keyword arguments of transformers'
    /// `apply_chat_template` (`enable_thinking = false` for Qwen3, `date_string` for Llama 3.x).
    pub chat_template_kwargs: toml::Table,
}

impl Default for TaskConfig {
    fn default() -> Self {
        Self {
            train_file: None,
            eval_file: None,
            formatters: vec!["{prompt}".to_string()],
            system_prompts: None,
            chat_template: true,
            chat_template_kwargs: toml::Table::new(),
        }
    }
}

/// The task reward and its `reward_processor` (x * scale + shift). Parameters of the chosen kind
/// sit in the same table and are checked by the reward itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RewardConfig {
    pub kind: String,
    pub scale: f64,
    pub shift: f64,
    #[serde(flatten)]
    pub params: toml::Table,
}

impl Default for RewardConfig {
    fn default() -> Self {
        Self { kind: "length_ratio".into(), scale: 1.0, shift: 0.0, params: toml::Table::new() }
    }
}

/// The whole configuration. Flat fields carry the reference's names and defaults (MADPOConfig).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    // --- pbrl's own keys --------------------------------------------------------------------
    pub run_dir: PathBuf,
    pub seed: u64,
    /// One model source for every agent (GGUF file, HF directory or hub id) ...
    pub agent_model: Option<String>,
    /// ... or one per agent (heterogeneous teams).
    pub agents: Option<Vec<String>>,
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
    /// Which stored rounds a training phase sees (reference §9; aliases accepted).
    pub preference_replay_mode: String,
    #[serde(deserialize_with = "opt")]
    pub preference_replay_k: Option<i64>,
    #[serde(deserialize_with = "opt")]
    pub preference_replay_lambda: Option<f64>,
    #[serde(deserialize_with = "opt")]
    pub preference_replay_sample_size: Option<i64>,
    /// Write a resumable checkpoint every this many epochs (0: none).
    pub checkpoint_interval: i64,
    /// Keep at most this many checkpoints (the newest).
    #[serde(deserialize_with = "opt")]
    pub checkpoint_total_limit: Option<i64>,

    // --- reference MADPOConfig fields -------------------------------------------------------
    pub num_train_epochs: i64,
    pub agent_learning_rate: f64,
    pub logging_steps: i64,
    pub num_agents: i64,
    pub collaboration_mode: String,
    pub parallel_training: String,
    pub agent_devices: Option<DeviceSpec>,
    pub max_new_tokens: i64,
    pub temperature: f64,
    pub top_p: f64,
    #[serde(deserialize_with = "opt")]
    pub top_k: Option<i64>,
    pub num_turns: i64,
    pub discount: f64,
    pub joint_mode: String,
    #[serde(deserialize_with = "opt")]
    pub early_termination_threshold: Option<f64>,
    pub external_prompt_passthrough: bool,
    pub eval_interval: i64,
    pub eval_num_samples: i64,
    pub eval_batch_size: i64,
    pub rollout_buffer_size: i64,
    #[serde(deserialize_with = "opt")]
    pub train_batch_size: Option<i64>,
    pub advantage_normalization: bool,
    pub advantage_mode: String,
    pub reference_kl_enabled: bool,
    pub reference_kl_coef: f64,
    pub reference_devices: Option<DeviceSpec>,
    pub preference_num_candidates: i64,
    #[serde(deserialize_with = "opt")]
    pub preference_pairs_per_sample: Option<i64>,
    pub pair_selection: String,
    pub dpo_beta: f64,
    pub use_environment_step: bool,
    pub environment_steps_per_pair: i64,

    pub task: TaskConfig,
    pub reward: RewardConfig,
}

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
            num_train_epochs: 20,
            agent_learning_rate: 5e-6,
            logging_steps: 50,
            num_agents: 2,
            collaboration_mode: "decentralized".into(),
            parallel_training: "none".into(),
            agent_devices: None,
            max_new_tokens: 256,
            temperature: 0.6,
            top_p: 0.6,
            top_k: Some(50),
            num_turns: 1,
            discount: 1.0,
            joint_mode: "aligned".into(),
            early_termination_threshold: None,
            external_prompt_passthrough: false,
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
            preference_num_candidates: 80,
            preference_pairs_per_sample: Some(16),
            pair_selection: "reward_gap".into(),
            dpo_beta: 0.1,
            use_environment_step: true,
            environment_steps_per_pair: 2,
            task: TaskConfig::default(),
            reward: RewardConfig::default(),
        }
    }
}

/// A `KEY=VALUE` override from the command line.
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    pub key: String,
    pub value: toml::Value,
}

impl Override {
    /// `key=value`; the value is a TOML literal (`1e-5`, `"a"`, `[1, 2]`, `true`), and anything
    /// that does not parse as one is taken as a plain string (`comparator_policy=model`).
    pub fn parse(s: &str) -> Result<Self, ConfigError> {
        let Some((key, raw)) = s.split_once('=') else {
            return err(format!("override `{s}` is not KEY=VALUE"));
        };
        let key = key.trim();
        if key.is_empty() || key.split('.').any(|p| p.is_empty()) {
            return err(format!("override `{s}` has an empty key"));
        }
        let raw = raw.trim();
        let value = toml::from_str::<toml::Table>(&format!("v = {raw}"))
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or_else(|| toml::Value::String(raw.to_string()));
        Ok(Self { key: key.to_string(), value })
    }

    fn apply(&self, table: &mut toml::Table) -> Result<(), ConfigError> {
        let parts: Vec<&str> = self.key.split('.').collect();
        let mut t = table;
        for p in &parts[..parts.len() - 1] {
            let entry = t.entry(p.to_string()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
            t = match entry {
                toml::Value::Table(inner) => inner,
                _ => return err(format!("override `{}`: `{p}` is not a table", self.key)),
            };
        }
        t.insert(parts[parts.len() - 1].to_string(), self.value.clone());
        Ok(())
    }
}

/// The smallest edit distance wins; `None` when nothing is reasonably close.
pub fn closest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    fn lev(a: &str, b: &str) -> usize {
        let b: Vec<char> = b.chars().collect();
        let mut prev: Vec<usize> = (0..=b.len()).collect();
        for (i, ca) in a.chars().enumerate() {
            let mut cur = vec![i + 1; b.len() + 1];
            for (j, &cb) in b.iter().enumerate() {
                cur[j + 1] = (prev[j] + (ca != cb) as usize).min(prev[j + 1] + 1).min(cur[j] + 1);
            }
            prev = cur;
        }
        prev[b.len()]
    }
    candidates
        .into_iter()
        .map(|c| (lev(word, c), c))
        .filter(|(d, c)| *d <= (c.len().max(word.len()) / 2).max(2))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

impl Config {
    /// Read a config file, apply the overrides, fill defaults, normalize and validate.
    pub fn load(path: &Path, overrides: &[Override]) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError(format!("cannot read config {}: {e}", path.display())))?;
        Self::from_toml_str(&text, &path.display().to_string(), overrides)
    }

    /// `origin` names the file in messages.
    pub fn from_toml_str(text: &str, origin: &str, overrides: &[Override]) -> Result<Self, ConfigError> {
        let mut table: toml::Table = toml::from_str(text).map_err(|e| {
            let line = e.span().map(|s| format!(" line {}", line_of(text, s.start))).unwrap_or_default();
            ConfigError(format!("{origin}{line}: {}", e.message()))
        })?;
        for o in overrides {
            o.apply(&mut table)?;
        }
        reject_non_finite("", &table, text, origin, overrides)?;
        let mut cfg: Config = serde_path_to_error::deserialize(toml::Value::Table(table))
            .map_err(|e| describe_de_error(&e, text, origin, overrides))?;
        cfg.normalize_and_validate().map_err(|e| {
            // Blame the command line when the message is about a key an override set.
            let from =
                overrides.iter().find(|o| e.0.contains(&o.key) || e.0.contains(o.key.rsplit('.').next().unwrap_or("")));
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

    /// The sampling settings every stage uses (collection, evaluation, exported agents).
    pub fn sampling(&self) -> crate::model::SamplingParams {
        crate::model::SamplingParams {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k.map(|k| k as usize),
            max_new_tokens: self.max_new_tokens as usize,
        }
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

    /// The replay mode with its parameter (validated).
    pub fn replay_mode(&self) -> crate::prefs::replay::ReplayMode {
        use crate::prefs::replay::ReplayMode;
        match self.preference_replay_mode.as_str() {
            "nearest_k" => ReplayMode::NearestK(self.preference_replay_k.unwrap_or(1) as usize),
            "all_history" => ReplayMode::AllHistory,
            "lambda_decay" => ReplayMode::LambdaDecay(self.preference_replay_lambda.unwrap_or(1.0)),
            _ => ReplayMode::Current,
        }
    }

    /// Where round files live.
    pub fn replay_dir(&self) -> PathBuf {
        self.preference_replay_dir.clone().unwrap_or_else(|| self.run_dir.join("preference_replay"))
    }

    /// How many models act: one per agent, or the one centralized actor writing every role.
    pub fn num_actors(&self) -> usize {
        if self.collaboration_mode == "centralized" {
            1
        } else {
            self.num_agents as usize
        }
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

    /// Reference validation (MADPOConfig.__post_init__), in the reference's order, plus pbrl's.
    fn normalize_and_validate(&mut self) -> Result<(), ConfigError> {
        if !matches!(self.collaboration_mode.as_str(), "decentralized" | "centralized") {
            return err("collaboration_mode must be 'decentralized' or 'centralized'.");
        }
        if self.num_train_epochs < 1 {
            return err("num_train_epochs must be >= 1.");
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
        if self.num_turns != 1 {
            return err("MADPO currently supports num_turns=1 only.");
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
        if !matches!(self.pair_selection.as_str(), "reward_gap" | "all" | "random") {
            return err("pair_selection must be one of: reward_gap, all, random.");
        }
        if self.pair_selection == "all" && self.preference_pairs_per_sample.is_some() {
            return err("preference_pairs_per_sample must be null when pair_selection='all'.");
        }
        if !matches!(self.joint_mode.trim().to_lowercase().as_str(), "align" | "aligned") {
            return err("joint_mode must be 'aligned' (the only supported joint mode).");
        }
        if !matches!(self.advantage_mode.as_str(), "mean" | "raw" | "max" | "rloo") {
            return err("advantage_mode must be one of: mean, raw, max, rloo.");
        }
        // pbrl's own rules.
        if self.max_new_tokens < 1 {
            return err("max_new_tokens must be >= 1.");
        }
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
        if !(self.reward_timeout_s > 0.0 && self.reward_timeout_s <= 604_800.0) {
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
            if !(lo.is_finite() && hi.is_finite() && lo < hi) {
                return err("reward_range must be [min, max] with min < max.");
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
        Ok(())
    }
}

/// Where a key's value came from: the command-line override that set it, else the file (with the
/// line that sets it, when one does).
fn place_of(key: &str, text: &str, origin: &str, overrides: &[Override]) -> String {
    if let Some(o) = overrides.iter().rev().find(|o| o.key == key) {
        return format!("command-line override `{}={}`", o.key, o.value);
    }
    let leaf = key.rsplit('.').next().unwrap_or(key);
    let line = text
        .lines()
        .position(|l| {
            let t = l.trim_start();
            t.starts_with(leaf) && t[leaf.len()..].trim_start().starts_with('=')
        })
        .map(|i| format!(" line {}", i + 1))
        .unwrap_or_default();
    format!("{origin}{line}")
}

/// TOML accepts `nan` and `inf`; no pbrl setting means either, so every float anywhere in the
/// configuration (the `[reward]` parameters included) must be finite.
fn reject_non_finite(
    prefix: &str,
    t: &toml::Table,
    text: &str,
    origin: &str,
    overrides: &[Override],
) -> Result<(), ConfigError> {
    for (k, v) in t {
        let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
        let bad = match v {
            toml::Value::Float(f) => !f.is_finite(),
            toml::Value::Array(a) => a.iter().any(|x| x.as_float().is_some_and(|f| !f.is_finite())),
            toml::Value::Table(inner) => {
                reject_non_finite(&key, inner, text, origin, overrides)?;
                false
            }
            _ => false,
        };
        if bad {
            return err(format!("{}: `{key}` = {v} is not a finite number", place_of(&key, text, origin, overrides)));
        }
    }
    Ok(())
}

/// Turn serde's message into one line that names the key, its origin and, for an unknown key,
/// the closest known one.
fn describe_de_error(
    e: &serde_path_to_error::Error<toml::de::Error>,
    text: &str,
    origin: &str,
    overrides: &[Override],
) -> ConfigError {
    let msg = e.inner().message().to_string();
    let first = msg.lines().next().unwrap_or(&msg).trim();
    if let Some(rest) = first.strip_prefix("unknown field `") {
        let (key, expected) = rest.split_once('`').unwrap_or((rest, ""));
        // The error's path ends with the unknown key itself.
        let path = e.path().to_string();
        let parent = path.rsplit_once('.').map(|(p, _)| p.to_string()).unwrap_or_default();
        let qualify = |k: &str| {
            if parent.is_empty() {
                k.to_string()
            } else {
                format!("{parent}.{k}")
            }
        };
        let full = qualify(key);
        let known: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
        let hint = closest(key, known.iter().copied())
            .map(|c| format!("; did you mean `{}`?", qualify(c)))
            .unwrap_or_default();
        let from_override = overrides.iter().any(|o| o.key == full);
        let place = if from_override {
            "command-line override".to_string()
        } else {
            let line = text
                .lines()
                .position(|l| {
                    l.trim_start().starts_with(key)
                        && l[l.find(key).unwrap() + key.len()..].trim_start().starts_with('=')
                })
                .map(|i| format!(" line {}", i + 1))
                .unwrap_or_default();
            format!("{origin}{line}")
        };
        return ConfigError(format!("{place}: unknown key `{full}`{hint}"));
    }
    let path = e.path().to_string();
    if overrides.iter().any(|o| o.key == path) {
        return ConfigError(format!("{}: {first}", place_of(&path, text, origin, overrides)));
    }
    ConfigError(format!("{origin}: key `{path}`: {first}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str, overrides: &[&str]) -> Result<Config, ConfigError> {
        let o: Vec<Override> = overrides.iter().map(|s| Override::parse(s).unwrap()).collect();
        Config::from_toml_str(text, "test.toml", &o)
    }

    fn message(text: &str, overrides: &[&str]) -> String {
        load(text, overrides).unwrap_err().0
    }

    #[test]
    fn defaults_are_the_reference_madpo_defaults() {
        let c = load("", &[]).unwrap();
        assert_eq!(c.num_train_epochs, 20);
        assert_eq!(c.agent_learning_rate, 5e-6);
        assert_eq!(c.preference_num_candidates, 80);
        assert_eq!(c.preference_pairs_per_sample, Some(16));
        assert_eq!(c.pair_selection, "reward_gap");
        assert_eq!(c.dpo_beta, 0.1);
        assert_eq!(c.max_new_tokens, 256);
        assert_eq!((c.temperature, c.top_p, c.top_k), (0.6, 0.6, Some(50)));
        assert_eq!(c.eval_interval, 16);
        assert_eq!(c.pairs_per_update(), 2, "train_batch_size defaults to rollout_buffer_size");
    }

    /// Every validation rule, with its message.
    #[test]
    fn each_rule_reports_its_message() {
        let cases: &[(&str, &str)] = &[
            ("collaboration_mode = \"central\"", "collaboration_mode must be 'decentralized' or 'centralized'."),
            ("num_train_epochs = 0", "num_train_epochs must be >= 1."),
            ("num_agents = 0", "num_agents must be >= 1."),
            ("rollout_buffer_size = 0", "rollout_buffer_size must be >= 1."),
            ("eval_interval = -1", "eval_interval must be >= 0."),
            ("eval_num_samples = -1", "eval_num_samples must be >= 0."),
            ("eval_batch_size = 0", "eval_batch_size must be >= 1."),
            ("eval_samples_per_item = 0", "eval_samples_per_item must be >= 1."),
            ("num_turns = 0", "num_turns must be >= 1."),
            ("logging_steps = 0", "logging_steps must be >= 1."),
            ("train_batch_size = 0", "train_batch_size must be >= 1."),
            ("parallel_training = \"ddp\"", "parallel_training must be one of: none, mp."),
            ("parallel_training = \"MP\"", "parallel_training='mp' requires agent_devices."),
            ("reference_kl_coef = -0.1", "reference_kl_coef must be >= 0."),
            ("num_turns = 2", "MADPO currently supports num_turns=1 only."),
            ("preference_num_candidates = 1", "preference_num_candidates must be >= 2."),
            ("preference_pairs_per_sample = 0", "preference_pairs_per_sample must be null or >= 1."),
            ("dpo_beta = 0.0", "dpo_beta must be > 0."),
            ("environment_steps_per_pair = 0", "environment_steps_per_pair must be >= 1."),
            ("pair_selection = \"best\"", "pair_selection must be one of: reward_gap, all, random."),
            ("pair_selection = \"all\"", "preference_pairs_per_sample must be null when pair_selection='all'."),
            ("joint_mode = \"cross\"", "joint_mode must be 'aligned'"),
            ("advantage_mode = \"median\"", "advantage_mode must be one of: mean, raw, max, rloo."),
            ("max_new_tokens = 0", "max_new_tokens must be >= 1."),
            ("temperature = -1.0", "temperature must be >= 0"),
            ("top_p = 0.0", "top_p must be in (0, 1]."),
            ("top_k = 0", "top_k must be null or >= 1."),
            ("[task]\nformatters = [\"a\", \"b\", \"c\"]", "task.formatters has 3 templates"),
            ("[task]\nsystem_prompts = [\"a\", \"b\", \"c\"]", "task.system_prompts has 3 entries"),
            ("[task.chat_template_kwargs]\nmessages = []", "task.chat_template_kwargs.messages is set by pbrl itself"),
            ("agent_devices = [\"cpu\"]", "agent_devices has 1 entries but there are 2 actors"),
            ("reward_timeout_s = 0.0", "reward_timeout_s must be a positive number of seconds"),
            ("reward_timeout_s = 1e20", "at most a week"),
            ("agent_learning_rate = -1e-5", "agent_learning_rate must be > 0."),
            ("agent_model = \"a\"\nagents = [\"b\", \"c\"]", "agent_model and agents are both set"),
            ("collect_batch_size = 0", "collect_batch_size must be >= 1."),
            ("preference_replay_mode = \"best\"", "preference_replay_mode must be one of"),
            ("preference_replay_k = 2", "preference_replay_k must be null or 1 when preference_replay_mode='current'."),
            ("preference_replay_lambda = 0.5", "preference_replay_lambda is only valid when"),
            (
                "preference_replay_sample_size = 4",
                "preference_replay_sample_size is only valid when preference_replay_mode is",
            ),
            (
                "preference_replay_mode = \"k\"",
                "preference_replay_k is required when preference_replay_mode='nearest_k'.",
            ),
            ("preference_replay_mode = \"last_k\"\npreference_replay_k = 0", "preference_replay_k must be >= 1."),
            (
                "preference_replay_mode = \"all_history\"\npreference_replay_k = 2",
                "preference_replay_k is only valid when preference_replay_mode='nearest_k'.",
            ),
            (
                "preference_replay_mode = \"all_history\"\npreference_replay_sample_size = 0",
                "preference_replay_sample_size must be null or >= 1.",
            ),
            ("preference_replay_mode = \"td-lambda\"", "preference_replay_lambda is required when"),
            (
                "preference_replay_mode = \"lambda\"\npreference_replay_lambda = 1.5",
                "preference_replay_lambda must be in [0, 1].",
            ),
            ("checkpoint_interval = -1", "checkpoint_interval must be >= 0"),
            ("checkpoint_total_limit = 0", "checkpoint_total_limit must be null or >= 1."),
            ("reward_range = [1.0, 0.0]", "reward_range must be [min, max] with min < max."),
            ("log_reward_distribution = true", "log_reward_distribution needs reward_range = [min, max]"),
        ];
        for (text, want) in cases {
            let m = message(text, &[]);
            assert!(m.starts_with("test.toml: ") && m.contains(want), "{text:?}: got {m:?}, want {want:?}");
        }
    }

    #[test]
    fn non_finite_values_and_override_mistakes_name_their_place() {
        assert_eq!(
            message("seed = 1\ndpo_beta = nan", &[]),
            "test.toml line 2: `dpo_beta` = nan is not a finite number"
        );
        assert!(message("[reward]\nscale = -inf", &[]).contains("`reward.scale` = -inf is not a finite number"));
        assert!(message("", &["reward.target_min=nan"]).contains("`reward.target_min` = nan"));
        let m = message("", &["temperature=inf"]);
        assert!(m.starts_with("command-line override `temperature=inf`"), "{m}");
        let m = message("", &["dpo_beta=-1.0"]);
        assert!(m.starts_with("command-line override `dpo_beta=-1.0`: dpo_beta must be > 0"), "{m}");
        let m = message("", &["num_agents=\"two\""]);
        assert!(m.starts_with("command-line override `num_agents=\"two\"`"), "{m}");
    }

    #[test]
    fn normalizations_and_none_values() {
        let c = load(
            "pair_selection = \" ALL \"\npreference_pairs_per_sample = \"none\"\nparallel_training = \"null\"",
            &[],
        )
        .unwrap();
        assert_eq!(c.pair_selection, "all");
        assert_eq!(c.preference_pairs_per_sample, None);
        assert_eq!(c.parallel_training, "none");
        assert_eq!(load("", &["top_k=none"]).unwrap().top_k, None);
        for (alias, mode) in [("latest", "current"), ("recent_k", "nearest_k"), ("TD-Lambda", "lambda_decay")] {
            let extra = match mode {
                "nearest_k" => "preference_replay_k=2",
                "lambda_decay" => "preference_replay_lambda=0.5",
                _ => "seed=1",
            };
            let c = load("", &[&format!("preference_replay_mode={alias}"), extra]).unwrap();
            assert_eq!(c.preference_replay_mode, mode);
        }
    }

    #[test]
    fn unknown_keys_name_the_line_and_the_closest_key() {
        assert_eq!(
            message("seed = 1\ndpo_betta = 0.2\n", &[]),
            "test.toml line 2: unknown key `dpo_betta`; did you mean `dpo_beta`?"
        );
        assert_eq!(
            message("[task]\ntrain_fil = \"x\"\n", &[]),
            "test.toml line 2: unknown key `task.train_fil`; did you mean `task.train_file`?"
        );
        assert_eq!(
            message("", &["max_new_token=3"]),
            "command-line override: unknown key `max_new_token`; did you mean `max_new_tokens`?"
        );
        assert_eq!(message("", &["zzzzzzzzzzzz=1"]), "command-line override: unknown key `zzzzzzzzzzzz`");
    }

    #[test]
    fn type_errors_name_the_key_and_syntax_errors_the_line() {
        let m = message("dpo_beta = \"high\"", &[]);
        assert!(m.contains("`dpo_beta`"), "{m}");
        let m = message("seed = 1\nnum_agents = = 2\n", &[]);
        assert!(m.starts_with("test.toml line 2:"), "{m}");
    }

    #[test]
    fn overrides_are_toml_literals_or_bare_words() {
        let c = load(
            "agent_learning_rate = 1e-5",
            &[
                "agent_learning_rate=2e-5",
                "task.eval_file=data/x.jsonl",
                "task.formatters=[\"{prompt}!\"]",
                "reward.kind=length_ratio",
            ],
        )
        .unwrap();
        assert_eq!(c.agent_learning_rate, 2e-5);
        assert_eq!(c.task.eval_file.as_deref(), Some(Path::new("data/x.jsonl")));
        assert_eq!(c.task.formatters, vec!["{prompt}!"]);
        assert_eq!(Override::parse("comparator_policy=model").unwrap().value, toml::Value::String("model".into()));
        assert!(Override::parse("novalue").is_err());
        assert!(message("seed = 1", &["seed.x=1"]).contains("`seed` is not a table"));
        assert!(message("", &["seed.x=1"]).contains("`seed`"));
    }

    #[test]
    fn resolved_config_round_trips() {
        let c = load("seed = 7\n[reward]\nkind = \"length_ratio\"\ntarget_min = 1.5", &[]).unwrap();
        let again = Config::from_toml_str(&c.to_toml(), "resolved", &[]).unwrap();
        assert_eq!(c, again);
    }

    #[test]
    fn agent_sources() {
        assert!(load("", &[]).unwrap().agent_sources().unwrap_err().0.contains("agent_model"));
        assert_eq!(load("agent_model = \"m.gguf\"", &[]).unwrap().agent_sources().unwrap(), vec!["m.gguf", "m.gguf"]);
        assert!(load("agents = [\"a\"]", &[]).unwrap().agent_sources().unwrap_err().0.contains("num_agents is 2"));
        let central = |extra: &str| load(&format!("collaboration_mode = \"centralized\"\n{extra}"), &[]).unwrap();
        assert_eq!(central("agent_model = \"m\"").agent_sources().unwrap(), vec!["m"]);
        assert_eq!(central("agents = [\"a\"]").agent_sources().unwrap(), vec!["a"]);
        assert!(central("agents = [\"a\", \"b\"]").agent_sources().unwrap_err().0.contains("exactly one actor"));
    }
}
