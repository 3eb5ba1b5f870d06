//! The real SmolLM2-135M-Instruct GGUF against transformers loading the same file
//! (fixtures from scripts/golden_reference.py): tokenizer ids, chat template, logits, greedy ids.
mod common;

use candle_core::{Device, IndexOp, Tensor};
use pbrl::model::batch::{PaddedBatch, Padding};
use pbrl::model::sampling::{greedy, sample, SampleRequest, SamplingParams};
use pbrl::model::{LoadedModel, Mode};
use serde_json::Value;

fn golden() -> Value {
    serde_json::from_str(&std::fs::read_to_string(common::fixtures().join("smollm2_golden.json")).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn load() -> LoadedModel {
    common::init();
    LoadedModel::load(common::smollm2().to_str().unwrap(), &Device::Cpu).unwrap()
}

#[test]
fn smollm2_tokenizer_chat_template_logits_and_greedy_match_transformers() {
    let m = load();
    let g = golden();
    let tok = &m.tokenizer;

    for (text, want) in g["tokenizer_ids"].as_object().unwrap() {
        assert_eq!(tok.encode(text).unwrap(), ids(want), "token ids of {text:?}");
    }
    let user = g["user_prompt"].as_str().unwrap();
    assert_eq!(tok.format_prompt(true, None, user).unwrap(), g["chat_prompt"].as_str().unwrap());
    assert_eq!(
        tok.format_prompt(true, Some("You are brief."), user).unwrap(),
        g["chat_prompt_with_system"].as_str().unwrap()
    );
    assert_eq!(tok.stop_ids[0], 2, "<|im_end|> stops generation");
    assert_ne!(tok.pad_id, 2, "padding is not the stop token");

    let prompt = ids(&g["prompt_ids"]);
    assert_eq!(tok.encode(g["chat_prompt"].as_str().unwrap()).unwrap(), prompt);
    let fx =
        candle_core::safetensors::load(common::fixtures().join("smollm2_logits.safetensors"), &Device::Cpu).unwrap();
    let batch = PaddedBatch::new(std::slice::from_ref(&prompt), tok.pad_id, Padding::Right, &Device::Cpu).unwrap();
    for mode in [Mode::Train, Mode::Infer] {
        let logits = m.model.forward(&batch.ids, &batch.positions, &batch.bias, None, mode).unwrap().i(0).unwrap();
        let idx: Vec<u32> = (0..logits.dim(1).unwrap() as u32).step_by(7).collect();
        let sub = logits.index_select(&Tensor::new(idx.as_slice(), &Device::Cpu).unwrap(), 1).unwrap();
        let d1 = common::max_abs_diff(&sub, &fx["logits_every7"]);
        let d2 = common::max_abs_diff(&logits.i(prompt.len() - 1).unwrap(), &fx["last_row"]);
        eprintln!("{mode:?}: max |logit - transformers| = {d1:.2e} (every 7th column), {d2:.2e} (last row)");
        assert!(d1 < 1e-3 && d2 < 1e-3, "{mode:?}: logits differ from transformers by {d1} / {d2}");
    }

    let want = ids(&g["greedy_ids"]);
    assert_eq!(greedy(&m.model, &prompt, want.len(), &tok.stop_ids).unwrap(), want);
    let params = SamplingParams { temperature: 0.0, top_p: 1.0, top_k: None, max_new_tokens: want.len() };
    let batched =
        sample(&m.model, &[SampleRequest { prompt, seed: 0 }], &params, &tok.stop_ids, tok.pad_id, |_| {}).unwrap();
    assert_eq!(batched[0], want);
    assert_eq!(tok.decode(&want).unwrap(), g["greedy_text"].as_str().unwrap());
}
