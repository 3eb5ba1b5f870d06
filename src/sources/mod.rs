//! Response sources: who writes the joint responses a round compares. The team samples its own
//! candidates; `iterate`'s comparator (reference §8.2) is another source built from the config
//! (`comparator::build`): the team itself, a copy of it, other models, a past team, an HTTP
//! endpoint (`api`), any of them writing every role in one tagged reply (`Centralized`).
//!
//! A source answers each item `n` times: `texts[j][k][a]` is role `a`'s text in joint response
//! `k` of item `j`, and request (item `j`, actor `a`, response `k`) draws from the seeded stream
//! `seed(j, a, k)`, so the same seeds give the same responses whichever stage asks.
pub mod api;
pub mod comparator;
pub mod http;

use anyhow::Result;

use crate::task::{render_template, TaskItem};
use crate::team::collab::{centralized_comparator_prompt, has_any_section, parse_joint_response};
use crate::team::rollout::{rollout, rollout_prompts, Rollout};
use crate::team::Agent;
use pbrl_model::SamplingParams;

/// A source's joint responses to a batch of items.
pub struct JointResponses {
    /// `texts[j][k][a]`: role `a`'s text in joint response `k` of item `j`.
    pub texts: Vec<Vec<Vec<String>>>,
    /// The rollout, when the source sampled a team's own actors: the exact prompts, token ids,
    /// whether each completion finished.
    pub rollout: Option<Rollout>,
    /// Tagged replies without any role section (scored as empty roles; the reference aborts).
    pub unparsed: usize,
    /// Replies longer than the actor's `max_new_tokens`, cut there.
    pub truncated: usize,
}

pub trait ResponseSource {
    /// `n` joint responses to each item; `on_tokens` hears of every decoding step's tokens.
    fn sample(
        &self,
        items: &[TaskItem],
        n: usize,
        seed: &dyn Fn(usize, usize, usize) -> u64,
        on_tokens: &mut dyn FnMut(usize),
    ) -> Result<JointResponses>;
}

/// A team's agents, the caller's or loaded for the source.
pub enum Agents<'a> {
    Borrowed(&'a [Agent]),
    Owned(Vec<Agent>),
}

impl Agents<'_> {
    pub fn get(&self) -> &[Agent] {
        match self {
            Agents::Borrowed(t) => t,
            Agents::Owned(t) => t,
        }
    }
}

/// A team sampling its actors: actor `a` answers with its own prompt and `params[a]`.
pub struct TeamSource<'a> {
    pub agents: Agents<'a>,
    pub params: Vec<SamplingParams>,
}

impl<'a> TeamSource<'a> {
    pub fn new(agents: Agents<'a>, params: Vec<SamplingParams>) -> Self {
        Self { agents, params }
    }
}

impl ResponseSource for TeamSource<'_> {
    fn sample(
        &self,
        items: &[TaskItem],
        n: usize,
        seed: &dyn Fn(usize, usize, usize) -> u64,
        on_tokens: &mut dyn FnMut(usize),
    ) -> Result<JointResponses> {
        let out = rollout(self.agents.get(), items, n, &self.params, seed, on_tokens)?;
        let texts = (0..out.responses.len()).map(|j| (0..n).map(|k| out.texts(j, k)).collect()).collect();
        Ok(JointResponses { texts, rollout: Some(out), unparsed: 0, truncated: 0 })
    }
}

/// Who writes a centralized reply.
pub enum Writer<'a> {
    /// Actor `index` of a team, with its chat template and `params[index]`.
    Agent(TeamSource<'a>),
    Api(Box<api::ApiSource<'a>>),
}

/// One writer answers every role at once: it is given every role's rendered template in the
/// reference's tagged prompt, and its reply is parsed into the roles' outputs.
pub struct Centralized<'a> {
    pub writer: Writer<'a>,
    /// The actor whose place the writer takes (its seeds, sampling settings and tokenizer).
    pub index: usize,
    /// Each role's `formatters` template.
    pub templates: Vec<String>,
}

impl ResponseSource for Centralized<'_> {
    fn sample(
        &self,
        items: &[TaskItem],
        n: usize,
        seed: &dyn Fn(usize, usize, usize) -> u64,
        on_tokens: &mut dyn FnMut(usize),
    ) -> Result<JointResponses> {
        let prompts = items
            .iter()
            .map(|it| Ok(centralized_comparator_prompt(&render_roles(&self.templates, it)?)))
            .collect::<Result<Vec<_>>>()?;
        let mut truncated = 0;
        let replies: Vec<Vec<String>> = match &self.writer {
            Writer::Agent(team) => {
                let one = &team.agents.get()[self.index..self.index + 1];
                let texts = vec![prompts.iter().map(|p| one[0].format_user_prompt(p)).collect::<Result<Vec<_>>>()?];
                let out = rollout_prompts(one, &texts, n, &team.params, seed, on_tokens)?;
                out.responses.iter().map(|r| r.iter().map(|joint| joint[0].text.clone()).collect()).collect()
            }
            Writer::Api(api) => prompts
                .iter()
                .zip(items)
                .map(|(p, it)| api.complete(p, self.index, it, n, &mut truncated))
                .collect::<Result<Vec<_>>>()?,
        };
        let roles = self.templates.len();
        let unparsed = replies.iter().flatten().filter(|text| !has_any_section(text, roles)).count();
        let texts = replies
            .iter()
            .map(|per_item| per_item.iter().map(|text| parse_joint_response(text, roles)).collect())
            .collect();
        Ok(JointResponses { texts, rollout: None, unparsed, truncated })
    }
}

/// Each role's rendered template for an item: what an API or a centralized writer is given (no
/// system prompt, no chat template).
pub fn render_roles(templates: &[String], item: &TaskItem) -> Result<Vec<String>> {
    templates.iter().map(|t| render_template(t, item)).collect()
}
