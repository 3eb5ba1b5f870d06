//! Log-probabilities of completions given prompts: summed per row (`sequence_log_probs`, what
//! every preference loss is built from) or per token (`token_log_probs`, what RL and KL terms
//! need).
//!
//! Only the positions that predict completion tokens go through the LM head, and the log-prob of
//! a token is `logit[target] - logsumexp(logits)`: no full log_softmax copy of the vocabulary is
//! materialised for the prompt positions.
use anyhow::Result;
use candle_core::Tensor;

use super::batch::BranchPack;
use super::mode::Mode;
use super::transformer::CausalLm;

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

/// How many of a row's completion tokens are scored.
pub fn scored_tokens(row: &ScoreRow, last: LastToken) -> usize {
    match last {
        LastToken::Include => row.completion.len(),
        LastToken::Exclude => row.completion.len().saturating_sub(1),
    }
}

/// Packed sequences are filled up to this many tokens. Attention memory grows with its square,
/// so it stays near the length of one prompt with its completions.
const PACK_TOKENS: usize = 256;

/// Per-token log-probs of a batch of rows: `values` (n,) holds every scored token's
/// log p(token | prefix), differentiable in `Mode::Train`; row `i`'s tokens are
/// `values[spans[i]]`, in completion order (empty for a row with nothing to score).
pub struct TokenLogProbs {
    pub values: Tensor,
    pub spans: Vec<std::ops::Range<usize>>,
}

impl TokenLogProbs {
    /// Row `i`'s per-token log-probs as numbers.
    pub fn row(&self, i: usize) -> Result<Vec<f32>> {
        let span = &self.spans[i];
        Ok(self.values.narrow(0, span.start, span.len())?.to_dtype(candle_core::DType::F32)?.to_vec1()?)
    }
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
    let Some(tokens) = token_log_probs(model, rows, last, pad_id, mode)? else {
        return Ok(Tensor::zeros(b, model.dtype(), &dev)?);
    };
    // Sum per row with a 0/1 ownership matrix (b, n): differentiable and one small GEMM.
    let n = tokens.values.dim(0)?;
    let mut own = vec![0f32; b * n];
    for (r, span) in tokens.spans.iter().enumerate() {
        for j in span.clone() {
            own[r * n + j] = 1.0;
        }
    }
    let own = Tensor::from_vec(own, (b, n), &dev)?.to_dtype(tokens.values.dtype())?;
    Ok(own.matmul(&tokens.values.unsqueeze(1)?)?.squeeze(1)?)
}

/// log p(completion token | prefix) of every scored token (`None` when no row has one).
///
/// Rows with the same prompt share one copy of it (a preference pair's winner and loser do):
/// a packed sequence holds `prompt, completion 1, completion 2, …` per prompt, each completion
/// attending to its prompt and its own earlier tokens only, its positions continuing from the
/// prompt's. The log-probs are those of each row scored alone (tested against transformers);
/// the forward and backward passes see each shared prompt once and no padding between rows.
pub fn token_log_probs(
    model: &CausalLm,
    rows: &[ScoreRow],
    last: LastToken,
    pad_id: u32,
    mode: Mode,
) -> Result<Option<TokenLogProbs>> {
    let dev = model.device().clone();
    let n_scored = |r: &ScoreRow| scored_tokens(r, last);
    if let Some(r) = rows.iter().find(|r| r.prompt.is_empty() && n_scored(r) > 0) {
        anyhow::bail!("cannot score a completion without a prompt ({} completion tokens)", r.completion.len());
    }
    // Prompt groups, in order of first appearance; only rows with something to score.
    let mut groups: Vec<(&[u32], Vec<usize>)> = Vec::new();
    for (i, r) in rows.iter().enumerate().filter(|(_, r)| n_scored(r) > 0) {
        match groups.iter_mut().find(|(p, _)| *p == r.prompt.as_slice()) {
            Some((_, members)) => members.push(i),
            None => groups.push((&r.prompt, vec![i])),
        }
    }
    if groups.is_empty() {
        return Ok(None);
    }
    // A group's input: the prompt, then each completion without its last token.
    let group_len =
        |(p, m): &(&[u32], Vec<usize>)| p.len() + m.iter().map(|&i| rows[i].completion.len() - 1).sum::<usize>();
    let mut packs: Vec<Vec<usize>> = Vec::new(); // group indices per packed sequence
    let mut fill = 0;
    for (g, group) in groups.iter().enumerate() {
        let n = group_len(group);
        match packs.last_mut() {
            Some(pack) if fill + n <= PACK_TOKENS => {
                pack.push(g);
                fill += n;
            }
            _ => {
                packs.push(vec![g]);
                fill = n;
            }
        }
    }
    let len = packs.iter().map(|pk| pk.iter().map(|&g| group_len(&groups[g])).sum::<usize>()).max().unwrap_or(1);

    let mut pack = BranchPack::new(packs.len(), len, pad_id);
    let mut positions = Vec::new(); // flat index into (packs · len) of each scored position
    let mut targets = Vec::new();
    let mut spans = vec![0..0; rows.len()]; // each row's scored positions, contiguous
    for (k, groups_here) in packs.iter().enumerate() {
        let base = k * len;
        for &g in groups_here {
            let (prompt, members) = &groups[g];
            let p = prompt.len();
            let prompt_cols = pack.push(k, prompt, 0, 0..0);
            for &i in members {
                let c = &rows[i].completion;
                let branch = pack.push(k, &c[..c.len() - 1], p, prompt_cols.clone());
                let first = positions.len();
                // completion[0] is predicted by the prompt's last token, completion[j] by completion[j-1].
                for (j, &target) in c.iter().take(n_scored(&rows[i])).enumerate() {
                    let col = if j == 0 { prompt_cols.end - 1 } else { branch.start + j - 1 };
                    positions.push((base + col) as u32);
                    targets.push(target);
                }
                spans[i] = first..positions.len();
            }
        }
    }
    let (ids, pos, bias) = pack.finish(&dev)?;
    let hidden = model.forward_rows(&ids, &pos, &bias, None, mode)?; // (packs·len, h)
    let picked = hidden.index_select(&Tensor::new(positions.as_slice(), &dev)?, 0)?;
    let logits = model.lm_head(&picked)?; // (n, vocab)
    let values = super::ops::token_log_probs(&logits, &Tensor::new(targets.as_slice(), &dev)?)?; // (n,)
    Ok(Some(TokenLogProbs { values, spans }))
}
