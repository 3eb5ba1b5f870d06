//! One MAGRPO-family policy-gradient update against CoMLRL 1.4.3's own code
//! (scripts/fixtures/golden_policy_gradient.py): fixed rollouts (completion rows padded as generation
//! leaves them, one cut off at max_new_tokens), magrpo's and marloo's advantages with and without
//! the reference KL, normalized; each item's loss within 1e-5 and every gradient of the chunk's
//! update within 1e-4 of its tensor's largest entry. On `PBRL_TEST_DEVICE` (default cpu).
mod common;

use candle_core::{DType, Device};
use pbrl::algo::advantages::{group_advantages, AdvantageMode, AdvantageRule};
use pbrl::algo::policy_gradient::{chunk_loss, group_loss};
use pbrl::algo::reference_kl::k3_sequence_kl;
use pbrl_model::scoring::{sequence_log_probs, token_log_probs, LastToken, ScoreRow};
use pbrl_model::weight_grads::backward;
use pbrl_model::{LoadedModel, Mode};
use serde_json::Value;

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
}

#[test]
fn magrpo_and_marloo_updates_match_comlrl() {
    common::init();
    let dir = common::fixtures().join("golden_policy_gradient");
    let g: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("golden.json")).unwrap()).unwrap();
    let want_grads = candle_core::safetensors::load(dir.join("grads.safetensors"), &Device::Cpu).unwrap();
    let items = g["items"].as_array().unwrap();
    for (name, case) in g["cases"].as_object().unwrap() {
        let dev = common::device();
        let m = LoadedModel::load(common::fixtures().join("golden_madpo/agent_0").to_str().unwrap(), &dev).unwrap();
        let rule = AdvantageRule {
            mode: AdvantageMode::parse(case["mode"].as_str().unwrap()).unwrap(),
            normalize: true,
            kl_coef: case["reference_kl"].as_bool().unwrap().then(|| g["kl_coef"].as_f64().unwrap()),
        };
        let mut losses = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let rows: Vec<ScoreRow> = item["completions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| ScoreRow { prompt: ids(&item["prompt"]), completion: ids(c) })
                .collect();
            let lp = sequence_log_probs(&m.model, &rows, LastToken::Exclude, m.tokenizer.pad_id, Mode::Train).unwrap();
            let adv = group_advantages(&floats(&item["returns"]), &floats(&item["kls"]), rule);
            let scored: Vec<bool> = rows.iter().map(|r| r.completion.len() > 1).collect();
            let loss = group_loss(&lp, &adv, &scored).unwrap().unwrap();
            let got = loss.to_dtype(DType::F64).unwrap().to_scalar::<f64>().unwrap();
            let want = case["losses"][i].as_f64().unwrap();
            assert!((got - want).abs() < 1e-5, "{name} item {i}: loss {got} vs CoMLRL {want}");
            losses.push(Some(loss));
        }
        let grads = backward(&chunk_loss(losses).unwrap().unwrap()).unwrap();
        let (checked, worst) = common::check_grads(&m, &grads, &want_grads, &format!("{name}/"), str::to_string);
        eprintln!("{name}: losses {:?}, {checked} gradients, worst {worst:.1e}", case["losses"]);
    }
}

/// The k3 reference KL of each rollout row (policy: agent_0, reference: agent_1, which shares its
/// tokenizer), over the response up to its first pad token, within 1e-5 of CoMLRL's.
#[test]
fn reference_kls_match_comlrl() {
    common::init();
    let g: Value = serde_json::from_str(
        &std::fs::read_to_string(common::fixtures().join("golden_policy_gradient/golden.json")).unwrap(),
    )
    .unwrap();
    let dev = common::device();
    let load =
        |a: &str| LoadedModel::load(common::fixtures().join("golden_madpo").join(a).to_str().unwrap(), &dev).unwrap();
    let (policy, reference) = (load("agent_0"), load("agent_1"));
    for item in g["items"].as_array().unwrap() {
        let rows: Vec<ScoreRow> = item["completions"]
            .as_array()
            .unwrap()
            .iter()
            .zip(item["response_lens"].as_array().unwrap())
            .map(|(c, n)| ScoreRow {
                prompt: ids(&item["prompt"]),
                completion: ids(c)[..n.as_u64().unwrap() as usize].to_vec(),
            })
            .collect();
        let per_token = |m: &LoadedModel| {
            token_log_probs(&m.model, &rows, LastToken::Include, m.tokenizer.pad_id, Mode::Infer).unwrap().unwrap()
        };
        let (p, r) = (per_token(&policy), per_token(&reference));
        for (k, want) in floats(&item["reference_kl"]).iter().enumerate() {
            let got = k3_sequence_kl(&p.row(k).unwrap(), &r.row(k).unwrap());
            assert!((got - want).abs() < 1e-5, "row {k}: KL {got} vs CoMLRL {want}");
        }
    }
}
