//! The math of training, as small pure functions (`madpo.rs`, `bradley_terry.rs`,
//! `advantages.rs`, `policy_gradient.rs`, `actor_critic.rs`,
//! `reference_kl.rs`), the statistics of learning over rounds (`trend.rs`), and the glue that feeds them from preference pairs and models
//! (`madpo_batch.rs`): no files, no CLI.
pub mod actor_critic;
pub mod advantages;
pub mod bradley_terry;
pub mod madpo;
pub mod madpo_batch;
pub mod policy_gradient;
pub mod reference_kl;
pub mod trend;
