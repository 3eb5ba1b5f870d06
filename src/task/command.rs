//! A task reward computed by an external program in any language: one long-lived child process
//! speaking JSON lines. pbrl writes one request per line,
//! `{"prompts": [[agent prompts], ...], "completions": [[agent 0 texts], [agent 1 texts], ...],
//! "items": [task item, ...]}` (one entry per joint response), and reads one line back,
//! `{"rewards": [float, ...]}`.
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use serde::Deserialize;
use serde_json::json;

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

/// The variables every reward program gets (when set): enough to find and run an interpreter.
pub const BASE_ENV: &[&str] = &["PATH", "HOME", "LANG"];

pub struct CommandReward {
    name: String,
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<std::io::Result<String>>,
    stderr_tail: Arc<Mutex<String>>,
    timeout: Duration,
}

const STDERR_TAIL: usize = 2000;

impl CommandReward {
    /// Start `command` with a minimal environment: [`BASE_ENV`] and the variables `env` names.
    pub fn spawn(command: &[String], env: &[String], timeout_s: f64) -> Result<Self> {
        let (prog, args) =
            command.split_first().context("reward.command is empty: give the program and its arguments")?;
        let name = command.join(" ");
        let passed: Vec<(String, std::ffi::OsString)> = BASE_ENV
            .iter()
            .map(|v| v.to_string())
            .chain(env.iter().cloned())
            .filter_map(|v| std::env::var_os(&v).map(|x| (v, x)))
            .collect();
        // Its own process group, so that ending it ends every process it started too.
        let mut child = Command::new(prog)
            .args(args)
            .env_clear()
            .envs(passed)
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot start reward command `{name}`"))?;
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        // Reader threads: stdout lines arrive on a channel (so reads can time out); stderr keeps
        // only its tail, for error messages.
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr_tail = Arc::new(Mutex::new(String::new()));
        let tail = stderr_tail.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(|l| l.ok()) {
                let mut t = tail.lock().expect("stderr tail lock");
                t.push_str(&line);
                t.push('\n');
                if t.len() > STDERR_TAIL {
                    let cut = t.len() - STDERR_TAIL;
                    let cut = (cut..t.len()).find(|&i| t.is_char_boundary(i)).unwrap_or(t.len());
                    t.drain(..cut);
                }
            }
        });
        let timeout = Duration::try_from_secs_f64(timeout_s)
            .map_err(|_| anyhow::anyhow!("reward_timeout_s = {timeout_s} is not a usable number of seconds"))?;
        Ok(Self { name, child, stdin, lines, stderr_tail, timeout })
    }

    fn fail(&mut self, what: String) -> anyhow::Error {
        std::thread::sleep(Duration::from_millis(50)); // let the stderr reader catch up
        let tail = self.stderr_tail.lock().expect("stderr tail lock").trim().to_string();
        let tail =
            if tail.is_empty() { String::new() } else { format!("; its stderr ends: {}", tail.replace('\n', " | ")) };
        anyhow::anyhow!("reward command `{}`: {what}{tail}", self.name)
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
        let line = serde_json::to_string(&req)? + "\n";
        if let Err(e) = self.stdin.write_all(line.as_bytes()).and_then(|_| self.stdin.flush()) {
            let status = self.child.try_wait().ok().flatten().map(|s| format!(" ({s})")).unwrap_or_default();
            return Err(self.fail(format!("cannot send a request, the program has exited{status}: {e}")));
        }
        let reply = match self.lines.recv_timeout(self.timeout) {
            Ok(Ok(l)) => l,
            Ok(Err(e)) => return Err(self.fail(format!("reading its output failed: {e}"))),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let secs = self.timeout.as_secs_f64();
                return Err(self.fail(format!("no answer within {secs} s (reward_timeout_s)")));
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = self.child.wait().map(|s| format!(" ({s})")).unwrap_or_default();
                return Err(self.fail(format!("the program exited without answering{status}")));
            }
        };
        #[derive(Deserialize)]
        struct Reply {
            rewards: Vec<f64>,
        }
        let parsed: Reply = match serde_json::from_str(&reply) {
            Ok(r) => r,
            Err(e) => {
                let head: String = reply.chars().take(200).collect();
                return Err(self.fail(format!("answered `{head}`, not {{\"rewards\": [numbers]}} ({e})")));
            }
        };
        if parsed.rewards.len() != joints.len() {
            return Err(self.fail(format!(
                "answered {} rewards for {} joint responses",
                parsed.rewards.len(),
                joints.len()
            )));
        }
        if let Some(bad) = parsed.rewards.iter().find(|r| !r.is_finite()) {
            return Err(self.fail(format!("answered a non-finite reward ({bad})")));
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

impl Drop for CommandReward {
    fn drop(&mut self) {
        // Closing stdin ends a well-behaved program; a stuck one is killed, with every process
        // of its group (the children it started).
        // SAFETY: signalling the process group the child leads (its pgid is its pid).
        unsafe {
            libc::kill(-(self.child.id() as libc::pid_t), libc::SIGKILL);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
