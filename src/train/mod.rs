//! The trainers: MADPO (`madpo.rs`, fed from preference pairs and models by `madpo_batch.rs`),
//! MARLHF's RL of the team (`marlhf/`), the joint reward model's fit (`reward_fit.rs`), an
//! iterate round's training with either (`round.rs`), and what every trainer shares: AdamW with
//! PyTorch semantics (`optim.rs`) and the training session (`session.rs`): optimizers, resume,
//! epochs and batches, eval cadence, the non-finite skip, checkpoints, metrics, progress, and
//! the final all-or-nothing save.
pub mod madpo;
pub mod madpo_batch;
pub mod marlhf;
pub mod optim;
pub mod reward_fit;
pub mod round;
pub mod session;
pub mod summary;
pub mod training_plot;
