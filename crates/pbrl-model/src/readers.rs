//! Reading a model source (a GGUF file, a Hugging Face directory, a hub id) into a `VarMap` of
//! f32 `Var`s under Hugging Face names, with its config, tokenizer and source files.
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use candle_core::quantized::gguf_file::Content;
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::VarMap;
use serde_json::Value;

use super::config::{token_ids, ModelConfig};
use super::source::SourceFiles;
use super::tokenizer::{chat_tokenizer_from_dir, chat_tokenizer_from_gguf, ChatTokenizer};

/// What a source yields before the module is built.
pub(super) type Loaded = (VarMap, ModelConfig, ChatTokenizer, SourceFiles);

fn varmap_from(tensors: HashMap<String, Tensor>) -> Result<VarMap> {
    let varmap = VarMap::new();
    {
        let mut data = varmap.data().lock().expect("fresh VarMap lock");
        for (name, t) in tensors {
            data.insert(name, Var::from_tensor(&t.to_dtype(DType::F32)?)?);
        }
    }
    Ok(varmap)
}

/// llama.cpp's converter permutes q/k rows for its interleaved rope: per head the rows are stored
/// as (d/2, 2) pairs; Hugging Face (rotate-half rope) wants (2, d/2). This undoes it.
pub fn unpermute_qk(w: &Tensor, n_head: usize) -> Result<Tensor> {
    let (out, inp) = w.dims2()?;
    let hd = out / n_head;
    Ok(w.reshape((n_head, hd / 2, 2, inp))?.transpose(1, 2)?.contiguous()?.reshape((out, inp))?)
}

/// GGUF (llama.cpp) tensor name → Hugging Face name.
pub fn gguf_to_hf_name(name: &str) -> Option<String> {
    let simple = match name {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(s) = simple {
        return Some(s.to_string());
    }
    let (idx, leaf) = name.strip_prefix("blk.")?.split_once('.')?;
    let hf = match leaf {
        "attn_q.weight" => "self_attn.q_proj.weight",
        "attn_k.weight" => "self_attn.k_proj.weight",
        "attn_v.weight" => "self_attn.v_proj.weight",
        "attn_q.bias" => "self_attn.q_proj.bias",
        "attn_k.bias" => "self_attn.k_proj.bias",
        "attn_v.bias" => "self_attn.v_proj.bias",
        "attn_q_norm.weight" => "self_attn.q_norm.weight",
        "attn_k_norm.weight" => "self_attn.k_norm.weight",
        "attn_output.weight" => "self_attn.o_proj.weight",
        "attn_norm.weight" => "input_layernorm.weight",
        "ffn_norm.weight" => "post_attention_layernorm.weight",
        "ffn_gate.weight" => "mlp.gate_proj.weight",
        "ffn_up.weight" => "mlp.up_proj.weight",
        "ffn_down.weight" => "mlp.down_proj.weight",
        _ => return None,
    };
    Some(format!("model.layers.{idx}.{hf}"))
}

/// Dequantize every tensor of a GGUF file to f32 under Hugging Face names.
pub(super) fn load_gguf(path: &Path, device: &Device) -> Result<Loaded> {
    let ctx = || format!("reading GGUF model {}", path.display());
    let mut f = std::fs::File::open(path).with_context(ctx)?;
    let ct = Content::read(&mut f).with_context(ctx)?;
    let config = ModelConfig::from_gguf(&ct).with_context(ctx)?;
    let tokenizer = chat_tokenizer_from_gguf(&ct, &config.eos_token_ids).with_context(ctx)?;
    // q/k rows are permuted only for the llama rope layout (qwen2 GGUFs keep the HF order).
    let unpermute =
        ct.metadata.get("general.architecture").and_then(|v| v.to_string().ok()).is_some_and(|a| a == "llama");
    let mut tensors = HashMap::new();
    for name in ct.tensor_infos.keys() {
        let hf =
            gguf_to_hf_name(name).with_context(|| format!("{}: unexpected GGUF tensor `{name}`", path.display()))?;
        let mut t = ct.tensor(&mut f, name, device).with_context(ctx)?.dequantize(device)?;
        if unpermute && name.ends_with("attn_q.weight") {
            t = unpermute_qk(&t, config.num_attention_heads)?;
        } else if unpermute && name.ends_with("attn_k.weight") {
            t = unpermute_qk(&t, config.num_key_value_heads)?;
        }
        tensors.insert(hf, t);
    }
    Ok((varmap_from(tensors)?, config, tokenizer, SourceFiles::default()))
}

fn read_json(path: &Path) -> Result<Value> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_slice(&bytes).with_context(|| format!("{}: invalid JSON", path.display()))
}

/// A JSON file of the directory, when it has one.
fn optional_json(dir: &Path, name: &str) -> Result<Option<Value>> {
    let p = dir.join(name);
    if p.is_file() {
        Ok(Some(read_json(&p)?))
    } else {
        Ok(None)
    }
}

/// config.json + one or more safetensors files + tokenizer files (+ generation_config.json).
pub(super) fn load_hf_dir(dir: &Path, device: &Device) -> Result<Loaded> {
    let cfg_path = dir.join("config.json");
    let cfg_json = read_json(&cfg_path)?;
    let config = ModelConfig::from_hf_json(&cfg_json).with_context(|| cfg_path.display().to_string())?;
    let jinja = dir.join("chat_template.jinja");
    let chat_template_jinja = if jinja.is_file() {
        Some(std::fs::read_to_string(&jinja).with_context(|| format!("reading {}", jinja.display()))?)
    } else {
        None
    };
    let source_files = SourceFiles {
        config_json: Some(cfg_json),
        tokenizer_config_json: optional_json(dir, "tokenizer_config.json")?,
        special_tokens_map_json: optional_json(dir, "special_tokens_map.json")?,
        chat_template_jinja,
        generation_config_json: optional_json(dir, "generation_config.json")?,
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        bail!("{}: no *.safetensors weights (pbrl reads safetensors only)", dir.display());
    }
    let mut tensors = HashMap::new();
    for f in &files {
        let part = candle_core::safetensors::load(f, device).with_context(|| format!("reading {}", f.display()))?;
        tensors.extend(part);
    }
    // Generation stops at every end-of-sequence id config.json or generation_config.json names.
    let mut eos_ids = config.eos_token_ids.clone();
    if let Some(g) = &source_files.generation_config_json {
        eos_ids.extend(token_ids(&g["eos_token_id"]));
    }
    let tokenizer = chat_tokenizer_from_dir(dir, &source_files, &eos_ids)?;
    Ok((varmap_from(tensors)?, config, tokenizer, source_files))
}

/// Fetch config, tokenizer and weights of a hub model into the standard Hugging Face cache.
pub(super) fn fetch_from_hub(id: &str) -> Result<PathBuf> {
    let offline_help = || {
        format!(
            "`{id}` is no local file or directory, and it could not be fetched from the Hugging Face hub. Without network access, download \
             config.json, tokenizer.json, tokenizer_config.json and model.safetensors of `{id}` into a \
             directory and set the model source to that directory (or to a .gguf file)"
        )
    };
    let api = hf_hub::api::sync::ApiBuilder::from_env().with_progress(true).build().with_context(offline_help)?;
    let repo = api.model(id.to_string());
    let config = repo.get("config.json").with_context(offline_help)?;
    repo.get("tokenizer.json").with_context(offline_help)?;
    // Optional files: a repo without them is still a complete model.
    for optional in
        ["tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "generation_config.json"]
    {
        let _ = repo.get(optional);
    }
    match repo.get("model.safetensors.index.json") {
        Ok(index) => {
            let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&index)?)?;
            let mut shards: Vec<&str> = v["weight_map"]
                .as_object()
                .context("model.safetensors.index.json has no weight_map")?
                .values()
                .filter_map(|x| x.as_str())
                .collect();
            shards.sort();
            shards.dedup();
            for s in shards {
                repo.get(s).with_context(offline_help)?;
            }
        }
        Err(_) => {
            repo.get("model.safetensors").with_context(offline_help)?;
        }
    }
    Ok(config.parent().context("hub cache path")?.to_path_buf())
}
