//! `pbrl train-madpo` end to end on a tiny model: learning, saved agents, resume, edge cases.
mod common;

use common::{ok, pbrl};

use std::path::Path;

use candle_core::{DType, Device};
use pbrl_model::{tiny::tiny_model, Architecture};

/// Tiny agents, 4 items, a round of pairs collected from them.
fn setup(d: &Path, extra: &str) {
    tiny_model(Architecture::Qwen2, false, 31, DType::F32).unwrap().save_hf_dir(&d.join("tiny"), None).unwrap();
    let items: String = (0..4).map(|i| format!("{{\"prompt\": \"w{i} w{} w7\"}}\n", i + 3)).collect();
    std::fs::write(d.join("train.jsonl"), items).unwrap();
    let cfg = format!(
        "agent_model = \"{}\"\nrun_dir = \"run\"\nseed = 3\nmax_new_tokens = 6\ntemperature = 1.0\ntop_p = 1.0\n\
         preference_num_candidates = 4\npreference_pairs_per_sample = 2\nagent_learning_rate = 1e-3\ntrain_batch_size = 2\n\
         {}{extra}\n[task]\ntrain_file = \"train.jsonl\"\nformatters = [\"{{prompt}}\", \"{{prompt}} w9\"]\nchat_template = false\n",
        d.join("tiny").display(),
        if extra.contains("eval_interval") { "" } else { "eval_interval = 0\n" }
    );
    std::fs::write(d.join("c.toml"), cfg).unwrap();
    ok(pbrl(&["collect", "--config", "c.toml"], d));
}

/// A second run directory `name` with the first one's round.
fn copy_round(d: &Path, name: &str) {
    std::fs::create_dir_all(d.join(name).join("preference_replay")).unwrap();
    let file = "preference_replay/iteration_0001.json";
    std::fs::copy(d.join("run").join(file), d.join(name).join(file)).unwrap();
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
    // Every update says where its time went: backward and AdamW are parts of the whole.
    let [update, backward, adamw] =
        ["time/update_s", "time/backward_s", "time/optimizer_s"].map(|k| common::metric_values(&d.join("run"), k));
    assert_eq!((update.len(), backward.len(), adamw.len()), (l.len(), l.len(), l.len()));
    for ((u, b), a) in update.iter().zip(&backward).zip(&adamw) {
        assert!(*b > 0.0 && *a > 0.0 && b + a <= *u, "update {u} s, backward {b} s, AdamW {a} s");
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
    copy_round(d, "other");
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

/// Anchored, length-normalized MADPO: at the first update every policy is its own reference, so
/// every margin is 0 and each loss is ln 2; the reference log-probs are stored once and a resumed
/// run reads them back and ends bit-identical.
#[test]
fn anchored_madpo_starts_at_ln2_and_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d, "madpo_reference = true\nmadpo_length_normalize = true\ncheckpoint_interval = 1");
    copy_round(d, "other");
    let o = ok(pbrl(&["train-madpo", "--config", "c.toml", "num_train_epochs=3"], d));
    assert!(String::from_utf8_lossy(&o.stdout).contains("reference log-probs of"));
    assert!(d.join("run/madpo_reference.json").is_file());
    let l = common::metric_values(&d.join("run"), "madpo/loss");
    assert!((l[0] - 2f64.ln()).abs() < 1e-4, "first anchored loss {} is not ln 2", l[0]);
    let kl = common::metric_values(&d.join("run"), "madpo/implied_kl/agent_1");
    assert!(kl[0].abs() < 1e-3, "no drift before the first update: {kl:?}");
    assert!(kl.iter().skip(1).any(|k| k.abs() > 1e-3), "the policy moves away from its reference: {kl:?}");
    assert!(l[l.len() - 1] < l[0], "{l:?}");

    ok(pbrl(&["train-madpo", "--config", "c.toml", "--run-dir", "other", "num_train_epochs=1"], d));
    let o = ok(pbrl(&["train-madpo", "--config", "c.toml", "--run-dir", "other", "--resume", "num_train_epochs=3"], d));
    assert!(!String::from_utf8_lossy(&o.stdout).contains("reference log-probs of"), "read back, not recomputed");
    for i in 0..2 {
        let a = std::fs::read(d.join(format!("run/agents/agent_{i}/model.safetensors"))).unwrap();
        let b = std::fs::read(d.join(format!("other/agents/agent_{i}/model.safetensors"))).unwrap();
        assert!(a == b, "agent {i}: resumed anchored weights differ from the uninterrupted run");
    }
    // A reference file of another run is refused.
    ok(pbrl(&["train-madpo", "--config", "c.toml", "--run-dir", "other", "num_train_epochs=1", "dpo_beta=0.5"], d));
    std::fs::copy(d.join("run/madpo_reference.json"), d.join("other/madpo_reference.json")).unwrap();
    let o = pbrl(
        &["train-madpo", "--config", "c.toml", "--run-dir", "other", "--resume", "num_train_epochs=2", "dpo_beta=0.5"],
        d,
    );
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("belongs to another training run") && err.contains("dpo_beta"), "{err}");
}

/// `frozen_dtype` stores a reference loaded from weights (`reference_model_name`) in bf16: its
/// log-probs are the f32 reference's within bf16's rounding, yet not the same numbers; q8_0 is
/// refused for a model whose inputs it cannot pack, naming the key and the projection.
#[test]
fn frozen_dtype_stores_a_reference_model_in_bf16() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d, "madpo_reference = true");
    copy_round(d, "bf16");
    copy_round(d, "q8");
    let reference = format!("reference_model_name=\"{}\"", d.join("tiny").display());
    let train = |run: &str, dtype: &str| {
        pbrl(&["train-madpo", "--config", "c.toml", "--run-dir", run, "num_train_epochs=1", &reference, dtype], d)
    };
    ok(train("run", "frozen_dtype=\"f32\""));
    ok(train("bf16", "frozen_dtype=\"bf16\""));
    let sums = |run: &str| -> Vec<f64> {
        let file: serde_json::Value =
            serde_json::from_slice(&std::fs::read(d.join(run).join("madpo_reference.json")).unwrap()).unwrap();
        let agents = file["log_probs"].as_array().unwrap();
        agents
            .iter()
            .flat_map(|pairs| pairs.as_array().unwrap().iter())
            .flat_map(|p| [p["winner"]["sum"].as_f64().unwrap(), p["loser"]["sum"].as_f64().unwrap()])
            .collect()
    };
    let (f32_sums, bf16_sums) = (sums("run"), sums("bf16"));
    assert_eq!(f32_sums.len(), bf16_sums.len());
    assert!(f32_sums.iter().zip(&bf16_sums).any(|(a, b)| a != b), "bf16 storage changed nothing");
    for (a, b) in f32_sums.iter().zip(&bf16_sums) {
        assert!((a - b).abs() <= 2e-2 * a.abs().max(1.0), "f32 {a} against bf16 {b}");
    }
    let o = train("q8", "frozen_dtype=\"q8_0\"");
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(e.contains("frozen_dtype") && e.contains("has 48 inputs"), "{e}");
}

/// `eval_split` holds train items out of collection; `keep_best` evaluates on them and saves the
/// best agents, reporting the best and the final evaluation; the drift diagnostics are logged
/// and plotted.
#[test]
fn keep_best_saves_the_best_evaluated_agents() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(
        d,
        "eval_split = 0.25\nkeep_best = true\neval_interval = 1\neval_num_samples = 4\neval_samples_per_item = 2\n\
         num_train_epochs = 3",
    );
    let held = pbrl::task::split::held_out(4, 0.25, 3).unwrap();
    let round = std::fs::read_to_string(d.join("run/preference_replay/iteration_0001.json")).unwrap();
    for (i, h) in held.iter().enumerate() {
        let prompt = format!("w{i} w{} w7", i + 3);
        assert_eq!(round.contains(&prompt), !h, "item {i} (held out: {h}) in the round: {}", round.contains(&prompt));
    }
    let o = ok(pbrl(&["train-madpo", "--config", "c.toml"], d));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("eval reward: final") && out.contains("best"), "{out}");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("run/training_summary.json")).unwrap()).unwrap();
    eprintln!("training summary: {summary}");
    let (best, last) = (&summary["best_eval"], &summary["final_eval"]);
    let rewards = common::metric_values(&d.join("run"), "eval/turn_1/reward_mean");
    let max = rewards.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    assert_eq!(best["reward_mean"].as_f64().unwrap(), max, "the best of {rewards:?}");
    assert_eq!(last["update"], summary["updates"], "the final agents are evaluated");
    let agents = |dir: &str, i: usize| std::fs::read(d.join(format!("run/{dir}/agent_{i}/model.safetensors"))).unwrap();
    for i in 0..2 {
        if summary["saved"] == "best" {
            assert!(best["update"] != last["update"]);
            assert!(agents("agents", i) == agents("best_agents", i), "agent {i}: the best agents are saved");
            assert!(agents("final_agents", i) != agents("agents", i), "agent {i}: the final agents are kept apart");
        } else {
            assert_eq!(best["update"], last["update"]);
        }
    }
    let metrics = std::fs::read_to_string(d.join("run/metrics.jsonl")).unwrap();
    for key in [
        "madpo/winner_tokens/agent_0",
        "madpo/loser_tokens/agent_1",
        "madpo/winner_shorter/agent_0",
        "eval/agent_1/response_chars_mean",
    ] {
        assert!(metrics.contains(key), "{key} not logged");
    }
    assert!(!metrics.contains("madpo/implied_kl"), "no reference pass without madpo_reference or madpo_log_kl");
    let plot = std::fs::read_to_string(d.join("run/training_plot.svg")).unwrap();
    assert!(plot.contains("eval reward") && plot.contains("madpo/winner_shorter"), "{plot}");
}

/// `keep_best_tolerance`: the best evaluation's agents replace the last ones only when the last
/// evaluation falls below the best by more than that many of the best's standard errors; at a
/// tolerance no fall reaches, the last agents are saved although an earlier evaluation scored
/// higher (at 0, the same run saves the best).
#[test]
fn keep_best_tolerance_keeps_the_last_agents_within_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(
        d,
        "eval_split = 0.5\nkeep_best = true\neval_interval = 1\neval_num_samples = 4\neval_samples_per_item = 2\n\
         num_train_epochs = 6",
    );
    let train = |tolerance: &str| {
        let run_dir = format!("run_{tolerance}");
        copy_round(d, &run_dir);
        let tol = format!("keep_best_tolerance={tolerance}");
        ok(pbrl(&["train-madpo", "--config", "c.toml", "--run-dir", &run_dir, &tol], d));
        let text = std::fs::read_to_string(d.join(&run_dir).join("training_summary.json")).unwrap();
        (serde_json::from_str::<serde_json::Value>(&text).unwrap(), d.join(run_dir))
    };
    let (strict, _) = train("0");
    let (best, last) = (&strict["best_eval"], &strict["final_eval"]);
    assert!(best["update"] != last["update"], "an earlier evaluation beats the last one: {strict}");
    assert!(best["reward_stderr"].as_f64().unwrap() > 0.0, "{strict}");
    assert_eq!(strict["saved"], "best", "{strict}");
    let (tolerant, run) = train("1e9");
    assert_eq!((&tolerant["best_eval"], &tolerant["final_eval"]), (best, last), "the same training");
    assert_eq!(tolerant["saved"], "final", "{tolerant}");
    assert!(!run.join("final_agents").exists(), "the saved agents are the final ones");
}

/// The periodic evaluations draw their own random streams and leave the weights alone: the final
/// agents of a keep-best run are those of the same training without evaluations.
#[test]
fn periodic_evaluations_do_not_change_the_training() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("val.jsonl"), "{\"prompt\": \"w1 w2\"}\n{\"prompt\": \"w5 w6\"}\n").unwrap();
    setup(d, "num_train_epochs = 6");
    let train = |run_dir: &str, keys: &[&str]| {
        copy_round(d, run_dir);
        let mut args = vec!["train-madpo", "--config", "c.toml", "--run-dir", run_dir];
        args.extend(keys);
        ok(pbrl(&args, d));
    };
    train("plain", &[]);
    let evaluated = [
        "eval_split=\"validation_file\"",
        "task.validation_file=\"val.jsonl\"",
        "keep_best=true",
        "eval_interval=1",
        "eval_num_samples=2",
        "eval_samples_per_item=2",
    ];
    train("evaluated", &evaluated);
    let weights = |p: String| std::fs::read(d.join(p)).unwrap();
    let last = if d.join("evaluated/final_agents").exists() { "final_agents" } else { "agents" };
    for i in 0..2 {
        assert!(
            weights(format!("plain/agents/agent_{i}/model.safetensors"))
                == weights(format!("evaluated/{last}/agent_{i}/model.safetensors")),
            "agent {i}: the evaluations changed the trained weights"
        );
    }
}

/// `eval_split = "validation_file"`: collection takes every train item, and keep-best evaluates
/// the validation file's items (a bad item there is reported as the validation file's).
#[test]
fn keep_best_on_a_validation_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d, "");
    std::fs::write(d.join("val.jsonl"), "{\"prompt\": \"w1 w2\"}\n{\"prompt\": \"w5 w6\"}\n").unwrap();
    std::fs::write(d.join("bad.jsonl"), "{\"topic\": \"w1\"}\n").unwrap();
    let run = |cmd: &str, run_dir: &str, file: &str| {
        let keys = [
            "eval_split=\"validation_file\"".to_string(),
            format!("task.validation_file=\"{file}\""),
            "keep_best=true".into(),
            "eval_interval=1".into(),
            "eval_num_samples=2".into(),
            "eval_samples_per_item=1".into(),
        ];
        let mut args = vec![cmd, "--config", "c.toml", "--run-dir", run_dir];
        args.extend(keys.iter().map(String::as_str));
        pbrl(&args, d)
    };
    ok(run("collect", "val", "val.jsonl"));
    let round = std::fs::read_to_string(d.join("val/preference_replay/iteration_0001.json")).unwrap();
    for i in 0..4 {
        assert!(round.contains(&format!("w{i} w{} w7", i + 3)), "train item {i} is collected");
    }
    let o = run("train-madpo", "val", "bad.jsonl");
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(e.contains("validation item 0"), "{e}");
    let o = ok(run("train-madpo", "val", "val.jsonl"));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("eval reward: final") && out.contains("best"), "{out}");
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
    // Each eval adds to the run's history: 4 so far, base first; the last (base again, the
    // same samples) gains exactly 0 over the first.
    let o = ok(pbrl(&["eval", "--config", "c.toml", "task.eval_file=train.jsonl", "--team", "base"], d));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("gain over the first eval of this run directory (base): +0.0000 ± 0.0000"), "{out}");
    // 4 items x 4 samples: the first 4 joint responses printed, the rest with `--table`.
    let o = ok(pbrl(&["eval", "--config", "c.toml", "task.eval_file=train.jsonl", "eval_samples_per_item=4"], d));
    let out = String::from_utf8_lossy(&o.stdout);
    let rows = |out: &str| out.lines().filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit())).count();
    assert_eq!(rows(&out), 4, "{out}");
    assert!(out.contains("12 more in the report (`--table` prints them all)"), "{out}");
    let table = ["eval", "--config", "c.toml", "task.eval_file=train.jsonl", "eval_samples_per_item=4", "--table"];
    let o = ok(pbrl(&table, d));
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(rows(&out), 16, "{out}");
    assert!(!out.contains("gain over the first eval"), "4 samples per item are not paired with 1: {out}");
    let svg = std::fs::read_to_string(d.join("run/eval/eval_reward.svg")).unwrap();
    // Seven evaluations: the x axis is labelled 1 to 7, at whole numbers only.
    assert!(svg.contains("base") && svg.contains("\n7\n</text>") && !svg.contains("\n6.5\n</text>"), "{svg}");
    // A saved team with a NaN weight is refused, naming the agent and the weight.
    let status = std::process::Command::new("cp").arg("-r").arg(d.join("run/agents")).arg(d.join("nan_team")).status();
    assert!(status.unwrap().success());
    let file = d.join("nan_team/agent_1/model.safetensors");
    let mut weights = candle_core::safetensors::load(&file, &candle_core::Device::Cpu).unwrap();
    let name = weights.keys().min().unwrap().clone();
    let bad = (weights[&name].ones_like().unwrap() * f64::NAN).unwrap();
    weights.insert(name.clone(), bad);
    candle_core::safetensors::save(&weights, &file).unwrap();
    let o = pbrl(&["eval", "--config", "c.toml", "task.eval_file=train.jsonl", "--team", "nan_team"], d);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && e.contains("agent 1 from") && e.contains(&format!("`{name}` has non-finite")),
        "{e}"
    );
    let o = pbrl(&["eval", "--config", "c.toml", "task.eval_file=train.jsonl", "--team", "nowhere"], d);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("nowhere"));
}

/// `train-madpo`, `fit-rm` and `train-marlhf` with `gradient_checkpointing = true` save the
/// models they save without (the same updates up to the order of the gradients' sums).
#[test]
fn training_stages_with_checkpointed_layers_train_the_same_models() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d, "num_train_epochs = 2");
    copy_round(d, "ck");
    ok(pbrl(&["train-madpo", "--config", "c.toml"], d));
    ok(pbrl(&["train-madpo", "--config", "c.toml", "--run-dir", "ck", "gradient_checkpointing=true"], d));
    let same_models = |a: &str, b: &str, files: &[&str]| {
        for file in files {
            let plain = candle_core::safetensors::load(d.join(a).join(file), &Device::Cpu).unwrap();
            let ck = candle_core::safetensors::load(d.join(b).join(file), &Device::Cpu).unwrap();
            for (name, t) in &plain {
                let diff = common::max_abs_diff(t, &ck[name]);
                assert!(diff < 1e-5, "{b}/{file} {name}: {diff}");
            }
        }
    };
    same_models("run", "ck", &["agents/agent_0/model.safetensors", "agents/agent_1/model.safetensors"]);
    let (a, b) =
        (common::metric_values(&d.join("run"), "madpo/loss"), common::metric_values(&d.join("ck"), "madpo/loss"));
    assert_eq!(a.len(), b.len());
    assert!(a.iter().zip(&b).all(|(x, y)| (x - y).abs() < 1e-6), "{a:?} against {b:?}");
    // fit-rm (the whole backbone trains) and train-marlhf (MAGRPO) the same way.
    for stage in ["fit-rm", "train-marlhf"] {
        ok(pbrl(&[stage, "--config", "c.toml"], d));
        ok(pbrl(&[stage, "--config", "c.toml", "--run-dir", "ck", "gradient_checkpointing=true"], d));
    }
    same_models("run", "ck", &["reward_model/backbone/model.safetensors", "agents/agent_1/model.safetensors"]);
    // The actor-critic backends' critics (whole backbones) are checkpointed too: over two
    // epochs the critics' first updates shape the second epoch's advantages, so the agents and
    // the value losses agree only if the critics' gradients do.
    for algorithm in ["maac", "iac"] {
        for run in ["ac", "ac-ck"] {
            copy_round(d, run);
            copy_dir(&d.join("run/reward_model"), &d.join(run).join("reward_model"));
            let mut args = vec!["train-marlhf", "--config", "c.toml", "--run-dir", run];
            let algo = format!("rl_algorithm={algorithm}");
            args.push(&algo);
            if run == "ac-ck" {
                args.push("gradient_checkpointing=true");
            }
            ok(pbrl(&args, d));
        }
        same_models("ac", "ac-ck", &["agents/agent_0/model.safetensors", "agents/agent_1/model.safetensors"]);
        let key = "marlhf/value_loss/agent_0";
        let (a, b) = (common::metric_values(&d.join("ac"), key), common::metric_values(&d.join("ac-ck"), key));
        assert!(!a.is_empty() && a.len() == b.len(), "{algorithm}: {a:?} against {b:?}");
        assert!(a.iter().zip(&b).all(|(x, y)| (x - y).abs() < 1e-6), "{algorithm}: {a:?} against {b:?}");
        for run in ["ac", "ac-ck"] {
            std::fs::remove_dir_all(d.join(run)).unwrap();
        }
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        match entry.file_type().unwrap().is_dir() {
            true => copy_dir(&entry.path(), &to.join(entry.file_name())),
            false => drop(std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap()),
        }
    }
}
