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

/// Pairs of token rows that begin alike (a winner's and a loser's joint text, which share the
/// header and the first agent's prompt), one packed row per pair: the first row, then the second
/// row's tokens after the common prefix. The second row's continuation sits at its own positions
/// (RoPE sees `prefix..`) and attends to the prefix and to itself only, never to the first row's
/// continuation, so every token's hidden state is the one its own row gives alone (the causal mask
/// makes the prefix's states independent of what follows), while the prefix runs once. Rows are
/// right-padded to the longest packed row.
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
        // Per pair: (first row's length, common prefix, packed length).
        let shapes: Vec<(usize, usize, usize)> = pairs
            .iter()
            .map(|(a, b)| {
                let p = common_prefix_len(a, b);
                (a.len(), p, a.len() + b.len() - p)
            })
            .collect();
        let len = shapes.iter().map(|s| s.2).max().unwrap_or(1);
        let n = pairs.len();
        let (mut ids, mut positions) = (Vec::with_capacity(n * len), Vec::with_capacity(n * len));
        let mut bias = vec![MASKED; n * len * len];
        let mut last = Vec::with_capacity(n);
        for (r, (&(a, b), &(na, p, packed))) in pairs.iter().zip(&shapes).enumerate() {
            ids.extend_from_slice(a);
            ids.extend_from_slice(&b[p..]);
            ids.extend(std::iter::repeat_n(pad_id, len - packed));
            positions.extend(0..na as u32);
            positions.extend(p as u32..b.len() as u32);
            let end = positions.last().copied().unwrap_or(0);
            positions.extend(std::iter::repeat_n(end, len - packed));
            for i in 0..len {
                let row = &mut bias[(r * len + i) * len..(r * len + i + 1) * len];
                // Keys a query attends to: its own row's earlier tokens; a padding query (its
                // output is never read) the whole packed row, so its softmax stays finite.
                let keys = |j: usize| match i {
                    i if i < na => j <= i,
                    i if i < packed => j < p || (na..=i).contains(&j),
                    _ => j < packed,
                };
                for (j, x) in row.iter_mut().enumerate() {
                    if keys(j) {
                        *x = 0.0;
                    }
                }
            }
            // The second row's last token is in its continuation, or (a row that is a prefix of
            // the first) the prefix's last token.
            last.push((na - 1, if b.len() > p { packed - 1 } else { p - 1 }));
        }
        Ok(Self {
            ids: Tensor::from_vec(ids, (n, len), dev)?,
            positions: Tensor::from_vec(positions, (n, len), dev)?,
            bias: Tensor::from_vec(bias, (n, 1, len, len), dev)?,
            last,
        })
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
