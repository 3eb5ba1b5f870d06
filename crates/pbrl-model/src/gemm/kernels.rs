//! Which family of `gemm` kernels a product runs on: the CPU's and the product's shape, or
//! `PBRL_GEMM`.
use std::sync::OnceLock;

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
/// Intel Xeon with AVX-512, 2 threads, products cut over candle's pool: on SmolLM2-135M's
/// products the 512-bit kernels are 0.71-1.34x as fast at 8 rows, 0.82-1.31x at 16, 0.92-1.61x
/// at 32 and 1.29-1.66x at 64; `pbrl collect` at 64 rows per agent took 0.86x the time with the
/// threshold at 32 instead of 128.
pub const WIDE_MIN_ROWS: usize = 32;

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
