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
//!
//! W may also be a frozen base stored in bf16 or GGUF q8_0 ([`WeightRows`]): each vector of W
//! is widened (bf16) or dequantized (`q as f32 · scale`, as candle dequantizes) in registers,
//! so the product is bit for bit the one on the f32 copy the other kernels would make of W
//! for every product, at a half or about a quarter of the bytes read.
use super::KernelFamily;

/// Products with at most this many rows run on the dot kernels (when their layout allows).
/// Measured with `cargo bench --bench runtime -- gemm`.
pub const DOT_MAX_ROWS: usize = 16;

/// Whether the dot kernels compute an (m, ·) product whose lhs rows are `lhs_col_stride`
/// apart element to element and whose rhs columns `rhs_row_stride`: contiguous both, a few
/// rows, and a vector family (the portable family keeps `gemm`'s scalar kernels).
pub(super) fn applies(family: KernelFamily, m: usize, lhs_col_stride: usize, rhs_row_stride: usize) -> bool {
    m <= DOT_MAX_ROWS && lhs_col_stride == 1 && rhs_row_stride == 1 && family != KernelFamily::Scalar
}

/// W's rows as they are stored: row j (column j of rhs) starts at `ptr + j · stride`.
#[derive(Clone, Copy)]
pub enum WeightRows {
    /// f32 elements; the stride in elements.
    F32 { ptr: *const f32, stride: usize },
    /// bf16 elements (as their bits); the stride in elements.
    Bf16 { ptr: *const u16, stride: usize },
    /// GGUF q8_0 blocks of 32 elements (an f16 scale, then 32 i8); the stride in bytes.
    Q8_0 { ptr: *const u8, stride: usize },
}

// SAFETY: a read-only view of weights that whoever makes one keeps alive and unchanged while
// a product reads them (`super::stored_product`'s contract), from any thread.
unsafe impl Send for WeightRows {}
unsafe impl Sync for WeightRows {}

impl WeightRows {
    /// The same rows from row `j` on.
    pub fn from_row(self, j: usize) -> Self {
        match self {
            WeightRows::F32 { ptr, stride } => WeightRows::F32 { ptr: ptr.wrapping_add(j * stride), stride },
            WeightRows::Bf16 { ptr, stride } => WeightRows::Bf16 { ptr: ptr.wrapping_add(j * stride), stride },
            WeightRows::Q8_0 { ptr, stride } => WeightRows::Q8_0 { ptr: ptr.wrapping_add(j * stride), stride },
        }
    }
}

/// One product for the dot kernels: `dst` row-major with `dst_stride` elements per row, row i
/// of x at `x + i · x_stride`, W's rows as `w` says.
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
    pub w: WeightRows,
}

impl DotProduct {
    /// Compute it on the calling thread.
    ///
    /// # Safety
    /// x must hold m rows and W n rows of k elements at their strides (q8_0: k a multiple of
    /// 32), dst every element of an (m, n) block, and `family` must be a vector family this CPU
    /// runs.
    pub(super) unsafe fn run(self, family: KernelFamily) {
        #[cfg(target_arch = "x86_64")]
        match (family, self.w) {
            (KernelFamily::Avx512, WeightRows::F32 { ptr, stride }) => return dot_avx512(self, F32Rows(ptr, stride)),
            (KernelFamily::Avx512, WeightRows::Bf16 { ptr, stride }) => return dot_avx512(self, Bf16Rows(ptr, stride)),
            (KernelFamily::Avx512, WeightRows::Q8_0 { ptr, stride }) => return dot_avx512(self, Q8Rows(ptr, stride)),
            (KernelFamily::Avx2, WeightRows::F32 { ptr, stride }) => return dot_avx2(self, F32Rows(ptr, stride)),
            (KernelFamily::Avx2, WeightRows::Bf16 { ptr, stride }) => return dot_avx2(self, Bf16Rows(ptr, stride)),
            (KernelFamily::Avx2, WeightRows::Q8_0 { ptr, stride }) => return dot_avx2(self, Q8Rows(ptr, stride)),
            _ => {}
        }
        unreachable!("the dot kernels run on a vector family ({})", family.name())
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn dot_avx512<W: Rows>(p: DotProduct, w: W) {
    tiles::<std::arch::x86_64::__m512, W, 4>(p, w)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2<W: Rows>(p: DotProduct, w: W) {
    tiles::<std::arch::x86_64::__m256, W, 2>(p, w)
}

/// How the kernels read one stored row of W: a vector of elements from `q` on (`q` a
/// multiple of the vector's width), or one element.
#[cfg(target_arch = "x86_64")]
trait Rows: Copy {
    /// Row `j`'s start.
    unsafe fn row(self, j: usize) -> *const u8;
    unsafe fn load<V: Lanes>(row: *const u8, q: usize) -> V;
    unsafe fn get(row: *const u8, t: usize) -> f32;
}

#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct F32Rows(*const f32, usize);
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Bf16Rows(*const u16, usize);
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Q8Rows(*const u8, usize);

/// Bytes of a q8_0 block: an f16 scale, then 32 i8.
pub const Q8_BLOCK_BYTES: usize = 34;

#[cfg(target_arch = "x86_64")]
impl Rows for F32Rows {
    #[inline(always)]
    unsafe fn row(self, j: usize) -> *const u8 {
        self.0.add(j * self.1).cast()
    }
    #[inline(always)]
    unsafe fn load<V: Lanes>(row: *const u8, q: usize) -> V {
        V::load(row.cast::<f32>().add(q))
    }
    #[inline(always)]
    unsafe fn get(row: *const u8, t: usize) -> f32 {
        *row.cast::<f32>().add(t)
    }
}

#[cfg(target_arch = "x86_64")]
impl Rows for Bf16Rows {
    #[inline(always)]
    unsafe fn row(self, j: usize) -> *const u8 {
        self.0.add(j * self.1).cast()
    }
    #[inline(always)]
    unsafe fn load<V: Lanes>(row: *const u8, q: usize) -> V {
        V::load_bf16(row.cast::<u16>().add(q))
    }
    #[inline(always)]
    unsafe fn get(row: *const u8, t: usize) -> f32 {
        f32::from_bits((row.cast::<u16>().add(t).read_unaligned() as u32) << 16)
    }
}

#[cfg(target_arch = "x86_64")]
impl Rows for Q8Rows {
    #[inline(always)]
    unsafe fn row(self, j: usize) -> *const u8 {
        self.0.add(j * self.1)
    }
    #[inline(always)]
    unsafe fn load<V: Lanes>(row: *const u8, q: usize) -> V {
        let block = row.add(q / 32 * Q8_BLOCK_BYTES);
        V::load_i8_scaled(block.add(2 + q % 32).cast(), q8_scale(block))
    }
    #[inline(always)]
    unsafe fn get(row: *const u8, t: usize) -> f32 {
        let block = row.add(t / 32 * Q8_BLOCK_BYTES);
        (*block.add(2 + t % 32).cast::<i8>()) as f32 * q8_scale(block)
    }
}

/// A q8_0 block's scale, its f16 widened.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn q8_scale(block: *const u8) -> f32 {
    half::f16::from_bits(block.cast::<u16>().read_unaligned()).to_f32()
}

/// A vector register of f32 lanes: what the kernels need of it.
#[cfg(target_arch = "x86_64")]
trait Lanes: Copy {
    const WIDTH: usize;
    unsafe fn zero() -> Self;
    unsafe fn load(p: *const f32) -> Self;
    /// `WIDTH` bf16 values, widened (exactly).
    unsafe fn load_bf16(p: *const u16) -> Self;
    /// `WIDTH` i8 values times `scale`, each `q as f32 · scale` (q8_0's dequantization).
    unsafe fn load_i8_scaled(p: *const i8, scale: f32) -> Self;
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
        unsafe fn load_bf16(p: *const u16) -> Self {
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast()))))
        }
        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn load_i8_scaled(p: *const i8, scale: f32) -> Self {
            let q = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p.cast())));
            _mm512_mul_ps(q, _mm512_set1_ps(scale))
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
        unsafe fn load_bf16(p: *const u16) -> Self {
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()))))
        }
        #[inline]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn load_i8_scaled(p: *const i8, scale: f32) -> Self {
            let q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p.cast())));
            _mm256_mul_ps(q, _mm256_set1_ps(scale))
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
unsafe fn tiles<V: Lanes, W: Rows, const X: usize>(p: DotProduct, w: W) {
    let mut j = 0;
    while j + 4 <= p.n {
        x_rows::<V, W, 4, X>(p, w, j);
        j += 4;
    }
    while j < p.n {
        x_rows::<V, W, 1, X>(p, w, j);
        j += 1;
    }
}

/// The outputs of W's rows `j..j + R` against every row of x.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn x_rows<V: Lanes, W: Rows, const R: usize, const X: usize>(p: DotProduct, w: W, j: usize) {
    let mut i = 0;
    while i + X <= p.m {
        tile::<V, W, R, X>(p, w, i, j);
        i += X;
    }
    match p.m - i {
        0 => {}
        1 => tile::<V, W, R, 1>(p, w, i, j),
        2 => tile::<V, W, R, 2>(p, w, i, j),
        _ => tile::<V, W, R, 3>(p, w, i, j),
    }
}

/// The R × C outputs of W's rows `j..j + R` and x's rows `i..i + C`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn tile<V: Lanes, W: Rows, const R: usize, const C: usize>(p: DotProduct, rows: W, i: usize, j: usize) {
    let w: [*const u8; R] = std::array::from_fn(|r| rows.row(j + r));
    let x: [*const f32; C] = std::array::from_fn(|c| p.x.add((i + c) * p.x_stride));
    let mut acc = [[V::zero(); C]; R];
    let body = p.k - p.k % V::WIDTH;
    let mut q = 0;
    while q < body {
        let mut wv = [V::zero(); R];
        for r in 0..R {
            wv[r] = W::load::<V>(w[r], q);
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
                sum = W::get(w[r], t).mul_add(*x[c].add(t), sum);
            }
            let out = p.dst.add((i + c) * p.dst_stride + j + r);
            *out = if p.read_dst { *out + p.scale * sum } else { p.scale * sum };
        }
    }
}
