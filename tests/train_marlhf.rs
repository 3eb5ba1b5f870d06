//! `pbrl train-marlhf` end to end on a tiny model: collect → fit-rm → train-marlhf; the policy
//! moves towards what the reward model scores higher, the reference's metrics are logged, the
//! reference KL starts at 0, resume is exact (the actor-critic backends' too, critics included),
//! what cannot work is refused.
mod common;

use common::{ok, pbrl};

use std::path::Path;

use candle_core::DType;
use candle_core::Device;
use pbrl_model::tiny::{random_varmap, tiny_config, tiny_model, word_tokenizer};
use pbrl_model::{Architecture, LoadedModel};

/// A tiny team, 6 items, a round of pairs, a reward model fitted on it.
fn setup(d: &Path, extra: &str) {
    tiny_model(Architecture::Llama, true, 51, DType::F32).unwrap().save_hf_dir(&d.join("tiny"), None).unwrap();
    let items: String = (0..6).map(|i| format!("{{\"prompt\": \"w{i} w{} w7\"}}\n", i + 3)).collect();
    std::fs::write(d.join("train.jsonl"), items).unwrap();
    let cfg = format!(
        "agent_model = \"{}\"\nrun_dir = \"run\"\nseed = 7\nmax_new_tokens = 5\ntemperature = 1.0\ntop_p = 1.0\n\
         preference_num_candidates = 4\npreference_pairs_per_sample = 2\neval_interval = 0\n\
         reward_learning_rate = 2e-3\nreward_train_batch_size = 2\nreward_num_train_epochs = 4\nreward_eval_fraction = 0\n\
         num_generations = 3\nrollout_buffer_size = 2\nagent_learning_rate = 1e-2\n{extra}\n\
         [task]\ntrain_file = \"train.jsonl\"\nformatters = [\"{{prompt}}\", \"{{prompt}} w9\"]\nchat_template = false\n",
        d.join("tiny").display()
    );
    std::fs::write(d.join("c.toml"), cfg).unwrap();
    ok(pbrl(&["collect", "--config", "c.toml"], d));
    ok(pbrl(&["fit-rm", "--config", "c.toml"], d));
}

/// A run directory `to` with the round and the reward model of `run`.
fn copy_inputs(d: &Path, to: &str) {
    std::fs::create_dir_all(d.join(to)).unwrap();
    for sub in ["preference_replay", "reward_model"] {
        let status = std::process::Command::new("cp").arg("-r").arg(d.join("run").join(sub)).arg(d.join(to)).status();
        assert!(status.unwrap().success());
    }
}

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len() as f64
}

#[test]
fn marlhf_raises_the_reward_models_score_and_saves_the_agents() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d, "num_train_epochs = 12");
    // fit-rm measured whether its model ranks fresh samples (none held out here: not measured).
    let report = d.join("run/reward_model/fit_report.json");
    assert_eq!(std::fs::read_to_string(&report).unwrap().replace(char::is_whitespace, ""), r#"{"fresh_rank":null}"#);
    let o = ok(pbrl(&["train-marlhf", "--config", "c.toml"], d));
    assert!(String::from_utf8_lossy(&o.stdout).contains("agents saved"), "{}", String::from_utf8_lossy(&o.stdout));
    assert!(!String::from_utf8_lossy(&o.stderr).contains("rm/fresh_rank_acc"));
    let run = d.join("run");
    let r = common::metric_values(&run, "turn_1/reward_mean");
    eprintln!("reward-model score of the rollouts per update: {r:?}");
    assert_eq!(r.len(), 12 * 3, "12 epochs of 3 buffers");
    let (first, last) = (mean(&r[..9]), mean(&r[r.len() - 9..]));
    eprintln!("first three epochs {first:.4}, last three {last:.4}");
    assert!(last > first, "the agents learn to please the reward model: {first:.4} → {last:.4}");
    for key in ["turn_1/expected_return", "marlhf/loss/agent_0", "marlhf/loss/agent_1", "marlhf/grad_norm/agent_1"] {
        assert!(!common::metric_values(&run, key).is_empty(), "{key} not logged");
    }
    assert_update_times(&run, r.len());
    for i in 0..2 {
        let a = std::fs::read(run.join(format!("agents/agent_{i}/model.safetensors"))).unwrap();
        assert_ne!(a, std::fs::read(d.join("tiny/model.safetensors")).unwrap(), "agent {i} changed");
    }
    assert!(run.join("marlhf_training/training_plot.svg").is_file());
}

/// `train-marlhf` reads a pooled reward model as it reads the last-token one.
#[test]
fn marlhf_trains_on_a_pooled_reward_model() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d, "num_train_epochs = 2\nreward_head = \"pooled_mlp\"");
    let o = ok(pbrl(&["train-marlhf", "--config", "c.toml"], d));
    assert!(String::from_utf8_lossy(&o.stdout).contains("agents saved"), "{}", String::from_utf8_lossy(&o.stdout));
    let r = common::metric_values(&d.join("run"), "turn_1/reward_mean");
    assert_eq!(r.len(), 2 * 3, "2 epochs of 3 buffers: {r:?}");
    assert!(r.iter().all(|x| x.is_finite()) && r.iter().any(|x| *x != r[0]), "the pooled model's scores: {r:?}");
}

#[test]
fn the_reference_kl_starts_at_zero_and_a_resumed_run_is_exact() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(
        d,
        "reference_kl_enabled = true\nreference_kl_coef = 0.5\ncheckpoint_interval = 1\nrl_algorithm = \"marloo\"",
    );
    // A second run directory with the same round and reward model.
    copy_inputs(d, "other");
    ok(pbrl(&["train-marlhf", "--config", "c.toml", "num_train_epochs=2"], d));
    let kl = common::metric_values(&d.join("run"), "turn_1/reference_kl_mean");
    assert_eq!(kl[0], 0.0, "before any update the policy is its reference");
    assert!(kl.iter().skip(1).all(|&x| x > 0.0), "{kl:?}");
    ok(pbrl(&["train-marlhf", "--config", "c.toml", "--run-dir", "other", "num_train_epochs=1"], d));
    let o =
        ok(pbrl(&["train-marlhf", "--config", "c.toml", "--run-dir", "other", "--resume", "num_train_epochs=2"], d));
    assert!(String::from_utf8_lossy(&o.stdout).contains("resuming from checkpoint-1"));
    for i in 0..2 {
        let a = std::fs::read(d.join(format!("run/agents/agent_{i}/model.safetensors"))).unwrap();
        let b = std::fs::read(d.join(format!("other/agents/agent_{i}/model.safetensors"))).unwrap();
        assert!(a == b, "agent {i}: the resumed run differs from the uninterrupted one");
    }
}

#[test]
fn train_marlhf_refuses_what_it_cannot_do() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d, "");
    let o = pbrl(
        &["train-marlhf", "--config", "c.toml", "rl_algorithm=iac", "use_separate_critic=false", "critic_model_name=x"],
        d,
    );
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("use_separate_critic = false puts the value head on each actor")
    );
    let o = pbrl(&["train-marlhf", "--config", "c.toml", "--run-dir", "empty"], d);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("run `pbrl fit-rm` first"));
    // An update whose logits could not fit in memory is refused before the first rollout: agents
    // with a vocabulary of 2^16 (their word tokenizer knows the first 51 ids), 64 items x 64
    // generations per update of 40 tokens, 2^16 x 8 bytes per token: 86 GB.
    let cfg = tiny_config(Architecture::Llama, 1 << 16, true);
    let varmap = random_varmap(&cfg, 3, DType::F32, &Device::Cpu).unwrap();
    let model = LoadedModel::build(&varmap, &cfg, DType::F32, &Device::Cpu).unwrap();
    let tokenizer = word_tokenizer(51).unwrap();
    let wide = LoadedModel { model, varmap, tokenizer, source: "wide".into(), files: Default::default(), lora: None };
    wide.save_hf_dir(&d.join("wide"), None).unwrap();
    copy_inputs(d, "big");
    let wide = format!("agent_model={}", d.join("wide").display());
    let big = ["num_generations=64", "rollout_buffer_size=64", "train_batch_size=64", "max_new_tokens=40", &wide];
    let o = pbrl(&[&["train-marlhf", "--config", "c.toml", "--run-dir", "big"][..], &big].concat(), d);
    let e = String::from_utf8_lossy(&o.stderr);
    if pbrl::device::available_memory().is_some_and(|free| free < 80 << 30) {
        assert!(
            !o.status.success() && e.contains("train_batch_size × num_generations: an update scores up to 4096"),
            "{e}"
        );
        let metrics = std::fs::read_to_string(d.join("big/metrics.jsonl")).unwrap_or_default();
        assert!(!d.join("big/agents").exists() && !metrics.contains("turn_1/reward_mean"), "no rollout ran");
    }
}

/// A reward model that `fit-rm` measured ranking fresh samples near chance: train-marlhf warns
/// and trains all the same.
#[test]
fn train_marlhf_warns_on_a_reward_model_that_ranks_fresh_samples_at_chance() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d, "num_train_epochs = 1");
    let report = r#"{"fresh_rank": {"fresh_rank_acc": 0.45, "fresh_rank_pairs": 20, "fresh_rank_items": 2}}"#;
    std::fs::write(d.join("run/reward_model/fit_report.json"), report).unwrap();
    let o = ok(pbrl(&["train-marlhf", "--config", "c.toml"], d));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("warning:") && err.contains("rm/fresh_rank_acc 0.450 < 0.6"), "{err}");
}

/// Each actor-critic variant with a state-value critic learns to please the reward model (per epoch: 3 buffers of one
/// item's 3 samples), logs its critic's loss, and leaves no value head in an exported agent.
#[test]
fn the_actor_critic_backends_raise_the_reward_models_score() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d, "num_train_epochs = 10\ncritic_learning_rate = 1e-2");
    // critic_type = "q" (the reference's Q(s, a) as the baseline of its own action) is run and
    // checked for its logs only: its advantage R − Q(s, a) shrinks as the critic fits, so it is
    // not expected to learn as fast.
    for (name, args) in [
        ("iac", vec!["rl_algorithm=iac"]),
        ("iac_shared", vec!["rl_algorithm=iac", "use_separate_critic=false", "value_head_hidden_dim=8"]),
        ("iac_q", vec!["rl_algorithm=iac", "critic_type=q"]),
        ("maac", vec!["rl_algorithm=maac"]),
        ("maac_q", vec!["rl_algorithm=maac", "critic_type=q"]),
    ] {
        let mut argv = vec!["train-marlhf", "--config", "c.toml", "--run-dir"];
        argv.push(name);
        argv.extend(&args);
        copy_inputs(d, name);
        ok(pbrl(&argv, d));
        let run = d.join(name);
        let r = common::metric_values(&run, "turn_1/reward_mean");
        assert_eq!(r.len(), 10 * 6, "{name}: 10 epochs of 6 buffers (one item of 3 samples each)");
        let (first, last) = (mean(&r[..18]), mean(&r[r.len() - 18..]));
        eprintln!("{name}: first three epochs {first:.4}, last three {last:.4}");
        if !name.ends_with("_q") {
            assert!(last > first, "{name}: the agents learn to please the reward model: {first:.4} → {last:.4}");
        }
        let v = common::metric_values(&run, "marlhf/value_loss/agent_1");
        assert_eq!(v.len(), r.len(), "{name}: a critic loss per buffer");
        assert_update_times(&run, r.len());
        let names = common::safetensors_names(&run.join("agents/agent_0/model.safetensors"));
        assert!(names.iter().all(|n| !n.contains("value_head")), "{name}: {names:?}");
    }
}

#[test]
fn a_resumed_actor_critic_run_is_exact() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d, "checkpoint_interval = 1\nrl_algorithm = \"iac\"\nreference_kl_enabled = true");
    copy_inputs(d, "other");
    ok(pbrl(&["train-marlhf", "--config", "c.toml", "num_train_epochs=2"], d));
    ok(pbrl(&["train-marlhf", "--config", "c.toml", "--run-dir", "other", "num_train_epochs=1"], d));
    ok(pbrl(&["train-marlhf", "--config", "c.toml", "--run-dir", "other", "--resume", "num_train_epochs=2"], d));
    for i in 0..2 {
        let a = std::fs::read(d.join(format!("run/agents/agent_{i}/model.safetensors"))).unwrap();
        let b = std::fs::read(d.join(format!("other/agents/agent_{i}/model.safetensors"))).unwrap();
        assert!(a == b, "agent {i}: the resumed run differs from the uninterrupted one");
    }
    let v = |run: &str| common::metric_values(&d.join(run), "marlhf/value_loss/agent_0");
    assert_eq!(v("run"), v("other")[v("other").len() - v("run").len()..].to_vec(), "the critics were restored too");
}

/// Every buffer says where its time went: sampling, the reward model, the backward passes and
/// AdamW are parts of the whole update.
fn assert_update_times(run: &Path, updates: usize) {
    let records: Vec<serde_json::Value> = std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|v: &serde_json::Value| v["stage"] == "train-marlhf" && v.get("time/update_s").is_some())
        .collect();
    assert_eq!(records.len(), updates, "one update record per buffer");
    for (i, r) in records.iter().enumerate() {
        let [update, rollout, reward, backward, adamw] =
            ["time/update_s", "time/rollout_s", "time/reward_s", "time/backward_s", "time/optimizer_s"]
                .map(|k| r[k].as_f64().unwrap_or_else(|| panic!("update {i}: {k} not logged")));
        let parts = [rollout, reward, backward, adamw];
        assert!(
            parts.iter().all(|&p| p > 0.0) && parts.iter().sum::<f64>() <= update,
            "update {i}: {parts:?} of {update}"
        );
    }
}
