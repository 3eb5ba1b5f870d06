//! `pbrl fit-rm`: fit a joint reward model to the stored preference rounds (`train::reward_fit`:
//! a Bradley–Terry loss, whole items held out, `rm/fresh_rank_acc` measured on fresh samples)
//! and save it in `<run_dir>/reward_model/`.
use anyhow::Result;

use crate::config::Config;
use crate::run::RunDir;
use crate::train::reward_fit::{fit, FitOptions, FitReport};

pub fn run(cfg: &Config, run_dir: &RunDir, opts: &FitOptions) -> Result<Option<FitReport>> {
    let Some(report) = fit(&cfg.reward_fit()?, run_dir, opts)? else {
        println!("no non-tied preference pairs in the selected rounds; no reward model was fitted");
        return Ok(None);
    };
    println!("{}", report.describe());
    Ok(Some(report))
}
