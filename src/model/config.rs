//! The architecture hyper-parameters of a decoder-only transformer, read from GGUF metadata or a
//! Hugging Face `config.json`, and written back as a `config.json` that transformers loads.
use anyhow::{bail, Context, Result};
use candle_core::quantized::gguf_file;
use serde_json::{json, Value};

/// The families pbrl can train. They share one module (`transformer.rs`); they differ in names,
/// biases and defaults only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// Llama 2/3, SmolLM/SmolLM2, TinyLlama, Mistral-style GQA: no biases.
    Llama,
    /// Qwen2 / Qwen2.5: biases on q, k and v.
    Qwen2,
}

impl Architecture {
    pub fn hf_class(self) -> &'static str {
        match self {
            Architecture::Llama => "LlamaForCausalLM",
            Architecture::Qwen2 => "Qwen2ForCausalLM",
        }
    }
    pub fn model_type(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Qwen2 => "qwen2",
        }
    }
    fn from_model_type(t: &str) -> Result<Self> {
        Ok(match t {
            "llama" | "mistral" => Architecture::Llama,
            "qwen2" => Architecture::Qwen2,
            other => bail!(
                "unsupported architecture `{other}`: pbrl supports the Llama family \
                 (llama, mistral) and Qwen2"
            ),
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Option<u32>,
}

impl ModelConfig {
    /// q/k/v carry a bias in this family.
    pub fn qkv_bias(&self) -> bool {
        self.architecture == Architecture::Qwen2
    }

    pub fn from_gguf(ct: &gguf_file::Content) -> Result<Self> {
        let arch =
            ct.metadata.get("general.architecture").context("GGUF has no general.architecture")?.to_string()?.clone();
        let architecture = Architecture::from_model_type(&arch)?;
        let key = |k: &str| format!("{arch}.{k}");
        let get_u = |k: &str| -> Result<usize> {
            let v = ct.metadata.get(&key(k)).with_context(|| format!("GGUF has no {}", key(k)))?;
            Ok(v.to_u32().or_else(|_| v.to_u64().map(|x| x as u32))? as usize)
        };
        let hidden_size = get_u("embedding_length")?;
        let num_attention_heads = get_u("attention.head_count")?;
        let num_key_value_heads = get_u("attention.head_count_kv").unwrap_or(num_attention_heads);
        let embd = ct.tensor_infos.get("token_embd.weight").context("GGUF has no token_embd.weight")?;
        let vocab_size = embd.shape.dims()[0];
        let eps =
            ct.metadata.get(&key("attention.layer_norm_rms_epsilon")).context("GGUF has no rms epsilon")?.to_f32()?
                as f64;
        let rope_theta =
            ct.metadata.get(&key("rope.freq_base")).and_then(|v| v.to_f32().ok()).unwrap_or(10_000.0) as f64;
        let tok_id = |k: &str| ct.metadata.get(k).and_then(|v| v.to_u32().ok());
        Ok(Self {
            architecture,
            hidden_size,
            intermediate_size: get_u("feed_forward_length")?,
            num_hidden_layers: get_u("block_count")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim: hidden_size / num_attention_heads,
            vocab_size,
            rms_norm_eps: eps,
            rope_theta,
            max_position_embeddings: get_u("context_length").unwrap_or(4096),
            tie_word_embeddings: !ct.tensor_infos.contains_key("output.weight"),
            bos_token_id: tok_id("tokenizer.ggml.bos_token_id"),
            eos_token_id: tok_id("tokenizer.ggml.eos_token_id"),
        })
    }

    /// Parse a Hugging Face `config.json`.
    pub fn from_hf_json(v: &Value) -> Result<Self> {
        let model_type = v["model_type"].as_str().unwrap_or("llama");
        let architecture = Architecture::from_model_type(model_type)?;
        let u = |k: &str| -> Result<usize> {
            v[k].as_u64().map(|x| x as usize).with_context(|| format!("config.json has no integer `{k}`"))
        };
        let hidden_size = u("hidden_size")?;
        let num_attention_heads = u("num_attention_heads")?;
        let head_dim = v["head_dim"].as_u64().map(|x| x as usize).unwrap_or(hidden_size / num_attention_heads);
        let first_id = |x: &Value| match x {
            Value::Number(n) => n.as_u64().map(|n| n as u32),
            Value::Array(a) => a.first().and_then(|n| n.as_u64()).map(|n| n as u32),
            _ => None,
        };
        let default_eps = if architecture == Architecture::Qwen2 { 1e-6 } else { 1e-5 };
        Ok(Self {
            architecture,
            hidden_size,
            intermediate_size: u("intermediate_size")?,
            num_hidden_layers: u("num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads: v["num_key_value_heads"].as_u64().map(|x| x as usize).unwrap_or(num_attention_heads),
            head_dim,
            vocab_size: u("vocab_size")?,
            rms_norm_eps: v["rms_norm_eps"].as_f64().unwrap_or(default_eps),
            rope_theta: v["rope_theta"].as_f64().unwrap_or(10_000.0),
            max_position_embeddings: v["max_position_embeddings"].as_u64().unwrap_or(4096) as usize,
            tie_word_embeddings: v["tie_word_embeddings"].as_bool().unwrap_or(false),
            bos_token_id: first_id(&v["bos_token_id"]),
            eos_token_id: first_id(&v["eos_token_id"]),
        })
    }

    /// A `config.json` that transformers (and pbrl) load back.
    pub fn to_hf_json(&self) -> Value {
        let mut v = json!({
            "architectures": [self.architecture.hf_class()],
            "model_type": self.architecture.model_type(),
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": "silu",
            "torch_dtype": "float32",
        });
        if let Some(b) = self.bos_token_id {
            v["bos_token_id"] = json!(b);
        }
        if let Some(e) = self.eos_token_id {
            v["eos_token_id"] = json!(e);
        }
        match self.architecture {
            Architecture::Llama => {
                v["attention_bias"] = json!(false);
                v["mlp_bias"] = json!(false);
            }
            Architecture::Qwen2 => {
                v["use_sliding_window"] = json!(false);
            }
        }
        v
    }
}
