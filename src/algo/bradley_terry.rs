//! The joint reward model's objective (reference §7.2–7.3): a Bradley–Terry model over joint
//! responses. For pair p with scores s_w(p), s_l(p) of the winning and the losing joint
//! response, the loss is mean_p −log σ(s_w(p) − s_l(p)).
use anyhow::Result;
use candle_core::Tensor;

use super::madpo::neg_log_sigmoid;

/// The text the reward model reads for one joint response (the reference's
/// `_format_joint_text`): agents numbered from 1, parts joined by a blank line; an agent with
/// no prompt or completion gets an empty one.
pub fn joint_text(num_agents: usize, prompts: &[String], completions: &[String]) -> String {
    joint_text_with_responses(num_agents, prompts, completions).0
}

/// [`joint_text`] and, for each agent, the byte range its response takes in it.
pub fn joint_text_with_responses(
    num_agents: usize,
    prompts: &[String],
    completions: &[String],
) -> (String, Vec<std::ops::Range<usize>>) {
    let mut text = String::from("Joint multi-agent response");
    let mut responses = Vec::with_capacity(num_agents);
    for i in 0..num_agents {
        let prompt = prompts.get(i).map_or("", String::as_str);
        let completion = completions.get(i).map_or("", String::as_str);
        text.push_str(&format!("\n\nAgent {} prompt:\n{prompt}\n\nAgent {} response:\n", i + 1, i + 1));
        responses.push(text.len()..text.len() + completion.len());
        text.push_str(completion);
    }
    (text, responses)
}

/// −mean log σ(s_w − s_l) over the batch; `winner`, `loser`: (pairs,) scores.
pub fn bradley_terry_loss(winner: &Tensor, loser: &Tensor) -> Result<Tensor> {
    Ok(neg_log_sigmoid(&(winner - loser)?)?.mean_all()?)
}

/// How well scores order a set of pairs: the share with s_w > s_l, the mean margin s_w − s_l
/// and the mean loss.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PairStats {
    pub accuracy: f64,
    pub margin_mean: f64,
    pub loss: f64,
}

pub fn pair_stats(winner: &[f64], loser: &[f64]) -> PairStats {
    let n = winner.len().min(loser.len());
    if n == 0 {
        return PairStats { accuracy: 0.0, margin_mean: 0.0, loss: 0.0 };
    }
    let margins: Vec<f64> = winner.iter().zip(loser).map(|(w, l)| w - l).collect();
    // −log σ(z) = softplus(−z), stably.
    let nls = |z: f64| (-z).max(0.0) + (-z.abs()).exp().ln_1p();
    PairStats {
        accuracy: margins.iter().filter(|&&m| m > 0.0).count() as f64 / n as f64,
        margin_mean: margins.iter().sum::<f64>() / n as f64,
        loss: margins.iter().map(|&m| nls(m)).sum::<f64>() / n as f64,
    }
}

/// How well a reward model orders fresh samples of one prompt among themselves, the order
/// MAGRPO's group advantages read: over every prompt's pairs of samples whose oracle rewards
/// differ by more than `tie`, the count the model orders the oracle's way (a model tie counts
/// as wrong), and the count of such pairs. `groups[g] = (oracle, model)` scores of prompt g's
/// samples.
pub fn within_prompt_order(groups: &[(Vec<f64>, Vec<f64>)], tie: f64) -> (usize, usize) {
    let (mut right, mut total) = (0, 0);
    for (oracle, model) in groups {
        for i in 0..oracle.len() {
            for j in i + 1..oracle.len() {
                let gap = oracle[i] - oracle[j];
                if gap.abs() <= tie {
                    continue;
                }
                total += 1;
                right += usize::from(gap * (model[i] - model[j]) > 0.0);
            }
        }
    }
    (right, total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn joint_text_numbers_agents_from_one() {
        let t = joint_text(2, &["p1".into(), "p2".into()], &["c1".into(), "c2".into()]);
        assert_eq!(
            t,
            "Joint multi-agent response\n\nAgent 1 prompt:\np1\n\nAgent 1 response:\nc1\n\nAgent 2 prompt:\np2\n\n\
             Agent 2 response:\nc2"
        );
        // A centralized pair has one prompt: the other agents' parts are empty, as in the reference.
        assert!(joint_text(2, &["p".into()], &["c".into()]).ends_with("Agent 2 prompt:\n\n\nAgent 2 response:\n"));
        let (t, spans) = joint_text_with_responses(2, &["p1".into(), "p2".into()], &["c1".into(), "".into()]);
        assert_eq!((&t[spans[0].clone()], spans[1].clone()), ("c1", t.len()..t.len()), "each response's bytes");
    }

    #[test]
    fn the_loss_is_ln2_at_equal_scores_and_matches_the_stats() {
        let dev = Device::Cpu;
        let w = Tensor::new(&[1.0f64, -2.0, 0.5], &dev).unwrap();
        let l = Tensor::new(&[1.0f64, -2.0, 0.5], &dev).unwrap();
        let loss = bradley_terry_loss(&w, &l).unwrap().to_scalar::<f64>().unwrap();
        assert!((loss - std::f64::consts::LN_2).abs() < 1e-12);
        let (wv, lv) = ([3.0, -1.0, 40.0], [1.0, 0.0, -40.0]);
        let by_hand = [2.0f64, -1.0, 80.0].iter().map(|m: &f64| -(1.0 / (1.0 + (-m).exp())).ln()).sum::<f64>() / 3.0;
        let loss = bradley_terry_loss(&Tensor::new(&wv, &dev).unwrap(), &Tensor::new(&lv, &dev).unwrap())
            .unwrap()
            .to_scalar::<f64>()
            .unwrap();
        assert!((loss - by_hand).abs() < 1e-12, "{loss} vs {by_hand}");
        let s = pair_stats(&wv, &lv);
        assert!((s.loss - by_hand).abs() < 1e-12);
        assert!((s.accuracy - 2.0 / 3.0).abs() < 1e-12);
        assert!((s.margin_mean - 81.0 / 3.0).abs() < 1e-12);
    }

    #[test]
    fn within_prompt_order_counts_pairs_with_an_oracle_gap() {
        // Prompt 0: oracle 0.1 < 0.5 < 0.9; the model swaps the last two (2 of 3 right).
        // Prompt 1: an oracle tie (skipped), a model tie and a wrong order (0 of 2).
        let groups = vec![(vec![0.1, 0.5, 0.9], vec![-1.0, 2.0, 1.0]), (vec![0.3, 0.3, 0.8], vec![0.0, 5.0, 0.0])];
        assert_eq!(within_prompt_order(&groups, 1e-9), (2, 3 + 2));
        assert_eq!(within_prompt_order(&groups, 0.45), (1, 3), "only gaps over 0.45");
    }
}
