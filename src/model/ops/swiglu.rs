//! The gated MLP's activation, silu(gate) ⊙ up, fused forward and backward. candle records it
//! as a SiLU and a product, and SiLU's backward as eight element-wise ops, each a pass over the
//! (tokens × intermediate) activations with its own allocation, plus `zeros + grad` per input:
//! ~15 passes per layer where this takes one forward and one backward. Each element is computed
//! by candle's own formulas in candle's order, so values and gradients are bit for bit those of
//! the composition (tested).
use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor};

use num_traits::Float;

use super::{contiguous_slice, cpu_float};
use crate::model::pool;

/// Rows of this many elements are what the pool hands out (the last dimension can be short).
const CHUNK: usize = 4096;

/// candle's SiLU: a / (1 + e^−a).
#[inline(always)]
fn silu<T: Float>(a: T) -> T {
    a / (T::one() + (-a).exp())
}

struct SwiGlu;

impl CustomOp2 for SwiGlu {
    fn name(&self) -> &'static str {
        "swiglu"
    }

    fn cpu_fwd(&self, a: &CpuStorage, la: &Layout, u: &CpuStorage, lu: &Layout) -> Result<(CpuStorage, Shape)> {
        fn run<T: Float + Send + Sync>(a: &[T], u: &[T]) -> Vec<T> {
            let mut h = vec![T::zero(); a.len()];
            pool::for_each_chunk_mut(&mut h, CHUNK, |c, h| {
                let (a, u) = (&a[c * CHUNK..][..h.len()], &u[c * CHUNK..][..h.len()]);
                for i in 0..h.len() {
                    h[i] = silu(a[i]) * u[i];
                }
            });
            h
        }
        if la.shape() != lu.shape() {
            candle_core::bail!("swiglu: gate {:?} and up {:?} differ in shape", la.shape(), lu.shape());
        }
        let out = dispatch2!("swiglu", (a, la), (u, lu), |a, u| run(a, u));
        Ok((out, la.shape().clone()))
    }

    fn bwd(&self, a: &Tensor, u: &Tensor, _h: &Tensor, g: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let both = a.apply_op3_no_bwd(u, &g.contiguous()?, &SwiGluGrad)?; // (2, …): d gate, d up
        Ok((Some(both.get(0)?), Some(both.get(1)?)))
    }
}

/// d gate = (g ⊙ u) ⊙ (s ⊙ (1 − silu(a)) + silu(a)), s = 1 / (e^−a + 1) (candle's SiLU backward
/// after its product's), d up = g ⊙ silu(a); stacked (2, …).
struct SwiGluGrad;

impl CustomOp3 for SwiGluGrad {
    fn name(&self) -> &'static str {
        "swiglu-grad"
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
        fn run<T: Float + Send + Sync>(a: &[T], u: &[T], g: &[T]) -> Vec<T> {
            let n = a.len();
            let mut out = vec![T::zero(); 2 * n];
            let (da, du) = out.split_at_mut(n);
            pool::for_each_chunk_mut(da, CHUNK, |c, da| {
                let k = c * CHUNK;
                let (a, u, g) = (&a[k..][..da.len()], &u[k..][..da.len()], &g[k..][..da.len()]);
                for i in 0..da.len() {
                    let (s, y) = (((-a[i]).exp() + T::one()).recip(), silu(a[i]));
                    da[i] = (g[i] * u[i]) * (s * (T::one() - y) + y);
                }
            });
            pool::for_each_chunk_mut(du, CHUNK, |c, du| {
                let k = c * CHUNK;
                let (a, g) = (&a[k..][..du.len()], &g[k..][..du.len()]);
                for i in 0..du.len() {
                    du[i] = g[i] * silu(a[i]);
                }
            });
            out
        }
        let out = dispatch3!("swiglu-grad", (a, la), (u, lu), (g, lg), |a, u, g| run(a, u, g));
        let mut dims = vec![2];
        dims.extend_from_slice(la.dims());
        Ok((out, Shape::from(dims)))
    }
}

/// silu(gate) ⊙ up, differentiable in both.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    if cpu_float(gate) && gate.dtype() == up.dtype() && up.device().is_cpu() {
        return gate.contiguous()?.apply_op2(&up.contiguous()?, SwiGlu);
    }
    swiglu_composite(gate, up)
}

/// The same from candle ops (other devices and dtypes).
pub fn swiglu_composite(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    gate.silu()? * up
}
