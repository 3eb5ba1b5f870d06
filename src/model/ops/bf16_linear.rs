//! A frozen base's products at `compute_dtype = "bf16"`: `x Wᵀ` forward and `G W` (dX)
//! backward, each with its input rounded to bf16 and W's values in bf16, the sums in f32
//! (`gemm::bf16`). W gets no gradient: it is frozen.
//!
//! The two packed forms of W (one per product) are made at W's first product of each kind and
//! kept: each is W's size in bf16, so a matrix computed this way holds twice its bf16 size
//! besides its own storage.
use std::sync::{Arc, OnceLock};

use candle_core::{CpuStorage, CustomOp1, DType, Device, Layout, Result, Shape, Storage, Tensor};

use super::super::gemm::bf16::{self, Packed, Rows};
use super::super::gemm::Accumulate;
use super::contiguous_slice;

/// A frozen (out, in) matrix on the CPU whose products take bf16 inputs.
#[derive(Debug)]
pub struct Bf16Matrix {
    /// As it is stored (f32 or bf16).
    pub weight: Tensor,
    /// (in × out): the right operand of `x Wᵀ`.
    transposed: OnceLock<Packed>,
    /// (out × in): the right operand of `G W`.
    itself: OnceLock<Packed>,
}

impl Bf16Matrix {
    /// `weight`: 2-D, f32 or bf16, on the CPU, not a variable.
    pub fn new(weight: Tensor) -> Result<Self> {
        if !weight.device().is_cpu() || weight.track_op() || weight.rank() != 2 {
            candle_core::bail!("bf16 products take a frozen 2-D matrix on the CPU")
        }
        if !matches!(weight.dtype(), DType::F32 | DType::BF16) {
            candle_core::bail!("bf16 products take a matrix stored in f32 or bf16, not {:?}", weight.dtype())
        }
        Ok(Self { weight: weight.contiguous()?, transposed: OnceLock::new(), itself: OnceLock::new() })
    }

    /// W's packed form for `x Wᵀ` (`transposed`) or for `G W`, made at its first use.
    fn packed(&self, transposed: bool) -> Result<&Packed> {
        let (out, inp) = self.weight.dims2()?;
        let pack = || -> Result<Packed> {
            let (storage, layout) = self.weight.storage_and_layout();
            let Storage::Cpu(s) = &*storage else { candle_core::bail!("bf16 products: a matrix off the CPU") };
            let (k, n) = if transposed { (inp, out) } else { (out, inp) };
            // Element (i, j) of the operand: W[j, i] for x Wᵀ, W[i, j] for G W.
            let index = move |i: usize, j: usize| if transposed { j * inp + i } else { i * inp + j };
            Ok(match s {
                CpuStorage::BF16(v) => {
                    let v = contiguous_slice(v, layout, "bf16 matrix")?;
                    Packed::from_fn(k, n, |i, j| v[index(i, j)].to_bits())
                }
                CpuStorage::F32(v) => {
                    let v = contiguous_slice(v, layout, "f32 matrix")?;
                    Packed::from_fn(k, n, |i, j| bf16::round_bits(v[index(i, j)]))
                }
                _ => candle_core::bail!("bf16 products take a matrix stored in f32 or bf16"),
            })
        };
        let cell = if transposed { &self.transposed } else { &self.itself };
        if cell.get().is_none() {
            let _ = cell.set(pack()?);
        }
        Ok(cell.get().expect("set above"))
    }

    /// `x Wᵀ` for x (rows × in), row-major.
    pub fn times_transposed(&self, x: &[f32], rows: usize) -> Result<Vec<f32>> {
        let (out, inp) = self.weight.dims2()?;
        self.product(x, rows, inp, out, true)
    }

    /// `G W` for G (rows × out), row-major: the input's gradient.
    pub fn left_times(&self, g: &[f32], rows: usize) -> Result<Vec<f32>> {
        let (out, inp) = self.weight.dims2()?;
        self.product(g, rows, out, inp, false)
    }

    fn product(&self, a: &[f32], rows: usize, k: usize, n: usize, transposed: bool) -> Result<Vec<f32>> {
        let a = Rows::round(a, rows, k).map_err(candle_core::Error::msg)?;
        let mut y = vec![0f32; rows * n];
        bf16::gemm(&mut y, Accumulate::No, &a, self.packed(transposed)?).map_err(candle_core::Error::msg)?;
        Ok(y)
    }
}

/// `x Wᵀ` for 2-D f32 x (rows, in) on the CPU, with bf16 inputs (see the module).
pub fn bf16_linear(x: &Tensor, w: &Arc<Bf16Matrix>) -> Result<Tensor> {
    if !x.device().is_cpu() || x.dtype() != DType::F32 {
        candle_core::bail!("compute_dtype = \"bf16\": f32 activations on the CPU only")
    }
    x.contiguous()?.apply_op1(Bf16Linear(w.clone()))
}

struct Bf16Linear(Arc<Bf16Matrix>);

fn f32_rows<'a>(s: &'a CpuStorage, l: &Layout) -> Result<(&'a [f32], usize)> {
    let CpuStorage::F32(v) = s else { candle_core::bail!("bf16-linear: f32 input only") };
    Ok((contiguous_slice(v, l, "bf16-linear input")?, l.shape().dims2()?.0))
}

impl CustomOp1 for Bf16Linear {
    fn name(&self) -> &'static str {
        "bf16-linear"
    }

    fn cpu_fwd(&self, x: &CpuStorage, lx: &Layout) -> Result<(CpuStorage, Shape)> {
        let (x, rows) = f32_rows(x, lx)?;
        let y = self.0.times_transposed(x, rows)?;
        let out = self.0.weight.dims2()?.0;
        Ok((CpuStorage::F32(y), Shape::from((rows, out))))
    }

    fn bwd(&self, x: &Tensor, _y: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        if !x.track_op() {
            return Ok(None);
        }
        let g = g.contiguous()?;
        let (storage, layout) = g.storage_and_layout();
        let Storage::Cpu(s) = &*storage else { candle_core::bail!("bf16-linear: a gradient off the CPU") };
        let (g_rows, rows) = f32_rows(s, layout)?;
        let dx = self.0.left_times(g_rows, rows)?;
        Ok(Some(Tensor::from_vec(dx, (rows, self.0.weight.dims2()?.1), &Device::Cpu)?))
    }
}
