//! Centralized collaboration end to end on a tiny model: one actor writes both roles in a tagged
//! joint response; collect scores the parsed roles, train-madpo learns from the joint text with
//! the full-token scorer, fit-rm and train-marlhf (MAGRPO) learn from the joint text too, eval
//! reports the parsed roles.
mod common;

use common::{ok, pbrl};

use std::path::Path;

use candle_core::DType;
use pbrl::config::Config;
use pbrl::prefs::RoundFile;
use pbrl::task::configured::build_reward;
use pbrl::task::TaskItem;
use pbrl::team::collab::parse_joint_response;
use pbrl_model::{tiny::tiny_model, Architecture};

/// A tiny actor whose most frequent output words are renamed to the section tags, so that its
/// random text contains sections of varying length (and the length-ratio reward tells
/// candidates apart).
fn setup(d: &Path) {
    let m = tiny_model(Architecture::Llama, true, 17, DType::F32).unwrap();
    m.save_hf_dir(&d.join("tiny"), None).unwrap();
    let items: String = (0..6).map(|i| format!("{{\"prompt\": \"w{} w{} w7\"}}\n", i + 4, i + 9)).collect();
    std::fs::write(d.join("train.jsonl"), &items).unwrap();
    std::fs::write(d.join("eval.jsonl"), &items).unwrap();
    let cfg = format!(
        "agent_model = \"{}\"\nrun_dir = \"run\"\nseed = 5\ncollaboration_mode = \"centralized\"\nmax_new_tokens = 24\n\
         temperature = 1.0\ntop_p = 1.0\npreference_num_candidates = 4\npreference_pairs_per_sample = 2\n\
         agent_learning_rate = 1e-3\ntrain_batch_size = 2\nnum_train_epochs = 3\neval_interval = 0\neval_num_samples = 6\n\
         [task]\ntrain_file = \"train.jsonl\"\neval_file = \"eval.jsonl\"\nformatters = [\"{{prompt}} w20\", \"{{prompt}} w21\"]\n\
         chat_template = false\n[reward]\nkind = \"length_ratio\"\n",
        d.join("tiny").display()
    );
    std::fs::write(d.join("c.toml"), cfg).unwrap();

    // Probe: the words the actor writes most (outside the prompts' words) become the tags.
    let report = eval_report(d, &["--run-dir", "probe"]);
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    for r in report["items"].as_array().unwrap() {
        for w in r["joint_completion"].as_str().unwrap().split_whitespace() {
            *counts.entry(w.to_string()).or_default() += 1;
        }
    }
    let in_prompts: Vec<String> = (4..15).chain([20, 21]).map(|i| format!("w{i}")).collect();
    let mut frequent: Vec<(usize, String)> = counts
        .into_iter()
        .filter(|(w, _)| w.starts_with('w') && !in_prompts.contains(w))
        .map(|(w, c)| (c, w))
        .collect();
    frequent.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let tok_path = d.join("tiny/tokenizer.json");
    let mut tok: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&tok_path).unwrap()).unwrap();
    let vocab = tok["model"]["vocab"].as_object_mut().unwrap();
    for ((_, word), tag) in frequent.iter().zip(["<agent_0>", "</agent_0>", "<agent_1>", "</agent_1>"]) {
        let id = vocab.remove(word).unwrap();
        vocab.insert(tag.to_string(), id);
    }
    std::fs::write(&tok_path, serde_json::to_string(&tok).unwrap()).unwrap();
}

/// Run `pbrl eval` and read the report it wrote.
fn eval_report(d: &Path, extra: &[&str]) -> serde_json::Value {
    let o = ok(pbrl(&[&["eval", "--config", "c.toml"], extra].concat(), d));
    let stdout = String::from_utf8_lossy(&o.stdout);
    let path = stdout.lines().find_map(|l| l.strip_prefix("report: ")).unwrap();
    serde_json::from_str(&std::fs::read_to_string(d.join(path)).unwrap()).unwrap()
}

#[test]
fn centralized_collect_train_eval() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d);

    ok(pbrl(&["collect", "--config", "c.toml"], d));
    let round = RoundFile::load(&d.join("run/preference_replay/iteration_0001.json")).unwrap();
    assert!(round.num_pairs > 0, "random tagged text should give non-tied candidates");
    eprintln!("centralized round: {} pairs", round.num_pairs);
    // The oracle scored the roles parsed from the joint text.
    let cfg = Config::load(&d.join("c.toml"), &[]).unwrap();
    let (mut reward, _) = build_reward(&cfg.reward, 10.0).unwrap();
    let item = TaskItem::default();
    for p in &round.pairs {
        assert_eq!((p.prompts.len(), p.winner_completions.len(), p.loser_completions.len()), (1, 1, 1));
        assert!(p.prompts[0].contains("Task of agent_0") && p.prompts[0].contains("Task of agent_1"));
        for (text, want) in [(&p.winner_completions[0], p.winner_reward), (&p.loser_completions[0], p.loser_reward)] {
            let roles = parse_joint_response(text, 2);
            let got = reward.score(&item, &[String::new(), String::new()], &roles).unwrap();
            assert!((got - want).abs() < 1e-12, "{text:?}: parsed roles {roles:?} score {got}, round says {want}");
        }
    }

    let o = ok(pbrl(&["train-madpo", "--config", "c.toml"], d));
    assert!(String::from_utf8_lossy(&o.stdout).contains("trained 1 agents"), "{}", String::from_utf8_lossy(&o.stdout));
    assert!(d.join("run/agents/agent_0/model.safetensors").is_file());
    assert!(!d.join("run/agents/agent_1").exists(), "one actor, one saved model");
    let losses = common::metric_values(&d.join("run"), "madpo/loss");
    eprintln!("centralized MADPO losses: {losses:?}");
    let k = losses.len() / 3;
    assert!(k >= 1 && losses[losses.len() - k..].iter().sum::<f64>() < losses[..k].iter().sum::<f64>(), "{losses:?}");

    // Eval uses the trained actor and reports the roles parsed from its joint text.
    let report = eval_report(d, &[]);
    for r in report["items"].as_array().unwrap() {
        let joint = r["joint_completion"].as_str().unwrap();
        let roles: Vec<String> =
            r["completions"].as_array().unwrap().iter().map(|c| c.as_str().unwrap().to_string()).collect();
        assert_eq!(roles, parse_joint_response(joint, 2));
    }

    // MARLHF on the same round: the reward model reads the joint prompt and text as fitted; RL
    // trains the one actor with the joint scorer.
    ok(pbrl(&["fit-rm", "--config", "c.toml", "reward_eval_fraction=0", "reward_learning_rate=1e-3"], d));
    let before = std::fs::read(d.join("run/agents/agent_0/model.safetensors")).unwrap();
    let o = ok(pbrl(&["train-marlhf", "--config", "c.toml", "num_train_epochs=2", "num_generations=3"], d));
    assert!(String::from_utf8_lossy(&o.stdout).contains("trained 1 agents with magrpo"), "{o:?}");
    let losses = common::metric_values(&d.join("run"), "marlhf/loss/agent_0");
    assert!(!losses.is_empty() && losses.iter().all(|l| l.is_finite()), "{losses:?}");
    let metrics = std::fs::read_to_string(d.join("run/metrics.jsonl")).unwrap();
    let rl_lines = metrics
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["stage"] == "train-marlhf" && v["turn_1/reward_mean"].is_f64())
        .count();
    assert_eq!(rl_lines, 2 * 3, "2 epochs of 3 buffers");
    assert_ne!(before, std::fs::read(d.join("run/agents/agent_0/model.safetensors")).unwrap(), "the actor moved");
    let o = pbrl(&["train-marlhf", "--config", "c.toml", "rl_algorithm=iac"], d);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("the actor-critic backends train decentralized agents"));

    // A round collected by two decentralized agents does not fit one centralized actor.
    ok(pbrl(&["collect", "--config", "c.toml", "collaboration_mode=decentralized", "--run-dir", "dec"], d));
    let o = pbrl(&["train-madpo", "--config", "c.toml", "--run-dir", "dec"], d);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("collaboration_mode centralized"), "{o:?}");
}
