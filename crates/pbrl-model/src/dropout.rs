//! Dropout on a LoRA adapter's input (PEFT's `lora_dropout`): in a training pass, each input
//! element the adapter reads is kept and scaled by 1/(1 − p), or dropped (0), with probability
//! p; the frozen base's product reads the input as it is. Inference passes drop nothing.
//!
//! The masks come from a counter-based stream: the mask of one projection in one pass is a pure
//! function of the pass's key, the projection and the element's place. So a mask can be made
//! again instead of kept — the backward pass and activation checkpointing's recomputation
//! regenerate exactly the forward's — and it depends neither on threads nor on the order in
//! which rows are computed. A pass's key is a hash of the training step's key (which
//! `train::session` derives from the seed, the stage and the update, so a resumed run draws
//! the masks of an uninterrupted one) and the pass's number within the step.
use std::sync::atomic::{AtomicU64, Ordering};

use crate::seed::derive_seed;

/// The training passes of one model: the current step's key and how many passes it has run.
#[derive(Debug, Default)]
pub struct DropoutStream {
    step: AtomicU64,
    pass: AtomicU64,
}

impl DropoutStream {
    /// Start a training step: its passes are keyed by `key`, numbered from 0.
    pub fn begin_step(&self, key: u64) {
        self.step.store(key, Ordering::SeqCst);
        self.pass.store(0, Ordering::SeqCst);
    }

    /// The key of the next training pass of this step.
    pub fn next_pass(&self) -> u64 {
        let pass = self.pass.fetch_add(1, Ordering::SeqCst);
        derive_seed(self.step.load(Ordering::SeqCst), &[pass])
    }
}

/// One projection's adapter dropout: its probability and its place in the model, which keys its
/// masks apart from the other projections'.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdapterDropout {
    pub p: f32,
    pub projection: u64,
}

impl AdapterDropout {
    /// The key of this projection's mask in the pass keyed `pass`.
    pub fn key(&self, pass: u64) -> u64 {
        derive_seed(pass, &[self.projection])
    }
}

/// murmur3's 32-bit finalizer: a bijective, well-avalanched hash step.
#[inline(always)]
fn fmix32(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85EB_CA6B);
    h ^= h >> 13;
    h = h.wrapping_mul(0xC2B2_AE35);
    h ^ (h >> 16)
}

/// One row scaled by its mask: element j's draw is `fmix32(j · φ ⊕ seed)`, distinct for every j
/// of the row (both steps are bijections of u32), dropped when below `threshold`.
#[inline(always)]
fn scale_row(seed: u32, row: &mut [f32], threshold: u64, keep: f32) {
    for (j, v) in row.iter_mut().enumerate() {
        let draw = fmix32((j as u32).wrapping_mul(0x9E37_79B9) ^ seed);
        *v *= if (draw as u64) < threshold { 0.0 } else { keep };
    }
}

/// [`scale_row`] compiled for AVX2, where the CPU has it, so that its loop can be vectorized.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn scale_row_avx2(seed: u32, row: &mut [f32], threshold: u64, keep: f32) {
    scale_row(seed, row, threshold, keep)
}

/// Scale `values` (rows of `cols`, row-major) by the mask of key `key` in place: each element
/// is dropped (0, with probability `p`) or multiplied by 1/(1 − p). Row i's mask depends on the
/// key and i only. Rows are shared out over the pool's threads.
pub fn apply(key: u64, values: &mut [f32], cols: usize, p: f32) {
    const ROWS_PER_TASK: usize = 16;
    let threshold = (p as f64 * 4_294_967_296.0) as u64; // dropped when a 32-bit draw is below it
    let keep = 1.0 / (1.0 - p);
    let cols = cols.max(1);
    #[cfg(target_arch = "x86_64")]
    let avx2 = std::arch::is_x86_feature_detected!("avx2");
    super::pool::for_each_chunk_mut(values, cols * ROWS_PER_TASK, |task, rows| {
        for (i, row) in rows.chunks_mut(cols).enumerate() {
            let seed = derive_seed(key, &[(task * ROWS_PER_TASK + i) as u64]) as u32;
            #[cfg(target_arch = "x86_64")]
            if avx2 {
                // SAFETY: the CPU has AVX2 (checked above).
                unsafe { scale_row_avx2(seed, row, threshold, keep) };
                continue;
            }
            scale_row(seed, row, threshold, keep);
        }
    });
}

/// The mask of key `key` over `rows × cols` inputs, row-major: each element 0 or 1/(1 − p),
/// what [`apply`] multiplies by.
pub fn mask(key: u64, rows: usize, cols: usize, p: f32) -> Vec<f32> {
    let mut out = vec![1f32; rows * cols];
    apply(key, &mut out, cols, p);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mask_drops_about_p_and_scales_the_rest() {
        for p in [0.05f32, 0.1, 0.5] {
            let m = mask(7, 300, 577, p);
            let dropped = m.iter().filter(|&&v| v == 0.0).count() as f64 / m.len() as f64;
            // 173,100 draws: the share's s.e. is at most 0.0012.
            assert!((dropped - p as f64).abs() < 0.006, "p {p}: dropped {dropped}");
            assert!(m.iter().all(|&v| v == 0.0 || v == 1.0 / (1.0 - p)));
            // The mean scale is 1: the adapter's input keeps its expectation.
            let mean = m.iter().map(|&v| v as f64).sum::<f64>() / m.len() as f64;
            assert!((mean - 1.0).abs() < 0.01, "p {p}: mean {mean}");
        }
    }

    #[test]
    fn applying_a_mask_multiplies_by_it() {
        let x: Vec<f32> = (0..7 * 33).map(|i| i as f32 * 0.25 - 3.0).collect();
        let mut dropped = x.clone();
        apply(5, &mut dropped, 33, 0.4);
        let want: Vec<f32> = x.iter().zip(mask(5, 7, 33, 0.4)).map(|(x, m)| x * m).collect();
        assert_eq!(dropped, want);
    }

    #[test]
    fn a_mask_is_a_function_of_its_key_and_place() {
        assert_eq!(mask(3, 4, 9, 0.3), mask(3, 4, 9, 0.3));
        assert_ne!(mask(3, 4, 9, 0.3), mask(4, 4, 9, 0.3));
        // A row's mask does not depend on how many rows there are.
        assert_eq!(mask(3, 2, 9, 0.3), mask(3, 5, 9, 0.3)[..18]);
        let d = AdapterDropout { p: 0.1, projection: 2 };
        assert_ne!(d.key(1), AdapterDropout { projection: 3, ..d }.key(1));
        assert_ne!(d.key(1), d.key(2));
        assert!(mask(1, 3, 5, 0.0).iter().all(|&v| v == 1.0), "p 0 keeps everything");
    }

    #[test]
    fn a_steps_passes_are_numbered_from_its_key() {
        let s = DropoutStream::default();
        s.begin_step(9);
        let (a, b) = (s.next_pass(), s.next_pass());
        assert_ne!(a, b);
        s.begin_step(9);
        assert_eq!((s.next_pass(), s.next_pass()), (a, b), "the same step draws the same passes");
        s.begin_step(10);
        assert_ne!(s.next_pass(), a);
    }
}
