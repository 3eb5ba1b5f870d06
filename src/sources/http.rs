//! The HTTP client of the API response source (reference §8.4): candidate responses from an
//! endpoint, in one of four request formats.
//!
//! | format | request | batching | completions from |
//! |---|---|---|---|
//! | generic | `{prompt, agent_idx, num_return_sequences, max_new_tokens, temperature, top_p, top_k, batch_item[, model]}` | one request | the dotted `response_field` |
//! | openai (chat completions) | `{model, messages, n, max_tokens, temperature, top_p}` | `n` up to `max_n_per_request` per request | `choices[].message.content` (or `.text`) |
//! | anthropic (messages) | `{model, max_tokens, messages, temperature}` | one request per candidate | the first `text` block of `content` |
//! | openai_responses | `{model, input, max_output_tokens}` | one request per candidate | the first `output_text` block of `output[].content` |
//!
//! `extra_body` is merged into every payload last. Beyond the reference (which tries once): a
//! request that times out, cannot connect, is refused with 429 (its `Retry-After` honoured) or
//! 5xx, or returns a body that is not JSON is retried with exponential backoff and jitter up to
//! `max_attempts` times; the last failure is an error naming the URL and what went wrong. Other
//! HTTP errors and a well-formed answer without completions fail at once. The key never appears
//! in an error, a log line or `Debug` output (a server's echo of it is redacted too).
use std::time::Duration;

use anyhow::{bail, Result};
use rand::Rng;
use serde_json::{json, Map, Value};

pub use crate::config::ApiFormat;

/// An API key: shown as `<redacted>` by `Debug`, removed from any text that would show it.
#[derive(Clone)]
pub struct ApiKey(String);

impl ApiKey {
    pub fn new(key: impl Into<String>) -> Option<Self> {
        let key = key.into();
        (!key.trim().is_empty()).then(|| Self(key.trim().to_string()))
    }

    /// `text` with every occurrence of the key replaced.
    pub fn redact(&self, text: &str) -> String {
        text.replace(&self.0, "<redacted>")
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// How failed requests are retried: up to `max_attempts` tries, waiting `base_delay`·2^k
/// (times a random factor in [0.5, 1], at most `max_delay`) before try k + 2; a 429's
/// `Retry-After` (seconds) replaces that wait, up to `max_retry_after`.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    pub max_attempts: u32,
    pub base_delay: Duration,
    pub max_delay: Duration,
    pub max_retry_after: Duration,
}

impl RetryPolicy {
    /// The wait after failed try `attempt` (from 0): `base_delay`·2^attempt, at most `max_delay`
    /// (computed without overflow however many tries there were).
    pub fn backoff(&self, attempt: u32) -> Duration {
        let doubled = self.base_delay.as_secs_f64() * 2f64.powi(attempt.min(1023) as i32);
        Duration::try_from_secs_f64(doubled).map_or(self.max_delay, |d| d.min(self.max_delay))
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 5,
            base_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(30),
            max_retry_after: Duration::from_secs(120),
        }
    }
}

#[derive(Debug, Clone)]
pub struct ApiSettings {
    pub url: String,
    pub format: ApiFormat,
    pub model: Option<String>,
    pub max_n_per_request: Option<usize>,
    /// Per HTTP request.
    pub timeout: Duration,
    /// Extra headers (after `Content-Type: application/json`).
    pub headers: Vec<(String, String)>,
    pub key: Option<ApiKey>,
    /// The key's header and prefix (`Authorization: Bearer <key>` by default).
    pub key_header: String,
    pub key_prefix: String,
    /// Generic format: the dotted path of the completions in the answer (`None`: the first of
    /// `completions`, `responses`, `outputs`, `choices`).
    pub response_field: Option<String>,
    pub extra_body: Option<Map<String, Value>>,
    pub retry: RetryPolicy,
}

/// The sampling settings a request carries.
#[derive(Debug, Clone, Copy)]
pub struct RequestSampling {
    pub max_new_tokens: usize,
    pub temperature: f64,
    pub top_p: f64,
    pub top_k: Option<usize>,
}

pub struct ApiClient {
    settings: ApiSettings,
    agent: ureq::Agent,
}

/// Why one try failed, and whether another may succeed.
struct Failure {
    message: String,
    transient: bool,
    retry_after: Option<Duration>,
}

impl ApiClient {
    pub fn new(settings: ApiSettings) -> Self {
        let agent = ureq::AgentBuilder::new().timeout(settings.timeout).build();
        Self { settings, agent }
    }

    /// `n` candidate responses of the comparator for agent `agent_idx`'s prompt on `item`.
    pub fn complete(
        &self,
        prompt: &str,
        agent_idx: usize,
        item: &Value,
        n: usize,
        sampling: RequestSampling,
    ) -> Result<Vec<String>> {
        let s = &self.settings;
        let mut out = Vec::with_capacity(n);
        match s.format {
            ApiFormat::Generic => {
                let payload = json!({
                    "prompt": prompt,
                    "agent_idx": agent_idx,
                    "num_return_sequences": n,
                    "max_new_tokens": sampling.max_new_tokens,
                    "temperature": sampling.temperature,
                    "top_p": sampling.top_p,
                    "top_k": sampling.top_k,
                    "batch_item": item,
                });
                let mut payload = payload.as_object().cloned().unwrap_or_default();
                if let Some(m) = &s.model {
                    payload.insert("model".into(), json!(m));
                }
                let answer = self.post(payload)?;
                out = generic_completions(&answer, s.response_field.as_deref())?;
            }
            ApiFormat::OpenAiChat => {
                let per_request = match s.max_n_per_request {
                    Some(m) => m.max(1).min(n.max(1)),
                    None if is_deepseek(&s.url, s.model.as_deref()) => 1,
                    None => n.max(1),
                };
                while out.len() < n {
                    let m = per_request.min(n - out.len());
                    let payload = dropping_nulls(json!({
                        "model": s.model,
                        "messages": [{"role": "user", "content": prompt}],
                        "n": m,
                        "max_tokens": sampling.max_new_tokens,
                        "temperature": sampling.temperature,
                        "top_p": sampling.top_p,
                    }));
                    let got = chat_completions(&self.post(payload)?);
                    if got.is_empty() {
                        break;
                    }
                    out.extend(got);
                }
                out.truncate(n);
            }
            ApiFormat::Anthropic => {
                for _ in 0..n {
                    let payload = dropping_nulls(json!({
                        "model": s.model,
                        "max_tokens": sampling.max_new_tokens,
                        "messages": [{"role": "user", "content": prompt}],
                        "temperature": sampling.temperature,
                    }));
                    out.extend(first_block(&self.post(payload)?, &["content"], &["text"]));
                }
            }
            ApiFormat::OpenAiResponses => {
                for _ in 0..n {
                    let payload = dropping_nulls(json!({
                        "model": s.model,
                        "input": prompt,
                        "max_output_tokens": sampling.max_new_tokens,
                    }));
                    out.extend(first_block(&self.post(payload)?, &["output", "content"], &["output_text", "text"]));
                }
            }
        }
        if out.is_empty() {
            bail!("Comparator API returned no completions for agent {agent_idx} ({}).", s.url);
        }
        Ok(out)
    }

    /// POST `payload` (with `extra_body` merged in) and return the answer's JSON, retrying
    /// transient failures.
    fn post(&self, mut payload: Map<String, Value>) -> Result<Value> {
        let s = &self.settings;
        if let Some(extra) = &s.extra_body {
            payload.extend(extra.clone());
        }
        let body = Value::Object(payload);
        let attempts = s.retry.max_attempts.max(1);
        let mut last = String::new();
        for attempt in 0..attempts {
            match self.try_once(&body) {
                Ok(v) => return Ok(v),
                Err(f) if f.transient && attempt + 1 < attempts => {
                    let backoff = s.retry.backoff(attempt);
                    let wait = match f.retry_after {
                        Some(r) => r.min(s.retry.max_retry_after),
                        None => backoff.mul_f64(rand::rng().random_range(0.5..=1.0)),
                    };
                    tracing::warn!(url = %s.url, attempt = attempt + 1, wait_s = wait.as_secs_f64(), "{}", f.message);
                    std::thread::sleep(wait);
                    last = f.message;
                }
                Err(f) => {
                    let tries = if f.transient { format!(" after {} tries", attempt + 1) } else { String::new() };
                    bail!("comparator API {}{tries}: {}", s.url, f.message);
                }
            }
        }
        bail!("comparator API {} after {attempts} tries: {last}", s.url)
    }

    fn try_once(&self, body: &Value) -> std::result::Result<Value, Failure> {
        let s = &self.settings;
        let mut req = self.agent.post(&s.url).set("Content-Type", "application/json");
        let mut headers = s.headers.clone();
        let (mut key_header, mut key_prefix) = (s.key_header.clone(), s.key_prefix.trim().to_string());
        if s.format == ApiFormat::Anthropic {
            if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("anthropic-version")) {
                headers.push(("anthropic-version".into(), "2023-06-01".into()));
            }
            if key_header.eq_ignore_ascii_case("authorization") {
                key_header = "x-api-key".into();
            }
            if key_prefix.eq_ignore_ascii_case("bearer") {
                key_prefix.clear();
            }
        }
        for (k, v) in &headers {
            req = req.set(k, v);
        }
        if let Some(key) = &s.key {
            let value = if key_prefix.is_empty() { key.0.clone() } else { format!("{key_prefix} {}", key.0) };
            req = req.set(&key_header, &value);
        }
        let redact = |t: &str| s.key.as_ref().map_or(t.to_string(), |k| k.redact(t));
        let fail =
            |message: String, transient: bool| Failure { message: redact(&message), transient, retry_after: None };
        match req.send_json(body) {
            Ok(resp) => {
                let text = read_body(resp).map_err(|e| fail(format!("reading the answer: {e}"), true))?;
                serde_json::from_str(&text)
                    .map_err(|e| fail(format!("the answer is not JSON ({e}): {}", head(&text)), true))
            }
            Err(ureq::Error::Status(code, resp)) => {
                let retry_after = resp
                    .header("Retry-After")
                    .and_then(|v| v.trim().parse::<f64>().ok())
                    .filter(|v| v.is_finite() && *v >= 0.0)
                    // Beyond what a Duration holds (1e20 s): the longest wait pbrl takes anyway.
                    .map(|v| Duration::try_from_secs_f64(v).unwrap_or(Duration::MAX));
                let text = resp.into_string().unwrap_or_default();
                let message = match code {
                    402 => format!("HTTP 402 (insufficient balance): {}", head(&text)),
                    _ => format!("HTTP {code}: {}", head(&text)),
                };
                let transient = code == 408 || code == 429 || code >= 500;
                Err(Failure { retry_after: if code == 429 { retry_after } else { None }, ..fail(message, transient) })
            }
            Err(ureq::Error::Transport(t)) => {
                let transient = !matches!(t.kind(), ureq::ErrorKind::InvalidUrl | ureq::ErrorKind::UnknownScheme);
                Err(fail(format!("{t}"), transient))
            }
        }
    }
}

/// The largest answer read (as `ureq`'s own `into_string`): a bigger one is an error.
const MAX_ANSWER_BYTES: u64 = 10 * 1024 * 1024;

/// An answer's body as text: strict UTF-8 (JSON's encoding), never decoded lossily, since a
/// replacement character would become part of a completion.
fn read_body(resp: ureq::Response) -> std::result::Result<String, String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    resp.into_reader().take(MAX_ANSWER_BYTES + 1).read_to_end(&mut bytes).map_err(|e| e.to_string())?;
    if bytes.len() as u64 > MAX_ANSWER_BYTES {
        return Err(format!("the answer is over {} MiB", MAX_ANSWER_BYTES >> 20));
    }
    String::from_utf8(bytes).map_err(|e| format!("the answer is not UTF-8 (byte {})", e.utf8_error().valid_up_to()))
}

/// The first 500 characters of a text.
fn head(text: &str) -> String {
    text.chars().take(500).collect()
}

fn is_deepseek(url: &str, model: Option<&str>) -> bool {
    url.contains("api.deepseek.com") || model.is_some_and(|m| m.to_lowercase().starts_with("deepseek-"))
}

/// A JSON object without its null fields (the reference drops `None` from every payload but
/// the generic one).
fn dropping_nulls(v: Value) -> Map<String, Value> {
    let mut m = v.as_object().cloned().unwrap_or_default();
    m.retain(|_, v| !v.is_null());
    m
}

/// The generic format's completions: the dotted field (or the first of the usual names), each
/// entry a string, or an object's `text` / `content` / `completion` / `response` /
/// `message.content`, else its JSON text; a single value counts as one.
fn generic_completions(answer: &Value, field: Option<&str>) -> Result<Vec<String>> {
    let found = match field {
        Some(path) => path.split('.').try_fold(answer, |v, k| v.get(k)),
        None => ["completions", "responses", "outputs", "choices"].iter().find_map(|k| answer.get(*k)),
    };
    let Some(found) = found else {
        bail!("the answer has no field `{}`: {}", field.unwrap_or("completions"), head(&answer.to_string()));
    };
    let text_of = |v: &Value| -> String {
        if let Some(s) = v.as_str() {
            return s.to_string();
        }
        for k in ["text", "content", "completion", "response"] {
            if let Some(s) = v.get(k).and_then(Value::as_str) {
                return s.to_string();
            }
        }
        if let Some(s) = v.get("message").and_then(|m| m.get("content")).and_then(Value::as_str) {
            return s.to_string();
        }
        v.to_string()
    };
    Ok(match found {
        Value::Array(items) => items.iter().map(text_of).collect(),
        Value::Null => Vec::new(),
        other => vec![text_of(other)],
    })
}

/// `choices[].message.content`, else `choices[].text`.
fn chat_completions(answer: &Value) -> Vec<String> {
    let choices = answer.get("choices").and_then(Value::as_array).cloned().unwrap_or_default();
    choices
        .iter()
        .filter_map(|c| {
            c.get("message").and_then(|m| m.get("content")).and_then(Value::as_str).or_else(|| c["text"].as_str())
        })
        .map(str::to_string)
        .collect()
}

/// The text of the first block whose `type` is one of `types`, under `path` (`["content"]`:
/// `content[]`; `["output", "content"]`: `output[].content[]`).
fn first_block(answer: &Value, path: &[&str], types: &[&str]) -> Option<String> {
    let mut blocks: Vec<&Value> = vec![answer];
    for key in path {
        blocks = blocks.iter().filter_map(|b| b.get(*key).and_then(Value::as_array)).flatten().collect();
    }
    blocks
        .into_iter()
        .find(|b| b.get("type").and_then(Value::as_str).is_some_and(|t| types.contains(&t)))
        .and_then(|b| b.get("text").and_then(Value::as_str))
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_and_answers_by_hand() {
        assert_eq!(ApiFormat::parse(" Chat ").unwrap(), ApiFormat::OpenAiChat);
        assert_eq!(ApiFormat::parse("codex").unwrap(), ApiFormat::OpenAiResponses);
        assert!(ApiFormat::parse("grpc").is_none(), "no silent fallback to generic");
        let a = json!({"out": {"texts": ["x", {"text": "y"}, {"message": {"content": "z"}}, 3]}});
        assert_eq!(generic_completions(&a, Some("out.texts")).unwrap(), vec!["x", "y", "z", "3"]);
        assert_eq!(generic_completions(&json!({"responses": "one"}), None).unwrap(), vec!["one"]);
        assert!(generic_completions(&json!({"other": []}), Some("completions")).is_err());
        let chat = json!({"choices": [{"message": {"content": "a"}}, {"text": "b"}]});
        assert_eq!(chat_completions(&chat), vec!["a", "b"]);
        let msg = json!({"content": [{"type": "thinking", "text": "t"}, {"type": "text", "text": "answer"}]});
        assert_eq!(first_block(&msg, &["content"], &["text"]).as_deref(), Some("answer"));
        let resp = json!({"output": [{"content": [{"type": "output_text", "text": "r"}]}]});
        assert_eq!(first_block(&resp, &["output", "content"], &["output_text", "text"]).as_deref(), Some("r"));
        let key = ApiKey::new("sk-secret").unwrap();
        assert_eq!(format!("{key:?}"), "<redacted>");
        assert_eq!(key.redact("echo sk-secret"), "echo <redacted>");
        assert!(is_deepseek("https://api.deepseek.com/v1", None) && is_deepseek("x", Some("DeepSeek-chat")));
    }
}
