//! LoRA adapters against PEFT (scripts/fixtures/golden_lora.py): on the small random Llama of
//! tests/fixtures/tiny_llama_untied with PEFT's adapter values on q, v and down projections
//! (r 4, alpha 8, plain and rsLoRA scaling), the logits and every adapter's gradient of
//! sum(logits · probe) equal PEFT's within 1e-4; the frozen base (`LoadedModel::frozen`) gets no
//! gradient, as PEFT's gets none; a fresh adapter (B zero) leaves the model's logits unchanged.
mod common;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarMap;
use pbrl::model::batch::{PaddedBatch, Padding};
use pbrl::model::lora::{attach, load_values, LoraSpec};
use pbrl::model::{CausalLm, LoadedModel, Mode};

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
    LoadedModel::load(dir.to_str().unwrap(), &Device::Cpu).unwrap()
}

fn logits(m: &CausalLm, ids: &[Vec<u32>], mode: Mode) -> Tensor {
    let batch = PaddedBatch::new(ids, 0, Padding::Right, &Device::Cpu).unwrap();
    m.forward(&batch.ids, &batch.positions, &batch.bias, None, mode).unwrap()
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
        let grads = (&got * probe).unwrap().sum_all().unwrap().backward().unwrap();
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
    assert_eq!(pbrl::config::LORA_PROJECTIONS, pbrl::model::lora::ALL_LINEAR);
}
