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

/// Sequences of rows that branch off shared prefixes, the layout behind prompt sharing in
/// scoring and the reward model's packed pairs. A branch's tokens sit at their own row's
/// positions (RoPE sees `prefix..`) and attend to their prefix's columns and to their own branch
/// up to themselves, never to a sibling branch, so every token's hidden state is the one its row
/// gives alone (the causal mask makes a prefix's states independent of what follows) while each
/// prefix runs once. Sequences are right-padded to `len`; a padding query (its output is never
/// read) attends to its sequence's tokens, so its softmax stays finite.
pub struct BranchPack {
    len: usize,
    /// Padding where nothing was pushed.
    ids: Vec<u32>,
    positions: Vec<u32>,
    bias: Vec<f32>,
    /// The next free column of each sequence.
    filled: Vec<usize>,
}

impl BranchPack {
    pub fn new(sequences: usize, len: usize, pad_id: u32) -> Self {
        Self {
            len,
            ids: vec![pad_id; sequences * len],
            positions: vec![0; sequences * len],
            bias: vec![MASKED; sequences * len * len],
            filled: vec![0; sequences],
        }
    }

    /// Append `tokens` to sequence `seq` at positions `first_position..`, each attending to the
    /// columns `prefix` and to this branch's tokens up to itself (a row's start: an empty
    /// `prefix`). Returns the columns the tokens took.
    pub fn push(
        &mut self,
        seq: usize,
        tokens: &[u32],
        first_position: usize,
        prefix: std::ops::Range<usize>,
    ) -> std::ops::Range<usize> {
        let (len, start) = (self.len, self.filled[seq]);
        for (k, &id) in tokens.iter().enumerate() {
            let col = seq * len + start + k;
            self.ids[col] = id;
            self.positions[col] = (first_position + k) as u32;
            let keys = &mut self.bias[col * len..(col + 1) * len];
            keys[prefix.clone()].fill(0.0);
            keys[start..=start + k].fill(0.0);
        }
        self.filled[seq] = start + tokens.len();
        start..self.filled[seq]
    }

    /// Pad every sequence (positions repeat its last one) and make the model's inputs: ids and
    /// positions (sequences, len), the additive bias (sequences, 1, len, len).
    pub fn finish(mut self, dev: &Device) -> Result<(Tensor, Tensor, Tensor)> {
        let (len, n) = (self.len, self.filled.len());
        for (seq, &used) in self.filled.iter().enumerate() {
            let last = if used > 0 { self.positions[seq * len + used - 1] } else { 0 };
            for col in seq * len + used..(seq + 1) * len {
                self.positions[col] = last;
                self.bias[col * len..col * len + used].fill(0.0);
            }
        }
        Ok((
            Tensor::from_vec(self.ids, (n, len), dev)?,
            Tensor::from_vec(self.positions, (n, len), dev)?,
            Tensor::from_vec(self.bias, (n, 1, len, len), dev)?,
        ))
    }
}

/// Pairs of token rows that begin alike (a winner's and a loser's joint text, which share the
/// header and the first agent's prompt), one [`BranchPack`] sequence per pair: the first row,
/// then the second row's tokens after the common prefix, branching off that prefix.
pub struct PairBatch {
    pub ids: Tensor,       // (b, len) u32
    pub positions: Tensor, // (b, len) u32
    pub bias: Tensor,      // (b, 1, len, len) f32
    /// Per pair: the column of the first row's last token and of the second row's.
    pub last: Vec<(usize, usize)>,
}

/// How many first tokens two rows have in common.
fn common_prefix_len(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl PairBatch {
    /// Pack `pairs` (both rows non-empty) into one batch.
    pub fn new(pairs: &[(&[u32], &[u32])], pad_id: u32, dev: &Device) -> Result<Self> {
        anyhow::ensure!(!pairs.is_empty(), "empty batch");
        anyhow::ensure!(pairs.iter().all(|(a, b)| !a.is_empty() && !b.is_empty()), "an empty row cannot be packed");
        let prefixes: Vec<usize> = pairs.iter().map(|(a, b)| common_prefix_len(a, b)).collect();
        let len = pairs.iter().zip(&prefixes).map(|((a, b), p)| a.len() + b.len() - p).max().unwrap_or(1);
        let mut pack = BranchPack::new(pairs.len(), len, pad_id);
        let mut last = Vec::with_capacity(pairs.len());
        for (r, (&(a, b), &p)) in pairs.iter().zip(&prefixes).enumerate() {
            let first = pack.push(r, a, 0, 0..0);
            let prefix = first.start..first.start + p;
            let second = pack.push(r, &b[p..], p, prefix.clone());
            // The second row's last token is in its continuation, or (a row that is a prefix of
            // the first) the prefix's last token.
            last.push((first.end - 1, if second.is_empty() { prefix.end - 1 } else { second.end - 1 }));
        }
        let (ids, positions, bias) = pack.finish(dev)?;
        Ok(Self { ids, positions, bias, last })
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
    fn pair_batches_pack_the_common_prefix_once_and_keep_each_row_to_itself() {
        let dev = Device::Cpu;
        // Prefix [1, 2] shared; the second pair's second row is a prefix of its first.
        let pairs: Vec<(&[u32], &[u32])> = vec![(&[1, 2, 3, 4], &[1, 2, 5]), (&[7, 8, 9], &[7, 8])];
        let b = PairBatch::new(&pairs, 0, &dev).unwrap();
        assert_eq!(b.ids.to_vec2::<u32>().unwrap(), vec![vec![1, 2, 3, 4, 5], vec![7, 8, 9, 0, 0]]);
        assert_eq!(b.positions.to_vec2::<u32>().unwrap(), vec![vec![0, 1, 2, 3, 2], vec![0, 1, 2, 2, 2]]);
        assert_eq!(b.last, vec![(3, 4), (2, 1)]);
        let bias: Vec<Vec<Vec<f32>>> = b.bias.squeeze(1).unwrap().to_vec3().unwrap();
        let open = |r: usize, i: usize| -> Vec<usize> { (0..5).filter(|&j| bias[r][i][j] == 0.0).collect() };
        assert_eq!(open(0, 3), vec![0, 1, 2, 3], "the first row is causal");
        assert_eq!(open(0, 4), vec![0, 1, 4], "the second row sees the prefix and itself, not the first's rest");
        assert_eq!(open(1, 1), vec![0, 1]);
        assert_eq!(open(1, 4), vec![0, 1, 2], "padding sees the packed row only");
        assert!(PairBatch::new(&[(&[1], &[])], 0, &dev).is_err());
    }

    #[test]
    fn branch_packs_keep_each_group_and_each_branch_to_itself() {
        // One sequence, two groups: prompt [1, 2] with branches [3] and [4, 5]; prompt [6].
        let mut pack = BranchPack::new(1, 8, 0);
        let p = pack.push(0, &[1, 2], 0, 0..0);
        assert_eq!((pack.push(0, &[3], 2, p.clone()), pack.push(0, &[4, 5], 2, p)), (2..3, 3..5));
        assert_eq!(pack.push(0, &[6], 0, 5..5), 5..6);
        let (ids, positions, bias) = pack.finish(&Device::Cpu).unwrap();
        assert_eq!(ids.to_vec2::<u32>().unwrap(), vec![vec![1, 2, 3, 4, 5, 6, 0, 0]]);
        assert_eq!(positions.to_vec2::<u32>().unwrap(), vec![vec![0, 1, 2, 2, 3, 0, 0, 0]]);
        let bias: Vec<Vec<f32>> = bias.squeeze(0).unwrap().squeeze(0).unwrap().to_vec2().unwrap();
        let open = |i: usize| -> Vec<usize> { (0..8).filter(|&j| bias[i][j] == 0.0).collect() };
        assert_eq!(open(1), vec![0, 1], "a prompt is causal");
        assert_eq!(open(2), vec![0, 1, 2]);
        assert_eq!(open(4), vec![0, 1, 3, 4], "a branch sees its prompt and itself, not its sibling");
        assert_eq!(open(5), vec![5], "a second group starts afresh");
        assert_eq!(open(7), (0..6).collect::<Vec<_>>(), "padding sees the sequence's tokens");
    }

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
