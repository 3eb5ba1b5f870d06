//! MADPO's batch glue between preference pairs and the model: the rows each actor scores,
//! every actor's margins in one forward, and an actor's objective (the loss itself is
//! `madpo.rs`). Shared by `train-madpo` and the tests against CoMLRL.
use anyhow::{Context, Result};
use candle_core::{DType, Tensor};
use serde::{Deserialize, Serialize};

use crate::algo::madpo::agent_loss;
use crate::prefs::PreferencePair;
use pbrl_model::scoring::{scored_tokens, sequence_log_probs, LastToken, ScoreRow};
use pbrl_model::tokenizer::ChatTokenizer;
use pbrl_model::{LoadedModel, Mode};

/// Actor `a`'s (winner, loser) rows for a batch, re-tokenized from the stored text.
///
/// The reference scorer (`LastToken::Exclude`) sees the completion without its end-of-turn
/// token (generation pads with it and the scorer trims at the first pad) and leaves the last
/// content token out. With `LastToken::Include` every token the actor produced is scored: the
/// end-of-turn token is put back on completions that ended (the round's `winner_finished` /
/// `loser_finished`; in rounds without them, those shorter than `max_new_tokens`); one cut off
/// at the limit gets none, so an actor is never taught to stop where it did not.
pub fn agent_rows(
    tok: &ChatTokenizer,
    a: usize,
    batch: &[&PreferencePair],
    max_new_tokens: usize,
    last: LastToken,
) -> Result<Vec<ScoreRow>> {
    let eos = tok.stop_ids[0];
    let row = |(prompt, completion, finished): (&str, &str, Option<bool>)| -> Result<ScoreRow> {
        let mut c = tok.encode(completion)?;
        let ended = finished.unwrap_or(c.len() < max_new_tokens);
        if last == LastToken::Include && ended {
            c.push(eos);
        }
        Ok(ScoreRow { prompt: tok.encode(prompt)?, completion: c })
    };
    // One row per turn of each winner's history (one turn: its joint response), then the losers'.
    let side = |winner: bool| batch.iter().flat_map(move |p| p.turns_of(a, winner)).map(row);
    side(true).chain(side(false)).collect()
}

/// An actor's scores of multi-turn rows ([`agent_rows`]: `turns` consecutive rows per history)
/// as one score per history: its turns' log-probs and scored tokens summed, the log-probability
/// of the agent's whole part in the history given each turn's prompt on it.
pub fn fold_turns(scores: ActorScores, turns: usize) -> Result<ActorScores> {
    if turns == 1 {
        return Ok(scores);
    }
    let histories = scores.tokens.len() / turns;
    let sums = scores.sums.reshape((histories, turns))?.sum(1)?;
    let tokens = scores.tokens.chunks(turns).map(|c| c.iter().sum()).collect();
    Ok(ActorScores { sums, tokens })
}

/// Every actor's margins Δ_i(p) = log π_i(winner) − log π_i(loser), (pairs,), differentiable,
/// all at the weights before any update of the batch. Their values are the fixed margins D_i
/// that the reference computes in a separate pass without gradients (same weights, same
/// numbers), so one forward per actor serves both.
pub fn batch_margins(models: &[&LoadedModel], rows: &[Vec<ScoreRow>], last: LastToken) -> Result<Vec<Tensor>> {
    let scores = batch_scores(models, rows, last, Mode::Train)?;
    scores.iter().map(|s| margins(s, None, false)).collect()
}

/// The summed log-prob and the number of scored tokens of one completion.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SeqLogProb {
    pub sum: f64,
    pub tokens: usize,
}

impl SeqLogProb {
    /// The completion's score in a margin: the sum, or with `normalize` the per-token mean (0
    /// for a completion with nothing scored).
    pub fn value(&self, normalize: bool) -> f64 {
        if normalize {
            self.sum / self.tokens.max(1) as f64
        } else {
            self.sum
        }
    }
}

/// One actor's scores of a batch: `sums` (2·pairs,) winners then losers, differentiable in
/// `Mode::Train`; `tokens` the scored tokens of each row.
pub struct ActorScores {
    pub sums: Tensor,
    pub tokens: Vec<usize>,
}

impl ActorScores {
    /// The rows' scores as numbers.
    pub fn values(&self) -> Result<Vec<SeqLogProb>> {
        let sums = self.sums.to_dtype(DType::F64)?.to_vec1::<f64>()?;
        Ok(sums.into_iter().zip(&self.tokens).map(|(sum, &tokens)| SeqLogProb { sum, tokens }).collect())
    }
}

/// Every actor's summed log-probs of its (winner, loser) rows, one forward per actor.
pub fn batch_scores(
    models: &[&LoadedModel],
    rows: &[Vec<ScoreRow>],
    last: LastToken,
    mode: Mode,
) -> Result<Vec<ActorScores>> {
    models
        .iter()
        .zip(rows)
        .enumerate()
        .map(|(i, (m, r))| {
            let sums = sequence_log_probs(&m.model, r, last, m.tokenizer.pad_id, mode)
                .with_context(|| format!("agent {i}: scoring the batch's completions"))?;
            let tokens = r.iter().map(|r| scored_tokens(r, last)).collect();
            Ok(ActorScores { sums, tokens })
        })
        .collect()
}

/// An actor's margins (pairs,): Δ(p) = [v(w) − v_ref(w)] − [v(l) − v_ref(l)] with v the summed
/// (or, with `normalize`, per-token mean) log-prob, and v_ref the frozen reference policy's
/// (`reference`: winners then losers, as `scores`), or 0 without one (reference-free MADPO).
pub fn margins(scores: &ActorScores, reference: Option<&[SeqLogProb]>, normalize: bool) -> Result<Tensor> {
    let rows = scores.tokens.len();
    let pairs = rows / 2;
    let dev = scores.sums.device();
    let dtype = scores.sums.dtype();
    let mut v = scores.sums.clone();
    if normalize {
        let inv: Vec<f64> = scores.tokens.iter().map(|&n| 1.0 / n.max(1) as f64).collect();
        v = (v * Tensor::new(inv, dev)?.to_dtype(dtype)?)?;
    }
    if let Some(r) = reference {
        anyhow::ensure!(r.len() == rows, "reference log-probs for {} rows, the batch has {rows}", r.len());
        let r: Vec<f64> = r.iter().map(|x| x.value(normalize)).collect();
        v = (v - Tensor::new(r, dev)?.to_dtype(dtype)?)?;
    }
    Ok((v.narrow(0, 0, pairs)? - v.narrow(0, pairs, pairs)?)?)
}

/// The margins' values, `d[i][p]`, as fixed numbers (no gradient flows through them).
pub fn margin_values(margins: &[Tensor]) -> Result<Vec<Vec<f64>>> {
    margins.iter().map(|m| Ok(m.to_dtype(DType::F64)?.to_vec1::<f64>()?)).collect()
}

/// Actor i's MADPO loss: its own differentiable margins against the others' fixed Σ_{j≠i} D_j.
pub fn agent_objective(own: &Tensor, others: &[f64], beta: f64) -> Result<Tensor> {
    agent_loss(own, &Tensor::new(others, own.device())?, beta)
}

/// The scorer MADPO uses: the joint full-token scorer for a centralized actor (§6.3), else the
/// decentralized one, which leaves the last token out unless `score_last_token` (§6.2).
pub fn scorer(centralized: bool, score_last_token: bool) -> LastToken {
    if centralized || score_last_token {
        LastToken::Include
    } else {
        LastToken::Exclude
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pbrl_model::tiny::word_tokenizer;

    fn pair(finished: Option<Vec<bool>>) -> PreferencePair {
        PreferencePair {
            prompts: vec!["w1".into(), "w2".into()],
            winner_completions: vec!["w3 w4".into(), "w5".into()],
            loser_completions: vec!["w6".into(), "w7".into()],
            winner_reward: 1.0,
            loser_reward: 0.0,
            candidate_reward_mean: 0.5,
            raw_rewards: None,
            target_raw_reward: None,
            comparator_raw_reward: None,
            winner_finished: finished.clone(),
            loser_finished: finished,
            winner_turns: None,
            loser_turns: None,
        }
    }

    /// Anchored, length-normalized margins against a hand computation.
    #[test]
    fn margins_subtract_the_reference_and_normalize() {
        let dev = candle_core::Device::Cpu;
        // Two pairs: winners (-4, -9) over (2, 3) tokens, losers (-6, -3) over (3, 1).
        let scores =
            ActorScores { sums: Tensor::new(&[-4.0f64, -9.0, -6.0, -3.0], &dev).unwrap(), tokens: vec![2, 3, 3, 1] };
        let free: Vec<f64> = margins(&scores, None, false).unwrap().to_vec1().unwrap();
        assert_eq!(free, vec![2.0, -6.0]);
        let r = |sum, tokens| SeqLogProb { sum, tokens };
        let reference = [r(-5.0, 2), r(-9.0, 3), r(-5.0, 3), r(-2.0, 1)];
        let anchored: Vec<f64> = margins(&scores, Some(&reference), false).unwrap().to_vec1().unwrap();
        assert_eq!(anchored, vec![(-4.0 + 5.0) - (-6.0 + 5.0), 0.0 - (-3.0 + 2.0)]);
        let norm: Vec<f64> = margins(&scores, Some(&reference), true).unwrap().to_vec1().unwrap();
        let want = [(-2.0 + 2.5) - (-2.0 + 5.0 / 3.0), 0.0 - (-3.0 + 2.0)];
        for (g, w) in norm.iter().zip(want) {
            assert!((g - w).abs() < 1e-12, "{g} vs {w}");
        }
        // The policy as its own reference: every margin is 0.
        let own = scores.values().unwrap();
        let zero: Vec<f64> = margins(&scores, Some(&own), true).unwrap().to_vec1().unwrap();
        assert_eq!(zero, vec![0.0, 0.0]);
    }

    #[test]
    fn the_end_of_turn_token_follows_the_rounds_finished_flags() {
        let tok = word_tokenizer(20).unwrap();
        let eos = tok.stop_ids[0];
        // No flags (a CoMLRL round): shorter than max_new_tokens means it ended.
        let rows = agent_rows(&tok, 0, &[&pair(None)], 8, LastToken::Include).unwrap();
        assert_eq!(rows[0].completion.last(), Some(&eos));
        // Flags: actor 0's completions were cut, actor 1's ended.
        let p = pair(Some(vec![false, true]));
        let a0 = agent_rows(&tok, 0, &[&p], 8, LastToken::Include).unwrap();
        assert!(a0.iter().all(|r| r.completion.last() != Some(&eos)), "cut completions get no end-of-turn");
        let a1 = agent_rows(&tok, 1, &[&p], 8, LastToken::Include).unwrap();
        assert!(a1.iter().all(|r| r.completion.last() == Some(&eos)));
        // The reference scorer never sees it.
        let ex = agent_rows(&tok, 1, &[&p], 8, LastToken::Exclude).unwrap();
        assert!(ex.iter().all(|r| r.completion.last() != Some(&eos)));
    }

    /// A history's margin is the sum of its turns' margins: a 2-turn pair scores as its two
    /// turns scored as one-turn pairs, added.
    #[test]
    fn a_historys_margin_sums_its_turns() {
        use crate::prefs::TurnRecord;
        let m = pbrl_model::tiny::tiny_model(pbrl_model::Architecture::Llama, true, 5, DType::F32).unwrap();
        let record = |p: &str, c: &str| TurnRecord {
            prompts: vec![p.into(), p.into()],
            completions: vec![c.into(), c.into()],
            finished: vec![true, true],
            reward: 0.0,
        };
        let one = |p: &str, w: &str, l: &str| PreferencePair {
            prompts: vec![p.into(), p.into()],
            winner_completions: vec![w.into(), w.into()],
            loser_completions: vec![l.into(), l.into()],
            winner_finished: Some(vec![true, true]),
            loser_finished: Some(vec![true, true]),
            ..pair(None)
        };
        let (t1, t2) = (one("w1 w2", "w3 w4", "w5"), one("w6 w1", "w7", "w8 w9 w3"));
        let two = PreferencePair {
            winner_turns: Some(vec![record("w1 w2", "w3 w4"), record("w6 w1", "w7")]),
            loser_turns: Some(vec![record("w1 w2", "w5"), record("w6 w1", "w8 w9 w3")]),
            ..t2.clone()
        };
        let score = |pairs: &[&PreferencePair], turns: usize| -> Vec<f64> {
            let rows = agent_rows(&m.tokenizer, 0, pairs, 8, LastToken::Include).unwrap();
            let s = batch_scores(&[&m], &[rows], LastToken::Include, Mode::Infer).unwrap().remove(0);
            margins(&fold_turns(s, turns).unwrap(), None, false)
                .unwrap()
                .to_dtype(DType::F64)
                .unwrap()
                .to_vec1()
                .unwrap()
        };
        let history = score(&[&two], 2);
        let turns = score(&[&t1, &t2], 1);
        assert_eq!(history.len(), 1);
        assert!((history[0] - (turns[0] + turns[1])).abs() < 1e-4, "{history:?} vs {turns:?}");
        assert!(turns[0].abs() > 1e-3 && turns[1].abs() > 1e-3, "both turns count");
    }
}
