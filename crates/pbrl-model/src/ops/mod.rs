//! Fused operations with a backward pass, for training.
//!
//! candle's autograd records every elementary op and accumulates each gradient as
//! `zeros + grad`, so composite softmax and rope cost many full passes over the activations in
//! backward. These ops do each forward and each backward in one pass.
//!
//! - [`linear`] works on every device (f32 on the CPU through `super::gemm`'s kernel choice,
//!   forward and backward; elsewhere the backend's own matmul) and returns dW in the weight's
//!   (out, in) layout, where `x.matmul(w.t())` would return it transposed and pay a
//!   strided add to accumulate it. A frozen weight may be stored in bf16: it is read in the
//!   input's dtype for each product. [`quantized_linear`] is the same product for a frozen
//!   quantized weight (a LoRA agent's base at `base_dtype = "q8_0"`).
//! - [`lora_linear`] is a LoRA projection over a frozen base in one op (f32 on the CPU), its
//!   adapter's product summed in the GEMM's store, forward and backward.
//! - [`batched_matmul`] is attention's batched product on the same kernels, the batch spread
//!   over the threads (f32 on the CPU; elsewhere candle's matmul).
//! - [`silu_mul`] is the MLP's gate `silu(gate) ⊙ up`, one pass forward and one backward.
//! - [`masked_softmax`] is attention's `softmax(scale · scores + mask)` in one pass each way.
//! - [`softmax_last_dim`], [`masked_softmax`], [`silu_mul`], [`rms_norm`], [`split_heads`]
//!   (with the rotary embedding), [`merge_heads`] and [`token_log_probs`] have CPU kernels (f32
//!   and f64; their exponentials on `exp`'s vectorized f32 exp); on other devices they fall
//!   back to the differentiable compositions of candle ops named `*_composite`.
pub use batched::batched_matmul;
pub use bf16_linear::{bf16_linear, Bf16Matrix};
pub use heads::{merge_heads, merge_heads_composite, split_heads, split_heads_composite};
pub use log_prob::{token_log_probs, token_log_probs_composite};
pub use lora::{lora_fuses, lora_linear, BaseWeight};
pub use norm::{rms_norm, rms_norm_composite, rope_composite};
pub use softmax::{masked_softmax, masked_softmax_composite, softmax_composite, softmax_last_dim};
pub use swiglu::{silu_mul, silu_mul_composite};

use std::sync::Arc;

use candle_core::backend::BackendStorage;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{CpuStorage, CustomOp1, CustomOp2, DType, Layout, Result, Shape, Storage, Tensor};

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

/// An f32 CPU storage's elements as `l` places them (contiguous); `what` names it in errors.
fn f32s<'a>(s: &'a CpuStorage, l: &Layout, what: &str) -> Result<&'a [f32]> {
    match s {
        CpuStorage::F32(v) => contiguous_slice(v, l, what),
        _ => candle_core::bail!("{what}: this op takes f32"),
    }
}

/// [`f32s`] of a tensor's storage, which must be on the CPU.
fn cpu_f32s<'a>(storage: &'a Storage, layout: &Layout, what: &str) -> Result<&'a [f32]> {
    let Storage::Cpu(s) = storage else { candle_core::bail!("{what}: this op runs on the CPU") };
    f32s(s, layout, what)
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

/// `s` (laid out as `l`) in `dtype`, contiguous, when it is stored in another dtype: a frozen
/// weight kept in bf16 is read in f32 for one product, and the copy is dropped after it.
fn in_dtype<S: BackendStorage>(s: &S, l: &Layout, dtype: DType) -> Result<Option<(S, Layout)>> {
    if s.dtype() == dtype {
        return Ok(None);
    }
    Ok(Some((s.to_dtype(l, dtype)?, Layout::contiguous(l.shape()))))
}

/// `x Wᵀ` (m, n) with a frozen W read as it is stored, for a product of a few rows (the
/// decode steps of sampling): f32 x and W in bf16 (`CpuStorage::BF16`, contiguous) or q8_0
/// (`QTensor` bytes), on `gemm::stored_product`'s dot kernels: bit for bit the product on the
/// f32 copy of W that the other kernels make for every product, reading a half or about a
/// quarter of its bytes. None where those kernels do not apply.
fn stored_product(x: &[f32], lx: &Layout, n: usize, w: StoredWeight) -> Result<Option<Vec<f32>>> {
    let (m, k) = lx.shape().dims2()?;
    let Some((start, end)) = lx.contiguous_offsets() else { return Ok(None) };
    let family = super::gemm::kernel_choice().map_err(candle_core::Error::msg)?.family(m, n);
    let rows = match w {
        StoredWeight::Bf16(v, lw) => match lw.contiguous_offsets() {
            Some((a, b)) if b - a == n * k => super::gemm::WeightRows::Bf16 { ptr: v[a..].as_ptr().cast(), stride: k },
            _ => return Ok(None),
        },
        StoredWeight::Q8_0(bytes) => {
            let stride = k / 32 * super::gemm::Q8_BLOCK_BYTES;
            if k % 32 != 0 || bytes.len() != n * stride {
                return Ok(None);
            }
            super::gemm::WeightRows::Q8_0 { ptr: bytes.as_ptr(), stride }
        }
    };
    // SAFETY: the rows view storage the caller holds for this call, n rows of k elements
    // (checked above).
    unsafe { super::gemm::stored_product(family, (m, n, k), &x[start..end], rows) }.map_err(candle_core::Error::msg)
}

/// A product's f32 result as an op's output.
fn f32_output(y: Vec<f32>, m: usize, n: usize) -> (CpuStorage, Shape) {
    (CpuStorage::F32(y), Shape::from((m, n)))
}

/// A frozen weight as [`stored_product`] reads it.
pub(crate) enum StoredWeight<'a> {
    Bf16(&'a [half::bf16], &'a Layout),
    Q8_0(&'a [u8]),
}

struct Linear;

impl CustomOp2 for Linear {
    fn name(&self) -> &'static str {
        "linear"
    }

    // y = x · Wᵀ: the product of x and W's transposed layout (a view, no copy). W is cast before
    // it is transposed, so the cast reads it in order.
    fn cpu_fwd(&self, x: &CpuStorage, lx: &Layout, w: &CpuStorage, lw: &Layout) -> Result<(CpuStorage, Shape)> {
        if let (CpuStorage::F32(xs), CpuStorage::BF16(ws)) = (x, w) {
            let n = lw.shape().dims2()?.0;
            if let Some(y) = stored_product(xs, lx, n, StoredWeight::Bf16(ws, lw))? {
                return Ok(f32_output(y, lx.shape().dims2()?.0, n));
            }
        }
        if let Some((w, lw)) = in_dtype(w, lw, x.dtype())? {
            return self.cpu_fwd(x, lx, &w, &lw);
        }
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
        if let Some((w, lw)) = in_dtype(w, lw, x.dtype())? {
            return self.cuda_fwd(x, lx, &w, &lw);
        }
        MatMul.cuda_fwd(x, lx, w, &lw.transpose(0, 1)?)
    }

    // Only the gradients someone will read: a frozen weight (not a variable, no graph: a LoRA
    // agent's base, a frozen backbone) gets no weight-sized product nor gradient buffer, which
    // candle would otherwise allocate and then drop; likewise an input outside the graph.
    fn bwd(&self, x: &Tensor, w: &Tensor, _y: &Tensor, g: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        // dX = G W: (m, n)(n, k).
        let dx = x.track_op().then(|| g.apply_op2_no_bwd(w, &MatMul)).transpose()?;
        // dW = Gᵀ X: (n, m)(m, k), already in W's layout; in a training step it goes to
        // `weight_grads` as it is, not through candle's `zeros + dW`.
        let dw = match w.track_op() {
            true => super::weight_grads::keep(w, g.t()?.apply_op2_no_bwd(x, &MatMul)?)?,
            false => None,
        };
        Ok((dx, dw))
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
        if let Some((b, lb)) = in_dtype(b, lb, a.dtype())? {
            return self.cpu_fwd(a, la, &b, &lb);
        }
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
        if let Some((b, lb)) = in_dtype(b, lb, a.dtype())? {
            return self.cuda_fwd(a, la, &b, &lb);
        }
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

/// `x Wᵀ` for a frozen quantized W (out, in): W is dequantized to f32 for each product and the
/// copy dropped after it (QLoRA's rule), so the forward is exactly the f32 model with the
/// dequantized weights and the backward (dX = G W; W gets no gradient) is exact for it. Only the
/// quantized blocks stay in memory, also in the autograd graph.
struct QuantizedLinear(Arc<QTensor>);

impl CustomOp1 for QuantizedLinear {
    fn name(&self) -> &'static str {
        "quantized-linear"
    }

    fn cpu_fwd(&self, x: &CpuStorage, lx: &Layout) -> Result<(CpuStorage, Shape)> {
        if let (CpuStorage::F32(xs), GgmlDType::Q8_0) = (x, self.0.dtype()) {
            let (bytes, n) = (self.0.data()?, self.0.shape().dims2()?.0);
            if let Some(y) = stored_product(xs, lx, n, StoredWeight::Q8_0(&bytes))? {
                return Ok(f32_output(y, lx.shape().dims2()?.0, n));
            }
        }
        let w = self.0.dequantize(&candle_core::Device::Cpu)?;
        let (storage, lw) = w.storage_and_layout();
        let Storage::Cpu(w) = &*storage else {
            candle_core::bail!("quantized-linear: a CPU input, a weight elsewhere")
        };
        MatMul.cpu_fwd(x, lx, w, &lw.transpose(0, 1)?)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, x: &candle_core::CudaStorage, lx: &Layout) -> Result<(candle_core::CudaStorage, Shape)> {
        let w = self.0.dequantize(&candle_core::Device::Cuda(x.device().clone()))?;
        let (storage, lw) = w.storage_and_layout();
        let Storage::Cuda(w) = &*storage else {
            candle_core::bail!("quantized-linear: a CUDA input, a weight elsewhere")
        };
        MatMul.cuda_fwd(x, lx, w, &lw.transpose(0, 1)?)
    }

    fn bwd(&self, x: &Tensor, _y: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        x.track_op().then(|| g.apply_op2_no_bwd(&self.0.dequantize(g.device())?, &MatMul)).transpose()
    }
}

/// `x Wᵀ` for 2-D x (m, in) and a frozen quantized W (out, in), on the CPU or a CUDA device.
pub fn quantized_linear(x: &Tensor, w: &Arc<QTensor>) -> Result<Tensor> {
    if !(x.device().is_cpu() || x.device().is_cuda()) {
        candle_core::bail!("a quantized frozen base runs on the CPU or a CUDA device");
    }
    x.contiguous()?.apply_op1(QuantizedLinear(w.clone()))
}

// The kernels (declared after the dispatch macros above, which they use).
mod batched;
mod bf16_linear;
pub mod exp;
mod heads;
mod log_prob;
mod lora;
mod norm;
mod softmax;
mod swiglu;
#[cfg(test)]
mod tests;

/// The embedding rows `x` (one per id) with those of token `pad` cut from the graph: the same
/// values, but no gradient reaches the embedding through them (`nn.Embedding(padding_idx)`).
pub fn detach_rows_of(x: &Tensor, ids: &Tensor, pad: u32) -> Result<Tensor> {
    let ids: Vec<u32> = ids.to_vec1()?;
    if !ids.contains(&pad) {
        return Ok(x.clone());
    }
    let keep: Vec<f32> = ids.iter().map(|&i| if i == pad { 0.0 } else { 1.0 }).collect();
    let keep = Tensor::from_vec(keep, (ids.len(), 1), x.device())?.to_dtype(x.dtype())?;
    let dropped = (1.0 - &keep)?;
    x.broadcast_mul(&keep)? + x.detach().broadcast_mul(&dropped)?
}
