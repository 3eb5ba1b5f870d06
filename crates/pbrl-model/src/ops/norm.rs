//! RMSNorm over the last dimension, fused forward and backward; the rotary embedding as a
//! composition of candle ops.
use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor, D};
use num_traits::Float;

use super::{contiguous_slice, cpu_float};
use crate::pool;

// ---------------------------------------------------------------------------------------------
// RMSNorm over the last dimension: y = x · r ⊙ w, r = 1/sqrt(mean(x²) + eps)

/// 1/sqrt(mean(x²) + eps) of one row, summed in f64 as the candle composition's mean is not:
/// the two agree to ~1e-7 relative.
fn inv_rms<T: Float>(x: &[T], eps: f64) -> T {
    let ms = x.iter().map(|v| v.to_f64().unwrap_or(f64::NAN).powi(2)).sum::<f64>() / x.len() as f64;
    T::from(1.0 / (ms + eps).sqrt()).unwrap_or(T::nan())
}

struct RmsNorm {
    eps: f64,
}

impl CustomOp2 for RmsNorm {
    fn name(&self) -> &'static str {
        "rms-norm"
    }

    fn cpu_fwd(&self, x: &CpuStorage, lx: &Layout, w: &CpuStorage, lw: &Layout) -> Result<(CpuStorage, Shape)> {
        fn run<T: Float + Send + Sync>(x: &[T], w: &[T], eps: f64) -> Vec<T> {
            let mut y = vec![T::zero(); x.len()];
            let d = w.len();
            pool::for_each_chunk_mut(&mut y, d, |r, y| {
                let x = &x[r * d..][..d];
                let r = inv_rms(x, eps);
                for i in 0..x.len() {
                    y[i] = x[i] * r * w[i];
                }
            });
            y
        }
        let eps = self.eps;
        let out = dispatch2!("rms-norm", (x, lx), (w, lw), |x, w| run(x, w, eps));
        Ok((out, lx.shape().clone()))
    }

    fn bwd(&self, x: &Tensor, w: &Tensor, _y: &Tensor, g: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let g = g.contiguous()?;
        let dx = x.apply_op3_no_bwd(w, &g, &RmsNormGradX { eps: self.eps })?;
        let dw = x.apply_op2_no_bwd(&g, &RmsNormGradW { eps: self.eps, dim: w.elem_count() })?;
        Ok((Some(dx), Some(dw)))
    }
}

/// dx = r · (g⊙w − x̂ · mean(g⊙w⊙x̂)), x̂ = x · r, row by row.
struct RmsNormGradX {
    eps: f64,
}

impl CustomOp3 for RmsNormGradX {
    fn name(&self) -> &'static str {
        "rms-norm-grad-x"
    }

    fn cpu_fwd(
        &self,
        x: &CpuStorage,
        lx: &Layout,
        w: &CpuStorage,
        lw: &Layout,
        g: &CpuStorage,
        lg: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        fn run<T: Float + Send + Sync>(x: &[T], w: &[T], g: &[T], eps: f64) -> Vec<T> {
            let d = w.len();
            let mut dx = vec![T::zero(); x.len()];
            pool::for_each_chunk_mut(&mut dx, d, |r, dx| {
                let (x, g) = (&x[r * d..][..d], &g[r * d..][..d]);
                let r = inv_rms(x, eps);
                let dot = (0..d).fold(T::zero(), |a, i| a + g[i] * w[i] * x[i] * r) / T::from(d).unwrap_or(T::nan());
                for i in 0..d {
                    dx[i] = r * (g[i] * w[i] - x[i] * r * dot);
                }
            });
            dx
        }
        let n = "rms-norm-grad-x";
        let out = match (x, w, g) {
            (CpuStorage::F32(x), CpuStorage::F32(w), CpuStorage::F32(g)) => CpuStorage::F32(run(
                contiguous_slice(x, lx, n)?,
                contiguous_slice(w, lw, n)?,
                contiguous_slice(g, lg, n)?,
                self.eps,
            )),
            (CpuStorage::F64(x), CpuStorage::F64(w), CpuStorage::F64(g)) => CpuStorage::F64(run(
                contiguous_slice(x, lx, n)?,
                contiguous_slice(w, lw, n)?,
                contiguous_slice(g, lg, n)?,
                self.eps,
            )),
            _ => candle_core::bail!("{n}: operands must all be f32 or all f64"),
        };
        Ok((out, lx.shape().clone()))
    }
}

/// dw = Σ_rows g ⊙ x̂, summed over fixed blocks of rows in a fixed order (deterministic under
/// any thread count).
struct RmsNormGradW {
    eps: f64,
    dim: usize,
}

impl CustomOp2 for RmsNormGradW {
    fn name(&self) -> &'static str {
        "rms-norm-grad-w"
    }

    fn cpu_fwd(&self, x: &CpuStorage, lx: &Layout, g: &CpuStorage, lg: &Layout) -> Result<(CpuStorage, Shape)> {
        fn run<T: Float + Send + Sync>(x: &[T], g: &[T], d: usize, eps: f64) -> Vec<T> {
            const BLOCK_ROWS: usize = 64;
            let block = d * BLOCK_ROWS;
            let partial: Vec<Vec<T>> = pool::map(x.len().div_ceil(block), |b| {
                let rows = b * block..((b + 1) * block).min(x.len());
                let mut acc = vec![T::zero(); d];
                for (x, g) in x[rows.clone()].chunks(d).zip(g[rows].chunks(d)) {
                    let r = inv_rms(x, eps);
                    for i in 0..d {
                        acc[i] = acc[i] + g[i] * x[i] * r;
                    }
                }
                acc
            });
            let mut dw = vec![T::zero(); d];
            for p in partial {
                dw.iter_mut().zip(p).for_each(|(a, b)| *a = *a + b);
            }
            dw
        }
        let (d, eps) = (self.dim, self.eps);
        let out = dispatch2!("rms-norm-grad-w", (x, lx), (g, lg), |x, g| run(x, g, d, eps));
        Ok((out, Shape::from(d)))
    }
}

/// Differentiable RMSNorm of x over its last dimension with weight w (shape: that dimension).
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    if cpu_float(x) && w.dtype() == x.dtype() && x.dims().last() == Some(&w.elem_count()) {
        return x.contiguous()?.apply_op2(&w.contiguous()?, RmsNorm { eps });
    }
    rms_norm_composite(x, w, eps)
}

/// RMSNorm from differentiable candle ops (the golden gradients' own formula).
pub fn rms_norm_composite(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
    x.broadcast_div(&(ms + eps)?.sqrt()?)?.broadcast_mul(w)
}

// ---------------------------------------------------------------------------------------------
// Rotary embedding (rotate-half layout)

/// Rotate-half rope on x: (b, heads, s, d) with cos/sin: (b, s, d/2), from differentiable
/// candle ops (the fused CPU path rotates inside [`split_heads`]).
pub fn rope_composite(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let cos = Tensor::cat(&[cos, cos], D::Minus1)?.unsqueeze(1)?;
    let sin = Tensor::cat(&[sin, sin], D::Minus1)?.unsqueeze(1)?;
    let d = x.dim(D::Minus1)?;
    let x1 = x.narrow(D::Minus1, 0, d / 2)?;
    let x2 = x.narrow(D::Minus1, d / 2, d / 2)?;
    let rotated = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
    x.broadcast_mul(&cos)? + rotated.broadcast_mul(&sin)?
}
