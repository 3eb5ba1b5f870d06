//! Resumable training state: `<run_dir>/checkpoints/checkpoint-N/` holds every agent's weights
//! and AdamW state, the random stream's position, the pair order and the progress cursor.
//! Written into a temporary directory and renamed into place, so a checkpoint is whole or absent.
//! Each carries the [`Fingerprint`] of its run, so `--resume` under a changed setup is refused;
//! a run that ends marks its newest checkpoint finished (`finished.json`), so a later `--resume` does
//! not quietly continue it, and a fresh run does not silently discard an unfinished one.
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};

use super::fingerprint::Fingerprint;
use pbrl_model::LoadedModel;

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
    /// The epochs the run that wrote this checkpoint was asked for.
    #[serde(default)]
    pub num_train_epochs: u64,
    /// What determined the run's result (config, rounds, starting weights).
    #[serde(default)]
    pub fingerprint: Fingerprint,
    /// The best periodic evaluation so far (with `keep_best`, its agents are in `best_agents/`).
    #[serde(default)]
    pub best: Option<EvalPoint>,
}

/// One periodic evaluation: before update `update + 1`, i.e. after `update` updates.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EvalPoint {
    pub update: u64,
    pub reward_mean: f64,
    pub reward_stderr: f64,
}

const FINISHED: &str = "finished.json";

/// How a training run ended: the epochs it was asked for and completed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finished {
    pub epochs: u64,
}

/// Mark the newest checkpoint as the last of a finished run (`finished.json` inside it).
pub fn mark_finished(run_dir: &Path, finished: &Finished) -> Result<()> {
    if let Some((_, newest)) = list(run_dir)?.pop() {
        super::atomic_write(&newest.join(FINISHED), &serde_json::to_vec_pretty(finished)?)?;
    }
    Ok(())
}

/// How the run the newest checkpoint belongs to ended, if it did.
pub fn finished(run_dir: &Path) -> Result<Option<Finished>> {
    let Some((_, newest)) = list(run_dir)?.pop() else { return Ok(None) };
    let p = newest.join(FINISHED);
    if !p.is_file() {
        return Ok(None);
    }
    let bytes = std::fs::read(&p).with_context(|| format!("reading {}", p.display()))?;
    Ok(Some(serde_json::from_slice(&bytes).with_context(|| format!("{}: not a pbrl finished marker", p.display()))?))
}

/// Before a fresh (not resumed) run: the checkpoints of a finished run are removed; those of an
/// unfinished one are kept and the run refused, so they are never lost to a forgotten --resume.
pub fn start_fresh(run_dir: &Path) -> Result<()> {
    let existing = list(run_dir)?;
    let Some((newest, _)) = existing.last() else { return Ok(()) };
    let dir = checkpoints_dir(run_dir);
    if finished(run_dir)?.is_none() {
        bail!(
            "{} holds checkpoint-{newest} of an unfinished training run; pass --resume to continue it, or remove \
             {} to start over",
            dir.display(),
            dir.display()
        );
    }
    std::fs::remove_dir_all(&dir).with_context(|| format!("removing the finished run's {}", dir.display()))?;
    Ok(())
}

/// The progress stored in a checkpoint.
pub fn read_progress(path: &Path) -> Result<Progress> {
    let state = path.join("state.json");
    serde_json::from_slice(&std::fs::read(&state).with_context(|| format!("reading {}", state.display()))?)
        .with_context(|| format!("{} is not a pbrl checkpoint state", state.display()))
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

/// What a checkpoint keeps of an optimizer (AdamW's, `train::optim`): its step count and each
/// parameter's moments by name.
pub trait OptimizerState {
    /// (name, first moment, second moment) of every parameter.
    fn moments(&self) -> Result<Vec<(String, Tensor, Tensor)>>;
    /// Put back the step count and the moments (matched by name).
    fn restore(&mut self, step: u64, moments: &HashMap<String, (Tensor, Tensor)>) -> Result<()>;
}

/// Write checkpoint `n`, then keep only the newest `limit`.
pub fn save(
    run_dir: &Path,
    n: u64,
    agents: &[&LoadedModel],
    optims: &[impl OptimizerState],
    progress: &Progress,
    limit: Option<usize>,
) -> Result<PathBuf> {
    let dir = checkpoints_dir(run_dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let final_path = dir.join(format!("checkpoint-{n}"));
    let tmp = dir.join(format!(".checkpoint-{n}.tmp-{}", std::process::id()));
    let write = || -> Result<()> {
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp)?;
        }
        std::fs::create_dir_all(&tmp)?;
        for (i, (agent, opt)) in agents.iter().zip(optims).enumerate() {
            let weights = tmp.join(format!("agent_{i}.safetensors"));
            agent.varmap.save(&weights).with_context(|| format!("writing {}", weights.display()))?;
            let mut state: HashMap<String, Tensor> = HashMap::new();
            for (name, m, v) in opt.moments()? {
                state.insert(format!("{name}.m"), m);
                state.insert(format!("{name}.v"), v);
            }
            let adam = tmp.join(format!("adamw_{i}.safetensors"));
            candle_core::safetensors::save(&state, &adam).with_context(|| format!("writing {}", adam.display()))?;
        }
        let state = tmp.join("state.json");
        std::fs::write(&state, serde_json::to_vec_pretty(progress)?)
            .with_context(|| format!("writing {}", state.display()))?;
        if final_path.exists() {
            std::fs::remove_dir_all(&final_path).with_context(|| format!("replacing {}", final_path.display()))?;
        }
        std::fs::rename(&tmp, &final_path).with_context(|| format!("renaming into {}", final_path.display()))?;
        Ok(())
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e.context(format!("saving checkpoint-{n}")));
    }
    if let Some(limit) = limit {
        let all = list(run_dir)?;
        for (_, old) in all.iter().take(all.len().saturating_sub(limit)) {
            std::fs::remove_dir_all(old).with_context(|| format!("pruning {}", old.display()))?;
        }
    }
    Ok(final_path)
}

/// Restore weights and optimizer state from a checkpoint; returns its progress.
pub fn restore(path: &Path, agents: &[&LoadedModel], optims: &mut [impl OptimizerState]) -> Result<Progress> {
    let progress = read_progress(path)?;
    if progress.optimizer_steps.len() != agents.len() {
        bail!(
            "{}: a checkpoint of {} agents cannot resume a team of {}",
            path.display(),
            progress.optimizer_steps.len(),
            agents.len()
        );
    }
    for (i, (agent, opt)) in agents.iter().zip(optims.iter_mut()).enumerate() {
        let file = path.join(format!("agent_{i}.safetensors"));
        let weights = candle_core::safetensors::load(&file, &Device::Cpu)
            .with_context(|| format!("reading {}", file.display()))?;
        let data = agent.varmap.data().lock().expect("VarMap lock");
        for (name, var) in data.iter() {
            let t = weights.get(name).with_context(|| format!("{}: agent {i} has no weight {name}", path.display()))?;
            var.set(&t.to_device(var.device())?.to_dtype(var.dtype())?)?;
        }
        drop(data);
        let file = path.join(format!("adamw_{i}.safetensors"));
        let state = candle_core::safetensors::load(&file, &Device::Cpu)
            .with_context(|| format!("reading {}", file.display()))?;
        let mut moments = HashMap::new();
        for (k, m) in &state {
            if let Some(name) = k.strip_suffix(".m") {
                let v = state
                    .get(&format!("{name}.v"))
                    .with_context(|| format!("{}: no second moment for {name}", path.display()))?;
                moments.insert(name.to_string(), (m.clone(), v.clone()));
            }
        }
        opt.restore(progress.optimizer_steps[i], &moments)
            .with_context(|| format!("{}: agent {i}'s AdamW state", file.display()))?;
    }
    Ok(progress)
}

/// The newest checkpoint's state, refused when it was written under another setup or belongs to
/// a run that finished (unless more epochs are asked for, which extends it).
pub fn resume(
    state_dir: &Path,
    models: &[&LoadedModel],
    optims: &mut [impl OptimizerState],
    now: Progress,
) -> Result<Progress> {
    let (num, path) = list(state_dir)?
        .pop()
        .with_context(|| format!("--resume: no checkpoint in {}", checkpoints_dir(state_dir).display()))?;
    let saved = read_progress(&path)?;
    let finished = finished(state_dir)?;
    if let Some(f) = &finished {
        if now.num_train_epochs <= f.epochs {
            bail!(
                "--resume: the training run in {} finished ({} epochs), so there is nothing to resume; train without \
                 --resume to start over, or raise the number of epochs to extend it",
                state_dir.display(),
                f.epochs
            );
        }
    }
    let changed = saved.fingerprint.differences(&now.fingerprint);
    if !changed.is_empty() {
        bail!(
            "--resume: checkpoint-{num} was written under a different setup ({}); train without --resume to start over",
            changed.join("; ")
        );
    }
    let mut progress = restore(&path, models, optims)?;
    if progress.rounds != now.rounds || progress.num_pairs != now.num_pairs {
        bail!(
            "checkpoint-{num} was trained on rounds {:?} ({} pairs), not on the selected rounds {:?} ({} pairs)",
            progress.rounds,
            progress.num_pairs,
            now.rounds,
            now.num_pairs
        );
    }
    (progress.fingerprint, progress.num_train_epochs) = (now.fingerprint, now.num_train_epochs);
    if let Some(f) = finished {
        println!("extending the finished {}-epoch run to {} epochs", f.epochs, progress.num_train_epochs);
    }
    println!("resuming from checkpoint-{num} after epoch {}", progress.epoch);
    Ok(progress)
}
