//! What a team needs for a multi-turn discussion: each agent's prompt at the next turn of a
//! branch (the transition's text made the agent's message, then its chat template), and the
//! check, before any sampling, that the longest prompt a discussion can grow to fits.
use anyhow::{bail, Result};

use super::rollout::{rollout, rollout_prompts, Completion};
use super::Agent;
use crate::config::{TransitionSpec, TurnsConfig};
use crate::task::transition::{Branch, Transition, DEBATE_FIELDS};
use crate::task::TaskItem;
use pbrl_model::sampling::SamplingParams;

/// One turn of one discussion: each agent's message (its template's text, before the chat
/// template), the exact prompt it was given, and its completion.
#[derive(Debug, Clone)]
pub struct Turn {
    pub users: Vec<String>,
    pub prompts: Vec<String>,
    pub completions: Vec<Completion>,
}

impl Turn {
    pub fn texts(&self) -> Vec<String> {
        self.completions.iter().map(|c| c.text.clone()).collect()
    }
}

/// The seeds of a discussion's requests: turn 1's `(item, agent, sample)`, and a later turn's
/// `(item, agent, sample, turn)` (`item`: its place in the batch).
pub struct DiscussionSeeds<'s> {
    pub first: &'s dyn Fn(usize, usize, usize) -> u64,
    pub later: &'s dyn Fn(usize, usize, usize, usize) -> u64,
}

/// `k` discussions of every item of a batch (`indices`: the items' places in their file, for
/// errors), each a single branch of `turns.num_turns` turns, every agent answering once per
/// turn: `[item][sample]` → its turns. Each turn samples every branch of the batch in one call
/// per agent; turn 1 is a one-turn rollout with `seeds.first`.
#[allow(clippy::too_many_arguments)]
pub fn discuss(
    team: &[Agent],
    transition: &mut Transition,
    turns: &TurnsConfig,
    items: &[TaskItem],
    indices: &[usize],
    k: usize,
    params: &[SamplingParams],
    seeds: &DiscussionSeeds,
    mut on_tokens: impl FnMut(usize),
) -> Result<Vec<Vec<Vec<Turn>>>> {
    let max_new: Vec<usize> = params.iter().map(|p| p.max_new_tokens).collect();
    let out = rollout(team, items, k, params, seeds.first, &mut on_tokens)?;
    // Branch b is sample b % k of item b / k.
    let mut branches: Vec<(Branch, Vec<Turn>)> = Vec::with_capacity(items.len() * k);
    for (j, item) in items.iter().enumerate() {
        let users = team.iter().map(|a| a.first_message(item)).collect::<Result<Vec<_>>>()?;
        for s in 0..k {
            let turn = Turn {
                users: users.clone(),
                prompts: out.prompts[j].clone(),
                completions: out.responses[j][s].clone(),
            };
            branches.push((Branch::default().then(&users, &turn.texts()), vec![turn]));
        }
    }
    for turn in 2..=turns.num_turns {
        let mut users = Vec::with_capacity(branches.len());
        let mut texts = vec![Vec::with_capacity(branches.len()); team.len()];
        for (b, (branch, _)) in branches.iter().enumerate() {
            let (j, item) = (b / k, &items[b / k]);
            let (u, prompts) = next_turn(team, transition, turns.passthrough, item, indices[j], branch, &max_new)?;
            for (a, p) in prompts.into_iter().enumerate() {
                texts[a].push(p);
            }
            users.push(u);
        }
        let seed = |b: usize, a: usize, _: usize| (seeds.later)(b / k, a, b % k, turn);
        let out = rollout_prompts(team, &texts, 1, params, seed, &mut on_tokens)?;
        for (b, ((branch, history), users)) in branches.iter_mut().zip(users).enumerate() {
            let t = Turn { users, prompts: out.prompts[b].clone(), completions: out.responses[b][0].clone() };
            *branch = branch.then(&t.users, &t.texts());
            history.push(t);
        }
    }
    let mut per_item: Vec<Vec<Vec<Turn>>> = vec![Vec::with_capacity(k); items.len()];
    for (b, (_, history)) in branches.into_iter().enumerate() {
        per_item[b / k].push(history);
    }
    Ok(per_item)
}

/// Every agent's prompt for the turn after `branch` of `item` (`index`: its place in its
/// file): the user messages (what the branch records) and the texts the models are given. A
/// command transition's prompts are checked here to fit with `max_new_tokens` (a debate's were
/// bounded before any sampling: [`check_discussion_fits`]).
pub fn next_turn(
    team: &[Agent],
    transition: &mut Transition,
    passthrough: bool,
    item: &TaskItem,
    index: usize,
    branch: &Branch,
    max_new_tokens: &[usize],
) -> Result<(Vec<String>, Vec<String>)> {
    let written = transition.next_prompts(item, index, branch)?;
    let command = matches!(transition, Transition::Command(_));
    let mut users = Vec::with_capacity(team.len());
    let mut prompts = Vec::with_capacity(team.len());
    for (agent, text) in team.iter().zip(&written) {
        let user = agent.turn_message(item, text, passthrough)?;
        let prompt = agent.chat_prompt(&user)?;
        if command {
            let ids = agent.model.tokenizer.encode(&prompt)?.len();
            let at = format!("item {index}, turn {}", branch.turns() + 1);
            check_prompt_fits(agent, ids, max_new_tokens[agent.index], &at)?;
        }
        prompts.push(prompt);
        users.push(user);
    }
    Ok((users, prompts))
}

/// Answer tokens the fields of a debate template hold at the last of `turns` turns, for `n`
/// agents: `{own}` one answer, `{others}` n − 1, `{history}` every answer of the earlier turns;
/// each answer at most `max_new_tokens`, with a few tokens of its label.
fn debate_answer_tokens(template: &str, n: usize, turns: usize, max_new_tokens: usize) -> usize {
    let per_answer = max_new_tokens + ANSWER_LABEL_TOKENS;
    let count = |field: &str| template.matches(&format!("{{{field}}}")).count();
    let answers = count("own") + count("others") * (n - 1) + count("history") * n * (turns - 1);
    answers * per_answer
}

/// Tokens an answer's label and separators take (`Agent j: `, blank lines, `Turn t:`), at most.
const ANSWER_LABEL_TOKENS: usize = 8;

/// Refuse, before any sampling, a discussion whose longest prompt would not fit: for the debate,
/// each item's last-turn prompt with empty answers plus the answers its template holds at most
/// (`max_new_tokens` each), and its completion, within the context; and a sampling batch of
/// `rows` requests of that length within the memory's KV cache. A command transition's prompts
/// are known only as it writes them: each is checked when it is sampled.
pub fn check_discussion_fits(
    team: &[Agent],
    items: &[TaskItem],
    max_new_tokens: &[usize],
    rows: (usize, &str),
    split: &str,
    turns: &TurnsConfig,
) -> Result<()> {
    let TransitionSpec::Debate(templates) = &turns.transition else { return Ok(()) };
    let n = team.len();
    let mut transition = Transition::debate(templates.clone());
    for agent in team {
        let max_new = max_new_tokens[agent.index];
        let context = agent.model.model.config.context_length();
        let held = debate_answer_tokens(&templates[agent.index], n, turns.num_turns, max_new);
        let mut longest = 0;
        for (j, item) in items.iter().enumerate() {
            if let Some(field) = DEBATE_FIELDS.iter().find(|f| item.contains_key(**f)) {
                bail!(
                    "{split} item {j} has a field `{field}`, which the debate transition's template fills itself \
                     ({DEBATE_FIELDS:?}); rename the field"
                );
            }
            // The last turn's prompt with every earlier answer empty.
            let mut branch = Branch::default();
            for _ in 1..turns.num_turns {
                branch = branch.then(&vec![String::new(); n], &vec![String::new(); n]);
            }
            let (_, prompts) = next_turn(team, &mut transition, turns.passthrough, item, j, &branch, max_new_tokens)?;
            let tokens = agent.model.tokenizer.encode(&prompts[agent.index])?.len() + held;
            if tokens + max_new > context {
                bail!(
                    "{split} item {j}: at turn {} actor {}'s prompt can grow to {tokens} tokens (its transition \
                     template holds up to {held} tokens of answers, max_new_tokens = {max_new} each), and with its \
                     answer the sequence would need {} positions, beyond the context of `{}` ({context}); lower \
                     max_new_tokens or num_turns, or shorten transition.template",
                    turns.num_turns,
                    agent.index,
                    tokens + max_new,
                    agent.model.source
                );
            }
            longest = longest.max(tokens);
        }
        let config = &agent.model.model.config;
        let need = pbrl_model::sampling::sampling_bytes(config, rows.0, longest + max_new);
        crate::device::ensure_fits(&agent.device, need, |need, free| {
            format!(
                "{split}: sampling {} rows at once ({}) of prompts up to {longest} tokens at turn {} needs about \
                 {need} MiB for actor {}'s KV cache, more than the {free} MiB of memory available; lower them",
                rows.0, rows.1, turns.num_turns, agent.index,
            )
        })?;
    }
    Ok(())
}

/// Refuse a prompt the transition program wrote that does not fit with its answer (`at`: the
/// item and turn, for the message).
fn check_prompt_fits(agent: &Agent, prompt_ids: usize, max_new_tokens: usize, at: &str) -> Result<()> {
    let context = agent.model.model.config.context_length();
    if prompt_ids + max_new_tokens > context {
        bail!(
            "{at}: actor {}'s prompt from the transition is {prompt_ids} tokens, and with max_new_tokens = \
             {max_new_tokens} the sequence would need {} positions, beyond the context of `{}` ({context})",
            agent.index,
            prompt_ids + max_new_tokens,
            agent.model.source
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_debate_template_holds_the_answers_it_names() {
        assert_eq!(debate_answer_tokens("{own} {others}", 3, 2, 10), (1 + 2) * 18);
        assert_eq!(debate_answer_tokens("{history}", 2, 3, 10), 4 * 18);
        assert_eq!(debate_answer_tokens("{prompt}", 2, 3, 10), 0);
    }
}
