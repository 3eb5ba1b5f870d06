//! Every family, RoPE type and chat template against transformers 5 (scripts/fixtures/golden_families.py):
//! tiny random models saved by `save_pretrained`, read from transformers 5's config layout and from
//! the older one (top-level `rope_theta` / `rope_scaling`); logits of a right-padded batch with
//! rows up to 110 positions (the fixture script checks that the wrong RoPE base or scaling moves
//! them by more than 0.5), greedy tokens, stop tokens, and `apply_chat_template` text byte for
//! byte. Exports keep the source's files and carry the run's sampling settings.
mod common;

use std::path::{Path, PathBuf};

use candle_core::{Device, IndexOp};
use pbrl_model::batch::{PaddedBatch, Padding};
use pbrl_model::sampling::greedy;
use pbrl_model::{Architecture, LoadedModel, Mode, RopeScaling, SamplingParams};
use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    common::fixtures().join("families").join(name)
}

fn golden(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture(name).join("golden.json")).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// A copy of the fixture whose config.json is the older (transformers 4) layout.
fn v4_copy(name: &str) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(fixture(name)).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, d.path().join(p.file_name().unwrap())).unwrap();
    }
    std::fs::copy(fixture(name).join("config_v4.json"), d.path().join("config.json")).unwrap();
    d
}

/// Logits within 1e-4 of transformers (both kernel sets), greedy tokens equal, stop tokens named.
fn check_against_transformers(dir: &Path, name: &str) -> LoadedModel {
    let g = golden(name);
    let dev = common::device();
    let m = LoadedModel::load(dir.to_str().unwrap(), &dev).unwrap();
    let want = candle_core::safetensors::load(fixture(name).join("logits.safetensors"), &Device::Cpu).unwrap();
    let want = &want["logits"];
    let seqs: Vec<Vec<u32>> =
        g["rows"].as_array().unwrap().iter().map(|r| [ids(&r["prompt"]), ids(&r["completion"])].concat()).collect();
    let batch = PaddedBatch::new(&seqs, 0, Padding::Right, &dev).unwrap();
    for mode in [Mode::Train, Mode::Infer] {
        let logits = m.model.forward(&batch.ids, &batch.positions, &batch.bias, None, mode).unwrap();
        for (b, s) in seqs.iter().enumerate() {
            let got = logits.i(b).unwrap().narrow(0, 0, s.len()).unwrap().to_device(&Device::Cpu).unwrap();
            let d = common::max_abs_diff(&got, &want.i(b).unwrap().narrow(0, 0, s.len()).unwrap());
            assert!(d < 1e-4, "{name} ({}) {mode:?} row {b}: logits max abs diff {d}", dir.display());
        }
    }
    let tok = &m.tokenizer;
    for s in ids(&g["stop_ids"]) {
        assert!(tok.stop_ids.contains(&s), "{name}: stop id {s} missing from {:?}", tok.stop_ids);
    }
    let want_greedy = ids(&g["greedy_ids"]);
    let got = greedy(&m.model, &ids(&g["greedy_prompt"]), want_greedy.len(), &tok.stop_ids).unwrap();
    assert_eq!(got, want_greedy, "{name}: greedy tokens");
    m
}

fn check_family(name: &str, arch: Architecture) {
    common::init();
    let m = check_against_transformers(&fixture(name), name);
    assert_eq!(m.model.config.architecture, arch);
    let old = v4_copy(name);
    let m4 = check_against_transformers(old.path(), name);
    assert_eq!(m4.model.config.rope, m.model.config.rope, "{name}: both config layouts give the same RoPE");
}

#[test]
fn llama3_rope_scaling_matches_transformers() {
    check_family("llama3", Architecture::Llama);
}

#[test]
fn linear_rope_matches_transformers() {
    check_family("llama_linear", Architecture::Llama);
}

#[test]
fn dynamic_rope_matches_transformers() {
    check_family("llama_dynamic", Architecture::Llama);
}

#[test]
fn qwen2_yarn_matches_transformers() {
    check_family("qwen2_yarn", Architecture::Qwen2);
}

#[test]
fn qwen3_with_qk_norm_matches_transformers() {
    check_family("qwen3", Architecture::Qwen3);
}

#[test]
fn qwen3_yarn_matches_transformers() {
    check_family("qwen3_yarn", Architecture::Qwen3);
    let m = LoadedModel::load(fixture("qwen3_yarn").to_str().unwrap(), &Device::Cpu).unwrap();
    assert!(matches!(m.model.config.rope.scaling, RopeScaling::Yarn(_)));
}

/// The model's own template, rendered as `apply_chat_template` renders it.
fn check_chat(name: &str) {
    common::init();
    let mut m = LoadedModel::load(fixture(name).to_str().unwrap(), &Device::Cpu).unwrap();
    let cases = golden(name)["chat"].as_array().unwrap().clone();
    assert!(!cases.is_empty());
    for c in cases {
        m.tokenizer.template_kwargs = c["kwargs"].as_object().unwrap().clone();
        let got = m.tokenizer.format_prompt(true, c["system"].as_str(), c["user"].as_str().unwrap()).unwrap();
        assert_eq!(got, c["text"].as_str().unwrap(), "{name}: {c}");
    }
}

#[test]
fn llama3_chat_template_renders_as_transformers() {
    check_chat("llama3");
}

#[test]
fn qwen3_chat_template_renders_as_transformers() {
    check_chat("qwen3");
}

#[test]
fn llama3_template_prints_todays_date_without_date_string() {
    common::init();
    let m = LoadedModel::load(fixture("llama3").to_str().unwrap(), &Device::Cpu).unwrap();
    let text = m.tokenizer.format_prompt(true, None, "Hi").unwrap();
    let today = chrono::Local::now().format("%d %b %Y").to_string();
    assert!(text.contains(&format!("Today Date: {today}\n")), "{text}");
    assert!(text.starts_with("<|begin_of_text|><|start_header_id|>system"), "{text}");
}

#[test]
fn an_export_keeps_the_source_files_and_the_runs_sampling_settings() {
    use std::os::unix::fs::PermissionsExt;
    common::init();
    let src = fixture("llama3");
    let m = LoadedModel::load(src.to_str().unwrap(), &Device::Cpu).unwrap();
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("agent_0");
    let params = SamplingParams { temperature: 0.7, top_p: 0.9, top_k: None, max_new_tokens: 33 };
    m.save_hf_dir(&out, Some(&params)).unwrap();
    let read = |p: PathBuf| -> Value { serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap() };
    assert_eq!(read(out.join("config.json")), read(src.join("config.json")), "config.json as the source had it");
    assert_eq!(
        std::fs::read_to_string(out.join("chat_template.jinja")).unwrap(),
        std::fs::read_to_string(src.join("chat_template.jinja")).unwrap()
    );
    assert_eq!(read(out.join("tokenizer_config.json")), read(src.join("tokenizer_config.json")));
    let gen = read(out.join("generation_config.json"));
    assert_eq!(gen["temperature"], 0.7);
    assert_eq!(gen["top_p"], 0.9);
    assert_eq!(gen["top_k"], 0, "no top-k filtering");
    assert_eq!(gen["max_new_tokens"], 33);
    assert_eq!(gen["do_sample"], true);
    assert_eq!(gen["eos_token_id"], read(src.join("generation_config.json"))["eos_token_id"]);
    for e in std::fs::read_dir(&out).unwrap() {
        let p = e.unwrap().path();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644, "{}", p.display());
    }
    // pbrl reads its own export back to the same model.
    let back = check_against_transformers(&out, "llama3");
    assert_eq!(back.model.config, m.model.config);
}

#[test]
fn refused_configs_name_the_file_and_field() {
    common::init();
    let d = v4_copy("llama_linear");
    let cfg = d.path().join("config.json");
    let mut v: Value = serde_json::from_slice(&std::fs::read(&cfg).unwrap()).unwrap();
    v["rope_scaling"] = serde_json::json!({"type": "longrope", "short_factor": [1.0], "long_factor": [1.0]});
    std::fs::write(&cfg, serde_json::to_vec(&v).unwrap()).unwrap();
    let err = format!("{:#}", LoadedModel::load(d.path().to_str().unwrap(), &Device::Cpu).err().unwrap());
    assert!(err.contains("config.json") && err.contains("rope_scaling") && err.contains("longrope"), "{err}");
}

/// A Llama 3 agent and a Qwen3 agent, each with its own chat template, stop tokens and RoPE:
/// collect, train-madpo, eval through the binary; the exports keep each family's files.
#[test]
fn a_heterogeneous_team_collects_trains_and_evaluates_with_its_templates() {
    use common::{ok, pbrl};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let items: String = (0..3).map(|i| format!("{{\"prompt\": \"w{i} w{} w7\"}}\n", i + 10)).collect();
    std::fs::write(d.join("items.jsonl"), items).unwrap();
    let cfg = format!(
        "agents = [\"{}\", \"{}\"]\nrun_dir = \"run\"\nseed = 5\nmax_new_tokens = 8\ntemperature = 1.0\ntop_p = 1.0\n\
         preference_num_candidates = 4\npreference_pairs_per_sample = 2\nagent_learning_rate = 1e-3\n\
         train_batch_size = 2\neval_interval = 0\neval_num_samples = 2\n\
         [task]\ntrain_file = \"items.jsonl\"\neval_file = \"items.jsonl\"\nformatters = [\"{{prompt}}\", \"{{prompt}} w9\"]\n\
         system_prompts = [\"w1 w2\", \"w3\"]\n\
         [task.chat_template_kwargs]\ndate_string = \"26 Jul 2024\"\nenable_thinking = false\n",
        fixture("llama3").display(),
        fixture("qwen3").display()
    );
    std::fs::write(d.join("c.toml"), cfg).unwrap();
    ok(pbrl(&["collect", "--config", "c.toml"], d));
    let round: Value =
        serde_json::from_slice(&std::fs::read(d.join("run/preference_replay/iteration_0001.json")).unwrap()).unwrap();
    let prompts = &round["pairs"][0]["prompts"];
    let p0 = prompts[0].as_str().unwrap();
    assert!(p0.starts_with("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"), "{p0}");
    assert!(p0.contains("Today Date: 26 Jul 2024\n\nw1 w2<|eot_id|>"), "{p0}");
    assert!(p0.ends_with("<|start_header_id|>assistant<|end_header_id|>\n\n"), "{p0}");
    let p1 = prompts[1].as_str().unwrap();
    assert!(p1.starts_with("<|im_start|>system\nw3<|im_end|>\n<|im_start|>user\n"), "{p1}");
    assert!(p1.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"), "{p1}");
    ok(pbrl(&["train-madpo", "--config", "c.toml"], d));
    let agent0 = d.join("run/agents/agent_0");
    assert!(agent0.join("chat_template.jinja").is_file());
    let cfg0: Value = serde_json::from_slice(&std::fs::read(agent0.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg0["rope_parameters"]["rope_type"], "llama3");
    let cfg1: Value =
        serde_json::from_slice(&std::fs::read(d.join("run/agents/agent_1/config.json")).unwrap()).unwrap();
    assert_eq!(cfg1["model_type"], "qwen3");
    ok(pbrl(&["eval", "--config", "c.toml"], d));

    // A prompt plus max_new_tokens past the 128-position context: refused before any sampling.
    let o = pbrl(&["collect", "--config", "c.toml", "max_new_tokens=120", "--force", "--round", "1"], d);
    assert_eq!(o.status.code(), Some(2), "{}", String::from_utf8_lossy(&o.stderr));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("train item 0") && err.contains("max_new_tokens = 120") && err.contains("(128)"), "{err}");
}

/// Exports of each family load in transformers with pbrl's logits, RoPE and sampling settings.
#[test]
fn exports_load_in_transformers_with_equal_logits_and_the_runs_settings() {
    common::init();
    let sampling = SamplingParams { temperature: 0.6, top_p: 0.6, top_k: Some(50), max_new_tokens: 64 };
    for name in ["llama3", "qwen3", "qwen2_yarn"] {
        let m = LoadedModel::load(fixture(name).to_str().unwrap(), &Device::Cpu).unwrap();
        let ids = ids(&golden(name)["rows"][0]["prompt"]);
        let Some(r) = common::check_export_in_transformers(&m, &ids, &sampling, 1e-4) else { return };
        assert_eq!(
            r["generation"],
            serde_json::json!({"do_sample": true, "temperature": 0.6, "top_p": 0.6, "top_k": 50, "max_new_tokens": 64})
        );
        let want = serde_json::from_slice::<Value>(&std::fs::read(fixture(name).join("config.json")).unwrap()).unwrap();
        assert_eq!(r["rope"], want["rope_parameters"], "{name}");
    }
}

/// A weight beside the language model's (a reward or value head) never reaches an export.
#[test]
fn an_export_holds_exactly_the_language_models_weights() {
    common::init();
    let m = LoadedModel::load(fixture("qwen3").to_str().unwrap(), &Device::Cpu).unwrap();
    let head = candle_core::Var::zeros((1, 64), candle_core::DType::F32, &Device::Cpu).unwrap();
    m.varmap.data().lock().unwrap().insert("score.weight".into(), head);
    let d = tempfile::tempdir().unwrap();
    m.save_hf_dir(&d.path().join("a"), None).unwrap();
    let saved = candle_core::safetensors::load(d.path().join("a/model.safetensors"), &Device::Cpu).unwrap();
    let mut names: Vec<_> = saved.keys().cloned().collect();
    names.sort();
    let mut want: Vec<_> = m.model.config.weight_shapes().into_iter().map(|(n, _)| n).collect();
    want.sort();
    assert_eq!(names, want);
    assert!(!names.iter().any(|n| n == "lm_head.weight" || n == "score.weight"), "tied head and extra head left out");
}
