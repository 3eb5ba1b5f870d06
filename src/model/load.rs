//! Model sources (GGUF file, Hugging Face directory, hub id), loading into a `VarMap` of f32
//! `Var`s under Hugging Face names, and saving as a Hugging Face directory.
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use candle_core::quantized::gguf_file::Content;
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{VarBuilder, VarMap};

use super::config::ModelConfig;
use super::tokenizer::{chat_tokenizer_from_files, chat_tokenizer_from_gguf, ChatTokenizer};
use super::transformer::CausalLm;

/// Where a model comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelSource {
    Gguf(PathBuf),
    HfDir(PathBuf),
    Hub(String),
}

impl ModelSource {
    /// Classify a config string: an existing `.gguf` file, an existing directory, or a hub id.
    pub fn parse(s: &str) -> Result<Self> {
        let p = Path::new(s);
        if p.is_file() {
            if s.ends_with(".gguf") {
                return Ok(Self::Gguf(p.to_path_buf()));
            }
            bail!("model source `{s}` is a file but not a .gguf file");
        }
        if p.is_dir() {
            if !p.join("config.json").is_file() {
                bail!("model directory `{s}` has no config.json (expected a Hugging Face model directory)");
            }
            return Ok(Self::HfDir(p.to_path_buf()));
        }
        let looks_like_hub = s.split('/').count() == 2
            && !s.starts_with('.')
            && !s.ends_with(".gguf")
            && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c));
        if looks_like_hub {
            return Ok(Self::Hub(s.to_string()));
        }
        if s.ends_with(".gguf") {
            bail!("model file `{s}` does not exist (for the bundled model run scripts/fetch-model.sh)");
        }
        bail!("model source `{s}` is not a .gguf file, a directory with config.json, or an `org/name` hub id")
    }
}

/// A model ready to sample and train: its weights (`VarMap`), the module built on them, and its
/// tokenizer.
pub struct LoadedModel {
    pub model: CausalLm,
    pub varmap: VarMap,
    pub tokenizer: ChatTokenizer,
    pub source: String,
}

impl LoadedModel {
    pub fn load(source: &str, device: &Device) -> Result<Self> {
        let parsed = ModelSource::parse(source)?;
        let (varmap, config, tokenizer) = match &parsed {
            ModelSource::Gguf(p) => load_gguf(p, device)?,
            ModelSource::HfDir(p) => load_hf_dir(p, device)?,
            ModelSource::Hub(id) => load_hf_dir(&fetch_from_hub(id)?, device)?,
        };
        let model = Self::build(&varmap, &config, DType::F32, device)
            .with_context(|| format!("building the model from `{source}`"))?;
        Ok(Self { model, varmap, tokenizer, source: source.to_string() })
    }

    /// The module over a `VarMap`'s weights (f32 for real models; tests also build f64 ones).
    pub fn build(varmap: &VarMap, config: &ModelConfig, dtype: DType, device: &Device) -> Result<CausalLm> {
        let vb = VarBuilder::from_varmap(varmap, dtype, device);
        CausalLm::load(vb, config)
    }

    /// Save as a Hugging Face directory (config.json, model.safetensors, tokenizer files),
    /// written into a temporary sibling directory and renamed into place.
    pub fn save_hf_dir(&self, dir: &Path) -> Result<()> {
        save_hf_dir(&self.varmap, &self.model.config, &self.tokenizer, dir)
    }
}

/// What a source yields before the module is built.
type Loaded = (VarMap, ModelConfig, ChatTokenizer);

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
fn load_gguf(path: &Path, device: &Device) -> Result<Loaded> {
    let ctx = || format!("reading GGUF model {}", path.display());
    let mut f = std::fs::File::open(path).with_context(ctx)?;
    let ct = Content::read(&mut f).with_context(ctx)?;
    let config = ModelConfig::from_gguf(&ct).with_context(ctx)?;
    let tokenizer = chat_tokenizer_from_gguf(&ct, config.eos_token_id).with_context(ctx)?;
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
    Ok((varmap_from(tensors)?, config, tokenizer))
}

/// config.json + one or more safetensors files + tokenizer.json.
fn load_hf_dir(dir: &Path, device: &Device) -> Result<Loaded> {
    let cfg_path = dir.join("config.json");
    let cfg_json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&cfg_path).with_context(|| format!("reading {}", cfg_path.display()))?)
            .with_context(|| format!("{}: invalid JSON", cfg_path.display()))?;
    let config = ModelConfig::from_hf_json(&cfg_json).with_context(|| cfg_path.display().to_string())?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
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
    let tok_path = dir.join("tokenizer.json");
    if !tok_path.is_file() {
        bail!("{}: no tokenizer.json", dir.display());
    }
    let tokenizer =
        chat_tokenizer_from_files(&tok_path, Some(&dir.join("tokenizer_config.json")), config.eos_token_id)?;
    Ok((varmap_from(tensors)?, config, tokenizer))
}

/// Fetch config, tokenizer and weights of a hub model into the standard Hugging Face cache.
fn fetch_from_hub(id: &str) -> Result<PathBuf> {
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
    let _ = repo.get("tokenizer_config.json");
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

/// Write a loadable Hugging Face directory atomically (temporary directory, then rename).
pub fn save_hf_dir(varmap: &VarMap, config: &ModelConfig, tokenizer: &ChatTokenizer, dir: &Path) -> Result<()> {
    let parent = dir.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent)?;
    let name = dir.file_name().context("model directory needs a name")?.to_string_lossy().to_string();
    let tmp = parent.join(format!(".{name}.tmp-{}", std::process::id()));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp)?;
    }
    std::fs::create_dir_all(&tmp)?;
    let mut tensors: Vec<(String, Tensor)> = {
        let data = varmap.data().lock().expect("VarMap lock");
        data.iter().map(|(k, v)| (k.clone(), v.as_tensor().clone())).collect()
    };
    if config.tie_word_embeddings {
        tensors.retain(|(k, _)| k != "lm_head.weight");
    }
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    let map: HashMap<String, Tensor> = tensors.into_iter().collect();
    candle_core::safetensors::save(&map, tmp.join("model.safetensors"))?;
    let json = |v: &serde_json::Value| -> Result<Vec<u8>> { Ok(serde_json::to_vec_pretty(v)?) };
    std::fs::write(tmp.join("config.json"), json(&config.to_hf_json())?)?;
    std::fs::write(tmp.join("tokenizer_config.json"), json(&tokenizer.tokenizer_config_json())?)?;
    let mut gen = serde_json::json!({"do_sample": true});
    if let Some(b) = config.bos_token_id {
        gen["bos_token_id"] = b.into();
    }
    if let Some(e) = config.eos_token_id {
        gen["eos_token_id"] = e.into();
    }
    gen["pad_token_id"] = tokenizer.pad_id.into();
    std::fs::write(tmp.join("generation_config.json"), json(&gen)?)?;
    tokenizer
        .tokenizer
        .save(tmp.join("tokenizer.json"), false)
        .map_err(|e| anyhow::anyhow!("saving tokenizer.json: {e}"))?;
    // Replace the previous directory only once the new one is complete.
    if dir.exists() {
        let old = parent.join(format!(".{name}.old-{}", std::process::id()));
        std::fs::rename(dir, &old)?;
        std::fs::rename(&tmp, dir)?;
        std::fs::remove_dir_all(&old)?;
    } else {
        std::fs::rename(&tmp, dir)?;
    }
    Ok(())
}
