//! The architecture hyper-parameters of a decoder-only transformer, read from GGUF metadata or a
//! Hugging Face `config.json`, and written back as a `config.json` that transformers loads.
//!
//! `config.json` is read as transformers reads it: one typed `serde` view of the fields the
//! families share, each family's own defaults where a field is absent (those of transformers'
//! `LlamaConfig`, `Qwen2Config`, `Qwen3Config`), and RoPE from either layout (`rope.rs`). Any
//! field that would change the computation in a way pbrl does not implement is refused by name.
use anyhow::{bail, Context, Result};
use candle_core::quantized::gguf_file;
use serde::Deserialize;
use serde_json::{json, Value};

use super::rope::{Rope, RopeScaling};

/// The families pbrl can train. They share one module (`transformer.rs`); they differ in names,
/// biases, q/k norms and defaults only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// Llama 2/3, SmolLM/SmolLM2, TinyLlama, Mistral-style GQA: no biases.
    Llama,
    /// Qwen2 / Qwen2.5: biases on q, k and v.
    Qwen2,
    /// Qwen3: RMSNorm per head on q and k (before RoPE), no biases.
    Qwen3,
}

/// What a family's `config.json` means when a field is absent (transformers' config classes).
struct FamilyDefaults {
    rms_norm_eps: f64,
    rope_theta: f64,
    max_position_embeddings: usize,
    /// `None`: hidden_size / num_attention_heads.
    head_dim: Option<usize>,
}

impl Architecture {
    pub fn hf_class(self) -> &'static str {
        match self {
            Architecture::Llama => "LlamaForCausalLM",
            Architecture::Qwen2 => "Qwen2ForCausalLM",
            Architecture::Qwen3 => "Qwen3ForCausalLM",
        }
    }
    pub fn model_type(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Qwen2 => "qwen2",
            Architecture::Qwen3 => "qwen3",
        }
    }
    fn from_model_type(t: &str) -> Result<Self> {
        Ok(match t {
            "llama" | "mistral" => Architecture::Llama,
            "qwen2" => Architecture::Qwen2,
            "qwen3" => Architecture::Qwen3,
            other => bail!(
                "unsupported architecture `{other}`: pbrl supports the Llama family (llama, mistral), Qwen2 and Qwen3"
            ),
        })
    }
    fn defaults(self) -> FamilyDefaults {
        match self {
            Architecture::Llama => FamilyDefaults {
                rms_norm_eps: 1e-6,
                rope_theta: 10_000.0,
                max_position_embeddings: 2048,
                head_dim: None,
            },
            Architecture::Qwen2 => FamilyDefaults {
                rms_norm_eps: 1e-6,
                rope_theta: 10_000.0,
                max_position_embeddings: 32768,
                head_dim: None,
            },
            Architecture::Qwen3 => FamilyDefaults {
                rms_norm_eps: 1e-6,
                rope_theta: 10_000.0,
                max_position_embeddings: 32768,
                head_dim: Some(128),
            },
        }
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
    pub rope: Rope,
    pub max_position_embeddings: usize,
    /// Attention looks back at most this far (Mistral, Qwen with `use_sliding_window`); pbrl
    /// computes full attention, so sequences are bounded by it (`context_length`).
    pub sliding_window: Option<usize>,
    pub tie_word_embeddings: bool,
    pub bos_token_id: Option<u32>,
    /// Every end-of-sequence id of config.json (Llama 3 lists several).
    pub eos_token_ids: Vec<u32>,
    /// transformers builds the input embedding with `padding_idx = pad_token_id`, so that row
    /// gets no gradient from the positions that hold it (its LM-head use, when tied, still
    /// does); pbrl trains the same way.
    pub pad_token_id: Option<u32>,
}

/// `bos_token_id` / `eos_token_id`: one id or a list of them.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum TokenIds {
    One(u32),
    Many(Vec<u32>),
}

impl TokenIds {
    fn ids(self) -> Vec<u32> {
        match self {
            TokenIds::One(i) => vec![i],
            TokenIds::Many(v) => v,
        }
    }
}

/// The ids of a `*_token_id` field of any Hugging Face JSON file (one id or a list; none when
/// absent or of another shape).
pub fn token_ids(v: &Value) -> Vec<u32> {
    TokenIds::deserialize(v).map(TokenIds::ids).unwrap_or_default()
}

/// The fields of a `config.json` that pbrl reads. Others are kept verbatim for export
/// (`ModelFiles::config_json`) but do not change the computation; the ones that would are in
/// the `refused` list of [`ModelConfig::from_hf_json`].
#[derive(Debug, Deserialize)]
struct HfConfigFile {
    model_type: Option<String>,
    architectures: Option<Vec<String>>,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    vocab_size: usize,
    rms_norm_eps: Option<f64>,
    max_position_embeddings: Option<usize>,
    tie_word_embeddings: Option<bool>,
    bos_token_id: Option<TokenIds>,
    eos_token_id: Option<TokenIds>,
    pad_token_id: Option<TokenIds>,
    hidden_act: Option<String>,
    attention_bias: Option<bool>,
    mlp_bias: Option<bool>,
    attention_dropout: Option<f64>,
    use_sliding_window: Option<bool>,
    sliding_window: Option<usize>,
    max_window_layers: Option<usize>,
    layer_types: Option<Vec<String>>,
    partial_rotary_factor: Option<f64>,
    quantization_config: Option<Value>,
}

impl ModelConfig {
    /// Every weight the model reads, with its Hugging Face name and shape (what an exported
    /// agent holds: a head added beside the LM never leaks into it).
    pub fn weight_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let (h, i, v) = (self.hidden_size, self.intermediate_size, self.vocab_size);
        let q = self.num_attention_heads * self.head_dim;
        let kv = self.num_key_value_heads * self.head_dim;
        let mut w = vec![("model.embed_tokens.weight".to_string(), vec![v, h]), ("model.norm.weight".into(), vec![h])];
        if !self.tie_word_embeddings {
            w.push(("lm_head.weight".into(), vec![v, h]));
        }
        for l in 0..self.num_hidden_layers {
            let p = format!("model.layers.{l}");
            w.push((format!("{p}.input_layernorm.weight"), vec![h]));
            w.push((format!("{p}.post_attention_layernorm.weight"), vec![h]));
            w.push((format!("{p}.self_attn.q_proj.weight"), vec![q, h]));
            w.push((format!("{p}.self_attn.k_proj.weight"), vec![kv, h]));
            w.push((format!("{p}.self_attn.v_proj.weight"), vec![kv, h]));
            w.push((format!("{p}.self_attn.o_proj.weight"), vec![h, q]));
            if self.qk_norm() {
                w.push((format!("{p}.self_attn.q_norm.weight"), vec![self.head_dim]));
                w.push((format!("{p}.self_attn.k_norm.weight"), vec![self.head_dim]));
            }
            if self.qkv_bias() {
                w.push((format!("{p}.self_attn.q_proj.bias"), vec![q]));
                w.push((format!("{p}.self_attn.k_proj.bias"), vec![kv]));
                w.push((format!("{p}.self_attn.v_proj.bias"), vec![kv]));
            }
            w.push((format!("{p}.mlp.gate_proj.weight"), vec![i, h]));
            w.push((format!("{p}.mlp.up_proj.weight"), vec![i, h]));
            w.push((format!("{p}.mlp.down_proj.weight"), vec![h, i]));
        }
        w
    }

    /// q/k/v carry a bias in this family.
    pub fn qkv_bias(&self) -> bool {
        self.architecture == Architecture::Qwen2
    }

    /// q and k pass through a per-head RMSNorm before RoPE.
    pub fn qk_norm(&self) -> bool {
        self.architecture == Architecture::Qwen3
    }

    /// Bytes of the f32 logits of `tokens` scored tokens and of their gradient.
    pub fn logit_and_grad_bytes(&self, tokens: usize) -> u128 {
        tokens as u128 * self.vocab_size as u128 * 8
    }

    /// A lower bound of the f32 activations a training forward pass over `tokens` tokens keeps
    /// for its backward pass: per layer and token at least the block's input and its normed
    /// copy (2 × hidden) and the MLP's gate, up and gated product (3 × intermediate).
    pub fn train_activation_bytes(&self, tokens: usize) -> u128 {
        let per_token_layer = 2 * self.hidden_size as u128 + 3 * self.intermediate_size as u128;
        tokens as u128 * self.num_hidden_layers as u128 * per_token_layer * 4
    }

    /// The longest sequence (prompt + completion) pbrl computes exactly as transformers does.
    pub fn context_length(&self) -> usize {
        self.sliding_window.map_or(self.max_position_embeddings, |w| w.min(self.max_position_embeddings))
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
        for k in ["rope.scaling.type", "rope.scaling.factor"] {
            if let Some(v) = ct.metadata.get(&key(k)) {
                let none = v.to_string().is_ok_and(|s| s == "none") || v.to_f32().is_ok_and(|f| f == 0.0 || f == 1.0);
                if !none {
                    bail!("GGUF metadata `{}` sets RoPE scaling; pbrl reads scaled RoPE from Hugging Face directories only", key(k));
                }
            }
        }
        if ct.tensor_infos.contains_key("rope_freqs.weight") {
            bail!("GGUF has `rope_freqs.weight` (Llama 3.1 RoPE scaling); load the model from its Hugging Face directory instead");
        }
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
        let head_dim = get_u("attention.key_length").unwrap_or(hidden_size / num_attention_heads);
        let tok_id = |k: &str| ct.metadata.get(k).and_then(|v| v.to_u32().ok());
        Ok(Self {
            architecture,
            hidden_size,
            intermediate_size: get_u("feed_forward_length")?,
            num_hidden_layers: get_u("block_count")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            vocab_size,
            rms_norm_eps: eps,
            rope: Rope { theta: rope_theta, scaling: RopeScaling::Default },
            max_position_embeddings: get_u("context_length").unwrap_or(4096),
            sliding_window: None,
            tie_word_embeddings: !ct.tensor_infos.contains_key("output.weight"),
            bos_token_id: tok_id("tokenizer.ggml.bos_token_id"),
            eos_token_ids: tok_id("tokenizer.ggml.eos_token_id").into_iter().collect(),
            // transformers reads the GGUF's padding token into config.pad_token_id.
            pad_token_id: tok_id("tokenizer.ggml.padding_token_id"),
        })
    }

    /// Parse a Hugging Face `config.json` (either layout: transformers 5's `rope_parameters` or
    /// transformers 4's top-level `rope_theta` / `rope_scaling`).
    pub fn from_hf_json(v: &Value) -> Result<Self> {
        let f: HfConfigFile = serde_path_to_error::deserialize(v).map_err(|e| {
            let path = e.path().to_string();
            anyhow::anyhow!("field `{path}`: {}", e.into_inner())
        })?;
        let from_class = f.architectures.as_ref().and_then(|a| a.first()).map(|c| match c.as_str() {
            "LlamaForCausalLM" | "MistralForCausalLM" => "llama",
            "Qwen2ForCausalLM" => "qwen2",
            "Qwen3ForCausalLM" => "qwen3",
            other => other,
        });
        let model_type = f.model_type.as_deref().or(from_class).context("config.json names no `model_type`")?;
        let architecture = Architecture::from_model_type(model_type)?;
        if let Some(class) = f.architectures.as_ref().and_then(|a| a.first()).filter(|c| !c.ends_with("ForCausalLM")) {
            bail!("field `architectures`: `{class}` is not a causal language model (pbrl loads *ForCausalLM weights)");
        }
        let d = architecture.defaults();
        // Fields that change what the model computes, in ways pbrl does not implement.
        let refused: [(&str, bool, String); 6] = [
            ("hidden_act", f.hidden_act.as_deref().is_some_and(|a| a != "silu"), "pbrl implements SiLU MLPs".into()),
            (
                "attention_bias",
                f.attention_bias == Some(true) && architecture != Architecture::Qwen2,
                "attention projections with biases are Qwen2's only".into(),
            ),
            ("mlp_bias", f.mlp_bias == Some(true), "pbrl's MLPs have no biases".into()),
            ("attention_dropout", f.attention_dropout.is_some_and(|p| p != 0.0), "pbrl trains without dropout".into()),
            (
                "partial_rotary_factor",
                f.partial_rotary_factor.is_some_and(|p| p != 1.0),
                "pbrl rotates every dimension of a head".into(),
            ),
            (
                "quantization_config",
                f.quantization_config.is_some(),
                "pbrl reads unquantized safetensors weights".into(),
            ),
        ];
        if let Some((field, _, why)) = refused.iter().find(|r| r.1) {
            bail!("field `{field}` = {}: not supported ({why})", v[*field]);
        }
        if let Some(t) = f.layer_types.iter().flatten().find(|t| *t != "full_attention" && *t != "sliding_attention") {
            bail!("field `layer_types`: attention type `{t}` is not supported");
        }
        // A sliding window matters only past its length; pbrl bounds sequences by it instead.
        let sliding = match architecture {
            Architecture::Llama => f.sliding_window.is_some(),
            _ => {
                // transformers: layer i slides when use_sliding_window and i >= max_window_layers (28).
                let by_flag =
                    f.use_sliding_window == Some(true) && f.max_window_layers.unwrap_or(28) < f.num_hidden_layers;
                by_flag || f.layer_types.iter().flatten().any(|t| t == "sliding_attention")
            }
        };
        let sliding_window = if sliding {
            Some(f.sliding_window.context("field `sliding_window`: a sliding-window model needs its window size")?)
        } else {
            None
        };
        let max_position_embeddings = f.max_position_embeddings.unwrap_or(d.max_position_embeddings);
        let rope = Rope::from_hf_config(v, d.rope_theta, max_position_embeddings)?;
        let rms_norm_eps = f.rms_norm_eps.unwrap_or(d.rms_norm_eps);
        if !(rms_norm_eps.is_finite() && rms_norm_eps > 0.0) {
            bail!("field `rms_norm_eps` must be a finite positive number");
        }
        let first = |ids: Option<TokenIds>| ids.map(TokenIds::ids).unwrap_or_default();
        Ok(Self {
            architecture,
            hidden_size: f.hidden_size,
            intermediate_size: f.intermediate_size,
            num_hidden_layers: f.num_hidden_layers,
            num_attention_heads: f.num_attention_heads,
            num_key_value_heads: f.num_key_value_heads.unwrap_or(f.num_attention_heads),
            head_dim: f.head_dim.or(d.head_dim).unwrap_or(f.hidden_size / f.num_attention_heads),
            vocab_size: f.vocab_size,
            rms_norm_eps,
            rope,
            max_position_embeddings,
            sliding_window,
            tie_word_embeddings: f.tie_word_embeddings.unwrap_or(false),
            bos_token_id: first(f.bos_token_id).first().copied(),
            eos_token_ids: first(f.eos_token_id),
            pad_token_id: first(f.pad_token_id).first().copied(),
        })
        .and_then(Self::checked)
    }

    /// Shapes that cannot describe a working model.
    fn checked(self) -> Result<Self> {
        if self.num_attention_heads == 0
            || self.num_key_value_heads == 0
            || !self.num_attention_heads.is_multiple_of(self.num_key_value_heads)
        {
            bail!(
                "num_attention_heads ({}) must be a positive multiple of num_key_value_heads ({})",
                self.num_attention_heads,
                self.num_key_value_heads
            );
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            bail!("head_dim ({}) must be even and positive for RoPE", self.head_dim);
        }
        Ok(self)
    }

    /// `eos_token_id` as transformers writes it: one id, or the list when there are several.
    pub fn eos_token_id_json(&self) -> Option<Value> {
        match self.eos_token_ids.as_slice() {
            [] => None,
            [e] => Some(json!(e)),
            many => Some(json!(many)),
        }
    }

    /// A `config.json` that transformers (and pbrl) load back, for a model whose source had none
    /// (a GGUF file, a test model). RoPE is written in both layouts, so transformers 4 and 5 read
    /// the same base.
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
            "rope_theta": self.rope.theta,
            "rope_parameters": self.rope.to_rope_parameters(),
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": "silu",
            "torch_dtype": "float32",
        });
        if self.rope.scaling != RopeScaling::Default {
            v["rope_scaling"] = self.rope.to_rope_parameters();
        }
        if let Some(b) = self.bos_token_id {
            v["bos_token_id"] = json!(b);
        }
        if let Some(e) = self.eos_token_id_json() {
            v["eos_token_id"] = e;
        }
        if let Some(p) = self.pad_token_id {
            v["pad_token_id"] = json!(p);
        }
        match self.architecture {
            Architecture::Llama => {
                v["attention_bias"] = json!(false);
                v["mlp_bias"] = json!(false);
            }
            Architecture::Qwen2 | Architecture::Qwen3 => {
                v["use_sliding_window"] = json!(false);
                if self.architecture == Architecture::Qwen3 {
                    v["attention_bias"] = json!(false);
                }
            }
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base(extra: Value) -> Value {
        let mut v = json!({"model_type": "llama", "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 64});
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        v
    }

    #[test]
    fn family_defaults_and_token_id_lists() {
        let c = ModelConfig::from_hf_json(&base(json!({"eos_token_id": [5, 7], "rope_theta": 500000.0}))).unwrap();
        assert_eq!(c.eos_token_ids, vec![5, 7]);
        assert_eq!(c.rope.theta, 500000.0);
        assert_eq!(c.rms_norm_eps, 1e-6, "LlamaConfig's default");
        assert_eq!(c.max_position_embeddings, 2048);
        let q3 = ModelConfig::from_hf_json(&base(json!({"model_type": "qwen3"}))).unwrap();
        assert_eq!((q3.architecture, q3.head_dim, q3.max_position_embeddings), (Architecture::Qwen3, 128, 32768));
    }

    #[test]
    fn computation_changing_fields_are_refused_by_name() {
        let e = |x: Value| format!("{:#}", ModelConfig::from_hf_json(&base(x)).unwrap_err());
        assert!(e(json!({"hidden_act": "gelu"})).contains("hidden_act"));
        assert!(e(json!({"attention_bias": true})).contains("attention_bias"));
        assert!(e(json!({"mlp_bias": true})).contains("mlp_bias"));
        assert!(e(json!({"model_type": "gemma"})).contains("gemma"));
        assert!(e(json!({"quantization_config": {"bits": 4}})).contains("quantization_config"));
        assert!(e(json!({"architectures": ["LlamaForSequenceClassification"]})).contains("causal"));
        assert!(e(json!({"hidden_size": "32"})).contains("hidden_size"));
        assert!(e(json!({"rope_scaling": {"type": "su"}})).contains("su"));
    }

    #[test]
    fn a_sliding_window_bounds_the_context() {
        let c = ModelConfig::from_hf_json(&base(
            json!({"model_type": "mistral", "sliding_window": 64, "max_position_embeddings": 128}),
        ))
        .unwrap();
        assert_eq!(c.context_length(), 64);
        let q = ModelConfig::from_hf_json(&base(
            json!({"model_type": "qwen2", "use_sliding_window": false, "sliding_window": 64}),
        ))
        .unwrap();
        assert_eq!(q.context_length(), 32768);
    }
}
