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
