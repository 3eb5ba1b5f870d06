//! Multi-turn discussions end to end on a tiny model: `train-marlhf` (the MAGRPO family, on the
//! task reward) over 2 and 3 turns, aligned and cross joint actions, debate and command
//! transitions, LoRA agents; every turn trained and logged under the reference's names; a
//! resumed run byte-identical to an uninterrupted one; `eval` of discussions with per-turn
//! rewards; what cannot work is refused before any work, and a failing transition program is a
//! clear error naming the program, the item and the turn.
mod common;

use common::{ok, pbrl};

use std::path::Path;

use candle_core::DType;
use pbrl_model::tiny::tiny_model;
use pbrl_model::Architecture;

/// A tiny model, 4 train and 2 eval items, and a config of `extra` keys and tables.
fn setup(d: &Path, extra: &str, tables: &str) {
    tiny_model(Architecture::Llama, true, 51, DType::F32).unwrap().save_hf_dir(&d.join("tiny"), None).unwrap();
    let items = |n: usize, off: usize| -> String {
        (0..n).map(|i| format!("{{\"prompt\": \"w{} w{} w7\"}}\n", i + off, i + off + 3)).collect()
    };
    std::fs::write(d.join("train.jsonl"), items(4, 0)).unwrap();
    std::fs::write(d.join("eval.jsonl"), items(2, 10)).unwrap();
    let cfg = format!(
        "agent_model = \"{}\"\nrun_dir = \"run\"\nseed = 7\nmax_new_tokens = 4\ntemperature = 1.0\ntop_p = 1.0\n\
         num_generations = 2\nrollout_buffer_size = 3\nagent_learning_rate = 1e-2\nrl_reward = \"task\"\n\
         eval_interval = 0\neval_num_samples = 2\neval_samples_per_item = 2\neval_batch_size = 2\n\
         early_termination_threshold = \"none\"\n{extra}\n\
         [task]\ntrain_file = \"train.jsonl\"\neval_file = \"eval.jsonl\"\nformatters = [\"{{prompt}}\", \"{{prompt}} w9\"]\n\
         chat_template = false\n{tables}\n",
        d.join("tiny").display()
    );
    std::fs::write(d.join("c.toml"), cfg).unwrap();
}

const DEBATE: &str = "[transition]\nkind = \"debate\"\ntemplate = \"{prompt} w5 {own} w6 {others}\"\n";

fn lines(run: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn agents(run: &Path) -> Vec<Vec<u8>> {
    (0..2).map(|i| std::fs::read(run.join(format!("agents/agent_{i}/model.safetensors"))).unwrap()).collect()
}

#[test]
fn two_turn_debates_train_every_turn_and_a_resumed_run_is_exact() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d, "num_turns = 2\nnum_train_epochs = 2\ncheckpoint_interval = 1", DEBATE);
    ok(pbrl(&["train-marlhf", "--config", "c.toml"], d));
    let run = d.join("run");
    let updates: Vec<_> = lines(&run).into_iter().filter(|l| l.get("event").is_none()).collect();
    // 1 + 2 nodes per item and a buffer of 3: one item per update, 4 per epoch.
    assert_eq!(updates.len(), 8, "{updates:?}");
    for key in ["turn_1/reward_mean", "turn_2/reward_mean", "turn_1/expected_return", "marlhf/loss/agent_1"] {
        assert!(updates.iter().all(|l| l[key].is_f64()), "{key} missing");
    }
    // Undiscounted: the first turn's expected return is its reward plus the second turn's mean.
    for l in &updates {
        let (r1, g1, g2) = (
            l["turn_1/reward_mean"].as_f64().unwrap(),
            l["turn_1/expected_return"].as_f64().unwrap(),
            l["turn_2/expected_return"].as_f64().unwrap(),
        );
        assert!((g1 - (r1 + g2)).abs() < 1e-9, "{l}");
    }
    let straight = agents(&run);
    assert_ne!(straight[0], std::fs::read(d.join("tiny/model.safetensors")).unwrap(), "agent 0 trained");
    // One epoch, then resumed to two: the same agents, byte for byte.
    std::fs::rename(&run, d.join("straight")).unwrap();
    ok(pbrl(&["train-marlhf", "--config", "c.toml", "--set", "num_train_epochs=1"], d));
    ok(pbrl(&["train-marlhf", "--config", "c.toml", "--resume"], d));
    assert_eq!(agents(&run), straight, "a resumed multi-turn run trains the same agents");
}

#[test]
fn three_turn_cross_discussions_with_a_command_transition_and_lora_agents() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let program = "import json, sys\nfor line in sys.stdin:\n    r = json.loads(line)\n    \
                   n = len(r['responses'])\n    assert all(len(h) == r['turn'] - 1 for h in r['responses'])\n    \
                   print(json.dumps({'prompts': [r['item']['prompt'] + ' w8 ' + r['responses'][(a + 1) % n][-1] for a in range(n)]}), flush=True)\n";
    std::fs::write(d.join("transition.py"), program).unwrap();
    let tables = "[transition]\nkind = \"command\"\ncommand = [\"python3\", \"transition.py\"]\n\
                  [agent_lora]\nr = 4\nalpha = 8\n";
    setup(d, "num_turns = 3\njoint_mode = \"cross\"\nnum_train_epochs = 1", tables);
    ok(pbrl(&["train-marlhf", "--config", "c.toml", "--set", "rollout_buffer_size=21", "--set", "eval_interval=2"], d));
    let all = lines(&d.join("run"));
    let updates: Vec<_> = all.iter().filter(|l| l.get("event").is_none() && l["turn_1/reward_mean"].is_f64()).collect();
    // Cross with 2 agents and K = 2: 4 joint actions per node, 1 + 4 + 16 nodes per item.
    assert_eq!(updates.len(), 4);
    assert!(updates.iter().all(|l| l["turn_3/reward_mean"].is_f64()), "{updates:?}");
    // The periodic evaluations run 3-turn discussions too.
    let evals: Vec<_> = all.iter().filter(|l| l["eval/history_reward_mean"].is_f64()).collect();
    assert!(evals.len() >= 2 && evals.iter().all(|l| l["eval/turn_3/reward_mean"].is_f64()), "{all:?}");
    assert!(d.join("run/agents/agent_0/adapter_model.safetensors").is_file());
}

#[test]
fn eval_runs_discussions_and_reports_every_turn() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d, "num_turns = 3\nhistory_reward = \"sum\"", DEBATE);
    let o = ok(pbrl(&["eval", "--config", "c.toml", "--table"], d));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("eval/turn_3/reward_mean") && out.contains("last turn over the first"), "{out}");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&common::eval_reports(&d.join("run"))[0]).unwrap()).unwrap();
    let records = report["items"].as_array().unwrap();
    assert_eq!(records.len(), 4, "2 items x 2 samples");
    for r in records {
        let turns = r["turns"].as_array().unwrap();
        assert_eq!(turns.len(), 3);
        let sum: f64 = turns.iter().map(|t| t["reward"].as_f64().unwrap()).sum();
        assert!((r["reward"].as_f64().unwrap() - sum).abs() < 1e-12, "history_reward = sum");
        // Turn 2's prompts hold what the debate template wrote.
        assert!(turns[1]["prompts"][0].as_str().unwrap().contains("w5"), "{}", turns[1]["prompts"]);
    }
    let m = &report["metrics"];
    for key in [
        "eval/turn_1/reward_mean",
        "eval/turn_3/expected_return",
        "eval/history_reward_mean",
        "eval/last_over_first_mean",
    ] {
        assert!(m[key].is_f64(), "{key}: {m}");
    }
    // Turn 1 is what a one-turn evaluation of the same team draws.
    setup(d, "", "");
    ok(pbrl(&["eval", "--config", "c.toml", "--run-dir", "one"], d));
    let one: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&common::eval_reports(&d.join("one"))[0]).unwrap()).unwrap();
    assert_eq!(one["metrics"]["eval/turn_1/reward_mean"], m["eval/turn_1/reward_mean"]);
}

#[test]
fn what_cannot_work_is_refused_and_a_failing_transition_names_itself() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d, "num_turns = 2", DEBATE);
    let err = |args: &[&str]| {
        let o = pbrl(args, d);
        assert!(!o.status.success(), "{args:?} should fail");
        String::from_utf8_lossy(&o.stderr).to_string()
    };
    let e = err(&["iterate", "--config", "c.toml"]);
    assert!(e.contains("`pbrl iterate` runs single-turn discussions only"), "{e}");
    let e = err(&["train-marlhf", "--config", "c.toml", "--set", "rl_algorithm=\"iac\""]);
    assert!(e.contains("the MAGRPO family"), "{e}");
    let e =
        err(&["train-marlhf", "--config", "c.toml", "--set", "num_turns=3", "--set", "transition.template=\"{nope}\""]);
    assert!(e.contains("{nope}"), "{e}");
    // The reference's default threshold ends every branch of a reward that is never negative.
    let o = ok(pbrl(
        &[
            "train-marlhf",
            "--config",
            "c.toml",
            "--set",
            "early_termination_threshold=-0.2",
            "--set",
            "num_train_epochs=1",
        ],
        d,
    ));
    assert!(String::from_utf8_lossy(&o.stderr).contains("early termination ended every branch"), "no warning");
    for (program, want) in [
        ("import sys\nsys.stderr.write('boom\\n')\nsys.exit(2)", "exited"),
        (
            "import sys, json\nfor l in sys.stdin:\n    print(json.dumps({'prompts': ['x']}), flush=True)",
            "answered 1 prompts for 2 agents",
        ),
        ("import sys\nfor l in sys.stdin:\n    print('nope', flush=True)", "answered `nope`"),
    ] {
        std::fs::write(d.join("t.py"), program).unwrap();
        let tables = "[transition]\nkind = \"command\"\ncommand = [\"python3\", \"t.py\"]\ntimeout_s = 20.0\n";
        setup(d, "num_turns = 2", tables);
        let _ = std::fs::remove_dir_all(d.join("run"));
        let e = err(&["train-marlhf", "--config", "c.toml"]);
        assert!(e.contains("transition command `python3 t.py`") && e.contains(want), "{e}");
        assert!(!d.join("run/agents").exists() && !d.join("run/marlhf_training/checkpoints").exists());
    }
}

/// The real model: a 2-turn debate of SmolLM2-135M-Instruct agents trained on the task reward,
/// then evaluated; the second turn's prompts are the debate template's, in the chat template.
#[test]
fn smollm2_agents_debate_train_and_evaluate() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("items.jsonl"), "{\"prompt\": \"Describe the sea.\"}\n{\"prompt\": \"Explain rain.\"}\n")
        .unwrap();
    let cfg = format!(
        "agent_model = \"{}\"\nrun_dir = \"run\"\nmax_new_tokens = 8\nnum_turns = 2\nrl_reward = \"task\"\n\
         num_generations = 2\nrollout_buffer_size = 3\nnum_train_epochs = 1\neval_interval = 0\neval_num_samples = 1\n\
         early_termination_threshold = \"none\"\n\
         [task]\ntrain_file = \"items.jsonl\"\neval_file = \"items.jsonl\"\n\
         formatters = [\"{{prompt}} Be brief.\", \"{{prompt}} Be detailed.\"]\n[transition]\nkind = \"debate\"\n",
        common::smollm2().display()
    );
    std::fs::write(d.join("c.toml"), cfg).unwrap();
    let o = ok(pbrl(&["train-marlhf", "--config", "c.toml"], d));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("on the task reward") && out.contains("2 updates"), "{out}");
    ok(pbrl(&["eval", "--config", "c.toml"], d));
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&common::eval_reports(&d.join("run"))[0]).unwrap()).unwrap();
    let second = report["items"][0]["turns"][1]["prompts"][1].as_str().unwrap().to_string();
    assert!(second.starts_with("<|im_start|>system\n") && second.ends_with("<|im_start|>assistant\n"), "{second}");
    assert!(second.contains("The other agents answered:\nAgent 0: ") && second.contains("Be detailed."), "{second}");
}

/// Preferences over whole joint histories: `collect` pairs 2-turn discussions (each pair with
/// every turn of both sides, scored by its last turn), `train-madpo` trains on them (each
/// agent's margin summed over its turns); `fit-rm` and a one-turn MADPO refuse them.
#[test]
fn collect_pairs_discussions_and_madpo_trains_on_them() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(
        d,
        "num_turns = 2\npreference_num_candidates = 4\npreference_pairs_per_sample = 2\ncollect_batch_size = 2\n\
              train_batch_size = 2\nnum_train_epochs = 2",
        DEBATE,
    );
    ok(pbrl(&["collect", "--config", "c.toml"], d));
    let round: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("run/preference_replay/iteration_0001.json")).unwrap()).unwrap();
    let pairs = round["pairs"].as_array().unwrap();
    assert!(!pairs.is_empty());
    for p in pairs {
        let (w, l) = (p["winner_turns"].as_array().unwrap(), p["loser_turns"].as_array().unwrap());
        assert_eq!((w.len(), l.len()), (2, 2));
        assert_eq!(p["winner_reward"], w[1]["reward"], "history_reward = last");
        assert!(p["winner_reward"].as_f64().unwrap() > p["loser_reward"].as_f64().unwrap());
        assert_eq!(p["prompts"], w[0]["prompts"]);
        assert_eq!(p["winner_completions"], w[1]["completions"]);
        assert!(w[1]["prompts"][0].as_str().unwrap().contains("w5"), "turn 2's prompt is the debate's");
    }
    let o = ok(pbrl(&["train-madpo", "--config", "c.toml"], d));
    assert!(String::from_utf8_lossy(&o.stdout).contains("updates"), "{}", String::from_utf8_lossy(&o.stdout));
    let losses = common::metric_values(&d.join("run"), "madpo/loss");
    assert!(!losses.is_empty() && losses.iter().all(|l| l.is_finite()), "{losses:?}");
    assert_ne!(agents(&d.join("run"))[0], std::fs::read(d.join("tiny/model.safetensors")).unwrap());
    let refuse = |args: &[&str], want: &str| {
        let o = pbrl(args, d);
        let e = String::from_utf8_lossy(&o.stderr).to_string();
        assert!(!o.status.success() && e.contains(want), "{args:?}: {e}");
    };
    refuse(&["train-madpo", "--config", "c.toml", "--set", "num_turns=1"], "holds 2-turn histories but num_turns = 1");
    refuse(&["fit-rm", "--config", "c.toml"], "`pbrl fit-rm` runs single-turn discussions only");
    refuse(&["fit-rm", "--config", "c.toml", "--set", "num_turns=1"], "holds 2-turn histories but num_turns = 1");
}
