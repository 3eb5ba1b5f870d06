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
//! A custom op returns a gradient for its own inputs only, so the weights' gradients are left
//! on this thread ([`take_weight_grads`]); `train::session::Step::apply` adds them to the
//! backward pass's gradients before the optimizer reads them.
use std::cell::RefCell;
use std::sync::Arc;

use candle_core::backprop::GradStore;
use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor, TensorId, Var};

/// Layer `l` of a stack applied to its input.
pub type LayerFn = Arc<dyn Fn(usize, &Tensor) -> Result<Tensor> + Send + Sync>;

thread_local! {
    /// Gradients of trained weights computed inside checkpointed backward passes, not yet
    /// handed to the optimizer.
    static WEIGHT_GRADS: RefCell<Vec<(TensorId, Tensor)>> = const { RefCell::new(Vec::new()) };
}

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

/// Add the weights' gradients left by checkpointed backward passes on this thread to `grads`.
pub fn take_weight_grads(grads: &mut GradStore) -> Result<()> {
    for (id, g) in WEIGHT_GRADS.with(|w| std::mem::take(&mut *w.borrow_mut())) {
        let sum = match grads.get_id(id) {
            Some(before) => (before + g)?,
            None => g,
        };
        grads.insert_id(id, sum);
    }
    Ok(())
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
        let mut g = g.clone();
        for (l, input) in self.inputs.iter().enumerate().rev() {
            let leaf = Var::from_tensor(input)?;
            let y = (self.f)(l, leaf.as_tensor())?;
            let grads = (y * &g)?.sum_all()?.backward()?;
            WEIGHT_GRADS.with(|w| {
                let mut w = w.borrow_mut();
                w.extend(self.params.iter().filter_map(|p| grads.get(p).map(|d| (p.id(), d.clone()))));
            });
            g = match grads.get(leaf.as_tensor()) {
                Some(d) => d.clone(),
                None => g.zeros_like()?,
            };
        }
        Ok((Some(g), None))
    }
}
