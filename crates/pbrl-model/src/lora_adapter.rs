//! One projection's low-rank adapter, `s · (dropout(x) Aᵀ) Bᵀ` (`lora.rs` attaches them to a
//! backbone and saves them).
use anyhow::Result;
use candle_core::Tensor;

use super::dropout::{self, AdapterDropout};
use super::ops;

/// One projection's adapter.
#[derive(Debug, Clone)]
pub struct LoraAdapter {
    /// (r, in)
    pub a: Tensor,
    /// (out, r)
    pub b: Tensor,
    pub scaling: f64,
    /// Dropout on the adapter's input in training passes (`dropout.rs`); `None`: none.
    pub dropout: Option<AdapterDropout>,
}

impl LoraAdapter {
    /// `s · (dropout(x) Aᵀ) Bᵀ` for 2-D `x` (rows, in); `pass`: the training pass's dropout
    /// key (`None` in inference passes, which drop nothing).
    pub fn delta(&self, x: &Tensor, pass: Option<u64>) -> Result<Tensor> {
        let x = match self.dropout_key(pass) {
            Some((p, key)) => {
                let (rows, cols) = x.dims2()?;
                let mask = Tensor::from_vec(dropout::mask(key, rows, cols, p), (rows, cols), x.device())?;
                (x * mask.to_dtype(x.dtype())?)?
            }
            None => x.clone(),
        };
        Ok((ops::linear(&ops::linear(&x, &self.a)?, &self.b)? * self.scaling)?)
    }

    /// The dropout probability and mask key of this adapter in the training pass `pass`, if it
    /// has dropout (`lora::set_dropout` sets it only for p > 0).
    pub fn dropout_key(&self, pass: Option<u64>) -> Option<(f32, u64)> {
        let d = self.dropout?;
        Some((d.p, d.key(pass?)))
    }
}
