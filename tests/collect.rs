//! `pbrl collect` end to end: round files, determinism, round numbering, ties, compatibility.
mod common;

use common::{ok, pbrl};

use std::path::Path;

use candle_core::{DType, Device};
use pbrl::prefs::RoundFile;
use pbrl_model::{tiny::tiny_model, Architecture, LoadedModel};

/// A run setup on a tiny random model: 4 items, 4 candidates, sampled at temperature 1.
fn setup(d: &Path, extra: &str) -> String {
    let model = d.join("tiny");
    tiny_model(Architecture::Llama, true, 21, DType::F32).unwrap().save_hf_dir(&model, None).unwrap();
    let items: String = (0..4).map(|i| format!("{{\"prompt\": \"w{i} w{} w7\"}}\n", i + 3)).collect();
    std::fs::write(d.join("train.jsonl"), items).unwrap();
    let cfg = format!(
        "agent_model = \"{}\"\nrun_dir = \"run\"\nseed = 5\nmax_new_tokens = 6\ntemperature = 1.0\ntop_p = 1.0\n\
         preference_num_candidates = 4\npreference_pairs_per_sample = 3\ncollect_batch_size = 2\n{extra}\n\
         [task]\ntrain_file = \"train.jsonl\"\nformatters = [\"{{prompt}}\", \"{{prompt}} w9\"]\nchat_template = false\n",
        model.display()
    );
    std::fs::write(d.join("c.toml"), cfg).unwrap();
    "c.toml".into()
}

/// `max_new_tokens` as a list: each actor samples up to its own limit.
#[test]
fn each_actor_samples_up_to_its_own_max_new_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cfg = setup(d, "");
    ok(pbrl(&["collect", "--config", &cfg, "max_new_tokens=[2, 6]"], d));
    let model = LoadedModel::load(d.join("tiny").to_str().unwrap(), &Device::Cpu).unwrap();
    let round = RoundFile::load(&d.join("run/preference_replay/iteration_0001.json")).unwrap();
    let longest = |a: usize| {
        let texts = round.pairs.iter().flat_map(|p| [&p.winner_completions[a], &p.loser_completions[a]]);
        texts.map(|c| model.tokenizer.encode(c).unwrap().len()).max().unwrap()
    };
    assert!(longest(0) <= 2 && longest(1) > 2, "longest answers: agent 0 {}, agent 1 {}", longest(0), longest(1));
    let o = pbrl(&["collect", "--config", &cfg, "--run-dir", "r2", "max_new_tokens=[2, 6, 6]"], d);
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("max_new_tokens has 3 entries but there are 2 actors"),
        "{o:?}"
    );
}

#[test]
fn collect_writes_deterministic_rounds_with_valid_pairs() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cfg = setup(d, "");
    ok(pbrl(&["collect", "--config", &cfg], d));
    ok(pbrl(&["collect", "--config", &cfg, "--run-dir", "run2"], d));
    let a = std::fs::read(d.join("run/preference_replay/iteration_0001.json")).unwrap();
    let b = std::fs::read(d.join("run2/preference_replay/iteration_0001.json")).unwrap();
    assert_eq!(a, b, "same config and seed give a byte-identical round file");

    let round = RoundFile::load(&d.join("run/preference_replay/iteration_0001.json")).unwrap();
    assert_eq!(round.iteration, 1);
    assert!(round.num_pairs > 0, "random tiny agents should disagree in length");
    for p in &round.pairs {
        assert!(p.winner_reward > p.loser_reward);
        assert_eq!(p.prompts.len(), 2);
        assert!(p.prompts[1].ends_with(" w9"), "prompts hold the exact formatted text: {:?}", p.prompts);
        for flags in [&p.winner_finished, &p.loser_finished] {
            assert_eq!(flags.as_ref().map(|f| f.len()), Some(2), "one stop flag per actor");
        }
    }
    // At most 3 pairs per item: count pairs per prompt.
    let mut per_item = std::collections::HashMap::new();
    for p in &round.pairs {
        *per_item.entry(p.prompts[0].clone()).or_insert(0) += 1;
    }
    assert!(per_item.values().all(|&n| n <= 3), "{per_item:?}");
    let metrics = std::fs::read_to_string(d.join("run/metrics.jsonl")).unwrap();
    for key in ["collect/num_pairs", "collect/reward_mean", "collect/tied_items", "collect/tokens_per_s"] {
        assert!(metrics.contains(key), "{key} not logged");
    }

    // The next collect writes round 2 (different samples); an existing round is kept unless --force.
    ok(pbrl(&["collect", "--config", &cfg], d));
    let r2 = std::fs::read(d.join("run/preference_replay/iteration_0002.json")).unwrap();
    assert_ne!(r2, a, "round 2 draws new samples");
    let o = pbrl(&["collect", "--config", &cfg, "--round", "1"], d);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("iteration_0001.json exists; pass --force"));
    ok(pbrl(&["collect", "--config", &cfg, "--round", "1", "--force"], d));
    assert_eq!(std::fs::read(d.join("run/preference_replay/iteration_0001.json")).unwrap(), a);
}

#[test]
fn all_tied_items_still_write_an_empty_round_and_warn() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cfg = setup(
        d,
        "log_reward_distribution = true\nreward_range = [0.0, 1.0]\n[reward]\nkind = \"keywords\"\nkeywords = [\"never-generated\"]",
    );
    let o = ok(pbrl(&["collect", "--config", &cfg], d));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no non-tied preference pairs"));
    let round = RoundFile::load(&d.join("run/preference_replay/iteration_0001.json")).unwrap();
    assert_eq!((round.num_pairs, round.pairs.len()), (0, 0));
    let dist: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("run/reward_distributions/iteration_0001.json")).unwrap())
            .unwrap();
    assert_eq!(dist["num_bins"], 16);
    assert_eq!(dist["candidate"]["target"]["sample_count"], 16, "4 items x 4 candidates");
    assert_eq!(dist["candidate"]["target"]["counts"][0], 16);
    assert!(d.join("run/reward_distributions/iteration_0001.svg").is_file());
}

#[test]
fn a_failing_reward_program_leaves_no_round_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cfg = setup(d, "[reward]\nkind = \"command\"\ncommand = [\"python3\", \"-c\", \"import sys; sys.stdin.readline(); sys.exit(1)\"]");
    let o = pbrl(&["collect", "--config", &cfg], d);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("reward command `python3 -c"));
    assert!(!d.join("run/preference_replay/iteration_0001.json").exists());
}

#[test]
fn a_round_written_by_comlrl_loads() {
    let round = RoundFile::load(&common::fixtures().join("comlrl_round/iteration_0001.json")).unwrap();
    assert_eq!(round.num_pairs, 2);
    assert_eq!(round.pairs[0].raw_rewards.as_deref(), Some(&[0.965, 0.135][..]));
    assert_eq!(round.pairs[1].loser_completions, vec!["", ""]);
    assert!(round.pairs[1].prompts[0].contains("日本語"));
}

#[test]
fn collect_train_and_eval_on_the_real_model() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("train.jsonl"), "{\"prompt\": \"Describe the sea.\"}\n{\"prompt\": \"Explain rain.\"}\n")
        .unwrap();
    let cfg = format!(
        "agent_model = \"{}\"\nrun_dir = \"run\"\nmax_new_tokens = 8\npreference_num_candidates = 2\ncollect_batch_size = 2\n\
         [task]\ntrain_file = \"train.jsonl\"\nformatters = [\"{{prompt}} Be brief.\", \"{{prompt}} Be detailed.\"]\n",
        common::smollm2().display()
    );
    std::fs::write(d.join("c.toml"), cfg).unwrap();
    let o = ok(pbrl(&["collect", "--config", "c.toml"], d));
    assert!(String::from_utf8_lossy(&o.stdout).contains("round 1:"));
    let round = RoundFile::load(&d.join("run/preference_replay/iteration_0001.json")).unwrap();
    assert!(round.num_pairs <= 2, "at most one ordered pair per item with 2 candidates");
    for p in &round.pairs {
        assert!(p.prompts[0].starts_with("<|im_start|>system\n") && p.prompts[0].ends_with("<|im_start|>assistant\n"));
    }

    // One MADPO update on that round, then eval with the trained agents.
    assert!(round.num_pairs > 0, "this seed gives non-tied candidates");
    let o = ok(pbrl(
        &["train-madpo", "--config", "c.toml", "train_batch_size=2", "num_train_epochs=1", "eval_interval=0"],
        d,
    ));
    assert!(String::from_utf8_lossy(&o.stdout).contains("1 updates"), "{}", String::from_utf8_lossy(&o.stdout));
    for i in 0..2 {
        assert!(d.join(format!("run/agents/agent_{i}/model.safetensors")).is_file());
    }
    let o = ok(pbrl(&["eval", "--config", "c.toml", "-v", "task.eval_file=train.jsonl", "eval_num_samples=2"], d));
    assert!(String::from_utf8_lossy(&o.stderr).contains("run/agents/agent_1"), "eval loads the trained agents");

    // Centralized: one SmolLM2 actor gets the tagged joint prompt inside its chat template.
    ok(pbrl(&["collect", "--config", "c.toml", "--run-dir", "central", "collaboration_mode=centralized"], d));
    let round = RoundFile::load(&d.join("central/preference_replay/iteration_0001.json")).unwrap();
    for p in &round.pairs {
        assert_eq!(p.prompts.len(), 1);
        assert!(p.prompts[0].starts_with("<|im_start|>system\n") && p.prompts[0].contains("<agent_1>"));
    }
}
