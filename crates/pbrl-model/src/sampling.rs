//! Batched sampling with a KV cache over left-padded prompts.
//!
//! Every row has its own seeded ChaCha stream, so a row's tokens depend on its seed and logits
//! only, not on which other rows share its batch. Finished rows leave the batch (their cache rows
//! are dropped), so a long answer does not keep short ones computing.
use anyhow::Result;
use candle_core::{Tensor, D};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::batch::{attention_bias, position_ids, PaddedBatch, Padding};
use super::mode::Mode;
use super::transformer::CausalLm;

#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy decoding.
    pub temperature: f64,
    pub top_p: f64,
    pub top_k: Option<usize>,
    pub max_new_tokens: usize,
}

/// One row to sample: a tokenized prompt and the seed of its random stream.
#[derive(Debug, Clone)]
pub struct SampleRequest {
    pub prompt: Vec<u32>,
    pub seed: u64,
}

/// Bytes a `sample` call over `rows` requests of up to `seq_len` positions needs at its peak:
/// the preallocated KV cache of every layer, the logits of every row (and their host copy).
pub fn sampling_bytes(cfg: &super::ModelConfig, rows: usize, seq_len: usize) -> u128 {
    let kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim;
    let (rows, seq) = (rows as u128, seq_len as u128);
    rows * seq * kv as u128 * 4 + rows * cfg.vocab_size as u128 * 4 * 2
}

/// Generated token ids per request (the stop token included when one was produced).
pub fn sample(
    model: &CausalLm,
    requests: &[SampleRequest],
    params: &SamplingParams,
    stop_ids: &[u32],
    pad_id: u32,
    mut on_tokens: impl FnMut(usize),
) -> Result<Vec<Vec<u32>>> {
    let mut out: Vec<Vec<u32>> = vec![Vec::new(); requests.len()];
    if requests.is_empty() || params.max_new_tokens == 0 {
        return Ok(out);
    }
    let dev = model.device().clone();
    // Candidates of one item share their prompt: prefill each distinct prompt once, then give
    // every request its own copy of that prompt's cache rows.
    let (distinct, source) = super::batch::distinct_rows(requests.iter().map(|r| r.prompt.as_slice()));
    let batch = PaddedBatch::new(&distinct, pad_id, Padding::Left, &dev)?;
    let mut rngs: Vec<ChaCha8Rng> = requests.iter().map(|r| ChaCha8Rng::seed_from_u64(r.seed)).collect();
    let mut active: Vec<usize> = (0..requests.len()).collect();
    let len = batch.key_mask[0].len();
    let mut cache = model.new_cache_with_capacity(len + params.max_new_tokens);
    // Only the last prompt position's logits are needed: run the LM head on those rows alone.
    let hidden = model.forward_rows(&batch.ids, &batch.positions, &batch.bias, Some(&mut cache), Mode::Infer)?;
    let last_rows: Vec<u32> = (0..distinct.len()).map(|i| (i * len + len - 1) as u32).collect();
    let last_hidden = hidden.index_select(&Tensor::new(last_rows.as_slice(), &dev)?, 0)?;
    let expand = Tensor::new(source.as_slice(), &dev)?;
    if distinct.len() < requests.len() {
        cache.select_rows(&expand)?;
    }
    let mut key_mask: Vec<Vec<u8>> = source.iter().map(|&u| batch.key_mask[u as usize].clone()).collect();
    let mut last = model.lm_head(&last_hidden.index_select(&expand, 0)?)?;
    for step in 0..params.max_new_tokens {
        let rows: Vec<Vec<f32>> = last.to_dtype(candle_core::DType::F32)?.to_vec2()?;
        // Every row draws from its own stream, so the rows are picked in parallel with the same
        // tokens as one by one (a pick sorts the top-k of the whole vocabulary).
        let picks: Vec<u32> = {
            use rayon::prelude::*;
            // `active` is increasing, so the streams come out in slot order.
            let streams: Vec<(&[f32], &mut ChaCha8Rng)> = rngs
                .iter_mut()
                .enumerate()
                .filter_map(|(r, rng)| active.binary_search(&r).ok().map(|slot| (rows[slot].as_slice(), rng)))
                .collect();
            streams.into_par_iter().map(|(logits, rng)| pick_token(logits, params, rng)).collect()
        };
        let mut keep = Vec::with_capacity(active.len());
        let mut next = Vec::with_capacity(active.len());
        for (slot, (&r, &tok)) in active.iter().zip(&picks).enumerate() {
            out[r].push(tok);
            if !stop_ids.contains(&tok) {
                keep.push(slot);
                next.push(tok);
            }
        }
        on_tokens(active.len());
        if keep.is_empty() || step + 1 == params.max_new_tokens {
            break;
        }
        if keep.len() < active.len() {
            let idx: Vec<u32> = keep.iter().map(|&s| s as u32).collect();
            cache.select_rows(&Tensor::new(idx.as_slice(), &dev)?)?;
            key_mask = keep.iter().map(|&s| key_mask[s].clone()).collect();
            active = keep.iter().map(|&s| active[s]).collect();
        }
        for m in key_mask.iter_mut() {
            m.push(1);
        }
        let n = next.len();
        let ids = Tensor::from_vec(next, (n, 1), &dev)?;
        let pos = position_ids(&key_mask, 1, &dev)?;
        let bias = attention_bias(&key_mask, 1, &dev)?;
        last = model.forward(&ids, &pos, &bias, Some(&mut cache), Mode::Infer)?.squeeze(1)?;
    }
    Ok(out)
}

/// Greedy argmax of one row of logits (lowest index among equal maxima).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in logits.iter().enumerate() {
        if x > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Temperature, then top-k, then top-p (nucleus), then a draw: the order transformers applies.
pub fn pick_token(logits: &[f32], p: &SamplingParams, rng: &mut impl Rng) -> u32 {
    if p.temperature <= 0.0 {
        return argmax(logits);
    }
    let t = p.temperature as f32;
    let mut cand: Vec<(u32, f32)> = logits.iter().enumerate().map(|(i, &x)| (i as u32, x / t)).collect();
    if let Some(k) = p.top_k.filter(|&k| k > 0 && k < cand.len()) {
        cand.select_nth_unstable_by(k - 1, |a, b| b.1.total_cmp(&a.1));
        cand.truncate(k);
    }
    cand.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let max = cand[0].1;
    let mut probs: Vec<f64> = cand.iter().map(|c| ((c.1 - max) as f64).exp()).collect();
    let total: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|x| *x /= total);
    if p.top_p < 1.0 {
        // Keep the smallest prefix whose mass reaches top_p (at least one token).
        let mut mass = 0.0;
        let mut keep = probs.len();
        for (i, &x) in probs.iter().enumerate() {
            mass += x;
            if mass >= p.top_p {
                keep = i + 1;
                break;
            }
        }
        probs.truncate(keep);
        cand.truncate(keep);
    }
    let total: f64 = probs.iter().sum();
    let mut u = rng.random::<f64>() * total;
    for (c, &x) in cand.iter().zip(probs.iter()) {
        if u < x {
            return c.0;
        }
        u -= x;
    }
    cand[cand.len() - 1].0
}

/// Greedy decoding of a single prompt, the reference path for tests of the batched sampler.
pub fn greedy(model: &CausalLm, prompt: &[u32], max_new_tokens: usize, stop_ids: &[u32]) -> Result<Vec<u32>> {
    let dev = model.device().clone();
    let mut ids = prompt.to_vec();
    let mut out = Vec::new();
    for _ in 0..max_new_tokens {
        let n = ids.len();
        let t = Tensor::from_vec(ids.clone(), (1, n), &dev)?;
        let pos = Tensor::arange(0u32, n as u32, &dev)?.unsqueeze(0)?;
        let bias = attention_bias(&[vec![1u8; n]], n, &dev)?;
        let logits = model.forward(&t, &pos, &bias, None, Mode::Infer)?;
        let tok = logits.narrow(1, n - 1, 1)?.squeeze(1)?.argmax(D::Minus1)?.to_vec1::<u32>()?[0];
        out.push(tok);
        if stop_ids.contains(&tok) {
            break;
        }
        ids.push(tok);
    }
    Ok(out)
}
