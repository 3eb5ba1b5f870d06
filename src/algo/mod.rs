//! The math of training, as small pure functions (`madpo.rs`, `bradley_terry.rs`,
//! `advantages.rs`, `policy_gradient.rs`, `actor_critic.rs`, `reference_kl.rs`, the multi-turn
//! `rollout_tree.rs`) and the
//! statistics of learning over rounds (`trend.rs`): no models, no files, no CLI.
pub mod actor_critic;
pub mod advantages;
pub mod bradley_terry;
pub mod madpo;
pub mod policy_gradient;
pub mod reference_kl;
pub mod rollout_tree;
pub mod trend;
