//! The actor-critic losses of `maac` and `iac` (reference §7.4), for one agent's rollout buffer
//! of samples s with reward-model return R_s (minus c·KL with the reference KL), the critic's
//! value V_old(s) at rollout time and summed response log-prob log π(s):
//!
//! 1. advantage A_s = R_s − V_old(s), normalized over the whole buffer (population std floored
//!    at 1e-6) with `advantage_normalization`;
//! 2. per chunk: actor loss mean_s −A_s · log π(s) (no ratio, no clipping), value loss
//!    mean_s (R_s − V(s))², or with `value_clip_range` ε (the reference applies it to `iac`'s
//!    shared head only) mean_s max((R_s − V)², (R_s − clip(V, V_old ± ε))²).
use anyhow::{ensure, Result};
use candle_core::Tensor;

use super::advantages::normalized;

/// The buffer's advantages from its value targets (the returns) and rollout-time values.
pub fn buffer_advantages(targets: &[f64], old_values: &[f64], normalize: bool) -> Vec<f64> {
    let adv: Vec<f64> = targets.iter().zip(old_values).map(|(t, v)| t - v).collect();
    if normalize {
        normalized(&adv)
    } else {
        adv
    }
}

/// mean_s −A_s · log π(s) over a chunk (`log_probs` (n,)).
pub fn actor_loss(log_probs: &Tensor, advantages: &[f64]) -> Result<Tensor> {
    let n = log_probs.dim(0)?;
    ensure!(advantages.len() == n && n > 0, "one advantage per sample of a non-empty chunk");
    let w: Vec<f64> = advantages.iter().map(|a| -a / n as f64).collect();
    let w = Tensor::new(w.as_slice(), log_probs.device())?.to_dtype(log_probs.dtype())?;
    Ok((log_probs * w)?.sum_all()?)
}

/// The chunk's value loss (before `value_loss_coef`) from the critic's values `values` (n,).
pub fn value_loss(values: &Tensor, targets: &[f64], old_values: &[f64], clip: Option<f64>) -> Result<Tensor> {
    let n = values.dim(0)?;
    ensure!(targets.len() == n && old_values.len() == n && n > 0, "one target and old value per sample");
    let dev = values.device();
    let as_t = |x: &[f64]| -> Result<Tensor> { Ok(Tensor::new(x, dev)?.to_dtype(values.dtype())?) };
    let target = as_t(targets)?;
    let error = (&target - values)?.sqr()?;
    let error = match clip {
        None => error,
        Some(eps) => {
            let old = as_t(old_values)?;
            let clipped = (&old + (values - &old)?.clamp(-eps, eps)?)?;
            error.maximum(&(&target - clipped)?.sqr()?)?
        }
    };
    Ok(error.mean_all()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn the_losses_by_hand() {
        let a = buffer_advantages(&[1.0, 0.0, 2.0], &[0.5, 0.5, 0.5], false);
        assert_eq!(a, vec![0.5, -0.5, 1.5]);
        let n = buffer_advantages(&[1.0, 0.0, 2.0], &[0.5, 0.5, 0.5], true);
        assert!(n.iter().sum::<f64>().abs() < 1e-12);
        let lp = Tensor::new(&[-2.0f64, -1.0], &Device::Cpu).unwrap();
        let l = actor_loss(&lp, &[1.0, -3.0]).unwrap().to_scalar::<f64>().unwrap();
        assert!((l - (2.0 - 3.0) / 2.0).abs() < 1e-12);
        let v = Tensor::new(&[1.0f64, 0.0], &Device::Cpu).unwrap();
        let plain = value_loss(&v, &[0.0, 0.5], &[0.0, 0.0], None).unwrap().to_scalar::<f64>().unwrap();
        assert!((plain - (1.0 + 0.25) / 2.0).abs() < 1e-12);
        // Clipped to old ± 0.2: sample 0's V = 1 counts as 0.2 too, max(1, 0.04) = 1; sample 1's
        // V = 0 is inside, both errors 0.25.
        let clipped = value_loss(&v, &[0.0, 0.5], &[0.0, 0.0], Some(0.2)).unwrap().to_scalar::<f64>().unwrap();
        assert!((clipped - plain).abs() < 1e-12);
        // The clipped error wins when the update moved V towards the target past the range.
        let c = value_loss(&v, &[2.0, 0.5], &[0.0, 0.0], Some(0.2)).unwrap().to_scalar::<f64>().unwrap();
        assert!((c - ((2.0f64 - 0.2).powi(2) + 0.25) / 2.0).abs() < 1e-12);
    }
}
