//! The trained team in `<run_dir>/agents/`, saved all-or-nothing: every agent is written into a
//! temporary `.agents.tmp-PID/` with a `team.json` manifest, which then takes the place of
//! `agents/` in one atomic exchange (`renameat2(RENAME_EXCHANGE)`), so a kill at any moment
//! leaves the old team or the new one, never a mix. A command that expects trained agents and
//! finds `agents/` without a manifest, or not matching it, says so instead of filling the gap
//! with base models.
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use super::RunDir;
use pbrl_model::{LoadedModel, SamplingParams};

pub const MANIFEST: &str = "team.json";

#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct TeamManifest {
    pub num_actors: usize,
    pub agents: Vec<String>,
}

/// Refuse weights that are not all finite: a NaN model (`what`: "agent 0", "the reward model")
/// is never saved.
pub fn check_finite(what: &str, m: &LoadedModel) -> Result<()> {
    if let Some(name) = m.first_non_finite_weight()? {
        bail!("{what}: weight `{name}` has non-finite values; nothing was saved (what was saved before is kept)");
    }
    Ok(())
}

/// Refuse a model just loaded (`what`: where it came from) with a NaN or infinite weight: it
/// would sample or score something, and every number after it would be wrong.
pub fn refuse_non_finite(what: &str, m: &LoadedModel) -> Result<()> {
    if let Some(name) = m.first_non_finite_weight()? {
        bail!("{what}: weight `{name}` has non-finite values (NaN or infinite); refusing to use it");
    }
    Ok(())
}

/// Save every actor as `agents/agent_i` (Hugging Face directories with the run's sampling
/// settings), all or nothing.
pub fn save_team(run: &RunDir, models: &[&LoadedModel], sampling: &[SamplingParams]) -> Result<()> {
    save_team_to(&run.agents(), models, sampling, None)
}

/// [`save_team`] into any directory (keep-best's `best_agents/`), with an optional extra file
/// `(name, bytes)` written with the team, in the same exchange.
pub fn save_team_to(
    target: &Path,
    models: &[&LoadedModel],
    sampling: &[SamplingParams],
    extra: Option<(&str, &[u8])>,
) -> Result<()> {
    for (i, m) in models.iter().enumerate() {
        check_finite(&format!("agent {i}"), m)?;
    }
    super::atomic::install_dir(target, |tmp| {
        let mut names = Vec::new();
        for (i, m) in models.iter().enumerate() {
            let name = format!("agent_{i}");
            m.save_hf_dir(&tmp.join(&name), Some(&sampling[i])).with_context(|| format!("saving agent {i}"))?;
            names.push(name);
        }
        if let Some((name, bytes)) = extra {
            super::atomic_write(&tmp.join(name), bytes)?;
        }
        let manifest = TeamManifest { num_actors: models.len(), agents: names };
        super::atomic_write(&tmp.join(MANIFEST), &serde_json::to_vec_pretty(&manifest)?)
    })
}

/// The LoRA team saved in `run`'s `agents/`, each agent merged into its base
/// ([`LoadedModel::merged`]), saved whole in `agents_merged/`, all or nothing.
pub fn save_merged_team(run: &RunDir, sampling: &[SamplingParams]) -> Result<()> {
    let dirs = saved_team(&run.agents(), sampling.len())?
        .with_context(|| format!("{} holds no saved team to merge", run.agents().display()))?;
    let merged = dirs
        .iter()
        .enumerate()
        .map(|(i, dir)| {
            let agent = LoadedModel::load(&dir.display().to_string(), &candle_core::Device::Cpu)?;
            agent.merged().with_context(|| format!("merging agent {i}"))
        })
        .collect::<Result<Vec<_>>>()?;
    save_team_to(&run.agents_merged(), &merged.iter().collect::<Vec<_>>(), sampling, None)
}

/// Put a copy of the saved team in `from` (a whole one: it has its manifest) at `target`, all or
/// nothing: keep-best's best agents becoming the run's `agents/`.
pub fn copy_team(from: &Path, target: &Path) -> Result<()> {
    if !from.join(MANIFEST).is_file() {
        bail!("{} holds no saved team ({MANIFEST} is missing)", from.display());
    }
    super::atomic::install_dir(target, |tmp| copy_dir(from, tmp))
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
    for e in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let e = e?;
        let dst = to.join(e.file_name());
        if e.file_type()?.is_dir() {
            copy_dir(&e.path(), &dst)?;
        } else {
            std::fs::copy(e.path(), &dst)
                .with_context(|| format!("copying {} to {}", e.path().display(), dst.display()))?;
        }
    }
    Ok(())
}

/// The team saved in `dir` (a run's `agents/`): `None` when there is none, the agent
/// directories when it holds a complete one of `n` actors, an error for anything else (a
/// partial or mixed team).
pub fn saved_team(dir: &Path, n: usize) -> Result<Option<Vec<PathBuf>>> {
    if !dir.exists() {
        return Ok(None);
    }
    let manifest_path = dir.join(MANIFEST);
    if !manifest_path.is_file() {
        bail!(
            "{} has no {MANIFEST}: a partial or foreign team (pbrl saves teams whole); remove the directory to start \
             from the base models, or train again",
            dir.display()
        );
    }
    let manifest: TeamManifest = serde_json::from_slice(
        &std::fs::read(&manifest_path).with_context(|| format!("reading {}", manifest_path.display()))?,
    )
    .with_context(|| format!("{}: not a pbrl team manifest", manifest_path.display()))?;
    if manifest.num_actors != n {
        bail!("{} holds a team of {} actors but this config has {n}", dir.display(), manifest.num_actors);
    }
    if manifest.agents.len() != n {
        bail!(
            "{}: the team manifest lists {} agents for a team of {n}",
            manifest_path.display(),
            manifest.agents.len()
        );
    }
    // Each agent is a plain subdirectory of the team's: no absolute path, no `..`, no link out.
    let plain = |a: &str| {
        let p = Path::new(a);
        p.components().count() == 1 && matches!(p.components().next(), Some(std::path::Component::Normal(_)))
    };
    if let Some(bad) = manifest.agents.iter().find(|a| !plain(a) || dir.join(a).is_symlink()) {
        bail!("{}: agent `{bad}` is not a subdirectory of the team directory", manifest_path.display());
    }
    let paths: Vec<PathBuf> = manifest.agents.iter().map(|a| dir.join(a)).collect();
    let whole = |p: &PathBuf| p.join("config.json").is_file() || p.join(pbrl_model::lora::ADAPTER_CONFIG).is_file();
    if let Some(missing) = paths.iter().find(|p| !whole(p)) {
        bail!("{}: the team manifest lists {} but it is missing or incomplete", dir.display(), missing.display());
    }
    Ok(Some(paths))
}

/// Put back the team iterate's round `round` starts from: the previous round's snapshot, or for
/// round 1 (or when nothing was trained before) the base models (an `agents/` left by a
/// training cut short is removed).
pub fn restore_round_input(run: &RunDir, round: u32, num_actors: usize) -> Result<()> {
    if round > 1 {
        let previous = run.policy_snapshot(round as usize - 2);
        if saved_team(&previous, num_actors)?.is_some() {
            return copy_team(&previous, &run.agents());
        }
        // No team was trained before that round (no pairs yet): it starts from the base models.
    }
    if run.agents().exists() {
        std::fs::remove_dir_all(run.agents())
            .with_context(|| format!("removing {} of the interrupted round 1", run.agents().display()))?;
    }
    Ok(())
}

/// Keep the team as `policy_checkpoints/iteration_{round−1}`, and only the snapshots a later
/// round can still need: this round's input until its summary is written (a resume repeats the
/// round from it), and the last `history_k` for a `history` comparator.
pub fn snapshot_round_team(run: &RunDir, round: u32, num_actors: usize, history_k: Option<usize>) -> Result<()> {
    let label = round as usize - 1;
    if saved_team(&run.agents(), num_actors)?.is_none() {
        return Ok(()); // nothing trained yet: the base models are the snapshot
    }
    copy_team(&run.agents(), &run.policy_snapshot(label))?;
    let mut keep_from = label.saturating_sub(1);
    if let Some(k) = history_k {
        keep_from = keep_from.min((label + 1).saturating_sub(k));
    }
    let root = run.policy_checkpoints();
    for e in std::fs::read_dir(&root).with_context(|| format!("reading {}", root.display()))? {
        let name = e?.file_name().to_string_lossy().to_string();
        let Some(j) = name.strip_prefix("iteration_").and_then(|n| n.parse::<usize>().ok()) else { continue };
        if j < keep_from {
            std::fs::remove_dir_all(root.join(&name))
                .with_context(|| format!("pruning {}", root.join(&name).display()))?;
        }
    }
    Ok(())
}
