//! The MAGRPO-family policy-gradient loss (reference §7.4): for one group of K samples of an
//! item, mean over the samples with something to score of −A_k · Σ_t log π(c_k[t] | prompt,
//! c_k[<t]); the reference scores each completion row as generation left it (padded to the
//! group's longest) with its last position left out. A chunk of groups is one update: the
//! groups' losses averaged.
use anyhow::{ensure, Result};
use candle_core::Tensor;

/// One group's loss from its rows' summed log-probs `seq_log_probs` (K,) and advantages; rows
/// with nothing scored (`scored[k] == false`) do not count. `None` when no row counts (the
/// reference's loss is then a constant 0 with no gradient).
pub fn group_loss(seq_log_probs: &Tensor, advantages: &[f64], scored: &[bool]) -> Result<Option<Tensor>> {
    let k = seq_log_probs.dim(0)?;
    ensure!(advantages.len() == k && scored.len() == k, "one advantage and one flag per sample");
    let counted = scored.iter().filter(|&&s| s).count();
    if counted == 0 {
        return Ok(None);
    }
    // −A_k / counted for the counted rows, 0 for the others: one dot product.
    let w: Vec<f64> = advantages.iter().zip(scored).map(|(a, &s)| if s { -a / counted as f64 } else { 0.0 }).collect();
    let w = Tensor::new(w.as_slice(), seq_log_probs.device())?.to_dtype(seq_log_probs.dtype())?;
    Ok(Some((seq_log_probs * w)?.sum_all()?))
}

/// One update's loss: the mean of its groups' losses (groups that count nothing add 0 but still
/// count in the mean, as the reference scales every sample of a chunk by 1/len(chunk)).
pub fn chunk_loss(group_losses: Vec<Option<Tensor>>) -> Result<Option<Tensor>> {
    let n = group_losses.len();
    let mut total: Option<Tensor> = None;
    for l in group_losses.into_iter().flatten() {
        total = Some(match total {
            Some(t) => (t + l)?,
            None => l,
        });
    }
    Ok(match total {
        Some(t) => Some((t / n as f64)?),
        None => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn the_loss_weights_log_probs_by_minus_the_advantage() {
        let lp = Tensor::new(&[-2.0f64, -1.0, -4.0], &Device::Cpu).unwrap();
        let l = group_loss(&lp, &[1.0, -0.5, 2.0], &[true, true, false]).unwrap().unwrap();
        // mean over the 2 counted rows of −A·lp: (2 + (−0.5)) / 2
        assert!((l.to_scalar::<f64>().unwrap() - 0.75).abs() < 1e-12);
        assert!(group_loss(&lp, &[1.0, 1.0, 1.0], &[false; 3]).unwrap().is_none());
        let c = chunk_loss(vec![Some(l), None]).unwrap().unwrap();
        assert!((c.to_scalar::<f64>().unwrap() - 0.375).abs() < 1e-12);
        assert!(chunk_loss(vec![None, None]).unwrap().is_none());
    }
}
