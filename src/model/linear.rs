//! The linear layer: `y = x Wᵀ (+ b)`, plus a LoRA adapter's product when one is set.
use anyhow::Result;
use candle_core::Tensor;
use candle_nn::VarBuilder;

use super::lora::LoraAdapter;
use super::ops;
use super::transformer::required;

/// `y = x Wᵀ (+ b)`, applied to a 2-D view of `x` so forward, dX and dW are single GEMMs.
#[derive(Debug, Clone)]
pub struct Linear {
    weight: Tensor,
    bias: Option<Tensor>,
    /// A low-rank adapter whose product is added to the output (`lora.rs`).
    lora: Option<LoraAdapter>,
}

impl Linear {
    pub(super) fn load(vb: &VarBuilder, in_dim: usize, out_dim: usize, name: &str, bias: bool) -> Result<Self> {
        let vb = vb.pp(name);
        let weight = required(&vb, (out_dim, in_dim), "weight")?;
        let bias = if bias { Some(required(&vb, out_dim, "bias")?) } else { None };
        Ok(Self { weight, bias, lora: None })
    }

    pub fn from_weight(weight: Tensor) -> Self {
        Self { weight, bias: None, lora: None }
    }

    /// (in, out) features.
    pub fn dims(&self) -> (usize, usize) {
        let (out, inp) = self.weight.dims2().expect("a linear weight is 2-D");
        (inp, out)
    }

    /// Add `adapter`'s product to this layer's output from now on.
    pub fn set_lora(&mut self, adapter: LoraAdapter) {
        self.lora = Some(adapter);
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.rank() != 2 {
            // Apply to a 2-D view, then restore the leading dimensions.
            let dims = x.dims();
            let in_dim = *dims.last().expect("linear input has at least one dim");
            let y = self.forward(&x.reshape(((), in_dim))?)?;
            let mut out = dims[..dims.len() - 1].to_vec();
            out.push(y.dim(1)?);
            return Ok(y.reshape(out)?);
        }
        let y = ops::linear(x, &self.weight)?;
        let y = match &self.bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        };
        match &self.lora {
            Some(adapter) => Ok((y + adapter.delta(x)?)?),
            None => Ok(y),
        }
    }
}
