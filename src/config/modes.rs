//! The modes a key selects, as types the stages match on. They live with the config, below
//! every module that uses them, so nothing the config needs sits above it.
use serde::{Deserialize, Serialize};

/// `lr_scheduler_type`: the learning rate over a training's U updates (transformers' schedules
/// without warmup): `constant` (the reference's), or `linear`, from the full rate at the first
/// update down to 1/U of it at the last of U, so the late updates of an epoch move the policy
/// less than the early ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LrSchedule {
    #[default]
    Constant,
    Linear,
}

impl LrSchedule {
    /// The factor on the learning rate of update `done + 1` of `total`.
    pub fn factor(self, done: u64, total: u64) -> f64 {
        match self {
            LrSchedule::Constant => 1.0,
            LrSchedule::Linear => total.saturating_sub(done) as f64 / total.max(1) as f64,
        }
    }

    pub fn is_constant(&self) -> bool {
        *self == LrSchedule::Constant
    }
}

/// `reward_head`: which head scores a joint text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RewardHeadKind {
    /// The reference's: a linear score of the last token's final hidden state.
    #[default]
    LastToken,
    /// Per agent, the mean of its response tokens' final hidden states and log(1 + its token
    /// count), all agents' into `Linear(A·(hidden + 1), d) → Tanh → Linear(d, 1)`.
    PooledMlp,
}

impl RewardHeadKind {
    pub fn is_last_token(&self) -> bool {
        *self == RewardHeadKind::LastToken
    }
}

/// `preference_replay_mode` with its parameter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ReplayMode {
    Current,
    NearestK(usize),
    AllHistory,
    LambdaDecay(f64),
}

/// `history_reward`: one number for a multi-turn joint history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HistoryReward {
    /// Its last turn's reward.
    Last,
    /// The sum of its turns' rewards.
    Sum,
}

impl HistoryReward {
    /// The history's score from its turns' rewards (at least one).
    pub fn score(self, turn_rewards: &[f64]) -> f64 {
        match self {
            HistoryReward::Last => *turn_rewards.last().expect("a history has a turn"),
            HistoryReward::Sum => turn_rewards.iter().sum(),
        }
    }
}

/// `pair_selection`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PairSelection {
    /// Largest score gap first (a stable sort: equal gaps keep generation order).
    #[default]
    RewardGap,
    /// Every ordered pair with a gap, in index order; never truncated.
    All,
    /// A seeded shuffle.
    Random,
    /// Iterative rounds only: the comparator's highest-scored candidates first, then the largest
    /// gap (reference §5.2).
    ComparatorReward,
}

impl PairSelection {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "reward_gap" => Some(Self::RewardGap),
            "all" => Some(Self::All),
            "random" => Some(Self::Random),
            "comparator_reward" => Some(Self::ComparatorReward),
            _ => None,
        }
    }
}

/// `advantage_mode`, which `rl_algorithm` sets for the MAGRPO family: the baseline of a group's
/// returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdvantageMode {
    Mean,
    Raw,
    Max,
    Rloo,
}

impl AdvantageMode {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "mean" => Some(Self::Mean),
            "raw" => Some(Self::Raw),
            "max" => Some(Self::Max),
            "rloo" => Some(Self::Rloo),
            _ => None,
        }
    }
}

/// `rl_algorithm` (with `use_separate_critic`): `train-marlhf`'s backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarlhfBackend {
    /// magrpo, mareinforce, maremax, marloo: group advantages with this baseline.
    PolicyGradient(AdvantageMode),
    /// A critic model per agent (`separate`), or a value head on each actor.
    Iac { separate: bool },
    /// One centralized critic.
    Maac,
}

/// `comparator_policy` with what it names: who `iterate` compares the team with.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ComparatorPolicy {
    /// The team's own agents under their own seeded stream.
    #[default]
    Current,
    /// The agents as they are, loaded onto `comparator_devices`.
    CurrentCopy,
    /// These model sources, one per role.
    Model(Vec<String>),
    /// The team this many rounds back.
    History(u64),
    /// An HTTP endpoint.
    Api,
}

/// The modes of a validated config, as types (`Config::modes`): filled when the config loads,
/// after its rules passed, so stages match on them and never on strings.
#[derive(Debug, Clone, PartialEq)]
pub struct Modes {
    /// `collaboration_mode = "centralized"`: one actor writes every role.
    pub centralized: bool,
    pub selection: PairSelection,
    pub marlhf: MarlhfBackend,
    /// `critic_type = "q"`: the critics value the prompt and the response.
    pub q_critic: bool,
    /// `algorithm = "marlhf"`: `iterate` fits a reward model and runs MARLHF each round.
    pub marlhf_rounds: bool,
    /// `preference_scoring_reward = "reward_model"`: the newest reward model scores comparisons.
    pub score_with_reward_model: bool,
    pub comparator: ComparatorPolicy,
    /// The comparator actor that writes every role (`comparator_generation_mode =
    /// "centralized"` with a decentralized team).
    pub comparator_writer: Option<usize>,
    pub api_format: ApiFormat,
}

impl Default for Modes {
    fn default() -> Self {
        Modes {
            centralized: false,
            selection: PairSelection::RewardGap,
            marlhf: MarlhfBackend::PolicyGradient(AdvantageMode::Mean),
            q_critic: false,
            marlhf_rounds: false,
            score_with_reward_model: false,
            comparator: ComparatorPolicy::Current,
            comparator_writer: None,
            api_format: ApiFormat::Generic,
        }
    }
}

/// The request format of an `api` comparator (`comparator_api_format`, reference names and
/// aliases).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiFormat {
    Generic,
    OpenAiChat,
    Anthropic,
    OpenAiResponses,
}

impl ApiFormat {
    /// Unlike the reference (which falls back to generic), an unknown name is none: another
    /// format would send another request.
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name.trim().to_lowercase().as_str() {
            "generic" => Self::Generic,
            "openai" | "openai_chat" | "chat" => Self::OpenAiChat,
            "anthropic" | "anthropic_messages" | "messages" => Self::Anthropic,
            "openai_responses" | "responses" | "codex" => Self::OpenAiResponses,
            _ => return None,
        })
    }
}

impl Modes {
    /// The modes of a config its rules accepted (the strings are normalized by then).
    pub(super) fn of(cfg: &super::Config) -> Result<Self, super::ConfigError> {
        let bad = |key: &str, value: &str| super::ConfigError(format!("{key} = \"{value}\" is not a mode pbrl knows"));
        let selection =
            PairSelection::parse(&cfg.pair_selection).ok_or_else(|| bad("pair_selection", &cfg.pair_selection))?;
        let marlhf = match cfg.rl_algorithm.as_str() {
            "magrpo" => MarlhfBackend::PolicyGradient(AdvantageMode::Mean),
            "mareinforce" => MarlhfBackend::PolicyGradient(AdvantageMode::Raw),
            "maremax" => MarlhfBackend::PolicyGradient(AdvantageMode::Max),
            "marloo" => MarlhfBackend::PolicyGradient(AdvantageMode::Rloo),
            "iac" => MarlhfBackend::Iac { separate: cfg.use_separate_critic },
            "maac" => MarlhfBackend::Maac,
            other => return Err(bad("rl_algorithm", other)),
        };
        let comparator = match cfg.comparator_policy.as_str() {
            "current" => ComparatorPolicy::Current,
            "current_copy" => ComparatorPolicy::CurrentCopy,
            "model" => ComparatorPolicy::Model(match (&cfg.comparator_agents, &cfg.comparator_model_name) {
                (Some(a), _) => a.clone(),
                (None, Some(m)) => vec![m.clone(); cfg.num_actors()],
                (None, None) => return Err(bad("comparator_policy", "model\" without comparator_model_name")),
            }),
            "history" => ComparatorPolicy::History(cfg.comparator_history_k.unwrap_or(1).max(0) as u64),
            "api" => ComparatorPolicy::Api,
            other => return Err(bad("comparator_policy", other)),
        };
        let api_format = ApiFormat::parse(&cfg.comparator_api_format).ok_or_else(|| {
            super::ConfigError(format!(
                "comparator_api_format = \"{}\": must be one of generic, openai (openai_chat, chat), anthropic \
                 (anthropic_messages, messages), openai_responses (responses, codex)",
                cfg.comparator_api_format.trim().to_lowercase()
            ))
        })?;
        let centralized = cfg.collaboration_mode == "centralized";
        let writer = cfg.comparator_generation_mode == "centralized" && !centralized;
        Ok(Modes {
            centralized,
            selection,
            marlhf,
            q_critic: cfg.critic_type == "q",
            marlhf_rounds: cfg.algorithm == "marlhf",
            score_with_reward_model: cfg.preference_scoring_reward == "reward_model",
            comparator,
            comparator_writer: writer.then_some(cfg.comparator_centralized_agent_index as usize),
            api_format,
        })
    }
}
