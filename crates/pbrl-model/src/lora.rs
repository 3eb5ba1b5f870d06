//! Low-rank adapters (LoRA, Hu et al. 2021) on a backbone's projections, as PEFT builds them:
//! a target projection `y = x Wᵀ` becomes `y = x Wᵀ + s · (x Aᵀ) Bᵀ` with A (r, in) and
//! B (out, r) trainable and W frozen; s = alpha / r (alpha / √r with rsLoRA). A starts as
//! PEFT's `kaiming_uniform_(a = √5)`, i.e. U(±1/√in), B as zeros, so a fresh adapter leaves the
//! model unchanged. The adapters' variables are named as in PEFT's `adapter_model.safetensors`
//! (`base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight`).
//!
//! A LoRA agent is saved as a PEFT adapter directory: `adapter_config.json` and
//! `adapter_model.safetensors` (PEFT's names, `{"format": "pt"}` metadata).
use std::path::Path;

use anyhow::{bail, Context, Result};
use candle_core::{Tensor, Var};
use candle_nn::VarMap;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};

use super::dropout::{AdapterDropout, DropoutStream};
pub use super::lora_adapter::LoraAdapter;
use super::transformer::Backbone;

/// The projections PEFT's `"all-linear"` selects on a Llama-family decoder (the LM head excluded).
pub const ALL_LINEAR: [&str; 7] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"];

/// The adapter settings of PEFT's `LoraConfig` that change the computation.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraSpec {
    pub r: usize,
    pub alpha: f64,
    /// Projection names (`q_proj`, ...), matched against the last part of a projection's name.
    pub target_modules: Vec<String>,
    pub use_rslora: bool,
}

impl LoraSpec {
    /// The factor of the adapter's product: alpha / r, or alpha / √r with rsLoRA.
    pub fn scaling(&self) -> f64 {
        match self.use_rslora {
            true => self.alpha / (self.r as f64).sqrt(),
            false => self.alpha / self.r as f64,
        }
    }

    fn targets(&self, projection: &str) -> bool {
        let last = projection.rsplit('.').next().unwrap_or(projection);
        self.target_modules.iter().any(|t| t == last)
    }
}

/// PEFT's name of a projection's adapter matrix (`which`: "lora_A" or "lora_B").
pub fn peft_name(projection: &str, which: &str) -> String {
    format!("base_model.model.{projection}.{which}.weight")
}

/// Whether `name` is one of PEFT's adapter matrix names ([`peft_name`]).
pub fn is_adapter_name(name: &str) -> bool {
    name.starts_with("base_model.model.") && (name.ends_with(".lora_A.weight") || name.ends_with(".lora_B.weight"))
}

/// Attach a fresh adapter to every projection of `backbone` that `spec` targets, its variables
/// created in `adapters` under PEFT's names (A drawn from `seed`, B zeros). Returns how many
/// projections were adapted; none is an error (a typo in `target_modules`).
pub fn attach(backbone: &mut Backbone, spec: &LoraSpec, adapters: &VarMap, seed: u64) -> Result<usize> {
    if spec.r == 0 {
        bail!("a LoRA rank must be >= 1");
    }
    let (device, dtype) = (backbone.device().clone(), backbone.dtype());
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut adapted = 0;
    for (name, proj) in backbone.projections_mut() {
        if !spec.targets(&name) {
            continue;
        }
        let (inp, out) = proj.dims();
        let bound = 1.0 / (inp as f64).sqrt();
        let a: Vec<f32> = (0..spec.r * inp).map(|_| rng.random_range(-bound..bound) as f32).collect();
        let a = Tensor::from_vec(a, (spec.r, inp), &device)?.to_dtype(dtype)?;
        let b = Tensor::zeros((out, spec.r), dtype, &device)?;
        let a = register(adapters, &peft_name(&name, "lora_A"), a)?;
        let b = register(adapters, &peft_name(&name, "lora_B"), b)?;
        proj.set_lora(LoraAdapter { a, b, scaling: spec.scaling(), dropout: None });
        adapted += 1;
    }
    if adapted == 0 {
        bail!("LoRA target_modules {:?} name no projection of this model (e.g. {ALL_LINEAR:?})", spec.target_modules);
    }
    Ok(adapted)
}

/// Drop each input element of every adapter of `backbone` with probability `p` in training
/// passes (PEFT's `lora_dropout`; 0: no dropout). Each projection's masks are keyed by its place
/// in the model, each pass's by the backbone's [`DropoutStream`].
pub fn set_dropout(backbone: &mut Backbone, p: f64) -> Result<()> {
    if !(0.0..1.0).contains(&p) {
        bail!("a LoRA dropout must be in [0, 1), not {p}");
    }
    for (i, (_, proj)) in backbone.projections_mut().into_iter().enumerate() {
        if let Some(adapter) = proj.lora_mut() {
            adapter.dropout = (p > 0.0).then_some(AdapterDropout { p: p as f32, projection: i as u64 });
        }
    }
    backbone.dropout = (p > 0.0).then(|| std::sync::Arc::new(DropoutStream::default()));
    Ok(())
}

/// `value` as a variable of `map` under `name`, and the tensor the model reads.
fn register(map: &VarMap, name: &str, value: Tensor) -> Result<Tensor> {
    let var = Var::from_tensor(&value)?;
    let tensor = var.as_tensor().clone();
    map.data().lock().expect("the adapter map's lock").insert(name.to_string(), var);
    Ok(tensor)
}

/// Load the adapters' values from `tensors` (PEFT's names) into `adapters`, every variable
/// present and of its shape.
pub fn load_values(adapters: &VarMap, tensors: &std::collections::HashMap<String, Tensor>) -> Result<()> {
    let data = adapters.data().lock().expect("the adapter map's lock");
    for (name, var) in data.iter() {
        let Some(value) = tensors.get(name) else { bail!("the adapter file has no `{name}`") };
        if value.dims() != var.dims() {
            bail!("adapter `{name}` is {:?}, this model needs {:?}", value.dims(), var.dims());
        }
        var.set(&value.to_dtype(var.dtype())?.to_device(var.device())?)?;
    }
    Ok(())
}

pub const ADAPTER_CONFIG: &str = "adapter_config.json";
pub const ADAPTER_WEIGHTS: &str = "adapter_model.safetensors";

/// What makes a model a LoRA agent: its adapters' settings and the base they sit on.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraAgent {
    pub spec: LoraSpec,
    /// The base model's source (`base_model_name_or_path`).
    pub base: String,
    /// The dropout its adapters train with (`lora_dropout`): a training setting, which the
    /// adapter's config records and which does not change what the adapter computes.
    pub dropout: f64,
}

impl LoraAgent {
    /// PEFT's `adapter_config.json`.
    pub fn adapter_config(&self) -> Value {
        json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": self.base,
            "r": self.spec.r,
            "lora_alpha": self.spec.alpha,
            "lora_dropout": self.dropout,
            "target_modules": self.spec.target_modules,
            "use_rslora": self.spec.use_rslora,
            "bias": "none",
            "fan_in_fan_out": false,
            "inference_mode": true,
            "init_lora_weights": true,
            "modules_to_save": null,
            "use_dora": false,
        })
    }

    /// Read a PEFT adapter directory's `adapter_config.json`; a setting that changes the
    /// computation and that pbrl's LoRA does not have (DoRA, biases, per-layer patterns) is an error.
    pub fn read(dir: &Path) -> Result<Self> {
        let path = dir.join(ADAPTER_CONFIG);
        let v: Value =
            serde_json::from_slice(&std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?)
                .with_context(|| format!("{}: not JSON", path.display()))?;
        let fail = |what: &str| anyhow::anyhow!("{}: {what}", path.display());
        if v["peft_type"] != "LORA" {
            return Err(fail("peft_type is not \"LORA\""));
        }
        for (key, plain) in [
            ("use_dora", json!(false)),
            ("fan_in_fan_out", json!(false)),
            ("bias", json!("none")),
            ("modules_to_save", Value::Null),
            ("layers_to_transform", Value::Null),
        ] {
            if !v[key].is_null() && v[key] != plain {
                return Err(fail(&format!(
                    "`{key}` = {} changes the computation and pbrl's LoRA has no such setting; refused",
                    v[key]
                )));
            }
        }
        for key in ["rank_pattern", "alpha_pattern"] {
            if v[key].as_object().is_some_and(|m| !m.is_empty()) {
                return Err(fail(&format!("`{key}` (per-layer ranks or scales) is outside pbrl's LoRA; refused")));
            }
        }
        let r = v["r"].as_u64().filter(|&r| r >= 1).ok_or_else(|| fail("`r` must be a positive integer"))? as usize;
        let alpha = v["lora_alpha"].as_f64().filter(|a| *a > 0.0).ok_or_else(|| fail("`lora_alpha` must be > 0"))?;
        let target_modules = match &v["target_modules"] {
            Value::String(s) if s == "all-linear" => ALL_LINEAR.map(String::from).to_vec(),
            Value::Array(a) => a
                .iter()
                .map(|t| t.as_str().map(String::from).ok_or_else(|| fail("`target_modules` must hold names")))
                .collect::<Result<_>>()?,
            _ => return Err(fail("`target_modules` must be a list of names or \"all-linear\"")),
        };
        let base = v["base_model_name_or_path"]
            .as_str()
            .filter(|b| !b.is_empty())
            .ok_or_else(|| fail("`base_model_name_or_path` is missing"))?
            .to_string();
        let use_rslora = v["use_rslora"].as_bool().unwrap_or(false);
        let dropout = match &v["lora_dropout"] {
            Value::Null => 0.0,
            d => {
                d.as_f64().filter(|d| (0.0..1.0).contains(d)).ok_or_else(|| fail("`lora_dropout` must be in [0, 1)"))?
            }
        };
        Ok(Self { spec: LoraSpec { r, alpha, target_modules, use_rslora }, base, dropout })
    }

    /// Write the adapter directory's two files into `dir`: the config and the adapters' values
    /// (f32, PEFT's names, `{"format": "pt"}` metadata). Other variables of the agent's map (an
    /// actor-critic value head on the actor) are not part of the adapter and stay out.
    pub fn save(&self, dir: &Path, adapters: &VarMap) -> Result<()> {
        let tensors: Vec<(String, Tensor)> = {
            let data = adapters.data().lock().expect("the adapter map's lock");
            data.iter()
                .filter(|(k, _)| is_adapter_name(k))
                .map(|(k, v)| Ok((k.clone(), v.as_tensor().to_dtype(candle_core::DType::F32)?)))
                .collect::<Result<_>>()?
        };
        let metadata = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
        safetensors::serialize_to_file(tensors, Some(metadata), &dir.join(ADAPTER_WEIGHTS))
            .with_context(|| format!("writing {ADAPTER_WEIGHTS}"))?;
        let mut bytes = serde_json::to_vec_pretty(&self.adapter_config())?;
        bytes.push(b'\n');
        std::fs::write(dir.join(ADAPTER_CONFIG), bytes).with_context(|| format!("writing {ADAPTER_CONFIG}"))
    }
}
