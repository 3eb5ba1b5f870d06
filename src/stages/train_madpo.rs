//! `pbrl train-madpo`: train the agents on stored preference rounds with Multi-Agent DPO
//! (reference §6), reference-free.
//!
//! 1. select the training pairs from the round files with the replay rules (default: the
//!    newest round) and re-tokenize them from their stored text;
//! 2. load the team and one AdamW per agent (PyTorch defaults, lr `agent_learning_rate`);
//!    with `--resume`, restore the newest checkpoint;
//! 3. per epoch, shuffle the pairs (seeded); per batch of `train_batch_size` pairs:
//!    evaluate when `updates % eval_interval == 0`; compute every agent's margins, all before
//!    any update (their values are the others' fixed margins); then for each agent in order:
//!    its loss against the others' fixed margins, backward, AdamW step (a non-finite loss
//!    skips the step);
//! 4. checkpoint every `checkpoint_interval` epochs; save the agents to `<run_dir>/agents/`.
use anyhow::{bail, Context, Result};
use candle_core::DType;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::json;

use crate::algo::madpo::{accuracy, joint_margins, other_margins};
use crate::algo::madpo_batch::{agent_objective, agent_rows, batch_margins, margin_values, scorer};
use crate::config::Config;
use crate::model::scoring::LastToken;
use crate::team::collab::Collaboration;
use crate::team::{check_fits, load_team, Agent};

use crate::evaluation::{eval_items, evaluate};
use crate::optim::{AdamW, AdamWConfig};
use crate::prefs::replay::training_pairs;
use crate::prefs::{round_path, PreferencePair};
use crate::progress;
use crate::rng::{derive_seed, purpose};
use crate::run::checkpoint::{self, Progress};
use crate::run::fingerprint::Fingerprint;
use crate::run::team::save_team;
use crate::run::RunDir;
use crate::task::reward::build_reward;

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
    check_pairs_fit(&team, &pairs, cfg.max_new_tokens as usize, last)?;
    let adam = AdamWConfig::torch_defaults(cfg.agent_learning_rate);
    let mut optims = team
        .iter()
        .map(|a| {
            let i = a.index;
            let params = a
                .model
                .varmap
                .data()
                .lock()
                .expect("VarMap lock")
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            AdamW::new(params, adam).with_context(|| format!("agent {i}: allocating the AdamW state"))
        })
        .collect::<Result<Vec<_>>>()?;
    let models: Vec<_> = team.iter().map(|a| &a.model).collect();
    let train_seed = derive_seed(cfg.seed, &[purpose::TRAIN]);
    let mut rng = ChaCha8Rng::seed_from_u64(train_seed);
    let mut progress = Progress {
        kind: "madpo".into(),
        epoch: 0,
        updates: 0,
        rng_word_pos: 0,
        optimizer_steps: vec![0; n],
        skipped_nonfinite: vec![0; n],
        rounds: rounds.clone(),
        num_pairs: pairs.len(),
        num_train_epochs: 0,
        fingerprint: Default::default(),
    };
    let dir = cfg.replay_dir();
    let round_files: Vec<(u32, std::path::PathBuf)> = rounds.iter().map(|&r| (r, round_path(&dir, r))).collect();
    let round_refs: Vec<(u32, &std::path::Path)> = round_files.iter().map(|(r, p)| (*r, p.as_path())).collect();
    // The configured sources, not the team as loaded: resuming restores every weight from the
    // checkpoint, and a run that finished has replaced the team it started from.
    progress.fingerprint = Fingerprint::of_training(cfg, &round_refs, &cfg.agent_sources()?)?;
    progress.num_train_epochs = cfg.num_train_epochs as u64;
    if opts.resume {
        let (num, path) = checkpoint::list(&run_dir.root)?.pop().with_context(|| {
            format!("--resume: no checkpoint in {}", checkpoint::checkpoints_dir(&run_dir.root).display())
        })?;
        let saved = checkpoint::read_progress(&path)?;
        let finished = checkpoint::finished(&run_dir.root)?;
        if let Some(f) = &finished {
            if progress.num_train_epochs <= f.epochs {
                bail!(
                    "--resume: the training run in {} finished ({} epochs), so there is nothing to resume; train \
                     without --resume to start over, or raise num_train_epochs to extend it",
                    run_dir.root.display(),
                    f.epochs
                );
            }
        }
        let changed = saved.fingerprint.differences(&progress.fingerprint);
        if !changed.is_empty() {
            bail!(
                "--resume: checkpoint-{num} was written under a different setup ({}); train without --resume to start \
                 over",
                changed.join("; ")
            );
        }
        let extending = finished.map(|f| f.epochs);
        let (fingerprint, target) = (progress.fingerprint.clone(), progress.num_train_epochs);
        progress = checkpoint::restore(&path, &models, &mut optims)?;
        if progress.rounds != rounds || progress.num_pairs != pairs.len() {
            bail!(
                "checkpoint-{num} was trained on rounds {:?} ({} pairs), not on the selected rounds {:?} ({} pairs)",
                progress.rounds,
                progress.num_pairs,
                rounds,
                pairs.len()
            );
        }
        (progress.fingerprint, progress.num_train_epochs) = (fingerprint, target);
        rng.set_word_pos(progress.rng_word_pos);
        if let Some(done) = extending {
            println!("extending the finished {done}-epoch run to {target} epochs");
        }
        println!("resuming from checkpoint-{num} after epoch {}", progress.epoch);
    } else {
        checkpoint::start_fresh(&run_dir.root)?;
    }
    let eval_set = if cfg.eval_interval > 0 { eval_items(cfg)? } else { None };
    if let Some(items) = &eval_set {
        check_fits(&team, items, cfg.max_new_tokens as usize, cfg.eval_rows(), "eval")?;
    }
    let mut eval_reward = match &eval_set {
        Some(_) => Some(build_reward(&cfg.reward, cfg.reward_timeout_s)?),
        None => None,
    };

    let per_update = cfg.pairs_per_update();
    let epochs = cfg.num_train_epochs as u64;
    let batches_per_epoch = pairs.len().div_ceil(per_update) as u64;
    let bar = progress::bar((epochs - progress.epoch.min(epochs)) * batches_per_epoch, "madpo");
    let started = std::time::Instant::now();
    let first_update = progress.updates;
    let mut tokens = 0usize; // tokens of every actor's rows, for tokens/s
    for epoch in progress.epoch..epochs {
        let mut order: Vec<usize> = (0..pairs.len()).collect();
        order.shuffle(&mut rng);
        for chunk in order.chunks(per_update) {
            if let (Some(items), Some((reward, processor))) = (&eval_set, eval_reward.as_mut()) {
                if progress.updates.is_multiple_of(cfg.eval_interval as u64) {
                    let ev = evaluate(cfg, &team, items, reward.as_mut(), *processor)?;
                    let mean = ev.reward_mean();
                    run_dir.log_metrics(&json!({"stage": "train-madpo", "update": progress.updates,
                        "eval/turn_1/reward_mean": mean, "eval/turn_1/expected_return": mean,
                        "eval/turn_1/reward_stderr": ev.reward_stderr}))?;
                }
            }
            let batch: Vec<&PreferencePair> = chunk.iter().map(|&i| &pairs[i]).collect();
            let max_new = cfg.max_new_tokens as usize;
            let rows = team
                .iter()
                .map(|a| agent_rows(&a.model.tokenizer, a.index, &batch, max_new, last))
                .collect::<Result<Vec<_>>>()?;
            tokens += rows.iter().flatten().map(|r| r.prompt.len() + r.completion.len()).sum::<usize>();
            // One graph per actor, all before any update; actor i's is dropped after its backward.
            let margins = batch_margins(&models, &rows, last)?;
            let fixed = margin_values(&margins)?;
            let others = other_margins(&fixed);
            let mut losses = Vec::with_capacity(n);
            let mut metrics = json!({"stage": "train-madpo", "epoch": epoch + 1, "update": progress.updates + 1});
            for (i, margins) in margins.into_iter().enumerate() {
                let loss = agent_objective(&margins, &others[i], cfg.dpo_beta)?;
                let value = loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
                if !value.is_finite() {
                    tracing::warn!(agent = i, update = progress.updates, "non-finite MADPO loss; update skipped");
                    progress.skipped_nonfinite[i] += 1;
                    continue;
                }
                let grads = loss.backward().with_context(|| format!("agent {i}: backward pass"))?;
                drop((loss, margins)); // free the activations before the optimizer touches its moments
                let grad_norm = optims[i].step(&grads).with_context(|| format!("agent {i}: AdamW update"))?;
                progress.optimizer_steps[i] = optims[i].step;
                metrics[format!("madpo/grad_norm/agent_{i}")] = json!(grad_norm);
                losses.push(value);
            }
            progress.updates += 1;
            let joint = joint_margins(&fixed);
            let collected = batch.iter().map(|p| p.candidate_reward_mean).sum::<f64>() / batch.len() as f64;
            let loss_mean = losses.iter().sum::<f64>() / losses.len().max(1) as f64;
            metrics["madpo/loss"] = json!(loss_mean);
            metrics["madpo/accuracy"] = json!(accuracy(&fixed));
            metrics["madpo/joint_margin_mean"] = json!(joint.iter().sum::<f64>() / joint.len() as f64);
            metrics["madpo/skipped_nonfinite"] = json!(progress.skipped_nonfinite.iter().sum::<u64>());
            metrics["turn_1/reward_mean"] = json!(collected);
            metrics["turn_1/expected_return"] = json!(collected);
            let secs = started.elapsed().as_secs_f64();
            metrics["pairs_per_s"] = json!((progress.updates - first_update) as f64 * per_update as f64 / secs);
            metrics["tokens_per_s"] = json!(tokens as f64 / secs);
            run_dir.log_metrics(&metrics)?;
            bar.set_message(format!("loss {loss_mean:.4}"));
            bar.inc(1);
        }
        progress.epoch = epoch + 1;
        progress.rng_word_pos = rng.get_word_pos();
        if cfg.checkpoint_interval > 0 && progress.epoch.is_multiple_of(cfg.checkpoint_interval as u64) {
            let limit = cfg.checkpoint_total_limit.map(|l| l as usize);
            checkpoint::save(&run_dir.root, progress.epoch, &models, &optims, &progress, limit)?;
        }
    }
    bar.finish_and_clear();
    save_team(run_dir, &models, &cfg.sampling())?;
    checkpoint::mark_finished(&run_dir.root, &checkpoint::Finished { epochs: progress.epoch })?;
    println!(
        "trained {n} agents on {} pairs from rounds {rounds:?}: {} updates in {:.1} s; agents saved in {}",
        pairs.len(),
        progress.updates,
        started.elapsed().as_secs_f64(),
        run_dir.agents().display()
    );
    Ok(TrainReport { updates: progress.updates, num_pairs: pairs.len() })
}
