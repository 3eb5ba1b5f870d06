//! `pbrl train-madpo` end to end on a tiny model: learning, saved agents, resume, edge cases.
mod common;

use common::{ok, pbrl};

use std::path::Path;

use candle_core::DType;
use pbrl::model::{tiny::tiny_model, Architecture};

/// Tiny agents, 4 items, a round of pairs collected from them.
fn setup(d: &Path, extra: &str) {
    tiny_model(Architecture::Qwen2, false, 31, DType::F32).unwrap().save_hf_dir(&d.join("tiny"), None).unwrap();
    let items: String = (0..4).map(|i| format!("{{\"prompt\": \"w{i} w{} w7\"}}\n", i + 3)).collect();
    std::fs::write(d.join("train.jsonl"), items).unwrap();
    let cfg = format!(
        "agent_model = \"{}\"\nrun_dir = \"run\"\nseed = 3\nmax_new_tokens = 6\ntemperature = 1.0\ntop_p = 1.0\n\
         preference_num_candidates = 4\npreference_pairs_per_sample = 2\nagent_learning_rate = 1e-3\ntrain_batch_size = 2\n\
         eval_interval = 0\n{extra}\n[task]\ntrain_file = \"train.jsonl\"\nformatters = [\"{{prompt}}\", \"{{prompt}} w9\"]\nchat_template = false\n",
        d.join("tiny").display()
    );
    std::fs::write(d.join("c.toml"), cfg).unwrap();
    ok(pbrl(&["collect", "--config", "c.toml"], d));
}

#[test]
fn madpo_lowers_the_loss_and_saves_loadable_agents() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d, "num_train_epochs = 4");
    let o = ok(pbrl(&["train-madpo", "--config", "c.toml"], d));
    assert!(String::from_utf8_lossy(&o.stdout).contains("agents saved"));
    let l = common::metric_values(&d.join("run"), "madpo/loss");
    eprintln!("MADPO losses per update: {l:?}");
    assert!(l.len() >= 4, "{l:?}");
    let first = l[..2].iter().sum::<f64>() / 2.0;
    let last = l[l.len() - 2..].iter().sum::<f64>() / 2.0;
    assert!(last < first, "MADPO loss should fall on its own pairs: {l:?}");
    let metrics = std::fs::read_to_string(d.join("run/metrics.jsonl")).unwrap();
    for key in
        ["madpo/accuracy", "madpo/joint_margin_mean", "madpo/grad_norm/agent_1", "turn_1/reward_mean", "tokens_per_s"]
    {
        assert!(metrics.contains(key), "{key} not logged");
    }
    for i in 0..2 {
        let agent = d.join(format!("run/agents/agent_{i}"));
        assert!(agent.join("model.safetensors").is_file());
        let base = std::fs::read(d.join("tiny/model.safetensors")).unwrap();
        assert_ne!(std::fs::read(agent.join("model.safetensors")).unwrap(), base, "agent {i} weights changed");
    }
    // Later stages use the trained agents.
    ok(pbrl(&["collect", "--config", "c.toml"], d));
}

#[test]
fn a_resumed_run_ends_bit_identical_to_an_uninterrupted_one() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d, "checkpoint_interval = 1\ncheckpoint_total_limit = 1");
    std::fs::create_dir_all(d.join("other/preference_replay")).unwrap();
    std::fs::copy(
        d.join("run/preference_replay/iteration_0001.json"),
        d.join("other/preference_replay/iteration_0001.json"),
    )
    .unwrap();
    ok(pbrl(&["train-madpo", "--config", "c.toml", "num_train_epochs=2"], d));
    ok(pbrl(&["train-madpo", "--config", "c.toml", "--run-dir", "other", "num_train_epochs=1"], d));
    let o = ok(pbrl(&["train-madpo", "--config", "c.toml", "--run-dir", "other", "--resume", "num_train_epochs=2"], d));
    assert!(String::from_utf8_lossy(&o.stdout).contains("resuming from checkpoint-1"));
    for i in 0..2 {
        let a = std::fs::read(d.join(format!("run/agents/agent_{i}/model.safetensors"))).unwrap();
        let b = std::fs::read(d.join(format!("other/agents/agent_{i}/model.safetensors"))).unwrap();
        assert!(a == b, "agent {i}: resumed weights differ from the uninterrupted run");
    }
    let kept: Vec<_> = std::fs::read_dir(d.join("run/checkpoints")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(kept, vec![std::ffi::OsString::from("checkpoint-2")], "checkpoint_total_limit = 1 prunes");
}

#[test]
fn missing_and_empty_rounds() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d, "");
    let o = pbrl(&["train-madpo", "--config", "c.toml", "--run-dir", "elsewhere"], d);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("run `pbrl collect` first"));
    std::fs::create_dir_all(d.join("empty/preference_replay")).unwrap();
    std::fs::write(
        d.join("empty/preference_replay/iteration_0001.json"),
        r#"{"iteration":1,"num_pairs":0,"pairs":[]}"#,
    )
    .unwrap();
    let o = ok(pbrl(&["train-madpo", "--config", "c.toml", "--run-dir", "empty"], d));
    assert!(String::from_utf8_lossy(&o.stdout).contains("no non-tied preference pairs"));
    assert!(!d.join("empty/agents").exists(), "agents untouched");
    let o = pbrl(&["train-madpo", "--config", "c.toml", "--run-dir", "empty", "--resume"], d);
    assert_eq!(o.status.code(), Some(0), "nothing to resume when there is nothing to train");
}

/// `pbrl eval --team`: the run's current team, the base models, or any saved team directory.
#[test]
fn eval_chooses_its_team() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d, "num_train_epochs = 3");
    let eval = |team: &str| -> Vec<serde_json::Value> {
        let o = ok(pbrl(&["eval", "--config", "c.toml", "task.eval_file=train.jsonl", "--team", team], d));
        let out = String::from_utf8_lossy(&o.stdout).to_string();
        let report = out.lines().find_map(|l| l.strip_prefix("report: ")).unwrap().trim().to_string();
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(d.join(report)).unwrap()).unwrap();
        v["items"].as_array().unwrap().iter().map(|r| r["completions"].clone()).collect()
    };
    let base = eval("base");
    ok(pbrl(&["train-madpo", "--config", "c.toml"], d));
    let current = eval("current");
    assert_ne!(base, current, "the trained team answers differently from the base models");
    assert_eq!(eval("run/agents"), current, "a saved team directory is the same team");
    assert_eq!(eval("base"), base, "the base models, whatever the run trained");
    let o = pbrl(&["eval", "--config", "c.toml", "task.eval_file=train.jsonl", "--team", "nowhere"], d);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("nowhere"));
}
