//! Activation checkpointing (`gradient_checkpointing`): a stack of layers whose forward pass
//! keeps each layer's input only, and whose backward pass recomputes one layer at a time.
//!
//! Forward: h₀ = x, h_{l+1} = f_l(h_l), each layer run outside the autograd graph; the inputs
//! h₀ … h_{L−1} are kept, not the layers' inner activations (attention scores, the MLP's wide
//! products), which are most of a training step's memory. The stack enters the graph as one
//! custom op of x whose value is h_L.
//! Backward, given g = ∂loss/∂h_L: for l = L−1 … 0, recompute y = f_l(h_l) with a graph from a
//! fresh leaf h_l, backpropagate g through it alone, keep the gradients of the trained weights
//! (`params`) and carry g ← ∂/∂h_l on. The recomputation runs the same ops on the same input, so
//! it gives the forward's values bit for bit, and the gradients are those of the plain graph.
//!
//! A custom op returns a gradient for its own inputs only, so the weights' gradients go to the
//! training pass's store (`super::weight_grads`), which adds them to the backward pass's
//! gradients before the optimizer reads them: the stack's backward runs inside
//! `weight_grads::backward` only.
use std::sync::Arc;

use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor, Var};

use super::weight_grads;

/// Layer `l` of a stack applied to its input.
pub type LayerFn = Arc<dyn Fn(usize, &Tensor) -> Result<Tensor> + Send + Sync>;

/// The stack of `layers` layers `f` applied to `x`, differentiable in `x` and in the weights
/// `params` (the trained variables `f` reads) by recomputation.
pub fn checkpointed(x: &Tensor, layers: usize, f: LayerFn, params: Arc<Vec<Tensor>>) -> Result<Tensor> {
    let mut inputs = Vec::with_capacity(layers);
    let mut h = x.detach();
    for l in 0..layers {
        inputs.push(h.clone());
        h = f(l, &h)?.detach();
    }
    // Frozen embeddings leave x outside the graph; the op must still be in it for the
    // weights' gradients, so it then reads a leaf copy of x (whose gradient nobody reads).
    let x = if x.track_op() { x.clone() } else { Var::from_tensor(x)?.into_inner() };
    x.apply_op2(&h.contiguous()?, Checkpoint { f, inputs, params })
}

struct Checkpoint {
    f: LayerFn,
    inputs: Vec<Tensor>,
    params: Arc<Vec<Tensor>>,
}

/// The op's value is its second operand (h_L, computed outside the graph); a copy of it.
fn copy_of<S: candle_core::backend::BackendStorage>(s: &S, l: &Layout) -> Result<(S, Shape)> {
    if !l.is_contiguous() || l.start_offset() != 0 {
        candle_core::bail!("checkpoint: the stack's output must be contiguous from its start");
    }
    Ok((s.try_clone(l)?, l.shape().clone()))
}

impl CustomOp2 for Checkpoint {
    fn name(&self) -> &'static str {
        "checkpointed-layers"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout, h: &CpuStorage, lh: &Layout) -> Result<(CpuStorage, Shape)> {
        copy_of(h, lh)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        _: &candle_core::CudaStorage,
        _: &Layout,
        h: &candle_core::CudaStorage,
        lh: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        copy_of(h, lh)
    }

    fn bwd(&self, _x: &Tensor, _h: &Tensor, _y: &Tensor, g: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        if !weight_grads::active() {
            candle_core::bail!("checkpointed layers: the backward pass must run in model::weight_grads::backward");
        }
        let mut g = g.clone();
        for (l, input) in self.inputs.iter().enumerate().rev() {
            let leaf = Var::from_tensor(input)?;
            let y = (self.f)(l, leaf.as_tensor())?;
            // The layer's own backward; its linear weights' gradients go to the pass's store as
            // they are made, the others (norms) are handed to it here.
            let grads = (y * &g)?.sum_all()?.backward()?;
            for p in self.params.iter() {
                if let Some(d) = grads.get(p) {
                    if weight_grads::keep(p, d.clone())?.is_some() {
                        candle_core::bail!("checkpointed layers: their trained weights must be variables");
                    }
                }
            }
            g = match grads.get(leaf.as_tensor()) {
                Some(d) => d.clone(),
                None => g.zeros_like()?,
            };
        }
        Ok((Some(g), None))
    }
}
