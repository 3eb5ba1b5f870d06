//! Softmax over the last dimension, fused forward and backward.
use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor, D};
use num_traits::Float;

use super::exp::ExpSlice;
use super::{contiguous_slice, cpu_float};
use crate::pool;

// ---------------------------------------------------------------------------------------------
// Softmax over the last dimension

/// One row's softmax, in place: `e^(y − max) / Σ`.
fn softmax_in_place<T: ExpSlice>(y: &mut [T]) {
    let max = y.iter().fold(T::neg_infinity(), |a, &b| a.max(b));
    y.iter_mut().for_each(|v| *v = *v - max);
    T::exp_in_place(y);
    let inv = y.iter().fold(T::zero(), |s, &v| s + v).recip();
    y.iter_mut().for_each(|v| *v = *v * inv);
}

struct Softmax;

impl CustomOp1 for Softmax {
    fn name(&self) -> &'static str {
        "softmax-last-dim"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        fn run<T: ExpSlice + Send + Sync>(x: &[T], d: usize) -> Vec<T> {
            let mut y = vec![T::zero(); x.len()];
            pool::for_each_chunk_mut(&mut y, d, |r, y| {
                y.copy_from_slice(&x[r * d..][..d]);
                softmax_in_place(y);
            });
            y
        }
        let d = l.shape().dims().last().copied().unwrap_or(1);
        let out = dispatch!(s, |v| run(contiguous_slice(v, l, "softmax")?, d));
        Ok((out, l.shape().clone()))
    }

    fn bwd(&self, _x: &Tensor, y: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(y.apply_op2_no_bwd(&g.contiguous()?, &SoftmaxGrad { scale: 1.0 })?))
    }
}

/// dx = scale · y ⊙ (g − Σ g⊙y), row by row (scale 1 for a plain softmax).
struct SoftmaxGrad {
    scale: f64,
}

impl CustomOp2 for SoftmaxGrad {
    fn name(&self) -> &'static str {
        "softmax-grad"
    }

    fn cpu_fwd(&self, y: &CpuStorage, ly: &Layout, g: &CpuStorage, lg: &Layout) -> Result<(CpuStorage, Shape)> {
        fn run<T: Float + std::iter::Sum + Send + Sync>(y: &[T], g: &[T], d: usize, scale: f64) -> Vec<T> {
            let scale = T::from(scale).unwrap_or(T::nan());
            let mut dx = vec![T::zero(); y.len()];
            pool::for_each_chunk_mut(&mut dx, d, |r, dx| {
                let (y, g) = (&y[r * d..][..d], &g[r * d..][..d]);
                let dot = (0..d).map(|i| g[i] * y[i]).sum::<T>();
                for i in 0..d {
                    dx[i] = scale * y[i] * (g[i] - dot);
                }
            });
            dx
        }
        let d = ly.shape().dims().last().copied().unwrap_or(1);
        let (n, scale) = ("softmax-grad", self.scale);
        let out = dispatch2!(n, (y, ly), (g, lg), |y, g| run(y, g, d, scale));
        Ok((out, ly.shape().clone()))
    }
}

// ---------------------------------------------------------------------------------------------
// Attention's probabilities: softmax(scale · scores + mask) in one pass

/// `softmax(scale · s + mask)` over the last dimension, for scores s (b, h, q, k) and an
/// additive mask (b, q, k) shared by the h heads: one pass forward, where the composition
/// makes three (the scaling, the masked sum, the softmax), and one backward,
/// `ds = scale · y ⊙ (g − Σ g⊙y)`, where it makes the softmax's and two more, each with
/// candle's `zeros + grad`. The mask takes no gradient.
struct MaskedSoftmax {
    scale: f64,
}

impl CustomOp2 for MaskedSoftmax {
    fn name(&self) -> &'static str {
        "masked-softmax"
    }

    fn cpu_fwd(&self, s: &CpuStorage, ls: &Layout, m: &CpuStorage, lm: &Layout) -> Result<(CpuStorage, Shape)> {
        fn run<T: ExpSlice + Send + Sync>(
            s: &[T],
            mask: &[T],
            (q, k): (usize, usize),
            rows_per_batch: usize,
            scale: f64,
        ) -> Vec<T> {
            let scale = T::from(scale).unwrap_or(T::nan());
            let mut y = vec![T::zero(); s.len()];
            pool::for_each_chunk_mut(&mut y, k, |r, y| {
                let (x, mask) = (&s[r * k..][..k], &mask[((r / rows_per_batch) * q + r % q) * k..][..k]);
                for i in 0..k {
                    y[i] = x[i] * scale + mask[i];
                }
                softmax_in_place(y);
            });
            y
        }
        let (b, h, q, k) = ls.shape().dims4()?;
        if lm.shape().dims3()? != (b, q, k) {
            candle_core::bail!("masked-softmax: a mask of {:?} for scores of {:?}", lm.shape(), ls.shape());
        }
        let scale = self.scale;
        let out = dispatch2!("masked-softmax", (s, ls), (m, lm), |s, m| run(s, m, (q, k), h * q, scale));
        Ok((out, ls.shape().clone()))
    }

    fn bwd(&self, _s: &Tensor, _m: &Tensor, y: &Tensor, g: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        Ok((Some(y.apply_op2_no_bwd(&g.contiguous()?, &SoftmaxGrad { scale: self.scale })?), None))
    }
}

/// `softmax(scale · scores + mask)` over the last dimension, differentiable in the scores:
/// scores (b, h, q, k), mask (b, q, k) added to every head's.
pub fn masked_softmax(scores: &Tensor, mask: &Tensor, scale: f64) -> Result<Tensor> {
    if cpu_float(scores) && mask.dtype() == scores.dtype() && mask.device().is_cpu() && !mask.track_op() {
        return scores.contiguous()?.apply_op2(&mask.contiguous()?, MaskedSoftmax { scale });
    }
    masked_softmax_composite(scores, mask, scale)
}

/// [`masked_softmax`] from differentiable candle ops.
pub fn masked_softmax_composite(scores: &Tensor, mask: &Tensor, scale: f64) -> Result<Tensor> {
    softmax_composite(&(scores * scale)?.broadcast_add(&mask.unsqueeze(1)?)?)
}

/// Differentiable softmax over the last dimension.
pub fn softmax_last_dim(x: &Tensor) -> Result<Tensor> {
    if cpu_float(x) {
        return x.contiguous()?.apply_op1(Softmax);
    }
    softmax_composite(x)
}

/// Softmax from differentiable candle ops.
pub fn softmax_composite(x: &Tensor) -> Result<Tensor> {
    candle_nn::ops::softmax(x, D::Minus1)
}
