//! Preference data: pairs of joint responses, round files, pair selection, reward histograms.
pub mod distribution;
pub mod replay;
pub mod selection;

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

pub use crate::run::layout::{existing_rounds, round_path};
use crate::run::{atomic_create, atomic_write};

/// One preference: the winning and losing joint responses to the same prompts (one entry per
/// agent in each list). The field names and order are the reference's record format, so round
/// files move between pbrl and CoMLRL in both directions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PreferencePair {
    /// The exact text each agent was given (after its template and chat template).
    pub prompts: Vec<String>,
    pub winner_completions: Vec<String>,
    pub loser_completions: Vec<String>,
    /// Oracle scores (after reward_processor).
    pub winner_reward: f64,
    pub loser_reward: f64,
    /// Mean oracle score of all candidates compared for the item.
    pub candidate_reward_mean: f64,
    /// Iterative rounds: [winner, loser] before reward_processor.
    #[serde(default)]
    pub raw_rewards: Option<Vec<f64>>,
    #[serde(default)]
    pub target_raw_reward: Option<f64>,
    #[serde(default)]
    pub comparator_raw_reward: Option<f64>,
    /// pbrl's own: whether each actor's winning / losing completion ended with a stop token
    /// (false: cut at max_new_tokens). Absent in rounds written by CoMLRL or older pbrl, where
    /// the scorer falls back to "shorter than max_new_tokens".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub winner_finished: Option<Vec<bool>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loser_finished: Option<Vec<bool>>,
    /// pbrl's own, multi-turn rounds (`num_turns` > 1): every turn of the winning and losing
    /// joint histories, turn 1 first. `prompts` then holds turn 1's prompts (the item's, the
    /// same for both), the completions and `*_finished` the last turn's, and the rewards the
    /// histories' scores (`history_reward`). Absent in one-turn rounds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub winner_turns: Option<Vec<TurnRecord>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loser_turns: Option<Vec<TurnRecord>>,
}

/// One turn of a joint history in a round file: each agent's exact prompt, completion and
/// whether it ended with a stop token, and the turn's reward (after reward_processor).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnRecord {
    pub prompts: Vec<String>,
    pub completions: Vec<String>,
    pub finished: Vec<bool>,
    pub reward: f64,
}

impl PreferencePair {
    /// The turns of its histories (1 for a one-turn pair).
    pub fn turns(&self) -> usize {
        self.winner_turns.as_ref().map_or(1, Vec::len)
    }

    /// Actor `a`'s (prompt, completion, finished) at every turn of the winner's (`winner`) or
    /// the loser's history.
    pub fn turns_of(&self, a: usize, winner: bool) -> Vec<(&str, &str, Option<bool>)> {
        let (turns, completions, finished) = match winner {
            true => (&self.winner_turns, &self.winner_completions, &self.winner_finished),
            false => (&self.loser_turns, &self.loser_completions, &self.loser_finished),
        };
        match turns {
            Some(turns) => turns
                .iter()
                .map(|t| (t.prompts[a].as_str(), t.completions[a].as_str(), t.finished.get(a).copied()))
                .collect(),
            None => vec![(
                self.prompts[a].as_str(),
                completions[a].as_str(),
                finished.as_ref().and_then(|f| f.get(a).copied()),
            )],
        }
    }
}

/// `iteration_NNNN.json`: one round of preference pairs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoundFile {
    pub iteration: u32,
    pub num_pairs: usize,
    pub pairs: Vec<PreferencePair>,
}

impl RoundFile {
    pub fn new(iteration: u32, pairs: Vec<PreferencePair>) -> Self {
        Self { iteration, num_pairs: pairs.len(), pairs }
    }

    /// Read and check a round file (the pair count, and one entry per agent in every list).
    pub fn load(path: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("cannot read round file {}", path.display()))?;
        let round: RoundFile = serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{} line {}: not a preference round file: {e}", path.display(), e.line()))?;
        if round.num_pairs != round.pairs.len() {
            bail!("{}: num_pairs is {} but it holds {} pairs", path.display(), round.num_pairs, round.pairs.len());
        }
        for (i, p) in round.pairs.iter().enumerate() {
            let n = p.prompts.len();
            if p.winner_completions.len() != n || p.loser_completions.len() != n {
                bail!(
                    "{}: pair {i} has {n} prompts but {} winner and {} loser completions",
                    path.display(),
                    p.winner_completions.len(),
                    p.loser_completions.len()
                );
            }
            let sides = [&p.winner_turns, &p.loser_turns];
            let lens: Vec<Option<usize>> = sides.iter().map(|t| t.as_ref().map(Vec::len)).collect();
            if lens[0] != lens[1] || lens[0] == Some(0) {
                bail!(
                    "{}: pair {i}'s winner and loser histories have {:?} and {:?} turns",
                    path.display(),
                    lens[0],
                    lens[1]
                );
            }
            for t in sides.iter().filter_map(|t| t.as_ref()).flatten() {
                if t.prompts.len() != n || t.completions.len() != n || t.finished.len() != n {
                    bail!(
                        "{}: pair {i} has a turn without one prompt, completion and flag per agent ({n})",
                        path.display()
                    );
                }
            }
        }
        Ok(round)
    }

    /// Written as compact JSON (like the reference), atomically.
    pub fn save(&self, path: &Path) -> Result<()> {
        atomic_write(path, serde_json::to_string(self)?.as_bytes())
    }

    /// Write a new round file; an existing one (another command's) is an error, never replaced.
    pub fn save_new(&self, path: &Path) -> Result<()> {
        atomic_create(path, serde_json::to_string(self)?.as_bytes())
    }
}

/// Refuse pairs of histories of another number of turns than the config's (`num_turns`): a
/// training would read a multi-turn history as one turn, or the other way round.
pub fn check_turns(pairs: &[PreferencePair], num_turns: usize) -> Result<()> {
    if let Some(bad) = pairs.iter().position(|p| p.turns() != num_turns) {
        bail!(
            "selected pair {bad} holds {}-turn histories but num_turns = {num_turns}; train on rounds collected with \
             the same num_turns",
            pairs[bad].turns()
        );
    }
    Ok(())
}

/// Refuse pairs of another team's size: every pair must have one prompt (and completion) per
/// actor of the team that trains on it (`n`; `team` describes it in the error), or the
/// training would read cut or padded joint responses.
pub fn check_actors(pairs: &[PreferencePair], n: usize, team: &str) -> Result<()> {
    if let Some(bad) = pairs.iter().position(|p| p.prompts.len() != n) {
        bail!("selected pair {bad} has {} actors' prompts but this team has {n} ({team})", pairs[bad].prompts.len());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> PreferencePair {
        PreferencePair {
            prompts: vec!["p0".into(), "p1".into()],
            winner_completions: vec!["a".into(), "bb".into()],
            loser_completions: vec!["c".into(), "d".into()],
            winner_reward: 0.9,
            loser_reward: 0.1,
            candidate_reward_mean: 0.5,
            raw_rewards: None,
            target_raw_reward: None,
            comparator_raw_reward: None,
            winner_finished: None,
            loser_finished: None,
            winner_turns: None,
            loser_turns: None,
        }
    }

    #[test]
    fn round_files_round_trip_with_every_record_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = round_path(dir.path(), 3);
        assert!(path.ends_with("iteration_0003.json"));
        let round = RoundFile::new(3, vec![pair()]);
        round.save(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        for key in [
            "\"iteration\":3",
            "\"num_pairs\":1",
            "\"raw_rewards\":null",
            "\"target_raw_reward\":null",
            "\"comparator_raw_reward\":null",
        ] {
            assert!(text.contains(key), "{key} missing in {text}");
        }
        assert_eq!(RoundFile::load(&path).unwrap(), round);
        assert_eq!(existing_rounds(dir.path()).unwrap(), vec![3]);
    }

    #[test]
    fn inconsistent_round_files_are_rejected_with_the_file_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("iteration_0001.json");
        std::fs::write(&path, r#"{"iteration": 1, "num_pairs": 2, "pairs": []}"#).unwrap();
        assert!(RoundFile::load(&path).unwrap_err().to_string().contains("num_pairs is 2"));
        std::fs::write(&path, "{\"iteration\": 1,\n \"pairs\": 3}").unwrap();
        let e = RoundFile::load(&path).unwrap_err().to_string();
        assert!(e.contains("iteration_0001.json line 2"), "{e}");
    }
}
