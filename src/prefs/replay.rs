//! The replay buffer: which stored pairs a training phase sees (reference §9).
//!
//! - `current`: the newest round's pairs as they are;
//! - `nearest_k`: a sample from the last k non-empty rounds, equal weight per round;
//! - `all_history`: a sample from every non-empty round, equal weight per round;
//! - `lambda_decay`: a sample with round weights w_a = λ^a / Σ_j λ^j (a = 0 the newest).
//!
//! A sample of S pairs draws each pair's round i.i.d. from the round weights (a multinomial
//! split, not largest remainder), then takes that many pairs from each round without repetition
//! (cycling through shuffled full copies when a round has fewer pairs than it was given), and
//! shuffles the lot.
use std::path::Path;

use anyhow::{bail, Result};

use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{existing_rounds, round_path, PreferencePair, RoundFile};
use crate::rng::{derive_seed, purpose};

use crate::config::ReplayConfig;
pub use crate::config::ReplayMode;

/// Round weights for `lambda_decay`, oldest → newest (they sum to 1).
pub fn lambda_decay_weights(rounds: usize, lambda: f64) -> Vec<f64> {
    if rounds == 0 {
        return Vec::new();
    }
    if lambda == 1.0 {
        return vec![1.0 / rounds as f64; rounds];
    }
    // newest first: (1 − λ)·λ^a; λ = 0 leaves only the newest (0^0 = 1).
    let newest_first: Vec<f64> = (0..rounds).map(|a| (1.0 - lambda) * lambda.powi(a as i32)).collect();
    let z: f64 = newest_first.iter().sum();
    let mut w: Vec<f64> = if z <= 0.0 {
        let mut w = vec![0.0; rounds];
        w[0] = 1.0;
        w
    } else {
        newest_first.iter().map(|x| x / z).collect()
    };
    w.reverse();
    w
}

/// How many of `sample_size` pairs each round gives: i.i.d. categorical draws.
pub fn multinomial_counts(weights: &[f64], sample_size: usize, rng: &mut impl Rng) -> Vec<usize> {
    let mut counts = vec![0; weights.len()];
    let total: f64 = weights.iter().sum();
    if weights.is_empty() || total <= 0.0 {
        return counts;
    }
    for _ in 0..sample_size {
        let mut u = rng.random::<f64>() * total;
        let mut pick = weights.len() - 1;
        for (i, &w) in weights.iter().enumerate() {
            if u < w {
                pick = i;
                break;
            }
            u -= w;
        }
        counts[pick] += 1;
    }
    counts
}

/// `count` records from one round: without repetition while they last, then whole shuffled
/// copies, then a final partial sample.
pub fn take_from_round<T: Clone>(records: &[T], count: usize, rng: &mut impl Rng) -> Vec<T> {
    if records.is_empty() {
        return Vec::new();
    }
    if count <= records.len() {
        return records.choose_multiple(rng, count).cloned().collect();
    }
    let mut out = Vec::with_capacity(count);
    let mut remaining = count;
    while remaining > 0 {
        if remaining >= records.len() {
            let mut copy = records.to_vec();
            copy.shuffle(rng);
            out.extend(copy);
            remaining -= records.len();
        } else {
            out.extend(records.choose_multiple(rng, remaining).cloned());
            remaining = 0;
        }
    }
    out
}

/// Which rounds a sample comes from and how many pairs each gives.
///
/// `rounds` are the non-empty rounds (number, pair count), oldest first; the newest is the
/// current one. Returns `(round, count)` for every round that gives pairs; for `Current` the
/// whole newest round. `sample_size` defaults to the newest round's size.
pub fn plan(
    rounds: &[(u32, usize)],
    mode: ReplayMode,
    sample_size: Option<usize>,
    rng: &mut impl Rng,
) -> Vec<(u32, usize)> {
    let Some(&(newest, newest_len)) = rounds.last() else { return Vec::new() };
    let size = sample_size.unwrap_or(newest_len);
    let (eligible, weights): (&[(u32, usize)], Vec<f64>) = match mode {
        ReplayMode::Current => return vec![(newest, newest_len)],
        ReplayMode::NearestK(k) => {
            let from = rounds.len().saturating_sub(k);
            (&rounds[from..], vec![1.0; rounds.len() - from])
        }
        ReplayMode::AllHistory => (rounds, vec![1.0; rounds.len()]),
        ReplayMode::LambdaDecay(l) => (rounds, lambda_decay_weights(rounds.len(), l)),
    };
    let counts = multinomial_counts(&weights, size, rng);
    eligible.iter().zip(counts).filter(|(_, c)| *c > 0).map(|(&(r, _), c)| (r, c)).collect()
}

/// Draw the pairs of a plan (`load(round)` gives a round's records) and shuffle them together.
pub fn draw<T: Clone>(
    plan: &[(u32, usize)],
    mode: ReplayMode,
    mut load: impl FnMut(u32) -> anyhow::Result<Vec<T>>,
    rng: &mut impl Rng,
) -> anyhow::Result<Vec<T>> {
    if mode == ReplayMode::Current {
        return match plan.first() {
            Some(&(round, _)) => load(round),
            None => Ok(Vec::new()),
        };
    }
    let mut out = Vec::new();
    for &(round, count) in plan {
        out.extend(take_from_round(&load(round)?, count, rng));
    }
    out.shuffle(rng);
    Ok(out)
}

/// The pairs a training phase uses: the replay selection over the non-empty rounds.
/// `seed` is the run's; `size` is `preference_replay_sample_size`. Returns the pairs and the
/// round numbers they came from.
pub fn training_pairs(dir: &Path, replay: &ReplayConfig) -> Result<(Vec<PreferencePair>, Vec<u32>)> {
    let (seed, mode, size) = (replay.seed, replay.mode, replay.sample_size);
    let numbers = existing_rounds(dir)?;
    if numbers.is_empty() {
        bail!("no preference rounds in {}; run `pbrl collect` first", dir.display());
    }
    let mut rounds = Vec::new();
    for n in &numbers {
        let r = RoundFile::load(&round_path(dir, *n))?;
        if r.num_pairs > 0 {
            rounds.push((*n, r.num_pairs));
        }
    }
    let mut rng = ChaCha8Rng::seed_from_u64(derive_seed(seed, &[purpose::REPLAY, *numbers.last().unwrap() as u64]));
    // `current` is the newest round even when it is empty.
    let chosen = if mode == ReplayMode::Current {
        let newest = *numbers.last().unwrap();
        rounds.iter().find(|(n, _)| *n == newest).map(|&(n, c)| vec![(n, c)]).unwrap_or_default()
    } else {
        plan(&rounds, mode, size, &mut rng)
    };
    let used = chosen.iter().map(|(n, _)| *n).collect();
    let pairs = draw(&chosen, mode, |n| Ok(RoundFile::load(&round_path(dir, n))?.pairs), &mut rng)?;
    Ok((pairs, used))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn rng(seed: u64) -> rand_chacha::ChaCha8Rng {
        rand_chacha::ChaCha8Rng::seed_from_u64(seed)
    }

    #[test]
    fn lambda_weights_follow_the_formula() {
        let w = lambda_decay_weights(3, 0.5);
        // newest first 1, 0.5, 0.25 over 1.75; returned oldest first
        let want = [0.25 / 1.75, 0.5 / 1.75, 1.0 / 1.75];
        for (a, b) in w.iter().zip(want) {
            assert!((a - b).abs() < 1e-12);
        }
        assert_eq!(lambda_decay_weights(3, 1.0), vec![1.0 / 3.0; 3]);
        assert_eq!(lambda_decay_weights(3, 0.0), vec![0.0, 0.0, 1.0], "λ = 0 keeps only the newest");
        assert!(lambda_decay_weights(0, 0.5).is_empty());
    }

    #[test]
    fn multinomial_counts_sum_to_the_sample_and_follow_the_weights() {
        let c = multinomial_counts(&[1.0, 3.0], 4000, &mut rng(1));
        assert_eq!(c.iter().sum::<usize>(), 4000);
        assert!((c[1] as f64 / 4000.0 - 0.75).abs() < 0.03, "{c:?}");
        assert_eq!(multinomial_counts(&[0.0, 1.0], 10, &mut rng(2)), vec![0, 10]);
    }

    #[test]
    fn rounds_give_pairs_without_repetition_then_whole_copies() {
        let recs: Vec<u32> = (0..5).collect();
        let three = take_from_round(&recs, 3, &mut rng(3));
        let mut u = three.clone();
        u.sort();
        u.dedup();
        assert_eq!(u.len(), 3, "no repetition: {three:?}");
        let twelve = take_from_round(&recs, 12, &mut rng(4));
        assert_eq!(twelve.len(), 12);
        for r in &recs {
            let n = twelve.iter().filter(|x| *x == r).count();
            assert!((2..=3).contains(&n), "two full copies plus a partial draw: {twelve:?}");
        }
        let mut first_copy = twelve[..5].to_vec();
        first_copy.sort();
        assert_eq!(first_copy, recs);
    }

    #[test]
    fn plans_per_mode() {
        let rounds = [(1, 4), (2, 6), (4, 8)]; // round 3 was empty, so it is not tracked
        assert_eq!(plan(&rounds, ReplayMode::Current, Some(3), &mut rng(0)), vec![(4, 8)]);
        let p = plan(&rounds, ReplayMode::NearestK(2), None, &mut rng(5));
        assert!(p.iter().all(|(r, _)| *r == 2 || *r == 4), "{p:?}");
        assert_eq!(p.iter().map(|(_, c)| c).sum::<usize>(), 8, "default size: the newest round's");
        let p = plan(&rounds, ReplayMode::AllHistory, Some(30), &mut rng(6));
        assert_eq!(p.iter().map(|(_, c)| c).sum::<usize>(), 30);
        assert_eq!(p.len(), 3);
        let p = plan(&rounds, ReplayMode::LambdaDecay(0.0), Some(5), &mut rng(7));
        assert_eq!(p, vec![(4, 5)]);
        assert!(plan(&[], ReplayMode::AllHistory, Some(5), &mut rng(8)).is_empty());
    }

    #[test]
    fn sampling_is_seeded_and_draws_from_the_planned_rounds() {
        let load = |r: u32| -> anyhow::Result<Vec<(u32, usize)>> { Ok((0..3).map(|i| (r, i)).collect()) };
        let p = vec![(1, 2), (2, 4)];
        let a = draw(&p, ReplayMode::AllHistory, load, &mut rng(9)).unwrap();
        assert_eq!(a, draw(&p, ReplayMode::AllHistory, load, &mut rng(9)).unwrap());
        assert_eq!(a.len(), 6);
        assert_eq!(a.iter().filter(|(r, _)| *r == 1).count(), 2);
        assert_eq!(draw(&[(2, 3)], ReplayMode::Current, load, &mut rng(0)).unwrap(), load(2).unwrap());
    }
}
