//! LoRA adapters against PEFT (scripts/fixtures/golden_lora.py): on the small random Llama of
//! tests/fixtures/tiny_llama_untied with PEFT's adapter values on q, v and down projections
//! (r 4, alpha 8, plain and rsLoRA scaling), the logits and every adapter's gradient of
//! sum(logits · probe) equal PEFT's within 1e-4; the frozen base (`LoadedModel::frozen`) gets no
//! gradient, as PEFT's gets none; a fresh adapter (B zero) leaves the model's logits unchanged.
//! Device-generic: `PBRL_TEST_DEVICE=cuda:0` runs it on a GPU.
mod common;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarMap;
use pbrl_model::batch::{PaddedBatch, Padding};
use pbrl_model::lora::{attach, load_values, LoraSpec};
use pbrl_model::weight_grads::backward;
use pbrl_model::{CausalLm, LoadedModel, Mode};

fn spec(use_rslora: bool) -> LoraSpec {
    LoraSpec {
        r: 4,
        alpha: 8.0,
        target_modules: ["q_proj", "v_proj", "down_proj"].map(String::from).to_vec(),
        use_rslora,
    }
}

/// The base model as loaded for a full fine-tune (its weights variables).
fn base() -> LoadedModel {
    let dir = common::fixtures().join("tiny_llama_untied");
    LoadedModel::load(dir.to_str().unwrap(), &common::device()).unwrap()
}

fn logits(m: &CausalLm, ids: &[Vec<u32>], mode: Mode) -> Tensor {
    let batch = PaddedBatch::new(ids, 0, Padding::Right, m.device()).unwrap();
    m.forward(&batch.ids, &batch.positions, &batch.bias, None, mode).unwrap().to_device(&Device::Cpu).unwrap()
}

#[test]
fn lora_logits_and_adapter_gradients_match_peft() {
    common::init();
    let fx = common::fixtures().join("golden_lora");
    let golden = candle_core::safetensors::load(fx.join("golden.safetensors"), &Device::Cpu).unwrap();
    let adapter = candle_core::safetensors::load(fx.join("adapter.safetensors"), &Device::Cpu).unwrap();
    let ids: Vec<Vec<u32>> = golden["ids"].to_dtype(DType::U32).unwrap().to_vec2().unwrap();
    let probe = &golden["probe"];
    for (case, rslora) in [("plain", false), ("rslora", true)] {
        let loaded = base();
        let mut m = loaded.frozen().unwrap();
        let before = logits(&loaded.model, &ids, Mode::Infer);
        let adapters = VarMap::new();
        let n = attach(&mut m.backbone, &spec(rslora), &adapters, 1).unwrap();
        assert_eq!(n, 2 * 3, "q, v, down in each of 2 layers");
        assert_eq!(
            common::max_abs_diff(&logits(&m, &ids, Mode::Infer), &before),
            0.0,
            "a fresh adapter changes nothing"
        );
        load_values(&adapters, &adapter).unwrap();
        let got = logits(&m, &ids, Mode::Train);
        let diff = common::max_abs_diff(&got, &golden[&format!("logits_{case}")]);
        assert!(diff < 1e-4, "{case}: logits differ by {diff}");
        // The logits come back to the host; the backward pass runs through that copy.
        let grads = backward(&(&got * probe).unwrap().sum_all().unwrap()).unwrap();
        for (name, var) in loaded.varmap.data().lock().unwrap().iter() {
            assert!(grads.get(var.as_tensor()).is_none(), "the frozen base's {name} got a gradient");
        }
        let vars = adapters.data().lock().unwrap();
        for (name, var) in vars.iter() {
            let want = &golden[&format!("grad_{case}.{name}")];
            common::assert_grad_close(&format!("{case} {name}"), grads.get(var.as_tensor()).unwrap(), want);
        }
    }
}

#[test]
fn lora_targets_must_name_a_projection() {
    let mut m = base();
    let bad = LoraSpec { target_modules: vec!["qproj".into()], ..spec(false) };
    let e = attach(&mut m.model.backbone, &bad, &VarMap::new(), 1).unwrap_err().to_string();
    assert!(e.contains("qproj") && e.contains("q_proj"), "{e}");
    assert!((spec(true).scaling() - 4.0).abs() < 1e-12 && (spec(false).scaling() - 2.0).abs() < 1e-12);
    // The config's list of projections (it imports nothing from the model) is the model's.
    assert_eq!(pbrl::config::LORA_PROJECTIONS, pbrl_model::lora::ALL_LINEAR);
}

/// A tiny model whose every input size is a multiple of 32 (q8_0's block), as a LoRA agent's
/// base: the tied variant stores its head with the embeddings, the untied one as a projection.
fn blockable_model(tie: bool, weights: impl Fn(&str, Tensor) -> Tensor) -> LoadedModel {
    use pbrl_model::tiny::{random_varmap, tiny_config, word_tokenizer};
    let mut cfg = tiny_config(pbrl_model::Architecture::Llama, 40, tie);
    (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim) = (64, 96, 16);
    let dev = common::device();
    let varmap = random_varmap(&cfg, 7, DType::F32, &dev).unwrap();
    for (name, var) in varmap.data().lock().unwrap().iter() {
        var.set(&weights(name, var.as_tensor().copy().unwrap())).unwrap();
    }
    let model = LoadedModel::build(&varmap, &cfg, DType::F32, &dev).unwrap();
    let tokenizer = word_tokenizer(cfg.vocab_size).unwrap();
    LoadedModel { model, varmap, tokenizer, source: "blockable".into(), files: Default::default(), lora: None }
}

/// A LoRA agent over a base stored in bf16 or q8_0 (`agent_lora.base_dtype`): its logits and
/// adapter gradients equal (1e-5 of their scale) those of the agent over an f32 base holding
/// the stored values read back (bf16 widened, q8_0 dequantized; the embeddings in bf16), so the
/// backward pass through the stored base is the right one, tied head or untied. How close the
/// stored base stays to the f32 one is checked on SmolLM2 (tests/real_model.rs): this random
/// model's large weights amplify rounding far beyond a trained model's.
#[test]
fn a_bf16_or_q8_0_base_trains_adapters_as_its_stored_values_do() {
    use candle_core::quantized::{GgmlDType, QTensor};
    use pbrl_model::linear::FrozenStorage;
    use pbrl_model::lora::LoraSpec;
    common::init();
    let spec = LoraSpec {
        r: 4,
        alpha: 8.0,
        target_modules: pbrl_model::lora::ALL_LINEAR.map(String::from).to_vec(),
        use_rslora: false,
    };
    let ids: Vec<Vec<u32>> = vec![vec![3, 9, 14, 27, 5, 8], vec![4, 11, 30, 2, 6, 39]];
    let host = |t: &Tensor| t.to_device(&Device::Cpu).unwrap();
    // The agent's logits and adapter gradients (adapters set to seeded nonzero values).
    let run = |base: LoadedModel, storage: FrozenStorage| {
        let base = base.into_frozen_base(storage).unwrap();
        let agent = LoadedModel::with_lora(&base, &spec, 3).unwrap();
        let vars = common::set_vars_random(&agent.varmap, 50, 0.3);
        let y = logits(&agent.model, &ids, Mode::Train);
        let probe = common::random_like(&y, 60);
        let grads = backward(&(&y * probe).unwrap().sum_all().unwrap()).unwrap();
        let g: Vec<(String, Tensor)> =
            vars.iter().map(|(n, v)| (n.clone(), host(grads.get(v.as_tensor()).unwrap()))).collect();
        (y, g)
    };
    let scale = |t: &Tensor| t.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
    for tie in [true, false] {
        for storage in [FrozenStorage::Bf16, FrozenStorage::Q8_0] {
            let (y, g) = run(blockable_model(tie, |_, w| w), storage);
            // The same values in f32: what the stored base holds, read back.
            let read_back = |name: &str, w: Tensor| {
                let bf16 = |w: Tensor| w.to_dtype(DType::BF16).unwrap().to_dtype(DType::F32).unwrap();
                match (storage, name) {
                    (_, n) if n.ends_with("norm.weight") => w,
                    (FrozenStorage::Q8_0, n) if n.contains("_proj") || n == "lm_head.weight" => {
                        QTensor::quantize(&w, GgmlDType::Q8_0).unwrap().dequantize(w.device()).unwrap()
                    }
                    _ => bf16(w),
                }
            };
            let (y_exact, g_exact) = run(blockable_model(tie, read_back), FrozenStorage::F32);
            let case = format!("{storage:?} tied={tie}");
            let d = common::max_abs_diff(&y, &y_exact);
            assert!(d <= 1e-5 * scale(&y_exact), "{case}: logits differ from the stored values' by {d}");
            for ((name, got), (_, exact)) in g.iter().zip(&g_exact) {
                let d = common::max_abs_diff(got, exact);
                assert!(d <= 1e-5 * scale(exact), "{case} {name}: gradient differs from the stored values' by {d}");
            }
        }
    }
}
