//! Activation checkpointing (`gradient_checkpointing`): the recomputed backward pass gives the
//! plain graph's loss and gradients, for a full fine-tune (every weight, the tied embeddings
//! included) and for LoRA adapters (whose frozen embeddings leave the layers' input outside
//! the graph), also with adapter dropout (the recomputation drops what the forward dropped).
//! The stages with it: `tests/train_madpo.rs`.
mod common;

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use pbrl_model::batch::{PaddedBatch, Padding};
use pbrl_model::linear::FrozenStorage;
use pbrl_model::lora::{LoraSpec, ALL_LINEAR};
use pbrl_model::tiny::tiny_model;
use pbrl_model::{Architecture, CausalLm, LoadedModel, Mode};

/// The loss Σ logits · probe of `m`, and the gradient of each of `vars`.
fn loss_and_grads(m: &CausalLm, vars: &[(String, Tensor)]) -> (f64, Vec<(String, Tensor)>) {
    m.begin_dropout_step(1);
    let ids: Vec<Vec<u32>> = vec![vec![3, 9, 14, 27, 5, 8], vec![4, 11, 30, 2]];
    let batch = PaddedBatch::new(&ids, 0, Padding::Right, &Device::Cpu).unwrap();
    let y = m.forward(&batch.ids, &batch.positions, &batch.bias, None, Mode::Train).unwrap();
    let loss = (&y * common::random_like(&y, 5)).unwrap().sum_all().unwrap();
    let grads = pbrl_model::weight_grads::backward(&loss).unwrap();
    let value = loss.to_dtype(DType::F64).unwrap().to_scalar::<f64>().unwrap();
    (value, vars.iter().map(|(n, v)| (n.clone(), grads.get(v).expect(n).clone())).collect())
}

#[test]
fn checkpointed_layers_give_the_plain_gradients() {
    common::init();
    let full = tiny_model(Architecture::Llama, true, 7, DType::F32).unwrap();
    let spec = LoraSpec { r: 4, alpha: 8.0, target_modules: ALL_LINEAR.map(String::from).to_vec(), use_rslora: false };
    let base = tiny_model(Architecture::Qwen2, false, 8, DType::F32).unwrap().into_frozen_base(FrozenStorage::F32);
    let base = base.unwrap();
    let lora = LoadedModel::with_lora(&base, &spec, 3).unwrap();
    common::set_vars_random(&lora.varmap, 11, 0.3);
    let mut dropped = LoadedModel::with_lora(&base, &spec, 3).unwrap();
    common::set_vars_random(&dropped.varmap, 11, 0.3);
    dropped.set_lora_dropout(0.3).unwrap();
    let no_dropout_loss = loss_and_grads(&lora.model, &[]).0;
    assert_ne!(loss_and_grads(&dropped.model, &[]).0, no_dropout_loss, "dropout acts in a training pass");
    let infer = |m: &CausalLm| {
        let batch = PaddedBatch::new(&[vec![3, 9, 14, 27]], 0, Padding::Right, &Device::Cpu).unwrap();
        m.forward(&batch.ids, &batch.positions, &batch.bias, None, Mode::Infer).unwrap()
    };
    assert_eq!(common::max_abs_diff(&infer(&dropped.model), &infer(&lora.model)), 0.0, "and in no inference pass");
    for (case, model) in [("full fine-tune", full), ("LoRA", lora), ("LoRA with dropout", dropped)] {
        let mut vars: Vec<(String, Tensor)> =
            model.varmap.data().lock().unwrap().iter().map(|(n, v)| (n.clone(), v.as_tensor().clone())).collect();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        let mut checkpointed = model.model.clone();
        checkpointed.backbone.checkpoint = Some(Arc::new(vars.iter().map(|(_, t)| t.clone()).collect()));
        let (plain_loss, plain) = loss_and_grads(&model.model, &vars);
        let (loss, grads) = loss_and_grads(&checkpointed, &vars);
        assert_eq!(loss, plain_loss, "{case}: the recomputed forward is the forward");
        for ((name, g), (_, want)) in grads.iter().zip(&plain) {
            let scale = want.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap().max(1e-6);
            let diff = common::max_abs_diff(g, want);
            assert!(diff <= 1e-5 * scale, "{case} {name}: gradient off by {diff} (scale {scale})");
        }
    }
}

/// The stack hands its weights' gradients to the training pass's store, so a plain
/// `Tensor::backward` through it (which has none) is an error, not gradients silently missing.
#[test]
fn a_plain_backward_through_checkpointed_layers_is_refused() {
    common::init();
    let model = tiny_model(Architecture::Llama, true, 7, DType::F32).unwrap();
    let vars: Vec<Tensor> = model.varmap.data().lock().unwrap().values().map(|v| v.as_tensor().clone()).collect();
    let mut checkpointed = model.model.clone();
    checkpointed.backbone.checkpoint = Some(Arc::new(vars));
    let batch = PaddedBatch::new(&[vec![3, 9, 14]], 0, Padding::Right, &Device::Cpu).unwrap();
    let y = checkpointed.forward(&batch.ids, &batch.positions, &batch.bias, None, Mode::Train).unwrap();
    let err = y.sum_all().unwrap().backward().unwrap_err().to_string();
    assert!(err.contains("weight_grads::backward"), "{err}");
}
