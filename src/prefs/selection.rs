//! Which candidate pairs of one item become preference pairs (reference §5.1).
use rand::seq::SliceRandom;
use rand::Rng;

/// `pair_selection`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PairSelection {
    /// Largest score gap first (a stable sort: equal gaps keep generation order).
    RewardGap,
    /// Every ordered pair with a gap, in index order; never truncated.
    All,
    /// A seeded shuffle.
    Random,
}

impl PairSelection {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "reward_gap" => Some(Self::RewardGap),
            "all" => Some(Self::All),
            "random" => Some(Self::Random),
            _ => None,
        }
    }
}

/// Ordered (winner, loser) candidate indices: every pair with a strictly positive score gap
/// (ties dropped), ordered by `mode`, truncated to `per_sample` (except for `All`).
pub fn select_pairs(
    scores: &[f64],
    mode: PairSelection,
    per_sample: Option<usize>,
    rng: &mut impl Rng,
) -> Vec<(usize, usize)> {
    let mut cand: Vec<(f64, usize, usize)> = Vec::new();
    for (i, &si) in scores.iter().enumerate() {
        for (j, &sj) in scores.iter().enumerate() {
            let gap = si - sj;
            if i != j && gap > 0.0 {
                cand.push((gap, i, j));
            }
        }
    }
    match mode {
        PairSelection::Random => cand.shuffle(rng),
        PairSelection::All => {} // generated in (i, j) order already
        PairSelection::RewardGap => cand.sort_by(|a, b| b.0.total_cmp(&a.0)), // stable
    }
    if mode != PairSelection::All {
        if let Some(k) = per_sample {
            cand.truncate(k);
        }
    }
    cand.into_iter().map(|(_, i, j)| (i, j)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn rng(seed: u64) -> rand_chacha::ChaCha8Rng {
        rand_chacha::ChaCha8Rng::seed_from_u64(seed)
    }

    #[test]
    fn ties_are_dropped_and_only_positive_gaps_kept() {
        let p = select_pairs(&[1.0, 1.0, 0.0], PairSelection::All, None, &mut rng(0));
        assert_eq!(p, vec![(0, 2), (1, 2)]);
        assert!(select_pairs(&[0.5, 0.5, 0.5], PairSelection::RewardGap, Some(4), &mut rng(0)).is_empty());
    }

    #[test]
    fn reward_gap_is_a_stable_descending_sort_then_truncated() {
        // gaps: (0,1)=0.5 (0,2)=1.0 (1,2)=0.5 (3,2)=1.0 (3,1)=0.5 (0,... )
        let scores = [1.0, 0.5, 0.0, 1.0];
        let p = select_pairs(&scores, PairSelection::RewardGap, None, &mut rng(0));
        assert_eq!(p, vec![(0, 2), (3, 2), (0, 1), (1, 2), (3, 1)]);
        let p = select_pairs(&scores, PairSelection::RewardGap, Some(3), &mut rng(0));
        assert_eq!(p, vec![(0, 2), (3, 2), (0, 1)]);
    }

    #[test]
    fn all_keeps_index_order_and_ignores_the_limit() {
        let p = select_pairs(&[0.0, 1.0, 2.0], PairSelection::All, Some(1), &mut rng(0));
        assert_eq!(p, vec![(1, 0), (2, 0), (2, 1)]);
    }

    #[test]
    fn random_is_a_seeded_shuffle_of_the_same_pairs() {
        let scores = [0.0, 1.0, 2.0, 3.0, 4.0];
        let a = select_pairs(&scores, PairSelection::Random, None, &mut rng(7));
        assert_eq!(a, select_pairs(&scores, PairSelection::Random, None, &mut rng(7)));
        let mut sorted = a.clone();
        sorted.sort();
        assert_eq!(sorted, select_pairs(&scores, PairSelection::All, None, &mut rng(0)));
        assert_ne!(a, sorted, "a 10-pair shuffle should move something");
        assert_eq!(select_pairs(&scores, PairSelection::Random, Some(2), &mut rng(7)), a[..2].to_vec());
    }
}
