//! Every supported architecture against transformers: small random Llama and Qwen2 models saved
//! by scripts/fixtures/golden_reference.py (GQA, Qwen2 q/k/v bias, tied and untied heads), with their
//! logits and completion log-probs for a right-padded batch. On `PBRL_TEST_DEVICE` (default cpu).
mod common;

use candle_core::IndexOp;
use pbrl_model::batch::{PaddedBatch, Padding};
use pbrl_model::scoring::{sequence_log_probs, LastToken, ScoreRow};
use pbrl_model::{Architecture, LoadedModel, Mode};
use serde_json::Value;

fn check(name: &str, arch: Architecture, tied: bool) {
    common::init();
    let dir = common::fixtures().join(format!("tiny_{name}"));
    let golden: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("golden.json")).unwrap()).unwrap();
    let dev = common::device();
    let m = LoadedModel::load(dir.to_str().unwrap(), &dev).unwrap();
    assert_eq!(m.model.config.architecture, arch);
    assert_eq!(m.model.config.tie_word_embeddings, tied);
    let ids = |v: &Value| -> Vec<u32> { v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect() };
    let rows: Vec<ScoreRow> = golden["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| ScoreRow { prompt: ids(&r["prompt"]), completion: ids(&r["completion"]) })
        .collect();
    let seqs: Vec<Vec<u32>> = rows.iter().map(|r| [r.prompt.clone(), r.completion.clone()].concat()).collect();
    let batch = PaddedBatch::new(&seqs, 0, Padding::Right, &dev).unwrap();
    for mode in [Mode::Train, Mode::Infer] {
        let logits = m.model.forward(&batch.ids, &batch.positions, &batch.bias, None, mode).unwrap();
        let mut worst = 0f64;
        for (b, s) in seqs.iter().enumerate() {
            let got: Vec<Vec<f32>> = logits.i(b).unwrap().narrow(0, 0, s.len()).unwrap().to_vec2().unwrap();
            for (t, row) in golden["logits"][b].as_array().unwrap().iter().enumerate() {
                for (v, want) in row.as_array().unwrap().iter().enumerate() {
                    worst = worst.max((got[t][v] as f64 - want.as_f64().unwrap()).abs());
                }
            }
        }
        assert!(worst < 1e-4, "{name} {mode:?}: logits max abs diff {worst}");
    }
    for (last, key) in
        [(LastToken::Include, "seq_logprob_include_last"), (LastToken::Exclude, "seq_logprob_exclude_last")]
    {
        let got: Vec<f32> = sequence_log_probs(&m.model, &rows, last, 0, Mode::Train).unwrap().to_vec1().unwrap();
        for (g, w) in got.iter().zip(golden[key].as_array().unwrap()) {
            let w = w.as_f64().unwrap();
            assert!((*g as f64 - w).abs() < 1e-4, "{name} {key}: {g} vs {w}");
        }
    }
}

#[test]
fn llama_tied_matches_transformers() {
    check("llama_tied", Architecture::Llama, true);
}

#[test]
fn llama_untied_matches_transformers() {
    check("llama_untied", Architecture::Llama, false);
}

#[test]
fn qwen2_untied_with_qkv_bias_matches_transformers() {
    check("qwen2_untied", Architecture::Qwen2, false);
}

#[test]
fn qwen2_tied_matches_transformers() {
    check("qwen2_tied", Architecture::Qwen2, true);
}
