//! A frozen base's products at `compute_dtype = "bf16"`: `x Wᵀ` forward and `G W` (dX)
//! backward, each with its input rounded to bf16 and W's values in bf16, the sums in f32
//! (`gemm::bf16`). W gets no gradient: it is frozen.
//!
//! W is kept only as the packed right operand of `x Wᵀ` (W's size in bf16), made when the
//! matrix is, and the stored tensor is let go; the right operand of `G W` is made from it at
//! the first backward pass (another bf16 copy: a trained base holds W twice in bf16, the size
//! of its f32 copy).
use std::sync::{Arc, OnceLock};

use candle_core::{CpuStorage, CustomOp1, DType, Device, Layout, Result, Shape, Storage, Tensor};

use super::super::gemm::bf16::{self, Packed, Rows};
use super::super::gemm::Accumulate;
use super::{contiguous_slice, cpu_f32s, f32s};

/// A frozen (out, in) matrix on the CPU whose products take bf16 inputs.
#[derive(Debug)]
pub struct Bf16Matrix {
    out: usize,
    inp: usize,
    /// (in × out): the right operand of `x Wᵀ`.
    transposed: Packed,
    /// (out × in): the right operand of `G W`, made from `transposed` at first use.
    itself: OnceLock<Packed>,
}

impl Bf16Matrix {
    /// `weight`: 2-D, f32 (rounded to bf16 here) or bf16, on the CPU, not a variable.
    pub fn new(weight: &Tensor) -> Result<Self> {
        if !weight.device().is_cpu() || weight.track_op() || weight.rank() != 2 {
            candle_core::bail!("bf16 products take a frozen 2-D matrix on the CPU")
        }
        let (out, inp) = weight.dims2()?;
        let weight = weight.contiguous()?;
        let (storage, layout) = weight.storage_and_layout();
        // Element (i, j) of x Wᵀ's right operand is W[j, i].
        let transposed = match &*storage {
            Storage::Cpu(CpuStorage::BF16(v)) => {
                let v = contiguous_slice(v, layout, "bf16 matrix")?;
                Packed::from_fn(inp, out, |i, j| v[j * inp + i].to_bits())
            }
            Storage::Cpu(CpuStorage::F32(v)) => {
                let v = contiguous_slice(v, layout, "f32 matrix")?;
                Packed::from_fn(inp, out, |i, j| bf16::round_bits(v[j * inp + i]))
            }
            _ => candle_core::bail!("bf16 products take a matrix stored in f32 or bf16, not {:?}", weight.dtype()),
        };
        Ok(Self { out, inp, transposed, itself: OnceLock::new() })
    }

    /// (out, in).
    pub fn dims(&self) -> (usize, usize) {
        (self.out, self.inp)
    }

    /// W in f32 (its bf16 values), (out, in): for the paths that do not take bf16 inputs.
    pub fn f32_values(&self) -> Result<Tensor> {
        let v: Vec<f32> =
            (0..self.out * self.inp).map(|e| bf16::value(self.transposed.at(e % self.inp, e / self.inp))).collect();
        Tensor::from_vec(v, (self.out, self.inp), &Device::Cpu)
    }

    /// `x Wᵀ` for x (rows × in), row-major.
    pub fn times_transposed(&self, x: &[f32], rows: usize) -> Result<Vec<f32>> {
        product(x, rows, self.inp, &self.transposed)
    }

    /// `G W` for G (rows × out), row-major: the input's gradient.
    pub fn left_times(&self, g: &[f32], rows: usize) -> Result<Vec<f32>> {
        let t = &self.transposed;
        let itself = self.itself.get_or_init(|| Packed::from_fn(self.out, self.inp, |i, j| t.at(j, i)));
        product(g, rows, self.out, itself)
    }
}

/// `a (rows × k, rounded to bf16) · b`.
fn product(a: &[f32], rows: usize, k: usize, b: &Packed) -> Result<Vec<f32>> {
    let a = Rows::round(a, rows, k).map_err(candle_core::Error::msg)?;
    let mut y = vec![0f32; rows * b.n];
    bf16::gemm(&mut y, Accumulate::No, &a, b).map_err(candle_core::Error::msg)?;
    Ok(y)
}

/// `x Wᵀ` for 2-D f32 x (rows, in) on the CPU, with bf16 inputs (see the module).
pub fn bf16_linear(x: &Tensor, w: &Arc<Bf16Matrix>) -> Result<Tensor> {
    if !x.device().is_cpu() || x.dtype() != DType::F32 {
        candle_core::bail!("compute_dtype = \"bf16\": f32 activations on the CPU only")
    }
    x.contiguous()?.apply_op1(Bf16Linear(w.clone()))
}

struct Bf16Linear(Arc<Bf16Matrix>);

impl CustomOp1 for Bf16Linear {
    fn name(&self) -> &'static str {
        "bf16-linear"
    }

    fn cpu_fwd(&self, x: &CpuStorage, lx: &Layout) -> Result<(CpuStorage, Shape)> {
        let (x, rows) = (f32s(x, lx, "bf16-linear input")?, lx.shape().dims2()?.0);
        let y = self.0.times_transposed(x, rows)?;
        let out = self.0.dims().0;
        Ok((CpuStorage::F32(y), Shape::from((rows, out))))
    }

    fn bwd(&self, x: &Tensor, _y: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        if !x.track_op() {
            return Ok(None);
        }
        let g = g.contiguous()?;
        let (storage, layout) = g.storage_and_layout();
        let (g_rows, rows) = (cpu_f32s(&storage, layout, "bf16-linear gradient")?, layout.shape().dims2()?.0);
        let dx = self.0.left_times(g_rows, rows)?;
        Ok(Some(Tensor::from_vec(dx, (rows, self.0.dims().1), &Device::Cpu)?))
    }
}
