//! What every trainer shares: AdamW with PyTorch semantics (`optim.rs`) and the training
//! session (`session.rs`): optimizers, resume, epochs and batches, eval cadence, the non-finite
//! skip, checkpoints, metrics, progress, and the final all-or-nothing save.
pub mod optim;
pub mod session;
