//! The run directory's layout (spec §4): every path a stage reads or writes there is named here,
//! and nowhere else.
//!
//! ```text
//! <run_dir>/
//!   config.toml                   the resolved config of the last command
//!   metrics.jsonl                 one JSON object per logged step, every stage
//!   .pbrl.lock                    one writer at a time
//!   preference_replay/            round files iteration_NNNN.json (or preference_replay_dir)
//!   agents/                       the trained team: agent_i/, team.json
//!   best_agents/, final_agents/   keep-best: the best snapshot so far; the last agents
//!   checkpoints/                  train-madpo's resumable state (checkpoint-N/)
//!   madpo_reference.json          anchored MADPO: the reference margins
//!   reward_model/                 fit-rm's reward model (fit_report.json beside it)
//!   reward_model_training/        fit-rm's checkpoints, summary and plot
//!   marlhf_training/              train-marlhf's checkpoints, summary and plot
//!   eval/                         eval-<time>.json reports, eval_reward.svg
//!   reward_distributions/         per-round reward histograms (json, svg)
//!   iterate/                      fingerprint.json, round_NNNN.json, eval_reward.svg
//!   policy_checkpoints/           iterate's team after each round (iteration_NNNN/)
//! ```
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// A run directory, and where its round files live.
#[derive(Debug, Clone)]
pub struct RunDir {
    pub root: PathBuf,
    replay: PathBuf,
}

impl RunDir {
    /// A run directory with its round files in `preference_replay/`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        Self { replay: root.join("preference_replay"), root }
    }

    /// A run directory `root` (the config's `run_dir`) with its round files in `replay` when
    /// given (`preference_replay_dir`), else in `preference_replay/`.
    pub fn with_replay(root: impl Into<PathBuf>, replay: Option<PathBuf>) -> Self {
        let dir = Self::new(root);
        match replay {
            Some(replay) => Self { replay, ..dir },
            None => dir,
        }
    }

    pub fn config(&self) -> PathBuf {
        self.root.join("config.toml")
    }
    pub fn metrics(&self) -> PathBuf {
        self.root.join("metrics.jsonl")
    }
    pub fn lock(&self) -> PathBuf {
        self.root.join(".pbrl.lock")
    }
    /// The round files, `iteration_NNNN.json`.
    pub fn replay(&self) -> &Path {
        &self.replay
    }

    /// The trained team (`team::save_team`): `agents/agent_i` and `agents/team.json`.
    pub fn agents(&self) -> PathBuf {
        self.root.join("agents")
    }
    /// The trained LoRA agents merged into their bases (`agent_lora.save_merged`).
    pub fn agents_merged(&self) -> PathBuf {
        self.root.join("agents_merged")
    }
    pub fn agent(&self, i: usize) -> PathBuf {
        self.agents().join(format!("agent_{i}"))
    }
    /// With `keep_best`: the best agents found so far, and the last agents when the best are
    /// the ones saved in `agents/`.
    pub fn best_agents(&self) -> PathBuf {
        self.root.join("best_agents")
    }
    pub fn final_agents(&self) -> PathBuf {
        self.root.join("final_agents")
    }

    /// train-madpo's state (its checkpoints live in `checkpoints/` under the run directory).
    pub fn madpo_state(&self) -> &Path {
        &self.root
    }
    pub fn checkpoints(&self) -> PathBuf {
        self.root.join("checkpoints")
    }
    pub fn madpo_reference(&self) -> PathBuf {
        self.root.join("madpo_reference.json")
    }

    pub fn reward_model(&self) -> PathBuf {
        self.root.join("reward_model")
    }
    pub fn fit_report(&self) -> PathBuf {
        self.reward_model().join("fit_report.json")
    }
    pub fn reward_model_state(&self) -> PathBuf {
        self.root.join("reward_model_training")
    }
    pub fn marlhf_state(&self) -> PathBuf {
        self.root.join("marlhf_training")
    }

    /// A training's summary and plot, in its state directory (`madpo_state`, `reward_model_state`,
    /// `marlhf_state`).
    pub fn training_summary(state: &Path) -> PathBuf {
        state.join("training_summary.json")
    }
    pub fn training_plot(state: &Path) -> PathBuf {
        state.join("training_plot.svg")
    }

    pub fn eval(&self) -> PathBuf {
        self.root.join("eval")
    }
    pub fn eval_plot(&self) -> PathBuf {
        self.eval().join("eval_reward.svg")
    }

    /// A round's reward histograms: `iteration_NNNN{suffix}.{ext}`.
    pub fn reward_distribution(&self, round: u32, suffix: &str, ext: &str) -> PathBuf {
        self.root.join("reward_distributions").join(format!("iteration_{round:04}{suffix}.{ext}"))
    }

    pub fn iterate_state(&self) -> PathBuf {
        self.root.join("iterate")
    }
    pub fn iterate_fingerprint(&self) -> PathBuf {
        self.iterate_state().join("fingerprint.json")
    }
    /// `iterate/round_NNNN.json`: a finished round's summary.
    pub fn round_summary(&self, round: u32) -> PathBuf {
        self.iterate_state().join(format!("round_{round:04}.json"))
    }
    pub fn iterate_plot(&self) -> PathBuf {
        self.iterate_state().join("eval_reward.svg")
    }
    pub fn policy_checkpoints(&self) -> PathBuf {
        self.root.join("policy_checkpoints")
    }
    /// The team after round `label + 1` (`iteration_{label}`).
    pub fn policy_snapshot(&self, label: usize) -> PathBuf {
        self.policy_checkpoints().join(format!("iteration_{label:04}"))
    }
}

/// A round file: `<dir>/iteration_NNNN.json`.
pub fn round_path(dir: &Path, iteration: u32) -> PathBuf {
    dir.join(format!("iteration_{iteration:04}.json"))
}

/// The round numbers present in `dir`, ascending.
pub fn existing_rounds(dir: &Path) -> Result<Vec<u32>> {
    let mut out = Vec::new();
    if !dir.is_dir() {
        return Ok(out);
    }
    for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let name = e?.file_name().to_string_lossy().to_string();
        if let Some(n) =
            name.strip_prefix("iteration_").and_then(|r| r.strip_suffix(".json")).and_then(|n| n.parse().ok())
        {
            out.push(n);
        }
    }
    out.sort_unstable();
    Ok(out)
}
