//! One recipe per subcommand: what it runs (library functions, never another stage) and what it
//! prints.
pub mod collect;
pub mod eval;
pub mod fit_rm;
pub mod iterate;
pub mod train_madpo;
pub mod train_marlhf;
