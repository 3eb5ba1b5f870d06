//! LoRA agents end to end on a tiny model: `collect` → `train-madpo` with `[agent_lora]` trains
//! the adapters only (the base file untouched), saves each agent as a PEFT adapter directory that
//! `eval` and `LoadedModel::load` read back (the trained agent differs from its base, a fresh one
//! does not), and that PEFT loads to the same logits (with PBRL_REF_PYTHON); MARLHF (MAGRPO and
//! the actor-critic backends) and iterate train LoRA teams too.
mod common;

use common::{ok, pbrl};

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use pbrl_model::batch::{PaddedBatch, Padding};
use pbrl_model::tiny::tiny_model;
use pbrl_model::{Architecture, LoadedModel, Mode};

fn setup(d: &Path) {
    tiny_model(Architecture::Llama, false, 61, DType::F32).unwrap().save_hf_dir(&d.join("tiny"), None).unwrap();
    let items: String = (0..6).map(|i| format!("{{\"prompt\": \"w{i} w{} w7\"}}\n", i + 3)).collect();
    std::fs::write(d.join("train.jsonl"), &items).unwrap();
    let cfg = format!(
        "agent_model = \"{}\"\nrun_dir = \"run\"\nseed = 5\nmax_new_tokens = 5\ntemperature = 1.0\ntop_p = 1.0\n\
         preference_num_candidates = 4\npreference_pairs_per_sample = 2\nagent_learning_rate = 1e-2\ntrain_batch_size = 2\n\
         eval_interval = 0\neval_num_samples = 2\n\
         [agent_lora]\nr = 4\nalpha = 8.0\ntarget_modules = [\"q_proj\", \"v_proj\", \"down_proj\"]\n\
         [task]\ntrain_file = \"train.jsonl\"\neval_file = \"train.jsonl\"\nformatters = [\"{{prompt}}\", \"{{prompt}} w9\"]\n\
         chat_template = false\n",
        d.join("tiny").display()
    );
    std::fs::write(d.join("c.toml"), cfg).unwrap();
}

fn logits(m: &LoadedModel, ids: &[u32]) -> Tensor {
    let b = PaddedBatch::new(&[ids.to_vec()], 0, Padding::Right, &Device::Cpu).unwrap();
    m.model.forward(&b.ids, &b.positions, &b.bias, None, Mode::Infer).unwrap()
}

/// collect, train-madpo, fit-rm and train-marlhf in turn with `args` (small MARLHF settings).
fn every_stage(d: &Path, args: &[&str]) {
    for stage in ["collect", "train-madpo", "fit-rm", "train-marlhf"] {
        ok(pbrl(&[&[stage, "--config", "c.toml"][..], args, &common::SMALL_MARLHF].concat(), d));
    }
}

/// How far the agent saved at `agent` moved the tiny base's logits on one sequence.
fn logits_moved(d: &Path, agent: &Path) -> f32 {
    let base = LoadedModel::load(d.join("tiny").to_str().unwrap(), &Device::Cpu).unwrap();
    let trained = LoadedModel::load(agent.to_str().unwrap(), &Device::Cpu).unwrap();
    common::max_abs_diff(&logits(&trained, &[3, 8, 5, 9]), &logits(&base, &[3, 8, 5, 9]))
}

#[test]
fn a_lora_team_trains_its_adapters_and_saves_peft_adapters() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d);
    let base_file = std::fs::read(d.join("tiny/model.safetensors")).unwrap();
    ok(pbrl(&["collect", "--config", "c.toml"], d));
    ok(pbrl(&["train-madpo", "--config", "c.toml"], d));
    assert_eq!(std::fs::read(d.join("tiny/model.safetensors")).unwrap(), base_file, "the base is never written");
    let ids = [3u32, 8, 5, 9, 12, 4];
    let base = LoadedModel::load(d.join("tiny").to_str().unwrap(), &Device::Cpu).unwrap();
    for i in 0..2 {
        let agent = d.join(format!("run/agents/agent_{i}"));
        assert!(!agent.join("model.safetensors").exists(), "an adapter, not a whole model");
        assert!(agent.join("tokenizer_config.json").is_file(), "the tokenizer's config beside the adapter");
        let config: serde_json::Value =
            serde_json::from_slice(&std::fs::read(agent.join("adapter_config.json")).unwrap()).unwrap();
        assert_eq!((config["peft_type"].as_str(), config["r"].as_u64()), (Some("LORA"), Some(4)));
        let names = common::safetensors_names(&agent.join("adapter_model.safetensors"));
        assert_eq!(names.len(), 2 * 3 * 2, "A and B for q, v, down in 2 layers");
        assert!(names.contains(&"base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight".to_string()));
        let trained = LoadedModel::load(agent.to_str().unwrap(), &Device::Cpu).unwrap();
        assert!(trained.lora.is_some());
        let moved = common::max_abs_diff(&logits(&trained, &ids), &logits(&base, &ids));
        assert!(moved > 1e-6, "agent {i}'s adapters trained: the logits moved by {moved}");
        let peft = |py: &std::path::PathBuf| {
            std::process::Command::new(py).args(["-c", "import peft"]).output().is_ok_and(|o| o.status.success())
        };
        if let Some(py) = common::ref_python().filter(peft) {
            let case = d.join(format!("case{i}.safetensors"));
            let ids_t =
                Tensor::new(&ids[..], &Device::Cpu).unwrap().to_dtype(DType::I64).unwrap().unsqueeze(0).unwrap();
            let map = [("ids".to_string(), ids_t), ("logits".to_string(), logits(&trained, &ids))];
            candle_core::safetensors::save(&map.into_iter().collect(), &case).unwrap();
            let o = std::process::Command::new(py)
                .arg(common::repo().join("scripts/check_adapter.py"))
                .arg(&agent)
                .arg(&case)
                .output()
                .unwrap();
            assert!(
                o.status.success(),
                "PEFT on the adapter: {}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            eprintln!("PEFT on agent {i}'s adapter: {}", String::from_utf8_lossy(&o.stdout).trim());
        } else {
            eprintln!("skipped the PEFT check: PBRL_REF_PYTHON is not set or has no peft");
        }
    }
    // eval reads the LoRA team; a fresh LoRA agent is its base.
    let o = ok(pbrl(&["eval", "--config", "c.toml"], d));
    assert!(String::from_utf8_lossy(&o.stdout).contains("reward_mean"));
    let fresh = LoadedModel::with_lora(&base, &trained_spec(), 3).unwrap();
    assert_eq!(common::max_abs_diff(&logits(&fresh, &ids), &logits(&base, &ids)), 0.0);
    // The run's LoRA team under a config without [agent_lora]: refused, never trained as another kind.
    let full = std::fs::read_to_string(d.join("c.toml")).unwrap().replace("[agent_lora]\nr = 4\nalpha = 8.0\n", "");
    let full = full.replace("target_modules = [\"q_proj\", \"v_proj\", \"down_proj\"]\n", "");
    std::fs::write(d.join("c-full.toml"), full).unwrap();
    let o = pbrl(&["train-madpo", "--config", "c-full.toml", "num_train_epochs=2", "--resume"], d);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("is a LoRA adapter") && e.contains("whole models"), "{e}");
}

/// Adapters of their own shape per agent (`r`, `alpha`, `target_modules` as lists): each saved
/// adapter has its agent's shape, both train, and the run's team under another shape is refused.
#[test]
fn each_agent_has_its_own_adapter_shape() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d);
    let shapes = [
        "agent_lora.r=[2, 6]",
        "agent_lora.alpha=[4.0, 3.0]",
        "agent_lora.target_modules=[[\"q_proj\"], \"all-linear\"]",
    ];
    for stage in ["collect", "train-madpo"] {
        ok(pbrl(&[&[stage, "--config", "c.toml"][..], &shapes[..]].concat(), d));
    }
    let ids = [3u32, 8, 5, 9, 12, 4];
    let base = LoadedModel::load(d.join("tiny").to_str().unwrap(), &Device::Cpu).unwrap();
    // A and B per adapted projection, 2 layers: q only (4), all seven (28).
    for (i, (r, alpha, tensors)) in [(2, 4.0, 4), (6, 3.0, 2 * 7 * 2)].into_iter().enumerate() {
        let agent = d.join(format!("run/agents/agent_{i}"));
        let config: serde_json::Value =
            serde_json::from_slice(&std::fs::read(agent.join("adapter_config.json")).unwrap()).unwrap();
        assert_eq!((config["r"].as_u64(), config["lora_alpha"].as_f64()), (Some(r), Some(alpha)), "agent {i}");
        assert_eq!(common::safetensors_names(&agent.join("adapter_model.safetensors")).len(), tensors, "agent {i}");
        let trained = LoadedModel::load(agent.to_str().unwrap(), &Device::Cpu).unwrap();
        assert!(common::max_abs_diff(&logits(&trained, &ids), &logits(&base, &ids)) > 1e-6, "agent {i} trained");
    }
    let o = pbrl(&["train-madpo", "--config", "c.toml", "--resume", "num_train_epochs=2", "agent_lora.r=[2, 4]"], d);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("agent 0") && e.contains("the config asks for"), "{e}");
}

/// MARLHF (MAGRPO) on a LoRA team, and `iterate` (2 rounds against the current team): adapters
/// saved and trained, the round snapshots adapters too. The actor-critic backends train LoRA
/// actors beside whole critics, or with a value head on the LoRA actor (`use_separate_critic =
/// false`: the head trains with the adapters and stays out of the saved adapter).
#[test]
fn marlhf_and_iterate_train_lora_teams() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d);
    let mh = common::SMALL_MARLHF;
    ok(pbrl(&[&["collect", "--config", "c.toml"][..], &mh].concat(), d));
    ok(pbrl(&[&["fit-rm", "--config", "c.toml"][..], &mh].concat(), d));
    ok(pbrl(&[&["train-marlhf", "--config", "c.toml"][..], &mh].concat(), d));
    let actor_critic: [(&str, &[&str]); 2] = [
        ("iac", &["rl_algorithm=iac", "use_separate_critic=false", "value_head_hidden_dim=8"]),
        ("maac", &["rl_algorithm=maac"]),
    ];
    for (run, keys) in actor_critic {
        std::fs::create_dir_all(d.join(run)).unwrap();
        for sub in ["preference_replay", "reward_model"] {
            let status =
                std::process::Command::new("cp").arg("-r").arg(d.join("run").join(sub)).arg(d.join(run)).status();
            assert!(status.unwrap().success());
        }
        ok(pbrl(&[&["train-marlhf", "--config", "c.toml", "--run-dir", run][..], &mh, keys].concat(), d));
        let l = common::metric_values(&d.join(run), "marlhf/value_loss/agent_0");
        assert!(!l.is_empty() && l.iter().all(|v| v.is_finite()), "{run}: the critic trained: {l:?}");
    }
    ok(pbrl(&["iterate", "--config", "c.toml", "--run-dir", "it", "num_iterations=2"], d));
    let base = LoadedModel::load(d.join("tiny").to_str().unwrap(), &Device::Cpu).unwrap();
    let ids = [3u32, 8, 5, 9];
    for run in ["run", "iac", "maac", "it"] {
        let agent = d.join(run).join("agents/agent_1");
        let trained = LoadedModel::load(agent.to_str().unwrap(), &Device::Cpu).unwrap();
        assert!(trained.lora.is_some() && !agent.join("model.safetensors").exists(), "{run}: an adapter");
        let moved = common::max_abs_diff(&logits(&trained, &ids), &logits(&base, &ids));
        assert!(moved > 1e-6, "{run}: the adapters trained ({moved})");
        let file = candle_core::safetensors::load(agent.join("adapter_model.safetensors"), &Device::Cpu).unwrap();
        assert!(file.keys().all(|k| pbrl_model::lora::is_adapter_name(k)), "{run}: adapters only: {:?}", file.keys());
    }
}

fn trained_spec() -> pbrl_model::lora::LoraSpec {
    pbrl_model::lora::LoraSpec { r: 4, alpha: 8.0, target_modules: vec!["q_proj".into()], use_rslora: false }
}

/// A LoRA run resumed for a second epoch ends with the adapters of an uninterrupted 2-epoch run,
/// byte for byte (the checkpoint holds the adapters and their AdamW state only), also with
/// adapter dropout (its masks are keyed by the update, not by how the process got there), which
/// trains other adapters and is recorded as the adapter's `lora_dropout`.
#[test]
fn a_resumed_lora_run_is_exact() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d);
    ok(pbrl(&["collect", "--config", "c.toml"], d));
    let adapter =
        |run: &str, i: usize| std::fs::read(d.join(run).join(format!("agents/agent_{i}/adapter_model.safetensors")));
    for (a, b, dropout) in [("a", "b", "agent_lora.dropout=0"), ("da", "db", "agent_lora.dropout=0.2")] {
        for run in [a, b] {
            std::fs::create_dir_all(d.join(run)).unwrap();
            let status = std::process::Command::new("cp")
                .arg("-r")
                .arg(d.join("run/preference_replay"))
                .arg(d.join(run))
                .status();
            assert!(status.unwrap().success());
        }
        let train = |run: &str, more: &[&str]| {
            let args = [&["train-madpo", "--config", "c.toml", "--run-dir", run, dropout][..], more].concat();
            ok(pbrl(&args, d));
        };
        train(a, &["num_train_epochs=2"]);
        train(b, &["num_train_epochs=1", "checkpoint_interval=1"]);
        train(b, &["num_train_epochs=2", "checkpoint_interval=1", "--resume"]);
        let losses = |run: &str| common::metric_values(&d.join(run), "madpo/loss").len();
        assert_eq!(losses(a), losses(b), "{dropout}: the resume trained the second epoch only");
        for i in 0..2 {
            assert!(adapter(a, i).unwrap() == adapter(b, i).unwrap(), "{dropout}: agent {i}");
        }
    }
    assert!(adapter("a", 0).unwrap() != adapter("da", 0).unwrap(), "dropout trains other adapters");
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("da/agents/agent_0/adapter_config.json")).unwrap()).unwrap();
    assert_eq!(config["lora_dropout"].as_f64(), Some(0.2), "{config}");
}

/// `agent_lora.base_dtype`: LoRA agents over a bf16 base train end to end (collect, MADPO,
/// MARLHF with its KL reference, the base with adapters off) and their adapters load over the
/// f32 base too; q8_0 is refused for a base whose projection inputs are not multiples of 32,
/// naming the projection, before any work.
#[test]
fn a_lora_team_trains_on_a_bf16_base_and_q8_0_names_what_it_cannot_pack() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d);
    every_stage(d, &["agent_lora.base_dtype=\"bf16\"", "reference_kl_enabled=true"]);
    let moved = logits_moved(d, &d.join("run/agents/agent_0"));
    assert!(moved > 1e-6, "the adapters trained ({moved})");
    let o = pbrl(&["collect", "--config", "c.toml", "--run-dir", "q8", "agent_lora.base_dtype=\"q8_0\""], d);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("model.layers.0.mlp.down_proj has 48 inputs"), "{e}");
    assert!(!e.contains("panicked"), "{e}");
}

/// `agent_lora.compute_dtype = "bf16"`: the base's products on bf16 inputs, over a bf16 or an
/// f32 base, through every stage (collect, MADPO, MARLHF with its KL reference over the base,
/// `fit-rm` with `reward_lora` at the same setting); the trained adapters move and load over
/// the f32 base. q8_0 with it is refused before any work.
#[test]
fn a_lora_team_trains_with_bf16_products() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d);
    for (run, base_dtype) in [("b", "bf16"), ("f", "f32")] {
        let base_dtype = format!("agent_lora.base_dtype=\"{base_dtype}\"");
        let bf16 = ["agent_lora.compute_dtype=\"bf16\"", "reward_lora.r=4", "reward_lora.compute_dtype=\"bf16\""];
        every_stage(d, &[&["--run-dir", run, &base_dtype, "reference_kl_enabled=true"][..], &bf16].concat());
        let moved = logits_moved(d, &d.join(run).join("agents/agent_0"));
        assert!(moved > 1e-6, "{run}: the adapters trained ({moved})");
    }
    let q8 = ["agent_lora.base_dtype=\"q8_0\"", "agent_lora.compute_dtype=\"bf16\""];
    let o = pbrl(&[&["collect", "--config", "c.toml", "--run-dir", "q8"][..], &q8].concat(), d);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("agent_lora.compute_dtype = \"bf16\""), "{e}");
    assert!(!e.contains("panicked") && !d.join("q8").exists(), "{e}");
}

/// `agent_lora.save_merged`: the trained team also saved merged into its base
/// (`agents_merged/agent_i`, whole Hugging Face directories): each computes the adapter agent's
/// logits (1e-5), and transformers loads it without PEFT (when the reference venv is present).
#[test]
fn a_lora_team_is_also_saved_merged_into_its_base() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d);
    ok(pbrl(&["collect", "--config", "c.toml"], d));
    ok(pbrl(&["train-madpo", "--config", "c.toml", "agent_lora.save_merged=true"], d));
    let ids = [3u32, 8, 5, 9, 12, 4];
    let base = LoadedModel::load(d.join("tiny").to_str().unwrap(), &Device::Cpu).unwrap();
    for i in 0..2 {
        let adapter =
            LoadedModel::load(d.join(format!("run/agents/agent_{i}")).to_str().unwrap(), &Device::Cpu).unwrap();
        let merged_dir = d.join(format!("run/agents_merged/agent_{i}"));
        let merged = LoadedModel::load(merged_dir.to_str().unwrap(), &Device::Cpu).unwrap();
        assert!(merged.lora.is_none() && merged_dir.join("model.safetensors").is_file(), "a whole model");
        let want = logits(&adapter, &ids);
        assert!(common::max_abs_diff(&want, &logits(&base, &ids)) > 1e-6, "the adapters trained");
        let diff = common::max_abs_diff(&logits(&merged, &ids), &want);
        assert!(diff < 1e-5, "agent {i}: the merged model's logits differ from the adapter agent's by {diff}");
        let sampling = pbrl_model::SamplingParams { temperature: 1.0, top_p: 1.0, top_k: None, max_new_tokens: 5 };
        common::check_export_in_transformers(&merged, &ids, &sampling, 1e-4);
    }
}
