//! The real SmolLM2-135M-Instruct GGUF against transformers loading the same file
//! (fixtures from scripts/fixtures/golden_reference.py): tokenizer ids, chat template, logits, greedy ids.
mod common;

use candle_core::{Device, IndexOp, Tensor};
use pbrl_model::batch::{PaddedBatch, Padding};
use pbrl_model::sampling::{greedy, sample, SampleRequest, SamplingParams};
use pbrl_model::weight_grads::backward;
use pbrl_model::{LoadedModel, Mode};
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

/// The same SmolLM2 as a Hugging Face directory written by transformers 5 from the GGUF
/// (scripts/fixtures/smollm2_hf_dir.py; `rope_parameters`, `chat_template.jinja`): the same model as the
/// GGUF path, down to the MADPO loss of a fixed round (was 0.2541 vs 0.4087 when the directory's
/// RoPE base was missed). Skipped, with a message, where the directory has not been made.
#[test]
fn smollm2_as_a_transformers_5_directory_equals_the_gguf() {
    use pbrl::algo::madpo::other_margins;
    use pbrl::prefs::RoundFile;
    use pbrl::train::madpo_batch::{agent_objective, agent_rows, batch_margins, margin_values};
    use pbrl_model::scoring::LastToken;
    common::init();
    let dir = common::repo().join("models/smollm2-hf");
    if !dir.join("config.json").is_file() {
        eprintln!("skipped: {} is absent (scripts/test.sh makes it when the baseline venv exists)", dir.display());
        return;
    }
    let gguf = load();
    let hf = LoadedModel::load(dir.to_str().unwrap(), &Device::Cpu).unwrap();
    assert_eq!(hf.model.config.rope, gguf.model.config.rope, "RoPE read from rope_parameters");
    let user = golden()["user_prompt"].as_str().unwrap().to_string();
    for system in [None, Some("You are brief.")] {
        assert_eq!(
            hf.tokenizer.format_prompt(true, system, &user).unwrap(),
            gguf.tokenizer.format_prompt(true, system, &user).unwrap(),
            "chat template from chat_template.jinja"
        );
    }
    assert_eq!(hf.tokenizer.stop_ids[0], gguf.tokenizer.stop_ids[0]);
    let round = RoundFile::load(&common::fixtures().join("comlrl_round/iteration_0001.json")).unwrap();
    let batch: Vec<_> = round.pairs.iter().collect();
    let loss_of = |m: &LoadedModel| -> Vec<f64> {
        let rows: Vec<_> =
            (0..2).map(|i| agent_rows(&m.tokenizer, i, &batch, 64, LastToken::Exclude).unwrap()).collect();
        let margins = batch_margins(&[m, m], &rows, LastToken::Exclude).unwrap();
        let others = other_margins(&margin_values(&margins).unwrap());
        (0..2)
            .map(|i| agent_objective(&margins[i], &others[i], 0.1).unwrap().to_scalar::<f32>().unwrap() as f64)
            .collect()
    };
    let (a, b) = (loss_of(&gguf), loss_of(&hf));
    eprintln!("MADPO losses: GGUF {a:?}, directory {b:?}");
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() < 1e-5, "GGUF {x} vs directory {y}");
    }
}

/// An agent exported from the GGUF (config.json written by pbrl, both RoPE layouts) loads in
/// transformers with pbrl's logits, base 100000, the chat template and the run's settings.
#[test]
fn an_agent_exported_from_the_gguf_loads_in_transformers() {
    common::init();
    let m = load();
    let sampling = SamplingParams { temperature: 0.6, top_p: 0.6, top_k: None, max_new_tokens: 48 };
    let ids = ids(&golden()["prompt_ids"]);
    let Some(r) = common::check_export_in_transformers(&m, &ids, &sampling, 1e-3) else { return };
    assert_eq!(r["rope"]["rope_theta"], 100000.0);
    assert_eq!(r["generation"]["top_k"], 0);
    assert_eq!(r["chat_hi"].as_str().unwrap(), m.tokenizer.format_prompt(true, None, "Hi").unwrap());
}

/// The pooled reward head finds each agent's response in the byte-level BPE's tokens of the
/// joint text: the tokens it pools decode to the response (multi-byte characters too).
#[test]
fn each_agents_response_tokens_decode_to_its_response() {
    use pbrl::reward_model::{JointRewardModel, RewardHeadKind};
    let rm = JointRewardModel::fresh(load(), 2, None, RewardHeadKind::PooledMlp, 4, 1).unwrap();
    let prompts = vec!["Why is the sky blue?".to_string(), "Why is the sky blue? In detail.".to_string()];
    let responses =
        vec!["Rayleigh scattering.".to_string(), "Sunlight (café ☕ aside) scatters:\n\nblue more.".to_string()];
    let row = rm.encode(&prompts, &responses).unwrap();
    for (a, r) in responses.iter().enumerate() {
        let text = rm.backbone.tokenizer.decode(&row.ids[row.responses[a].clone()]).unwrap();
        assert_eq!(text.trim_start_matches('\n'), r, "agent {a}'s response tokens");
        assert_eq!(row.response_tokens[a], row.responses[a].len());
    }
}

/// SmolLM2 as the frozen base of a LoRA agent stored in bf16 or q8_0 (`agent_lora.base_dtype`)
/// against the f32 base, the same adapters (seeded nonzero values) on all projections: logits
/// within 1.5e-2 (bf16) or 5e-2 (q8_0) of the f32 base's largest, and the adapters' gradient
/// (of the response's log-prob) within 3e-2 (bf16) or 1.5e-1 (q8_0) of the f32 base's in
/// relative L2 norm. Measured on an Intel Xeon: logits 0.46% and 1.9%, gradients 1.0% and 5.0%.
/// With the base's products on bf16 inputs (`compute_dtype = "bf16"`) over a bf16 or an f32
/// base: logits within 2e-2, gradients within 6e-2 (measured on AMD EPYC Zen 5: logits 0.67% and
/// 0.90%, gradients 2.6% and 1.7%).
/// (The exact check, against the stored values read back in f32, is tests/golden_lora.rs.)
#[test]
fn a_bf16_or_q8_0_smollm2_base_stays_close_to_the_f32_base() {
    use pbrl_model::linear::FrozenStorage;
    use pbrl_model::lora::{LoraSpec, ALL_LINEAR};
    use pbrl_model::scoring::{sequence_log_probs, LastToken, ScoreRow};
    let spec = LoraSpec { r: 8, alpha: 16.0, target_modules: ALL_LINEAR.map(String::from).to_vec(), use_rslora: false };
    let m = load();
    let row = ScoreRow {
        prompt: m.tokenizer.encode("Write one sentence about the sea.").unwrap(),
        completion: m.tokenizer.encode(" The sea is wide and calm at dawn.").unwrap(),
    };
    drop(m);
    // The agent's logits, and its adapters' gradient flattened in name order.
    let run = |storage: FrozenStorage, bf16_products: bool| {
        let base = load().into_frozen_base(storage).unwrap();
        let base = if bf16_products { base.compute_in_bf16().unwrap() } else { base };
        let agent = LoadedModel::with_lora(&base, &spec, 3).unwrap();
        let vars = common::set_vars_random(&agent.varmap, 70, 0.05);
        let rows = std::slice::from_ref(&row);
        let lp = sequence_log_probs(&agent.model, rows, LastToken::Include, 0, Mode::Train).unwrap();
        let grads = backward(&lp.sum_all().unwrap()).unwrap();
        let flat: Vec<Tensor> =
            vars.iter().map(|(_, v)| grads.get(v.as_tensor()).unwrap().flatten_all().unwrap()).collect();
        (logits_of(&agent, &[row.prompt.clone(), row.completion.clone()].concat()), Tensor::cat(&flat, 0).unwrap())
    };
    let norm = |t: &Tensor| t.sqr().unwrap().sum_all().unwrap().sqrt().unwrap().to_scalar::<f32>().unwrap();
    let largest = |t: &Tensor| t.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
    let (y32, g32) = run(FrozenStorage::F32, false);
    for (storage, bf16_products, close_logits, close_grad) in [
        (FrozenStorage::Bf16, false, 1.5e-2, 3e-2),
        (FrozenStorage::Q8_0, false, 5e-2, 1.5e-1),
        (FrozenStorage::Bf16, true, 2e-2, 6e-2),
        (FrozenStorage::F32, true, 2e-2, 6e-2),
    ] {
        let (y, g) = run(storage, bf16_products);
        let d = common::max_abs_diff(&y, &y32) / largest(&y32);
        assert!(
            d <= close_logits,
            "{storage:?} (bf16 products {bf16_products}): logits differ from the f32 base's by {d} of their largest"
        );
        let d = norm(&(&g - &g32).unwrap()) / norm(&g32);
        assert!(
            d <= close_grad,
            "{storage:?} (bf16 products {bf16_products}): the adapters' gradient differs from the f32 base's by {d} (relative L2)"
        );
    }
}

/// All-position logits of one sequence (inference), on the host.
fn logits_of(m: &LoadedModel, ids: &[u32]) -> Tensor {
    let b = PaddedBatch::new(&[ids.to_vec()], 0, Padding::Right, m.model.device()).unwrap();
    m.model.forward(&b.ids, &b.positions, &b.bias, None, Mode::Infer).unwrap()
}

/// A LoRA agent over the GGUF (adapters on every projection, seeded nonzero values) saved as a
/// PEFT adapter: PEFT loads it over transformers' reading of the same GGUF and computes pbrl's
/// logits (1e-3, as the 30-layer model's logits test), so adapters trained over a GGUF are in
/// the Hugging Face layout (pbrl undoes llama.cpp's q/k row order at load, as transformers does).
#[test]
fn a_lora_agent_over_the_gguf_loads_in_peft() {
    use pbrl_model::lora::{LoraSpec, ALL_LINEAR};
    let Some(py) = common::ref_python() else {
        eprintln!("skipped: PBRL_REF_PYTHON is not set (scripts/test.sh sets it when the baseline venv exists)");
        return;
    };
    let base = load();
    let spec = LoraSpec { r: 4, alpha: 8.0, target_modules: ALL_LINEAR.map(String::from).to_vec(), use_rslora: false };
    let agent = LoadedModel::with_lora(&base, &spec, 3).unwrap();
    common::set_vars_random(&agent.varmap, 90, 0.02);
    let ids = agent.tokenizer.encode("The sea is wide and calm at dawn.").unwrap();
    let logits = logits_of(&agent, &ids);
    assert!(common::max_abs_diff(&logits, &logits_of(&base, &ids)) > 1e-3, "the adapters change the logits");
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("agent_0");
    agent.save_hf_dir(&dir, None).unwrap();
    // The adapter directory carries the chat template (a GGUF has no tokenizer_config.json of its
    // own), so `AutoTokenizer` on it formats prompts as pbrl does.
    let tokenizer_config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("tokenizer_config.json")).unwrap()).unwrap();
    assert!(tokenizer_config["chat_template"].as_str().is_some_and(|t| t.contains("im_start")));
    let case = d.path().join("case.safetensors");
    let ids_t =
        Tensor::new(&ids[..], &Device::Cpu).unwrap().to_dtype(candle_core::DType::I64).unwrap().unsqueeze(0).unwrap();
    candle_core::safetensors::save(
        &[("ids".to_string(), ids_t), ("logits".to_string(), logits)].into_iter().collect(),
        &case,
    )
    .unwrap();
    let o = std::process::Command::new(py)
        .arg(common::repo().join("scripts/check_adapter.py"))
        .args([dir.as_os_str(), case.as_os_str()])
        .arg("1e-3")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "PEFT on the adapter over the GGUF: {out}{}", String::from_utf8_lossy(&o.stderr));
    eprintln!("PEFT on the adapter over the GGUF: {}", out.trim());
}
