//! A LoRA projection over a frozen base as one op: `y = x Wᵀ + s · (x Aᵀ) Bᵀ`.
//!
//! As a composition of candle ops the adapter's term costs three passes over the (rows, out)
//! output of their own (the thin product's result, its scaling, the sum) and, in backward, a
//! gradient buffer for each of them plus candle's `zeros + grad` accumulation of each. Here
//! the adapter's product is added in the GEMM's store (`gemm::gemm_into`), and the backward
//! computes exactly the three gradients it needs, also summing the two terms of dX in the
//! store:
//!
//! ```text
//!   v  = G B                 (rows, r)
//!   dA = s · vᵀ X            (r, in)       made as its transpose Xᵀ v: see below
//!   dB = s · Gᵀ U            (out, r)      U = X Aᵀ, kept from the forward pass
//!   dX = G W + s · v A       (rows, in)    W gets no gradient: it is frozen
//! ```
//!
//! The forward pass keeps U (rows × r: 25 KB for 400 rows at r 16) in the op, so the backward
//! pass does not compute it again. dA's product has r output rows; `gemm` computes such a
//! product at about half the speed of its transpose (measured on AMD EPYC Zen 5, 2 threads,
//! 400 rows: 16 × 576 at 112 GFLOP/s, 576 × 16 at 235), so dA is made as Xᵀ v and transposed.
//!
//! With adapter dropout (`dropout.rs`) the adapter reads X ⊙ M for the mask M of the pass, so
//! X is replaced by X ⊙ M in `dA` and `dB`, and the adapter's term of dX is `s · (v A) ⊙ M`; the
//! mask is made again from its key in the backward pass, not kept.
//!
//! f32 on the CPU only; elsewhere (and for a weight that trains) `linear.rs` keeps the
//! composition, which computes the same values up to the order of the sums.
use std::sync::{Arc, OnceLock};

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{CpuStorage, CustomOp3, DType, Device, Layout, Result, Shape, Storage, Tensor};

use super::super::dropout;
use super::super::gemm::{gemm_into, kernel_choice, matmul, Accumulate, KernelChoice, Operand};
use super::bf16_linear::Bf16Matrix;
use super::{cpu_f32s, f32s, StoredWeight};

/// A linear layer's weight matrix (out, in): a tensor (a variable when it trains, possibly
/// stored in bf16 when frozen), a frozen quantized one, or a frozen one whose products take
/// bf16 inputs (`compute_dtype = "bf16"`).
#[derive(Debug, Clone)]
pub enum BaseWeight {
    Dense(Tensor),
    Quantized(Arc<QTensor>),
    Bf16Products(Arc<Bf16Matrix>),
}

impl BaseWeight {
    /// The matrix in f32 on the CPU, contiguous, for one product: a bf16 or q8_0 one is a fresh
    /// copy, dropped after it.
    fn cpu_f32(&self) -> Result<Tensor> {
        match self {
            BaseWeight::Dense(w) => w.to_dtype(DType::F32)?.contiguous(),
            BaseWeight::Quantized(q) => q.dequantize(&Device::Cpu),
            BaseWeight::Bf16Products(m) => m.f32_values(),
        }
    }

    /// `x Wᵀ` for x (m, inp), row-major: on bf16 inputs for a `Bf16Products` matrix; else W
    /// read as it is stored for a few rows (`stored_product`), or the f32 kernels over W in f32.
    fn product(&self, choice: KernelChoice, x_storage: &CpuStorage, lx: &Layout, out: usize) -> Result<Vec<f32>> {
        let ((m, inp), x) = (lx.shape().dims2()?, f32s(x_storage, lx, "lora x")?);
        if let BaseWeight::Bf16Products(w) = self {
            return w.times_transposed(x, m);
        }
        if let Some(y) = self.stored_product(x_storage, lx, out)? {
            return Ok(y);
        }
        let w = self.cpu_f32()?;
        let (w_storage, w_layout) = w.storage_and_layout();
        let w = cpu_f32s(&w_storage, w_layout, "lora base weight")?;
        let mut y = vec![0f32; m * out];
        let (x, w) = (Operand::row_major(x, inp), Operand::transposed(w, inp));
        gemm_into(choice.family(m, out), (m, out, inp), &mut y, Accumulate::No, 1.0, x, w).map_err(gemm_error)?;
        Ok(y)
    }

    /// `G W` for G (m, out), row-major: the input's gradient through the frozen matrix.
    fn input_gradient(
        &self,
        choice: KernelChoice,
        g: Operand,
        (m, out, inp): (usize, usize, usize),
    ) -> Result<Vec<f32>> {
        if let BaseWeight::Bf16Products(w) = self {
            return w.left_times(g.data, m);
        }
        let w = self.cpu_f32()?;
        let (w_storage, w_layout) = w.storage_and_layout();
        let w_rows = Operand::row_major(cpu_f32s(&w_storage, w_layout, "lora base weight")?, inp);
        let mut dx = vec![0f32; m * inp];
        gemm_into(choice.family(m, inp), (m, inp, out), &mut dx, Accumulate::No, 1.0, g, w_rows).map_err(gemm_error)?;
        Ok(dx)
    }

    /// `x Wᵀ` read from W as it is stored when it is bf16 or q8_0 and x has a few rows
    /// (`super::stored_product`); None otherwise (an f32 W reaches the same kernels through
    /// `gemm_into`).
    fn stored_product(&self, x: &CpuStorage, lx: &Layout, out: usize) -> Result<Option<Vec<f32>>> {
        let CpuStorage::F32(xs) = x else { return Ok(None) };
        match self {
            BaseWeight::Dense(w) => match &*w.storage_and_layout().0 {
                Storage::Cpu(CpuStorage::BF16(v)) => {
                    super::stored_product(xs, lx, out, StoredWeight::Bf16(v, w.layout()))
                }
                _ => Ok(None),
            },
            BaseWeight::Quantized(q) if q.dtype() == GgmlDType::Q8_0 => {
                super::stored_product(xs, lx, out, StoredWeight::Q8_0(&q.data()?))
            }
            BaseWeight::Quantized(_) | BaseWeight::Bf16Products(_) => Ok(None),
        }
    }

    fn frozen_on_cpu(&self) -> bool {
        match self {
            BaseWeight::Dense(w) => {
                !w.track_op() && w.device().is_cpu() && matches!(w.dtype(), DType::F32 | DType::BF16)
            }
            BaseWeight::Quantized(q) => q.device().is_cpu(),
            BaseWeight::Bf16Products(_) => true,
        }
    }
}

/// Whether [`lora_linear`] applies: everything f32 on the CPU and the base weight frozen.
pub fn lora_fuses(x: &Tensor, w: &BaseWeight, a: &Tensor, b: &Tensor) -> bool {
    [x, a, b].iter().all(|t| t.device().is_cpu() && t.dtype() == DType::F32) && w.frozen_on_cpu()
}

/// `x Wᵀ + scaling · (x Aᵀ) Bᵀ` for 2-D x (rows, in), a frozen W (out, in), A (r, in) and
/// B (out, r); with `dropout` = (p, key), the adapter reads `x ⊙ dropout::mask(key, …, p)`. See
/// [`lora_fuses`] for where it applies.
pub fn lora_linear(
    x: &Tensor,
    w: &BaseWeight,
    a: &Tensor,
    b: &Tensor,
    scaling: f64,
    dropout: Option<(f32, u64)>,
) -> Result<Tensor> {
    let op = LoraLinear { w: w.clone(), scaling: scaling as f32, dropout, adapter_product: OnceLock::new() };
    x.contiguous()?.apply_op3(&a.contiguous()?, &b.contiguous()?, op)
}

struct LoraLinear {
    w: BaseWeight,
    scaling: f32,
    dropout: Option<(f32, u64)>,
    /// U = (x ⊙ M) Aᵀ, (rows, r), as the forward pass made it: dB reads it.
    adapter_product: OnceLock<Vec<f32>>,
}

impl LoraLinear {
    /// What the adapter reads of `x` (rows of `inp`): `x ⊙ M` under dropout, else `x` itself.
    fn adapter_input<'a>(&self, x: &'a [f32], inp: usize) -> std::borrow::Cow<'a, [f32]> {
        match self.dropout {
            Some((p, key)) => {
                let mut read = x.to_vec();
                dropout::apply(key, &mut read, inp, p);
                read.into()
            }
            None => x.into(),
        }
    }
}

/// U = x Aᵀ, (m, r), for x (m, inp) and A (r, inp), both row-major.
fn adapter_product(choice: KernelChoice, (m, r, inp): (usize, usize, usize), x: &[f32], a: &[f32]) -> Result<Vec<f32>> {
    let (x, at) = (Operand::row_major(x, inp), Operand::transposed(a, inp));
    matmul(choice.family(m, r), m, r, inp, x, at).map_err(gemm_error)
}

fn gemm_error(e: String) -> candle_core::Error {
    candle_core::Error::msg(e)
}

impl CustomOp3 for LoraLinear {
    fn name(&self) -> &'static str {
        "lora-linear"
    }

    fn cpu_fwd(
        &self,
        x_storage: &CpuStorage,
        lx: &Layout,
        a: &CpuStorage,
        la: &Layout,
        b: &CpuStorage,
        lb: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let ((m, inp), (r, _), (out, _)) = (lx.shape().dims2()?, la.shape().dims2()?, lb.shape().dims2()?);
        let (x, a, b) = (f32s(x_storage, lx, "lora x")?, f32s(a, la, "lora_A")?, f32s(b, lb, "lora_B")?);
        let choice = kernel_choice().map_err(gemm_error)?;
        let mut y = self.w.product(choice, x_storage, lx, out)?;
        let x = self.adapter_input(x, inp);
        let u = adapter_product(choice, (m, r, inp), &x, a)?;
        let bt = Operand::transposed(b, r);
        gemm_into(
            choice.family(m, out),
            (m, out, r),
            &mut y,
            Accumulate::Yes,
            self.scaling,
            Operand::row_major(&u, r),
            bt,
        )
        .map_err(gemm_error)?;
        // An op runs its forward pass once; a second U would be the same product.
        let _ = self.adapter_product.set(u);
        Ok((CpuStorage::F32(y), Shape::from((m, out))))
    }

    fn bwd(
        &self,
        x: &Tensor,
        a: &Tensor,
        b: &Tensor,
        _y: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let ((m, inp), (r, _), (out, _)) = (x.dims2()?, a.dims2()?, b.dims2()?);
        let (g, s, choice) = (g.contiguous()?, self.scaling, kernel_choice().map_err(gemm_error)?);
        let cpu = |v: Vec<f32>, shape: (usize, usize)| Tensor::from_vec(v, shape, &Device::Cpu);
        let ((g_storage, g_layout), (x_storage, x_layout)) = (g.storage_and_layout(), x.storage_and_layout());
        let ((a_storage, a_layout), (b_storage, b_layout)) = (a.storage_and_layout(), b.storage_and_layout());
        let g_rows = Operand::row_major(cpu_f32s(&g_storage, g_layout, "lora output gradient")?, out);
        let x_read = self.adapter_input(cpu_f32s(&x_storage, x_layout, "lora x")?, inp);
        let x_rows = Operand::row_major(&x_read, inp);
        let a_rows = Operand::row_major(cpu_f32s(&a_storage, a_layout, "lora_A")?, inp);
        let b_rows = Operand::row_major(cpu_f32s(&b_storage, b_layout, "lora_B")?, r);
        let v = matmul(choice.family(m, r), m, r, out, g_rows, b_rows).map_err(gemm_error)?;
        let da = if a.track_op() {
            // dAᵀ = s · Xᵀ v, (in, r), then transposed into A's layout.
            let mut da_t = vec![0f32; inp * r];
            let (xt, v) = (Operand::transposed(x_rows.data, inp), Operand::row_major(&v, r));
            gemm_into(choice.family(inp, r), (inp, r, m), &mut da_t, Accumulate::No, s, xt, v).map_err(gemm_error)?;
            let da: Vec<f32> = (0..r * inp).map(|i| da_t[(i % inp) * r + i / inp]).collect();
            Some(cpu(da, (r, inp))?)
        } else {
            None
        };
        let db = if b.track_op() {
            let made;
            let u = match self.adapter_product.get() {
                Some(u) => u,
                None => {
                    made = adapter_product(choice, (m, r, inp), x_rows.data, a_rows.data)?;
                    &made
                }
            };
            let (gt, u) = (Operand::transposed(g_rows.data, out), Operand::row_major(u, r));
            let mut db = vec![0f32; out * r];
            gemm_into(choice.family(out, r), (out, r, m), &mut db, Accumulate::No, s, gt, u).map_err(gemm_error)?;
            Some(cpu(db, (out, r))?)
        } else {
            None
        };
        let dx = if x.track_op() {
            let mut dx = self.w.input_gradient(choice, g_rows, (m, out, inp))?;
            let (family, v) = (choice.family(m, inp), Operand::row_major(&v, r));
            match self.dropout {
                // The adapter's term reaches only the inputs it read.
                Some((p, key)) => {
                    let mut adapter = vec![0f32; m * inp];
                    gemm_into(family, (m, inp, r), &mut adapter, Accumulate::No, s, v, a_rows).map_err(gemm_error)?;
                    dropout::apply(key, &mut adapter, inp, p);
                    dx.iter_mut().zip(&adapter).for_each(|(d, t)| *d += t);
                }
                None => gemm_into(family, (m, inp, r), &mut dx, Accumulate::Yes, s, v, a_rows).map_err(gemm_error)?,
            }
            Some(cpu(dx, (m, inp))?)
        } else {
            None
        };
        Ok((dx, da, db))
    }
}
