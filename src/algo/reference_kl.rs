//! The reference KL of a sampled response (reference §7.4, `utils/reference_kl.py`): Schulman's
//! k3 estimator per token, with r = log π_ref(t) − log π(t): e^r − r − 1 (≥ 0, 0 where the two
//! policies agree), summed over the response's tokens. MAGRPO subtracts `reference_kl_coef` times
//! it from the returns before the baselines ([`super::advantages`]).

/// Σ_t (e^r_t − r_t − 1) over per-token log-probs of the policy and the reference.
pub fn k3_sequence_kl(policy: &[f32], reference: &[f32]) -> f64 {
    policy
        .iter()
        .zip(reference)
        .map(|(&p, &q)| {
            let r = q as f64 - p as f64;
            r.exp() - r - 1.0
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k3_is_zero_at_equality_and_positive_elsewhere() {
        assert_eq!(k3_sequence_kl(&[-1.0, -2.5], &[-1.0, -2.5]), 0.0);
        let kl = k3_sequence_kl(&[-1.0], &[-2.0]);
        assert!((kl - ((-1f64).exp() + 1.0 - 1.0)).abs() < 1e-12);
        assert!(k3_sequence_kl(&[-2.0], &[-1.0]) > 0.0);
    }
}
