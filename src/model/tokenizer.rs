//! Tokenizer, chat template and stop tokens of a model.
//!
//! The tokenizer comes from `tokenizer.json`, or is built from GGUF metadata as the equivalent
//! Hugging Face byte-level BPE (so token ids equal transformers' and llama.cpp's). Chat templates
//! are rendered natively for the ChatML family (SmolLM2, Qwen2): pbrl does not embed a Jinja engine,
//! it recognises the template and reads its default system prompt.
use anyhow::{anyhow, bail, Context, Result};
use candle_core::quantized::gguf_file::{Content, Value as GgufValue};
use serde_json::{json, Value};
use tokenizers::Tokenizer;

/// A ChatML chat template: `<|im_start|>role\ntext<|im_end|>\n` turns.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatTemplate {
    /// The system prompt the template inserts when the conversation has none.
    pub default_system: Option<String>,
    /// The template source, kept so a saved model carries it unchanged.
    pub source: String,
}

impl ChatTemplate {
    /// Recognise a ChatML template; `None` for any other template.
    pub fn parse(source: &str) -> Option<Self> {
        if !source.contains("<|im_start|>") || !source.contains("<|im_end|>") {
            return None;
        }
        // The default system turn appears as a string literal: '<|im_start|>system\n...<|im_end|>'.
        let mut default_system = None;
        'outer: for start in ["<|im_start|>system\\n", "<|im_start|>system\n"] {
            for (at, _) in source.match_indices(start) {
                let rest = &source[at + start.len()..];
                let Some(end) = rest.find("<|im_end|>") else {
                    continue;
                };
                let text = &rest[..end];
                // A Jinja expression here means the system text comes from the messages.
                if !text.contains("{{") && !text.contains('\'') && !text.contains('+') {
                    default_system = Some(text.replace("\\n", "\n"));
                    break 'outer;
                }
            }
        }
        Some(Self { default_system, source: source.to_string() })
    }

    /// The prompt for one user turn, ending with the assistant header (add_generation_prompt).
    pub fn render(&self, system: Option<&str>, user: &str) -> String {
        let mut s = String::new();
        if let Some(sys) = system.or(self.default_system.as_deref()) {
            s.push_str(&format!("<|im_start|>system\n{sys}<|im_end|>\n"));
        }
        s.push_str(&format!("<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"));
        s
    }
}

/// A tokenizer with what sampling needs to know about the model's special tokens.
#[derive(Clone)]
pub struct ChatTokenizer {
    pub tokenizer: Tokenizer,
    pub chat_template: Option<ChatTemplate>,
    /// Generation ends at any of these (e.g. `<|im_end|>`, `<|endoftext|>`).
    pub stop_ids: Vec<u32>,
    /// Fills padded positions; masked out everywhere, so its value never matters.
    pub pad_id: u32,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
}

impl ChatTokenizer {
    pub fn new(tokenizer: Tokenizer, chat_template: Option<String>, eos_id: Option<u32>) -> Result<Self> {
        let chat_template = chat_template.as_deref().and_then(ChatTemplate::parse);
        let id = |s: &str| tokenizer.token_to_id(s);
        let mut stop_ids: Vec<u32> = eos_id.into_iter().collect();
        for name in ["<|im_end|>", "<|endoftext|>", "</s>", "<|eot_id|>"] {
            if let Some(i) = id(name) {
                let relevant = name != "<|im_end|>" || chat_template.is_some();
                if relevant && !stop_ids.contains(&i) {
                    stop_ids.push(i);
                }
            }
        }
        if stop_ids.is_empty() {
            bail!("the tokenizer has no end-of-sequence token; pbrl cannot tell when an answer ends");
        }
        let pad_id = id("<|endoftext|>").or_else(|| id("<pad>")).unwrap_or(stop_ids[0]);
        let eos_token = eos_id.and_then(|i| tokenizer.id_to_token(i));
        Ok(Self { tokenizer, chat_template, stop_ids, pad_id, bos_token: None, eos_token })
    }

    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self.tokenizer.encode(text, false).map_err(|e| anyhow!("tokenizer: {e}"))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of generated tokens, special tokens (the stop token) removed.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.tokenizer.decode(ids, true).map_err(|e| anyhow!("tokenizer: {e}"))
    }

    /// The exact text an agent is given: the chat-templated turn, or the raw prompt.
    pub fn format_prompt(&self, use_chat_template: bool, system: Option<&str>, user: &str) -> Result<String> {
        if !use_chat_template {
            return Ok(match system {
                Some(s) => format!("{s}\n\n{user}"),
                None => user.to_string(),
            });
        }
        match &self.chat_template {
            Some(t) => Ok(t.render(system, user)),
            None => bail!(
                "the model has no ChatML chat template; set `task.chat_template = false` to give \
                 it raw prompts"
            ),
        }
    }

    /// `tokenizer_config.json` for a saved model, so transformers finds the chat template.
    pub fn tokenizer_config_json(&self) -> Value {
        let mut v = json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "clean_up_tokenization_spaces": false,
            "pad_token": self.tokenizer.id_to_token(self.pad_id),
        });
        if let Some(e) = &self.eos_token {
            v["eos_token"] = json!(e);
        }
        if let Some(b) = &self.bos_token {
            v["bos_token"] = json!(b);
        }
        if let Some(t) = &self.chat_template {
            v["chat_template"] = json!(t.source);
        }
        v
    }
}

fn md<'a>(ct: &'a Content, k: &str) -> Result<&'a GgufValue> {
    ct.metadata.get(k).with_context(|| format!("GGUF has no metadata `{k}`"))
}

/// A Hugging Face `tokenizer.json` equivalent to the GGUF's embedded byte-level BPE vocabulary.
pub fn tokenizer_json_from_gguf(ct: &Content) -> Result<Value> {
    let model = md(ct, "tokenizer.ggml.model")?.to_string()?;
    if model != "gpt2" {
        bail!("GGUF tokenizer `{model}` is not supported: pbrl builds byte-level BPE (`gpt2`) tokenizers only; use a Hugging Face directory with tokenizer.json instead");
    }
    let tokens = md(ct, "tokenizer.ggml.tokens")?.to_vec()?;
    let merges = md(ct, "tokenizer.ggml.merges")?.to_vec()?;
    let types = md(ct, "tokenizer.ggml.token_type")?.to_vec()?;
    let pre = ct.metadata.get("tokenizer.ggml.pre").and_then(|v| v.to_string().ok()).cloned().unwrap_or_default();

    let mut vocab = serde_json::Map::with_capacity(tokens.len());
    let mut added = Vec::new();
    for (id, (tok, ty)) in tokens.iter().zip(types.iter()).enumerate() {
        let tok = tok.to_string()?;
        vocab.insert(tok.clone(), json!(id));
        // llama.cpp token types: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
        let ty = ty.to_i32()?;
        if ty == 3 || ty == 4 {
            added.push(json!({"id": id, "content": tok, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": ty == 3}));
        }
    }
    // Merges are stored as "left right"; byte-level symbols never contain a real space.
    let merges = merges
        .iter()
        .map(|m| {
            let s = m.to_string()?;
            let (a, b) = s.split_once(' ').with_context(|| format!("GGUF merge `{s}` has no space"))?;
            Ok(json!([a, b]))
        })
        .collect::<Result<Vec<_>>>()?;
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
    // llama.cpp's `smollm` pre-tokenizer is the StarCoder rule: split every digit, then the GPT-2 regex.
    let pre_tokenizer = match pre.as_str() {
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva-7b" => json!({
            "type": "Sequence",
            "pretokenizers": [{"type": "Digits", "individual_digits": true}, byte_level]
        }),
        "gpt-2" | "default" | "" => byte_level,
        other => {
            bail!("GGUF pre-tokenizer `{other}` is not supported; use a Hugging Face directory with tokenizer.json")
        }
    };
    let unk = ct
        .metadata
        .get("tokenizer.ggml.unknown_token_id")
        .and_then(|v| v.to_u32().ok())
        .and_then(|i| tokens.get(i as usize))
        .and_then(|t| t.to_string().ok().cloned());
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": unk,
            "continuing_subword_prefix": null, "end_of_word_suffix": null,
            "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": merges
        }
    }))
}

/// The tokenizer, chat template and special token names stored in a GGUF file.
pub fn chat_tokenizer_from_gguf(ct: &Content, eos_id: Option<u32>) -> Result<ChatTokenizer> {
    let json = tokenizer_json_from_gguf(ct)?;
    let tokenizer = Tokenizer::from_bytes(serde_json::to_vec(&json)?)
        .map_err(|e| anyhow!("building the tokenizer from GGUF metadata: {e}"))?;
    let template = ct.metadata.get("tokenizer.chat_template").and_then(|v| v.to_string().ok()).cloned();
    let mut t = ChatTokenizer::new(tokenizer, template, eos_id)?;
    let bos = ct.metadata.get("tokenizer.ggml.bos_token_id").and_then(|v| v.to_u32().ok());
    t.bos_token = bos.and_then(|i| t.tokenizer.id_to_token(i));
    Ok(t)
}

/// Load `tokenizer.json` (+ `tokenizer_config.json` for the chat template) from a directory.
pub fn chat_tokenizer_from_files(
    tokenizer_json: &std::path::Path,
    tokenizer_config: Option<&std::path::Path>,
    eos_id: Option<u32>,
) -> Result<ChatTokenizer> {
    let tokenizer = Tokenizer::from_file(tokenizer_json).map_err(|e| anyhow!("{}: {e}", tokenizer_json.display()))?;
    let mut template = None;
    let mut eos_name = None;
    let mut bos_name = None;
    if let Some(p) = tokenizer_config.filter(|p| p.exists()) {
        let v: Value =
            serde_json::from_slice(&std::fs::read(p)?).with_context(|| format!("{}: invalid JSON", p.display()))?;
        template = v["chat_template"].as_str().map(str::to_string);
        let name = |x: &Value| x.as_str().map(str::to_string).or_else(|| x["content"].as_str().map(str::to_string));
        eos_name = name(&v["eos_token"]);
        bos_name = name(&v["bos_token"]);
    }
    let eos_id = eos_id.or_else(|| eos_name.as_deref().and_then(|n| tokenizer.token_to_id(n)));
    let mut t = ChatTokenizer::new(tokenizer, template, eos_id)?;
    t.bos_token = bos_name;
    if t.eos_token.is_none() {
        t.eos_token = eos_name;
    }
    Ok(t)
}
