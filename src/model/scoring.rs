//! Sequence log-probabilities of completions given prompts: the quantity every preference loss
//! is built from.
//!
//! Only the positions that predict completion tokens go through the LM head, and the log-prob of
//! a token is `logit[target] - logsumexp(logits)`: no full log_softmax copy of the vocabulary is
//! materialised for the prompt positions.
use anyhow::Result;
use candle_core::Tensor;

use super::batch::{PaddedBatch, Padding};
use super::transformer::{CausalLm, Mode};

/// One (prompt, completion) pair of token rows.
#[derive(Debug, Clone)]
pub struct ScoreRow {
    pub prompt: Vec<u32>,
    pub completion: Vec<u32>,
}

/// Which completion tokens are scored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LastToken {
    /// Score every completion token (the joint scorer, reference §6.3).
    Include,
    /// Leave the last completion token out (the decentralized reference scorer, §6.2).
    Exclude,
}

/// Σ log p(completion token | prefix) for each row, shape (rows,). Differentiable in
/// `Mode::Train`; in the model's dtype. A row with nothing to score gets 0.
pub fn sequence_log_probs(
    model: &CausalLm,
    rows: &[ScoreRow],
    last: LastToken,
    pad_id: u32,
    mode: Mode,
) -> Result<Tensor> {
    let dev = model.device().clone();
    let b = rows.len();
    // Input: prompt ++ completion[..C-1]; the position P-1+k predicts completion[k].
    let mut inputs = Vec::with_capacity(b);
    let mut positions = Vec::new(); // flat index into (b * len) of each scored position
    let mut targets = Vec::new();
    let mut owner = Vec::new(); // row of each scored position
    for r in rows {
        let c = r.completion.len();
        let n_scored = match last {
            LastToken::Include => c,
            LastToken::Exclude => c.saturating_sub(1),
        };
        if r.prompt.is_empty() && n_scored > 0 {
            anyhow::bail!("cannot score a completion without a prompt");
        }
        let mut x = r.prompt.clone();
        x.extend_from_slice(&r.completion[..c.saturating_sub(1)]);
        inputs.push((x, n_scored));
    }
    let len = inputs.iter().map(|(x, _)| x.len()).max().unwrap_or(0);
    if len == 0 || inputs.iter().all(|(_, n)| *n == 0) {
        return Ok(Tensor::zeros(b, model.dtype(), &dev)?);
    }
    for (row, ((_, n_scored), r)) in inputs.iter().zip(rows).enumerate() {
        let p = r.prompt.len();
        for k in 0..*n_scored {
            positions.push((row * len + p - 1 + k) as u32);
            targets.push(r.completion[k]);
            owner.push(row);
        }
    }
    let token_rows: Vec<Vec<u32>> = inputs.into_iter().map(|(x, _)| x).collect();
    let batch = PaddedBatch::new(&token_rows, pad_id, Padding::Right, &dev)?;
    let hidden = model.forward_rows(&batch.ids, &batch.positions, &batch.bias, None, mode)?; // (b·len, h)
    let n = positions.len();
    let picked = hidden.index_select(&Tensor::new(positions.as_slice(), &dev)?, 0)?;
    let logits = model.lm_head(&picked)?; // (n, vocab)
    let token_lp = super::ops::token_log_probs(&logits, &Tensor::new(targets.as_slice(), &dev)?)?; // (n,)

    // Sum per row with a 0/1 ownership matrix (b, n): differentiable and one small GEMM.
    let mut own = vec![0f32; b * n];
    for (j, &r) in owner.iter().enumerate() {
        own[r * n + j] = 1.0;
    }
    let own = Tensor::from_vec(own, (b, n), &dev)?.to_dtype(token_lp.dtype())?;
    Ok(own.matmul(&token_lp.unsqueeze(1)?)?.squeeze(1)?)
}
