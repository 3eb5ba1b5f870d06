//! Which candidate pairs of one item become preference pairs (reference §5.1).
use rand::seq::SliceRandom;
use rand::Rng;

pub use crate::config::PairSelection;

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
        // (collect refuses comparator_reward: a round of one team has no comparator)
        PairSelection::RewardGap | PairSelection::ComparatorReward => cand.sort_by(|a, b| b.0.total_cmp(&a.0)), // stable
    }
    if mode != PairSelection::All {
        if let Some(k) = per_sample {
            cand.truncate(k);
        }
    }
    cand.into_iter().map(|(_, i, j)| (i, j)).collect()
}

/// Which side won a comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Winner {
    Current,
    Comparator,
}

/// An iterative round's comparisons of one item (reference §5.2): candidate `idx` of the current
/// team against candidate `idx` of the comparator (the same index only), either side winning on
/// a strictly positive gap of the processed scores; ordered by `mode` (`ComparatorReward`: by the
/// comparator's score, then the gap, both descending; `RewardGap`: by the gap; `All`: by index;
/// `Random`: a seeded shuffle) and cut to `per_sample` (except `All`). Returns (index, winner).
pub fn select_comparison_pairs(
    current: &[f64],
    comparator: &[f64],
    mode: PairSelection,
    per_sample: Option<usize>,
    rng: &mut impl Rng,
) -> Vec<(usize, Winner)> {
    let mut cand: Vec<(f64, f64, usize, Winner)> = Vec::new();
    for (idx, (&c, &m)) in current.iter().zip(comparator).enumerate() {
        let gap = c - m;
        if gap > 0.0 {
            cand.push((gap, m, idx, Winner::Current));
        } else if gap < 0.0 {
            cand.push((-gap, m, idx, Winner::Comparator));
        }
    }
    match mode {
        PairSelection::Random => cand.shuffle(rng),
        PairSelection::All => {}
        PairSelection::RewardGap => cand.sort_by(|a, b| b.0.total_cmp(&a.0)),
        PairSelection::ComparatorReward => cand.sort_by(|a, b| b.1.total_cmp(&a.1).then(b.0.total_cmp(&a.0))),
    }
    if mode != PairSelection::All {
        if let Some(k) = per_sample {
            cand.truncate(k);
        }
    }
    cand.into_iter().map(|(_, _, idx, w)| (idx, w)).collect()
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
    fn comparisons_are_by_index_either_side_winning() {
        use Winner::*;
        let cur = [0.5, 0.2, 0.9, 0.4];
        let cmp = [0.1, 0.6, 0.9, 0.3];
        // gaps: 0 → +0.4 (current), 1 → −0.4 (comparator), 2 tie, 3 → +0.1 (current)
        let all = select_comparison_pairs(&cur, &cmp, PairSelection::All, Some(1), &mut rng(0));
        assert_eq!(all, vec![(0, Current), (1, Comparator), (3, Current)]);
        // comparator_reward: the comparator's score first (0.6, 0.3, 0.1)
        let by_cmp = select_comparison_pairs(&cur, &cmp, PairSelection::ComparatorReward, Some(2), &mut rng(0));
        assert_eq!(by_cmp, vec![(1, Comparator), (3, Current)]);
        // reward_gap: a stable sort by the gap (0.4, 0.4, 0.1)
        let by_gap = select_comparison_pairs(&cur, &cmp, PairSelection::RewardGap, None, &mut rng(0));
        assert_eq!(by_gap, vec![(0, Current), (1, Comparator), (3, Current)]);
        // only common indices count
        assert_eq!(select_comparison_pairs(&[1.0, 1.0], &[0.0], PairSelection::All, None, &mut rng(0)).len(), 1);
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
