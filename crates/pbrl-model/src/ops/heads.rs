//! Attention heads: split and merge, with the rotary embedding fused into the split.
use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape, Tensor};
use num_traits::Float;

use super::{contiguous_slice, cpu_float, rope_composite};
use crate::pool;

// ---------------------------------------------------------------------------------------------
// Attention heads: (b·s, n·d) ↔ (b, n, s, d), with the rotary embedding fused into the split

/// Splits rows of `n` heads into the (b, n, s, d) attention layout, optionally rotating each
/// head by its position's rope angles; `merge` is the inverse permutation. The backward of a
/// split is a merge (rotated back by −θ) and vice versa: one node and one pass instead of the
/// reshape, transpose, copy and rope nodes.
struct Heads {
    b: usize,
    s: usize,
    n: usize,
    d: usize,
    merge: bool,
    /// (cos, sin) of shape (b, s, d/2) and whether to rotate by −θ.
    rope: Option<(Tensor, Tensor, bool)>,
}

impl Heads {
    fn inverse(&self) -> Self {
        let rope = self.rope.as_ref().map(|(c, s, inv)| (c.clone(), s.clone(), !inv));
        Self { merge: !self.merge, rope, ..*self }
    }
}

fn cpu_float_slice<'a, T: candle_core::WithDType>(t: &'a candle_core::Storage, l: &Layout) -> Result<&'a [T]> {
    match t {
        candle_core::Storage::Cpu(c) => contiguous_slice(c.as_slice::<T>()?, l, "heads"),
        _ => candle_core::bail!("heads: rope tables must be on the CPU"),
    }
}

impl CustomOp1 for Heads {
    fn name(&self) -> &'static str {
        "heads"
    }

    fn cpu_fwd(&self, st: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        fn run<T: Float + candle_core::WithDType + Send + Sync>(op: &Heads, x: &[T]) -> Result<Vec<T>> {
            let (s, n, d) = (op.s, op.n, op.d);
            let half = d / 2;
            let guards = op.rope.as_ref().map(|(c, sn, inv)| (c.storage_and_layout(), sn.storage_and_layout(), *inv));
            let tables = match &guards {
                Some((c, sn, inv)) => {
                    Some((cpu_float_slice::<T>(&c.0, c.1)?, cpu_float_slice::<T>(&sn.0, sn.1)?, *inv))
                }
                None => None,
            };
            let mut y = vec![T::zero(); x.len()];
            // Work item = one (batch row, head, position) vector of d values.
            pool::for_each_chunk_mut(&mut y, d, |o, out| {
                // o indexes the output layout; find the input vector it comes from.
                let (bi, hi, si) =
                    if op.merge { (o / (s * n), o % n, (o / n) % s) } else { (o / (n * s), (o / s) % n, o % s) };
                let src = if op.merge { ((bi * n + hi) * s + si) * d } else { ((bi * s + si) * n + hi) * d };
                let v = &x[src..src + d];
                match tables {
                    None => out.copy_from_slice(v),
                    Some((cos, sin, inv)) => {
                        let off = (bi * s + si) * half;
                        for i in 0..half {
                            let (c, sn) = (cos[off + i], if inv { -sin[off + i] } else { sin[off + i] });
                            out[i] = v[i] * c - v[i + half] * sn;
                            out[i + half] = v[i + half] * c + v[i] * sn;
                        }
                    }
                }
            });
            Ok(y)
        }
        let shape = if self.merge {
            Shape::from((self.b * self.s, self.n * self.d))
        } else {
            Shape::from((self.b, self.n, self.s, self.d))
        };
        let out = dispatch!(st, |v| run(self, contiguous_slice(v, l, "heads")?)?);
        Ok((out, shape))
    }

    fn bwd(&self, _x: &Tensor, _y: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(g.contiguous()?.apply_op1_no_bwd(&self.inverse())?))
    }
}

/// (b·s, n·d) → (b, n, s, d), rotated by the rope tables (b, s, d/2) when given.
pub fn split_heads(
    x: &Tensor,
    b: usize,
    s: usize,
    n: usize,
    d: usize,
    rope_tables: Option<(&Tensor, &Tensor)>,
) -> Result<Tensor> {
    if cpu_float(x) {
        let rope = match rope_tables {
            Some((c, sn)) => Some((c.contiguous()?, sn.contiguous()?, false)),
            None => None,
        };
        return x.contiguous()?.apply_op1(Heads { b, s, n, d, merge: false, rope });
    }
    split_heads_composite(x, b, s, n, d, rope_tables)
}

/// Head split (and rope) from differentiable candle ops.
pub fn split_heads_composite(
    x: &Tensor,
    b: usize,
    s: usize,
    n: usize,
    d: usize,
    rope_tables: Option<(&Tensor, &Tensor)>,
) -> Result<Tensor> {
    let h = x.reshape((b, s, n, d))?.transpose(1, 2)?.contiguous()?;
    match rope_tables {
        Some((c, sn)) => rope_composite(&h, c, sn),
        None => Ok(h),
    }
}

/// (b, n, s, d) → (b·s, n·d).
pub fn merge_heads(x: &Tensor) -> Result<Tensor> {
    let (b, n, s, d) = x.dims4()?;
    if cpu_float(x) {
        return x.contiguous()?.apply_op1(Heads { b, s, n, d, merge: true, rope: None });
    }
    merge_heads_composite(x)
}

/// Head merge from differentiable candle ops.
pub fn merge_heads_composite(x: &Tensor) -> Result<Tensor> {
    let (b, n, s, d) = x.dims4()?;
    x.transpose(1, 2)?.reshape((b * s, n * d))
}
