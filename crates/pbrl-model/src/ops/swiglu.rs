//! The MLP's gate, `silu(gate) ⊙ up`, fused forward and backward.
//!
//! As candle ops the gate is two passes forward and, in backward, eight more (silu's
//! derivative alone is `neg, exp, +1, recip, affine, mul, add`, then the products with the
//! upstream gradient) over (rows, intermediate) tensors, each a fresh buffer, plus candle's
//! `zeros + grad` for every one of the three nodes. Here the forward is one pass and the
//! backward one pass writing both inputs' gradients:
//!
//! ```text
//!   σ = 1 / (1 + e^(−a)),  silu(a) = a · σ
//!   y       = silu(a) ⊙ u
//!   dL/da   = g ⊙ u ⊙ σ · (1 + a · (1 − σ))
//!   dL/du   = g ⊙ silu(a)
//! ```
use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor};

use super::exp::ExpSlice;
use super::{contiguous_slice, cpu_float};
use crate::pool;

/// Elements per chunk of work on the pool.
const CHUNK: usize = 4096;

struct SiluMul;

impl CustomOp2 for SiluMul {
    fn name(&self) -> &'static str {
        "silu-mul"
    }

    fn cpu_fwd(&self, a: &CpuStorage, la: &Layout, u: &CpuStorage, lu: &Layout) -> Result<(CpuStorage, Shape)> {
        fn run<T: ExpSlice + Send + Sync>(a: &[T], u: &[T]) -> Vec<T> {
            let mut y = vec![T::zero(); a.len()];
            pool::for_each_chunk_mut(&mut y, CHUNK, |c, y| {
                let (a, u) = (&a[c * CHUNK..][..y.len()], &u[c * CHUNK..][..y.len()]);
                // silu(a) = a / (1 + e^(−a)), as candle computes it.
                y.iter_mut().zip(a).for_each(|(y, &a)| *y = -a);
                T::exp_in_place(y);
                for i in 0..y.len() {
                    y[i] = a[i] / (T::one() + y[i]) * u[i];
                }
            });
            y
        }
        if la.shape() != lu.shape() {
            candle_core::bail!("silu-mul: gate {:?} and up {:?} differ in shape", la.shape(), lu.shape());
        }
        let out = dispatch2!("silu-mul", (a, la), (u, lu), |a, u| run(a, u));
        Ok((out, la.shape().clone()))
    }

    fn bwd(&self, a: &Tensor, u: &Tensor, _y: &Tensor, g: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        // Both gradients in one (2, …) buffer, one pass; each is a contiguous view of it.
        let both = a.apply_op3_no_bwd(u, &g.contiguous()?, &SiluMulGrad)?;
        let half = |i: usize| both.narrow(0, i, 1)?.reshape(a.shape());
        Ok((a.track_op().then(|| half(0)).transpose()?, u.track_op().then(|| half(1)).transpose()?))
    }
}

/// `[dL/da; dL/du]` stacked on a new first dimension of 2.
struct SiluMulGrad;

impl CustomOp3 for SiluMulGrad {
    fn name(&self) -> &'static str {
        "silu-mul-grad"
    }

    fn cpu_fwd(
        &self,
        a: &CpuStorage,
        la: &Layout,
        u: &CpuStorage,
        lu: &Layout,
        g: &CpuStorage,
        lg: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        fn run<T: ExpSlice + Send + Sync>(a: &[T], u: &[T], g: &[T]) -> Vec<T> {
            let n = a.len();
            let mut out = vec![T::zero(); 2 * n];
            let (da, du) = out.split_at_mut(n);
            let (da, du) = (pool::Chunks::new(da, CHUNK), pool::Chunks::new(du, CHUNK));
            pool::map(da.count(), |c| {
                let (da, du) = (da.get(c), du.get(c));
                let at = c * CHUNK..c * CHUNK + da.len();
                let (a, u, g) = (&a[at.clone()], &u[at.clone()], &g[at]);
                da.iter_mut().zip(a).for_each(|(d, &a)| *d = -a);
                T::exp_in_place(da);
                for i in 0..da.len() {
                    let s = (T::one() + da[i]).recip();
                    da[i] = g[i] * u[i] * s * (T::one() + a[i] * (T::one() - s));
                    du[i] = g[i] * a[i] * s;
                }
            });
            out
        }
        let name = "silu-mul-grad";
        let out = match (a, u, g) {
            (CpuStorage::F32(a), CpuStorage::F32(u), CpuStorage::F32(g)) => {
                let s = |v, l| contiguous_slice(v, l, name);
                CpuStorage::F32(run(s(a, la)?, s(u, lu)?, s(g, lg)?))
            }
            (CpuStorage::F64(a), CpuStorage::F64(u), CpuStorage::F64(g)) => {
                let s = |v, l| contiguous_slice(v, l, name);
                CpuStorage::F64(run(s(a, la)?, s(u, lu)?, s(g, lg)?))
            }
            _ => candle_core::bail!("{name}: operands must all be f32 or all f64"),
        };
        let mut dims = vec![2];
        dims.extend_from_slice(la.dims());
        Ok((out, Shape::from(dims)))
    }
}

/// `silu(gate) ⊙ up`, differentiable in both.
pub fn silu_mul(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    if cpu_float(gate) && gate.dtype() == up.dtype() && up.device().is_cpu() {
        return gate.contiguous()?.apply_op2(&up.contiguous()?, SiluMul);
    }
    silu_mul_composite(gate, up)
}

/// `silu(gate) ⊙ up` from differentiable candle ops.
pub fn silu_mul_composite(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    gate.silu()? * up
}
