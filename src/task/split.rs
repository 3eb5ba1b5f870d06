//! The train items a run learns from, and the share it holds out for the periodic evaluation
//! (`eval_split = x`). The held-out items are chosen by the seed alone, so every stage (collect,
//! train, iterate) sees the same split and training never touches what keep-best selects on.
use anyhow::{bail, Context, Result};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::{load_items, TaskItem};
use crate::config::{EvalSplit, SplitConfig};
use crate::rng::{derive_seed, purpose};

/// Which of `n` items are held out: round(n·share), at least 1 and leaving at least 1.
pub fn held_out(n: usize, share: f64, seed: u64) -> Result<Vec<bool>> {
    if n < 2 {
        bail!("eval_split = {share} needs at least 2 train items to hold some out, the train file has {n}");
    }
    Ok(choose_held_out(n, share, derive_seed(seed, &[purpose::SPLIT])))
}

/// round(n·share) of `n ≥ 2` things, at least 1 and leaving at least 1, chosen by the random
/// stream `stream_seed`.
pub fn choose_held_out(n: usize, share: f64, stream_seed: u64) -> Vec<bool> {
    assert!(n >= 2, "choose_held_out needs at least 2 things to split");
    let k = ((n as f64 * share).round() as usize).clamp(1, n - 1);
    let mut order: Vec<usize> = (0..n).collect();
    order.shuffle(&mut ChaCha8Rng::seed_from_u64(stream_seed));
    let mut held = vec![false; n];
    for &i in &order[..k] {
        held[i] = true;
    }
    held
}

/// The same split over groups: `keys[i]` names the group of thing `i` (things with equal keys
/// go together), round(groups·share) of the `≥ 2` groups (in order of first appearance) are
/// chosen as [`choose_held_out`] chooses, and every thing of a chosen group is held out.
/// `fit-rm` holds out whole items this way, so no held-out pair shares its prompt with a fitted one.
pub fn choose_held_out_groups<K: Eq + std::hash::Hash>(keys: &[K], share: f64, stream_seed: u64) -> Vec<bool> {
    let mut group_of = std::collections::HashMap::new();
    let groups: Vec<usize> = keys
        .iter()
        .map(|k| {
            let next = group_of.len();
            *group_of.entry(k).or_insert(next)
        })
        .collect();
    let held = choose_held_out(group_of.len(), share, stream_seed);
    groups.into_iter().map(|g| held[g]).collect()
}

fn all_train_items(cfg: &SplitConfig) -> Result<Vec<TaskItem>> {
    let train_file = cfg.train_file.as_ref().context("task.train_file is not set: this stage needs task items")?;
    let items = load_items(train_file)?;
    super::check_prompts(&cfg.role_templates, items.iter().enumerate(), "train")?;
    Ok(items)
}

/// The items collection and training use, each with its index in the train file (random
/// streams are derived from it, so holding items out does not change the others' samples).
pub fn train_items(cfg: &SplitConfig) -> Result<Vec<(usize, TaskItem)>> {
    let items = all_train_items(cfg)?;
    let held = match cfg.eval_split {
        EvalSplit::EvalFile | EvalSplit::ValidationFile => vec![false; items.len()],
        EvalSplit::TrainShare(x) => held_out(items.len(), x, cfg.seed)?,
    };
    Ok(items.into_iter().enumerate().filter(|(i, _)| !held[*i]).collect())
}

/// The held-out train items (empty unless `eval_split` is a share), in file order.
pub fn held_out_items(cfg: &SplitConfig) -> Result<Vec<TaskItem>> {
    let EvalSplit::TrainShare(x) = cfg.eval_split else { return Ok(Vec::new()) };
    let items = all_train_items(cfg)?;
    let held = held_out(items.len(), x, cfg.seed)?;
    Ok(items.into_iter().enumerate().filter(|(i, _)| held[*i]).map(|(_, it)| it).collect())
}

/// `iterate` with `items_per_round = k`: the positions (into `n` train items) that round
/// `round` (from 1) compares on, in ascending order: the k after the previous round's in one
/// shuffle of the items by the stream `stream_seed`, wrapping around. So the rounds take
/// disjoint items until every item has had a turn, as iterative DPO recipes split their prompts
/// over the rounds, and a run resumed with more rounds keeps the earlier rounds' items.
pub fn round_items(n: usize, k: usize, round: u32, stream_seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    order.shuffle(&mut ChaCha8Rng::seed_from_u64(stream_seed));
    let k = k.min(n); // (more than there are: every item, and no product that overflows)
    let start = (round.max(1) as usize - 1) * k;
    let mut chosen: Vec<usize> = (start..start + k).map(|p| order[p % n]).collect();
    chosen.sort_unstable();
    chosen
}

/// The train items (from [`train_items`]) round `round` of `iterate` compares on: all of them,
/// or `items_per_round` of them ([`round_items`], seeded by the run's seed).
pub fn items_of_round(cfg: &SplitConfig, items: &[(usize, TaskItem)], round: u32) -> Vec<(usize, TaskItem)> {
    match cfg.items_per_round {
        None => items.to_vec(),
        Some(k) => round_items(items.len(), k, round, derive_seed(cfg.seed, &[purpose::ROUND_ITEMS]))
            .into_iter()
            .map(|p| items[p].clone())
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_split_is_seeded_sized_and_disjoint() {
        let h = held_out(54, 0.2, 42).unwrap();
        assert_eq!(h.iter().filter(|&&x| x).count(), 11); // round(10.8)
        assert_eq!(h, held_out(54, 0.2, 42).unwrap(), "same seed, same split");
        assert_ne!(h, held_out(54, 0.2, 7).unwrap(), "another seed holds out other items");
        assert_eq!(held_out(3, 0.01, 1).unwrap().iter().filter(|&&x| x).count(), 1, "at least one");
        assert_eq!(held_out(3, 0.99, 1).unwrap().iter().filter(|&&x| x).count(), 2, "at least one left");
        assert!(held_out(1, 0.5, 1).is_err());
    }

    #[test]
    fn rounds_take_disjoint_items_until_each_had_a_turn() {
        let rounds: Vec<Vec<usize>> = (1..=4).map(|r| round_items(10, 3, r, 5)).collect();
        let first_three: Vec<usize> = rounds[..3].concat();
        let distinct: std::collections::HashSet<_> = first_three.iter().collect();
        assert_eq!((first_three.len(), distinct.len()), (9, 9), "rounds 1-3 disjoint: {rounds:?}");
        // round 4 takes the one item left, then wraps around to round 1's first items
        let left: Vec<usize> = (0..10).filter(|i| !distinct.contains(i)).collect();
        assert_eq!(rounds[3].len(), 3);
        assert!(rounds[3].contains(&left[0]), "{rounds:?}");
        assert_eq!(rounds[3].iter().filter(|i| rounds[0].contains(i)).count(), 2, "{rounds:?}");
        assert_eq!(round_items(10, 3, 2, 5), rounds[1], "seeded");
        assert_ne!((1..=3).map(|r| round_items(10, 3, r, 6)).collect::<Vec<_>>(), rounds[..3], "another stream");
        assert_eq!(round_items(4, 9, 1, 5), vec![0, 1, 2, 3], "more than there are: every item once");
        assert_eq!(round_items(4, usize::MAX, 100_000, 5), vec![0, 1, 2, 3]);
    }

    #[test]
    fn a_grouped_split_holds_out_whole_groups() {
        // 10 groups of uneven sizes, interleaved
        let keys: Vec<usize> = (0..37).map(|i| (i * 7) % 10).collect();
        let h = choose_held_out_groups(&keys, 0.2, 9);
        for g in 0..10 {
            let members: Vec<bool> = keys.iter().zip(&h).filter(|(k, _)| **k == g).map(|(_, &x)| x).collect();
            assert!(members.iter().all(|&x| x == members[0]), "group {g} split: {members:?}");
        }
        let held_groups: std::collections::HashSet<_> =
            keys.iter().zip(&h).filter(|(_, &x)| x).map(|(k, _)| k).collect();
        assert_eq!(held_groups.len(), 2, "round(10 x 0.2) groups");
        assert_eq!(h, choose_held_out_groups(&keys, 0.2, 9), "seeded");
        let one_each: Vec<usize> = (0..10).collect();
        assert_eq!(
            choose_held_out_groups(&one_each, 0.2, 9),
            choose_held_out(10, 0.2, 9),
            "groups of one: the plain split"
        );
    }
}
