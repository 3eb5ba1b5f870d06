//! Softmax over the last dimension, fused forward and backward.
use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor, D};
use num_traits::Float;

use super::exp::ExpSlice;
use super::{contiguous_slice, cpu_float};
use crate::model::pool;

// ---------------------------------------------------------------------------------------------
// Softmax over the last dimension

struct Softmax;

impl CustomOp1 for Softmax {
    fn name(&self) -> &'static str {
        "softmax-last-dim"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        fn run<T: ExpSlice + Send + Sync>(x: &[T], d: usize) -> Vec<T> {
            let mut y = vec![T::zero(); x.len()];
            pool::for_each_chunk_mut(&mut y, d, |r, y| {
                let x = &x[r * d..][..d];
                let max = x.iter().fold(T::neg_infinity(), |a, &b| a.max(b));
                for i in 0..d {
                    y[i] = x[i] - max;
                }
                T::exp_in_place(y);
                let sum = y.iter().fold(T::zero(), |s, &v| s + v);
                let inv = sum.recip();
                y.iter_mut().for_each(|v| *v = *v * inv);
            });
            y
        }
        let d = l.shape().dims().last().copied().unwrap_or(1);
        let out = dispatch!(s, |v| run(contiguous_slice(v, l, "softmax")?, d));
        Ok((out, l.shape().clone()))
    }

    fn bwd(&self, _x: &Tensor, y: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(y.apply_op2_no_bwd(&g.contiguous()?, &SoftmaxGrad)?))
    }
}

/// dx = y ⊙ (g − Σ g⊙y), row by row.
struct SoftmaxGrad;

impl CustomOp2 for SoftmaxGrad {
    fn name(&self) -> &'static str {
        "softmax-grad"
    }

    fn cpu_fwd(&self, y: &CpuStorage, ly: &Layout, g: &CpuStorage, lg: &Layout) -> Result<(CpuStorage, Shape)> {
        fn run<T: Float + std::iter::Sum + Send + Sync>(y: &[T], g: &[T], d: usize) -> Vec<T> {
            let mut dx = vec![T::zero(); y.len()];
            pool::for_each_chunk_mut(&mut dx, d, |r, dx| {
                let (y, g) = (&y[r * d..][..d], &g[r * d..][..d]);
                let dot = (0..d).map(|i| g[i] * y[i]).sum::<T>();
                for i in 0..d {
                    dx[i] = y[i] * (g[i] - dot);
                }
            });
            dx
        }
        let d = ly.shape().dims().last().copied().unwrap_or(1);
        let n = "softmax-grad";
        let out = dispatch2!(n, (y, ly), (g, lg), |y, g| run(y, g, d));
        Ok((out, ly.shape().clone()))
    }
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
