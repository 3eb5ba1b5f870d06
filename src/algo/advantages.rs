//! Advantages of the MAGRPO family (reference §7.4), for one group of K samples of the same
//! item by one agent, with returns R_k and reference KLs kl_k:
//!
//! 1. R'_k = R_k − c·kl_k with the reference KL (c = `reference_kl_coef`), else R'_k = R_k;
//! 2. by `advantage_mode`: mean (magrpo) R'_k − mean R', raw (mareinforce) R'_k, max (maremax)
//!    R'_k − max R', rloo (marloo) (K·R'_k − Σ R') / (K − 1), which is R'_k minus the mean of the
//!    others (mean when K = 1);
//! 3. with `advantage_normalization` and K > 1: (A − mean A) / max(std_pop A, 1e-6).

pub use crate::config::AdvantageMode;

/// How a group's returns become advantages.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdvantageRule {
    pub mode: AdvantageMode,
    pub normalize: bool,
    /// `reference_kl_coef` when the reference KL is on.
    pub kl_coef: Option<f64>,
}

/// Floor of the standard deviation in the normalization.
const STD_FLOOR: f64 = 1e-6;

/// The advantages of one group; `kls[k]` is sample k's reference KL (used only with `kl_coef`).
pub fn group_advantages(returns: &[f64], kls: &[f64], rule: AdvantageRule) -> Vec<f64> {
    let shaped: Vec<f64> = match rule.kl_coef {
        Some(c) => returns.iter().enumerate().map(|(k, r)| r - c * kls.get(k).copied().unwrap_or(0.0)).collect(),
        None => returns.to_vec(),
    };
    let g = shaped.len();
    if g == 0 {
        return Vec::new();
    }
    let mean = |xs: &[f64]| xs.iter().sum::<f64>() / xs.len() as f64;
    let m = mean(&shaped);
    let adv: Vec<f64> = match rule.mode {
        AdvantageMode::Mean => shaped.iter().map(|r| r - m).collect(),
        AdvantageMode::Raw => shaped.clone(),
        AdvantageMode::Max => {
            let max = shaped.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            shaped.iter().map(|r| r - max).collect()
        }
        AdvantageMode::Rloo if g <= 1 => shaped.iter().map(|r| r - m).collect(),
        AdvantageMode::Rloo => {
            let sum: f64 = shaped.iter().sum();
            shaped.iter().map(|r| (r * g as f64 - sum) / (g as f64 - 1.0)).collect()
        }
    };
    if !rule.normalize {
        return adv;
    }
    normalized(&adv)
}

/// (A − mean A) / max(std_pop A, 1e-6), or A itself when there is at most one.
pub fn normalized(adv: &[f64]) -> Vec<f64> {
    let g = adv.len();
    if g <= 1 {
        return adv.to_vec();
    }
    let am = adv.iter().sum::<f64>() / g as f64;
    let std = (adv.iter().map(|a| (a - am).powi(2)).sum::<f64>() / g as f64).sqrt().max(STD_FLOOR);
    adv.iter().map(|a| (a - am) / std).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(mode: AdvantageMode, normalize: bool) -> AdvantageRule {
        AdvantageRule { mode, normalize, kl_coef: None }
    }

    #[test]
    fn each_mode_by_hand() {
        let r = [1.0, 2.0, 6.0];
        assert_eq!(group_advantages(&r, &[], rule(AdvantageMode::Mean, false)), vec![-2.0, -1.0, 3.0]);
        assert_eq!(group_advantages(&r, &[], rule(AdvantageMode::Raw, false)), vec![1.0, 2.0, 6.0]);
        assert_eq!(group_advantages(&r, &[], rule(AdvantageMode::Max, false)), vec![-5.0, -4.0, 0.0]);
        // Leave-one-out: each return minus the mean of the others.
        assert_eq!(group_advantages(&r, &[], rule(AdvantageMode::Rloo, false)), vec![-3.0, -1.5, 4.5]);
        assert_eq!(group_advantages(&[5.0], &[], rule(AdvantageMode::Rloo, false)), vec![0.0]);
        let kl = AdvantageRule { mode: AdvantageMode::Raw, normalize: false, kl_coef: Some(0.5) };
        assert_eq!(group_advantages(&r, &[2.0, 0.0, 4.0], kl), vec![0.0, 2.0, 4.0]);
        let n = group_advantages(&r, &[], rule(AdvantageMode::Raw, true));
        assert!(n.iter().sum::<f64>().abs() < 1e-12);
        assert!((n.iter().map(|a| a * a).sum::<f64>() / 3.0 - 1.0).abs() < 1e-12, "unit population variance");
        assert_eq!(group_advantages(&[2.0, 2.0], &[], rule(AdvantageMode::Raw, true)), vec![0.0, 0.0], "std floored");
    }
}
