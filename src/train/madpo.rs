//! Training the agents on stored preference rounds with Multi-Agent DPO (reference §6):
//! reference-free as the reference, or anchored to a frozen reference policy (`madpo_reference`,
//! pbrl's own). `pbrl train-madpo` and `iterate`'s MADPO rounds run it.
//!
//! 1. select the training pairs from the round files with the replay rules (default: the
//!    newest round) and re-tokenize them from their stored text (a multi-turn pair: one row per
//!    turn and side, each agent's turns' log-probs summed into its history's);
//! 2. load the team and open a training session on it (`train::session`: one AdamW per agent,
//!    PyTorch defaults, lr `agent_learning_rate`; `--resume` restores the newest checkpoint);
//! 3. anchored (or `madpo_log_kl`): score every pair once under the reference policy, without
//!    gradients (the agents as training starts, or `reference_model_name`), and store the
//!    log-probs in `<run_dir>/madpo_reference.json` (a resumed run reads them back);
//! 4. per batch of `train_batch_size` pairs (the session shuffles, evaluates every
//!    `eval_interval` updates, checkpoints every `checkpoint_interval` epochs): compute every
//!    agent's margins, all before any update (their values are the others' fixed margins);
//!    then for each agent in order: its loss against the others' fixed margins, backward,
//!    AdamW step (a non-finite loss skips the step); log the loss and the drift diagnostics;
//! 5. save the agents (with `keep_best`, the best evaluation's), whole, to `<run_dir>/agents/`.
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::algo::madpo::{accuracy, joint_margins, other_margins};
use crate::config::MadpoConfig;
use crate::prefs::replay::training_pairs;
use crate::prefs::{check_actors, check_turns, round_path, PreferencePair};
use crate::run::fingerprint::Fingerprint;
use crate::run::RunDir;
use crate::team::{load_reference_team, load_training_team, Agent};
use crate::train::madpo_batch::{
    agent_objective, agent_rows, batch_scores, fold_turns, margin_values, margins, scorer, ActorScores, SeqLogProb,
};
use crate::train::session::{Session, SessionSetup, TrainingData, TrainingSummary};
use pbrl_model::scoring::{scored_tokens, LastToken, ScoreRow};
use pbrl_model::Mode;

pub struct TrainOptions {
    pub resume: bool,
}

pub struct TrainReport {
    pub num_agents: usize,
    /// The pairs trained on, from the rounds.
    pub num_pairs: usize,
    pub rounds: Vec<u32>,
    pub summary: TrainingSummary,
    pub secs: f64,
    pub saved_in: PathBuf,
}

impl TrainReport {
    /// What the training did, as `pbrl train-madpo` prints it.
    pub fn describe(&self) -> String {
        let what = format!("{} agents on {} pairs from rounds {:?}", self.num_agents, self.num_pairs, self.rounds);
        self.summary.describe(&what, self.secs, &self.saved_in)
    }
}

/// Refuse, before training, a pair whose re-tokenized prompt and completion do not fit an actor's
/// context, and an update whose logits could not be held: `pairs_per_update` pairs are 2 rows
/// each per actor, and the logits of their scored tokens and the logits' gradient alone (f32, a
/// vocabulary-wide row per scored token) need at least that much for the longest such rows; the
/// rest of the step needs more.
fn check_pairs_fit(
    team: &[Agent],
    pairs: &[PreferencePair],
    max_new_tokens: &[usize],
    last: LastToken,
    pairs_per_update: usize,
) -> Result<()> {
    for agent in team {
        let max_new_tokens = max_new_tokens[agent.index];
        let context = agent.model.model.config.context_length();
        let mut lengths = Vec::with_capacity(2 * pairs.len());
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
                lengths.push(scored_tokens(&row, last));
            }
        }
        // The largest update: the longest 2 rows per pair (2 per turn of a multi-turn pair).
        let turns = pairs.first().map_or(1, PreferencePair::turns);
        let tokens = crate::device::sum_of_largest(lengths, pairs_per_update.saturating_mul(2 * turns));
        let need = agent.model.model.config.logit_and_grad_bytes(tokens);
        crate::device::ensure_fits(&agent.device, need, |need, free| {
            format!(
                "train_batch_size: an update of {pairs_per_update} pairs scores up to {tokens} tokens of actor {}, \
                 whose logits and their gradient alone need {need} MiB, more than the {free} MiB of memory available; \
                 lower train_batch_size",
                agent.index
            )
        })?;
    }
    Ok(())
}

/// Train the team on the replay selection and save it in `agents/`; `None` when the selected
/// rounds hold no pairs (the agents are unchanged).
pub fn train(cfg: &MadpoConfig, run_dir: &RunDir, opts: &TrainOptions) -> Result<Option<TrainReport>> {
    let (pairs, rounds) = training_pairs(run_dir.replay(), &cfg.replay)?;
    if pairs.is_empty() {
        return Ok(None);
    }
    let n = cfg.team.num_actors;
    check_actors(&pairs, n, &cfg.team_setup)?;
    check_turns(&pairs, cfg.num_turns)?;
    let team = load_training_team(&cfg.team, run_dir)?;
    let last = scorer(cfg.team.centralized, cfg.score_last_token);
    let max_new = &cfg.max_new_tokens;
    check_pairs_fit(&team, &pairs, max_new, last, cfg.pairs_per_update)?;
    let dir = run_dir.replay().to_path_buf();
    let files: Vec<(u32, PathBuf)> = rounds.iter().map(|&r| (r, round_path(&dir, r))).collect();
    let files: Vec<(u32, &Path)> = files.iter().map(|(r, p)| (*r, p.as_path())).collect();
    let data = TrainingData { rounds: &files, num_examples: pairs.len() };
    // The configured sources, not the team as loaded: resuming restores every weight from the
    // checkpoint, and a run that finished has replaced the team it started from.
    let setup = SessionSetup::of(&cfg.training, data.rounds, &cfg.team.sources, Some(&team))?;
    let mut session = Session::open(setup, run_dir, "train-madpo", &team, data, cfg.learning_rate, opts.resume)?;
    let models = session.models();
    // The reference log-probs, [actor][pair]: computed before the first update of a fresh run,
    // so "the agents as training starts" are the weights just loaded; read back on --resume,
    // since the session has restored later weights by now.
    let reference = if cfg.anchored || cfg.log_kl {
        let rows = |a: &Agent, batch: &[&PreferencePair]| {
            agent_rows(&a.model.tokenizer, a.index, batch, max_new[a.index], last)
        };
        Some(reference_log_probs(cfg, run_dir, &team, &pairs, &rows, last, &session.progress.fingerprint, opts.resume)?)
    } else {
        None
    };
    let started = std::time::Instant::now();

    session.run(pairs.len(), cfg.pairs_per_update, |step, chunk, metrics| {
        let batch: Vec<&PreferencePair> = chunk.iter().map(|&i| &pairs[i]).collect();
        let rows = team
            .iter()
            .map(|a| agent_rows(&a.model.tokenizer, a.index, &batch, max_new[a.index], last))
            .collect::<Result<Vec<_>>>()?;
        *step.tokens += rows.iter().flatten().map(|r| r.prompt.len() + r.completion.len()).sum::<usize>();
        // The batch's reference rows, [actor][winners then losers].
        let batch_reference: Option<Vec<Vec<SeqLogProb>>> = reference.as_ref().map(|r| {
            r.iter()
                .map(|actor| {
                    let w = chunk.iter().map(|&p| actor[p].winner);
                    w.chain(chunk.iter().map(|&p| actor[p].loser)).collect()
                })
                .collect()
        });
        // One graph per actor, all before any update; actor i's is dropped after its backward.
        let scores = batch_scores(&models, &rows, last, Mode::Train)?;
        let scores = scores.into_iter().map(|s| fold_turns(s, cfg.num_turns)).collect::<Result<Vec<ActorScores>>>()?;
        for (i, s) in scores.iter().enumerate() {
            let values = s.values()?;
            drift_metrics(i, &values, batch_reference.as_ref().map(|r| r[i].as_slice()), metrics);
        }
        let margins = scores
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let r = batch_reference.as_ref().filter(|_| cfg.anchored).map(|r| r[i].as_slice());
                margins(s, r, cfg.length_normalize)
            })
            .collect::<Result<Vec<_>>>()?;
        drop(scores);
        let fixed = margin_values(&margins)?;
        let others = other_margins(&fixed);
        let mut losses = Vec::with_capacity(n);
        for (i, margins) in margins.into_iter().enumerate() {
            let loss = agent_objective(&margins, &others[i], cfg.beta)?;
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
    let summary = session.finish()?;
    Ok(Some(TrainReport {
        num_agents: n,
        num_pairs: pairs.len(),
        rounds,
        summary,
        secs: started.elapsed().as_secs_f64(),
        saved_in: run_dir.agents(),
    }))
}

/// What drifts when DPO runs away (logged per update and actor): the scored tokens of winners
/// and losers, the share of pairs whose winner is the shorter, and, with reference log-probs,
/// the implied KL from the reference: the mean over the batch's rows of Σ_t log π/π_ref.
fn drift_metrics(i: usize, rows: &[SeqLogProb], reference: Option<&[SeqLogProb]>, metrics: &mut serde_json::Value) {
    let pairs = rows.len() / 2;
    let (w, l) = rows.split_at(pairs);
    let mean = |xs: &[SeqLogProb]| xs.iter().map(|x| x.tokens as f64).sum::<f64>() / xs.len().max(1) as f64;
    metrics[format!("madpo/winner_tokens/agent_{i}")] = json!(mean(w));
    metrics[format!("madpo/loser_tokens/agent_{i}")] = json!(mean(l));
    let shorter = w.iter().zip(l).filter(|(w, l)| w.tokens < l.tokens).count();
    metrics[format!("madpo/winner_shorter/agent_{i}")] = json!(shorter as f64 / pairs.max(1) as f64);
    if let Some(r) = reference {
        let kl = rows.iter().zip(r).map(|(x, r)| x.sum - r.sum).sum::<f64>() / rows.len().max(1) as f64;
        metrics[format!("madpo/implied_kl/agent_{i}")] = json!(kl);
    }
}

/// `<run_dir>/madpo_reference.json`: the reference policy's log-probs of every training pair,
/// with the fingerprint of the run they belong to.
#[derive(Serialize, Deserialize)]
struct ReferenceFile {
    fingerprint: Fingerprint,
    /// "the agents as training started", or the `reference_model_name` source.
    policy: String,
    seconds: f64,
    log_probs: Vec<Vec<PairLogProbs>>,
}

/// One pair's reference scores for one actor.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct PairLogProbs {
    winner: SeqLogProb,
    loser: SeqLogProb,
}

/// Pairs per reference forward pass.
const REFERENCE_BATCH: usize = 8;

/// The reference log-probs of every pair and actor: read back when resuming (they belong to the
/// checkpointed run), else computed once without gradients and stored atomically.
/// An actor's (winner, loser) score rows for a batch of pairs.
type RowsOf<'a> = dyn Fn(&Agent, &[&PreferencePair]) -> Result<Vec<ScoreRow>> + 'a;

#[allow(clippy::too_many_arguments)]
fn reference_log_probs(
    cfg: &MadpoConfig,
    run_dir: &RunDir,
    team: &[Agent],
    pairs: &[PreferencePair],
    rows: &RowsOf,
    last: LastToken,
    fingerprint: &Fingerprint,
    resume: bool,
) -> Result<Vec<Vec<PairLogProbs>>> {
    let path = run_dir.madpo_reference();
    if resume {
        let file: ReferenceFile = serde_json::from_slice(
            &std::fs::read(&path)
                .with_context(|| format!("--resume: reading the reference log-probs {}", path.display()))?,
        )
        .with_context(|| format!("{}: not a pbrl reference log-prob file", path.display()))?;
        let changed = file.fingerprint.differences(fingerprint);
        if !changed.is_empty() || file.log_probs.iter().any(|a| a.len() != pairs.len()) {
            bail!(
                "--resume: {} belongs to another training run ({}); train without --resume to start over",
                path.display(),
                changed.join("; ")
            );
        }
        return Ok(file.log_probs);
    }
    let started = std::time::Instant::now();
    let own;
    let (scorers, policy): (Vec<&Agent>, String) = match &cfg.reference_model {
        None => (team.iter().collect(), "the agents as training started".into()),
        Some(source) => {
            own = load_reference_team(&cfg.team, team, &vec![source.clone(); team.len()], "reference_model_name")?;
            (own.iter().collect(), source.clone())
        }
    };
    let bar = crate::progress::bar(pairs.len().div_ceil(REFERENCE_BATCH) as u64, "reference");
    let mut out = vec![Vec::with_capacity(pairs.len()); team.len()];
    for chunk in pairs.chunks(REFERENCE_BATCH) {
        let batch: Vec<&PreferencePair> = chunk.iter().collect();
        for (i, (agent, scorer)) in team.iter().zip(&scorers).enumerate() {
            let r = rows(agent, &batch)?;
            // Another model must read the pairs as the agent does (same token ids).
            if cfg.reference_model.is_some()
                && rows(scorer, &batch)?
                    .iter()
                    .zip(&r)
                    .any(|(a, b)| a.completion != b.completion || a.prompt != b.prompt)
            {
                bail!(
                    "reference_model_name `{policy}` tokenizes agent {i}'s training pairs differently from the agent: \
                     the reference must share the agents' tokenizer"
                );
            }
            let scores = batch_scores(&[&scorer.model], std::slice::from_ref(&r), last, Mode::Infer)?;
            let values = fold_turns(scores.into_iter().next().expect("one scorer"), cfg.num_turns)?.values()?;
            let (w, l) = values.split_at(chunk.len());
            out[i].extend(w.iter().zip(l).map(|(&winner, &loser)| PairLogProbs { winner, loser }));
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    let seconds = started.elapsed().as_secs_f64();
    let file = ReferenceFile { fingerprint: fingerprint.clone(), policy, seconds, log_probs: out };
    crate::run::atomic_write(&path, &serde_json::to_vec(&file)?)?;
    println!("reference log-probs of {} pairs ({}) in {seconds:.1} s", pairs.len(), file.policy);
    run_dir.log_metrics(&json!({"stage": "train-madpo", "event": "reference", "reference/seconds": seconds,
        "reference/num_pairs": pairs.len()}))?;
    Ok(file.log_probs)
}
