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
