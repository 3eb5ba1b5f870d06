//! Hostile input against the binary, tallied: bad values for every key the second half reads
//! (fit-rm, train-marlhf, iterate and its comparators, keep-best, eval), broken and foreign files
//! in the run directory, broken command lines. Each case must end in a clean error: exit code 2,
//! no panic, no abort, and a message naming what is wrong (the case's expected text). The tally
//! (clean / unclear / wrong / panics / aborts) is printed; the test fails on anything not clean.
mod common;

use common::{ok, pbrl};

use std::path::Path;
use std::process::Output;

use candle_core::DType;
use pbrl_model::{tiny::tiny_model, Architecture};

/// A tiny team, items, a config (MADPO, 2 agents) and a run `base` with a round and a reward model.
fn setup(d: &Path) {
    tiny_model(Architecture::Llama, true, 51, DType::F32).unwrap().save_hf_dir(&d.join("tiny"), None).unwrap();
    let items: String = (0..6).map(|i| format!("{{\"prompt\": \"w{i} w{} w7\"}}\n", i + 3)).collect();
    std::fs::write(d.join("train.jsonl"), &items).unwrap();
    std::fs::write(d.join("eval.jsonl"), &items).unwrap();
    let cfg = format!(
        "agent_model = \"{}\"\nrun_dir = \"base\"\nseed = 7\nmax_new_tokens = 5\ntemperature = 1.0\ntop_p = 1.0\n\
         preference_num_candidates = 4\npreference_pairs_per_sample = 2\neval_interval = 0\neval_num_samples = 2\n\
         reward_train_batch_size = 2\nreward_num_train_epochs = 1\nreward_eval_fraction = 0\nnum_generations = 2\n\
         rollout_buffer_size = 2\ntrain_batch_size = 2\n\
         [task]\ntrain_file = \"train.jsonl\"\neval_file = \"eval.jsonl\"\nformatters = [\"{{prompt}}\", \"{{prompt}} w9\"]\n\
         chat_template = false\n",
        d.join("tiny").display()
    );
    std::fs::write(d.join("c.toml"), cfg).unwrap();
    ok(pbrl(&["collect", "--config", "c.toml"], d));
    ok(pbrl(&["fit-rm", "--config", "c.toml"], d));
    ok(pbrl(&["train-madpo", "--config", "c.toml"], d));
}

/// A run directory `to` holding what `command` reads of `base` (never its stage state).
fn copy_inputs(d: &Path, command: &str, to: &str) {
    let inputs: &[&str] = match command {
        "fit-rm" | "train-madpo" => &["preference_replay"],
        "train-marlhf" => &["preference_replay", "reward_model"],
        "eval" => &["agents"],
        _ => &[],
    };
    std::fs::create_dir_all(d.join(to)).unwrap();
    for sub in inputs {
        let status = std::process::Command::new("cp").arg("-r").arg(d.join("base").join(sub)).arg(d.join(to)).status();
        assert!(status.unwrap().success());
    }
}

/// Edit a JSON file in place.
fn edit_json(path: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(path, serde_json::to_vec(&v).unwrap()).unwrap();
}

type Prepare = fn(&Path, &Path);

/// One hostile input: a subcommand with overrides (or extra flags) in a run directory prepared
/// from `base` (or fresh), and the text its error must contain.
struct Case {
    command: &'static str,
    args: Vec<String>,
    prepare: Option<Prepare>,
    expect: &'static str,
}

fn case(command: &'static str, args: &[&str], expect: &'static str) -> Case {
    Case { command, args: args.iter().map(|s| s.to_string()).collect(), prepare: None, expect }
}

fn with_files(command: &'static str, args: &[&str], prepare: Prepare, expect: &'static str) -> Case {
    Case { prepare: Some(prepare), ..case(command, args, expect) }
}

/// `command` with `key` set to each of `values`, each refused naming the key.
fn bad(command: &'static str, key: &'static str, values: &[&str]) -> Vec<Case> {
    values.iter().map(|v| Case { args: vec![format!("{key}={v}")], ..case(command, &[], key) }).collect()
}

/// Bad values for the keys the second half reads, each through the command that reads it.
fn value_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    cases.extend(bad("fit-rm", "reward_learning_rate", &["nan", "inf", "-1", "0"]));
    cases.extend(bad("fit-rm", "reward_num_train_epochs", &["0", "-1", "1e12", "4294967297"]));
    cases.extend(bad("fit-rm", "reward_train_batch_size", &["0", "-1", "18446744073709551616"]));
    cases.extend(bad("fit-rm", "reward_eval_fraction", &["1.5", "-0.1", "nan", "1"]));
    cases.extend(bad("fit-rm", "reward_fresh_samples", &["-1", "1000000000", "1"]));
    cases.extend(bad("fit-rm", "reward_max_length", &["0", "-1", "1000000000"]));
    cases.extend(bad("fit-rm", "reward_head", &["\"bogus\"", "3"]));
    cases.extend(bad("fit-rm", "reward_head_hidden", &["0", "-5", "100000000000"]));
    cases.extend(bad("fit-rm", "reward_range", &["[-1e308, 1e308]", "[1.0, 0.0]", "[\"a\", 1]", "[1.0]"]));
    cases.extend(bad("train-marlhf", "rl_algorithm", &["\"bogus\"", "\"\""]));
    cases.extend(bad("train-marlhf", "num_generations", &["0", "1", "-3", "1000000000"]));
    cases.extend(bad("train-marlhf", "rollout_buffer_size", &["0", "-1"]));
    cases.extend(bad("train-marlhf", "advantage_mode", &["\"bogus\""]));
    cases.extend(bad("train-marlhf", "reference_kl_coef", &["nan", "-1", "inf"]));
    cases.extend(bad("train-marlhf", "value_head_hidden_dim", &["100000000000", "0"]));
    cases.extend(bad("train-marlhf", "critic_value_head_hidden_dim", &["100000000000", "-1"]));
    cases.extend(bad("train-marlhf", "value_clip_range", &["nan", "-0.2"]));
    cases.extend(bad("train-marlhf", "agent_learning_rate", &["nan", "-1e-5", "inf"]));
    cases.extend(bad("train-marlhf", "num_train_epochs", &["0", "-2", "4294967297"]));
    cases.extend(bad("train-madpo", "dpo_beta", &["0", "nan", "-1", "inf"]));
    cases.extend(bad("train-madpo", "eval_split", &["1.0", "-0.1", "nan"]));
    cases.extend(bad("train-madpo", "eval_interval", &["-1", "1.5"]));
    cases.extend(bad("train-madpo", "lr_scheduler_type", &["\"bogus\""]));
    cases.extend(bad("train-madpo", "train_batch_size", &["0", "-1"]));
    cases.extend(bad("iterate", "num_iterations", &["0", "-1", "4294967297"]));
    cases.extend(bad("iterate", "comparator_policy", &["\"bogus\"", "\"model\""]));
    cases.push(case("iterate", &["comparator_policy=\"history\"", "comparator_history_k=0"], "comparator_history_k"));
    cases.extend(bad("iterate", "preference_replay_mode", &["\"bogus\"", "\"nearest_k\""]));
    cases.extend(bad("iterate", "preference_replay_lambda", &["nan", "0", "2"]));
    cases.extend(bad("iterate", "preference_replay_k", &["0", "-1"]));
    cases.extend(bad("iterate", "preference_replay_sample_size", &["0", "-1"]));
    cases.extend(bad("iterate", "pair_selection", &["\"bogus\""]));
    cases.extend(bad("iterate", "comparator_api_timeout", &["1e20", "-1", "nan", "0"]));
    cases.extend(bad("iterate", "comparator_api_max_attempts", &["4294967296", "0", "-1"]));
    cases.extend(bad("iterate", "comparator_api_max_n_per_request", &["0", "-1"]));
    cases.extend(bad("eval", "eval_num_samples", &["-1", "1.5"]));
    cases.extend(bad("eval", "eval_samples_per_item", &["0", "-1", "100000000000"]));
    cases.extend(bad("eval", "eval_batch_size", &["0", "-1"]));
    cases.extend(bad("collect", "max_new_tokens", &["0", "-1", "[5]", "[5, 5, 5]", "100000"]));
    cases.extend(bad("collect", "temperature", &["-1", "nan", "inf"]));
    cases.extend(bad("collect", "top_p", &["0", "1.5", "nan"]));
    cases.extend(bad("collect", "top_k", &["-1"]));
    cases.extend(bad("collect", "seed", &["-1", "1.5"]));
    cases.extend(bad("collect", "num_agents", &["0"]));
    cases.push(case("collect", &["num_agents=1000"], "one per agent (1000)"));
    cases.extend(bad("collect", "agent_devices", &["\"tpu\"", "[\"cpu\"]", "\"cuda:99\""]));
    cases.extend(bad("collect", "agent_lora.base_dtype", &["\"q4_0\"", "8"]));
    cases.extend(bad("collect", "agent_lora.compute_dtype", &["\"f16\"", "1", "[\"bf16\", \"f32\"]"]));
    cases.extend(bad("train-madpo", "frozen_dtype", &["\"q4_0\"", "8"]));
    cases.extend(bad("fit-rm", "reward_lora.r", &["0", "[4, 8]", "\"x\""]));
    cases.extend(bad("fit-rm", "reward_lora.save_merged", &["true"]));
    cases.extend(bad("collect", "agent_lora.target_modules", &["3", "\"qproj\"", "[\"all-linear\", \"q_proj\"]"]));
    cases.extend(bad("train-madpo", "agent_lora.save_merged", &["\"yes\"", "1"]));
    cases.extend(bad("train-madpo", "agent_lora.dropout", &["1", "-0.1", "nan", "[0.1, 0.2]"]));
    cases.extend(bad("fit-rm", "reward_lora.dropout", &["1.5", "\"x\""]));
    cases.extend(bad("collect", "preference_num_candidates", &["1", "0", "1000000000"]));
    cases.extend(bad("collect", "collect_batch_size", &["0", "-1"]));
    cases.extend(bad("collect", "task.formatters", &["[]", "[\"\", \"{prompt}\"]"]));
    cases.push(case("collect", &["task.formatters=[\"{nope}\", \"{prompt}\"]"], "`{nope}`"));
    cases.push(case("collect", &["task.train_file=\"missing.jsonl\""], "task file missing.jsonl"));
    cases.push(case("collect", &["task.train_file=\".\""], "task file .: Is a directory"));
    cases.extend(bad("collect", "bogus_key", &["1"]));
    cases
}

/// The API comparator's keys: each bad value is found before any work.
fn api_cases() -> Vec<Case> {
    let api = |extra: &'static str, expect: &'static str| {
        let mut args = vec!["comparator_policy=\"api\"", "comparator_api_model=\"m\""];
        args.extend(extra.split(';').filter(|s| !s.is_empty()));
        case("iterate", &args, expect)
    };
    vec![
        api("", "comparator_api_url"),
        api("comparator_api_url=\"ftp://x\"", "ftp://x"),
        api("comparator_api_url=\"not a url\"", "not a url"),
        api("comparator_api_url=\"http://127.0.0.1:9\";comparator_api_format=\"bogus\"", "bogus"),
        api(
            "comparator_api_url=\"http://127.0.0.1:9\";comparator_api_key_env=\"PBRL_NO_SUCH_VAR\"",
            "PBRL_NO_SUCH_VAR",
        ),
        api("comparator_api_url=\"http://127.0.0.1:9\";comparator_api_headers={X=\"a\\nb\"}", "comparator_api_headers"),
        api(
            "comparator_api_url=\"http://127.0.0.1:9\";comparator_api_headers={\"X Y\"=\"a\"}",
            "comparator_api_headers",
        ),
        api("comparator_api_url=\"http://127.0.0.1:9\";comparator_api_key_header=\"\"", "comparator_api_key_header"),
    ]
}

/// Broken or foreign files in the run directory.
fn file_cases() -> Vec<Case> {
    fn round(run: &Path) -> std::path::PathBuf {
        run.join("preference_replay/iteration_0001.json")
    }
    vec![
        with_files(
            "fit-rm",
            &[],
            |_, r| edit_json(&round(r), |v| v["pairs"][0]["prompts"] = serde_json::json!(["a"])),
            "pair 0 has 1 prompts",
        ),
        with_files(
            "fit-rm",
            &[],
            |_, r| edit_json(&round(r), |v| v["pairs"][0]["winner_completions"] = serde_json::json!(["a", "b", "c"])),
            "3 winner",
        ),
        with_files("fit-rm", &[], |_, r| std::fs::write(round(r), b"{\"pairs\": [").unwrap(), "iteration_0001.json"),
        with_files("train-madpo", &[], |_, r| std::fs::write(round(r), b"\xff\xfe").unwrap(), "iteration_0001.json"),
        with_files(
            "train-madpo",
            &[],
            |_, r| edit_json(&round(r), |v| v["pairs"][0]["winner_reward"] = serde_json::json!("x")),
            "iteration_0001.json",
        ),
        with_files(
            "eval",
            &["--team", "current"],
            |_, r| {
                std::fs::write(r.join("agents/team.json"), b"{\"num_actors\": 2, \"agents\": [\"agent_0\", \"../x\"]}")
                    .unwrap()
            },
            "not a subdirectory",
        ),
        with_files(
            "eval",
            &["--team", "current"],
            |_, r| {
                let t = b"{\"num_actors\": 2, \"agents\": [\"agent_0\", \"agent_1\", \"agent_1\"]}";
                std::fs::write(r.join("agents/team.json"), t).unwrap()
            },
            "lists 3 agents",
        ),
        with_files(
            "eval",
            &["--team", "current"],
            |_, r| std::fs::remove_file(r.join("agents/team.json")).unwrap(),
            "team.json",
        ),
        with_files(
            "eval",
            &["--team", "current"],
            |_, r| std::fs::write(r.join("agents/agent_1/model.safetensors"), b"not safetensors").unwrap(),
            "agent 1",
        ),
        with_files(
            "train-marlhf",
            &[],
            |_, r| std::fs::write(r.join("reward_model/reward_head.safetensors"), b"\0\0\0\0\0\0\0\0").unwrap(),
            "reward_head.safetensors",
        ),
        with_files(
            "train-marlhf",
            &[],
            |_, r| std::fs::write(r.join("reward_model/backbone/model.safetensors"), b"{}").unwrap(),
            "backbone",
        ),
        with_files(
            "eval",
            &[],
            |d, _| std::fs::write(d.join("eval.jsonl"), b"{\"prompt\": \"w1\"}\n{not json}\n").unwrap(),
            "line 2",
        ),
        with_files(
            "eval",
            &[],
            |d, _| std::fs::write(d.join("eval.jsonl"), b"{\"topic\": \"w1\"}\n").unwrap(),
            "prompt",
        ),
        with_files("collect", &[], |d, _| std::fs::write(d.join("train.jsonl"), b"").unwrap(), "train.jsonl"),
    ]
}

/// Broken command lines and config files.
fn command_line_cases() -> Vec<Case> {
    vec![
        case("collect", &["--threads", "0"], "threads"),
        case("collect", &["--threads", "abc"], "threads"),
        case("collect", &["novalue"], "novalue"),
        case("collect", &["=1"], "=1"),
        case("collect", &["seed=\"seven\""], "seed"),
        with_files("collect", &[], |d, _| std::fs::write(d.join("c.toml"), b"seed = 1\nseed = 2\n").unwrap(), "seed"),
    ]
}

/// What one run came to.
#[derive(Debug, PartialEq, Clone, Copy)]
enum Outcome {
    Clean,
    Unclear,
    Wrong,
    Panic,
    Abort,
}

fn outcome(o: &Output, expect: &str) -> Outcome {
    let err = String::from_utf8_lossy(&o.stderr);
    match o.status.code() {
        None => Outcome::Abort,
        Some(101) => Outcome::Panic,
        _ if err.contains("panicked at") => Outcome::Panic,
        Some(0) => Outcome::Wrong,
        Some(_) if err.contains(expect) => Outcome::Clean,
        Some(_) => Outcome::Unclear,
    }
}

#[test]
fn every_hostile_input_ends_in_a_clean_error() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d);
    let good_config = std::fs::read(d.join("c.toml")).unwrap();
    let good_items = (std::fs::read(d.join("train.jsonl")).unwrap(), std::fs::read(d.join("eval.jsonl")).unwrap());
    let cases: Vec<Case> =
        [value_cases(), api_cases(), file_cases(), command_line_cases()].into_iter().flatten().collect();
    let mut tally: Vec<(Outcome, String)> = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let run = format!("case{i}");
        copy_inputs(d, c.command, &run);
        if let Some(prepare) = c.prepare {
            prepare(d, &d.join(&run));
        }
        let mut args = vec![c.command, "--config", "c.toml", "--run-dir", &run];
        args.extend(c.args.iter().map(String::as_str));
        let o = std::process::Command::new(common::pbrl_bin())
            .args(&args)
            .current_dir(d)
            .env("PBRL_THREADS", "1")
            .env("RUST_BACKTRACE", "0")
            .output()
            .unwrap();
        let got = outcome(&o, c.expect);
        let line = String::from_utf8_lossy(&o.stderr).lines().last().unwrap_or("").to_string();
        tally.push((got, format!("{} {}: {got:?}: {line}", c.command, c.args.join(" "))));
        // Undo what the case did to the shared inputs.
        std::fs::write(d.join("c.toml"), &good_config).unwrap();
        std::fs::write(d.join("train.jsonl"), &good_items.0).unwrap();
        std::fs::write(d.join("eval.jsonl"), &good_items.1).unwrap();
        std::fs::remove_dir_all(d.join(&run)).ok();
    }
    let count = |k: Outcome| tally.iter().filter(|(o, _)| *o == k).count();
    for (_, line) in &tally {
        eprintln!("{line}");
    }
    let counts = [Outcome::Clean, Outcome::Unclear, Outcome::Wrong, Outcome::Panic, Outcome::Abort].map(count);
    eprintln!(
        "{} hostile inputs: {} clean, {} unclear, {} wrong, {} panics, {} aborts",
        tally.len(),
        counts[0],
        counts[1],
        counts[2],
        counts[3],
        counts[4]
    );
    let bad: Vec<&String> = tally.iter().filter(|(o, _)| *o != Outcome::Clean).map(|(_, l)| l).collect();
    assert!(bad.is_empty(), "not clean:\n{}", bad.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n"));
}
