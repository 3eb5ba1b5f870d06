//! One rollout function for every stage that samples: each actor of the team answers every item
//! `n` times (collection candidates, evaluation samples; next, RL rollouts), each request with
//! its own seeded stream, all of an actor's requests in one batched call.
use anyhow::Result;

use super::Agent;
use crate::task::TaskItem;
use pbrl_model::sampling::{sample, SampleRequest, SamplingParams};
use pbrl_model::scoring::{token_log_probs, LastToken, ScoreRow};
use pbrl_model::Mode;

/// What an actor produced for one request.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// Generated token ids, the stop token included when one was produced.
    pub ids: Vec<u32>,
    /// The decoded text, special tokens removed.
    pub text: String,
    /// It ended with a stop token (not cut at `max_new_tokens`).
    pub finished: bool,
    /// log p(token | prefix) of each generated token under the actor that sampled it, when
    /// asked for ([`add_log_probs`]); the untempered distribution, as RL and KL terms need.
    pub log_probs: Option<Vec<f32>>,
}

/// The joint responses of a team to a batch of items.
#[derive(Debug, Clone)]
pub struct Rollout {
    /// `prompts[j][a]`: the exact text actor `a` was given for item `j`.
    pub prompts: Vec<Vec<String>>,
    /// `prompt_ids[j][a]`: that text as actor `a`'s token ids.
    pub prompt_ids: Vec<Vec<Vec<u32>>>,
    /// `responses[j][k][a]`: actor `a`'s completion in joint response `k` of item `j`.
    pub responses: Vec<Vec<Vec<Completion>>>,
}

impl Rollout {
    /// The actors' texts of joint response `k` of item `j`.
    pub fn texts(&self, j: usize, k: usize) -> Vec<String> {
        self.responses[j][k].iter().map(|c| c.text.clone()).collect()
    }
}

/// Every actor answers each item `n` times; request (item `j`, actor `a`, response `k`) is
/// sampled with the stream `seed(j, a, k)` and actor `a`'s settings `params[a]`. `on_tokens`
/// hears of every decoding step's tokens.
pub fn rollout(
    team: &[Agent],
    items: &[TaskItem],
    n: usize,
    params: &[SamplingParams],
    seed: impl Fn(usize, usize, usize) -> u64,
    on_tokens: impl FnMut(usize),
) -> Result<Rollout> {
    let texts = team
        .iter()
        .map(|agent| items.iter().map(|it| agent.prompt_for(it)).collect::<Result<Vec<_>>>())
        .collect::<Result<Vec<_>>>()?;
    rollout_prompts(team, &texts, n, params, seed, on_tokens)
}

/// [`rollout`] on given prompt texts: `texts[a][j]` is actor `a`'s prompt for item `j`.
pub fn rollout_prompts(
    team: &[Agent],
    texts: &[Vec<String>],
    n: usize,
    params: &[SamplingParams],
    seed: impl Fn(usize, usize, usize) -> u64,
    mut on_tokens: impl FnMut(usize),
) -> Result<Rollout> {
    let items = texts.first().map_or(0, Vec::len);
    let mut prompts: Vec<Vec<String>> = vec![Vec::with_capacity(team.len()); items];
    let mut prompt_ids: Vec<Vec<Vec<u32>>> = vec![Vec::with_capacity(team.len()); items];
    let mut responses: Vec<Vec<Vec<Completion>>> = vec![vec![Vec::with_capacity(team.len()); n]; items];
    for (agent, texts) in team.iter().zip(texts) {
        let tok = &agent.model.tokenizer;
        let texts = texts.clone();
        let mut requests = Vec::with_capacity(items * n);
        for (j, t) in texts.iter().enumerate() {
            let ids = tok.encode(t)?;
            for k in 0..n {
                requests.push(SampleRequest { prompt: ids.clone(), seed: seed(j, agent.index, k) });
            }
            prompt_ids[j].push(ids);
        }
        let out =
            sample(&agent.model.model, &requests, &params[agent.index], &tok.stop_ids, tok.pad_id, &mut on_tokens)?;
        for (r, ids) in out.into_iter().enumerate() {
            let finished = ids.last().is_some_and(|t| tok.stop_ids.contains(t));
            let text = tok.decode(&ids)?;
            responses[r / n][r % n].push(Completion { ids, text, finished, log_probs: None });
        }
        for (j, t) in texts.into_iter().enumerate() {
            prompts[j].push(t);
        }
    }
    Ok(Rollout { prompts, prompt_ids, responses })
}

/// Score every completion of a rollout under the actor that produced it (no gradients) and
/// keep its per-token log-probs.
pub fn add_log_probs(team: &[Agent], out: &mut Rollout) -> Result<()> {
    for (a, agent) in team.iter().enumerate() {
        let tok = &agent.model.tokenizer;
        let mut rows = Vec::new();
        for (j, responses) in out.responses.iter().enumerate() {
            for joint in responses {
                rows.push(ScoreRow { prompt: out.prompt_ids[j][a].clone(), completion: joint[a].ids.clone() });
            }
        }
        let scored = token_log_probs(&agent.model.model, &rows, LastToken::Include, tok.pad_id, Mode::Infer)?;
        let mut r = 0;
        for responses in out.responses.iter_mut() {
            for joint in responses.iter_mut() {
                joint[a].log_probs = Some(match &scored {
                    Some(t) => t.row(r)?,
                    None => Vec::new(),
                });
                r += 1;
            }
        }
    }
    Ok(())
}
