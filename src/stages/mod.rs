//! One file per subcommand, each readable top to bottom: load → loop → save.
pub mod collect;
pub mod eval;
pub mod fit_rm;
pub mod iterate;
pub mod marlhf_actor_critic;
pub mod train_madpo;
pub mod train_marlhf;
