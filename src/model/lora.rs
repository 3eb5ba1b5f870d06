//! Low-rank adapters (LoRA, Hu et al. 2021) on a backbone's projections, as PEFT builds them:
//! a target projection `y = x Wᵀ` becomes `y = x Wᵀ + s · (x Aᵀ) Bᵀ` with A (r, in) and
//! B (out, r) trainable and W frozen; s = alpha / r (alpha / √r with rsLoRA). A starts as
//! PEFT's `kaiming_uniform_(a = √5)`, i.e. U(±1/√in), B as zeros, so a fresh adapter leaves the
//! model unchanged. The adapters' variables are named as in PEFT's `adapter_model.safetensors`
//! (`base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight`).
//!
//! This is the building block of LoRA agents (issue 33); stages do not use it yet.
use anyhow::{bail, Result};
use candle_core::{Tensor, Var};
use candle_nn::VarMap;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::ops;
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

/// One projection's adapter.
#[derive(Debug, Clone)]
pub struct LoraAdapter {
    /// (r, in)
    pub a: Tensor,
    /// (out, r)
    pub b: Tensor,
    pub scaling: f64,
}

impl LoraAdapter {
    /// `s · (x Aᵀ) Bᵀ` for 2-D `x` (rows, in).
    pub fn delta(&self, x: &Tensor) -> Result<Tensor> {
        Ok((ops::linear(&ops::linear(x, &self.a)?, &self.b)? * self.scaling)?)
    }
}

/// PEFT's name of a projection's adapter matrix (`which`: "lora_A" or "lora_B").
pub fn peft_name(projection: &str, which: &str) -> String {
    format!("base_model.model.{projection}.{which}.weight")
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
        proj.set_lora(LoraAdapter { a, b, scaling: spec.scaling() });
        adapted += 1;
    }
    if adapted == 0 {
        bail!("LoRA target_modules {:?} name no projection of this model (e.g. {ALL_LINEAR:?})", spec.target_modules);
    }
    Ok(adapted)
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
