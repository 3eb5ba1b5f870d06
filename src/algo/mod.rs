//! The math of training, as small pure functions over tensors: no files, no CLI.
pub mod madpo;
