//! Fused operations with a backward pass, for training.
//!
//! candle's autograd records every elementary op and accumulates each gradient as
//! `zeros + grad`, so composite softmax and rope cost many full passes over the activations in
//! backward. These ops do each forward and each backward in one pass.
//!
//! - [`linear`] works on every device (f32 on the CPU through `super::gemm`'s kernel choice,
//!   forward and backward; elsewhere the backend's own matmul) and returns dW in the weight's
//!   (out, in) layout, where `x.matmul(w.t())` would return it transposed and pay a
//!   strided add to accumulate it.
//! - [`softmax_last_dim`], [`rms_norm`], [`split_heads`] (with the rotary embedding),
//!   [`merge_heads`] and [`token_log_probs`] have CPU kernels (f32 and f64); on other devices
//!   they fall back to the differentiable compositions of candle ops named `*_composite`.
use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor, D};
use num_traits::Float;
use rayon::prelude::*;

/// Whether the fused CPU kernels apply to `x`.
fn cpu_float(x: &Tensor) -> bool {
    x.device().is_cpu() && matches!(x.dtype(), DType::F32 | DType::F64)
}

fn contiguous_slice<'a, T>(v: &'a [T], l: &Layout, what: &str) -> Result<&'a [T]> {
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&v[a..b]),
        None => candle_core::bail!("{what}: expects a contiguous tensor"),
    }
}

/// Run a kernel on f32 or f64 CPU storage.
macro_rules! dispatch {
    ($s:expr, |$v:ident| $body:expr) => {
        match $s {
            CpuStorage::F32($v) => CpuStorage::F32($body),
            CpuStorage::F64($v) => CpuStorage::F64($body),
            _ => candle_core::bail!("fused op: only f32 and f64 are supported"),
        }
    };
}

/// Run a kernel on two (or three) f32 CPU storages, or two (three) f64 ones, as contiguous slices.
macro_rules! dispatch2 {
    ($name:expr, ($a:expr, $la:expr), ($b:expr, $lb:expr), |$x:ident, $y:ident| $body:expr) => {
        match ($a, $b) {
            (CpuStorage::F32($x), CpuStorage::F32($y)) => {
                let ($x, $y) = (contiguous_slice($x, $la, $name)?, contiguous_slice($y, $lb, $name)?);
                CpuStorage::F32($body)
            }
            (CpuStorage::F64($x), CpuStorage::F64($y)) => {
                let ($x, $y) = (contiguous_slice($x, $la, $name)?, contiguous_slice($y, $lb, $name)?);
                CpuStorage::F64($body)
            }
            _ => candle_core::bail!("{}: operands must both be f32 or both f64", $name),
        }
    };
}

// ---------------------------------------------------------------------------------------------
// Linear: y = x Wᵀ

/// `a (m, k) · b (k, n)` for 2-D CPU operands in any strides: f32 on the kernels
/// `super::gemm` picks for the output's shape, other types on candle's matmul.
fn cpu_matmul(
    a: &CpuStorage,
    la: &Layout,
    b: &CpuStorage,
    lb: &Layout,
    (m, n, k): (usize, usize, usize),
) -> Result<CpuStorage> {
    use super::gemm::{kernel_choice, matmul, Operand};
    let (CpuStorage::F32(av), CpuStorage::F32(bv)) = (a, b) else {
        return a.matmul(b, (1, m, n, k), la, lb);
    };
    fn operand<'a>(v: &'a [f32], l: &Layout) -> Operand<'a> {
        Operand { data: &v[l.start_offset()..], row_stride: l.stride()[0], col_stride: l.stride()[1] }
    }
    let family = kernel_choice().map_err(candle_core::Error::msg)?.family(m, n);
    let y = matmul(family, m, n, k, operand(av, la), operand(bv, lb)).map_err(candle_core::Error::msg)?;
    Ok(CpuStorage::F32(y))
}

struct Linear;

impl CustomOp2 for Linear {
    fn name(&self) -> &'static str {
        "linear"
    }

    // y = x · Wᵀ: the product of x and W's transposed layout (a view, no copy).
    fn cpu_fwd(&self, x: &CpuStorage, lx: &Layout, w: &CpuStorage, lw: &Layout) -> Result<(CpuStorage, Shape)> {
        MatMul.cpu_fwd(x, lx, w, &lw.transpose(0, 1)?)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        x: &candle_core::CudaStorage,
        lx: &Layout,
        w: &candle_core::CudaStorage,
        lw: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        MatMul.cuda_fwd(x, lx, w, &lw.transpose(0, 1)?)
    }

    fn bwd(&self, x: &Tensor, w: &Tensor, _y: &Tensor, g: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let dx = g.apply_op2_no_bwd(w, &MatMul)?; // (m, n)(n, k)
        let dw = g.t()?.apply_op2_no_bwd(x, &MatMul)?; // (n, m)(m, k): already in W's layout
        Ok((Some(dx), Some(dw)))
    }
}

/// `a · b` for 2-D operands in any strides, without a backward pass (the linear layer's
/// forward and its gradients): on the CPU through [`cpu_matmul`]'s kernel choice.
struct MatMul;

impl CustomOp2 for MatMul {
    fn name(&self) -> &'static str {
        "matmul-2d"
    }

    fn cpu_fwd(&self, a: &CpuStorage, la: &Layout, b: &CpuStorage, lb: &Layout) -> Result<(CpuStorage, Shape)> {
        let ((m, k), (_, n)) = (la.shape().dims2()?, lb.shape().dims2()?);
        Ok((cpu_matmul(a, la, b, lb, (m, n, k))?, Shape::from((m, n))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        a: &candle_core::CudaStorage,
        la: &Layout,
        b: &candle_core::CudaStorage,
        lb: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let ((m, k), (_, n)) = (la.shape().dims2()?, lb.shape().dims2()?);
        Ok((a.matmul(b, (1, m, n, k), la, lb)?, Shape::from((m, n))))
    }
}

/// `x Wᵀ` for 2-D x (m, in) and W (out, in).
pub fn linear(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    if x.device().is_cpu() || x.device().is_cuda() {
        x.contiguous()?.apply_op2(w, Linear)
    } else {
        x.matmul(&w.t()?)
    }
}

// ---------------------------------------------------------------------------------------------
// Softmax over the last dimension

struct Softmax;

impl CustomOp1 for Softmax {
    fn name(&self) -> &'static str {
        "softmax-last-dim"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        fn run<T: Float + Send + Sync>(x: &[T], d: usize) -> Vec<T> {
            let mut y = vec![T::zero(); x.len()];
            y.par_chunks_mut(d).zip(x.par_chunks(d)).for_each(|(y, x)| {
                let max = x.iter().fold(T::neg_infinity(), |a, &b| a.max(b));
                let mut sum = T::zero();
                for i in 0..d {
                    y[i] = (x[i] - max).exp();
                    sum = sum + y[i];
                }
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
            dx.par_chunks_mut(d).zip(y.par_chunks(d)).zip(g.par_chunks(d)).for_each(|((dx, y), g)| {
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
            y.par_chunks_mut(w.len()).zip(x.par_chunks(w.len())).for_each(|(y, x)| {
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
            dx.par_chunks_mut(d).zip(x.par_chunks(d)).zip(g.par_chunks(d)).for_each(|((dx, x), g)| {
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
            let partial: Vec<Vec<T>> = x
                .par_chunks(d * BLOCK_ROWS)
                .zip(g.par_chunks(d * BLOCK_ROWS))
                .map(|(x, g)| {
                    let mut acc = vec![T::zero(); d];
                    for (x, g) in x.chunks(d).zip(g.chunks(d)) {
                        let r = inv_rms(x, eps);
                        for i in 0..d {
                            acc[i] = acc[i] + g[i] * x[i] * r;
                        }
                    }
                    acc
                })
                .collect();
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

// ---------------------------------------------------------------------------------------------
// Log-probability of a target token: log softmax(logits)[target]

/// lp[r] = logits[r, t_r] − logsumexp(logits[r]), one pass per row; its backward is
/// g[r]·(onehot(t_r) − softmax(logits[r])), also one pass. No (n, vocab) temporaries besides
/// the gradient itself.
struct TokenLogProb;

fn u32_slice<'a>(s: &'a CpuStorage, l: &Layout, what: &str) -> Result<&'a [u32]> {
    match s {
        CpuStorage::U32(v) => contiguous_slice(v, l, what),
        _ => candle_core::bail!("{what}: targets must be u32"),
    }
}

/// Accumulated in f64: a vocabulary-sized f32 sum drifts by ~1e-4, which shows in
/// sequence log-prob differences.
fn logsumexp<T: Float>(row: &[T]) -> T {
    let max = row.iter().fold(T::neg_infinity(), |a, &b| a.max(b));
    let sum: f64 = row.iter().map(|&v| (v - max).exp().to_f64().unwrap_or(0.0)).sum();
    max + T::from(sum.ln()).unwrap()
}

impl CustomOp2 for TokenLogProb {
    fn name(&self) -> &'static str {
        "token-log-prob"
    }

    fn cpu_fwd(&self, x: &CpuStorage, lx: &Layout, t: &CpuStorage, lt: &Layout) -> Result<(CpuStorage, Shape)> {
        fn run<T: Float + Send + Sync>(x: &[T], t: &[u32], v: usize) -> Vec<T> {
            x.par_chunks(v).zip(t.par_iter()).map(|(row, &t)| row[t as usize] - logsumexp(row)).collect()
        }
        let (n, v) = lx.shape().dims2()?;
        let t = u32_slice(t, lt, "token-log-prob")?;
        if t.iter().any(|&i| i as usize >= v) {
            candle_core::bail!("token-log-prob: target id out of the vocabulary");
        }
        let out = dispatch!(x, |x| run(contiguous_slice(x, lx, "token-log-prob")?, t, v));
        Ok((out, Shape::from(n)))
    }

    fn bwd(&self, x: &Tensor, t: &Tensor, _y: &Tensor, g: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        Ok((Some(x.apply_op3_no_bwd(t, &g.contiguous()?, &TokenLogProbGrad)?), None))
    }
}

struct TokenLogProbGrad;

impl CustomOp3 for TokenLogProbGrad {
    fn name(&self) -> &'static str {
        "token-log-prob-grad"
    }

    fn cpu_fwd(
        &self,
        x: &CpuStorage,
        lx: &Layout,
        t: &CpuStorage,
        lt: &Layout,
        g: &CpuStorage,
        lg: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        fn run<T: Float + Send + Sync>(x: &[T], t: &[u32], g: &[T], v: usize) -> Vec<T> {
            let mut dx = vec![T::zero(); x.len()];
            dx.par_chunks_mut(v).zip(x.par_chunks(v)).zip(t.par_iter().zip(g.par_iter())).for_each(
                |((dx, row), (&t, &g))| {
                    let lse = logsumexp(row);
                    for i in 0..v {
                        dx[i] = -g * (row[i] - lse).exp();
                    }
                    dx[t as usize] = dx[t as usize] + g;
                },
            );
            dx
        }
        let n = "token-log-prob-grad";
        let v = lx.shape().dims2()?.1;
        let t = u32_slice(t, lt, n)?;
        let out = dispatch2!(n, (x, lx), (g, lg), |x, g| run(x, t, g, v));
        Ok((out, lx.shape().clone()))
    }
}

/// log softmax(logits)[target] per row: logits (n, vocab), targets (n,) u32 → (n,).
pub fn token_log_probs(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    if cpu_float(logits) {
        return logits.contiguous()?.apply_op2(&targets.contiguous()?, TokenLogProb);
    }
    token_log_probs_composite(logits, targets)
}

/// Token log-probabilities from differentiable candle ops.
pub fn token_log_probs_composite(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let max = logits.max_keepdim(D::Minus1)?.detach();
    let lse = (logits.broadcast_sub(&max)?.exp()?.sum_keepdim(D::Minus1)?.log()? + &max)?;
    let picked = logits.gather(&targets.unsqueeze(1)?, D::Minus1)?;
    (picked - lse)?.squeeze(1)
}

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
            y.par_chunks_mut(d).enumerate().for_each(|(o, out)| {
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

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};
    use rand::{Rng, SeedableRng};

    fn random(shape: &[usize], seed: u64) -> Tensor {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let n: usize = shape.iter().product();
        let v: Vec<f64> = (0..n).map(|_| rng.random::<f64>() * 2.0 - 1.0).collect();
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
        (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f64>().unwrap()
    }

    type Op<'a> = &'a dyn Fn(&[Tensor]) -> Tensor;

    /// A fused op and its composite reference agree in value and in the gradient of every
    /// input for a random upstream gradient (f64, so the tolerance is tight). The composite is
    /// what runs on non-CPU devices.
    fn check(inputs: &[Tensor], fused: Op, composite: Op) {
        let run = |f: Op| {
            let vars: Vec<Var> = inputs.iter().map(|t| Var::from_tensor(t).unwrap()).collect();
            let ts: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
            let y = f(&ts);
            let probe = random(y.dims(), 99);
            let grads = (&y * &probe).unwrap().sum_all().unwrap().backward().unwrap();
            let g: Vec<Tensor> = ts.iter().map(|t| grads.get(t).expect("gradient").clone()).collect();
            (y, g)
        };
        let (yf, gf) = run(fused);
        let (yc, gc) = run(composite);
        assert!(max_diff(&yf, &yc) < 1e-10, "values differ by {}", max_diff(&yf, &yc));
        for (i, (a, b)) in gf.iter().zip(&gc).enumerate() {
            assert!(max_diff(a, b) < 1e-10, "gradient of input {i} differs by {}", max_diff(a, b));
        }
    }

    /// The f32 linear layer (pbrl's kernel choice, `super::gemm`) against f64 candle matmuls,
    /// in value and gradients, below and above the wide-kernel threshold.
    #[test]
    fn f32_linear_matches_f64_matmul_in_value_and_gradients() {
        for (m, n, k) in [(5, 3, 4), (130, 150, 140)] {
            let (x, w, probe) = (random(&[m, k], 20), random(&[n, k], 21), random(&[m, n], 22));
            let run = |dtype: DType, fused: bool| {
                let (xv, wv) = (
                    Var::from_tensor(&x.to_dtype(dtype).unwrap()).unwrap(),
                    Var::from_tensor(&w.to_dtype(dtype).unwrap()).unwrap(),
                );
                let y = if fused {
                    linear(xv.as_tensor(), wv.as_tensor())
                } else {
                    xv.as_tensor().matmul(&wv.t().unwrap())
                };
                let y = y.unwrap();
                let g = (&y * probe.to_dtype(dtype).unwrap()).unwrap().sum_all().unwrap().backward().unwrap();
                let f64s = |t: &Tensor| t.to_dtype(DType::F64).unwrap();
                [f64s(&y), f64s(g.get(xv.as_tensor()).unwrap()), f64s(g.get(wv.as_tensor()).unwrap())]
            };
            let (got, want) = (run(DType::F32, true), run(DType::F64, false));
            for (what, (a, b)) in ["y", "dx", "dw"].iter().zip(got.iter().zip(&want)) {
                assert!(max_diff(a, b) < 1e-4, "{m}x{n}x{k} {what} differs by {}", max_diff(a, b));
            }
        }
    }

    #[test]
    fn fused_ops_match_their_composite_references() {
        let (b, s, n, d) = (2, 5, 3, 8);
        let cos = random(&[b, s, d / 2], 1);
        let sin = random(&[b, s, d / 2], 2);
        let targets = Tensor::new(&[3u32, 0, 6, 2], &Device::Cpu).unwrap();
        check(&[random(&[4, 3, 7], 5)], &|t| softmax_last_dim(&t[0]).unwrap(), &|t| softmax_composite(&t[0]).unwrap());
        check(&[random(&[b * s, n * d], 7)], &|t| split_heads(&t[0], b, s, n, d, Some((&cos, &sin))).unwrap(), &|t| {
            split_heads_composite(&t[0], b, s, n, d, Some((&cos, &sin))).unwrap()
        });
        check(&[random(&[b * s, n * d], 8)], &|t| split_heads(&t[0], b, s, n, d, None).unwrap(), &|t| {
            split_heads_composite(&t[0], b, s, n, d, None).unwrap()
        });
        check(&[random(&[b, n, s, d], 9)], &|t| merge_heads(&t[0]).unwrap(), &|t| {
            merge_heads_composite(&t[0]).unwrap()
        });
        check(&[random(&[5, 4], 10), random(&[3, 4], 11)], &|t| linear(&t[0], &t[1]).unwrap(), &|t| {
            t[0].matmul(&t[1].t().unwrap()).unwrap()
        });
        // More rows than one block of the weight gradient's sum.
        check(&[random(&[130, 6], 13), random(&[6], 14)], &|t| rms_norm(&t[0], &t[1], 1e-5).unwrap(), &|t| {
            rms_norm_composite(&t[0], &t[1], 1e-5).unwrap()
        });
        // Targets carry no gradient: check the logits' gradient alone.
        let logits = random(&[4, 7], 12);
        check(&[logits], &|t| token_log_probs(&t[0], &targets).unwrap(), &|t| {
            token_log_probs_composite(&t[0], &targets).unwrap()
        });
    }
}
