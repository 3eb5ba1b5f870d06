//! Products of a few rows as dot products: `dst (m, n) [+]= scale · lhs (m, k) · rhs (k, n)`
//! where lhs's rows and rhs's columns are contiguous — `x Wᵀ` with W (n, k) row-major, every
//! linear layer of a decode step — and m is at most [`DOT_MAX_ROWS`].
//!
//! Handed `x Wᵀ` transposed (`super::block_product`), `gemm` packs W into column panels before
//! its microkernels read it: a strided gather of the whole weight matrix, element by element,
//! for every product. With a few rows the packing costs more than the product: 48% of a
//! sampling run's samples (`perf`, the runtime bench's 8 rows × 64 tokens) were in `gemm`'s
//! packing loop (`pack_generic`). Here each output is the
//! dot product of one row of x and one row of W, read where they lie: W streams from memory
//! once per product, a tile of 4 of its rows against a few rows of x at a time (4 on 512-bit
//! registers, 2 on 256-bit ones, so that the accumulators stay in registers).
//!
//! Each output's sum runs in one fixed order — the family's vector lanes over the depth, the
//! lanes summed pairwise, then the depth's remainder — so it does not depend on m, on the tile
//! the output falls in, nor on the threads.
use super::KernelFamily;

/// Products with at most this many rows run on the dot kernels (when their layout allows).
/// Measured with `cargo bench --bench runtime -- gemm` (docs/benchmarks.md, "Decode steps
/// without packing").
pub const DOT_MAX_ROWS: usize = 16;

/// Whether the dot kernels compute an (m, ·) product whose lhs rows are `lhs_col_stride`
/// apart element to element and whose rhs columns `rhs_row_stride`: contiguous both, a few
/// rows, and a vector family (the portable family keeps `gemm`'s scalar kernels).
pub(super) fn applies(family: KernelFamily, m: usize, lhs_col_stride: usize, rhs_row_stride: usize) -> bool {
    m <= DOT_MAX_ROWS && lhs_col_stride == 1 && rhs_row_stride == 1 && family != KernelFamily::Scalar
}

/// One product for the dot kernels: `dst` row-major with `dst_stride` elements per row, row i
/// of x at `x + i · x_stride`, row j of W (column j of rhs) at `w + j · w_stride`.
#[derive(Clone, Copy)]
pub(super) struct DotProduct {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub dst: *mut f32,
    pub dst_stride: usize,
    pub read_dst: bool,
    pub scale: f32,
    pub x: *const f32,
    pub x_stride: usize,
    pub w: *const f32,
    pub w_stride: usize,
}

impl DotProduct {
    /// Compute it on the calling thread.
    ///
    /// # Safety
    /// x must hold m rows and W n rows of k elements at their strides, dst every element of
    /// an (m, n) block, and `family` must be a vector family this CPU runs.
    pub(super) unsafe fn run(self, family: KernelFamily) {
        match family {
            #[cfg(target_arch = "x86_64")]
            KernelFamily::Avx512 => dot_avx512(self),
            #[cfg(target_arch = "x86_64")]
            KernelFamily::Avx2 => dot_avx2(self),
            _ => unreachable!("the dot kernels run on a vector family ({})", family.name()),
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn dot_avx512(p: DotProduct) {
    tiles::<std::arch::x86_64::__m512, 4>(p)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2(p: DotProduct) {
    tiles::<std::arch::x86_64::__m256, 2>(p)
}

/// A vector register of f32 lanes: what the kernels need of it.
#[cfg(target_arch = "x86_64")]
trait Lanes: Copy {
    const WIDTH: usize;
    unsafe fn zero() -> Self;
    unsafe fn load(p: *const f32) -> Self;
    /// `self · b + acc`, fused.
    unsafe fn mul_add(self, b: Self, acc: Self) -> Self;
    /// The lanes' sum, pairwise: halves added until one lane is left.
    unsafe fn sum(self) -> f32;
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    impl super::Lanes for __m512 {
        const WIDTH: usize = 16;
        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn zero() -> Self {
            _mm512_setzero_ps()
        }
        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn load(p: *const f32) -> Self {
            _mm512_loadu_ps(p)
        }
        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn mul_add(self, b: Self, acc: Self) -> Self {
            _mm512_fmadd_ps(self, b, acc)
        }
        #[inline]
        #[target_feature(enable = "avx512f,avx2,fma")]
        unsafe fn sum(self) -> f32 {
            let halves = _mm512_castps_pd(self);
            let low = _mm256_castpd_ps(_mm512_castpd512_pd256(halves));
            let high = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(halves));
            _mm256_add_ps(low, high).sum()
        }
    }

    impl super::Lanes for __m256 {
        const WIDTH: usize = 8;
        #[inline]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn zero() -> Self {
            _mm256_setzero_ps()
        }
        #[inline]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn load(p: *const f32) -> Self {
            _mm256_loadu_ps(p)
        }
        #[inline]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn mul_add(self, b: Self, acc: Self) -> Self {
            _mm256_fmadd_ps(self, b, acc)
        }
        #[inline]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn sum(self) -> f32 {
            let four = _mm_add_ps(_mm256_castps256_ps128(self), _mm256_extractf128_ps::<1>(self));
            let two = _mm_add_ps(four, _mm_movehl_ps(four, four));
            _mm_cvtss_f32(_mm_add_ss(two, _mm_shuffle_ps::<1>(two, two)))
        }
    }
}

/// Every output, in tiles of 4 rows of W by `X` rows of x.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn tiles<V: Lanes, const X: usize>(p: DotProduct) {
    let mut j = 0;
    while j + 4 <= p.n {
        x_rows::<V, 4, X>(p, j);
        j += 4;
    }
    while j < p.n {
        x_rows::<V, 1, X>(p, j);
        j += 1;
    }
}

/// The outputs of W's rows `j..j + R` against every row of x.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn x_rows<V: Lanes, const R: usize, const X: usize>(p: DotProduct, j: usize) {
    let mut i = 0;
    while i + X <= p.m {
        tile::<V, R, X>(p, i, j);
        i += X;
    }
    match p.m - i {
        0 => {}
        1 => tile::<V, R, 1>(p, i, j),
        2 => tile::<V, R, 2>(p, i, j),
        _ => tile::<V, R, 3>(p, i, j),
    }
}

/// The R × C outputs of W's rows `j..j + R` and x's rows `i..i + C`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn tile<V: Lanes, const R: usize, const C: usize>(p: DotProduct, i: usize, j: usize) {
    let w: [*const f32; R] = std::array::from_fn(|r| p.w.add((j + r) * p.w_stride));
    let x: [*const f32; C] = std::array::from_fn(|c| p.x.add((i + c) * p.x_stride));
    let mut acc = [[V::zero(); C]; R];
    let body = p.k - p.k % V::WIDTH;
    let mut q = 0;
    while q < body {
        let mut wv = [V::zero(); R];
        for r in 0..R {
            wv[r] = V::load(w[r].add(q));
        }
        for c in 0..C {
            let xv = V::load(x[c].add(q));
            for r in 0..R {
                acc[r][c] = wv[r].mul_add(xv, acc[r][c]);
            }
        }
        q += V::WIDTH;
    }
    for r in 0..R {
        for c in 0..C {
            let mut sum = acc[r][c].sum();
            for t in body..p.k {
                sum = (*w[r].add(t)).mul_add(*x[c].add(t), sum);
            }
            let out = p.dst.add((i + c) * p.dst_stride + j + r);
            *out = if p.read_dst { *out + p.scale * sum } else { p.scale * sum };
        }
    }
}
