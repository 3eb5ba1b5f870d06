//! f32 matrix products on the CPU, with the kernel family chosen at run time by the CPU and the
//! shape of the product.
//!
//! candle's CPU matmul calls the `gemm` crate, which (built with its `x86-v4` feature, as pbrl
//! is) picks its widest kernels once per process: AVX-512 wherever the CPU has it. Those win on
//! training's large products (measured on an Intel Xeon with AVX-512: the train step 1.18x
//! faster) but lose on the decode step's, whose outputs have as many rows as there are
//! sequences being sampled (8-32 in a collection batch): there the 256-bit kernels are faster
//! (forcing AVX-512 everywhere made sampling 1.6x slower).
//! So pbrl's own linear layers call `gemm`'s kernels through this module, which takes the
//! AVX-512 family only when the output's smaller side has at least [`WIDE_MIN_ROWS`] rows
//! (training's products and long prompts' prefill, not the decode steps of a collection batch).
//! Either family computes the same product up to the order of its sums (~1e-7 relative).
//!
//! `PBRL_GEMM` forces one family for A/B runs: `auto` (the default: the rule above),
//! `avx512`, `avx2` or `scalar`; a family the CPU lacks is an error. It covers the linear
//! layers (forward and backward: nearly all of a step's work); candle's own products (the
//! attention scores) keep `gemm`'s own choice.
use std::sync::OnceLock;

use gemm_common::gemm::gemm_basic_generic;
use gemm_common::Parallelism;

/// A family of `gemm` f32 kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelFamily {
    /// 512-bit (AVX-512F) kernels.
    Avx512,
    /// 256-bit (AVX2 + FMA) kernels.
    Avx2,
    /// Portable kernels (no SIMD).
    Scalar,
}

impl KernelFamily {
    pub fn name(self) -> &'static str {
        match self {
            KernelFamily::Avx512 => "avx512",
            KernelFamily::Avx2 => "avx2",
            KernelFamily::Scalar => "scalar",
        }
    }

    /// Whether this CPU runs the family (the instruction sets its kernels are compiled for).
    pub fn available(self) -> bool {
        use gemm_common::simd::MixedSimd;
        match self {
            #[cfg(target_arch = "x86_64")]
            KernelFamily::Avx512 => <gemm_common::simd::V4 as MixedSimd<f32, f32, f32, f32>>::try_new().is_some(),
            #[cfg(target_arch = "x86_64")]
            KernelFamily::Avx2 => <gemm_common::simd::V3 as MixedSimd<f32, f32, f32, f32>>::try_new().is_some(),
            #[cfg(not(target_arch = "x86_64"))]
            KernelFamily::Avx512 | KernelFamily::Avx2 => false,
            KernelFamily::Scalar => true,
        }
    }
}

/// Products whose output has fewer rows than this (on its smaller side) take the 256-bit
/// kernels even where AVX-512 exists. Measured with `cargo bench --bench runtime -- gemm` on an
/// Intel Xeon with AVX-512, 2 threads (docs/benchmarks.md): on SmolLM2-135M's products the
/// 512-bit kernels are 0.36-0.81x as fast at 8-16 rows (the LM head: 1.0-1.1x), from 0.86x
/// (576 outputs) to 1.59x (49152) at 128, and 1.33-1.65x at 512 (training's rows).
pub const WIDE_MIN_ROWS: usize = 128;

/// How pbrl picks kernels: by the rule (`auto`) or one family forced by `PBRL_GEMM`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelChoice {
    Auto { wide: Option<KernelFamily>, narrow: KernelFamily },
    Forced(KernelFamily),
}

impl KernelChoice {
    /// The family for a product whose output is `rows` × `cols`.
    pub fn family(self, rows: usize, cols: usize) -> KernelFamily {
        match self {
            KernelChoice::Forced(f) => f,
            KernelChoice::Auto { wide: Some(w), .. } if rows.min(cols) >= WIDE_MIN_ROWS => w,
            KernelChoice::Auto { narrow, .. } => narrow,
        }
    }

    /// One line for logs and benchmark reports.
    pub fn describe(self) -> String {
        match self {
            KernelChoice::Forced(f) => format!("{} (forced by PBRL_GEMM)", f.name()),
            KernelChoice::Auto { wide: Some(w), narrow } => {
                format!("{} for outputs of >= {WIDE_MIN_ROWS} rows, else {}", w.name(), narrow.name())
            }
            KernelChoice::Auto { wide: None, narrow } => narrow.name().to_string(),
        }
    }
}

/// Parse a `PBRL_GEMM` value against what this CPU offers.
pub fn parse_choice(value: Option<&str>) -> Result<KernelChoice, String> {
    let narrow = if KernelFamily::Avx2.available() { KernelFamily::Avx2 } else { KernelFamily::Scalar };
    let family = match value.map(str::trim) {
        None | Some("") | Some("auto") => {
            let wide = KernelFamily::Avx512.available().then_some(KernelFamily::Avx512);
            return Ok(KernelChoice::Auto { wide, narrow });
        }
        Some("avx512") => KernelFamily::Avx512,
        Some("avx2") => KernelFamily::Avx2,
        Some("scalar") => KernelFamily::Scalar,
        Some(other) => return Err(format!("PBRL_GEMM={other:?}: expected auto, avx512, avx2 or scalar")),
    };
    if family.available() {
        Ok(KernelChoice::Forced(family))
    } else {
        Err(format!("PBRL_GEMM={}: this CPU does not support the {} kernels", family.name(), family.name()))
    }
}

/// The process's choice, read from `PBRL_GEMM` once.
pub fn kernel_choice() -> Result<KernelChoice, String> {
    static CHOICE: OnceLock<Result<KernelChoice, String>> = OnceLock::new();
    CHOICE.get_or_init(|| parse_choice(std::env::var("PBRL_GEMM").ok().as_deref())).clone()
}

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
    (m, n, k): (usize, usize, usize),
    dst: &mut [f32],
    accumulate: Accumulate,
    scale: f32,
    lhs: Operand,
    rhs: Operand,
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
    let (read_dst, dst_factor) = match accumulate {
        Accumulate::No => (false, 0.0),
        Accumulate::Yes => (true, 1.0),
    };
    let threads = candle_core::utils::get_num_threads();
    let parallelism = if threads > 1 { Parallelism::Rayon(threads) } else { Parallelism::None };
    // As `gemm::gemm` does for a row-major destination: compute the transposed product
    // (n, m) = rhsᵀ · lhsᵀ on column-major terms, which its microkernels prefer.
    let (mm, nn) = (n, m);
    let (dst_cs, dst_rs) = (n as isize, 1isize);
    let (a, a_cs, a_rs) = (rhs.data.as_ptr(), rhs.row_stride as isize, rhs.col_stride as isize);
    let (b, b_cs, b_rs) = (lhs.data.as_ptr(), lhs.row_stride as isize, lhs.col_stride as isize);
    let d = dst.as_mut_ptr();
    macro_rules! run {
        ($simd:expr, $module:path, $n:expr) => {{
            use $module as ukr;
            // SAFETY: the operands hold every element their strides reach (checked above),
            // dst is an m × n buffer (checked above), and `$simd` was checked available on this CPU.
            unsafe {
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
                    mm,
                    nn,
                    k,
                    d,
                    dst_cs,
                    dst_rs,
                    read_dst,
                    a,
                    a_cs,
                    a_rs,
                    b,
                    b_cs,
                    b_rs,
                    dst_factor,
                    scale,
                    false,
                    false,
                    false,
                    |x, y, z| x * y + z,
                    &ukr::UKR,
                    &ukr::H_UKR,
                    false,
                    parallelism,
                )
            }
        }};
    }
    use gemm_common::simd::MixedSimd;
    match family {
        #[cfg(target_arch = "x86_64")]
        KernelFamily::Avx512 => {
            let simd = <gemm_common::simd::V4 as MixedSimd<f32, f32, f32, f32>>::try_new().ok_or("gemm: no AVX-512")?;
            run!(simd, gemm_f32::microkernel::avx512f::f32, 16)
        }
        #[cfg(target_arch = "x86_64")]
        KernelFamily::Avx2 => {
            let simd = <gemm_common::simd::V3 as MixedSimd<f32, f32, f32, f32>>::try_new().ok_or("gemm: no AVX2")?;
            run!(simd, gemm_f32::microkernel::fma::f32, 8)
        }
        #[cfg(not(target_arch = "x86_64"))]
        KernelFamily::Avx512 | KernelFamily::Avx2 => unreachable!("checked available above"),
        KernelFamily::Scalar => {
            let simd = <gemm_common::simd::Scalar as MixedSimd<f32, f32, f32, f32>>::try_new().ok_or("gemm: scalar")?;
            run!(simd, gemm_f32::microkernel::scalar::f32, 1)
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(m: usize, n: usize, k: usize, a: &[f32], b: &[f32]) -> Vec<f32> {
        let mut c = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|p| a[i * k + p] as f64 * b[p * n + j] as f64).sum::<f64>() as f32;
            }
        }
        c
    }

    fn data(len: usize, seed: u32) -> Vec<f32> {
        (0..len)
            .map(|i| (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) % 1000) as f32 / 500.0 - 1.0)
            .collect()
    }

    #[test]
    fn every_available_family_computes_the_product_in_any_layout() {
        for family in [KernelFamily::Avx512, KernelFamily::Avx2, KernelFamily::Scalar] {
            if !family.available() {
                continue;
            }
            for (m, n, k) in
                [(1, 1, 1), (4, 3, 0), (3, 5, 7), (8, 576, 64), (40, 33, 17), (64, 96, 128), (130, 140, 33)]
            {
                let (a, b) = (data(m * k, 1), data(k * n, 2));
                let want = naive(m, n, k, &a, &b);
                let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect(); // (n, k)
                let at: Vec<f32> = (0..k * m).map(|i| a[(i % m) * k + i / m]).collect(); // (k, m)
                for (lhs, rhs) in [
                    (Operand::row_major(&a, k), Operand::row_major(&b, n)),
                    (Operand::row_major(&a, k), Operand::transposed(&bt, k)),
                    (Operand::transposed(&at, m), Operand::row_major(&b, n)),
                ] {
                    let got = matmul(family, m, n, k, lhs, rhs).unwrap();
                    for (g, w) in got.iter().zip(&want) {
                        assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "{family:?} {m}x{n}x{k}: {g} vs {w}");
                    }
                }
            }
        }
    }

    #[test]
    fn operands_too_small_for_their_shape_are_an_error() {
        let a = vec![0f32; 5];
        let err = matmul(KernelFamily::Scalar, 2, 2, 3, Operand::row_major(&a, 3), Operand::row_major(&a, 2));
        assert!(err.unwrap_err().contains("lhs"));
    }

    #[test]
    fn the_choice_follows_the_output_shape_and_the_variable() {
        let auto = KernelChoice::Auto { wide: Some(KernelFamily::Avx512), narrow: KernelFamily::Avx2 };
        assert_eq!(auto.family(8, 49152), KernelFamily::Avx2);
        assert_eq!(auto.family(512, 576), KernelFamily::Avx512);
        assert_eq!(KernelChoice::Forced(KernelFamily::Scalar).family(512, 576), KernelFamily::Scalar);
        assert_eq!(parse_choice(Some("scalar")), Ok(KernelChoice::Forced(KernelFamily::Scalar)));
        assert!(parse_choice(Some("avx9")).unwrap_err().contains("expected auto, avx512, avx2 or scalar"));
        assert!(matches!(parse_choice(None), Ok(KernelChoice::Auto { .. })));
    }
}
