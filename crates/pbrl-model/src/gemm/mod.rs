//! f32 matrix products on the CPU, with the kernel family chosen at run time by the CPU and the
//! shape of the product, and the threads of candle's own pool (`super::pool`).
//!
//! candle's CPU matmul calls the `gemm` crate, which (built with its `x86-v4` feature, as pbrl
//! is) picks its widest kernels once per process: AVX-512 wherever the CPU has it, and splits a
//! product over rayon's threads, a second pool beside candle's. pbrl's linear layers and
//! attention products call `gemm`'s kernels through this module instead, which
//! - takes the AVX-512 family only when the output's smaller side has at least
//!   [`WIDE_MIN_ROWS`] rows (the decode steps of small sampling batches take the 256-bit ones);
//! - cuts a product into blocks of whole output tiles, each computed on one thread of candle's
//!   pool, with the same depth blocking as the whole product: the result is the same bits under
//!   any thread count (`tests::blocks_for_threads_change_no_bit_of_the_product`).
//!
//! Products of at most [`DOT_MAX_ROWS`] rows in `x Wᵀ`'s layout (the decode steps of
//! sampling) skip `gemm` and its packing of W: `dot` computes each output as one dot product,
//! streaming W once (`dot`'s module documentation); up to `UNPACKED_MAX_ROWS` rows `gemm`
//! reads W in place.
//!
//! Either family computes the same product up to the order of its sums (~1e-7 relative).
//!
//! `PBRL_GEMM` forces one family for A/B runs: `auto` (the default: the rule above),
//! `avx512`, `avx2` or `scalar`; a family the CPU lacks is an error. It covers the linear
//! layers and the attention products (forward and backward: nearly all of a step's work).
use gemm_common::gemm::gemm_basic_generic;
use gemm_common::Parallelism;

pub mod bf16;
mod dot;
mod kernels;
#[cfg(test)]
mod tests;

pub use dot::{WeightRows, DOT_MAX_ROWS, Q8_BLOCK_BYTES};
pub use kernels::{kernel_choice, parse_choice, KernelChoice, KernelFamily, WIDE_MIN_ROWS};

/// A matrix operand: its elements and the strides (in elements) between its rows and columns.
#[derive(Clone, Copy)]
pub struct Operand<'a> {
    pub data: &'a [f32],
    pub row_stride: usize,
    pub col_stride: usize,
}

impl<'a> Operand<'a> {
    /// A row-major (rows, cols) matrix.
    pub fn row_major(data: &'a [f32], cols: usize) -> Self {
        Operand { data, row_stride: cols, col_stride: 1 }
    }

    /// The transpose of a row-major matrix with `cols` columns.
    pub fn transposed(data: &'a [f32], cols: usize) -> Self {
        Operand { data, row_stride: 1, col_stride: cols }
    }

    fn check(&self, rows: usize, cols: usize, what: &str) -> Result<(), String> {
        let last = (rows.max(1) - 1) * self.row_stride + (cols.max(1) - 1) * self.col_stride;
        if rows > 0 && cols > 0 && last >= self.data.len() {
            return Err(format!("gemm: {what} of {rows}x{cols} does not fit in {} elements", self.data.len()));
        }
        Ok(())
    }
}

/// `lhs (m, k) · rhs (k, n)` as a row-major (m, n) matrix, on `family`'s kernels.
pub fn matmul(
    family: KernelFamily,
    m: usize,
    n: usize,
    k: usize,
    lhs: Operand,
    rhs: Operand,
) -> Result<Vec<f32>, String> {
    let mut dst = vec![0f32; m * n];
    gemm_into(family, (m, n, k), &mut dst, Accumulate::No, 1.0, lhs, rhs)?;
    Ok(dst)
}

/// Whether [`gemm_into`] adds to what its destination holds or overwrites it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accumulate {
    No,
    Yes,
}

/// `dst (m, n) = [dst +] scale · lhs (m, k) · rhs (k, n)`, `dst` row-major: the scale and the
/// sum happen in the microkernel's store, so a scaled product added to another (a LoRA
/// adapter's term on its base projection) costs no pass over the output of its own.
pub fn gemm_into(
    family: KernelFamily,
    mnk: (usize, usize, usize),
    dst: &mut [f32],
    accumulate: Accumulate,
    scale: f32,
    lhs: Operand,
    rhs: Operand,
) -> Result<(), String> {
    gemm_in_blocks(family, mnk, dst, accumulate, scale, lhs, rhs, super::pool::threads())
}

/// [`gemm_into`], cut into blocks for `threads` threads.
#[allow(clippy::too_many_arguments)]
fn gemm_in_blocks(
    family: KernelFamily,
    (m, n, k): (usize, usize, usize),
    dst: &mut [f32],
    accumulate: Accumulate,
    scale: f32,
    lhs: Operand,
    rhs: Operand,
    threads: usize,
) -> Result<(), String> {
    lhs.check(m, k, "lhs")?;
    rhs.check(k, n, "rhs")?;
    if dst.len() != m * n {
        return Err(format!("gemm: a destination of {} elements for a {m}x{n} product", dst.len()));
    }
    if !family.available() {
        return Err(format!("gemm: this CPU does not support the {} kernels", family.name()));
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        if accumulate == Accumulate::No {
            dst.fill(0.0);
        }
        return Ok(());
    }
    let read_dst = accumulate == Accumulate::Yes;
    let dst_ptr = SharedPtr(dst.as_mut_ptr());
    let blocks = Blocks::of((m, n, k), threads);
    let block = |b: usize| {
        let (rows, cols) = blocks.block(b);
        // SAFETY: the operands hold every element their strides reach and dst is an m × n
        // buffer (both checked above); a block reads and writes inside them, and the blocks'
        // parts of dst do not overlap.
        unsafe {
            block_product(
                family,
                (rows.len(), cols.len(), k),
                dst_ptr.get().add(rows.start * n + cols.start),
                n,
                read_dst,
                scale,
                lhs.raw_at(rows.start, 0),
                rhs.raw_at(0, cols.start),
            )
        }
    };
    if blocks.count == 1 {
        block(0);
    } else {
        // On candle's pool, as the element-wise ops between two products (`super::pool`).
        super::pool::map(blocks.count, block);
    }
    Ok(())
}

/// `x (m, k) · Wᵀ` with W (n, k) read as it is stored (`rows`: f32, bf16 or q8_0), on the dot
/// kernels and cut over the pool along W's rows, when they apply: a vector `family` and at
/// most [`DOT_MAX_ROWS`] rows; else None (the caller makes an f32 W for `gemm`). x is
/// row-major with k elements per row.
///
/// # Safety
/// `rows` must reach n rows of k elements (q8_0: k a multiple of 32) that stay alive and
/// unchanged during the call.
pub unsafe fn stored_product(
    family: KernelFamily,
    (m, n, k): (usize, usize, usize),
    x: &[f32],
    rows: WeightRows,
) -> Result<Option<Vec<f32>>, String> {
    if !dot::applies(family, m, 1, 1) || !family.available() {
        return Ok(None);
    }
    if x.len() != m * k || (matches!(rows, WeightRows::Q8_0 { .. }) && k % 32 != 0) {
        return Err(format!("gemm: a {m}x{k} product with {} elements of x (q8_0 rows need k % 32 == 0)", x.len()));
    }
    let mut dst = vec![0f32; m * n];
    if m == 0 || n == 0 {
        return Ok(Some(dst));
    }
    let dst_ptr = SharedPtr(dst.as_mut_ptr());
    let blocks = Blocks::of((m, n, k), super::pool::threads());
    let block = |b: usize| {
        let (_, cols) = blocks.block(b);
        let product = dot::DotProduct {
            m,
            n: cols.len(),
            k,
            dst: dst_ptr.get().wrapping_add(cols.start),
            dst_stride: n,
            read_dst: false,
            scale: 1.0,
            x: x.as_ptr(),
            x_stride: k,
            w: rows.from_row(cols.start),
        };
        // SAFETY: x holds m rows of k (checked), `rows` n rows (the caller's contract), and
        // the blocks write disjoint columns of dst; `applies` admitted a vector family this
        // CPU runs.
        unsafe { product.run(family) }
    };
    if blocks.count == 1 {
        block(0);
    } else {
        super::pool::map(blocks.count, block);
    }
    Ok(Some(dst))
}

/// `dst[i] = lhs[i] · rhs[i]` for a batch of products of one shape (attention's scores and
/// values): `dst` holds them row-major one after the other, product i's operands start at
/// `lhs_starts[i]` and `rhs_starts[i]` in the operands' data, with the operands' strides. Each
/// product runs on one thread, the batch spread over the pool; a batch smaller than the pool
/// cuts each product instead.
#[allow(clippy::too_many_arguments)]
pub fn gemm_batched(
    family: KernelFamily,
    (m, n, k): (usize, usize, usize),
    dst: &mut [f32],
    lhs: Operand,
    lhs_starts: &[usize],
    rhs: Operand,
    rhs_starts: &[usize],
) -> Result<(), String> {
    let batch = lhs_starts.len();
    if rhs_starts.len() != batch || dst.len() != batch * m * n {
        return Err(format!(
            "gemm: a batch of {batch} {m}x{n} products with {} rhs and {} outputs",
            rhs_starts.len(),
            dst.len()
        ));
    }
    for (&a, &b) in lhs_starts.iter().zip(rhs_starts) {
        let (Some(ld), Some(rd)) = (lhs.data.get(a..), rhs.data.get(b..)) else {
            return Err("gemm: a batch operand starts past its data".into());
        };
        Operand { data: ld, ..lhs }.check(m, k, "lhs")?;
        Operand { data: rd, ..rhs }.check(k, n, "rhs")?;
    }
    if !family.available() {
        return Err(format!("gemm: this CPU does not support the {} kernels", family.name()));
    }
    let threads = super::pool::threads();
    if batch < 2 * threads || m * n == 0 || k == 0 {
        for (i, out) in dst.chunks_mut((m * n).max(1)).enumerate() {
            let (a, b) = (
                Operand { data: &lhs.data[lhs_starts[i]..], ..lhs },
                Operand { data: &rhs.data[rhs_starts[i]..], ..rhs },
            );
            gemm_in_blocks(family, (m, n, k), out, Accumulate::No, 1.0, a, b, threads)?;
        }
        return Ok(());
    }
    super::pool::for_each_chunk_mut(dst, m * n, |i, out| {
        // SAFETY: every product's operands were checked above, `out` is its (m, n) output.
        unsafe {
            block_product(
                family,
                (m, n, k),
                out.as_mut_ptr(),
                n,
                false,
                1.0,
                Operand { data: &lhs.data[lhs_starts[i]..], ..lhs }.raw_at(0, 0),
                Operand { data: &rhs.data[rhs_starts[i]..], ..rhs }.raw_at(0, 0),
            )
        }
    });
    Ok(())
}

/// The destination's pointer, shared by the threads that write disjoint blocks of it.
#[derive(Clone, Copy)]
struct SharedPtr(*mut f32);
// SAFETY: the threads holding it write disjoint blocks (see `gemm_into`).
unsafe impl Send for SharedPtr {}
unsafe impl Sync for SharedPtr {}

impl SharedPtr {
    /// The pointer (a method, so that closures capture the `Sync` wrapper, not its field).
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// An operand from one element on, as `gemm`'s kernels read it: a pointer and its strides.
#[derive(Clone, Copy)]
struct RawOperand {
    ptr: *const f32,
    row_stride: usize,
    col_stride: usize,
}

impl Operand<'_> {
    /// This operand from element (`row`, `col`) on.
    fn raw_at(&self, row: usize, col: usize) -> RawOperand {
        let ptr = self.data.as_ptr().wrapping_add(row * self.row_stride + col * self.col_stride);
        RawOperand { ptr, row_stride: self.row_stride, col_stride: self.col_stride }
    }
}

/// How one product is cut into blocks for the threads: along its output's longer side, in
/// whole microkernel tiles. Every block computes each of its outputs exactly as the whole
/// product would (the same depth blocking, so the same order of sums): the result does not
/// depend on the number of threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Blocks {
    along_rows: bool,
    /// Rows or columns per block (the last one takes the rest: up to twice as many).
    size: usize,
    len: usize,
    other: usize,
    count: usize,
}

/// Products of at most this many rows in x Wᵀ's layout (and more than `DOT_MAX_ROWS`) are
/// computed as they are, W read in place, not transposed with W packed. Measured with `cargo
/// bench --bench runtime -- gemm` on an Intel Xeon with AVX-512, 2 threads: at 32 rows 1.0-2.2x
/// as fast, at 64 0.8-1.4x, at 128 0.6-1.0x.
const UNPACKED_MAX_ROWS: usize = 48;
/// Products below this many multiply-adds run on the calling thread alone (`gemm`'s own
/// threading threshold).
const THREADING_MIN_WORK: usize = 48 * 48 * 256;
/// Blocks per thread: more than one, so that a thread the OS delays leaves its share to the
/// others (the pool hands blocks out from a shared cursor).
const BLOCKS_PER_THREAD: usize = 4;

impl Blocks {
    fn of((m, n, k): (usize, usize, usize), threads: usize) -> Blocks {
        let along_rows = m >= n;
        let (len, other) = if along_rows { (m, n) } else { (n, m) };
        // Rows are the microkernel's 6-wide side, columns its 16- or 64-tall one (the product
        // is computed transposed). `gemm` blocks the depth differently for products with at
        // most 64 rows and 64 columns, so no block is that small unless the product is.
        // Columns are cut in steps of 32, not of a whole 64-tall tile: 576 columns (SmolLM2's
        // hidden size) make 6 blocks of 96, even over 2 threads, where steps of 64 made 3 of
        // 128 and one of 192, so one thread computed 320 columns and the other waited.
        let (unit, min) = if along_rows { (48, 48) } else { (32, 64) };
        let min = if other <= 64 { 96 } else { min };
        let whole = Blocks { along_rows, size: len, len, other, count: 1 };
        if threads <= 1 || m.saturating_mul(n).saturating_mul(k) < THREADING_MIN_WORK || len < 2 * min {
            return whole;
        }
        let size = len.div_ceil(threads * BLOCKS_PER_THREAD).next_multiple_of(unit).max(min);
        // The last block takes what is left over, so that none is shorter than `size`.
        Blocks { size, count: len / size, ..whole }
    }

    /// Block `b`'s rows and columns of the output.
    fn block(&self, b: usize) -> (std::ops::Range<usize>, std::ops::Range<usize>) {
        let end = if b + 1 == self.count { self.len } else { (b + 1) * self.size };
        let part = b * self.size..end;
        if self.along_rows {
            (part, 0..self.other)
        } else {
            (0..self.other, part)
        }
    }
}

/// `dst (m, n) [+]= scale · lhs · rhs` on the calling thread, `dst` row-major with `dst_stride`
/// elements per row.
///
/// # Safety
/// The operands must hold every element their strides reach for an (m, k) and a (k, n)
/// matrix, `dst` every element of an (m, n) block, and `family` must run on this CPU.
#[allow(clippy::too_many_arguments)]
unsafe fn block_product(
    family: KernelFamily,
    (m, n, k): (usize, usize, usize),
    dst: *mut f32,
    dst_stride: usize,
    read_dst: bool,
    scale: f32,
    lhs: RawOperand,
    rhs: RawOperand,
) {
    if dot::applies(family, m, lhs.col_stride, rhs.row_stride) {
        let product = dot::DotProduct {
            m,
            n,
            k,
            dst,
            dst_stride,
            read_dst,
            scale,
            x: lhs.ptr,
            x_stride: lhs.row_stride,
            w: dot::WeightRows::F32 { ptr: rhs.ptr, stride: rhs.col_stride },
        };
        // SAFETY: as this function's own contract; `applies` admits vector families only.
        return unsafe { product.run(family) };
    }
    // gemm takes a product (gm, k) · (k, gn), dst by (column stride, row stride) and each
    // operand as (pointer, column stride, row stride): `reading` passes an operand as it is,
    // `transposed` as its transpose. As `gemm::gemm` does for a row-major destination, a product is computed transposed,
    // (n, m) = rhsᵀ · lhsᵀ on column-major terms, which its microkernels prefer; but gemm then
    // packs W (lhs of the transposed product, row-major) into panels, a strided gather of the
    // whole matrix for every product. With few rows in x Wᵀ's layout it computes the product
    // as it is instead: x (small) is packed and W read in place.
    let dst_factor = if read_dst { 1.0 } else { 0.0 };
    let reading = |o: RawOperand| (o.ptr, o.col_stride as isize, o.row_stride as isize);
    let transposed = |o: RawOperand| (o.ptr, o.row_stride as isize, o.col_stride as isize);
    let ((gm, gn), (dst_cs, dst_rs), a, b) = if m <= UNPACKED_MAX_ROWS && lhs.col_stride == 1 && rhs.row_stride == 1 {
        ((m, n), (1, dst_stride as isize), reading(lhs), reading(rhs))
    } else {
        ((n, m), (dst_stride as isize, 1), transposed(rhs), transposed(lhs))
    };
    macro_rules! run {
        ($simd:expr, $module:path, $n:expr) => {{
            use $module as ukr;
            gemm_basic_generic::<
                _,
                f32,
                { $n },
                { ukr::MR_DIV_N * $n },
                { ukr::NR },
                { ukr::MR_DIV_N },
                { ukr::H_M },
                { ukr::H_N },
            >(
                $simd,
                gm,
                gn,
                k,
                dst,
                dst_cs,
                dst_rs,
                read_dst,
                a.0,
                a.1,
                a.2,
                b.0,
                b.1,
                b.2,
                dst_factor,
                scale,
                false,
                false,
                false,
                |x, y, z| x * y + z,
                &ukr::UKR,
                &ukr::H_UKR,
                false,
                Parallelism::None,
            )
        }};
    }
    use gemm_common::simd::MixedSimd;
    match family {
        #[cfg(target_arch = "x86_64")]
        KernelFamily::Avx512 => {
            let simd = <gemm_common::simd::V4 as MixedSimd<f32, f32, f32, f32>>::try_new().expect("checked available");
            run!(simd, gemm_f32::microkernel::avx512f::f32, 16)
        }
        #[cfg(target_arch = "x86_64")]
        KernelFamily::Avx2 => {
            let simd = <gemm_common::simd::V3 as MixedSimd<f32, f32, f32, f32>>::try_new().expect("checked available");
            run!(simd, gemm_f32::microkernel::fma::f32, 8)
        }
        #[cfg(not(target_arch = "x86_64"))]
        KernelFamily::Avx512 | KernelFamily::Avx2 => unreachable!("checked available"),
        KernelFamily::Scalar => {
            let simd = <gemm_common::simd::Scalar as MixedSimd<f32, f32, f32, f32>>::try_new().expect("scalar");
            run!(simd, gemm_f32::microkernel::scalar::f32, 1)
        }
    }
}
