//! Products with bf16 inputs and f32 sums: `dst (m, n) [+]= a (m, k) · b (k, n)` where every
//! element of `a` and `b` is a bf16 value, each product of two exact in f32, the sums in f32.
//! They are the frozen base's products of LoRA agents at `agent_lora.compute_dtype = "bf16"`
//! (bitsandbytes' `bnb_4bit_compute_dtype`, the products PyTorch's bf16 autocast makes).
//!
//! Both operands are bf16 *pairs* along the depth k: element 2p in the low half of a u32,
//! element 2p + 1 in the high half (an odd k padded with a zero), the layout AVX512_BF16's
//! `vdpbf16ps` reads. One such instruction adds a₀b₀ + a₁b₁ to each of 16 f32 sums: twice the
//! multiply-adds of an f32 FMA (one thread of the AMD EPYC Zen 5 VM: 505 GFLOP/s against
//! 206–251 for f32 FMAs, a scratch loop of the microkernel's shape).
//! - [`Rows`]: the left operand, m rows of pairs, rounded from f32 rows as a product takes
//!   them ([`Rows::round`]: round to nearest even, subnormals to zero, as `vcvtne2ps2bf16`).
//! - [`Packed`]: the right operand, made once per frozen matrix and kept: strips of
//!   [`STRIP`] columns, each strip's pairs one contiguous run (the microkernel's 3 × 16 lanes).
//!
//! [`gemm`] cuts the strips over candle's pool; every output element is summed in the same
//! order whatever the thread count, so the bits do not depend on it. On a CPU without
//! AVX512_BF16, or with `PBRL_GEMM` forcing a family, it computes the same sums with the f32
//! kernels over the pairs' values (the same values up to the order of the sums).
use super::{gemm_into, kernel_choice, Accumulate, KernelChoice, Operand, SharedPtr};

/// Columns per strip of a [`Packed`] operand: three 16-lane registers.
pub const STRIP: usize = 48;
/// Rows per microkernel tile: 8 × 3 accumulators of the 32 vector registers.
const TILE_ROWS: usize = 8;
/// Pairs of depth per block: a strip's block is 72 KiB, kept in L2 over all row tiles.
const DEPTH_BLOCK: usize = 384;

/// The bits of `x` rounded to bf16: to nearest even, a subnormal to a signed zero, a NaN kept
/// a (quiet) NaN; what `vcvtne2ps2bf16` computes.
pub fn round_bits(x: f32) -> u16 {
    let b = x.to_bits();
    if b & 0x7f80_0000 == 0 {
        return ((b >> 16) & 0x8000) as u16;
    }
    if b & 0x7fff_ffff > 0x7f80_0000 {
        return ((b >> 16) | 0x0040) as u16;
    }
    if b & 0x7fff_ffff == 0x7f80_0000 {
        return (b >> 16) as u16;
    }
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// The f32 value of bf16 bits.
pub fn value(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

fn pair(lo: u16, hi: u16) -> u32 {
    lo as u32 | (hi as u32) << 16
}

fn pairs_of(k: usize) -> usize {
    k.div_ceil(2)
}

/// Whether [`gemm`] runs on the bf16 dot-product instructions here: the CPU has AVX512_BF16
/// and `PBRL_GEMM` leaves the choice to pbrl.
pub fn native() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let auto = matches!(kernel_choice(), Ok(KernelChoice::Auto { .. }));
        auto && is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The left operand: `rows` rows of `pairs` bf16 pairs each, row-major.
pub struct Rows {
    pub rows: usize,
    pub pairs: usize,
    data: Vec<u32>,
}

impl Rows {
    /// f32 rows (`rows` × `k`, row-major) rounded to bf16 ([`round_bits`]).
    pub fn round(x: &[f32], rows: usize, k: usize) -> Result<Self, String> {
        if x.len() != rows * k {
            return Err(format!("bf16 rows: {} elements for {rows} rows of {k}", x.len()));
        }
        let pairs = pairs_of(k);
        let mut data = vec![0u32; rows * pairs];
        if k > 0 {
            #[cfg(target_arch = "x86_64")]
            let native = native();
            let round_row = |(src, dst): (&[f32], &mut [u32])| {
                #[cfg(target_arch = "x86_64")]
                if native {
                    // SAFETY: `native` checked the instructions; the slices are a row each.
                    return unsafe { round_row_avx512(src, dst) };
                }
                round_row_scalar(src, dst, 0)
            };
            x.chunks(k).zip(data.chunks_mut(pairs)).for_each(round_row);
        }
        Ok(Self { rows, pairs, data })
    }

    /// The rows' values as f32 (`rows` × 2·`pairs`): what the fallback multiplies.
    fn values(&self) -> Vec<f32> {
        self.data.iter().flat_map(|&p| [value(p as u16), value((p >> 16) as u16)]).collect()
    }
}

/// Row `src` (k elements) into `dst` (⌈k/2⌉ pairs), from element `from` (even) on.
fn round_row_scalar(src: &[f32], dst: &mut [u32], from: usize) {
    for p in from / 2..dst.len() {
        let hi = src.get(2 * p + 1).map_or(0, |&x| round_bits(x));
        dst[p] = pair(round_bits(src[2 * p]), hi);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn round_row_avx512(src: &[f32], dst: &mut [u32]) {
    use std::arch::x86_64::*;
    let full = src.len() / 32;
    for c in 0..full {
        let lo = _mm512_loadu_ps(src.as_ptr().add(32 * c));
        let hi = _mm512_loadu_ps(src.as_ptr().add(32 * c + 16));
        // The low 16 bf16 of the result are `lo`'s: element i of the row stays element i.
        let v = std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(hi, lo));
        _mm512_storeu_si512(dst.as_mut_ptr().add(16 * c) as *mut __m512i, v);
    }
    round_row_scalar(src, dst, 32 * full);
}

/// The right operand (k × n), packed: strip s holds columns `STRIP·s ..` (zeros past n), its
/// pairs p = 0 .. ⌈k/2⌉ one after the other, each `STRIP` u32.
pub struct Packed {
    pub n: usize,
    pub pairs: usize,
    data: Vec<u32>,
}

impl std::fmt::Debug for Packed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Packed({} pairs × {})", self.pairs, self.n)
    }
}

impl Packed {
    /// The (k × n) operand whose element (i, j) has the bits `at(i, j)`.
    pub fn from_fn(k: usize, n: usize, at: impl Fn(usize, usize) -> u16 + Sync) -> Self {
        let pairs = pairs_of(k);
        let strip = |s: usize| {
            let mut out = vec![0u32; pairs * STRIP];
            for (p, run) in out.chunks_mut(STRIP).enumerate() {
                for (c, slot) in run.iter_mut().enumerate().take(n.saturating_sub(s * STRIP)) {
                    let j = s * STRIP + c;
                    let hi = if 2 * p + 1 < k { at(2 * p + 1, j) } else { 0 };
                    *slot = pair(at(2 * p, j), hi);
                }
            }
            out
        };
        let data = super::super::pool::map(n.div_ceil(STRIP), strip).concat();
        Self { n, pairs, data }
    }

    /// The bits of element (i, j), i < k, j < n.
    pub fn at(&self, i: usize, j: usize) -> u16 {
        let v = self.data[((j / STRIP) * self.pairs + i / 2) * STRIP + j % STRIP];
        (v >> (16 * (i % 2))) as u16
    }

    /// The operand's values as f32, (2·`pairs` × n) row-major: what the fallback multiplies.
    fn values(&self) -> Vec<f32> {
        let mut out = vec![0f32; 2 * self.pairs * self.n];
        for j in 0..self.n {
            let (s, c) = (j / STRIP, j % STRIP);
            for p in 0..self.pairs {
                let v = self.data[(s * self.pairs + p) * STRIP + c];
                out[2 * p * self.n + j] = value(v as u16);
                out[(2 * p + 1) * self.n + j] = value((v >> 16) as u16);
            }
        }
        out
    }
}

/// `dst (a.rows × b.n) = [dst +] a · b`.
pub fn gemm(dst: &mut [f32], accumulate: Accumulate, a: &Rows, b: &Packed) -> Result<(), String> {
    let threads = super::super::pool::threads();
    gemm_in_chunks(dst, accumulate, a, b, threads, native())
}

/// [`gemm`] with the strips cut into `chunks` runs, on the bf16 instructions or (`native`
/// false) the f32 kernels.
fn gemm_in_chunks(
    dst: &mut [f32],
    accumulate: Accumulate,
    a: &Rows,
    b: &Packed,
    chunks: usize,
    native: bool,
) -> Result<(), String> {
    let (m, n) = (a.rows, b.n);
    if a.pairs != b.pairs || dst.len() != m * n {
        return Err(format!(
            "bf16 gemm: {m} rows of {} pairs times {} pairs × {n}, into {} elements",
            a.pairs,
            b.pairs,
            dst.len()
        ));
    }
    if !native {
        let (k, family) = (2 * a.pairs, kernel_choice()?.family(m, n));
        let (av, bv) = (a.values(), b.values());
        return gemm_into(
            family,
            (m, n, k),
            dst,
            accumulate,
            1.0,
            Operand::row_major(&av, k),
            Operand::row_major(&bv, n),
        );
    }
    if a.pairs == 0 && accumulate == Accumulate::No {
        dst.fill(0.0);
    }
    if m == 0 || n == 0 || a.pairs == 0 {
        return Ok(());
    }
    let strips = n.div_ceil(STRIP);
    let chunks = chunks.clamp(1, strips);
    let dst_ptr = SharedPtr(dst.as_mut_ptr());
    let run = |t: usize| {
        for s in strips * t / chunks..strips * (t + 1) / chunks {
            // SAFETY: `native` (the caller's check) means the CPU has the instructions; the
            // strip's columns of dst are written by this run only.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                strip_product(dst_ptr.get(), accumulate, a, b, s)
            };
            #[cfg(not(target_arch = "x86_64"))]
            let _ = (s, dst_ptr);
        }
    };
    if chunks == 1 {
        run(0);
    } else {
        super::super::pool::map(chunks, run);
    }
    Ok(())
}

/// Strip `s` of `dst` (its columns of every row), depth block by depth block.
///
/// # Safety
/// The CPU has AVX512F and AVX512_BF16; `dst` holds `a.rows × b.n` elements and no other
/// thread writes strip `s`'s columns.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn strip_product(dst: *mut f32, accumulate: Accumulate, a: &Rows, b: &Packed, s: usize) {
    let (m, n, pairs) = (a.rows, b.n, a.pairs);
    let cols = STRIP.min(n - s * STRIP);
    let strip = b.data.as_ptr().add(s * pairs * STRIP);
    let mut tile = [0f32; TILE_ROWS * STRIP];
    for (d, depth) in (0..pairs).step_by(DEPTH_BLOCK).enumerate() {
        let kc = DEPTH_BLOCK.min(pairs - depth);
        let overwrite = d == 0 && accumulate == Accumulate::No;
        for row in (0..m).step_by(TILE_ROWS) {
            let rows = TILE_ROWS.min(m - row);
            // A short last tile repeats its last row; only its own rows are stored.
            let starts: [*const u32; TILE_ROWS] =
                std::array::from_fn(|i| a.data.as_ptr().add((row + i.min(rows - 1)) * pairs + depth));
            tile_product(kc, &starts, strip.add(depth * STRIP), &mut tile);
            for i in 0..rows {
                let out = dst.add((row + i) * n + s * STRIP);
                for c in 0..cols {
                    let t = tile[i * STRIP + c];
                    *out.add(c) = if overwrite { t } else { *out.add(c) + t };
                }
            }
        }
    }
}

/// `tile (8 × 48) = Σ_p a_i[p] · b[p]` over `kc` pairs: row i's pairs from `a[i]`, the strip's
/// from `b` (`STRIP` per pair).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn tile_product(kc: usize, a: &[*const u32; TILE_ROWS], b: *const u32, tile: &mut [f32; TILE_ROWS * STRIP]) {
    use std::arch::x86_64::*;
    // 32 bits of bf16 pairs as the operand type of `vdpbf16ps` (the same bits).
    let pairs = |v: __m512i| std::mem::transmute::<__m512i, __m512bh>(v);
    let mut acc = [[_mm512_setzero_ps(); 3]; TILE_ROWS];
    for p in 0..kc {
        let bp = b.add(p * STRIP) as *const __m512i;
        let bv = [0, 1, 2].map(|j| pairs(_mm512_loadu_si512(bp.add(j))));
        for (row, a) in acc.iter_mut().zip(a) {
            let ai = pairs(_mm512_set1_epi32(*a.add(p) as i32));
            for (sum, b) in row.iter_mut().zip(&bv) {
                *sum = _mm512_dpbf16_ps(*sum, ai, *b);
            }
        }
    }
    for (out, row) in tile.chunks_exact_mut(STRIP).zip(&acc) {
        for (j, sum) in row.iter().enumerate() {
            _mm512_storeu_ps(out.as_mut_ptr().add(16 * j), *sum);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::data;
    use super::*;

    #[test]
    fn rounding_is_to_nearest_even_with_subnormals_to_zero() {
        assert_eq!(round_bits(1.0), 0x3f80);
        // 1 + 2⁻⁸ is halfway between 1 and 1 + 2⁻⁷: to the even one, 1; 1 + 3·2⁻⁸ up to 1 + 2⁻⁶.
        assert_eq!(value(round_bits(1.0 + 1.0 / 256.0)), 1.0);
        assert_eq!(value(round_bits(1.0 + 3.0 / 256.0)), 1.0 + 1.0 / 64.0);
        assert_eq!(round_bits(-1e-40), 0x8000);
        assert!(value(round_bits(f32::NAN)).is_nan());
        assert_eq!(value(round_bits(f32::INFINITY)), f32::INFINITY);
        assert_eq!(value(round_bits(f32::MAX)), f32::INFINITY);
        // The vector rounding agrees with the scalar one on every element, tails included.
        let mut x = data(77, 3);
        x[5] = 1e-39;
        x[40] = f32::NAN;
        let rows = Rows::round(&x, 1, 77).unwrap();
        for (i, &v) in x.iter().enumerate() {
            let got = (rows.data[i / 2] >> (16 * (i % 2))) as u16;
            assert_eq!(got, round_bits(v), "element {i}");
        }
    }

    /// The products equal an f64 sum over the rounded values, for shapes with short last tiles
    /// and strips, an odd depth and more than one depth block, overwriting or accumulating.
    #[test]
    fn products_are_f32_sums_of_the_rounded_values() {
        for (m, n, k) in [(1, 1, 1), (13, 50, 37), (8, 48, 2), (20, 100, 1001), (3, 7, 800), (4, 5, 0)] {
            let (x, w) = (data(m * k, 1), data(k * n, 2));
            let a = Rows::round(&x, m, k).unwrap();
            let b = Packed::from_fn(k, n, |i, j| round_bits(w[i * n + j]));
            let rounded = |v: f32| value(round_bits(v)) as f64;
            let want: Vec<f64> = (0..m * n)
                .map(|e| (0..k).map(|p| rounded(x[e / n * k + p]) * rounded(w[p * n + e % n])).sum())
                .collect();
            for native in [false, true].into_iter().filter(|&v| !v || super::native()) {
                for accumulate in [Accumulate::No, Accumulate::Yes] {
                    let mut got = vec![0.5f32; m * n];
                    gemm_in_chunks(&mut got, accumulate, &a, &b, 2, native).unwrap();
                    let start = if accumulate == Accumulate::Yes { 0.5 } else { 0.0 };
                    for (g, w) in got.iter().zip(&want) {
                        let w = w + start;
                        assert!((*g as f64 - w).abs() <= 1e-5 * (1.0 + w.abs()), "{m}x{n}x{k} {native}: {g} vs {w}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_thread_count_changes_no_bit() {
        if !native() {
            eprintln!("skipped: this CPU has no AVX512_BF16 (the f32 kernels' own test covers the fallback)");
            return;
        }
        let (m, n, k) = (40, 200, 900);
        let a = Rows::round(&data(m * k, 5), m, k).unwrap();
        let w = data(k * n, 6);
        let b = Packed::from_fn(k, n, |i, j| round_bits(w[i * n + j]));
        let run = |chunks| {
            let mut out = vec![0f32; m * n];
            gemm_in_chunks(&mut out, Accumulate::No, &a, &b, chunks, true).unwrap();
            out
        };
        let one = run(1);
        for chunks in [2, 3, 5] {
            assert_eq!(run(chunks), one, "{chunks} chunks");
        }
    }

    #[test]
    fn a_packed_operand_reads_back_its_elements() {
        let (k, n) = (7, 50);
        let b = Packed::from_fn(k, n, |i, j| (i * 100 + j) as u16);
        for (i, j) in [(0, 0), (6, 49), (3, 48), (5, 17)] {
            assert_eq!(b.at(i, j), (i * 100 + j) as u16);
        }
    }

    #[test]
    fn mismatched_operands_are_errors() {
        let a = Rows::round(&[1.0; 6], 2, 3).unwrap();
        let b = Packed::from_fn(5, 4, |_, _| 0);
        assert!(gemm(&mut [0.0; 8], Accumulate::No, &a, &b).unwrap_err().contains("pairs"));
        assert!(Rows::round(&[1.0; 5], 2, 3).is_err());
    }
}
