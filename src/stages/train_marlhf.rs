//! `pbrl train-marlhf`: online RL of the agents on the joint reward model `fit-rm` fitted
//! (`train::marlhf`: the MAGRPO family or the actor-critic backends), the agents saved in
//! `<run_dir>/agents/`.
use anyhow::Result;

use crate::config::Config;
use crate::run::RunDir;
use crate::train::marlhf::{train, TrainOptions, TrainReport};

pub fn run(cfg: &Config, run_dir: &RunDir, opts: &TrainOptions) -> Result<TrainReport> {
    let report = train(&cfg.marlhf()?, run_dir, opts)?;
    println!("{}", report.describe());
    Ok(report)
}
