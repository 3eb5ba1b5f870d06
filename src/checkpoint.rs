//! Resumable training state: `<run_dir>/checkpoints/checkpoint-N/` holds every agent's weights
//! and AdamW state, the random stream's position, the pair order and the progress cursor.
//! Written into a temporary directory and renamed into place, so a checkpoint is whole or absent.
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::model::LoadedModel;
use crate::optim::AdamW;

/// Where training stands (`state.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    pub kind: String,
    /// Epochs completed.
    pub epoch: u64,
    /// Preference updates so far (drives the eval cadence).
    pub updates: u64,
    /// Word position of the training random stream (ChaCha8, seeded from the run seed).
    pub rng_word_pos: u128,
    /// Optimizer steps per agent.
    pub optimizer_steps: Vec<u64>,
    /// Updates skipped for a non-finite loss, per agent.
    pub skipped_nonfinite: Vec<u64>,
    /// The rounds the pairs came from, to refuse resuming on different data.
    pub rounds: Vec<u32>,
    pub num_pairs: usize,
}

pub fn checkpoints_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("checkpoints")
}

/// Existing checkpoints, oldest first: (N, path).
pub fn list(run_dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let dir = checkpoints_dir(run_dir);
    let mut out = Vec::new();
    if dir.is_dir() {
        for e in std::fs::read_dir(&dir)? {
            let e = e?;
            let name = e.file_name().to_string_lossy().to_string();
            if let Some(n) = name.strip_prefix("checkpoint-").and_then(|n| n.parse().ok()) {
                out.push((n, e.path()));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Write checkpoint `n`, then keep only the newest `limit`.
pub fn save(
    run_dir: &Path,
    n: u64,
    agents: &[&LoadedModel],
    optims: &[AdamW],
    progress: &Progress,
    limit: Option<usize>,
) -> Result<PathBuf> {
    let dir = checkpoints_dir(run_dir);
    std::fs::create_dir_all(&dir)?;
    let final_path = dir.join(format!("checkpoint-{n}"));
    let tmp = dir.join(format!(".checkpoint-{n}.tmp-{}", std::process::id()));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp)?;
    }
    std::fs::create_dir_all(&tmp)?;
    for (i, (agent, opt)) in agents.iter().zip(optims).enumerate() {
        agent.varmap.save(tmp.join(format!("agent_{i}.safetensors")))?;
        let mut state: HashMap<String, Tensor> = HashMap::new();
        for (name, m, v) in opt.moments()? {
            state.insert(format!("{name}.m"), m);
            state.insert(format!("{name}.v"), v);
        }
        candle_core::safetensors::save(&state, tmp.join(format!("adamw_{i}.safetensors")))?;
    }
    std::fs::write(tmp.join("state.json"), serde_json::to_vec_pretty(progress)?)?;
    if final_path.exists() {
        std::fs::remove_dir_all(&final_path)?;
    }
    std::fs::rename(&tmp, &final_path)?;
    if let Some(limit) = limit {
        let all = list(run_dir)?;
        for (_, old) in all.iter().take(all.len().saturating_sub(limit)) {
            std::fs::remove_dir_all(old).with_context(|| format!("pruning {}", old.display()))?;
        }
    }
    Ok(final_path)
}

/// Restore weights and optimizer state from a checkpoint; returns its progress.
pub fn restore(path: &Path, agents: &[&LoadedModel], optims: &mut [AdamW]) -> Result<Progress> {
    let progress: Progress = serde_json::from_slice(
        &std::fs::read(path.join("state.json")).with_context(|| format!("reading {}/state.json", path.display()))?,
    )
    .with_context(|| format!("{}/state.json is not a pbrl checkpoint state", path.display()))?;
    if progress.optimizer_steps.len() != agents.len() {
        bail!(
            "{}: a checkpoint of {} agents cannot resume a team of {}",
            path.display(),
            progress.optimizer_steps.len(),
            agents.len()
        );
    }
    for (i, (agent, opt)) in agents.iter().zip(optims.iter_mut()).enumerate() {
        let weights = candle_core::safetensors::load(path.join(format!("agent_{i}.safetensors")), &Device::Cpu)?;
        let data = agent.varmap.data().lock().expect("VarMap lock");
        for (name, var) in data.iter() {
            let t = weights.get(name).with_context(|| format!("{}: agent {i} has no weight {name}", path.display()))?;
            var.set(&t.to_device(var.device())?.to_dtype(var.dtype())?)?;
        }
        drop(data);
        let state = candle_core::safetensors::load(path.join(format!("adamw_{i}.safetensors")), &Device::Cpu)?;
        let mut moments = HashMap::new();
        for (k, m) in &state {
            if let Some(name) = k.strip_suffix(".m") {
                let v = state
                    .get(&format!("{name}.v"))
                    .with_context(|| format!("{}: no second moment for {name}", path.display()))?;
                moments.insert(name.to_string(), (m.clone(), v.clone()));
            }
        }
        opt.restore(progress.optimizer_steps[i], &moments)?;
    }
    Ok(progress)
}
