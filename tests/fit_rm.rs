//! `pbrl fit-rm` end to end on a tiny model: the fit orders its pairs, the saved reward model
//! loads and scores as pbrl trained it, a frozen backbone stays unchanged, resume is exact.
mod common;

use common::{ok, pbrl};

use std::path::Path;

use candle_core::{DType, Device};
use pbrl::prefs::RoundFile;
use pbrl::reward_model::JointRewardModel;
use pbrl_model::linear::FrozenStorage;
use pbrl_model::{tiny::tiny_model, Architecture, LoadedModel};

/// A tiny backbone, 8 items, a round of pairs collected from tiny agents.
fn setup(d: &Path, extra: &str) {
    tiny_model(Architecture::Llama, true, 41, DType::F32).unwrap().save_hf_dir(&d.join("tiny"), None).unwrap();
    let items: String = (0..8).map(|i| format!("{{\"prompt\": \"w{i} w{} w7\"}}\n", i + 3)).collect();
    std::fs::write(d.join("train.jsonl"), items).unwrap();
    let cfg = format!(
        "agent_model = \"{}\"\nrun_dir = \"run\"\nseed = 5\nmax_new_tokens = 6\ntemperature = 1.0\ntop_p = 1.0\n\
         preference_num_candidates = 4\npreference_pairs_per_sample = 2\neval_interval = 0\n\
         reward_learning_rate = 2e-3\nreward_train_batch_size = 2\nreward_num_train_epochs = 6\n\
         reward_eval_fraction = 0.25\n{extra}\n\
         [task]\ntrain_file = \"train.jsonl\"\nformatters = [\"{{prompt}}\", \"{{prompt}} w9\"]\nchat_template = false\n",
        d.join("tiny").display()
    );
    std::fs::write(d.join("c.toml"), cfg).unwrap();
    ok(pbrl(&["collect", "--config", "c.toml"], d));
}

/// The share of the round's pairs a saved reward model orders right.
fn accuracy(run: &Path) -> f64 {
    let rm = JointRewardModel::load(&run.join("reward_model"), &Device::Cpu, FrozenStorage::F32).unwrap();
    let round = RoundFile::load(&run.join("preference_replay/iteration_0001.json")).unwrap();
    let scores = |winner: bool| -> Vec<f64> {
        let rows: Vec<_> = round
            .pairs
            .iter()
            .map(|p| rm.encode(&p.prompts, if winner { &p.winner_completions } else { &p.loser_completions }).unwrap())
            .collect();
        rm.score(&rows, 8).unwrap()
    };
    let (w, l) = (scores(true), scores(false));
    w.iter().zip(&l).filter(|(w, l)| w > l).count() as f64 / w.len() as f64
}

#[test]
fn fit_rm_orders_its_pairs_and_saves_a_loadable_reward_model() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d, "");
    let run = d.join("run");
    let o = ok(pbrl(&["fit-rm", "--config", "c.toml"], d));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("held-out pairs") && out.contains("reward model saved"), "{out}");
    // The order RL reads: fresh samples (4 each) of the 2 held-out items, ranked against the oracle.
    assert!(out.contains("rm/fresh_rank_acc") && out.contains("of 2 held-out items"), "{out}");
    let acc = common::metric_values(&run, "rm/fresh_rank_acc");
    let pairs = common::metric_values(&run, "rm/fresh_rank_pairs");
    assert!(
        acc.len() == 1 && (0.0..=1.0).contains(&acc[0]) && pairs[0] >= 1.0 && pairs[0] <= 12.0,
        "{acc:?} {pairs:?}"
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("reward_model/fit_report.json")).unwrap()).unwrap();
    assert_eq!(report["fresh_rank"]["fresh_rank_acc"].as_f64(), Some(acc[0]));
    let l = common::metric_values(&run, "rm/loss");
    eprintln!("Bradley–Terry losses per update: {l:?}");
    assert!(l.len() >= 12, "6 epochs of >= 2 batches: {l:?}");
    let (first, last) = (l[..3].iter().sum::<f64>() / 3.0, l[l.len() - 3..].iter().sum::<f64>() / 3.0);
    assert!(last < first - 0.1, "the loss falls on its own pairs: {l:?}");
    let eval = common::metric_values(&run, "rm/eval_accuracy");
    assert_eq!(eval.len(), 7, "held-out pairs measured before training and after each of 6 epochs: {eval:?}");
    // Whole items are held out: 2 of the 8 (0.25), with every pair of theirs.
    let round = RoundFile::load(&run.join("preference_replay/iteration_0001.json")).unwrap();
    let mut per_item = std::collections::HashMap::new();
    for p in &round.pairs {
        *per_item.entry(&p.prompts).or_insert(0usize) += 1;
    }
    let counts: Vec<usize> = per_item.into_values().collect();
    assert_eq!(common::metric_values(&run, "rm/eval_items"), vec![2.0]);
    let held = common::metric_values(&run, "rm/eval_pairs")[0] as usize;
    assert!(out.contains(&format!("held-out pairs ({held} from 2 items never fitted)")), "{out}");
    let two_items = (0..counts.len()).any(|i| (i + 1..counts.len()).any(|j| counts[i] + counts[j] == held));
    assert!(two_items, "{held} held-out pairs are all the pairs of 2 items (pairs per item {counts:?})");
    for key in ["rm/accuracy", "rm/margin_mean", "rm/eval_margin_mean", "rm/grad_norm"] {
        assert!(!common::metric_values(&run, key).is_empty(), "{key} not logged");
    }
    let acc = accuracy(&run);
    assert!(acc >= 0.75, "the fitted model orders most of the round's pairs: {acc}");
    // The backbone is a plain causal-LM directory: no head weights in it.
    let backbone = LoadedModel::load(run.join("reward_model/backbone").to_str().unwrap(), &Device::Cpu).unwrap();
    assert!(backbone.varmap.data().lock().unwrap().keys().all(|k| !k.starts_with("reward_head")));
    let info: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("reward_model/reward_model.json")).unwrap()).unwrap();
    assert_eq!(info["num_agents"], 2);
    assert_eq!(info["joint_text"]["agent_prompt"], "Agent {i} prompt:\n{prompt}");
    assert!(run.join("reward_model_training/training_plot.svg").is_file());
}

/// The pooled head (per-agent response means and token counts, an MLP) fits its pairs on the
/// frozen backbone's features, and is saved with its description.
/// The fresh-sample order is also measured on the train items `eval_split` holds out of
/// collection (never in a round), with or without held-out pairs.
#[test]
fn fresh_samples_of_the_items_eval_split_holds_out() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d, "eval_split = 0.25");
    let o = ok(pbrl(&["fit-rm", "--config", "c.toml"], d));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("fresh samples of 4 held-out items"), "2 of the pairs', 2 of eval_split's: {out}");
    std::fs::create_dir_all(d.join("all/preference_replay")).unwrap();
    let round = "preference_replay/iteration_0001.json";
    std::fs::copy(d.join("run").join(round), d.join("all").join(round)).unwrap();
    let o = ok(pbrl(&["fit-rm", "--config", "c.toml", "--run-dir", "all", "reward_eval_fraction=0"], d));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("fresh samples of 2 held-out items"), "eval_split's alone: {out}");
}

#[test]
fn the_pooled_head_orders_its_pairs_and_is_saved_as_one() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d, "reward_head = \"pooled_mlp\"\nreward_head_hidden = 16\nreward_freeze_backbone = true");
    let run = d.join("run");
    ok(pbrl(&["fit-rm", "--config", "c.toml", "reward_learning_rate=1e-2", "reward_num_train_epochs=20"], d));
    let l = common::metric_values(&run, "rm/loss");
    assert!(l.last() < l.first(), "the pooled head learns: {l:?}");
    let acc = accuracy(&run);
    assert!(acc >= 0.75, "the fitted model orders most of the round's pairs: {acc}");
    let info: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("reward_model/reward_model.json")).unwrap()).unwrap();
    assert_eq!((info["pooling"].as_str(), info["mlp_hidden"].as_u64()), (Some(pbrl::reward_model::POOLED), Some(16)));
    let head = common::safetensors_names(&run.join("reward_model/reward_head.safetensors"));
    assert_eq!(head.len(), 4, "{head:?}");
    assert!(head.contains(&"reward_head.pre_projection.0.weight".to_string()), "{head:?}");
}

/// Pairs of another team's size (here one agent's, for a team of two) are refused, as
/// `train-madpo` refuses them, not fitted on cut or padded joint texts.
#[test]
fn rounds_of_another_team_size_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d, "");
    let path = d.join("run/preference_replay/iteration_0001.json");
    let mut round: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    for p in round["pairs"].as_array_mut().unwrap() {
        for key in ["prompts", "winner_completions", "loser_completions", "winner_finished", "loser_finished"] {
            p[key].as_array_mut().unwrap().truncate(1);
        }
    }
    std::fs::write(&path, round.to_string()).unwrap();
    for stage in ["fit-rm", "train-madpo"] {
        let o = pbrl(&[stage, "--config", "c.toml"], d);
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && e.contains("1 actors' prompts but this team has 2 (num_agents 2"),
            "{stage}: {e}"
        );
    }
    assert!(!d.join("run/reward_model").exists());
}

/// A frozen backbone is saved as its source, also when the fit read it stored in bf16
/// (`frozen_dtype`), which changes the fit's numbers a little; a reader stores it so again.
#[test]
fn a_frozen_backbone_is_saved_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d, "reward_freeze_backbone = true");
    let base = candle_core::safetensors::load(d.join("tiny/model.safetensors"), &Device::Cpu).unwrap();
    let mut losses = Vec::new();
    for (run, dtype) in [("run", "f32"), ("bf16", "bf16")] {
        std::fs::create_dir_all(d.join(run).join("preference_replay")).unwrap();
        let round = "preference_replay/iteration_0001.json";
        if run != "run" {
            std::fs::copy(d.join("run").join(round), d.join(run).join(round)).unwrap();
        }
        ok(pbrl(&["fit-rm", "--config", "c.toml", "--run-dir", run, &format!("frozen_dtype=\"{dtype}\"")], d));
        let saved = d.join(run).join("reward_model/backbone/model.safetensors");
        let saved = candle_core::safetensors::load(saved, &Device::Cpu).unwrap();
        assert_eq!(base.len(), saved.len());
        for (name, t) in &base {
            assert_eq!(
                common::max_abs_diff(t, &saved[name]),
                0.0,
                "{run}: {name} changed under reward_freeze_backbone"
            );
        }
        let l = common::metric_values(&d.join(run), "rm/loss");
        assert!(l.last() < l.first(), "{run}: the head alone still learns: {l:?}");
        losses.push(l);
    }
    assert_ne!(losses[0], losses[1], "bf16 storage changed nothing");
    for (a, b) in losses[0].iter().zip(&losses[1]) {
        assert!((a - b).abs() < 0.05, "f32 loss {a}, bf16 {b}");
    }
    let scores = |storage: FrozenStorage| {
        let rm = JointRewardModel::load(&d.join("bf16/reward_model"), &Device::Cpu, storage).unwrap();
        let round = RoundFile::load(&d.join("run/preference_replay/iteration_0001.json")).unwrap();
        let rows: Vec<_> = round.pairs.iter().map(|p| rm.encode(&p.prompts, &p.winner_completions).unwrap()).collect();
        rm.score(&rows, 8).unwrap()
    };
    let (exact, stored) = (scores(FrozenStorage::F32), scores(FrozenStorage::Bf16));
    assert_ne!(exact, stored);
    for (a, b) in exact.iter().zip(&stored) {
        assert!((a - b).abs() < 0.05 * a.abs().max(1.0), "scores over the f32 backbone {a}, over bf16 {b}");
    }
}

/// `reward_lora`: adapters on the frozen backbone train with the head; the reward model is saved
/// with them merged into a whole backbone, which scores as the adapted one did (1e-5), and
/// whose embeddings and norms are the source's.
#[test]
fn a_reward_model_with_lora_on_its_backbone() {
    use pbrl_model::lora::{LoraSpec, ALL_LINEAR};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Saved merged: the adapted model's scores, from the saved one.
    let spec = LoraSpec { r: 4, alpha: 8.0, target_modules: ALL_LINEAR.map(String::from).to_vec(), use_rslora: false };
    tiny_model(Architecture::Llama, true, 41, DType::F32).unwrap().save_hf_dir(&d.join("tiny"), None).unwrap();
    let base = LoadedModel::load_backbone(d.join("tiny").to_str().unwrap(), &Device::Cpu).unwrap();
    let adapted = LoadedModel::with_lora(&base.into_frozen_base(FrozenStorage::F32).unwrap(), &spec, 1).unwrap();
    let kind = pbrl::config::RewardHeadKind::PooledMlp;
    let rm = JointRewardModel::fresh(adapted, 2, None, kind, 8, 3).unwrap();
    common::set_vars_random(&rm.backbone.varmap, 9, 0.3);
    let prompts = ["w1 w2".to_string(), "w3 w9".to_string()];
    let rows: Vec<_> = [["w4 w5 w6", "w7"], ["w8", "w2 w3 w4 w5"]]
        .iter()
        .map(|c| rm.encode(&prompts, &[c[0].to_string(), c[1].to_string()]).unwrap())
        .collect();
    rm.save(&d.join("saved")).unwrap();
    let back = JointRewardModel::load(&d.join("saved"), &Device::Cpu, FrozenStorage::F32).unwrap();
    assert!(back.backbone.lora.is_none(), "a whole backbone");
    for (a, b) in rm.score(&rows, 4).unwrap().iter().zip(back.score(&rows, 4).unwrap()) {
        assert!((a - b).abs() <= 1e-5 * a.abs().max(1.0), "adapted {a}, saved merged {b}");
    }
    // Through fit-rm: the adapters and the head learn; the source's embeddings and norms are kept.
    setup(d, "reward_head = \"pooled_mlp\"\nreward_head_hidden = 16\n[reward_lora]\nr = 4\nalpha = 8.0");
    ok(pbrl(&["fit-rm", "--config", "c.toml", "reward_learning_rate=1e-2"], d));
    let l = common::metric_values(&d.join("run"), "rm/loss");
    assert!(l.last() < l.first(), "{l:?}");
    let source = candle_core::safetensors::load(d.join("tiny/model.safetensors"), &Device::Cpu).unwrap();
    let saved =
        candle_core::safetensors::load(d.join("run/reward_model/backbone/model.safetensors"), &Device::Cpu).unwrap();
    for (name, t) in &source {
        let moved = common::max_abs_diff(t, &saved[name]);
        match name.ends_with("_proj.weight") {
            true => assert!(moved > 0.0, "{name}: the adapters were merged into it"),
            false => assert_eq!(moved, 0.0, "{name} is not adapted"),
        }
    }
    let o = pbrl(&["fit-rm", "--config", "c.toml", "--run-dir", "x", "reward_freeze_backbone=true"], d);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("reward_lora trains adapters"), "{e}");
}

#[test]
fn a_resumed_fit_ends_bit_identical_to_an_uninterrupted_one() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d, "checkpoint_interval = 1\ncheckpoint_total_limit = 1");
    std::fs::create_dir_all(d.join("other/preference_replay")).unwrap();
    let file = "preference_replay/iteration_0001.json";
    std::fs::copy(d.join("run").join(file), d.join("other").join(file)).unwrap();
    ok(pbrl(&["fit-rm", "--config", "c.toml", "reward_num_train_epochs=2"], d));
    ok(pbrl(&["fit-rm", "--config", "c.toml", "--run-dir", "other", "reward_num_train_epochs=1"], d));
    let o =
        ok(pbrl(&["fit-rm", "--config", "c.toml", "--run-dir", "other", "--resume", "reward_num_train_epochs=2"], d));
    assert!(String::from_utf8_lossy(&o.stdout).contains("resuming from checkpoint-1"));
    for f in ["backbone/model.safetensors", "reward_head.safetensors"] {
        let a = std::fs::read(d.join("run/reward_model").join(f)).unwrap();
        let b = std::fs::read(d.join("other/reward_model").join(f)).unwrap();
        assert!(a == b, "{f}: the resumed fit differs from the uninterrupted one");
    }
    // The same with LoRA on the backbone (adapters and head in the checkpoint), its adapters
    // trained with dropout, which changes the fit.
    for run in ["lora", "lora-resumed", "lora-no-dropout"] {
        std::fs::create_dir_all(d.join(run).join("preference_replay")).unwrap();
        std::fs::copy(d.join("run").join(file), d.join(run).join(file)).unwrap();
    }
    let lora = |run: &str, epochs: &str, dropout: &str, resume: bool| {
        let mut args = vec!["fit-rm", "--config", "c.toml", "--run-dir", run, "reward_lora.r=4", epochs, dropout];
        args.extend(resume.then_some("--resume"));
        ok(pbrl(&args, d));
    };
    lora("lora", "reward_num_train_epochs=2", "reward_lora.dropout=0.3", false);
    lora("lora-resumed", "reward_num_train_epochs=1", "reward_lora.dropout=0.3", false);
    lora("lora-resumed", "reward_num_train_epochs=2", "reward_lora.dropout=0.3", true);
    lora("lora-no-dropout", "reward_num_train_epochs=2", "reward_lora.dropout=0", false);
    let saved = |run: &str, f: &str| std::fs::read(d.join(run).join("reward_model").join(f)).unwrap();
    for f in ["backbone/model.safetensors", "reward_head.safetensors"] {
        assert!(
            saved("lora", f) == saved("lora-resumed", f),
            "LoRA {f}: the resumed fit differs from the uninterrupted one"
        );
        assert!(saved("lora", f) != saved("lora-no-dropout", f), "LoRA {f}: dropout changes the fit");
    }
    // A reward_max_length beyond the backbone's context is refused before any work.
    let o = pbrl(&["fit-rm", "--config", "c.toml", "--run-dir", "other", "reward_max_length=100000"], d);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("reward_max_length = 100000 is beyond the context"));
    // A changed setup is refused.
    let o = pbrl(
        &[
            "fit-rm",
            "--config",
            "c.toml",
            "--run-dir",
            "other",
            "--resume",
            "reward_learning_rate=1e-2",
            "reward_num_train_epochs=3",
        ],
        d,
    );
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("reward_learning_rate"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn a_saved_reward_model_scores_the_same_in_transformers() {
    let Some(python) = common::ref_python() else {
        eprintln!("skipped: PBRL_REF_PYTHON is not set (scripts/test.sh sets it when a baseline venv exists)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d, "");
    ok(pbrl(&["fit-rm", "--config", "c.toml", "reward_num_train_epochs=1"], d));
    let rm_dir = d.join("run/reward_model");
    let rm = JointRewardModel::load(&rm_dir, &Device::Cpu, FrozenStorage::F32).unwrap();
    let round = RoundFile::load(&d.join("run/preference_replay/iteration_0001.json")).unwrap();
    let texts: Vec<String> = round.pairs.iter().map(|p| rm.text(&p.prompts, &p.winner_completions)).collect();
    let rows: Vec<_> = round.pairs.iter().map(|p| rm.encode(&p.prompts, &p.winner_completions).unwrap()).collect();
    let ours = rm.score(&rows, texts.len()).unwrap();
    let mut child = std::process::Command::new(python)
        .arg(common::repo().join("scripts/score_reward_model.py"))
        .arg(&rm_dir)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(serde_json::to_string(&texts).unwrap().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let theirs: Vec<f64> = serde_json::from_slice(&out.stdout).unwrap();
    for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
        assert!((a - b).abs() < 1e-4, "text {i}: pbrl {a} vs transformers {b}");
    }
    eprintln!("{} joint texts scored alike in pbrl and transformers", texts.len());
}
