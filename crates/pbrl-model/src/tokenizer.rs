//! Tokenizer, chat template and stop tokens of a model.
//!
//! The tokenizer comes from `tokenizer.json`, or is built from GGUF metadata as the equivalent
//! Hugging Face byte-level BPE (so token ids equal transformers' and llama.cpp's). The chat
//! template is the model's own Jinja template (`chat_template.rs`), from `chat_template.jinja`,
//! `tokenizer_config.json` or the GGUF metadata.
use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use candle_core::quantized::gguf_file::{Content, Value as GgufValue};
use serde_json::{json, Value};
use tokenizers::Tokenizer;

use super::chat_template::{ChatTemplate, Message};
use super::source::SourceFiles;

/// A token's (start, end) byte offsets in the text it was read from.
pub type ByteRange = (usize, usize);

/// The special tokens transformers hands a chat template (its `special_tokens_map`), by name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SpecialTokens {
    pub bos: Option<String>,
    pub eos: Option<String>,
    pub pad: Option<String>,
    pub unk: Option<String>,
}

impl SpecialTokens {
    fn template_vars(&self) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        for (k, v) in
            [("bos_token", &self.bos), ("eos_token", &self.eos), ("pad_token", &self.pad), ("unk_token", &self.unk)]
        {
            if let Some(v) = v {
                m.insert(k.to_string(), v.clone());
            }
        }
        m
    }
}

/// A tokenizer with what sampling needs to know about the model's special tokens.
#[derive(Clone)]
pub struct ChatTokenizer {
    pub tokenizer: Tokenizer,
    pub chat_template: Option<ChatTemplate>,
    /// Extra variables for the chat template (the task's `chat_template_kwargs`, e.g.
    /// `enable_thinking = false`), as keyword arguments of `apply_chat_template`.
    pub template_kwargs: serde_json::Map<String, Value>,
    /// Generation ends at any of these (e.g. `<|im_end|>`, `<|endoftext|>`, `<|eot_id|>`).
    pub stop_ids: Vec<u32>,
    /// Fills padded positions; masked out everywhere, so its value never matters.
    pub pad_id: u32,
    pub special: SpecialTokens,
}

impl ChatTokenizer {
    /// `eos_ids`: every end-of-sequence id the model's files name (config.json and
    /// generation_config.json may list several, as Llama 3 does).
    pub fn new(
        tokenizer: Tokenizer,
        chat_template: Option<String>,
        special: SpecialTokens,
        eos_ids: &[u32],
    ) -> Result<Self> {
        let chat_template = match chat_template {
            Some(src) => Some(ChatTemplate::compile(&src, special.template_vars())?),
            None => None,
        };
        let id = |s: &str| tokenizer.token_to_id(s);
        let mut stop_ids: Vec<u32> = Vec::new();
        let named = special.eos.as_deref().and_then(id);
        for i in eos_ids.iter().copied().chain(named) {
            if !stop_ids.contains(&i) {
                stop_ids.push(i);
            }
        }
        for name in ["<|im_end|>", "<|endoftext|>", "</s>", "<|eot_id|>"] {
            if let Some(i) = id(name) {
                // `<|im_end|>` ends a turn only where the template writes ChatML turns.
                let relevant = name != "<|im_end|>" || chat_template.as_ref().is_some_and(|t| t.source.contains(name));
                if relevant && !stop_ids.contains(&i) {
                    stop_ids.push(i);
                }
            }
        }
        if stop_ids.is_empty() {
            bail!("the tokenizer has no end-of-sequence token; pbrl cannot tell when an answer ends");
        }
        let pad_id = id("<|endoftext|>").or_else(|| id("<pad>")).unwrap_or(stop_ids[0]);
        let mut special = special;
        if special.eos.is_none() {
            special.eos = tokenizer.id_to_token(stop_ids[0]);
        }
        Ok(Self { tokenizer, chat_template, template_kwargs: Default::default(), stop_ids, pad_id, special })
    }

    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self.tokenizer.encode(text, false).map_err(|e| anyhow!("tokenizer: {e}"))?;
        Ok(enc.get_ids().to_vec())
    }

    /// As transformers' `tokenizer(text)` encodes by default: with the special tokens the
    /// tokenizer's post-processor adds (Llama 3's `<|begin_of_text|>`; none for SmolLM2).
    pub fn encode_with_special_tokens(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self.tokenizer.encode(text, true).map_err(|e| anyhow!("tokenizer: {e}"))?;
        Ok(enc.get_ids().to_vec())
    }

    /// [`ChatTokenizer::encode_with_special_tokens`] and each token's byte range in `text`
    /// (an added special token's is empty).
    pub fn encode_with_offsets(&self, text: &str) -> Result<(Vec<u32>, Vec<ByteRange>)> {
        let enc = self.tokenizer.encode(text, true).map_err(|e| anyhow!("tokenizer: {e}"))?;
        Ok((enc.get_ids().to_vec(), enc.get_offsets().to_vec()))
    }

    /// Text of generated tokens, special tokens (the stop token) removed.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.tokenizer.decode(ids, true).map_err(|e| anyhow!("tokenizer: {e}"))
    }

    /// The exact text an agent is given: the chat-templated turn (`apply_chat_template` with
    /// `add_generation_prompt=True`), or the raw prompt.
    pub fn format_prompt(&self, use_chat_template: bool, system: Option<&str>, user: &str) -> Result<String> {
        if !use_chat_template {
            return Ok(match system {
                Some(s) => format!("{s}\n\n{user}"),
                None => user.to_string(),
            });
        }
        let Some(t) = &self.chat_template else {
            bail!("the model has no chat template; set `task.chat_template = false` to give it raw prompts")
        };
        let mut messages = Vec::with_capacity(2);
        if let Some(s) = system {
            messages.push(Message { role: "system", content: s });
        }
        messages.push(Message { role: "user", content: user });
        t.render(&messages, true, &self.template_kwargs)
    }

    /// `tokenizer_config.json` for a model that had none (a GGUF source or a test model), so
    /// transformers finds the chat template and the special tokens.
    pub fn tokenizer_config_json(&self) -> Value {
        let mut v = json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "clean_up_tokenization_spaces": false,
            "pad_token": self.tokenizer.id_to_token(self.pad_id),
        });
        for (k, t) in
            [("eos_token", &self.special.eos), ("bos_token", &self.special.bos), ("unk_token", &self.special.unk)]
        {
            if let Some(t) = t {
                v[k] = json!(t);
            }
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
pub fn chat_tokenizer_from_gguf(ct: &Content, eos_ids: &[u32]) -> Result<ChatTokenizer> {
    let json = tokenizer_json_from_gguf(ct)?;
    let tokenizer = Tokenizer::from_bytes(serde_json::to_vec(&json)?)
        .map_err(|e| anyhow!("building the tokenizer from GGUF metadata: {e}"))?;
    let template = ct.metadata.get("tokenizer.chat_template").and_then(|v| v.to_string().ok()).cloned();
    let name = |k: &str| ct.metadata.get(k).and_then(|v| v.to_u32().ok()).and_then(|i| tokenizer.id_to_token(i));
    let special = SpecialTokens {
        bos: name("tokenizer.ggml.bos_token_id"),
        eos: name("tokenizer.ggml.eos_token_id"),
        pad: name("tokenizer.ggml.padding_token_id"),
        unk: name("tokenizer.ggml.unknown_token_id"),
    };
    ChatTokenizer::new(tokenizer, template, special, eos_ids)
}

/// A token named in `tokenizer_config.json`: a string, or an `AddedToken` object.
fn token_name(v: &Value) -> Option<String> {
    v.as_str().map(str::to_string).or_else(|| v["content"].as_str().map(str::to_string))
}

/// Load a Hugging Face directory's tokenizer from `tokenizer.json` and the directory's other
/// files, already read (`SourceFiles`): the special tokens of `tokenizer_config.json` (else
/// `special_tokens_map.json`), and the chat template from `chat_template.jinja`
/// (transformers 5) or else `tokenizer_config.json`'s `chat_template`.
pub fn chat_tokenizer_from_dir(dir: &Path, files: &SourceFiles, eos_ids: &[u32]) -> Result<ChatTokenizer> {
    let tok_path = dir.join("tokenizer.json");
    if !tok_path.is_file() {
        bail!("{}: no tokenizer.json", dir.display());
    }
    let tokenizer = Tokenizer::from_file(&tok_path).map_err(|e| anyhow!("{}: {e}", tok_path.display()))?;
    let cfg = files.tokenizer_config_json.as_ref().unwrap_or(&Value::Null);
    let map = files.special_tokens_map_json.as_ref().unwrap_or(&Value::Null);
    let pick = |k: &str| token_name(&cfg[k]).or_else(|| token_name(&map[k]));
    let special = SpecialTokens {
        bos: pick("bos_token"),
        eos: pick("eos_token"),
        pad: pick("pad_token"),
        unk: pick("unk_token"),
    };
    let cfg_path = dir.join("tokenizer_config.json");
    let (template, origin) = match &files.chat_template_jinja {
        Some(t) => (Some(t.clone()), dir.join("chat_template.jinja")),
        None => {
            let t = match &cfg["chat_template"] {
                Value::Null => None,
                Value::String(s) => Some(s.clone()),
                // A list of named templates: the one called "default" is what apply_chat_template uses.
                Value::Array(list) => Some(
                    list.iter()
                        .find(|t| t["name"] == "default")
                        .and_then(|t| t["template"].as_str())
                        .map(str::to_string)
                        .with_context(|| {
                            format!("{}: `chat_template` lists no template named \"default\"", cfg_path.display())
                        })?,
                ),
                _ => bail!("{}: `chat_template` is neither a string nor a list of named templates", cfg_path.display()),
            };
            (t, cfg_path)
        }
    };
    ChatTokenizer::new(tokenizer, template, special, eos_ids).with_context(|| origin.display().to_string())
}
