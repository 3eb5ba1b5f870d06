//! The real binary: user errors are one line with exit code 2; `pbrl eval` runs end to end on
//! the real SmolLM2 model with small settings.
mod common;

use common::pbrl;

use std::path::Path;
use std::process::{Command, Output};

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

/// A one-line error on stderr, exit code 2, no panic or backtrace.
fn assert_user_error(o: &Output, needle: &str) {
    let e = stderr(o);
    assert_eq!(o.status.code(), Some(2), "stderr: {e}");
    assert!(e.starts_with("error: ") && e.trim_end().lines().count() == 1, "not one line: {e:?}");
    assert!(e.contains(needle), "{e:?} should mention {needle:?}");
    assert!(!e.contains("panicked") && !e.contains("backtrace"), "{e}");
}

#[test]
fn user_errors_are_one_line_with_exit_code_2() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cfg = write(d, "c.toml", "agent_model = \"nowhere/x.gguf\"\ndpo_betta = 0.1\n");
    assert_user_error(
        &pbrl(&["eval", "--config", &cfg], d),
        "c.toml line 2: unknown key `dpo_betta`; did you mean `dpo_beta`?",
    );
    let cfg = write(d, "c2.toml", "agent_model = \"nowhere/x.gguf\"\n");
    assert_user_error(
        &pbrl(&["eval", "--config", &cfg, "pair_selection=all"], d),
        "preference_pairs_per_sample must be null when pair_selection='all'.",
    );
    assert_user_error(&pbrl(&["eval", "--config", &cfg, "--set", "max_new_tokens"], d), "is not KEY=VALUE");
    assert_user_error(&pbrl(&["eval", "--config", "missing.toml"], d), "cannot read config missing.toml");
    assert_user_error(&pbrl(&["eval", "--config", &cfg], d), "task.eval_file is not set");
    let items = write(d, "e.jsonl", "{\"prompt\": \"hi\"}\n");
    let set = format!("task.eval_file={items}");
    assert_user_error(
        &pbrl(&["eval", "--config", &cfg, &set, "agent_model=models/none.gguf"], d),
        "scripts/fetch-model.sh",
    );
    let model = common::smollm2().display().to_string();
    let m = format!("agent_model={model}");
    #[cfg(not(feature = "cuda"))]
    assert_user_error(
        &pbrl(&["eval", "--config", &cfg, &set, &m, "agent_devices=[\"cpu\", \"cuda:0\"]"], d),
        "agent_devices[1]: `cuda:0` needs a pbrl built with the `cuda` feature",
    );
    let bad_items = write(d, "bad.jsonl", "{\"prompt\": \"hi\"}\nnot json\n");
    assert_user_error(
        &pbrl(&["eval", "--config", &cfg, &format!("task.eval_file={bad_items}"), &m], d),
        "bad.jsonl line 2: invalid JSON",
    );
}

#[test]
fn print_config_shows_the_resolved_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write(dir.path(), "c.toml", "seed = 3\n");
    let o = pbrl(&["eval", "--config", &cfg, "--print-config", "dpo_beta=0.5"], dir.path());
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    for line in ["seed = 3", "dpo_beta = 0.5", "preference_num_candidates = 80", "pair_selection = \"reward_gap\""] {
        assert!(out.lines().any(|l| l == line), "missing {line:?} in:\n{out}");
    }
    assert!(!dir.path().join("runs").exists(), "--print-config writes nothing");
}

#[test]
fn eval_runs_end_to_end_on_the_real_model() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let items = write(
        d,
        "eval.jsonl",
        "{\"prompt\": \"Describe the sea.\"}\n{\"prompt\": \"Explain rain.\"}\n{\"prompt\": \"unused\"}\n",
    );
    let cfg = write(
        d,
        "c.toml",
        &format!(
            "run_dir = \"run\"\nagent_model = \"{}\"\nmax_new_tokens = 8\neval_num_samples = 2\neval_batch_size = 2\n\
             [task]\neval_file = \"{items}\"\nformatters = [\"{{prompt}} Be brief.\", \"{{prompt}} Be detailed.\"]\n",
            common::smollm2().display()
        ),
    );
    let o = pbrl(&["eval", "--config", &cfg], d);
    assert!(o.status.success(), "{}", stderr(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("eval/turn_1/reward_mean"), "{stdout}");
    let reports = common::eval_reports(&d.join("run"));
    assert_eq!(reports.len(), 1);
    assert!(d.join("run/eval/eval_reward.svg").is_file(), "the run's evaluations drawn");
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&reports[0]).unwrap()).unwrap();
    let items = r["items"].as_array().unwrap();
    assert_eq!(items.len(), 2);
    let mean = r["metrics"]["eval/turn_1/reward_mean"].as_f64().unwrap();
    let by_hand = items.iter().map(|i| i["reward"].as_f64().unwrap()).sum::<f64>() / 2.0;
    assert!((mean - by_hand).abs() < 1e-12);
    assert_eq!(r["metrics"]["eval/turn_1/expected_return"].as_f64().unwrap(), mean);
    let prompt0 = items[0]["prompts"][0].as_str().unwrap();
    assert!(
        prompt0.starts_with("<|im_start|>system\n")
            && prompt0.ends_with("Describe the sea. Be brief.<|im_end|>\n<|im_start|>assistant\n"),
        "{prompt0:?}"
    );
    assert_eq!(items[0]["completions"].as_array().unwrap().len(), 2);
    assert!(d.join("run/config.toml").is_file());
    let metrics = std::fs::read_to_string(d.join("run/metrics.jsonl")).unwrap();
    assert!(metrics.contains("\"eval/turn_1/reward_mean\""));

    // Same config and seed: the same completions (a second report, the first kept).
    let o = pbrl(&["eval", "--config", &cfg], d);
    assert!(o.status.success(), "{}", stderr(&o));
    let reports = common::eval_reports(&d.join("run"));
    assert_eq!(reports.len(), 2);
    let again: serde_json::Value = serde_json::from_slice(&std::fs::read(&reports[1]).unwrap()).unwrap();
    assert_eq!(again["items"], r["items"]);

    // Three samples per item: six joint responses; each item's first sample is the one-sample run's.
    let o = pbrl(&["eval", "--config", &cfg, "eval_samples_per_item=3", "--table"], d);
    assert!(o.status.success(), "{}", stderr(&o));
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(table.lines().any(|l| l.trim_start().starts_with("1.2 ")), "rows are labelled item.sample: {table}");
    let three = common::eval_reports(&d.join("run"))
        .into_iter()
        .map(|p| serde_json::from_slice::<serde_json::Value>(&std::fs::read(p).unwrap()).unwrap())
        .find(|rep| rep["items"].as_array().unwrap().len() == 6)
        .expect("a report with 2 items x 3 samples");
    let records = three["items"].as_array().unwrap();
    let samples: Vec<u64> = records.iter().map(|x| x["sample"].as_u64().unwrap()).collect();
    assert_eq!(samples, [0, 1, 2, 0, 1, 2]);
    assert_eq!(records[0], items[0]);
    assert_eq!(records[3], items[1]);
    let rewards: Vec<f64> = records.iter().map(|x| x["reward"].as_f64().unwrap()).collect();
    let mean = three["metrics"]["eval/turn_1/reward_mean"].as_f64().unwrap();
    assert!((mean - rewards.iter().sum::<f64>() / 6.0).abs() < 1e-12);
    let (m0, m1) = (rewards[..3].iter().sum::<f64>() / 3.0, rewards[3..].iter().sum::<f64>() / 3.0);
    let se = three["metrics"]["eval/turn_1/reward_stderr"].as_f64().unwrap();
    assert!((se - (m0 - m1).abs() / 2.0).abs() < 1e-12, "{se} vs item means {m0} {m1}");
}

/// A hub id resolves through the standard Hugging Face cache (`$HF_HOME/hub`) without network;
/// a file missing from the cache and an unreachable hub give a message that says what to do.
#[test]
fn hub_ids_load_from_the_cache_and_fail_clearly_offline() {
    use candle_core::DType;
    use pbrl_model::{tiny::tiny_model, Architecture};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let snapshot = d.join("hf/hub/models--tiny-org--tiny-llama/snapshots/0123abcd");
    tiny_model(Architecture::Llama, true, 11, DType::F32).unwrap().save_hf_dir(&snapshot, None).unwrap();
    std::fs::create_dir_all(d.join("hf/hub/models--tiny-org--tiny-llama/refs")).unwrap();
    std::fs::write(d.join("hf/hub/models--tiny-org--tiny-llama/refs/main"), "0123abcd").unwrap();
    let items = write(d, "e.jsonl", "{\"prompt\": \"w1 w2 w3\"}\n");
    let cfg = write(
        d,
        "c.toml",
        &format!("run_dir = \"run\"\nmax_new_tokens = 4\neval_num_samples = 1\n[task]\neval_file = \"{items}\"\nchat_template = false\n"),
    );
    let run = |model: &str| {
        Command::new(common::pbrl_bin())
            .args(["eval", "--config", &cfg, &format!("agent_model={model}")])
            .current_dir(d)
            .env("PBRL_THREADS", "1")
            .env("HF_HOME", d.join("hf"))
            .env("HF_ENDPOINT", "http://127.0.0.1:9") // nothing listens there: no network use
            .output()
            .unwrap()
    };
    let o = run("tiny-org/tiny-llama");
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("eval/turn_1/reward_mean"));
    assert_user_error(
        &run("tiny-org/not-cached"),
        "`tiny-org/not-cached` is no local file or directory, and it could not be fetched",
    );
}
