//! The math of training, as small pure functions over tensors (`madpo.rs`), and the glue that
//! feeds them from preference pairs and models (`madpo_batch.rs`): no files, no CLI.
pub mod madpo;
pub mod madpo_batch;
