//! Padded batches of token rows: ids, position ids and the additive attention bias.
//!
//! Training and scoring batches are right-padded (positions count the real tokens, so they are
//! `arange` over them and padding repeats the last); sampling
//! batches are left-padded so every row's next token sits in the last column.
use anyhow::Result;
use candle_core::{Device, Tensor};

/// Additive bias value for a masked key. Finite, so a query row whose keys are all masked
/// (a left-pad row) gives a uniform softmax instead of NaN.
pub const MASKED: f32 = -1e9;

/// Which side the padding goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Padding {
    Left,
    Right,
}

/// The distinct rows of `rows` in order of first appearance, and each row's index among them:
/// rows that repeat (the candidates of one prompt, a response in several pairs) are computed
/// once and their results picked back out with `index_select`.
pub fn distinct_rows<'a>(rows: impl IntoIterator<Item = &'a [u32]>) -> (Vec<Vec<u32>>, Vec<u32>) {
    let mut distinct: Vec<Vec<u32>> = Vec::new();
    let mut index: std::collections::HashMap<&[u32], u32> = std::collections::HashMap::new();
    let source = rows
        .into_iter()
        .map(|row| {
            *index.entry(row).or_insert_with(|| {
                distinct.push(row.to_vec());
                (distinct.len() - 1) as u32
            })
        })
        .collect();
    (distinct, source)
}

/// A batch ready for `CausalLm::forward`.
pub struct PaddedBatch {
    pub ids: Tensor,       // (b, len) u32
    pub positions: Tensor, // (b, len) u32
    pub bias: Tensor,      // (b, 1, len, len) f32
    /// 1 for real tokens, 0 for padding, per row over the whole length.
    pub key_mask: Vec<Vec<u8>>,
    /// Column where each row's tokens start (left padding) or 0 (right padding).
    pub offsets: Vec<usize>,
    pub lengths: Vec<usize>,
}

impl PaddedBatch {
    pub fn new(rows: &[Vec<u32>], pad_id: u32, padding: Padding, dev: &Device) -> Result<Self> {
        anyhow::ensure!(!rows.is_empty(), "empty batch");
        let len = rows.iter().map(|r| r.len()).max().unwrap_or(0).max(1);
        let b = rows.len();
        let mut ids = Vec::with_capacity(b * len);
        let mut key_mask = Vec::with_capacity(b);
        let mut offsets = Vec::with_capacity(b);
        for r in rows {
            let pad = len - r.len();
            let (mask, off) = match padding {
                Padding::Left => {
                    ids.extend(std::iter::repeat_n(pad_id, pad));
                    ids.extend_from_slice(r);
                    let mut m = vec![0u8; pad];
                    m.extend(std::iter::repeat_n(1u8, r.len()));
                    (m, pad)
                }
                Padding::Right => {
                    ids.extend_from_slice(r);
                    ids.extend(std::iter::repeat_n(pad_id, pad));
                    let mut m = vec![1u8; r.len()];
                    m.extend(std::iter::repeat_n(0u8, pad));
                    (m, 0)
                }
            };
            key_mask.push(mask);
            offsets.push(off);
        }
        let ids = Tensor::from_vec(ids, (b, len), dev)?;
        let positions = position_ids(&key_mask, len, dev)?;
        let bias = attention_bias(&key_mask, len, dev)?;
        Ok(Self { ids, positions, bias, key_mask, offsets, lengths: rows.iter().map(|r| r.len()).collect() })
    }
}

/// Causal + key-padding bias (b, 1, q_len, kv_len) for the last `q_len` queries of each row.
pub fn attention_bias(key_mask: &[Vec<u8>], q_len: usize, dev: &Device) -> Result<Tensor> {
    let b = key_mask.len();
    let kv = key_mask.first().map(|m| m.len()).unwrap_or(0);
    let off = kv - q_len;
    let mut v = vec![0f32; b * q_len * kv];
    for (bi, m) in key_mask.iter().enumerate() {
        for i in 0..q_len {
            let row = &mut v[(bi * q_len + i) * kv..(bi * q_len + i + 1) * kv];
            for (j, x) in row.iter_mut().enumerate() {
                if j > off + i || m[j] == 0 {
                    *x = MASKED;
                }
            }
        }
    }
    Ok(Tensor::from_vec(v, (b, 1, q_len, kv), dev)?)
}

/// Position ids `max(cumsum(mask) - 1, 0)` over each row; the last `q_len` are returned.
pub fn position_ids(key_mask: &[Vec<u8>], q_len: usize, dev: &Device) -> Result<Tensor> {
    let b = key_mask.len();
    let mut out = Vec::with_capacity(b * q_len);
    for m in key_mask {
        let mut c: i64 = -1;
        let row: Vec<u32> = m
            .iter()
            .map(|&x| {
                c += x as i64;
                c.max(0) as u32
            })
            .collect();
        out.extend_from_slice(&row[row.len() - q_len..]);
    }
    Ok(Tensor::from_vec(out, (b, q_len), dev)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distinct_rows_keep_first_appearance_order_and_index_every_row() {
        let rows: Vec<Vec<u32>> = vec![vec![3, 1], vec![2], vec![3, 1], vec![], vec![2], vec![3]];
        let (distinct, source) = distinct_rows(rows.iter().map(|r| r.as_slice()));
        assert_eq!(distinct, vec![vec![3, 1], vec![2], vec![], vec![3]]);
        assert_eq!(source, vec![0, 1, 0, 2, 1, 3]);
        for (row, &i) in rows.iter().zip(&source) {
            assert_eq!(row, &distinct[i as usize]);
        }
    }
}
