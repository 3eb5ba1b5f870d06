//! Model sources (GGUF file, Hugging Face directory, hub id), loading into a `VarMap` of f32
//! `Var`s under Hugging Face names, and saving as a Hugging Face directory.
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use candle_core::quantized::gguf_file::Content;
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{VarBuilder, VarMap};
use serde_json::{json, Value};

use super::config::{token_ids, ModelConfig};
use super::linear::FrozenStorage;
use super::lora::{attach, load_values, LoraAgent, LoraSpec, ADAPTER_CONFIG, ADAPTER_WEIGHTS};
use super::sampling::SamplingParams;
use super::tokenizer::{chat_tokenizer_from_dir, chat_tokenizer_from_gguf, ChatTokenizer};
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

/// What a Hugging Face source directory had besides weights and tokenizer, kept so an exported
/// agent carries it unchanged (unknown fields included) rather than rebuilt from the few fields
/// pbrl reads. Empty for GGUF and test models: their files are written from what was parsed.
#[derive(Debug, Clone, Default)]
pub struct SourceFiles {
    pub config_json: Option<Value>,
    pub tokenizer_config_json: Option<Value>,
    pub special_tokens_map_json: Option<Value>,
    /// The template of `chat_template.jinja`, when it came from that file (transformers 5).
    pub chat_template_jinja: Option<String>,
    pub generation_config_json: Option<Value>,
}

/// The untied LM head's weight.
const LM_HEAD: &str = "lm_head.weight";

/// A model ready to sample and train: its weights (`VarMap`), the module built on them, and its
/// tokenizer.
pub struct LoadedModel {
    pub model: CausalLm,
    /// The trainable weights: all of them, or a LoRA agent's adapters only.
    pub varmap: VarMap,
    pub tokenizer: ChatTokenizer,
    pub source: String,
    pub files: SourceFiles,
    /// A LoRA agent: adapters (`varmap`) on a frozen base (`model`'s other weights).
    pub lora: Option<LoraAgent>,
}

impl LoadedModel {
    pub fn load(source: &str, device: &Device) -> Result<Self> {
        Self::load_parts(source, device, true)
    }

    /// A model's backbone, for the roles that read hidden states (a reward model, a critic):
    /// no LM head is built, and an untied model's `lm_head.weight` is dropped once read.
    pub fn load_backbone(source: &str, device: &Device) -> Result<Self> {
        Self::load_parts(source, device, false)
    }

    fn load_parts(source: &str, device: &Device, with_lm_head: bool) -> Result<Self> {
        if Path::new(source).join(ADAPTER_CONFIG).is_file() {
            if !with_lm_head {
                bail!("`{source}` is a LoRA adapter: a reward model's or critic's backbone must be a whole model");
            }
            return Self::load_adapter(source, device);
        }
        let parsed = ModelSource::parse(source)?;
        let (varmap, config, tokenizer, files) = match &parsed {
            ModelSource::Gguf(p) => load_gguf(p, device)?,
            ModelSource::HfDir(p) => load_hf_dir(p, device)?,
            ModelSource::Hub(id) => load_hf_dir(&fetch_from_hub(id)?, device)?,
        };
        let model = if with_lm_head {
            Self::build(&varmap, &config, DType::F32, device)
        } else {
            varmap.data().lock().expect("VarMap lock").remove(LM_HEAD);
            CausalLm::load_backbone(VarBuilder::from_varmap(&varmap, DType::F32, device), &config)
        }
        .with_context(|| format!("building the model from `{source}`"))?;
        Ok(Self { model, varmap, tokenizer, source: source.to_string(), files, lora: None })
    }

    /// A LoRA agent over `base`: its weights frozen (shared with `base`, not copied), fresh
    /// adapters (A from `seed`, B zero: the base's outputs) the only variables.
    pub fn with_lora(base: &LoadedModel, spec: &LoraSpec, seed: u64) -> Result<Self> {
        if base.lora.is_some() {
            bail!("`{}` is already a LoRA agent", base.source);
        }
        let mut model = base.frozen()?;
        let varmap = VarMap::new();
        attach(&mut model.backbone, spec, &varmap, seed)?;
        let lora = Some(LoraAgent { spec: spec.clone(), base: base.source.clone() });
        Ok(Self {
            model,
            varmap,
            tokenizer: base.tokenizer.clone(),
            source: base.source.clone(),
            files: base.files.clone(),
            lora,
        })
    }

    /// A saved PEFT adapter directory: its base (`base_model_name_or_path`) with the adapters.
    fn load_adapter(dir: &str, device: &Device) -> Result<Self> {
        let agent = LoraAgent::read(Path::new(dir))?;
        let base =
            Self::load(&agent.base, device).with_context(|| format!("loading the base of the LoRA adapter `{dir}`"))?;
        Self::adapter_over(&base, dir, &agent.spec)
    }

    /// The adapter directory `dir` (read as `agent` by [`LoraAgent::read`]) on an already loaded
    /// `base`, its `base_model_name_or_path`: agents of one base share it in memory.
    pub fn adapter_over(base: &LoadedModel, dir: &str, spec: &LoraSpec) -> Result<Self> {
        let mut m = Self::with_lora(base, spec, 0)?;
        let path = Path::new(dir).join(ADAPTER_WEIGHTS);
        let values = candle_core::safetensors::load(&path, base.model.device())
            .with_context(|| format!("reading {}", path.display()))?;
        load_values(&m.varmap, &values).with_context(|| format!("{}", path.display()))?;
        m.source = dir.to_string();
        Ok(m)
    }

    /// A LoRA agent's base, the agent with its adapters off (sharing the base's storage, frozen
    /// as the agent's is); `None` for a whole model.
    pub fn lora_base(&self) -> Option<LoadedModel> {
        let lora = self.lora.as_ref()?;
        Some(Self {
            model: self.model.without_adapters(),
            varmap: VarMap::new(),
            tokenizer: self.tokenizer.clone(),
            source: lora.base.clone(),
            files: self.files.clone(),
            lora: None,
        })
    }

    /// A LoRA agent merged into a whole model, as PEFT's `merge_and_unload` does: its base
    /// loaded again as it is on disk (f32, whatever `base_dtype` the agent trained over), then
    /// `W += s · B A` for every adapted projection. Saved with [`Self::save_hf_dir`], it is a
    /// Hugging Face directory transformers loads without PEFT.
    pub fn merged(&self) -> Result<LoadedModel> {
        let lora = self.lora.as_ref().context("only a LoRA agent can be merged")?;
        let mut whole = Self::load(&lora.base, self.model.device())
            .with_context(|| format!("loading the base `{}` to merge into", lora.base))?;
        {
            let weights = whole.varmap.data().lock().expect("VarMap lock");
            let adapters = self.varmap.data().lock().expect("the adapter map's lock");
            let scaling = lora.spec.scaling();
            for (name, a) in adapters.iter() {
                let Some(projection) =
                    name.strip_prefix("base_model.model.").and_then(|n| n.strip_suffix(".lora_A.weight"))
                else {
                    continue;
                };
                let b = adapters
                    .get(&super::lora::peft_name(projection, "lora_B"))
                    .with_context(|| format!("adapter `{projection}` has A but no B"))?;
                let w = weights
                    .get(&format!("{projection}.weight"))
                    .with_context(|| format!("the base has no `{projection}.weight`"))?;
                let delta = (b.as_tensor().matmul(a.as_tensor())? * scaling)?.to_dtype(w.dtype())?;
                w.set(&(w.as_tensor() + delta)?)?;
            }
        }
        whole.tokenizer = self.tokenizer.clone();
        Ok(whole)
    }

    /// The same model with its weights as plain tensors (no variables, sharing their storage): a
    /// frozen base. Its backward computes no weight gradients (`ops::linear`), so adapters on it
    /// train without weight-sized buffers.
    pub fn frozen(&self) -> Result<CausalLm> {
        if self.varmap.all_vars().is_empty() {
            // Already a frozen base (`into_frozen_base`): share it as it is stored.
            return Ok(self.model.clone());
        }
        let tensors: HashMap<String, Tensor> = {
            let data = self.varmap.data().lock().expect("VarMap lock");
            data.iter().map(|(k, v)| (k.clone(), v.as_tensor().detach())).collect()
        };
        let device = self.model.device().clone();
        let vb = VarBuilder::from_tensors(tensors, self.model.dtype(), &device);
        match self.model.has_lm_head() {
            true => CausalLm::load(vb, &self.model.config),
            false => CausalLm::load_backbone(vb, &self.model.config),
        }
    }

    /// This model as the frozen base of LoRA agents: no variables, its matrices stored as
    /// `storage` says (the f32 variables dropped once converted). The agents built on it
    /// ([`Self::with_lora`], [`Self::adapter_over`]) share its storage.
    pub fn into_frozen_base(self, storage: FrozenStorage) -> Result<Self> {
        let mut model = self.frozen()?;
        // The variables and the module over them go first: each f32 matrix is then freed as
        // soon as its stored copy exists, so loading peaks near the f32 model, not above it.
        let Self { model: variables_module, varmap, tokenizer, source, files, lora } = self;
        drop((variables_module, varmap));
        model.store_frozen(storage).with_context(|| format!("storing the base `{source}` as {storage:?}"))?;
        Ok(Self { model, varmap: VarMap::new(), tokenizer, source, files, lora })
    }

    /// The module over a `VarMap`'s weights (f32 for real models; tests also build f64 ones).
    pub fn build(varmap: &VarMap, config: &ModelConfig, dtype: DType, device: &Device) -> Result<CausalLm> {
        let vb = VarBuilder::from_varmap(varmap, dtype, device);
        CausalLm::load(vb, config)
    }

    /// Save as a Hugging Face directory that transformers and pbrl load: `model.safetensors`
    /// (f32), `config.json` and the tokenizer files as the source had them, and a
    /// `generation_config.json` with the sampling settings of the run (`sampling`, when given).
    /// Written into a temporary sibling directory and renamed into place; files 0644.
    pub fn save_hf_dir(&self, dir: &Path, sampling: Option<&SamplingParams>) -> Result<()> {
        let parent = dir.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        let name = dir.file_name().context("model directory needs a name")?.to_string_lossy().to_string();
        let tmp = parent.join(format!(".{name}.tmp-{}", std::process::id()));
        let result = self.write_hf_files(&tmp, sampling);
        if let Err(e) = result {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e.context(format!("saving the model to {}", dir.display())));
        }
        // Replace the previous directory only once the new one is complete.
        let io = |e: std::io::Error| anyhow::anyhow!("saving the model to {}: {e}", dir.display());
        if dir.exists() {
            let old = parent.join(format!(".{name}.old-{}", std::process::id()));
            std::fs::rename(dir, &old).map_err(io)?;
            std::fs::rename(&tmp, dir).map_err(io)?;
            std::fs::remove_dir_all(&old).map_err(io)?;
        } else {
            std::fs::rename(&tmp, dir).map_err(io)?;
        }
        Ok(())
    }

    /// A LoRA agent's directory: the PEFT adapter and the tokenizer with its chat template (so
    /// the directory alone tells what text the agent reads, and `AutoTokenizer` loads it), as
    /// a whole model's export writes them.
    fn write_adapter_files(&self, tmp: &Path, lora: &LoraAgent) -> Result<()> {
        lora.save(tmp, &self.varmap)?;
        self.tokenizer
            .tokenizer
            .save(tmp.join("tokenizer.json"), false)
            .map_err(|e| anyhow::anyhow!("saving tokenizer.json: {e}"))?;
        let config = match &self.files.tokenizer_config_json {
            Some(v) => v.clone(),
            None => self.tokenizer.tokenizer_config_json(),
        };
        std::fs::write(tmp.join("tokenizer_config.json"), serde_json::to_vec_pretty(&config)?)?;
        if let Some(t) = &self.files.chat_template_jinja {
            std::fs::write(tmp.join("chat_template.jinja"), t).context("writing chat_template.jinja")?;
        }
        new_file_modes(tmp)
    }

    fn write_hf_files(&self, tmp: &Path, sampling: Option<&SamplingParams>) -> Result<()> {
        if tmp.exists() {
            std::fs::remove_dir_all(tmp)?;
        }
        std::fs::create_dir_all(tmp)?;
        let config = &self.model.config;
        if let Some(lora) = &self.lora {
            return self.write_adapter_files(tmp, lora);
        }
        // Exactly the weights the language model reads: no other head in the VarMap, no
        // lm_head.weight of its own for a tied model, and none for a backbone.
        let map: HashMap<String, Tensor> = {
            let data = self.varmap.data().lock().expect("VarMap lock");
            config
                .weight_shapes()
                .into_iter()
                .filter(|(name, _)| self.model.has_lm_head() || name != LM_HEAD)
                .map(|(name, _)| {
                    let var = data.get(&name).with_context(|| format!("the model has no weight `{name}`"))?;
                    Ok((name, var.as_tensor().clone()))
                })
                .collect::<Result<_>>()?
        };
        candle_core::safetensors::save(&map, tmp.join("model.safetensors"))?;
        let write_json = |name: &str, v: &Value| -> Result<()> {
            let mut bytes = serde_json::to_vec_pretty(v)?;
            bytes.push(b'\n');
            std::fs::write(tmp.join(name), bytes).with_context(|| format!("writing {name}"))
        };
        let files = &self.files;
        let config_json = match &files.config_json {
            Some(src) => {
                // The weights are written in f32, whatever dtype the source had.
                let mut v = src.clone();
                for k in ["torch_dtype", "dtype"] {
                    if v.get(k).is_some() {
                        v[k] = json!("float32");
                    }
                }
                v
            }
            None => config.to_hf_json(),
        };
        write_json("config.json", &config_json)?;
        match &files.tokenizer_config_json {
            Some(v) => write_json("tokenizer_config.json", v)?,
            None => write_json("tokenizer_config.json", &self.tokenizer.tokenizer_config_json())?,
        }
        if let Some(v) = &files.special_tokens_map_json {
            write_json("special_tokens_map.json", v)?;
        }
        if let Some(t) = &files.chat_template_jinja {
            std::fs::write(tmp.join("chat_template.jinja"), t).context("writing chat_template.jinja")?;
        }
        let mut gen = files.generation_config_json.clone().unwrap_or_else(|| {
            let mut g = json!({});
            if let Some(b) = config.bos_token_id {
                g["bos_token_id"] = b.into();
            }
            if let Some(e) = config.eos_token_id_json() {
                g["eos_token_id"] = e;
            }
            g["pad_token_id"] = self.tokenizer.pad_id.into();
            g
        });
        if let Some(p) = sampling {
            gen["do_sample"] = json!(p.temperature > 0.0);
            gen["temperature"] = json!(p.temperature);
            gen["top_p"] = json!(p.top_p);
            // transformers reads top_k = 0 as "no top-k filtering".
            gen["top_k"] = json!(p.top_k.unwrap_or(0));
            gen["max_new_tokens"] = json!(p.max_new_tokens);
        }
        write_json("generation_config.json", &gen)?;
        self.tokenizer
            .tokenizer
            .save(tmp.join("tokenizer.json"), false)
            .map_err(|e| anyhow::anyhow!("saving tokenizer.json: {e}"))?;
        new_file_modes(tmp)
    }
}

/// Files copied from a read-only source (a hub cache) would stay read-only: every file of `dir`
/// gets what a new file gets, read-write under the user's umask.
fn new_file_modes(dir: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = 0o666 & !crate::run::atomic::umask();
    for entry in std::fs::read_dir(dir)? {
        std::fs::set_permissions(entry?.path(), std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

/// What a source yields before the module is built.
type Loaded = (VarMap, ModelConfig, ChatTokenizer, SourceFiles);

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
fn load_gguf(path: &Path, device: &Device) -> Result<Loaded> {
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
fn load_hf_dir(dir: &Path, device: &Device) -> Result<Loaded> {
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
