//! The linear layer: `y = x Wᵀ (+ b)`, plus a LoRA adapter's product when one is set.
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Tensor};
use candle_nn::VarBuilder;

use super::lora_adapter::LoraAdapter;
use super::ops::{self, BaseWeight};
use super::required::required;

/// How a frozen base stores its weight matrices (`agent_lora.base_dtype`); activations, norms,
/// adapters and their optimizer state stay f32 in every case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrozenStorage {
    /// As loaded (f32): the weights' storage is shared, not copied.
    F32,
    /// Every matrix (projections, embeddings, LM head) in bf16, read in f32 for each product.
    Bf16,
    /// The projections (and an untied LM head) in GGUF's q8_0 blocks, dequantized for each
    /// product; the token embeddings (and a tied head) in bf16.
    Q8_0,
}

/// `y = x Wᵀ (+ b)`, applied to a 2-D view of `x` so forward, dX and dW are single GEMMs.
#[derive(Debug, Clone)]
pub struct Linear {
    weight: BaseWeight,
    bias: Option<Tensor>,
    /// A low-rank adapter whose product is added to the output (`lora.rs`).
    lora: Option<LoraAdapter>,
}

impl Linear {
    pub(super) fn load(vb: &VarBuilder, in_dim: usize, out_dim: usize, name: &str, bias: bool) -> Result<Self> {
        let vb = vb.pp(name);
        let weight = required(&vb, (out_dim, in_dim), "weight")?;
        let bias = if bias { Some(required(&vb, out_dim, "bias")?) } else { None };
        Ok(Self { weight: BaseWeight::Dense(weight), bias, lora: None })
    }

    pub fn from_weight(weight: Tensor) -> Self {
        Self { weight: BaseWeight::Dense(weight), bias: None, lora: None }
    }

    /// (in, out) features.
    pub fn dims(&self) -> (usize, usize) {
        let (out, inp) = match &self.weight {
            BaseWeight::Dense(w) => w.dims2(),
            BaseWeight::Quantized(q) => q.shape().dims2(),
            BaseWeight::Bf16Products(m) => Ok(m.dims()),
        }
        .expect("a linear weight is 2-D");
        (inp, out)
    }

    /// Store this frozen layer's weight as `storage` says (its bias stays as it is). `name` is
    /// the layer's, for errors: q8_0 packs each row in blocks of 32 inputs.
    pub fn store_frozen(&mut self, storage: FrozenStorage, name: &str) -> Result<()> {
        let BaseWeight::Dense(w) = &self.weight else { bail!("{name} is already stored as a frozen matrix") };
        self.weight = match storage {
            FrozenStorage::F32 => return Ok(()),
            FrozenStorage::Bf16 => BaseWeight::Dense(w.to_dtype(DType::BF16)?),
            FrozenStorage::Q8_0 => {
                let (inp, _) = self.dims();
                if inp % GgmlDType::Q8_0.block_size() != 0 {
                    bail!("\"q8_0\" packs rows in blocks of 32: {name} has {inp} inputs");
                }
                BaseWeight::Quantized(Arc::new(QTensor::quantize(w, GgmlDType::Q8_0)?))
            }
        };
        Ok(())
    }

    /// From now on, this frozen layer's products (`x Wᵀ`, and `G W` in backward) take their
    /// input rounded to bf16 and W's bf16 values, the sums in f32 (`compute_dtype = "bf16"`;
    /// `ops::bf16_linear`). W stays stored as it is (f32 or bf16); q8_0 is refused.
    pub fn compute_in_bf16(&mut self, name: &str) -> Result<()> {
        self.weight = match &self.weight {
            BaseWeight::Dense(w) => BaseWeight::Bf16Products(Arc::new(
                ops::Bf16Matrix::new(w).with_context(|| format!("{name}: bf16 products"))?,
            )),
            BaseWeight::Bf16Products(_) => return Ok(()),
            BaseWeight::Quantized(_) => {
                bail!("{name}: compute_dtype = \"bf16\" needs a base stored in f32 or bf16, not q8_0")
            }
        };
        Ok(())
    }

    /// Add `adapter`'s product to this layer's output from now on.
    pub fn set_lora(&mut self, adapter: LoraAdapter) {
        self.lora = Some(adapter);
    }

    /// Drop the adapter: the base layer alone.
    pub fn clear_lora(&mut self) {
        self.lora = None;
    }

    /// The adapter, to change its settings.
    pub fn lora_mut(&mut self) -> Option<&mut LoraAdapter> {
        self.lora.as_mut()
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_in_pass(x, None)
    }

    /// The layer in a pass whose adapter dropout is keyed `pass` (`dropout.rs`; `None`: an
    /// inference pass, or no dropout).
    pub fn forward_in_pass(&self, x: &Tensor, pass: Option<u64>) -> Result<Tensor> {
        if x.rank() != 2 {
            // Apply to a 2-D view, then restore the leading dimensions.
            let dims = x.dims();
            let in_dim = *dims.last().expect("linear input has at least one dim");
            let y = self.forward_in_pass(&x.reshape(((), in_dim))?, pass)?;
            let mut out = dims[..dims.len() - 1].to_vec();
            out.push(y.dim(1)?);
            return Ok(y.reshape(out)?);
        }
        // A LoRA product over a frozen f32 CPU base runs as one op (`ops::lora_linear`);
        // elsewhere the adapter's term is added to the base's as candle ops.
        let fused = self.lora.as_ref().filter(|lora| ops::lora_fuses(x, &self.weight, &lora.a, &lora.b));
        let y = match (fused, &self.weight) {
            (Some(lora), w) => ops::lora_linear(x, w, &lora.a, &lora.b, lora.scaling, lora.dropout_key(pass))?,
            (None, BaseWeight::Dense(w)) => ops::linear(x, w)?,
            (None, BaseWeight::Quantized(q)) => ops::quantized_linear(x, q)?,
            (None, BaseWeight::Bf16Products(m)) => ops::bf16_linear(x, m)?,
        };
        let y = match &self.bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        };
        match (&self.lora, fused) {
            (Some(lora), None) => Ok((y + lora.delta(x, pass)?)?),
            _ => Ok(y),
        }
    }
}
