//! The transition between turns of a multi-turn discussion (CoMLRL's `external_transition`):
//! from an item and one branch of its discussion so far, each agent's prompt for the next turn.
//!
//! - `debate` (built in): agent i's next prompt renders its template over the item's fields and
//!   `{own}` (its own latest answer), `{others}` (the other agents' latest answers, by role),
//!   `{turn}` (the coming turn's number, from 1) and `{history}` (every answer so far, turn by
//!   turn);
//! - `command`: an external program speaking JSON lines (`process.rs`): one request per branch,
//!   `{"item", "turn", "prompts", "responses"}` (`prompts[a][t]`, `responses[a][t]`: agent a's
//!   prompt and answer at turn t of the branch, from turn 1), one answer `{"prompts": [...]}`
//!   with one prompt per agent.
//!
//! What the transition writes stands in the item's `prompt` field under the agent's own
//! template (`task.formatters`), as the reference's formatter reads the transition's prompt, or
//! is the prompt as written with `external_prompt_passthrough` (`team::Agent::prompt_for_turn`).
use anyhow::{Context, Result};
use serde::Deserialize;
use serde_json::{json, Value};

use super::process::JsonLinesProcess;
use super::{render_template, TaskItem};
use crate::config::TransitionSpec;

pub use crate::config::DEFAULT_DEBATE_TEMPLATE;

/// The fields a debate template may use besides the item's.
pub const DEBATE_FIELDS: [&str; 4] = ["own", "others", "turn", "history"];

/// One branch of a discussion: per agent, its prompts and answers turn by turn (the reference's
/// `prompt_history_per_agent`, `response_history_per_agent`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Branch {
    pub prompts: Vec<Vec<String>>,
    pub responses: Vec<Vec<String>>,
}

impl Branch {
    /// The turns the branch holds.
    pub fn turns(&self) -> usize {
        self.responses.first().map_or(0, Vec::len)
    }

    /// The branch with one more turn: each agent's prompt and answer.
    pub fn then(&self, prompts: &[String], responses: &[String]) -> Self {
        let grow = |hist: &[Vec<String>], add: &[String]| -> Vec<Vec<String>> {
            let mut h = if hist.is_empty() { vec![Vec::new(); add.len()] } else { hist.to_vec() };
            h.iter_mut().zip(add).for_each(|(h, x)| h.push(x.clone()));
            h
        };
        Self { prompts: grow(&self.prompts, prompts), responses: grow(&self.responses, responses) }
    }
}

pub enum Transition {
    /// One template per agent.
    Debate(Vec<String>),
    Command(Box<JsonLinesProcess>),
}

impl Transition {
    pub fn debate(templates: Vec<String>) -> Self {
        Transition::Debate(templates)
    }

    /// The transition `[transition]` configures (a command's program started).
    pub fn of(spec: &TransitionSpec) -> Result<Self> {
        match spec {
            TransitionSpec::Debate(templates) => Ok(Self::debate(templates.clone())),
            TransitionSpec::Command { command, env, timeout_s } => Self::command(command, env, *timeout_s),
        }
    }

    /// Start the transition program (`transition.command`, `transition.env`,
    /// `transition.timeout_s`).
    pub fn command(command: &[String], env: &[String], timeout_s: f64) -> Result<Self> {
        let process = JsonLinesProcess::spawn("transition", command, env, timeout_s, "transition.timeout_s")?;
        Ok(Transition::Command(Box::new(process)))
    }

    /// Each agent's prompt for the turn after `branch` (which holds at least one turn) of the
    /// discussion of `item` (`item_index`: its place in its file, for errors).
    pub fn next_prompts(&mut self, item: &TaskItem, item_index: usize, branch: &Branch) -> Result<Vec<String>> {
        let n = branch.responses.len();
        let turn = branch.turns() + 1;
        match self {
            Transition::Debate(templates) => (0..n)
                .map(|a| {
                    let fields = debate_fields(item, branch, a);
                    render_template(&templates[a], &fields)
                        .with_context(|| format!("item {item_index}, turn {turn}: agent {a}'s debate template"))
                })
                .collect(),
            Transition::Command(process) => {
                let request =
                    json!({"item": item, "turn": turn, "prompts": branch.prompts, "responses": branch.responses});
                let reply = process.request(&request).with_context(|| format!("item {item_index}, turn {turn}"))?;
                #[derive(Deserialize)]
                struct Reply {
                    prompts: Vec<String>,
                }
                let at = format!("item {item_index}, turn {turn}");
                let parsed: Reply = match serde_json::from_str(&reply) {
                    Ok(r) => r,
                    Err(e) => {
                        let head: String = reply.chars().take(200).collect();
                        return Err(
                            process.fail(format!("{at}: answered `{head}`, not {{\"prompts\": [strings]}} ({e})"))
                        );
                    }
                };
                if parsed.prompts.len() != n {
                    return Err(process.fail(format!("{at}: answered {} prompts for {n} agents", parsed.prompts.len())));
                }
                Ok(parsed.prompts)
            }
        }
    }
}

/// The item's fields with the debate's own for agent `a` after `branch`.
fn debate_fields(item: &TaskItem, branch: &Branch, a: usize) -> TaskItem {
    let latest = |j: usize| branch.responses[j].last().map_or("", String::as_str).trim().to_string();
    let others: Vec<String> =
        (0..branch.responses.len()).filter(|&j| j != a).map(|j| format!("Agent {j}: {}", latest(j))).collect();
    let history: Vec<String> = (0..branch.turns())
        .map(|t| {
            let answers: Vec<String> =
                branch.responses.iter().enumerate().map(|(j, r)| format!("Agent {j}: {}", r[t].trim())).collect();
            format!("Turn {}:\n{}", t + 1, answers.join("\n"))
        })
        .collect();
    let mut fields = item.clone();
    fields.insert("own".into(), Value::String(latest(a)));
    fields.insert("others".into(), Value::String(others.join("\n\n")));
    fields.insert("turn".into(), json!(branch.turns() + 1));
    fields.insert("history".into(), Value::String(history.join("\n\n")));
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item() -> TaskItem {
        json!({"prompt": "Name two fruits.", "topic": "fruit"}).as_object().unwrap().clone()
    }

    fn branch() -> Branch {
        Branch::default()
            .then(&["p0".into(), "p1".into()], &["apple ".into(), "pear".into()])
            .then(&["q0".into(), "q1".into()], &["apple, fig".into(), "pear, plum".into()])
    }

    #[test]
    fn a_branch_grows_turn_by_turn() {
        let b = branch();
        assert_eq!(b.turns(), 2);
        assert_eq!(b.prompts, vec![vec!["p0", "q0"], vec!["p1", "q1"]]);
        assert_eq!(b.responses[1], vec!["pear", "pear, plum"]);
    }

    #[test]
    fn the_debate_shows_each_agent_its_own_and_the_others_answers() {
        let mut t = Transition::debate(vec!["{topic} {turn}: {own} | {others}".into(), "{history}".into()]);
        let b = Branch::default().then(&["p0".into(), "p1".into()], &["apple ".into(), "pear".into()]);
        let p = t.next_prompts(&item(), 0, &b).unwrap();
        assert_eq!(p[0], "fruit 2: apple | Agent 1: pear");
        assert_eq!(p[1], "Turn 1:\nAgent 0: apple\nAgent 1: pear");
        let p = t.next_prompts(&item(), 0, &branch()).unwrap();
        assert_eq!(p[0], "fruit 3: apple, fig | Agent 1: pear, plum");
        assert_eq!(p[1], "Turn 1:\nAgent 0: apple\nAgent 1: pear\n\nTurn 2:\nAgent 0: apple, fig\nAgent 1: pear, plum");
        let mut default = Transition::debate(vec![DEFAULT_DEBATE_TEMPLATE.into(); 2]);
        let p = default.next_prompts(&item(), 0, &b).unwrap();
        assert!(p[1].starts_with("Name two fruits.\n\nYour answer so far:\npear\n") && p[1].contains("Agent 0: apple"));
    }

    #[test]
    fn a_debate_template_naming_a_missing_field_names_the_item_and_turn() {
        let mut t = Transition::debate(vec!["{nope}".into(); 2]);
        let b = Branch::default().then(&["p0".into(), "p1".into()], &["a".into(), "b".into()]);
        let e = format!("{:#}", t.next_prompts(&item(), 7, &b).unwrap_err());
        assert!(e.contains("item 7, turn 2: agent 0's debate template") && e.contains("{nope}"), "{e}");
    }
}
