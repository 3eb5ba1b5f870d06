//! `e^x` over a slice, for the kernels with exponentials (softmax, the MLP's gate, the token
//! log-prob over the vocabulary).
//!
//! libm's `expf` is a call per element that the compiler cannot vectorize: ~115M of them a
//! SmolLM2 training step (four sequences of 128 tokens), ~6% of a profile of the step. For
//! f32 this computes Cephes' `expf` instead, branch-free so that it vectorizes, compiled for
//! AVX-512 and for AVX2 + FMA and chosen at run time by the CPU:
//!
//! ```text
//!   n = round(x · log2 e),   r = x − n · ln 2    (ln 2 in two parts, so r is exact)
//!   e^x = 2ⁿ · (1 + r + r² · p(r)),   p a degree-5 polynomial on |r| ≤ ½ ln 2
//! ```
//!
//! within 2 ulp of the exact value over the normal range (1 ulp measured;
//! `tests::exp_is_within_two_ulp`);
//! below it 0 (where `expf` gives a subnormal), above it +∞, and NaN stays NaN. f64 keeps
//! the standard library's `exp`.
use num_traits::Float;

/// Floats whose exponential a kernel takes over a whole slice at once.
pub trait ExpSlice: Float {
    /// `x ← e^x` for every element.
    fn exp_in_place(xs: &mut [Self]);
}

impl ExpSlice for f64 {
    fn exp_in_place(xs: &mut [f64]) {
        xs.iter_mut().for_each(|x| *x = x.exp());
    }
}

impl ExpSlice for f32 {
    fn exp_in_place(xs: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("fma") {
                // SAFETY: the CPU has the features the function is compiled for.
                return unsafe { exp_avx512(xs) };
            }
            if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                // SAFETY: as above.
                return unsafe { exp_avx2(xs) };
            }
        }
        exp_f32s(xs)
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn exp_avx512(xs: &mut [f32]) {
    exp_f32s(xs)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp_avx2(xs: &mut [f32]) {
    exp_f32s(xs)
}

/// The largest and smallest arguments with a normal f32 result.
const MAX_ARG: f32 = 88.722_83;
const MIN_ARG: f32 = -87.336_54;

#[inline(always)]
fn exp_f32s(xs: &mut [f32]) {
    for x in xs.iter_mut() {
        *x = exp_f32(*x);
    }
}

/// Cephes' `expf`, without branches (selects only) so that a loop over it vectorizes.
#[inline(always)]
fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 = C1 + C2, C1 with few mantissa bits so that n · C1 is exact.
    const C1: f32 = 0.693_359_4;
    const C2: f32 = -2.121_944_4e-4;
    // Rounds x · log2 e to the nearest integer n by adding 1.5 · 2²³, which leaves n in the
    // low mantissa bits: no float-to-int conversion, which would not vectorize.
    const ROUNDER: f32 = 12_582_912.0;
    let clamped = x.clamp(MIN_ARG, MAX_ARG);
    let shifted = clamped.mul_add(LOG2E, ROUNDER);
    let n = shifted - ROUNDER;
    let r = clamped - n * C1 - n * C2;
    let p = 1.987_569_1e-4_f32;
    let p = p.mul_add(r, 1.398_2e-3);
    let p = p.mul_add(r, 8.333_452e-3);
    let p = p.mul_add(r, 4.166_579_6e-2);
    let p = p.mul_add(r, 1.666_666_5e-1);
    let p = p.mul_add(r, 0.5);
    let y = p.mul_add(r * r, r) + 1.0;
    // 2ⁿ in two factors: n reaches 128 at the top of the range, past f32's exponents.
    let n = shifted.to_bits() as i32 - ROUNDER.to_bits() as i32;
    let half = n >> 1;
    let pow2 = |k: i32| f32::from_bits(((k + 127) as u32) << 23);
    let e = y * pow2(half) * pow2(n - half);
    let e = if x < MIN_ARG { 0.0 } else { e };
    let e = if x > MAX_ARG { f32::INFINITY } else { e };
    if x.is_nan() {
        x
    } else {
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distance in units in the last place between two positive normal floats.
    fn ulps(a: f32, b: f32) -> u32 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
    }

    #[test]
    fn exp_is_within_two_ulp() {
        // Arguments 0.097% apart from the smallest to the largest with a normal result, in
        // slices of odd lengths so that the vector loops' tails run too.
        let mut args = Vec::new();
        let mut x = MIN_ARG;
        while x <= MAX_ARG {
            args.push(x);
            x += 0.000_97 * x.abs().max(1e-3);
        }
        args.extend([0.0, -0.0, 1.0, -1.0, 1e-8, -1e-8, MIN_ARG, MAX_ARG]);
        let mut got = args.clone();
        for chunk in got.chunks_mut(37) {
            f32::exp_in_place(chunk);
        }
        // The same function without the vector features (what other CPUs run).
        let portable: Vec<f32> = args.iter().map(|&x| exp_f32(x)).collect();
        let mut worst = 0;
        for ((&x, &e), &p) in args.iter().zip(&got).zip(&portable) {
            assert!(ulps(p, e) <= 1, "exp({x}): {e} vectorized, {p} portable");
            let want = (x as f64).exp() as f32;
            worst = worst.max(ulps(e, want));
            assert!(ulps(e, want) <= 2, "exp({x}) = {e}, want {want}");
        }
        assert!(args.len() > 10_000, "{} arguments", args.len());
        eprintln!("{} arguments, worst {worst} ulp", args.len());
    }

    #[test]
    fn exp_of_special_values() {
        let mut xs = [f32::NEG_INFINITY, -100.0, -88.0, 89.0, f32::INFINITY, f32::NAN, 0.0];
        f32::exp_in_place(&mut xs);
        assert_eq!(&xs[..5], &[0.0, 0.0, 0.0, f32::INFINITY, f32::INFINITY]);
        assert!(xs[5].is_nan());
        assert_eq!(xs[6], 1.0);
    }
}
