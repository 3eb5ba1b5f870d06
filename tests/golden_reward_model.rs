//! The joint reward model against CoMLRL 1.4.3's own code (scripts/fixtures/golden_reward_model.py): the
//! same backbones, head weights and pairs; scores and the Bradley–Terry loss within 1e-5 and
//! every parameter's gradient within 1e-4 of its tensor's largest entry, for a Llama and a Qwen2
//! backbone, right- and left-padded in the reference (pbrl pads right; the last real token is
//! pooled either way), one case truncated by `reward_max_length`; and the scores after one AdamW
//! step of the reference's own loop. On `PBRL_TEST_DEVICE` (default cpu).
mod common;

use candle_core::{DType, Device, Tensor};
use pbrl::algo::bradley_terry::bradley_terry_loss;
use pbrl::reward_model::{JointRewardModel, JointRow};
use pbrl::train::optim::{AdamW, AdamWConfig};
use pbrl_model::weight_grads::backward;
use pbrl_model::{LoadedModel, Mode};
use serde_json::Value;

fn golden() -> (std::path::PathBuf, Value) {
    let dir = common::fixtures().join("golden_reward_model");
    let g = serde_json::from_str(&std::fs::read_to_string(dir.join("golden.json")).unwrap()).unwrap();
    (dir, g)
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_string()).collect()
}

/// The case's reward model and its winner, loser token rows.
fn setup(case: &Value, pairs: &[Value]) -> (JointRewardModel, Vec<JointRow>) {
    let dev = common::device();
    let backbone = common::fixtures().join("golden_madpo").join(case["backbone"].as_str().unwrap());
    let model = LoadedModel::load(backbone.to_str().unwrap(), &dev).unwrap();
    let max_length = case["max_length"].as_u64().map_or(model.model.config.context_length(), |m| m as usize);
    let w: Vec<f32> = case["head_weight"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
    let hidden = w.len();
    let b = case["head_bias"][0].as_f64().unwrap() as f32;
    let rm = JointRewardModel::with_head(
        model,
        2,
        max_length,
        Tensor::from_vec(w, (1, hidden), &dev).unwrap(),
        Tensor::new(&[b], &dev).unwrap(),
    )
    .unwrap();
    let text = |p: &Value, side: &str| rm.text(&strings(&p["prompts"]), &strings(&p[side]));
    assert_eq!(text(&pairs[0], "winner_completions"), case["joint_texts"][0].as_str().unwrap(), "the joint text");
    let rows: Vec<JointRow> = ["winner_completions", "loser_completions"]
        .iter()
        .flat_map(|side| {
            pairs.iter().map(|p| rm.encode(&strings(&p["prompts"]), &strings(&p[side])).unwrap()).collect::<Vec<_>>()
        })
        .collect();
    (rm, rows)
}

fn close(got: &[f64], want: &Value, tol: f64, what: &str) {
    let want: Vec<f64> = want.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!((g - w).abs() < tol, "{what}[{i}]: {g} vs CoMLRL {w}");
    }
}

#[test]
fn bradley_terry_scores_losses_and_gradients_match_comlrl() {
    common::init();
    let (dir, g) = golden();
    let pairs = g["pairs"].as_array().unwrap().clone();
    let n = pairs.len();
    let want_grads = candle_core::safetensors::load(dir.join("grads.safetensors"), &Device::Cpu).unwrap();
    for (name, case) in g["cases"].as_object().unwrap() {
        let (rm, rows) = setup(case, &pairs);
        if case["max_length"].is_u64() {
            let cut = case["max_length"].as_u64().unwrap() as usize;
            assert!(
                rows.iter().all(|r| r.ids.len() <= cut) && rows.iter().any(|r| r.ids.len() == cut),
                "{name}: truncated"
            );
        }
        // Winners and losers in two forward passes, as the reference scores them, and in one
        // pass over each pair packed on its common prefix, as `fit-rm` does.
        let pairs_of_rows: Vec<(&JointRow, &JointRow)> = (0..n).map(|i| (&rows[i], &rows[n + i])).collect();
        for packed in [true, false] {
            let label = &format!("{name}{}", if packed { " (packed pairs)" } else { "" });
            let (w, l) = match packed {
                true => rm.score_pairs(&pairs_of_rows, Mode::Train).unwrap(),
                false => {
                    (rm.score_rows(&rows[..n], Mode::Train).unwrap(), rm.score_rows(&rows[n..], Mode::Train).unwrap())
                }
            };
            let values = |t: &Tensor| -> Vec<f64> { t.to_dtype(DType::F64).unwrap().to_vec1().unwrap() };
            close(&values(&w), &case["winner_scores"], 1e-5, &format!("{label} winner scores"));
            close(&values(&l), &case["loser_scores"], 1e-5, &format!("{label} loser scores"));
            let loss = bradley_terry_loss(&w, &l).unwrap();
            let got = loss.to_dtype(DType::F64).unwrap().to_scalar::<f64>().unwrap();
            let want = case["loss"].as_f64().unwrap();
            assert!((got - want).abs() < 1e-5, "{label}: loss {got} vs CoMLRL {want}");
            let grads = backward(&loss).unwrap();
            let (mut checked, mut worst) = (0, 0f64);
            for (param, var) in rm.trainable(false) {
                let key = format!("{name}/{param}");
                let shown = format!("{label}/{param}");
                let Some(want) = want_grads.get(&key) else {
                    assert!(param == "lm_head.weight", "{key}: no reference gradient");
                    continue;
                };
                let got = grads.get(var.as_tensor()).unwrap_or_else(|| panic!("{shown}: no gradient"));
                if param == "reward_head.bias" {
                    // s_w − s_l does not depend on the bias: its gradient is exactly 0 in both.
                    let diff = common::max_abs_diff(&got.to_device(&Device::Cpu).unwrap(), want);
                    assert!(
                        diff == 0.0 && want.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap() == 0.0,
                        "{shown}"
                    );
                } else {
                    worst = worst.max(common::assert_grad_close(&shown, got, want));
                }
                checked += 1;
            }
            let expected = want_grads.keys().filter(|k| k.starts_with(&format!("{name}/"))).count();
            assert_eq!(checked, expected, "{label}: every reference gradient compared");
            eprintln!("{label}: loss {got:.7} (CoMLRL {want:.7}), {checked} gradients, worst {worst:.1e}");

            if let (false, Some(after)) = (packed, case.get("after_step_winner_scores")) {
                // One AdamW step (PyTorch defaults, the reference's lr) on that loss.
                let mut opt =
                    AdamW::new(rm.trainable(false), AdamWConfig::torch_defaults(g["lr"].as_f64().unwrap())).unwrap();
                opt.step(&grads).unwrap();
                let s: Vec<f64> =
                    rm.score_rows(&rows[..n], Mode::Infer).unwrap().to_dtype(DType::F64).unwrap().to_vec1().unwrap();
                close(&s, after, 1e-5, &format!("{name} winner scores after one AdamW step"));
            }
        }
    }
}

#[test]
fn a_frozen_backbone_trains_the_head_only_with_the_same_head_gradients() {
    common::init();
    let (_, g) = golden();
    let pairs = g["pairs"].as_array().unwrap().clone();
    let n = pairs.len();
    let case = &g["cases"]["llama_right"];
    let (rm, rows) = setup(case, &pairs);
    let trainable: Vec<String> = rm.trainable(true).into_iter().map(|(k, _)| k).collect();
    assert_eq!(trainable, vec!["reward_head.bias".to_string(), "reward_head.weight".to_string()]);
    let w = rm.score_rows(&rows[..n], Mode::Infer).unwrap();
    let l = rm.score_rows(&rows[n..], Mode::Infer).unwrap();
    let values: Vec<f64> = w.to_dtype(DType::F64).unwrap().to_vec1().unwrap();
    close(&values, &case["winner_scores"], 1e-5, "frozen winner scores");
    let loss = bradley_terry_loss(&w, &l).unwrap();
    let grads = backward(&loss).unwrap();
    let (dir, _) = golden();
    let want_grads = candle_core::safetensors::load(dir.join("grads.safetensors"), &Device::Cpu).unwrap();
    for (param, var) in rm.trainable(false) {
        let got = grads.get(var.as_tensor());
        if param.starts_with("reward_head.") {
            let want = &want_grads[&format!("llama_right/{param}")];
            let got = got.unwrap().to_device(&Device::Cpu).unwrap();
            assert!(common::max_abs_diff(&got, want) < 1e-6, "{param}");
        } else {
            assert!(got.is_none(), "{param}: the frozen backbone gets no gradient");
        }
    }
}
