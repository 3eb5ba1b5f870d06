//! One IAC and one MAAC update against CoMLRL 1.4.3's own code
//! (scripts/fixtures/golden_actor_critic.py): the critic's values at rollout time, the buffer's
//! normalized advantages, the actor and value losses of the first chunk within 1e-5, and every
//! gradient of the actor and of the critic within 1e-4 of its tensor's largest entry; for a
//! separate critic and for a value head shared with the actor (critic type q, clipped value
//! loss). On `PBRL_TEST_DEVICE` (default cpu).
mod common;

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};
use pbrl::algo::actor_critic::buffer_advantages;
use pbrl::train::marlhf::actor_critic::{chunk_losses, values_without_grad, Sample, VALUE_HEAD};
use pbrl_model::heads::ValueHead;
use pbrl_model::scoring::ScoreRow;
use pbrl_model::weight_grads::backward;
use pbrl_model::LoadedModel;
use serde_json::Value;

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// The reference's value head of a case, inserted into `m`.
fn head(m: &LoadedModel, heads: &HashMap<String, Tensor>, case: &str, dev: &Device) -> ValueHead {
    let get = |n: &str| heads.get(&format!("{case}/value_head.{n}")).map(|t| t.to_device(dev).unwrap());
    let pre = get("pre_projection.0.weight").map(|w| (w, get("pre_projection.0.bias").unwrap()));
    let out = (get("value_projection.weight").unwrap(), get("value_projection.bias").unwrap());
    ValueHead::insert(&m.varmap, VALUE_HEAD, pre, out).unwrap()
}

fn scalar(t: &Tensor) -> f64 {
    t.to_dtype(DType::F64).unwrap().to_scalar::<f64>().unwrap()
}

#[test]
fn iac_and_maac_updates_match_comlrl() {
    common::init();
    let dir = common::fixtures().join("golden_actor_critic");
    let g: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("golden.json")).unwrap()).unwrap();
    let want_grads = candle_core::safetensors::load(dir.join("grads.safetensors"), &Device::Cpu).unwrap();
    let heads = candle_core::safetensors::load(dir.join("heads.safetensors"), &Device::Cpu).unwrap();
    let coef = g["value_loss_coef"].as_f64().unwrap();
    let chunk = g["chunk"].as_u64().unwrap() as usize;
    for (name, case) in g["cases"].as_object().unwrap() {
        let dev = common::device();
        let load =
            || LoadedModel::load(common::fixtures().join("golden_madpo/agent_0").to_str().unwrap(), &dev).unwrap();
        let separate = case["separate_critic"].as_bool().unwrap();
        let actor = load();
        let critic_model = if separate { Some(load()) } else { None };
        let critic = critic_model.as_ref().unwrap_or(&actor);
        let value_head = head(critic, &heads, name, &dev);
        let mut samples: Vec<Sample> = case["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| Sample {
                row: ScoreRow { prompt: ids(&r["prompt"]), completion: ids(&r["completion"]) },
                critic_row: ids(&r["critic_ids"]),
                target: r["target"].as_f64().unwrap(),
                old_value: 0.0,
            })
            .collect();
        let rows: Vec<Vec<u32>> = samples.iter().map(|s| s.critic_row.clone()).collect();
        let olds = values_without_grad(critic, &value_head, &rows).unwrap();
        for (i, (s, got)) in samples.iter_mut().zip(&olds).enumerate() {
            let want = case["rows"][i]["old_value"].as_f64().unwrap();
            assert!((got - want).abs() < 1e-5, "{name} sample {i}: value {got} vs CoMLRL {want}");
            s.old_value = *got;
        }
        let targets: Vec<f64> = samples.iter().map(|s| s.target).collect();
        let adv = buffer_advantages(&targets, &olds, true);
        for (i, want) in case["advantages"].as_array().unwrap().iter().enumerate() {
            let want = want.as_f64().unwrap();
            assert!((adv[i] - want).abs() < 1e-4, "{name} sample {i}: advantage {} vs CoMLRL {want}", adv[i]);
        }
        let first: Vec<&Sample> = samples[..chunk].iter().collect();
        let clip = if separate { None } else { Some(0.2) };
        let (actor_loss, value_loss) =
            chunk_losses(&actor, (critic, &value_head), &first, &adv[..chunk], clip, coef).unwrap();
        let close = |got: f64, key: &str| {
            let want = case[key].as_f64().unwrap();
            assert!((got - want).abs() < 1e-5, "{name}: {key} {got} vs CoMLRL {want}");
        };
        // (model, its parameters' prefix in the fixture, its gradients)
        let mut checks: Vec<(&LoadedModel, &str, candle_core::backprop::GradStore)> = Vec::new();
        if separate {
            close(scalar(&actor_loss), "actor_loss");
            close(scalar(&value_loss), "value_loss");
            checks.push((&actor, "actor", backward(&actor_loss).unwrap()));
            checks.push((critic, "critic", backward(&value_loss).unwrap()));
        } else {
            let total = (actor_loss + value_loss).unwrap();
            close(scalar(&total), "total_loss");
            checks.push((&actor, "actor", backward(&total).unwrap()));
        }
        for (m, part, grads) in checks {
            // PyTorch names the backbone's weights under the wrapper's `model.`.
            let torch_name = |p: &str| if p.starts_with("value_head.") { p.to_string() } else { format!("model.{p}") };
            let (checked, worst) = common::check_grads(m, &grads, &want_grads, &format!("{name}/{part}/"), torch_name);
            eprintln!("{name} {part}: {checked} gradients, worst {worst:.1e}");
        }
    }
}
