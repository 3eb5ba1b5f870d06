//! The API comparator against a real local HTTP server that speaks each format and injects
//! faults: timeouts, 429 with Retry-After, 500, truncated JSON, a missing field, 401. Transient
//! faults are retried (the answers arrive), the last failure is an error naming the URL, a
//! permanent one fails at once, and the key reaches the server's header but never an error or
//! the `Debug` text.
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pbrl::sources::http::{ApiClient, ApiFormat, ApiKey, ApiSettings, RequestSampling, RetryPolicy};
use serde_json::{json, Value};

/// One scripted answer of the server.
#[derive(Clone)]
enum Reply {
    Json(u16, Value),
    /// A status with a Retry-After header (seconds).
    RetryAfter(u16, &'static str),
    /// Sleep before answering, past the client's timeout.
    Stall(Duration),
    /// A 200 whose JSON body is cut short.
    Truncated,
}

/// A request as the server saw it.
#[derive(Debug, Clone)]
struct Seen {
    headers: Vec<(String, String)>,
    body: Value,
}

/// Serve the replies in order (the last one repeats), recording each request.
fn server(replies: Vec<Reply>) -> (String, Arc<Mutex<Vec<Seen>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1/generate", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for (i, stream) in listener.incoming().enumerate() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut headers = Vec::new();
            let mut line = String::new();
            reader.read_line(&mut line).unwrap(); // request line
            loop {
                line.clear();
                reader.read_line(&mut line).unwrap();
                let l = line.trim_end();
                if l.is_empty() {
                    break;
                }
                let (k, v) = l.split_once(':').unwrap();
                headers.push((k.trim().to_lowercase(), v.trim().to_string()));
            }
            let len: usize = headers.iter().find(|(k, _)| k == "content-length").map_or(0, |(_, v)| v.parse().unwrap());
            let mut body = vec![0; len];
            reader.read_exact(&mut body).unwrap();
            log.lock().unwrap().push(Seen { headers, body: serde_json::from_slice(&body).unwrap() });
            let reply = replies[i.min(replies.len() - 1)].clone();
            let (code, extra, text) = match reply {
                Reply::Json(code, v) => (code, String::new(), v.to_string()),
                Reply::RetryAfter(code, secs) => (code, format!("Retry-After: {secs}\r\n"), "{}".to_string()),
                Reply::Stall(d) => {
                    std::thread::sleep(d);
                    (200, String::new(), "{}".to_string())
                }
                Reply::Truncated => (200, String::new(), "{\"completions\": [\"cut".to_string()),
            };
            let head = format!(
                "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n",
                text.len()
            );
            let _ = stream.write_all(head.as_bytes()).and_then(|_| stream.write_all(text.as_bytes()));
        }
    });
    (url, seen)
}

fn settings(url: &str, format: ApiFormat) -> ApiSettings {
    ApiSettings {
        url: url.into(),
        format,
        model: Some("test-model".into()),
        max_n_per_request: None,
        timeout: Duration::from_millis(500),
        headers: vec![("X-Team".into(), "pbrl".into())],
        key: ApiKey::new("sk-test-secret-123"),
        key_header: "Authorization".into(),
        key_prefix: "Bearer".into(),
        response_field: None,
        extra_body: None,
        retry: RetryPolicy {
            max_attempts: 4,
            base_delay: Duration::from_millis(20),
            max_delay: Duration::from_millis(100),
            max_retry_after: Duration::from_secs(2),
        },
    }
}

const SAMPLING: RequestSampling = RequestSampling { max_new_tokens: 16, temperature: 0.7, top_p: 0.9, top_k: Some(50) };

fn header<'a>(s: &'a Seen, k: &str) -> Option<&'a str> {
    s.headers.iter().find(|(h, _)| h == k).map(|(_, v)| v.as_str())
}

#[test]
fn each_format_sends_the_reference_request_and_reads_its_answer() {
    let item = json!({"prompt": "a topic"});
    // generic: one request with every sampling field and the item; the dotted field read.
    let (url, seen) = server(vec![Reply::Json(200, json!({"data": {"texts": ["g1", {"text": "g2"}]}}))]);
    let mut s = settings(&url, ApiFormat::Generic);
    s.response_field = Some("data.texts".into());
    s.extra_body = Some(json!({"temperature": 0.1, "seed": 3}).as_object().unwrap().clone());
    let out = ApiClient::new(s).complete("write", 1, &item, 2, SAMPLING).unwrap();
    assert_eq!(out, vec!["g1", "g2"]);
    let r = &seen.lock().unwrap()[0];
    assert_eq!(r.body["num_return_sequences"], 2);
    assert_eq!((r.body["agent_idx"].clone(), r.body["top_k"].clone()), (json!(1), json!(50)));
    assert_eq!(r.body["batch_item"], item);
    assert_eq!((r.body["temperature"].clone(), r.body["seed"].clone()), (json!(0.1), json!(3)), "extra_body wins");
    assert_eq!(header(r, "authorization"), Some("Bearer sk-test-secret-123"));
    assert_eq!(header(r, "x-team"), Some("pbrl"));

    // openai: n batched up to max_n_per_request, the result cut to n.
    let chat = json!({"choices": [{"message": {"content": "c1"}}, {"message": {"content": "c2"}}]});
    let (url, seen) = server(vec![Reply::Json(200, chat)]);
    let mut s = settings(&url, ApiFormat::OpenAiChat);
    s.max_n_per_request = Some(2);
    let out = ApiClient::new(s).complete("write", 0, &item, 3, SAMPLING).unwrap();
    assert_eq!(out, vec!["c1", "c2", "c1"]);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.iter().map(|r| r.body["n"].as_u64().unwrap()).collect::<Vec<_>>(), vec![2, 1]);
    assert_eq!(seen[0].body["messages"], json!([{"role": "user", "content": "write"}]));
    assert_eq!(seen[0].body["max_tokens"], 16);
    assert!(seen[0].body.get("top_k").is_none());

    // anthropic: one request per candidate, the key as x-api-key, the version header.
    let msg = json!({"content": [{"type": "text", "text": "m"}]});
    let (url, seen) = server(vec![Reply::Json(200, msg)]);
    let out = ApiClient::new(settings(&url, ApiFormat::Anthropic)).complete("w", 0, &item, 2, SAMPLING).unwrap();
    assert_eq!(out, vec!["m", "m"]);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2);
    assert_eq!(header(&seen[0], "x-api-key"), Some("sk-test-secret-123"));
    assert_eq!(header(&seen[0], "anthropic-version"), Some("2023-06-01"));
    assert!(header(&seen[0], "authorization").is_none());

    // openai_responses: input and max_output_tokens, no temperature.
    let resp = json!({"output": [{"content": [{"type": "output_text", "text": "r"}]}]});
    let (url, seen) = server(vec![Reply::Json(200, resp)]);
    let out = ApiClient::new(settings(&url, ApiFormat::OpenAiResponses)).complete("w", 0, &item, 1, SAMPLING).unwrap();
    assert_eq!(out, vec!["r"]);
    let r = &seen.lock().unwrap()[0];
    assert_eq!((r.body["input"].clone(), r.body["max_output_tokens"].clone()), (json!("w"), json!(16)));
    assert!(r.body.get("temperature").is_none());
}

/// A server that asks for a wait no `Duration` holds (or none at all) gets pbrl's longest wait,
/// never a panic; the backoff after any number of tries stays at its cap.
#[test]
fn huge_or_zero_retry_after_and_long_backoffs_are_capped() {
    let ok = Reply::Json(200, json!({"completions": ["fine"]}));
    let (url, seen) = server(vec![Reply::RetryAfter(429, "1e20"), Reply::RetryAfter(429, "0"), ok]);
    let mut s = settings(&url, ApiFormat::Generic);
    s.retry.max_retry_after = Duration::from_millis(300);
    let started = Instant::now();
    let out = ApiClient::new(s).complete("w", 0, &json!({}), 1, SAMPLING).unwrap();
    assert_eq!(out, vec!["fine"]);
    assert_eq!(seen.lock().unwrap().len(), 3);
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(300) && waited < Duration::from_secs(5), "{waited:?}");
    let policy = RetryPolicy { max_attempts: 100, ..settings(&url, ApiFormat::Generic).retry };
    for attempt in [0, 1, 63, 64, 65, 1024, u32::MAX] {
        assert!(policy.backoff(attempt) <= policy.max_delay, "try {attempt}");
    }
    assert_eq!(policy.backoff(0), Duration::from_millis(20));
    assert_eq!(policy.backoff(2), Duration::from_millis(80));
}

#[test]
fn transient_faults_are_retried_and_the_last_one_is_a_clear_error() {
    let ok = Reply::Json(200, json!({"completions": ["fine"]}));
    let (url, seen) = server(vec![
        Reply::Stall(Duration::from_millis(900)),
        Reply::RetryAfter(429, "1"),
        Reply::Json(500, json!({"error": "overloaded"})),
        ok.clone(),
    ]);
    let started = Instant::now();
    let out = ApiClient::new(settings(&url, ApiFormat::Generic)).complete("w", 0, &json!({}), 1, SAMPLING).unwrap();
    assert_eq!(out, vec!["fine"]);
    assert_eq!(seen.lock().unwrap().len(), 4, "a timeout, a 429 and a 500, then the answer");
    assert!(started.elapsed() >= Duration::from_secs(1), "the 429's Retry-After was honoured");

    // Truncated JSON until the tries run out: an error naming the URL and the cause, no key.
    let (url, seen) = server(vec![Reply::Truncated]);
    let err = ApiClient::new(settings(&url, ApiFormat::Generic))
        .complete("w", 0, &json!({}), 1, SAMPLING)
        .unwrap_err()
        .to_string();
    assert_eq!(seen.lock().unwrap().len(), 4);
    assert!(err.contains(&url) && err.contains("after 4 tries") && err.contains("not JSON"), "{err}");
    assert!(!err.contains("sk-test-secret-123"));

    // A well-formed answer without the field, and a 401 that echoes the key: no retry.
    let (url, seen) = server(vec![Reply::Json(200, json!({"wrong": ["x"]}))]);
    let err = ApiClient::new(settings(&url, ApiFormat::Generic))
        .complete("w", 0, &json!({}), 1, SAMPLING)
        .unwrap_err()
        .to_string();
    assert_eq!(seen.lock().unwrap().len(), 1);
    assert!(err.contains("no field `completions`"), "{err}");
    let (url, seen) = server(vec![Reply::Json(401, json!({"error": "bad key Bearer sk-test-secret-123"}))]);
    let s = settings(&url, ApiFormat::OpenAiChat);
    let debug = format!("{s:?}");
    let err = ApiClient::new(s).complete("w", 0, &json!({}), 1, SAMPLING).unwrap_err().to_string();
    assert_eq!(seen.lock().unwrap().len(), 1);
    assert!(err.contains("HTTP 401") && err.contains("<redacted>"), "{err}");
    for text in [&err, &debug] {
        assert!(!text.contains("sk-test-secret-123"), "the key leaked: {text}");
    }
}
