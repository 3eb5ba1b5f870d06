//! Collaboration modes (reference §12): decentralized, one actor per role, or centralized, one
//! actor writing every role's output in a single tagged joint response.
//!
//! Centralized protocol: the actor gets one prompt listing every role's own prompt and asking
//! for one `<agent_i>…</agent_i>` section per role (0-based). The joint text is what is stored
//! and learned from (scored token by token, the last one included, §6.3); the task reward and
//! evaluation see the roles' outputs parsed from it: the first section of each role, tags matched
//! case-insensitively and with inner whitespace, content trimmed, "" for a missing section.
use anyhow::Result;
use regex::Regex;

use crate::task::{render_template, TaskItem};

#[derive(Debug, Clone)]
pub enum Collaboration {
    Decentralized,
    /// One template per role (`task.formatters`, the shared one repeated).
    Centralized {
        templates: Vec<String>,
    },
}

impl Collaboration {
    /// Centralized (`templates`: each role's) or not.
    pub fn new(centralized: bool, templates: Vec<String>) -> Self {
        match centralized {
            true => Collaboration::Centralized { templates },
            false => Collaboration::Decentralized,
        }
    }

    pub fn is_centralized(&self) -> bool {
        matches!(self, Collaboration::Centralized { .. })
    }

    /// Each role's output from the actors' outputs for one joint response.
    pub fn role_outputs(&self, actor_outputs: &[String]) -> Vec<String> {
        match self {
            Collaboration::Decentralized => actor_outputs.to_vec(),
            Collaboration::Centralized { templates } => parse_joint_response(&actor_outputs[0], templates.len()),
        }
    }

    /// The prompts the task reward is shown with the role outputs: the actors' own prompts, or,
    /// centralized, each role's rendered template.
    pub fn reward_prompts(&self, item: &TaskItem, actor_prompts: &[String]) -> Result<Vec<String>> {
        match self {
            Collaboration::Decentralized => Ok(actor_prompts.to_vec()),
            Collaboration::Centralized { templates } => templates.iter().map(|t| render_template(t, item)).collect(),
        }
    }
}

/// The centralized actor's prompt: every role's prompt, and the tagged form of the answer.
pub fn joint_prompt(role_prompts: &[String]) -> String {
    let n = role_prompts.len();
    let tasks: Vec<String> =
        role_prompts.iter().enumerate().map(|(i, p)| format!("Task of agent_{i}:\n{}", p.trim())).collect();
    let form: Vec<String> = (0..n).map(|i| format!("<agent_{i}>\n(agent_{i}'s answer)\n</agent_{i}>")).collect();
    format!(
        "You write for a team of {n} agents. Each agent has its own task, given below. Write each \
         agent's answer as that agent would, following its task only.\n\n{}\n\nReply with exactly one \
         section per agent, in this form, and nothing outside the sections:\n{}\n",
        tasks.join("\n\n"),
        form.join("\n")
    )
}

/// The centralized comparator's prompt for decentralized agents, exactly the reference's
/// `TaggedCentralizedComparatorAdapter.build_prompt` (§8.3; agents from 0).
pub fn centralized_comparator_prompt(role_prompts: &[String]) -> String {
    let n = role_prompts.len();
    let mut sections = vec![
        format!("You are a centralized coordinator producing the separate outputs of {n} agents."),
        "Each output must satisfy its corresponding original prompt. Keep the outputs separate;\ndo not merge them \
         or add commentary outside the required tags."
            .to_string(),
    ];
    for (i, p) in role_prompts.iter().enumerate() {
        sections.push(format!("Agent {i} original prompt:\n{p}"));
    }
    let tags: Vec<String> = (0..n).map(|i| format!("<agent_{i}>\n...\n</agent_{i}>")).collect();
    sections.push(format!("Return exactly one section for each agent in this format:\n{}", tags.join("\n")));
    format!("{}\n", sections.join("\n\n"))
}

/// Whether `text` has any role's section (the reference's comparator parse fails without one).
pub fn has_any_section(text: &str, roles: usize) -> bool {
    (0..roles).any(|i| {
        Regex::new(&format!(r"(?is)<\s*agent_{i}\s*>(.*?)<\s*/\s*agent_{i}\s*>")).expect("valid pattern").is_match(text)
    })
}

/// Role i's output: the first `<agent_i>…</agent_i>` section of `text`, trimmed; "" when absent.
pub fn parse_joint_response(text: &str, roles: usize) -> Vec<String> {
    (0..roles)
        .map(|i| {
            let re = Regex::new(&format!(r"(?is)<\s*agent_{i}\s*>(.*?)<\s*/\s*agent_{i}\s*>")).expect("valid pattern");
            re.captures(text).map(|c| c[1].trim().to_string()).unwrap_or_default()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_centralized_comparator_prompt_is_the_references() {
        let p = centralized_comparator_prompt(&["Write A.".to_string(), "Write B.".to_string()]);
        let want = "You are a centralized coordinator producing the separate outputs of 2 agents.\n\n\
                    Each output must satisfy its corresponding original prompt. Keep the outputs separate;\n\
                    do not merge them or add commentary outside the required tags.\n\n\
                    Agent 0 original prompt:\nWrite A.\n\n\
                    Agent 1 original prompt:\nWrite B.\n\n\
                    Return exactly one section for each agent in this format:\n\
                    <agent_0>\n...\n</agent_0>\n<agent_1>\n...\n</agent_1>\n";
        assert_eq!(p, want);
        assert!(has_any_section("x <AGENT_1> b </agent_1>", 2) && !has_any_section("no tags", 2));
    }

    #[test]
    fn parses_first_section_case_insensitively_and_trims() {
        let text = "intro <AGENT_1 >\n second </ agent_1> <agent_0>first\nline </Agent_0> <agent_0>again</agent_0>";
        assert_eq!(parse_joint_response(text, 2), vec!["first\nline", "second"]);
    }

    #[test]
    fn missing_or_unclosed_sections_are_empty() {
        assert_eq!(parse_joint_response("<agent_0>only</agent_0> <agent_1>open", 3), vec!["only", "", ""]);
        assert_eq!(parse_joint_response("no tags at all", 2), vec!["", ""]);
        // agent_1 must not match agent_10's tags.
        assert_eq!(parse_joint_response("<agent_10>x</agent_10>", 2), vec!["", ""]);
    }

    #[test]
    fn joint_prompt_lists_every_role_and_the_answer_form() {
        let p = joint_prompt(&["Say hi.".into(), "Say bye.".into()]);
        assert!(p.contains("Task of agent_0:\nSay hi.") && p.contains("Task of agent_1:\nSay bye."), "{p}");
        assert!(p.contains("<agent_1>\n(agent_1's answer)\n</agent_1>"), "{p}");
        // What the actor is asked to write is what the parser reads.
        assert_eq!(parse_joint_response(&p, 2), vec!["(agent_0's answer)", "(agent_1's answer)"]);
    }

    #[test]
    fn decentralized_outputs_pass_through() {
        let outs = vec!["a".to_string(), "b".to_string()];
        assert_eq!(Collaboration::Decentralized.role_outputs(&outs), outs);
        let joint = vec!["<agent_1>B</agent_1><agent_0>A</agent_0>".to_string()];
        let central = Collaboration::Centralized { templates: vec!["{prompt}".into(), "{prompt}!".into()] };
        assert_eq!(central.role_outputs(&joint), vec!["A", "B"]);
    }
}
