//! The train items a run learns from, and the share it holds out for the periodic evaluation
//! (`eval_split = x`). The held-out items are chosen by the seed alone, so every stage (collect,
//! train, iterate) sees the same split and training never touches what keep-best selects on.
use anyhow::{bail, Context, Result};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::{load_items, TaskItem};
use crate::config::{Config, EvalSplit};
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

fn all_train_items(cfg: &Config) -> Result<Vec<TaskItem>> {
    let train_file = cfg.task.train_file.as_ref().context("task.train_file is not set: this stage needs task items")?;
    load_items(train_file)
}

/// The items collection and training use, each with its index in the train file (random
/// streams are derived from it, so holding items out does not change the others' samples).
pub fn train_items(cfg: &Config) -> Result<Vec<(usize, TaskItem)>> {
    let items = all_train_items(cfg)?;
    let held = match cfg.eval_split {
        EvalSplit::EvalFile => vec![false; items.len()],
        EvalSplit::TrainShare(x) => held_out(items.len(), x, cfg.seed)?,
    };
    Ok(items.into_iter().enumerate().filter(|(i, _)| !held[*i]).collect())
}

/// The held-out train items (empty with `eval_split = "eval_file"`), in file order.
pub fn held_out_items(cfg: &Config) -> Result<Vec<TaskItem>> {
    let EvalSplit::TrainShare(x) = cfg.eval_split else { return Ok(Vec::new()) };
    let items = all_train_items(cfg)?;
    let held = held_out(items.len(), x, cfg.seed)?;
    Ok(items.into_iter().enumerate().filter(|(i, _)| held[*i]).map(|(_, it)| it).collect())
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
}
