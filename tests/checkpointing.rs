//! Activation checkpointing (`gradient_checkpointing`): the recomputed backward pass gives the
//! plain graph's loss and gradients, for a full fine-tune (every weight, the tied embeddings
//! included) and for LoRA adapters (whose frozen embeddings leave the layers' input outside
//! the graph); and `train-madpo` trains the same agents with it.
mod common;

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use pbrl::model::batch::{PaddedBatch, Padding};
use pbrl::model::checkpoint::take_weight_grads;
use pbrl::model::linear::FrozenStorage;
use pbrl::model::lora::{LoraSpec, ALL_LINEAR};
use pbrl::model::tiny::tiny_model;
use pbrl::model::{Architecture, CausalLm, LoadedModel, Mode};

/// The loss Σ logits · probe of `m`, and the gradient of each of `vars`.
fn loss_and_grads(m: &CausalLm, vars: &[(String, Tensor)]) -> (f64, Vec<(String, Tensor)>) {
    let ids: Vec<Vec<u32>> = vec![vec![3, 9, 14, 27, 5, 8], vec![4, 11, 30, 2]];
    let batch = PaddedBatch::new(&ids, 0, Padding::Right, &Device::Cpu).unwrap();
    let y = m.forward(&batch.ids, &batch.positions, &batch.bias, None, Mode::Train).unwrap();
    let loss = (&y * common::random_like(&y, 5)).unwrap().sum_all().unwrap();
    let mut grads = loss.backward().unwrap();
    take_weight_grads(&mut grads).unwrap();
    let value = loss.to_dtype(DType::F64).unwrap().to_scalar::<f64>().unwrap();
    (value, vars.iter().map(|(n, v)| (n.clone(), grads.get(v).expect(n).clone())).collect())
}

#[test]
fn checkpointed_layers_give_the_plain_gradients() {
    common::init();
    let full = tiny_model(Architecture::Llama, true, 7, DType::F32).unwrap();
    let spec = LoraSpec { r: 4, alpha: 8.0, target_modules: ALL_LINEAR.map(String::from).to_vec(), use_rslora: false };
    let base = tiny_model(Architecture::Qwen2, false, 8, DType::F32).unwrap().into_frozen_base(FrozenStorage::F32);
    let lora = LoadedModel::with_lora(&base.unwrap(), &spec, 3).unwrap();
    common::set_vars_random(&lora.varmap, 11, 0.3);
    for (case, model) in [("full fine-tune", full), ("LoRA", lora)] {
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

/// `train-madpo`, `fit-rm` and `train-marlhf` with `gradient_checkpointing = true` save the
/// models they save without (the same updates up to the order of the gradients' sums).
#[test]
fn training_stages_with_checkpointed_layers_train_the_same_models() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    tiny_model(Architecture::Llama, true, 31, DType::F32).unwrap().save_hf_dir(&d.join("tiny"), None).unwrap();
    let items: String = (0..4).map(|i| format!("{{\"prompt\": \"w{i} w{} w7\"}}\n", i + 3)).collect();
    std::fs::write(d.join("train.jsonl"), items).unwrap();
    let cfg = format!(
        "agent_model = \"{}\"\nrun_dir = \"run\"\nseed = 3\nmax_new_tokens = 6\ntemperature = 1.0\ntop_p = 1.0\n\
         preference_num_candidates = 4\npreference_pairs_per_sample = 2\nagent_learning_rate = 1e-3\ntrain_batch_size = 2\n\
         num_train_epochs = 2\neval_interval = 0\n\
         [task]\ntrain_file = \"train.jsonl\"\nformatters = [\"{{prompt}}\", \"{{prompt}} w9\"]\nchat_template = false\n",
        d.join("tiny").display()
    );
    std::fs::write(d.join("c.toml"), cfg).unwrap();
    common::ok(common::pbrl(&["collect", "--config", "c.toml"], d));
    std::fs::create_dir_all(d.join("ck/preference_replay")).unwrap();
    let round = "preference_replay/iteration_0001.json";
    std::fs::copy(d.join("run").join(round), d.join("ck").join(round)).unwrap();
    common::ok(common::pbrl(&["train-madpo", "--config", "c.toml"], d));
    common::ok(common::pbrl(
        &["train-madpo", "--config", "c.toml", "--run-dir", "ck", "gradient_checkpointing=true"],
        d,
    ));
    for i in 0..2 {
        let file = format!("agents/agent_{i}/model.safetensors");
        let plain = candle_core::safetensors::load(d.join("run").join(&file), &Device::Cpu).unwrap();
        let ck = candle_core::safetensors::load(d.join("ck").join(&file), &Device::Cpu).unwrap();
        for (name, t) in &plain {
            let diff = common::max_abs_diff(t, &ck[name]);
            assert!(diff < 1e-5, "agent {i} {name}: {diff}");
        }
    }
    let (a, b) =
        (common::metric_values(&d.join("run"), "madpo/loss"), common::metric_values(&d.join("ck"), "madpo/loss"));
    assert_eq!(a.len(), b.len());
    assert!(a.iter().zip(&b).all(|(x, y)| (x - y).abs() < 1e-6), "{a:?} against {b:?}");
    // fit-rm (the whole backbone trains) and train-marlhf (MAGRPO) the same way.
    for stage in ["fit-rm", "train-marlhf"] {
        common::ok(common::pbrl(&[stage, "--config", "c.toml"], d));
        common::ok(common::pbrl(&[stage, "--config", "c.toml", "--run-dir", "ck", "gradient_checkpointing=true"], d));
    }
    for file in ["reward_model/backbone/model.safetensors", "agents/agent_1/model.safetensors"] {
        let plain = candle_core::safetensors::load(d.join("run").join(file), &Device::Cpu).unwrap();
        let ck = candle_core::safetensors::load(d.join("ck").join(file), &Device::Cpu).unwrap();
        for (name, t) in &plain {
            let diff = common::max_abs_diff(t, &ck[name]);
            assert!(diff < 1e-5, "{file} {name}: {diff}");
        }
    }
}
