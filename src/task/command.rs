//! A task reward computed by an external program in any language: one long-lived child process
//! speaking JSON lines (`process.rs`). pbrl writes one request per line,
//! `{"prompts": [[agent prompts], ...], "completions": [[agent 0 texts], [agent 1 texts], ...],
//! "items": [task item, ...]}` (one entry per joint response), and reads one line back,
//! `{"rewards": [float, ...]}`.
use anyhow::Result;
use serde::Deserialize;
use serde_json::json;

use super::process::JsonLinesProcess;
pub use super::process::BASE_ENV;
use super::reward::TaskReward;
use super::TaskItem;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandParams {
    /// The program and its arguments, e.g. `["python3", "rewards/my_reward.py"]`.
    pub command: Vec<String>,
    /// Environment variables the program gets besides [`BASE_ENV`] (by name; unset ones are
    /// left out). Nothing else of pbrl's environment reaches it: no API key, no token.
    #[serde(default)]
    pub env: Vec<String>,
}

pub struct CommandReward {
    process: JsonLinesProcess,
}

impl CommandReward {
    /// Start `command` with a minimal environment: [`BASE_ENV`] and the variables `env` names.
    pub fn spawn(command: &[String], env: &[String], timeout_s: f64) -> Result<Self> {
        Ok(Self { process: JsonLinesProcess::spawn("reward", command, env, timeout_s, "reward_timeout_s")? })
    }

    fn request(&mut self, item: &TaskItem, prompts: &[String], joints: &[Vec<String>]) -> Result<Vec<f64>> {
        let n_agents = prompts.len();
        let completions: Vec<Vec<&str>> =
            (0..n_agents).map(|a| joints.iter().map(|j| j[a].as_str()).collect()).collect();
        let req = json!({
            "prompts": vec![prompts; joints.len()],
            "completions": completions,
            "items": vec![item; joints.len()],
        });
        let reply = self.process.request(&req)?;
        #[derive(Deserialize)]
        struct Reply {
            rewards: Vec<f64>,
        }
        let parsed: Reply = match serde_json::from_str(&reply) {
            Ok(r) => r,
            Err(e) => {
                let head: String = reply.chars().take(200).collect();
                return Err(self.process.fail(format!("answered `{head}`, not {{\"rewards\": [numbers]}} ({e})")));
            }
        };
        if parsed.rewards.len() != joints.len() {
            return Err(self.process.fail(format!(
                "answered {} rewards for {} joint responses",
                parsed.rewards.len(),
                joints.len()
            )));
        }
        if let Some(bad) = parsed.rewards.iter().find(|r| !r.is_finite()) {
            return Err(self.process.fail(format!("answered a non-finite reward ({bad})")));
        }
        Ok(parsed.rewards)
    }
}

impl TaskReward for CommandReward {
    fn score(&mut self, item: &TaskItem, prompts: &[String], completions: &[String]) -> Result<f64> {
        Ok(self.request(item, prompts, &[completions.to_vec()])?[0])
    }

    fn score_batch(&mut self, item: &TaskItem, prompts: &[String], joints: &[Vec<String>]) -> Result<Vec<f64>> {
        if joints.is_empty() {
            return Ok(Vec::new());
        }
        self.request(item, prompts, joints)
    }
}
