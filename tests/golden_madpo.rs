//! MADPO against CoMLRL 1.4.3's own loss code (scripts/fixtures/golden_madpo.py): the same two small
//! models and pair batches, per-agent losses within 1e-5 and every parameter's gradient within
//! 1e-4 of its tensor's largest entry, for the decentralized scorer (last token left out) and the
//! centralized joint scorer (every token, end-of-turn included). On `PBRL_TEST_DEVICE` (default cpu).
mod common;

use candle_core::{DType, Device};
use pbrl::algo::madpo::other_margins;
use pbrl::prefs::PreferencePair;
use pbrl::train::madpo_batch::{agent_objective, agent_rows, batch_margins, margin_values};
use pbrl_model::scoring::LastToken;
use pbrl_model::weight_grads::backward;
use pbrl_model::LoadedModel;
use serde_json::Value;

fn check(scorer: &str, last: LastToken) {
    common::init();
    let dir = common::fixtures().join("golden_madpo");
    let golden: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("golden.json")).unwrap()).unwrap();
    let case = &golden["scorers"][scorer];
    let beta = golden["dpo_beta"].as_f64().unwrap();
    let max_new = golden["max_new_tokens"].as_u64().unwrap() as usize;
    let want_grads = candle_core::safetensors::load(dir.join("grads.safetensors"), &Device::Cpu).unwrap();
    let pairs: Vec<PreferencePair> = case["pairs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let mut v = p.clone();
            for (k, x) in [("winner_reward", 1.0), ("loser_reward", 0.0), ("candidate_reward_mean", 0.5)] {
                v[k] = x.into();
            }
            serde_json::from_value(v).unwrap()
        })
        .collect();
    let actors = pairs[0].prompts.len();
    let dev = common::device();
    let models: Vec<LoadedModel> = (0..actors)
        .map(|i| LoadedModel::load(dir.join(format!("agent_{i}")).to_str().unwrap(), &dev).unwrap())
        .collect();
    let model_refs: Vec<&LoadedModel> = models.iter().collect();
    let batch: Vec<&PreferencePair> = pairs.iter().collect();
    let rows: Vec<_> =
        models.iter().enumerate().map(|(i, m)| agent_rows(&m.tokenizer, i, &batch, max_new, last).unwrap()).collect();

    let margins = batch_margins(&model_refs, &rows, last).unwrap();
    let fixed = margin_values(&margins).unwrap();
    for (p, want) in case["margins"].as_array().unwrap().iter().enumerate() {
        for (i, w) in want.as_array().unwrap().iter().enumerate() {
            let w = w.as_f64().unwrap();
            assert!((fixed[i][p] - w).abs() < 1e-4, "{scorer}: margin of pair {p} agent {i}: {} vs {w}", fixed[i][p]);
        }
    }
    let others = other_margins(&fixed);
    for (i, m) in models.iter().enumerate() {
        let loss = agent_objective(&margins[i], &others[i], beta).unwrap();
        let got = loss.to_dtype(DType::F64).unwrap().to_scalar::<f64>().unwrap();
        let want = case["losses"][i].as_f64().unwrap();
        assert!((got - want).abs() < 1e-5, "{scorer}: loss of agent {i}: {got} vs {want}");
        let grads = backward(&loss).unwrap();
        let vars = m.varmap.data().lock().unwrap();
        let (mut checked, mut worst) = (0, 0f64);
        for (name, var) in vars.iter() {
            let key = format!("{scorer}/agent_{i}/{name}");
            let Some(want) = want_grads.get(&key) else {
                // A tied head has no lm_head.weight of its own in PyTorch either.
                assert!(name == "lm_head.weight", "{key}: no reference gradient");
                continue;
            };
            let got = grads.get(var.as_tensor()).unwrap_or_else(|| panic!("{key}: no gradient"));
            worst = worst.max(common::assert_grad_close(&key, got, want));
            checked += 1;
        }
        let expected = want_grads.keys().filter(|k| k.starts_with(&format!("{scorer}/agent_{i}/"))).count();
        assert_eq!(checked, expected, "{scorer} agent {i}: every reference gradient compared");
        eprintln!("{scorer} agent {i}: loss {got:.7} (CoMLRL {want:.7}), {checked} gradients, worst {worst:.1e}");
    }
}

#[test]
fn decentralized_madpo_matches_comlrl() {
    check("decentralized", LastToken::Exclude);
}

#[test]
fn centralized_madpo_matches_comlrl() {
    check("centralized", LastToken::Include);
}
