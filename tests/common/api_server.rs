//! A local OpenAI-format completions server whose faults a test scripts while it runs: each
//! request takes the next fault of a queue, then the standing fault, and a request without a
//! fault gets `n` deterministic answers (answer k is k + 1 words, so the same request always
//! gets the same answer). It records every request's `Authorization` header.
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the server does with one request.
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// Answer as asked.
    None,
    /// A status with a body and no answer.
    Status(u16),
    /// 429 with this `Retry-After` (seconds, as written).
    RetryAfter(&'static str),
    /// Sleep this long, then answer.
    Stall(Duration),
    /// A 200 whose JSON body is cut short.
    Truncated,
    /// A 200 whose body is not UTF-8.
    NonUtf8,
    /// One answer fewer than asked.
    FewerChoices,
    /// The first answer is this many words, far beyond any `max_new_tokens`.
    Overlong(usize),
}

#[derive(Default)]
struct Script {
    queue: VecDeque<Fault>,
    standing: Option<Fault>,
    served: usize,
    auth: Vec<String>,
}

/// A running server; it lives as long as the test.
#[derive(Clone)]
pub struct FaultServer {
    pub url: String,
    script: Arc<Mutex<Script>>,
}

impl FaultServer {
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/v1/chat/completions", listener.local_addr().unwrap());
        let script = Arc::new(Mutex::new(Script::default()));
        let shared = script.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let shared = shared.clone();
                // One thread per connection: a stalled answer must not hold the next request.
                std::thread::spawn(move || serve(stream, &shared));
            }
        });
        Self { url, script }
    }

    /// The faults the next requests get, in order, before the standing one.
    pub fn queue(&self, faults: &[Fault]) {
        self.script.lock().unwrap().queue.extend(faults.iter().cloned());
    }

    /// The fault every request gets once the queue is empty (`Fault::None`: a fixed server).
    pub fn standing(&self, fault: Fault) {
        self.script.lock().unwrap().standing = Some(fault);
    }

    /// Requests answered so far.
    pub fn served(&self) -> usize {
        self.script.lock().unwrap().served
    }

    /// The `Authorization` headers seen so far.
    pub fn auth(&self) -> Vec<String> {
        self.script.lock().unwrap().auth.clone()
    }
}

fn serve(mut stream: std::net::TcpStream, script: &Mutex<Script>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let (mut line, mut len) = (String::new(), 0usize);
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let mut auth = None;
    loop {
        line.clear();
        if reader.read_line(&mut line).is_err() {
            return;
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let lower = l.to_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            len = v.trim().parse().unwrap();
        }
        if lower.starts_with("authorization:") {
            auth = Some(l.to_string());
        }
    }
    let mut body = vec![0; len];
    if reader.read_exact(&mut body).is_err() {
        return;
    }
    let request: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let fault = {
        let mut s = script.lock().unwrap();
        s.served += 1;
        s.auth.extend(auth);
        s.queue.pop_front().or_else(|| s.standing.clone()).unwrap_or(Fault::None)
    };
    let n = request["n"].as_u64().unwrap_or(1) as usize;
    let answers = |n: usize, first: usize| -> Vec<u8> {
        let choices: Vec<serde_json::Value> = (0..n)
            .map(|k| serde_json::json!({"message": {"content": "w5 ".repeat(if k == 0 { first } else { k + 1 })}}))
            .collect();
        serde_json::json!({"choices": choices}).to_string().into_bytes()
    };
    let (code, extra, text): (u16, String, Vec<u8>) = match fault {
        Fault::None => (200, String::new(), answers(n, 1)),
        Fault::Status(code) => (code, String::new(), b"{\"error\": \"scripted\"}".to_vec()),
        Fault::RetryAfter(secs) => (429, format!("Retry-After: {secs}\r\n"), b"{}".to_vec()),
        Fault::Stall(d) => {
            std::thread::sleep(d);
            (200, String::new(), answers(n, 1))
        }
        Fault::Truncated => (200, String::new(), b"{\"choices\": [{\"message\": {\"content\": \"cut".to_vec()),
        Fault::NonUtf8 => (200, String::new(), b"{\"choices\": [{\"message\": {\"content\": \"\xff\xfe\"}}]}".to_vec()),
        Fault::FewerChoices => (200, String::new(), answers(n - 1, 1)),
        Fault::Overlong(words) => (200, String::new(), answers(n, words)),
    };
    let head = format!(
        "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n",
        text.len()
    );
    let _ = stream.write_all(head.as_bytes()).and_then(|_| stream.write_all(&text));
}
