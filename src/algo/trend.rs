//! Learning over rounds, paired by prompt: every round's team is evaluated on the same eval
//! prompts, so each prompt's mean reward is a series over rounds, and a change is read per
//! prompt before it is averaged (the prompts' own difficulty cancels).
//!
//! - the paired gain of round t over round s: mean over prompts of r_i(t) − r_i(s), with its
//!   standard error over prompts;
//! - the trend: each prompt's least-squares slope of r_i(t) on t over the rounds, averaged over
//!   prompts, with its standard error over prompts.

use serde::{Deserialize, Serialize};

/// A mean over prompts and its standard error (sample sd / √n; 0 with fewer than 2 prompts).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MeanSe {
    pub mean: f64,
    pub se: f64,
}

impl MeanSe {
    pub fn of(values: &[f64]) -> Self {
        let n = values.len();
        if n == 0 {
            return Self { mean: f64::NAN, se: f64::NAN };
        }
        let mean = values.iter().sum::<f64>() / n as f64;
        if n < 2 {
            return Self { mean, se: 0.0 };
        }
        let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
        Self { mean, se: (var / n as f64).sqrt() }
    }
}

impl std::fmt::Display for MeanSe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:+.4} ± {:.4}", self.mean, self.se)
    }
}

/// The mean of some values (0 when there are none).
pub fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len().max(1) as f64
}

/// Each item's mean reward: `rewards` item-major, `k` samples per item.
pub fn item_means(rewards: &[f64], k: usize) -> Vec<f64> {
    rewards.chunks(k.max(1)).map(|c| c.iter().sum::<f64>() / c.len() as f64).collect()
}

/// The paired gain of `after` over `before` (per-prompt means of the same prompts).
pub fn paired_gain(before: &[f64], after: &[f64]) -> MeanSe {
    let d: Vec<f64> = before.iter().zip(after).map(|(b, a)| a - b).collect();
    MeanSe::of(&d)
}

/// The per-prompt slope of reward on the round index, `rounds[t][i]` the mean reward of prompt
/// i at round t (t = 0, 1, …), averaged over prompts. `None` with fewer than 2 rounds.
pub fn slope_over_rounds(rounds: &[Vec<f64>]) -> Option<MeanSe> {
    let t = rounds.len();
    if t < 2 {
        return None;
    }
    let x_mean = (t - 1) as f64 / 2.0;
    let sxx: f64 = (0..t).map(|x| (x as f64 - x_mean).powi(2)).sum();
    let prompts = rounds.iter().map(Vec::len).min().unwrap_or(0);
    let slopes: Vec<f64> = (0..prompts)
        .map(|i| {
            let y_mean = rounds.iter().map(|r| r[i]).sum::<f64>() / t as f64;
            rounds.iter().enumerate().map(|(x, r)| (x as f64 - x_mean) * (r[i] - y_mean)).sum::<f64>() / sxx
        })
        .collect();
    Some(MeanSe::of(&slopes))
}

/// The paired statistics of rounds 0..=ν on the same eval prompts.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct RoundTrend {
    /// r(ν) − r(0): this round's team over the base team.
    pub gain: [f64; 2],
    /// r(ν) − r(1): what the rounds after the first added (= gain(ν) − gain(1)).
    pub gain_after_round_1: [f64; 2],
    /// The per-prompt least-squares slope of reward on the round, rounds 0..=ν.
    pub slope_per_round: [f64; 2],
}

impl RoundTrend {
    /// From `rounds[t]`, round t's per-prompt means, t = 0..=ν (ν >= 1).
    pub fn of(rounds: &[Vec<f64>]) -> Option<Self> {
        let pair = |m: MeanSe| [m.mean, m.se];
        let last = rounds.last()?;
        Some(Self {
            gain: pair(paired_gain(rounds.first()?, last)),
            gain_after_round_1: pair(paired_gain(rounds.get(1)?, last)),
            slope_per_round: pair(slope_over_rounds(rounds)?),
        })
    }

    pub fn describe(&self) -> String {
        let f = |v: [f64; 2]| format!("{:+.4} ± {:.4}", v[0], v[1]);
        format!(
            "gain over the base team {}; over round 1 {}; slope {} per round (paired by prompt)",
            f(self.gain),
            f(self.gain_after_round_1),
            f(self.slope_per_round)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_and_standard_error_over_prompts() {
        let m = MeanSe::of(&[0.0, 1.0]);
        assert_eq!(m.mean, 0.5);
        assert!((m.se - 0.5).abs() < 1e-12, "sd 0.7071 / √2");
        assert_eq!(MeanSe::of(&[0.3]).se, 0.0);
        assert!(MeanSe::of(&[]).mean.is_nan());
        assert_eq!(item_means(&[0.0, 1.0, 1.0, 1.0], 2), vec![0.5, 1.0]);
    }

    #[test]
    fn gains_are_paired_by_prompt() {
        // Two prompts of very different difficulty, each up by exactly 0.1: no spread in the gain.
        let g = paired_gain(&[0.1, 0.9], &[0.2, 1.0]);
        assert!((g.mean - 0.1).abs() < 1e-12 && g.se < 1e-12);
    }

    #[test]
    fn slope_is_each_prompts_least_squares_slope_averaged() {
        assert_eq!(slope_over_rounds(&[vec![0.5]]), None);
        // Prompt 0 rises 0.1 a round; prompt 1 is flat: slopes 0.1 and 0.
        let rounds = vec![vec![0.2, 0.5], vec![0.3, 0.5], vec![0.4, 0.5]];
        let s = slope_over_rounds(&rounds).unwrap();
        assert!((s.mean - 0.05).abs() < 1e-12 && (s.se - 0.05).abs() < 1e-12, "{s:?}");
        // A dip in the middle does not change a least-squares slope over 3 rounds.
        let s = slope_over_rounds(&[vec![0.0], vec![-1.0], vec![0.2]]).unwrap();
        assert!((s.mean - 0.1).abs() < 1e-12);
    }
}
