//! An iterate round's training on the replay selection: MADPO, or MARLHF (a fresh reward model
//! fitted on it, then RL of the team on it), each resuming from its checkpoint when a training
//! was cut short.
use std::path::Path;

use anyhow::Result;

use super::reward_fit::{fit, FitOptions};
use crate::config::RoundTraining;
use crate::run::RunDir;

/// Train the team on the selected rounds; returns the pairs it trained on.
pub fn train_round(cfg: &RoundTraining, run_dir: &RunDir) -> Result<usize> {
    let unfinished = |dir: &Path| -> Result<bool> {
        Ok(crate::run::checkpoint::list(dir)?.last().is_some() && crate::run::checkpoint::finished(dir)?.is_none())
    };
    let cfg = match cfg {
        RoundTraining::Madpo(madpo) => madpo,
        RoundTraining::Marlhf { replay, fit: fit_config, rl } => {
            let (pairs, _) = crate::prefs::replay::training_pairs(run_dir.replay(), replay)?;
            if pairs.is_empty() {
                println!("no non-tied preference pairs in the selected rounds; the agents are unchanged");
                return Ok(0);
            }
            let resume = unfinished(&run_dir.reward_model_state())?;
            let Some(fit) = fit(fit_config, run_dir, &FitOptions { resume })? else { return Ok(0) };
            println!("{}", fit.describe());
            let resume = unfinished(&run_dir.marlhf_state())?;
            let trained = super::marlhf::train(rl, run_dir, &super::marlhf::TrainOptions { resume })?;
            println!("{}", trained.describe());
            return Ok(fit.num_pairs);
        }
    };
    let resume = unfinished(&run_dir.root)?;
    let Some(trained) = super::madpo::train(cfg, run_dir, &super::madpo::TrainOptions { resume })? else {
        println!("no non-tied preference pairs in the selected rounds; the agents are unchanged");
        return Ok(0);
    };
    println!("{}", trained.describe());
    Ok(trained.num_pairs)
}
