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

use crate::rng::derive_seed;

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

/// splitmix64's output step.
fn splitmix(z: u64) -> u64 {
    let z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The mask of key `key` over `rows × cols` inputs, row-major: each element 0 (dropped, with
/// probability `p`) or 1/(1 − p). Each 64-bit draw decides two elements (32 bits each).
pub fn mask(key: u64, rows: usize, cols: usize, p: f32) -> Vec<f32> {
    let threshold = (p as f64 * 4_294_967_296.0) as u64; // dropped when a 32-bit draw is below it
    let keep = 1.0 / (1.0 - p);
    let mut out = vec![0f32; rows * cols];
    for (row, values) in out.chunks_mut(cols.max(1)).enumerate() {
        let base = derive_seed(key, &[row as u64]);
        for (pair, two) in values.chunks_mut(2).enumerate() {
            let bits = splitmix(base.wrapping_add((pair as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)));
            for (v, draw) in two.iter_mut().zip([bits & 0xFFFF_FFFF, bits >> 32]) {
                *v = if draw < threshold { 0.0 } else { keep };
            }
        }
    }
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
