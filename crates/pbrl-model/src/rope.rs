//! Rotary position embeddings as transformers computes them (`modeling_rope_utils.py`): the
//! inverse frequencies of each RoPE type and the factor cos/sin are scaled by; the cos/sin tables
//! a model rotates its queries and keys with.
//!
//! Settings come from transformers 5's `rope_parameters` or the older top-level `rope_theta` +
//! `rope_scaling` (both exist in the wild). A type or a field pbrl does not implement is an error
//! naming it, never a silent default.
use std::f64::consts::PI;

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor};
use serde::Deserialize;
use serde_json::{json, Value};

use super::mode::Mode;
use super::ops;

/// How the base frequencies are rescaled.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE.
    Default,
    /// Position interpolation: every frequency divided by `factor`.
    Linear { factor: f64 },
    /// Dynamic NTK: the base grows with the sequence once it exceeds `max_position_embeddings`.
    /// pbrl never runs a sequence past the model's context (the model config's `context_length`), and
    /// within it transformers computes the plain frequencies, so this equals `Default` here.
    Dynamic { factor: f64 },
    /// Llama 3.x: low frequencies divided by `factor`, high ones kept, a smooth ramp between.
    Llama3 { factor: f64, low_freq_factor: f64, high_freq_factor: f64, original_max_position_embeddings: usize },
    /// YaRN (Qwen2.5/Qwen3 long context): interpolation ramped by dimension, cos/sin scaled.
    Yarn(Yarn),
}

/// YaRN's settings, as `rope_parameters` names them.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Yarn {
    pub factor: f64,
    pub original_max_position_embeddings: usize,
    pub beta_fast: f64,
    pub beta_slow: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mscale: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mscale_all_dim: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attention_factor: Option<f64>,
    pub truncate: bool,
}

/// RoPE settings of a model.
#[derive(Debug, Clone, PartialEq)]
pub struct Rope {
    pub theta: f64,
    pub scaling: RopeScaling,
}

/// The fields transformers reads from `rope_parameters` / `rope_scaling`. Any other field is
/// refused (`deny_unknown_fields`): it would belong to a RoPE variant pbrl does not implement.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RopeFields {
    rope_theta: Option<f64>,
    rope_type: Option<String>,
    #[serde(rename = "type")]
    legacy_type: Option<String>,
    factor: Option<f64>,
    original_max_position_embeddings: Option<usize>,
    low_freq_factor: Option<f64>,
    high_freq_factor: Option<f64>,
    beta_fast: Option<f64>,
    beta_slow: Option<f64>,
    mscale: Option<f64>,
    mscale_all_dim: Option<f64>,
    attention_factor: Option<f64>,
    truncate: Option<bool>,
    partial_rotary_factor: Option<f64>,
}

fn finite_positive(v: Option<f64>, field: &str) -> Result<Option<f64>> {
    match v {
        Some(x) if !(x.is_finite() && x > 0.0) => bail!("`{field}` must be a finite positive number, not {x}"),
        other => Ok(other),
    }
}

impl Rope {
    /// Read the RoPE settings of a `config.json`: `rope_parameters` (transformers 5), else the
    /// top-level `rope_theta` and `rope_scaling`. `default_theta` is the family's default base;
    /// `max_position_embeddings` the model's (the original context of llama3 and YaRN when the
    /// config names none, as transformers' `standardize_rope_params` does).
    pub fn from_hf_config(cfg: &Value, default_theta: f64, max_position_embeddings: usize) -> Result<Self> {
        let (field, params) = match (&cfg["rope_parameters"], &cfg["rope_scaling"]) {
            (Value::Null, Value::Null) => ("rope_scaling", Value::Object(Default::default())),
            (Value::Null, s) => ("rope_scaling", s.clone()),
            (p, Value::Null) => ("rope_parameters", p.clone()),
            // transformers 5 writes both only when they agree; read the newer one.
            (p, _) => ("rope_parameters", p.clone()),
        };
        let obj = params.as_object().with_context(|| format!("`{field}` must be an object"))?;
        if let Some((k, _)) = obj.iter().find(|(k, v)| v.is_object() && k.ends_with("attention")) {
            bail!("`{field}` gives RoPE settings per layer type (`{k}`); pbrl supports one RoPE for every layer");
        }
        let kind_of = |k: &str| obj.get(k).and_then(Value::as_str);
        if let Some(t) = kind_of("rope_type").or(kind_of("type")) {
            if !["default", "linear", "dynamic", "llama3", "yarn"].contains(&t) {
                bail!("`{field}`: RoPE type `{t}` is not supported (pbrl implements default, linear, dynamic, llama3, yarn)");
            }
        }
        let f: RopeFields =
            serde_json::from_value(params.clone()).with_context(|| format!("`{field}`: unsupported RoPE setting"))?;
        let theta = match (f.rope_theta, cfg["rope_theta"].as_f64()) {
            (Some(t), _) | (None, Some(t)) => t,
            (None, None) => default_theta,
        };
        finite_positive(Some(theta), "rope_theta")?;
        if let Some(p) = f.partial_rotary_factor.filter(|&p| p != 1.0) {
            bail!("`{field}.partial_rotary_factor` = {p}: pbrl rotates every dimension of a head (1.0 only)");
        }
        let kind = f.rope_type.as_deref().or(f.legacy_type.as_deref()).unwrap_or("default");
        // A top-level `original_max_position_embeddings` (Phi-3 style) takes priority.
        let top_original = cfg["original_max_position_embeddings"].as_u64().map(|x| x as usize);
        let original = top_original.or(f.original_max_position_embeddings).unwrap_or(max_position_embeddings);
        if original == 0 {
            bail!("`{field}.original_max_position_embeddings` must be positive");
        }
        let factor = || -> Result<f64> {
            finite_positive(f.factor, &format!("{field}.factor"))?
                .with_context(|| format!("`{field}`: RoPE type `{kind}` needs `factor`"))
        };
        let scaling = match kind {
            "default" => RopeScaling::Default,
            "linear" => RopeScaling::Linear { factor: factor()? },
            "dynamic" => RopeScaling::Dynamic { factor: factor()? },
            "llama3" => {
                let need = |v: Option<f64>, k: &str| -> Result<f64> {
                    finite_positive(v, &format!("{field}.{k}"))?
                        .with_context(|| format!("`{field}`: RoPE type `llama3` needs `{k}`"))
                };
                let (low, high) = (need(f.low_freq_factor, "low_freq_factor")?, need(f.high_freq_factor, "high_freq_factor")?);
                if low == high {
                    bail!("`{field}`: llama3 RoPE needs low_freq_factor != high_freq_factor");
                }
                RopeScaling::Llama3 {
                    factor: factor()?,
                    low_freq_factor: low,
                    high_freq_factor: high,
                    original_max_position_embeddings: original,
                }
            }
            "yarn" => RopeScaling::Yarn(Yarn {
                // transformers: without `factor`, the ratio of the context to the original one.
                factor: match f.factor {
                    None => max_position_embeddings as f64 / original as f64,
                    Some(_) => factor()?,
                },
                original_max_position_embeddings: original,
                // transformers: `get("beta_fast") or 32`, `get("beta_slow") or 1`.
                beta_fast: finite_positive(f.beta_fast, "beta_fast")?.unwrap_or(32.0),
                beta_slow: finite_positive(f.beta_slow, "beta_slow")?.unwrap_or(1.0),
                mscale: f.mscale,
                mscale_all_dim: f.mscale_all_dim,
                attention_factor: finite_positive(f.attention_factor, "attention_factor")?,
                truncate: f.truncate.unwrap_or(true),
            }),
            other => bail!(
                "`{field}`: RoPE type `{other}` is not supported (pbrl implements default, linear, dynamic, llama3, yarn)"
            ),
        };
        Ok(Self { theta, scaling })
    }

    /// `rope_parameters` as transformers 5 writes it.
    pub fn to_rope_parameters(&self) -> Value {
        let mut v = json!({"rope_theta": self.theta});
        let put = |v: &mut Value, k: &str, x: Value| v[k] = x;
        match &self.scaling {
            RopeScaling::Default => put(&mut v, "rope_type", json!("default")),
            RopeScaling::Linear { factor } => {
                put(&mut v, "rope_type", json!("linear"));
                put(&mut v, "factor", json!(factor));
            }
            RopeScaling::Dynamic { factor } => {
                put(&mut v, "rope_type", json!("dynamic"));
                put(&mut v, "factor", json!(factor));
            }
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } => {
                v = json!({"rope_theta": self.theta, "rope_type": "llama3", "factor": factor,
                    "low_freq_factor": low_freq_factor, "high_freq_factor": high_freq_factor,
                    "original_max_position_embeddings": original_max_position_embeddings});
            }
            RopeScaling::Yarn(y) => {
                v = serde_json::to_value(y).expect("plain fields serialize");
                v["rope_theta"] = json!(self.theta);
                v["rope_type"] = json!("yarn");
            }
        }
        v
    }

    /// Inverse frequencies (head_dim / 2 of them) and the factor cos and sin are multiplied by.
    pub fn inv_freq(&self, head_dim: usize) -> (Vec<f64>, f64) {
        let dim = head_dim as f64;
        let base: Vec<f64> = (0..head_dim).step_by(2).map(|i| 1.0 / self.theta.powf(i as f64 / dim)).collect();
        match &self.scaling {
            RopeScaling::Default | RopeScaling::Dynamic { .. } => (base, 1.0),
            RopeScaling::Linear { factor } => (base.iter().map(|f| f / factor).collect(), 1.0),
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } => {
                let old = *original_max_position_embeddings as f64;
                let (low_wavelen, high_wavelen) = (old / low_freq_factor, old / high_freq_factor);
                let inv = base
                    .iter()
                    .map(|&f| {
                        let wavelen = 2.0 * PI / f;
                        if wavelen < high_wavelen {
                            f
                        } else if wavelen > low_wavelen {
                            f / factor
                        } else {
                            let smooth = (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    })
                    .collect();
                (inv, 1.0)
            }
            RopeScaling::Yarn(Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                mscale,
                mscale_all_dim,
                attention_factor,
                truncate,
            }) => {
                let original = *original_max_position_embeddings as f64;
                let get_mscale = |scale: f64, m: f64| if scale <= 1.0 { 1.0 } else { 0.1 * m * scale.ln() + 1.0 };
                let attention = attention_factor.unwrap_or(match (mscale, mscale_all_dim) {
                    (Some(m), Some(a)) if *m != 0.0 && *a != 0.0 => get_mscale(*factor, *m) / get_mscale(*factor, *a),
                    _ => get_mscale(*factor, 1.0),
                });
                let correction_dim = |rot: f64| (dim * (original / (rot * 2.0 * PI)).ln()) / (2.0 * self.theta.ln());
                let (mut low, mut high) = (correction_dim(*beta_fast), correction_dim(*beta_slow));
                if *truncate {
                    (low, high) = (low.floor(), high.ceil());
                }
                let (low, high) = (low.max(0.0), high.min(dim - 1.0));
                let high = if low == high { high + 0.001 } else { high };
                let inv = base
                    .iter()
                    .enumerate()
                    .map(|(i, &extrapolation)| {
                        let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                        let extrapolation_factor = 1.0 - ramp;
                        let interpolation = extrapolation / factor;
                        interpolation * (1.0 - extrapolation_factor) + extrapolation * extrapolation_factor
                    })
                    .collect();
                (inv, attention)
            }
        }
    }
}

/// cos/sin tables for every position, and the per-batch slices of them.
#[derive(Debug, Clone)]
pub struct RotaryEmbedding {
    cos: Tensor, // (max_pos, head_dim / 2)
    sin: Tensor,
}

/// cos/sin gathered at a batch's position ids: (b, s, head_dim / 2).
#[derive(Clone)]
pub struct RopeSlice {
    cos: Tensor,
    sin: Tensor,
}

impl RotaryEmbedding {
    /// Tables for every position of the context, from the RoPE type's inverse frequencies; cos
    /// and sin are scaled by its attention factor (YaRN), as transformers does.
    pub(super) fn new(
        rope: &Rope,
        head_dim: usize,
        max_position_embeddings: usize,
        dtype: DType,
        dev: &Device,
    ) -> Result<Self> {
        let (inv, attention_factor) = rope.inv_freq(head_dim);
        let inv: Vec<f32> = inv.into_iter().map(|f| f as f32).collect();
        let n = inv.len();
        let inv = Tensor::from_vec(inv, (1, n), dev)?;
        let t = Tensor::arange(0u32, max_position_embeddings as u32, dev)?.to_dtype(DType::F32)?.reshape(((), 1))?;
        let freqs = t.broadcast_mul(&inv)?;
        let (cos, sin) = (freqs.cos()?, freqs.sin()?);
        let (cos, sin) =
            if attention_factor == 1.0 { (cos, sin) } else { ((cos * attention_factor)?, (sin * attention_factor)?) };
        Ok(Self { cos: cos.to_dtype(dtype)?, sin: sin.to_dtype(dtype)? })
    }

    pub(super) fn slice(&self, positions: &Tensor) -> Result<RopeSlice> {
        let (b, s) = positions.dims2()?;
        let flat = positions.flatten_all()?;
        let half = self.cos.dim(1)?;
        let cos = self.cos.index_select(&flat, 0)?.reshape((b, s, half))?;
        let sin = self.sin.index_select(&flat, 0)?.reshape((b, s, half))?;
        Ok(RopeSlice { cos, sin })
    }
}

impl RopeSlice {
    /// (b·s, n·d) rows → (b, n, s, d) heads, rotated when `rotate`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn heads(
        &self,
        x: &Tensor,
        b: usize,
        s: usize,
        n: usize,
        d: usize,
        rotate: bool,
        mode: Mode,
    ) -> Result<Tensor> {
        Ok(match mode {
            Mode::Train => ops::split_heads(x, b, s, n, d, rotate.then_some((&self.cos, &self.sin)))?,
            Mode::Infer => {
                let h = x.reshape((b, s, n, d))?.transpose(1, 2)?.contiguous()?;
                if rotate {
                    candle_nn::rotary_emb::rope(&h, &self.cos, &self.sin)?
                } else {
                    h
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Value) -> Result<Rope> {
        Rope::from_hf_config(&v, 10_000.0, 4096)
    }

    #[test]
    fn both_layouts_read_the_same_settings() {
        let new = parse(json!({"rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}})).unwrap();
        let old = parse(json!({"rope_theta": 100000.0})).unwrap();
        assert_eq!(new, old);
        assert_eq!(new.theta, 100000.0);
        let l3 = json!({"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
        let mut a = l3.clone();
        a["rope_type"] = json!("llama3");
        a["rope_theta"] = json!(500000.0);
        let mut b = l3;
        b["type"] = json!("llama3");
        assert_eq!(
            parse(json!({"rope_parameters": a})).unwrap(),
            parse(json!({"rope_theta": 500000.0, "rope_scaling": b})).unwrap()
        );
        assert_eq!(parse(json!({})).unwrap().theta, 10_000.0, "the family default when nothing is set");
    }

    #[test]
    fn unsupported_settings_are_refused_by_name() {
        let e = |v: Value| format!("{:#}", parse(v).unwrap_err());
        assert!(e(json!({"rope_scaling": {"rope_type": "longrope", "factor": 2.0}})).contains("longrope"));
        assert!(e(json!({"rope_parameters": {"rope_type": "linear"}})).contains("needs `factor`"));
        assert!(e(json!({"rope_parameters": {"rope_type": "default", "mrope_section": [1]}})).contains("mrope_section"));
        assert!(e(json!({"rope_parameters": {"rope_theta": -1.0}})).contains("rope_theta"));
        assert!(e(json!({"rope_parameters": {"partial_rotary_factor": 0.5}})).contains("partial_rotary_factor"));
    }

    #[test]
    fn llama3_keeps_high_and_divides_low_frequencies() {
        let r = Rope {
            theta: 500000.0,
            scaling: RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 64,
            },
        };
        let plain = Rope { theta: 500000.0, scaling: RopeScaling::Default }.inv_freq(16).0;
        let (inv, att) = r.inv_freq(16);
        assert_eq!(att, 1.0);
        assert_eq!(inv[0], plain[0], "wavelength 2π < 16: kept");
        assert!((inv[7] - plain[7] / 8.0).abs() < 1e-15, "longest wavelength: divided by the factor");
        assert!(inv.iter().zip(&plain).any(|(a, b)| a < b && *a > b / 8.0), "a smoothed band in between");
    }

    #[test]
    fn yarn_attention_factor_and_ramp() {
        let y = |attention_factor| Rope {
            theta: 10000.0,
            scaling: RopeScaling::Yarn(Yarn {
                factor: 4.0,
                original_max_position_embeddings: 32,
                beta_fast: 32.0,
                beta_slow: 1.0,
                mscale: None,
                mscale_all_dim: None,
                attention_factor,
                truncate: true,
            }),
        };
        let (inv, att) = y(None).inv_freq(16);
        assert!((att - (0.1 * 4f64.ln() + 1.0)).abs() < 1e-12);
        let plain = Rope { theta: 10000.0, scaling: RopeScaling::Default }.inv_freq(16).0;
        assert_eq!(inv[0], plain[0]);
        assert!((inv[7] - plain[7] / 4.0).abs() < 1e-15);
        assert_eq!(y(Some(1.5)).inv_freq(16).1, 1.5);
    }
}
