//! The math of training, as small pure functions over tensors (`madpo.rs`, `bradley_terry.rs`),
//! and the glue that feeds them from preference pairs and models (`madpo_batch.rs`): no files,
//! no CLI.
pub mod bradley_terry;
pub mod madpo;
pub mod madpo_batch;
