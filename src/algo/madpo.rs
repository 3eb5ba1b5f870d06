//! The MADPO loss (reference §6.1): reference-free joint DPO.
//!
//! For pair p and agent i, Δ_i(p) = log π_i(winner_i) − log π_i(loser_i). Agent i's loss is
//! mean_p −log σ(β·(Δ_i(p) + Σ_{j≠i} D_j(p))), where D_j are the other agents' margins computed
//! once per batch without gradients, before any agent's update.
use anyhow::Result;
use candle_core::Tensor;

/// −log σ(z) = softplus(−z), written stably: max(−z, 0) + log(1 + e^{−|z|}).
pub fn neg_log_sigmoid(z: &Tensor) -> Result<Tensor> {
    let tail = (z.abs()?.neg()?.exp()? + 1.0)?.log()?;
    Ok((z.neg()?.relu()? + tail)?)
}

/// The joint margins Σ_j D_j(p) from every agent's detached margins `d[j][p]`.
pub fn joint_margins(d: &[Vec<f64>]) -> Vec<f64> {
    let pairs = d.first().map_or(0, |m| m.len());
    (0..pairs).map(|p| d.iter().map(|m| m[p]).sum()).collect()
}

/// Σ_{j≠i} D_j(p) for every agent i, from the detached margins `d[j][p]`.
pub fn other_margins(d: &[Vec<f64>]) -> Vec<Vec<f64>> {
    let joint = joint_margins(d);
    d.iter().map(|m| m.iter().zip(&joint).map(|(m, j)| j - m).collect()).collect()
}

/// Agent i's loss: `own` (pairs,) is its differentiable margin Δ_i, `others` (pairs,) the
/// constant Σ_{j≠i} D_j.
pub fn agent_loss(own: &Tensor, others: &Tensor, beta: f64) -> Result<Tensor> {
    let z = ((own + others.to_dtype(own.dtype())?)? * beta)?;
    Ok(neg_log_sigmoid(&z)?.mean_all()?)
}

/// Share of pairs whose joint margin Σ_j D_j is positive.
pub fn accuracy(d: &[Vec<f64>]) -> f64 {
    let joint = joint_margins(d);
    if joint.is_empty() {
        return 0.0;
    }
    joint.iter().filter(|&&z| z > 0.0).count() as f64 / joint.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    #[test]
    fn neg_log_sigmoid_is_stable_and_exact() {
        let z = Tensor::new(&[-1000.0f64, -2.0, 0.0, 3.0, 1000.0], &Device::Cpu).unwrap();
        let got: Vec<f64> = neg_log_sigmoid(&z).unwrap().to_vec1().unwrap();
        let want = [1000.0, (1.0 + 2f64.exp()).ln(), 2f64.ln(), (1.0 + (-3f64).exp()).ln(), 0.0];
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-12, "{g} vs {w}");
        }
    }

    #[test]
    fn other_margins_and_accuracy() {
        let d = vec![vec![1.0, -2.0, 0.5], vec![0.5, 1.0, -1.0]];
        assert_eq!(other_margins(&d), vec![vec![0.5, 1.0, -1.0], vec![1.0, -2.0, 0.5]]);
        assert_eq!(joint_margins(&d), vec![1.5, -1.0, -0.5]);
        assert!((accuracy(&d) - 1.0 / 3.0).abs() < 1e-12); // joint: 1.5, -1, -0.5
    }

    /// loss_i and its gradient against a hand computation: d/dΔ −logσ(β(Δ+o)) = −β σ(−β(Δ+o)).
    #[test]
    fn agent_loss_value_and_gradient() {
        let dev = Device::Cpu;
        let own = Var::new(&[0.3f64, -1.2], &dev).unwrap();
        let others = Tensor::new(&[0.5f64, 0.4], &dev).unwrap();
        let beta = 0.1;
        let loss = agent_loss(own.as_tensor(), &others, beta).unwrap();
        let sig = |x: f64| 1.0 / (1.0 + (-x).exp());
        let zs = [beta * 0.8, beta * -0.8];
        let want: f64 = zs.iter().map(|z| -sig(*z).ln()).sum::<f64>() / 2.0;
        assert!((loss.to_scalar::<f64>().unwrap() - want).abs() < 1e-12);
        let g: Vec<f64> = loss.backward().unwrap().get(own.as_tensor()).unwrap().to_vec1().unwrap();
        for (gi, z) in g.iter().zip(zs) {
            assert!((gi - (-beta * sig(-z) / 2.0)).abs() < 1e-12);
        }
    }
}
