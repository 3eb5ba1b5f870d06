//! A long-lived external program speaking JSON lines, as the command reward and the command
//! transition use it: pbrl writes one request per line and reads one answer line back, within a
//! timeout. The program gets a minimal environment and its own process group, which ends with
//! it; every failure is an error naming the program and ending with its stderr's tail.
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};

/// The variables every program gets (when set): enough to find and run an interpreter.
pub const BASE_ENV: &[&str] = &["PATH", "HOME", "LANG"];

pub struct JsonLinesProcess {
    /// What it is, for errors: "reward command `python3 r.py`".
    label: String,
    /// The key that sets the timeout, for the timeout's error.
    timeout_key: &'static str,
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<std::io::Result<String>>,
    stderr_tail: Arc<Mutex<String>>,
    timeout: Duration,
}

const STDERR_TAIL: usize = 2000;

impl JsonLinesProcess {
    /// Start `command` (`role`: "reward", "transition") with a minimal environment: [`BASE_ENV`]
    /// and the variables `env` names; answers are awaited `timeout_s` seconds (`timeout_key`).
    pub fn spawn(
        role: &str,
        command: &[String],
        env: &[String],
        timeout_s: f64,
        timeout_key: &'static str,
    ) -> Result<Self> {
        let (prog, args) = command
            .split_first()
            .with_context(|| format!("{role}.command is empty: give the program and its arguments"))?;
        let label = format!("{role} command `{}`", command.join(" "));
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
            .with_context(|| format!("cannot start {label}"))?;
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
            .map_err(|_| anyhow::anyhow!("{timeout_key} = {timeout_s} is not a usable number of seconds"))?;
        Ok(Self { label, timeout_key, child, stdin, lines, stderr_tail, timeout })
    }

    /// The error `what` about this program, with its stderr's tail.
    pub fn fail(&mut self, what: String) -> anyhow::Error {
        std::thread::sleep(Duration::from_millis(50)); // let the stderr reader catch up
        let tail = self.stderr_tail.lock().expect("stderr tail lock").trim().to_string();
        let tail =
            if tail.is_empty() { String::new() } else { format!("; its stderr ends: {}", tail.replace('\n', " | ")) };
        anyhow::anyhow!("{}: {what}{tail}", self.label)
    }

    /// Send `request` as one line and return the answer line.
    pub fn request(&mut self, request: &serde_json::Value) -> Result<String> {
        let line = serde_json::to_string(request)? + "\n";
        if let Err(e) = self.stdin.write_all(line.as_bytes()).and_then(|_| self.stdin.flush()) {
            let status = self.child.try_wait().ok().flatten().map(|s| format!(" ({s})")).unwrap_or_default();
            return Err(self.fail(format!("cannot send a request, the program has exited{status}: {e}")));
        }
        match self.lines.recv_timeout(self.timeout) {
            Ok(Ok(l)) => Ok(l),
            Ok(Err(e)) => Err(self.fail(format!("reading its output failed: {e}"))),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let secs = self.timeout.as_secs_f64();
                Err(self.fail(format!("no answer within {secs} s ({})", self.timeout_key)))
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = self.child.wait().map(|s| format!(" ({s})")).unwrap_or_default();
                Err(self.fail(format!("the program exited without answering{status}")))
            }
        }
    }
}

impl Drop for JsonLinesProcess {
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
