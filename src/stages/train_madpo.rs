//! `pbrl train-madpo`: train the agents on stored preference rounds with Multi-Agent DPO
//! (reference §6), reference-free.
//!
//! 1. select the training pairs from the round files with the replay rules (default: the
//!    newest round) and re-tokenize them from their stored text;
//! 2. load the team and open a training session on it (`train::session`: one AdamW per agent,
//!    PyTorch defaults, lr `agent_learning_rate`; `--resume` restores the newest checkpoint);
//! 3. per batch of `train_batch_size` pairs (the session shuffles, evaluates every
//!    `eval_interval` updates, checkpoints every `checkpoint_interval` epochs): compute every
//!    agent's margins, all before any update (their values are the others' fixed margins);
//!    then for each agent in order: its loss against the others' fixed margins, backward,
//!    AdamW step (a non-finite loss skips the step);
//! 4. save the agents, whole, to `<run_dir>/agents/`.
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use serde_json::json;

use crate::algo::madpo::{accuracy, joint_margins, other_margins};
use crate::algo::madpo_batch::{agent_objective, agent_rows, batch_margins, margin_values, scorer};
use crate::config::Config;
use crate::model::scoring::LastToken;
use crate::prefs::replay::training_pairs;
use crate::prefs::{round_path, PreferencePair};
use crate::run::RunDir;
use crate::team::collab::Collaboration;
use crate::team::{load_team, Agent};
use crate::train::session::{Session, TrainingData};

pub struct TrainOptions {
    pub resume: bool,
}

pub struct TrainReport {
    pub updates: u64,
    pub num_pairs: usize,
}

/// Refuse, before training, a pair whose re-tokenized prompt and completion do not fit an actor's
/// context.
fn check_pairs_fit(team: &[Agent], pairs: &[PreferencePair], max_new_tokens: usize, last: LastToken) -> Result<()> {
    for agent in team {
        let context = agent.model.model.config.context_length();
        for (p, pair) in pairs.iter().enumerate() {
            for row in agent_rows(&agent.model.tokenizer, agent.index, &[pair], max_new_tokens, last)? {
                let n = row.prompt.len() + row.completion.len();
                if n > context {
                    bail!(
                        "training pair {p}: actor {}'s prompt and completion are {n} tokens, beyond the context \
                         of `{}` ({context})",
                        agent.index,
                        agent.model.source
                    );
                }
            }
        }
    }
    Ok(())
}

pub fn run(cfg: &Config, run_dir: &RunDir, opts: &TrainOptions) -> Result<TrainReport> {
    let (pairs, rounds) = training_pairs(&cfg.replay_dir(), cfg.seed, cfg.replay_mode(), cfg.replay_sample_size())?;
    if pairs.is_empty() {
        println!("no non-tied preference pairs in the selected rounds; the agents are unchanged");
        return Ok(TrainReport { updates: 0, num_pairs: 0 });
    }
    let n = cfg.num_actors();
    if let Some(bad) = pairs.iter().position(|p| p.prompts.len() != n) {
        bail!(
            "pair {bad} has {} actors' prompts but this team has {n} (num_agents {}, collaboration_mode {})",
            pairs[bad].prompts.len(),
            cfg.num_agents,
            cfg.collaboration_mode
        );
    }
    let team = load_team(cfg, run_dir)?;
    let last = scorer(Collaboration::from_config(cfg).is_centralized(), cfg.score_last_token);
    let max_new = cfg.max_new_tokens as usize;
    check_pairs_fit(&team, &pairs, max_new, last)?;
    let dir = cfg.replay_dir();
    let files: Vec<(u32, PathBuf)> = rounds.iter().map(|&r| (r, round_path(&dir, r))).collect();
    let files: Vec<(u32, &Path)> = files.iter().map(|(r, p)| (*r, p.as_path())).collect();
    let data = TrainingData { rounds: &files, num_examples: pairs.len() };
    let mut session = Session::open(cfg, run_dir, "train-madpo", &team, data, cfg.agent_learning_rate, opts.resume)?;
    let models = session.models();
    let started = std::time::Instant::now();

    session.run(pairs.len(), cfg.pairs_per_update(), |step, chunk, metrics| {
        let batch: Vec<&PreferencePair> = chunk.iter().map(|&i| &pairs[i]).collect();
        let rows = team
            .iter()
            .map(|a| agent_rows(&a.model.tokenizer, a.index, &batch, max_new, last))
            .collect::<Result<Vec<_>>>()?;
        *step.tokens += rows.iter().flatten().map(|r| r.prompt.len() + r.completion.len()).sum::<usize>();
        // One graph per actor, all before any update; actor i's is dropped after its backward.
        let margins = batch_margins(&models, &rows, last)?;
        let fixed = margin_values(&margins)?;
        let others = other_margins(&fixed);
        let mut losses = Vec::with_capacity(n);
        for (i, margins) in margins.into_iter().enumerate() {
            let loss = agent_objective(&margins, &others[i], cfg.dpo_beta)?;
            if let Some((value, grad_norm)) = step.apply(i, loss, || drop(margins))? {
                metrics[format!("madpo/grad_norm/agent_{i}")] = json!(grad_norm);
                losses.push(value);
            }
        }
        let joint = joint_margins(&fixed);
        let collected = batch.iter().map(|p| p.candidate_reward_mean).sum::<f64>() / batch.len() as f64;
        metrics["madpo/loss"] = json!(losses.iter().sum::<f64>() / losses.len().max(1) as f64);
        metrics["madpo/accuracy"] = json!(accuracy(&fixed));
        metrics["madpo/joint_margin_mean"] = json!(joint.iter().sum::<f64>() / joint.len() as f64);
        metrics["madpo/skipped_nonfinite"] = json!(step.progress.skipped_nonfinite.iter().sum::<u64>());
        metrics["turn_1/reward_mean"] = json!(collected);
        metrics["turn_1/expected_return"] = json!(collected);
        Ok(())
    })?;
    let progress = session.finish()?;
    println!(
        "trained {n} agents on {} pairs from rounds {rounds:?}: {} updates in {:.1} s; agents saved in {}",
        pairs.len(),
        progress.updates,
        started.elapsed().as_secs_f64(),
        run_dir.agents().display()
    );
    Ok(TrainReport { updates: progress.updates, num_pairs: pairs.len() })
}
