//! The purposes of pbrl's random streams: the first index of every seed path
//! ([`derive_seed`]), so that no two streams share a seed.

pub use pbrl_model::seed::derive_seed;

/// Purposes of random streams (the first path element).
pub mod purpose {
    pub const EVAL: u64 = 1;
    pub const COLLECT: u64 = 2;
    pub const PAIRS: u64 = 3;
    pub const REPLAY: u64 = 4;
    pub const TRAIN: u64 = 5;
    pub const SPLIT: u64 = 6;
    pub const REWARD_HEAD: u64 = 7;
    pub const REWARD_SPLIT: u64 = 8;
    pub const REWARD_TRAIN: u64 = 9;
    pub const RL_ROLLOUT: u64 = 10;
    pub const RL_BUFFER: u64 = 11;
    pub const VALUE_HEAD: u64 = 12;
    pub const COMPARATOR: u64 = 13;
    pub const EVAL_ROUND: u64 = 14;
    pub const REWARD_FRESH: u64 = 15;
    pub const LORA_INIT: u64 = 16;
    pub const REWARD_LORA_INIT: u64 = 17;
    pub const ROUND_ITEMS: u64 = 18;
    pub const LORA_DROPOUT: u64 = 19;
    pub const EVAL_TURN: u64 = 20;
    pub const RL_TURN: u64 = 21;
    pub const COLLECT_TURN: u64 = 22;
}
