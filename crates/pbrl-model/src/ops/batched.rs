//! Batched matrix products (attention's scores and values) on pbrl's kernels.
use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};

use super::super::gemm::{gemm_batched, kernel_choice, Operand};

/// `a (…, m, k) · b (…, k, n)` for f32 CPU operands in any strides, the batch spread over
/// candle's pool (`super::super::pool`); candle's own matmul sends it to a second pool.
struct BatchedMatMul;

/// Where each product of a batch starts in its operand's data: the layout's start plus the
/// batch index times the batch dimensions' strides.
fn batch_starts(l: &Layout) -> Vec<usize> {
    let rank = l.dims().len();
    let (dims, strides) = (&l.dims()[..rank - 2], &l.stride()[..rank - 2]);
    let mut starts = vec![l.start_offset()];
    for (&d, &st) in dims.iter().zip(strides) {
        starts = starts.iter().flat_map(|&s| (0..d).map(move |i| s + i * st)).collect();
    }
    starts
}

impl CustomOp2 for BatchedMatMul {
    fn name(&self) -> &'static str {
        "matmul-batched"
    }

    fn cpu_fwd(&self, a: &CpuStorage, la: &Layout, b: &CpuStorage, lb: &Layout) -> Result<(CpuStorage, Shape)> {
        let rank = la.dims().len();
        if rank < 2 || lb.dims().len() != rank || la.dims()[..rank - 2] != lb.dims()[..rank - 2] {
            candle_core::bail!("matmul-batched: shapes {:?} and {:?} do not multiply", la.dims(), lb.dims());
        }
        let (m, k, n) = (la.dims()[rank - 2], la.dims()[rank - 1], lb.dims()[rank - 1]);
        if lb.dims()[rank - 2] != k {
            candle_core::bail!("matmul-batched: shapes {:?} and {:?} do not multiply", la.dims(), lb.dims());
        }
        let mut shape = la.dims().to_vec();
        shape[rank - 1] = n;
        let (CpuStorage::F32(av), CpuStorage::F32(bv)) = (a, b) else {
            candle_core::bail!("matmul-batched: f32 operands only")
        };
        let (a_rs, a_cs, b_rs, b_cs) =
            (la.stride()[rank - 2], la.stride()[rank - 1], lb.stride()[rank - 2], lb.stride()[rank - 1]);
        let mut y = vec![0f32; shape.iter().product()];
        let family = kernel_choice().map_err(candle_core::Error::msg)?.family(m, n);
        gemm_batched(
            family,
            (m, n, k),
            &mut y,
            Operand { data: av, row_stride: a_rs, col_stride: a_cs },
            &batch_starts(la),
            Operand { data: bv, row_stride: b_rs, col_stride: b_cs },
            &batch_starts(lb),
        )
        .map_err(candle_core::Error::msg)?;
        Ok((CpuStorage::F32(y), Shape::from(shape)))
    }

    // dA = G Bᵀ and dB = Aᵀ G, each only when it is read.
    fn bwd(&self, a: &Tensor, b: &Tensor, _y: &Tensor, g: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let da = a.track_op().then(|| g.apply_op2_no_bwd(&b.t()?, &BatchedMatMul)).transpose()?;
        let db = b.track_op().then(|| a.t()?.apply_op2_no_bwd(g, &BatchedMatMul)).transpose()?;
        Ok((da, db))
    }
}

/// `a · b` over the last two dimensions (batch dimensions equal): f32 on the CPU through
/// pbrl's kernels, elsewhere candle's matmul.
pub fn batched_matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    if a.device().is_cpu()
        && a.dtype() == candle_core::DType::F32
        && b.dtype() == candle_core::DType::F32
        && a.rank() >= 2
    {
        return a.apply_op2(b, BatchedMatMul);
    }
    a.matmul(b)
}
