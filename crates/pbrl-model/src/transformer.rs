//! A trainable decoder-only transformer (Llama family, Qwen2, Qwen3), in the style of
//! `candle-transformers`: plain structs with `forward`, weights loaded by name through a
//! `VarBuilder` backed by a `VarMap`, so every weight is a `Var` that receives gradients.
//!
//! Why not `candle_transformers::models::llama`: it returns only the last position's logits, takes
//! no padding mask and uses fused kernels without a backward pass (rms_norm, softmax_last_dim,
//! rope), which silently cut the autograd graph. Here [`Mode::Train`] uses differentiable
//! versions of those ops (`super::ops`: fused CPU kernels with their backward, candle
//! compositions elsewhere) and [`Mode::Infer`] candle's fused kernels (for sampling), except
//! for attention's masked softmax and the MLP's gate, where pbrl's ops serve both modes on the
//! CPU.
use anyhow::{bail, Result};
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;

use super::config::ModelConfig;
use super::dropout::DropoutStream;
use super::kv_cache::{KvCache, LayerKv};
use super::linear::{FrozenStorage, Linear};
use super::mode::Mode;
use super::ops;
use super::required::required;
use super::rope::{RopeSlice, RotaryEmbedding};

#[derive(Debug, Clone)]
pub struct RmsNorm {
    weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    fn load(vb: &VarBuilder, dim: usize, name: &str, eps: f64) -> Result<Self> {
        Ok(Self { weight: required(&vb.pp(name), dim, "weight")?, eps })
    }

    pub fn forward(&self, x: &Tensor, mode: Mode) -> Result<Tensor> {
        Ok(match mode {
            Mode::Infer => candle_nn::ops::rms_norm(&x.contiguous()?, &self.weight, self.eps as f32)?,
            Mode::Train => ops::rms_norm(x, &self.weight, self.eps)?,
        })
    }
}

#[derive(Debug, Clone)]
struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    /// Qwen3: RMSNorm over each head of q and k, before RoPE.
    qk_norm: Option<(RmsNorm, RmsNorm)>,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
}

impl Attention {
    fn load(vb: &VarBuilder, cfg: &ModelConfig) -> Result<Self> {
        let h = cfg.hidden_size;
        let q_dim = cfg.num_attention_heads * cfg.head_dim;
        let kv_dim = cfg.num_key_value_heads * cfg.head_dim;
        let bias = cfg.qkv_bias();
        Ok(Self {
            q_proj: Linear::load(vb, h, q_dim, "q_proj", bias)?,
            k_proj: Linear::load(vb, h, kv_dim, "k_proj", bias)?,
            v_proj: Linear::load(vb, h, kv_dim, "v_proj", bias)?,
            o_proj: Linear::load(vb, q_dim, h, "o_proj", false)?,
            qk_norm: if cfg.qk_norm() {
                let (d, eps) = (cfg.head_dim, cfg.rms_norm_eps);
                Some((RmsNorm::load(vb, d, "q_norm", eps)?, RmsNorm::load(vb, d, "k_norm", eps)?))
            } else {
                None
            },
            num_heads: cfg.num_attention_heads,
            num_kv_heads: cfg.num_key_value_heads,
            head_dim: cfg.head_dim,
        })
    }

    /// x: (b·s, hidden) rows; bias: (b, 1, s, kv_len) additive mask over cached + new keys.
    #[allow(clippy::too_many_arguments)]
    fn forward(
        &self,
        x: &Tensor,
        (b, s): (usize, usize),
        rope: &RopeSlice,
        bias: &Tensor,
        cache: Option<(&mut Option<LayerKv>, usize)>,
        (mode, pass): (Mode, Option<u64>),
    ) -> Result<Tensor> {
        let (nh, nkv, hd) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let (mut q, mut k) = (self.q_proj.forward_in_pass(x, pass)?, self.k_proj.forward_in_pass(x, pass)?);
        if let Some((qn, kn)) = &self.qk_norm {
            // Rows of one head each: (b·s·n, d), normalised, back to (b·s, n·d).
            q = qn.forward(&q.reshape(((), hd))?, mode)?.reshape((b * s, nh * hd))?;
            k = kn.forward(&k.reshape(((), hd))?, mode)?.reshape((b * s, nkv * hd))?;
        }
        let q = rope.heads(&q, b, s, nh, hd, true, mode)?;
        let mut k = rope.heads(&k, b, s, nkv, hd, true, mode)?;
        let mut v = rope.heads(&self.v_proj.forward_in_pass(x, pass)?, b, s, nkv, hd, false, mode)?;
        if let Some((slot, capacity)) = cache {
            (k, v) = LayerKv::append(slot, k, v, capacity)?;
        }
        let kv_len = k.dim(2)?;
        // Grouped-query attention without copying k/v per query head: the n_rep query heads that
        // share a kv head are stacked along the query axis, (b, nkv, n_rep * s, hd).
        let n_rep = nh / nkv;
        let q = q.reshape((b, nkv, n_rep * s, hd))?;
        let scale = 1.0 / (hd as f64).sqrt();
        let scores = ops::batched_matmul(&q, &k.t()?)?.reshape((b, nh, s, kv_len))?;
        let att = match mode {
            Mode::Infer if !scores.device().is_cpu() => {
                candle_nn::ops::softmax_last_dim(&(scores * scale)?.broadcast_add(bias)?)?
            }
            _ => ops::masked_softmax(&scores, &bias.squeeze(1)?, scale)?,
        };
        let y = ops::batched_matmul(&att.reshape((b, nkv, n_rep * s, kv_len))?, &v)?; // (b, nkv, n_rep*s, hd)
        let y = match mode {
            Mode::Train => ops::merge_heads(&y.reshape((b, nh, s, hd))?)?,
            Mode::Infer => y.reshape((b, nh, s, hd))?.transpose(1, 2)?.reshape((b * s, nh * hd))?,
        };
        self.o_proj.forward_in_pass(&y, pass)
    }
}

#[derive(Debug, Clone)]
struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

impl Mlp {
    fn load(vb: &VarBuilder, cfg: &ModelConfig) -> Result<Self> {
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        Ok(Self {
            gate_proj: Linear::load(vb, h, i, "gate_proj", false)?,
            up_proj: Linear::load(vb, h, i, "up_proj", false)?,
            down_proj: Linear::load(vb, i, h, "down_proj", false)?,
        })
    }

    fn forward(&self, x: &Tensor, pass: Option<u64>) -> Result<Tensor> {
        let (gate, up) = (self.gate_proj.forward_in_pass(x, pass)?, self.up_proj.forward_in_pass(x, pass)?);
        self.down_proj.forward_in_pass(&ops::silu_mul(&gate, &up)?, pass)
    }
}

#[derive(Debug, Clone)]
struct DecoderLayer {
    self_attn: Attention,
    mlp: Mlp,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
}

impl DecoderLayer {
    fn load(vb: &VarBuilder, cfg: &ModelConfig) -> Result<Self> {
        let eps = cfg.rms_norm_eps;
        Ok(Self {
            self_attn: Attention::load(&vb.pp("self_attn"), cfg)?,
            mlp: Mlp::load(&vb.pp("mlp"), cfg)?,
            input_layernorm: RmsNorm::load(vb, cfg.hidden_size, "input_layernorm", eps)?,
            post_attention_layernorm: RmsNorm::load(vb, cfg.hidden_size, "post_attention_layernorm", eps)?,
        })
    }

    fn forward(
        &self,
        x: &Tensor,
        shape: (usize, usize),
        rope: &RopeSlice,
        bias: &Tensor,
        cache: Option<(&mut Option<LayerKv>, usize)>,
        (mode, pass): (Mode, Option<u64>),
    ) -> Result<Tensor> {
        let h = self.input_layernorm.forward(x, mode)?;
        let x = (x + self.self_attn.forward(&h, shape, rope, bias, cache, (mode, pass))?)?;
        let h = self.post_attention_layernorm.forward(&x, mode)?;
        Ok((&x + self.mlp.forward(&h, pass)?)?)
    }
}

/// The transformer backbone: embeddings, decoder layers, final norm. It maps token ids to final
/// hidden states; what reads them is a head (the LM head of a `CausalLm`, a reward model's or a
/// critic's value head).
#[derive(Debug, Clone)]
pub struct Backbone {
    pub config: ModelConfig,
    /// The activations' dtype (f32 for real models; tests also build f64 ones), whatever dtype
    /// a frozen base stores its matrices in.
    dtype: DType,
    embed_tokens: Tensor,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    rotary: RotaryEmbedding,
    /// Activation checkpointing of the decoder layers in training passes
    /// (`gradient_checkpointing`): the trained variables whose gradients the recomputation
    /// hands on (`checkpoint.rs`); `None`: every activation kept.
    pub checkpoint: Option<std::sync::Arc<Vec<Tensor>>>,
    /// The training passes' keys for the adapters' dropout (`lora::set_dropout`); `None`: no
    /// adapter drops anything.
    pub dropout: Option<std::sync::Arc<DropoutStream>>,
}

impl Backbone {
    /// Build from Hugging Face tensor names (`model.layers.N.self_attn.q_proj.weight`, ...).
    pub fn load(vb: &VarBuilder, cfg: &ModelConfig) -> Result<Self> {
        let m = vb.pp("model");
        let embed_tokens = required(&m.pp("embed_tokens"), (cfg.vocab_size, cfg.hidden_size), "weight")?;
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| DecoderLayer::load(&m.pp(format!("layers.{i}")), cfg))
            .collect::<Result<Vec<_>>>()?;
        let norm = RmsNorm::load(&m, cfg.hidden_size, "norm", cfg.rms_norm_eps)?;
        let rotary =
            RotaryEmbedding::new(&cfg.rope, cfg.head_dim, cfg.max_position_embeddings, vb.dtype(), vb.device())?;
        Ok(Self {
            config: cfg.clone(),
            dtype: vb.dtype(),
            embed_tokens,
            layers,
            norm,
            rotary,
            checkpoint: None,
            dropout: None,
        })
    }

    pub fn device(&self) -> &Device {
        self.embed_tokens.device()
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Store this frozen backbone's matrices as `storage` says: the projections by
    /// [`Linear::store_frozen`], the token embeddings in bf16 unless f32 is asked.
    pub fn store_frozen(&mut self, storage: FrozenStorage) -> Result<()> {
        if storage == FrozenStorage::F32 {
            return Ok(());
        }
        self.embed_tokens = self.embed_tokens.to_dtype(DType::BF16)?;
        for (name, proj) in self.projections_mut() {
            proj.store_frozen(storage, &name)?;
        }
        Ok(())
    }

    /// Make every projection's products take bf16 inputs ([`Linear::compute_in_bf16`]).
    pub fn compute_in_bf16(&mut self) -> Result<()> {
        for (name, proj) in self.projections_mut() {
            proj.compute_in_bf16(&name)?;
        }
        Ok(())
    }

    /// Start a training step for the adapters' dropout: its passes are keyed by `key`.
    pub fn begin_dropout_step(&self, key: u64) {
        if let Some(d) = &self.dropout {
            d.begin_step(key);
        }
    }

    /// Every projection of the decoder layers with its Hugging Face name
    /// (`model.layers.N.self_attn.q_proj`, ...), in layer order: where adapters attach.
    pub fn projections_mut(&mut self) -> Vec<(String, &mut Linear)> {
        let mut out = Vec::new();
        for (i, layer) in self.layers.iter_mut().enumerate() {
            let (a, m) = (&mut layer.self_attn, &mut layer.mlp);
            for (name, proj) in [("self_attn.q_proj", &mut a.q_proj), ("self_attn.k_proj", &mut a.k_proj)]
                .into_iter()
                .chain([("self_attn.v_proj", &mut a.v_proj), ("self_attn.o_proj", &mut a.o_proj)])
                .chain([("mlp.gate_proj", &mut m.gate_proj), ("mlp.up_proj", &mut m.up_proj)])
                .chain([("mlp.down_proj", &mut m.down_proj)])
            {
                out.push((format!("model.layers.{i}.{name}"), proj));
            }
        }
        out
    }

    pub fn new_cache(&self) -> KvCache {
        KvCache::new(self.layers.len())
    }

    /// A cache with room for `capacity` positions per row.
    pub fn new_cache_with_capacity(&self, capacity: usize) -> KvCache {
        KvCache::with_capacity(self.layers.len(), capacity)
    }

    /// ids, positions: (b, s) u32; bias: (b, 1, s, kv_len) additive mask (0 = attend).
    /// Returns the final hidden states (b, s, hidden).
    pub fn forward_hidden(
        &self,
        ids: &Tensor,
        positions: &Tensor,
        bias: &Tensor,
        cache: Option<&mut KvCache>,
        mode: Mode,
    ) -> Result<Tensor> {
        let (b, s) = ids.dims2()?;
        Ok(self.forward_rows(ids, positions, bias, cache, mode)?.reshape((b, s, self.config.hidden_size))?)
    }

    /// The final hidden states as (b·s, hidden) rows. Activations stay 2-D through every layer,
    /// so no reshape nodes enter the autograd graph.
    pub fn forward_rows(
        &self,
        ids: &Tensor,
        positions: &Tensor,
        bias: &Tensor,
        mut cache: Option<&mut KvCache>,
        mode: Mode,
    ) -> Result<Tensor> {
        let (b, s) = ids.dims2()?;
        let rope = self.rotary.slice(positions)?;
        let bias = &bias.to_dtype(self.dtype)?;
        let flat = ids.flatten_all()?;
        let mut x = self.embed_tokens.index_select(&flat, 0)?.to_dtype(self.dtype)?;
        if let (Mode::Train, Some(pad)) = (mode, self.config.pad_token_id) {
            x = ops::detach_rows_of(&x, &flat, pad)?;
        }
        // A training pass draws its adapter-dropout key here; the recomputation of a checkpointed
        // stack reuses it, so it drops what the forward pass dropped.
        let pass = match mode {
            Mode::Train => self.dropout.as_ref().map(|d| d.next_pass()),
            Mode::Infer => None,
        };
        match (&self.checkpoint, mode, cache.is_none()) {
            (Some(params), Mode::Train, true) => {
                let (layers, bias) = (self.layers.clone(), bias.clone());
                let f = move |l: usize, h: &Tensor| {
                    let train = (Mode::Train, pass);
                    layers[l].forward(h, (b, s), &rope, &bias, None, train).map_err(candle_core::Error::wrap)
                };
                x = super::checkpoint::checkpointed(&x, self.layers.len(), std::sync::Arc::new(f), params.clone())?;
            }
            _ => {
                for (i, layer) in self.layers.iter().enumerate() {
                    let slot = cache.as_deref_mut().map(|c| (&mut c.layers[i], c.capacity));
                    // Each layer's activations are freed as soon as the next layer has its output.
                    x = without_graph(layer.forward(&x, (b, s), &rope, bias, slot, (mode, pass))?, mode);
                }
            }
        }
        Ok(without_graph(self.norm.forward(&x, mode)?, mode))
    }
}

/// A model as pbrl loads it: a backbone and, for a causal LM, its LM head (tied to the
/// embeddings or its own `lm_head.weight`). Loaded as a backbone (a reward model's, a critic's)
/// it has no LM head in memory, and an untied model's `lm_head.weight` is never built. The
/// backbone's methods are the model's (`Deref`).
#[derive(Debug, Clone)]
pub struct CausalLm {
    pub backbone: Backbone,
    lm_head: Option<Linear>,
}

impl std::ops::Deref for CausalLm {
    type Target = Backbone;
    fn deref(&self) -> &Backbone {
        &self.backbone
    }
}

impl CausalLm {
    /// A causal LM: the backbone and its LM head.
    pub fn load(vb: VarBuilder, cfg: &ModelConfig) -> Result<Self> {
        let backbone = Backbone::load(&vb, cfg)?;
        let lm_head = match cfg.tie_word_embeddings {
            true => Linear::from_weight(backbone.embed_tokens.clone()),
            false => Linear::load(&vb, cfg.hidden_size, cfg.vocab_size, "lm_head", false)?,
        };
        Ok(Self { backbone, lm_head: Some(lm_head) })
    }

    /// The backbone only (embeddings, layers, final norm): no LM head, and for an untied model
    /// no `lm_head.weight` read.
    pub fn load_backbone(vb: VarBuilder, cfg: &ModelConfig) -> Result<Self> {
        Ok(Self { backbone: Backbone::load(&vb, cfg)?, lm_head: None })
    }

    /// LM head on hidden states of any leading shape.
    pub fn lm_head(&self, hidden: &Tensor) -> Result<Tensor> {
        match &self.lm_head {
            Some(head) => head.forward(hidden),
            None => bail!("this model was loaded as a backbone (a reward model's or a critic's): it has no LM head"),
        }
    }

    /// Store this frozen model's matrices as `storage` says ([`Backbone::store_frozen`]); a tied
    /// LM head keeps sharing the embeddings, an untied one is stored as a projection.
    pub fn store_frozen(&mut self, storage: FrozenStorage) -> Result<()> {
        self.backbone.store_frozen(storage)?;
        if let Some(head) = &mut self.lm_head {
            match self.backbone.config.tie_word_embeddings {
                true => *head = Linear::from_weight(self.backbone.embed_tokens.clone()),
                false => head.store_frozen(storage, "lm_head")?,
            }
        }
        Ok(())
    }

    /// Make the products of this frozen model's projections and LM head take bf16 inputs
    /// ([`Linear::compute_in_bf16`]); the token embeddings' lookup stays as it is.
    pub fn compute_in_bf16(&mut self) -> Result<()> {
        self.backbone.compute_in_bf16()?;
        if let Some(head) = &mut self.lm_head {
            head.compute_in_bf16("lm_head")?;
        }
        Ok(())
    }

    /// The same model with every adapter off: a LoRA agent's base, sharing its storage.
    pub fn without_adapters(&self) -> CausalLm {
        let mut base = self.clone();
        for (_, proj) in base.backbone.projections_mut() {
            proj.clear_lora();
        }
        base.backbone.dropout = None;
        base
    }

    /// Whether the model has its LM head (a backbone has not).
    pub fn has_lm_head(&self) -> bool {
        self.lm_head.is_some()
    }

    /// All-position logits (b, s, vocab).
    pub fn forward(
        &self,
        ids: &Tensor,
        positions: &Tensor,
        bias: &Tensor,
        cache: Option<&mut KvCache>,
        mode: Mode,
    ) -> Result<Tensor> {
        let h = self.backbone.forward_hidden(ids, positions, bias, cache, mode)?;
        Ok(without_graph(self.lm_head(&h)?, mode))
    }
}

/// In inference, `t` cut from its autograd graph: the weights are variables, so candle would
/// otherwise record every op and keep all layers' activations (attention probabilities
/// included) alive until the result is dropped. No inference result carries a graph, so
/// callers never need to detach one.
fn without_graph(t: Tensor, mode: Mode) -> Tensor {
    match mode {
        Mode::Infer => t.detach(),
        Mode::Train => t,
    }
}
