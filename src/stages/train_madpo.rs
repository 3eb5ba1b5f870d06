//! `pbrl train-madpo`: train the agents on the stored preference rounds with Multi-Agent DPO
//! (`train::madpo`: reference-free as the reference, or anchored to a frozen reference policy)
//! and save them in `<run_dir>/agents/`.
use anyhow::Result;

use crate::config::Config;
use crate::run::RunDir;
use crate::train::madpo::{train, TrainOptions, TrainReport};

pub fn run(cfg: &Config, run_dir: &RunDir, opts: &TrainOptions) -> Result<Option<TrainReport>> {
    let Some(report) = train(&cfg.madpo()?, run_dir, opts)? else {
        println!("no non-tied preference pairs in the selected rounds; the agents are unchanged");
        return Ok(None);
    };
    println!("{}", report.describe());
    Ok(Some(report))
}
