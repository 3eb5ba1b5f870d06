//! Tiny random models with a word-level tokenizer, for unit tests and benchmarks that must not
//! depend on downloaded weights. Initialised from a seeded ChaCha stream (candle's CPU RNG
//! cannot be seeded), so they are reproducible.
use std::collections::HashMap;

use anyhow::{anyhow, Result};
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::VarMap;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;

use super::config::{Architecture, ModelConfig};
use super::rope::{Rope, RopeScaling};
use super::tokenizer::{ChatTokenizer, SpecialTokens};
use super::LoadedModel;

/// 2 layers, GQA (4 query heads over 2 kv heads), a vocabulary of `vocab` words.
pub fn tiny_config(architecture: Architecture, vocab: usize, tie: bool) -> ModelConfig {
    ModelConfig {
        architecture,
        hidden_size: 32,
        intermediate_size: 48,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 8,
        vocab_size: vocab,
        rms_norm_eps: 1e-5,
        rope: Rope { theta: 10_000.0, scaling: RopeScaling::Default },
        max_position_embeddings: 256,
        sliding_window: None,
        tie_word_embeddings: tie,
        bos_token_id: None,
        eos_token_ids: vec![1],
        pad_token_id: None,
    }
}

/// Random weights (norm weights near 1, matrices ~ N(0, 0.3²)) as `Var`s of `dtype`.
pub fn random_varmap(cfg: &ModelConfig, seed: u64, dtype: DType, dev: &Device) -> Result<VarMap> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let varmap = VarMap::new();
    {
        let mut data = varmap.data().lock().expect("fresh VarMap lock");
        for (name, shape) in cfg.weight_shapes() {
            let n: usize = shape.iter().product();
            let is_norm = name.ends_with("norm.weight");
            let vals: Vec<f64> = (0..n)
                .map(|_| {
                    // Sum of uniforms: cheap, bell-shaped, seeded.
                    let g: f64 = (0..4).map(|_| rng.random::<f64>() - 0.5).sum::<f64>() * 0.6;
                    if is_norm {
                        1.0 + 0.2 * g
                    } else {
                        g
                    }
                })
                .collect();
            let t = Tensor::from_vec(vals, shape, dev)?.to_dtype(dtype)?;
            data.insert(name, Var::from_tensor(&t)?);
        }
    }
    Ok(varmap)
}

/// A word-level tokenizer over `<pad> <eos> <unk> w0 w1 ...` (whitespace-separated words).
pub fn word_tokenizer(vocab: usize) -> Result<ChatTokenizer> {
    let mut words: HashMap<String, u32> = HashMap::new();
    words.insert("<pad>".into(), 0);
    words.insert("<eos>".into(), 1);
    words.insert("<unk>".into(), 2);
    for i in 3..vocab {
        words.insert(format!("w{}", i - 3), i as u32);
    }
    let j = json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [
            {"id": 0, "content": "<pad>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
            {"id": 1, "content": "<eos>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
        ],
        "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": words, "unk_token": "<unk>"}
    });
    let tok = tokenizers::Tokenizer::from_bytes(serde_json::to_vec(&j)?).map_err(|e| anyhow!("{e}"))?;
    let special = SpecialTokens { eos: Some("<eos>".into()), pad: Some("<pad>".into()), ..Default::default() };
    let mut t = ChatTokenizer::new(tok, None, special, &[1])?;
    t.pad_id = 0;
    Ok(t)
}

/// A complete tiny model (f32 unless `dtype` says otherwise) with its tokenizer.
pub fn tiny_model(architecture: Architecture, tie: bool, seed: u64, dtype: DType) -> Result<LoadedModel> {
    let dev = Device::Cpu;
    let cfg = tiny_config(architecture, 40, tie);
    let varmap = random_varmap(&cfg, seed, dtype, &dev)?;
    let model = LoadedModel::build(&varmap, &cfg, dtype, &dev)?;
    let tokenizer = word_tokenizer(cfg.vocab_size)?;
    Ok(LoadedModel { model, varmap, tokenizer, source: format!("tiny:{seed}"), files: Default::default(), lora: None })
}
