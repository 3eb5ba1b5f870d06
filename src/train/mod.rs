//! The trainers of the team: MADPO (`madpo.rs`), and what every trainer shares: AdamW with
//! PyTorch semantics (`optim.rs`) and the training session (`session.rs`): optimizers, resume,
//! epochs and batches, eval cadence, the non-finite skip, checkpoints, metrics, progress, and
//! the final all-or-nothing save.
pub mod madpo;
pub mod marlhf;
pub mod optim;
pub mod session;
pub mod summary;
pub mod training_plot;
