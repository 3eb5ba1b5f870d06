//! Weight gradients kept beside candle's `GradStore` during a training backward pass.
//!
//! candle's backprop accumulates every gradient as `or_insert(zeros_like(w))` then `sum + g`:
//! for a weight matrix, two weight-sized allocations, a memset and a full add pass on top of
//! the product that made dW, for every matrix of the model at every update (~1.7 GB of memory
//! traffic per SmolLM2-135M backward). Inside [`backward`], the ops that make a weight's
//! gradient (the linear layer's dW; a checkpointed stack's weights) hand it to [`keep`]
//! instead: the first gradient of a weight is kept as it is, a later one (a weight read twice,
//! such as tied embeddings) is added to it, and after the pass they join the `GradStore` the
//! optimizer reads. Adding to an exact zero changes no bit, so a weight's gradient is candle's
//! bit for bit, with one exception in the order of a sum: tied embeddings whose lookup repeats
//! a token. candle adds the looked-up rows' gradients onto the LM head's dW one by one; here
//! they are summed first and the head's dW added after, which can move the last bit.
//!
//! Outside [`backward`] (a plain `Tensor::backward`) [`keep`] hands the gradient back to candle,
//! as before; a gradient that cannot go back (a checkpointed stack's weights) is an error there.
use std::cell::RefCell;
use std::collections::HashMap;

use candle_core::backprop::GradStore;
use candle_core::{Result, Tensor, TensorId};

thread_local! {
    /// The weight gradients of the backward pass running on this thread, when it runs inside
    /// [`backward`]; `None` otherwise.
    static KEPT: RefCell<Option<HashMap<TensorId, Tensor>>> = const { RefCell::new(None) };
}

/// Clears this thread's store when the pass ends, also on an error or a panic.
struct Pass;

impl Drop for Pass {
    fn drop(&mut self) {
        KEPT.with(|k| k.borrow_mut().take());
    }
}

/// `loss.backward()`, with the weights' gradients made as described above: what every training
/// step calls.
pub fn backward(loss: &Tensor) -> Result<GradStore> {
    if active() {
        // A nested pass would take the outer one's gradients with it.
        candle_core::bail!("weight_grads::backward: a pass is already running on this thread");
    }
    let pass = Pass;
    KEPT.with(|k| *k.borrow_mut() = Some(HashMap::new()));
    let mut grads = loss.backward()?;
    let kept = KEPT.with(|k| k.borrow_mut().take()).unwrap_or_default();
    drop(pass);
    for (id, g) in kept {
        // A weight that candle also saw (an embedding row lookup beside the tied LM head).
        let sum = plus(grads.get_id(id), g)?;
        grads.insert_id(id, sum);
    }
    Ok(grads)
}

/// `grad` added to the gradient a weight already has, if any.
fn plus(before: Option<&Tensor>, grad: Tensor) -> Result<Tensor> {
    match before {
        Some(before) => before + grad,
        None => Ok(grad),
    }
}

/// Whether a backward pass inside [`backward`] is running on this thread.
pub fn active() -> bool {
    KEPT.with(|k| k.borrow().is_some())
}

/// Take `grad`, the gradient of `weight` from one of its uses, into the running pass's store;
/// `Some(grad)` back, for candle to accumulate, when no [`backward`] runs or when `weight` is
/// not a variable itself (a view of one, whose gradient candle must carry on to the variable).
pub fn keep(weight: &Tensor, grad: Tensor) -> Result<Option<Tensor>> {
    if !weight.is_variable() {
        return Ok(Some(grad));
    }
    KEPT.with(|k| {
        let mut k = k.borrow_mut();
        let Some(kept) = k.as_mut() else { return Ok(Some(grad)) };
        let sum = plus(kept.get(&weight.id()), grad)?;
        kept.insert(weight.id(), sum);
        Ok(None)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    /// W read by a linear product and by a lookup of distinct rows (as tied embeddings are), by
    /// two linear products, or through a product with a value made from it (not a variable, so
    /// its gradient must go on through candle): the pass through [`backward`] gives candle's own
    /// gradients, bit for bit (a sum of two terms is the same in either order), and clears its
    /// store.
    #[test]
    fn kept_gradients_are_candles() {
        let dev = Device::Cpu;
        let values = |n: usize, k: f32| (0..n).map(|i| (i as f32 * k).sin()).collect::<Vec<f32>>();
        let w = Var::from_vec(values(5 * 3, 0.7), (5, 3), &dev).unwrap();
        let x = Var::from_vec(values(4 * 3, 1.3), (4, 3), &dev).unwrap();
        let probe = Tensor::from_vec(values(4 * 5, 2.1), (4, 5), &dev).unwrap();
        let ids = Tensor::new(&[4u32, 0, 2], &dev).unwrap();
        let linear = |x: &Tensor| super::super::ops::linear(x, w.as_tensor());
        for case in ["tied", "twice", "derived"] {
            let loss = || -> Result<Tensor> {
                let y = (linear(x.as_tensor())? * &probe)?.sum_all()?;
                let other = match case {
                    "tied" => w.as_tensor().index_select(&ids, 0)?.sqr()?.sum_all()?,
                    "twice" => linear(&x.as_tensor().sqr()?)?.sum_all()?,
                    _ => super::super::ops::linear(x.as_tensor(), &(w.as_tensor() * 0.5)?)?.sum_all()?,
                };
                y + other
            };
            let plain = loss().unwrap().backward().unwrap();
            let kept = backward(&loss().unwrap()).unwrap();
            assert!(!active(), "the store is cleared when the pass ends");
            for v in [&w, &x] {
                let (a, b) = (kept.get(v.as_tensor()).unwrap(), plain.get(v.as_tensor()).unwrap());
                let numbers = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                assert_eq!(numbers(a), numbers(b), "{case}");
            }
        }
        let back = keep(w.as_tensor(), probe.clone()).unwrap().expect("outside a pass the gradient goes back");
        assert_eq!(back.dims(), probe.dims());
    }
}
