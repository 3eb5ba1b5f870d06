//! The loaded model (its module, variables and tokenizer; a LoRA agent over a frozen base), read
//! from a source by `readers.rs`, and saving as a Hugging Face directory or a PEFT adapter.
use std::collections::HashMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use serde_json::{json, Value};

use super::config::ModelConfig;
use super::linear::FrozenStorage;
use super::lora::{attach, load_values, LoraAgent, LoraSpec, ADAPTER_CONFIG, ADAPTER_WEIGHTS};
use super::permissions;
use super::readers::{fetch_from_hub, load_gguf, load_hf_dir};
use super::sampling::SamplingParams;
use super::source::{ModelSource, SourceFiles};
use super::tokenizer::ChatTokenizer;
use super::transformer::CausalLm;

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
        let lora = Some(LoraAgent { spec: spec.clone(), base: base.source.clone(), dropout: 0.0 });
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

    /// Train this LoRA agent's adapters with dropout `p` on their inputs (`lora::set_dropout`);
    /// its saved adapter records it as `lora_dropout`.
    pub fn set_lora_dropout(&mut self, p: f64) -> Result<()> {
        let lora = self.lora.as_mut().context("only a LoRA agent's adapters take a dropout")?;
        super::lora::set_dropout(&mut self.model.backbone, p)?;
        lora.dropout = p;
        Ok(())
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

    /// Train with activation checkpointing (`gradient_checkpointing`, `checkpoint.rs`): the
    /// decoder layers keep their inputs only and are recomputed in the backward pass.
    pub fn checkpoint_layers(&mut self) {
        let vars = self.varmap.all_vars().into_iter().map(|v| v.as_tensor().clone()).collect();
        self.model.backbone.checkpoint = Some(std::sync::Arc::new(vars));
    }

    /// The name of the first weight variable (in name order) with a NaN or infinite value.
    pub fn first_non_finite_weight(&self) -> Result<Option<String>> {
        let data = self.varmap.data().lock().expect("VarMap lock");
        let mut names: Vec<&String> = data.keys().collect();
        names.sort();
        for name in names {
            let t = data[name].as_tensor().to_dtype(DType::F32)?;
            let sum = t.sum_all()?.to_scalar::<f32>()?;
            let max = t.abs()?.max_all()?.to_scalar::<f32>()?;
            if sum.is_nan() || !max.is_finite() {
                return Ok(Some(name.clone()));
            }
        }
        Ok(None)
    }

    /// A model that is only read (a reference policy, a comparator): a whole model stored as
    /// `storage` says ([`Self::into_frozen_base`]), or a LoRA adapter over its base so stored.
    pub fn load_frozen(source: &str, device: &Device, storage: FrozenStorage) -> Result<Self> {
        if Path::new(source).join(ADAPTER_CONFIG).is_file() {
            let agent = LoraAgent::read(Path::new(source))?;
            let base = Self::load(&agent.base, device)
                .and_then(|b| b.into_frozen_base(storage))
                .with_context(|| format!("loading the base of the LoRA adapter `{source}`"))?;
            return Self::adapter_over(&base, source, &agent.spec);
        }
        Self::load(source, device)?.stored(storage)
    }

    /// This model as it is (f32), or frozen and stored in `storage` ([`Self::into_frozen_base`]).
    pub fn stored(self, storage: FrozenStorage) -> Result<Self> {
        match storage {
            FrozenStorage::F32 => Ok(self),
            _ => self.into_frozen_base(storage),
        }
    }

    /// This model as the frozen base of LoRA agents: no variables, its matrices stored as
    /// `storage` says (the f32 variables dropped once converted). The agents built on it
    /// ([`Self::with_lora`], [`Self::adapter_over`]) share its storage. A non-finite weight is
    /// refused here, while it is still a variable that can be named.
    pub fn into_frozen_base(self, storage: FrozenStorage) -> Result<Self> {
        if let Some(name) = self.first_non_finite_weight()? {
            bail!("weight `{name}` of `{}` has non-finite values (NaN or infinite); refusing to use it", self.source);
        }
        let mut model = self.frozen()?;
        // The variables and the module over them go first: each f32 matrix is then freed as
        // soon as its stored copy exists, so loading peaks near the f32 model, not above it.
        let Self { model: variables_module, varmap, tokenizer, source, files, lora } = self;
        drop((variables_module, varmap));
        model.store_frozen(storage).with_context(|| format!("storing the base `{source}` as {storage:?}"))?;
        Ok(Self { model, varmap: VarMap::new(), tokenizer, source, files, lora })
    }

    /// This frozen base with products that take bf16 inputs (`compute_dtype = "bf16"`,
    /// [`CausalLm::compute_in_bf16`]): on the CPU only.
    pub fn compute_in_bf16(mut self) -> Result<Self> {
        if !self.varmap.all_vars().is_empty() {
            bail!("bf16 products are for a frozen base; `{}` has trainable weights", self.source);
        }
        if !self.model.device().is_cpu() {
            bail!(
                "compute_dtype = \"bf16\" runs on the CPU (its kernels use AVX512_BF16); `{}` is on {:?}: \
                 use compute_dtype = \"f32\" there",
                self.source,
                self.model.device()
            );
        }
        self.model.compute_in_bf16().with_context(|| format!("the base `{}`", self.source))?;
        Ok(self)
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
        permissions::new_file_modes(tmp)
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
        permissions::new_file_modes(tmp)
    }
}
