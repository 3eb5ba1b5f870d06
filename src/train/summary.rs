//! How a training run ended: `training_summary.json`, and the line a stage prints.
use std::path::Path;

use serde::Serialize;

use crate::run::checkpoint::EvalPoint;

/// How a training run ended (`training_summary.json`, and what `finish` returns).
#[derive(Debug, Clone, Serialize)]
pub struct TrainingSummary {
    pub stage: String,
    pub updates: u64,
    /// The evaluation of the agents after the last update.
    pub final_eval: Option<EvalPoint>,
    /// The best periodic evaluation (the final one included).
    pub best_eval: Option<EvalPoint>,
    /// Which agents are in `agents/`: "final" or "best".
    pub saved: &'static str,
}

/// Whether `keep_best` saves the best evaluation's agents rather than the last ones: when the
/// best is another evaluation than the last and beats it by more than `tolerance` standard
/// errors of the best (`keep_best_tolerance`). The best is the highest of several noisy
/// evaluations, so on a plateau it beats the last by about one standard error through luck
/// alone; a tolerance keeps the last agents there and the best ones after a real fall.
pub fn keeps_best(best: Option<EvalPoint>, last: Option<EvalPoint>, tolerance: f64) -> bool {
    match (best, last) {
        (Some(b), Some(l)) => b.update != l.update && l.reward_mean < b.reward_mean - tolerance * b.reward_stderr,
        (Some(_), None) => true,
        (None, _) => false,
    }
}

impl TrainingSummary {
    /// "trained `what`: N updates in S s; agents saved in DIR", and the final and best
    /// evaluations with which agents were saved, when there were evaluations.
    pub fn describe(&self, what: &str, secs: f64, saved_in: &Path) -> String {
        let mut out =
            format!("trained {what}: {} updates in {secs:.1} s; agents saved in {}", self.updates, saved_in.display());
        let show = |e: &EvalPoint| format!("{:.4} ± {:.4} after update {}", e.reward_mean, e.reward_stderr, e.update);
        if let (Some(f), Some(b)) = (&self.final_eval, &self.best_eval) {
            out += &format!("\neval reward: final {}; best {}; saved: the {} agents", show(f), show(b), self.saved);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(update: u64, reward_mean: f64, reward_stderr: f64) -> Option<EvalPoint> {
        Some(EvalPoint { update, reward_mean, reward_stderr })
    }

    #[test]
    fn the_best_agents_replace_the_last_only_after_a_fall_beyond_the_tolerance() {
        let best = at(36, 0.847, 0.035);
        // A plateau: the last evaluation 0.024 below the best, within one standard error.
        assert!(keeps_best(best, at(54, 0.823, 0.038), 0.0));
        assert!(!keeps_best(best, at(54, 0.823, 0.038), 1.0));
        // A fall of more than one standard error keeps the best agents.
        assert!(keeps_best(best, at(54, 0.800, 0.038), 1.0));
        // Exactly at the tolerance: the last agents.
        assert!(!keeps_best(at(24, 0.8, 0.05), at(54, 0.75, 0.01), 1.0));
        // The last evaluation is the best: nothing to replace, at any tolerance.
        assert!(!keeps_best(best, best, 0.0));
        // No evaluations at all.
        assert!(!keeps_best(None, None, 1.0));
    }
}
