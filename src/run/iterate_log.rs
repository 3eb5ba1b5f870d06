//! `iterate/`: the record of an iterate run. `fingerprint.json` holds the setup a resume must
//! share; `round_NNNN.json` summarises a finished round, and its existence marks the round
//! finished. The summaries so far are read once, when the run starts or resumes, and kept.
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use super::fingerprint::Fingerprint;
use super::layout::existing_rounds;
use super::{atomic_write, RunDir};
use crate::algo::trend::RoundTrend;

/// `iterate/round_NNNN.json`: what a finished round did.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RoundSummary {
    pub round: u32,
    /// Train items the round compared on (all of them, or `items_per_round`).
    #[serde(default)]
    pub items: usize,
    pub pairs: usize,
    pub current_wins: usize,
    pub comparator_wins: usize,
    /// Mean raw task reward of each side's candidates (none for round 0).
    pub current_reward_mean: Option<f64>,
    pub comparator_reward_mean: Option<f64>,
    pub train_pairs: usize,
    /// Centralized comparator replies without any role section.
    #[serde(default)]
    pub comparator_unparsed: usize,
    /// API comparator replies longer than `max_new_tokens`, cut there.
    #[serde(default)]
    pub comparator_truncated: usize,
    pub eval_reward_mean: Option<f64>,
    pub eval_reward_stderr: Option<f64>,
    /// Each eval prompt's mean reward, in the eval file's order (absent in summaries written
    /// before pbrl kept them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_item_means: Option<Vec<f64>>,
    /// Learning so far, paired by prompt (from round 1 on, when every round up to this one
    /// kept its prompts' means).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trend: Option<RoundTrend>,
    pub collect_s: f64,
    pub train_s: f64,
    pub eval_s: f64,
}

/// What a round's comparisons gave.
#[derive(Debug, Clone, Default)]
pub struct RoundStats {
    /// Train items compared on.
    pub items: usize,
    pub pairs: usize,
    pub current_wins: usize,
    pub current_mean: f64,
    pub comparator_mean: f64,
    /// Centralized comparator replies without any role section (scored as empty roles).
    pub comparator_unparsed: usize,
    /// API replies cut at `max_new_tokens`.
    pub comparator_truncated: usize,
}

/// An evaluation of the team after a round (or of the base team, round 0).
#[derive(Debug, Clone)]
pub struct RoundEval {
    pub mean: f64,
    pub stderr: f64,
    pub item_means: Vec<f64>,
    pub secs: f64,
}

/// Seconds a round spent comparing and training.
#[derive(Debug, Clone, Copy, Default)]
pub struct RoundTimes {
    pub collect_s: f64,
    pub train_s: f64,
}

impl RoundSummary {
    /// Round `round`'s summary (round 0: the base team's evaluation, `stats` None), its trend not
    /// yet known.
    pub fn new(
        round: u32,
        stats: Option<&RoundStats>,
        train_pairs: usize,
        eval: Option<&RoundEval>,
        times: RoundTimes,
    ) -> Self {
        let s = stats.cloned().unwrap_or_default();
        Self {
            round,
            items: s.items,
            pairs: s.pairs,
            current_wins: s.current_wins,
            comparator_wins: s.pairs - s.current_wins,
            current_reward_mean: stats.map(|s| s.current_mean),
            comparator_reward_mean: stats.map(|s| s.comparator_mean),
            train_pairs,
            comparator_unparsed: s.comparator_unparsed,
            comparator_truncated: s.comparator_truncated,
            eval_reward_mean: eval.map(|e| e.mean),
            eval_reward_stderr: eval.map(|e| e.stderr),
            eval_item_means: eval.map(|e| e.item_means.clone()),
            trend: None,
            collect_s: times.collect_s,
            train_s: times.train_s,
            eval_s: eval.map_or(0.0, |e| e.secs),
        }
    }
}

/// An iterate run's record: its finished rounds' summaries, in order.
pub struct IterateLog {
    pub summaries: Vec<RoundSummary>,
}

impl IterateLog {
    /// Start a run in `run_dir` (refusing one that holds rounds or trained agents) or, with
    /// `resume`, continue one started under the same `fingerprint` and no more rounds than
    /// `num_iterations` (rounds only add up: the team on disk is the last round's).
    pub fn open(run_dir: &RunDir, fingerprint: &Fingerprint, resume: bool, num_iterations: u32) -> Result<Self> {
        let path = run_dir.iterate_fingerprint();
        let rounds = existing_rounds(run_dir.replay())?;
        if resume {
            let saved: Fingerprint = serde_json::from_slice(
                &std::fs::read(&path)
                    .with_context(|| format!("--resume: {} holds no iterate run", run_dir.root.display()))?,
            )
            .with_context(|| format!("{}: not a pbrl fingerprint", path.display()))?;
            let changed = saved.differences(fingerprint);
            if !changed.is_empty() {
                bail!("--resume: the run was started under a different setup ({})", changed.join("; "));
            }
            let last = rounds.iter().copied().max().unwrap_or(0);
            let done = (1..=last).rev().find(|&r| run_dir.round_summary(r).exists()).unwrap_or(0);
            if last.max(done) > num_iterations {
                bail!(
                    "--resume: the run already has {} rounds, more than num_iterations = {num_iterations}; resume \
                     with num_iterations >= {} (the rounds only add up)",
                    last.max(done),
                    last.max(done)
                );
            }
        } else {
            // (a start killed before its fingerprint was written left nothing to continue)
            if path.exists() || run_dir.agents().exists() || !rounds.is_empty() {
                bail!(
                    "{} already holds rounds or trained agents; pass --resume to continue an iterate run there, or \
                     choose another run_dir",
                    run_dir.root.display()
                );
            }
            atomic_write(&path, &serde_json::to_vec_pretty(fingerprint)?)?;
        }
        let mut summaries = Vec::new();
        for round in 0.. {
            let file = run_dir.round_summary(round);
            if !file.exists() {
                break;
            }
            summaries.push(
                serde_json::from_slice::<RoundSummary>(&std::fs::read(&file)?)
                    .with_context(|| format!("{}: not an iterate round summary", file.display()))?,
            );
        }
        Ok(Self { summaries })
    }

    /// Whether round `round` finished.
    pub fn finished(&self, round: u32) -> bool {
        (round as usize) < self.summaries.len()
    }

    /// Pairs in the round files of the finished rounds (each summary counts its round's).
    pub fn total_pairs(&self) -> usize {
        self.summaries.iter().map(|s| s.pairs).sum()
    }

    /// Round `s`'s trend over the finished rounds and itself, paired by prompt (when every
    /// round kept its prompts' means).
    pub fn trend_with(&self, s: &RoundSummary) -> Option<RoundTrend> {
        let series: Option<Vec<Vec<f64>>> =
            self.summaries.iter().chain([s]).map(|r| r.eval_item_means.clone()).collect();
        series.filter(|rounds| rounds.iter().all(|r| r.len() == rounds[0].len())).and_then(|r| RoundTrend::of(&r))
    }

    /// Record round `s.round` as finished: its summary file, then kept.
    pub fn record(&mut self, run_dir: &RunDir, s: RoundSummary) -> Result<&RoundSummary> {
        atomic_write(&run_dir.round_summary(s.round), &serde_json::to_vec_pretty(&s)?)?;
        self.summaries.push(s);
        Ok(self.summaries.last().expect("just pushed"))
    }
}
