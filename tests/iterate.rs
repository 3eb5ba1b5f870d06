//! `pbrl iterate` end to end on a tiny model: rounds against each comparator source, the round
//! files and per-round reports, resume (after a finished round and after a round cut short)
//! giving the same round files and agents as an uninterrupted run, and the refusals.
mod common;

use common::api_server::{Fault, FaultServer};
use common::{ok, pbrl};

use std::path::Path;

use candle_core::DType;
use pbrl::prefs::RoundFile;
use pbrl_model::{tiny::tiny_model, Architecture};

fn setup(d: &Path, extra: &str) {
    tiny_model(Architecture::Llama, true, 51, DType::F32).unwrap().save_hf_dir(&d.join("tiny"), None).unwrap();
    let items: String = (0..4).map(|i| format!("{{\"prompt\": \"w{i} w{} w7\"}}\n", i + 3)).collect();
    std::fs::write(d.join("train.jsonl"), &items).unwrap();
    std::fs::write(d.join("eval.jsonl"), &items).unwrap();
    let cfg = format!(
        "agent_model = \"{}\"\nrun_dir = \"run\"\nseed = 7\nmax_new_tokens = 5\ntemperature = 1.0\ntop_p = 1.0\n\
         preference_num_candidates = 4\neval_interval = 0\neval_num_samples = 4\nagent_learning_rate = 1e-3\n\
         train_batch_size = 2\n{extra}\n\
         [task]\ntrain_file = \"train.jsonl\"\neval_file = \"eval.jsonl\"\nformatters = [\"{{prompt}}\", \"{{prompt}} w9\"]\n\
         chat_template = false\n",
        d.join("tiny").display()
    );
    std::fs::write(d.join("c.toml"), cfg).unwrap();
}

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string()
}

fn bytes(d: &Path, p: &str) -> Vec<u8> {
    std::fs::read(d.join(p)).unwrap_or_else(|e| panic!("{p}: {e}"))
}

/// Runs `a` and `b` wrote the same round files and agents, byte for byte.
fn assert_same_run(d: &Path, a: &str, b: &str, rounds: u32) {
    let files = (1..=rounds)
        .map(|r| format!("preference_replay/iteration_{r:04}.json"))
        .chain((0..2).map(|i| format!("agents/agent_{i}/model.safetensors")));
    for p in files {
        assert!(bytes(d, &format!("{a}/{p}")) == bytes(d, &format!("{b}/{p}")), "{p} differs between {a} and {b}");
    }
}

#[test]
fn three_rounds_against_the_current_team_then_an_exact_resume() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d, "num_iterations = 3");
    let o = ok(pbrl(&["iterate", "--config", "c.toml"], d));
    assert!(stdout(&o).contains("3 rounds in"), "{}", stdout(&o));
    for r in 1..=3u32 {
        let round = RoundFile::load(&d.join(format!("run/preference_replay/iteration_{r:04}.json"))).unwrap();
        assert_eq!(round.iteration, r);
        assert!(round.num_pairs > 0 && round.num_pairs <= 4 * 4, "round {r}: {} pairs", round.num_pairs);
        for p in &round.pairs {
            let raw = p.raw_rewards.as_ref().unwrap();
            let (t, c) = (p.target_raw_reward.unwrap(), p.comparator_raw_reward.unwrap());
            assert!(raw[0] > raw[1] && (raw == &[t, c] || raw == &[c, t]), "{p:?}");
        }
        assert!(d.join(format!("run/iterate/round_{r:04}.json")).is_file());
    }
    assert!(d.join("run/iterate/round_0000.json").is_file(), "the base evaluation");
    assert!(d.join("run/iterate/eval_reward.svg").is_file());
    // The round-by-round summary `scripts/quickstart.sh` prints after an iterate job.
    let summary = std::process::Command::new("python3")
        .arg(common::repo().join("scripts/summarize_runs.py"))
        .arg(d.join("run"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&summary.stdout);
    assert!(summary.status.success(), "{text}{}", String::from_utf8_lossy(&summary.stderr));
    assert!(text.lines().any(|l| l.trim_start().starts_with("round 3: ")), "{text}");
    let hist: serde_json::Value =
        serde_json::from_slice(&bytes(d, "run/reward_distributions/iteration_0002.json")).unwrap();
    for side in ["target", "comparator"] {
        assert_eq!(hist["candidate"][side]["sample_count"], 4 * 4, "{side}: 4 items x 4 candidates");
        assert!(d.join(format!("run/reward_distributions/iteration_0002_{side}.svg")).is_file());
    }
    let evals = common::metric_values(&d.join("run"), "iter/eval_reward_mean");
    assert_eq!(evals.len(), 4, "rounds 0-3");
    // Learning so far, paired by prompt: from round 1 on, on stdout, in the metrics and summaries.
    let summary = |r: u32| -> serde_json::Value {
        serde_json::from_slice(&bytes(d, &format!("run/iterate/round_{r:04}.json"))).unwrap()
    };
    let means = |r: u32| -> Vec<f64> {
        summary(r)["eval_item_means"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect()
    };
    let (base, last) = (means(0), means(3));
    assert_eq!(base.len(), 4, "one mean per eval prompt");
    let gain = base.iter().zip(&last).map(|(b, a)| a - b).sum::<f64>() / 4.0;
    assert!((summary(3)["trend"]["gain"][0].as_f64().unwrap() - gain).abs() < 1e-9);
    assert!((evals[3] - evals[0] - gain).abs() < 1e-9, "the paired gain is the change of the mean");
    assert!(summary(0).get("trend").is_none());
    assert_eq!(common::metric_values(&d.join("run"), "iter/eval_slope").len(), 3, "rounds 1-3");
    for r in 1..=3 {
        assert!(stdout(&o).contains(&format!("round {r}: gain over the base team")), "{}", stdout(&o));
    }
    assert_eq!(common::metric_values(&d.join("run"), "iter/current_preference_pairs").len(), 4);
    assert_ne!(bytes(d, "run/agents/agent_0/model.safetensors"), bytes(d, "tiny/model.safetensors"));

    // The same run in steps: one round, then a resume to three, with round 2 cut short (its
    // training done and snapshot saved, its summary not written).
    ok(pbrl(&["iterate", "--config", "c.toml", "--run-dir", "b", "num_iterations=2"], d));
    std::fs::remove_file(d.join("b/iterate/round_0002.json")).unwrap();
    let o = ok(pbrl(&["iterate", "--config", "c.toml", "--run-dir", "b", "--resume", "num_iterations=3"], d));
    assert!(stdout(&o).contains("round 2:") && !stdout(&o).contains("round 1:"), "{}", stdout(&o));
    assert_same_run(d, "run", "b", 3);

    // Refusals: a fresh run over this one, a resume under another setup.
    let o = pbrl(&["iterate", "--config", "c.toml"], d);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("pass --resume"));
    let o = pbrl(&["iterate", "--config", "c.toml", "--resume", "dpo_beta=0.5"], d);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("dpo_beta"), "{o:?}");
    // Fewer rounds than the run has done: refused (its team is the third round's).
    let o = pbrl(&["iterate", "--config", "c.toml", "--resume", "num_iterations=2"], d);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("already has 3 rounds, more than num_iterations = 2"), "{e}");
}

#[test]
fn history_and_model_comparators() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d, "num_iterations = 3\ncomparator_policy = \"previous\"\ncomparator_num_candidates = 3");
    ok(pbrl(&["iterate", "--config", "c.toml"], d));
    // k = 1: a round compares with the snapshot of the round before; the one before that is
    // kept only as the last round's input (for a resume), older ones are pruned.
    let mut kept: Vec<String> = std::fs::read_dir(d.join("run/policy_checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    kept.sort();
    assert_eq!(kept, vec!["iteration_0001", "iteration_0002"], "{kept:?}");
    let round = RoundFile::load(&d.join("run/preference_replay/iteration_0001.json")).unwrap();
    assert!(round.num_pairs > 0);

    let cfg = format!("comparator_policy=model\ncomparator_model_name={}", d.join("tiny").display());
    let args: Vec<&str> = cfg.lines().collect();
    let mut argv =
        vec!["iterate", "--config", "c.toml", "--run-dir", "m", "num_iterations=1", "comparator_policy=model"];
    argv.push(args[1]);
    let o = ok(pbrl(&argv, d));
    assert!(stdout(&o).contains("round 1:"));
    // The model comparator stored in bf16 (`frozen_dtype`); q8_0 cannot pack the tiny model.
    argv[4] = "mb";
    let o = ok(pbrl(&[&argv[..], &["frozen_dtype=\"bf16\""]].concat(), d));
    assert!(stdout(&o).contains("round 1:"));
    argv[4] = "mq";
    let o = pbrl(&[&argv[..], &["frozen_dtype=\"q8_0\""]].concat(), d);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.code() == Some(2) && e.contains("comparator") && e.contains("frozen_dtype"), "{e}");
    // A centralized comparator (the current agent 1 writing both roles in the tagged prompt): the
    // tiny model writes no tags, so every reply counts as unparsed and scores as empty roles.
    let argv = ["iterate", "--config", "c.toml", "--run-dir", "c", "num_iterations=1", "comparator_policy=current"];
    let o = ok(pbrl(
        &[&argv[..], &["comparator_generation_mode=single_agent", "comparator_centralized_agent_index=1"]].concat(),
        d,
    ));
    assert!(stdout(&o).contains("round 1:"));
    assert_eq!(common::metric_values(&d.join("c"), "iter/comparator_unparsed"), vec![0.0, 12.0], "4 items x 3 replies");
    let round = RoundFile::load(&d.join("c/preference_replay/iteration_0001.json")).unwrap();
    assert!(round.pairs.iter().all(|p| p.loser_completions == vec![String::new(), String::new()]));
    let o = pbrl(&["iterate", "--config", "c.toml", "--run-dir", "x", "comparator_policy=model"], d);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("needs comparator_model_name"));
}

/// An OpenAI-compatible local server as the comparator; its key comes from the environment and
/// never reaches the run directory.
#[test]
fn an_api_comparator_and_its_key() {
    let server = FaultServer::start();
    // Every first answer far longer than max_new_tokens (5).
    server.standing(Fault::Overlong(40));
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d, &api_comparator(&server.url));
    let o = with_key(&["iterate", "--config", "c.toml"], d);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!server.auth().is_empty() && server.auth().iter().all(|h| h.ends_with("Bearer sk-iterate-secret")));
    let round = RoundFile::load(&d.join("run/preference_replay/iteration_0001.json")).unwrap();
    assert!(round.pairs.iter().any(|p| p
        .winner_completions
        .iter()
        .chain(&p.loser_completions)
        .any(|c| c.contains("w5"))));
    for entry in walk(&d.join("run")) {
        let text = String::from_utf8_lossy(&std::fs::read(&entry).unwrap()).to_string();
        assert!(!text.contains("sk-iterate-secret"), "the key is in {}", entry.display());
    }
    assert!(!String::from_utf8_lossy(&o.stderr).contains("sk-iterate-secret"));
    // Overlong answers are cut at max_new_tokens, and counted.
    let words = round.pairs.iter().flat_map(|p| p.winner_completions.iter().chain(&p.loser_completions));
    assert!(words.map(|c| c.split_whitespace().count()).max().unwrap() <= 5);
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("run/iterate/round_0001.json")).unwrap()).unwrap();
    assert!(summary["comparator_truncated"].as_u64().unwrap() >= 1, "{summary}");
    // A bad API format is found before the run directory records anything: the corrected
    // command then runs there.
    let o = with_key(&["iterate", "--config", "c.toml", "--run-dir", "fixed", "comparator_api_format=bogus"], d);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("bogus"), "{e}");
    assert!(!d.join("fixed/iterate").exists() && !d.join("fixed/eval").exists());
    assert!(with_key(&["iterate", "--config", "c.toml", "--run-dir", "fixed"], d).status.success());
    // Fewer answers than asked: an error, never empty responses in the round.
    server.standing(Fault::FewerChoices);
    let o = with_key(&["iterate", "--config", "c.toml", "--run-dir", "short"], d);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("returned 3 completions for agent 0, 4 were asked"), "{e}");
    // Without the variable: a clear error naming it.
    let o = pbrl(&["iterate", "--config", "c.toml", "--run-dir", "nokey"], d);
    assert!(String::from_utf8_lossy(&o.stderr).contains("PBRL_TEST_KEY"), "{o:?}");
}

/// The API comparator's settings for `setup`, with a short timeout and two tries per request.
fn api_comparator(url: &str) -> String {
    format!(
        "num_iterations = 1\ncomparator_policy = \"api\"\ncomparator_api_url = \"{url}\"\ncomparator_api_format = \
         \"openai\"\ncomparator_api_model = \"local\"\ncomparator_api_key_env = \"PBRL_TEST_KEY\"\n\
         comparator_api_timeout = 1.0\ncomparator_api_max_attempts = 2"
    )
}

/// `pbrl ARGS` in `d` on one thread, with the API key in the environment.
fn with_key(args: &[&str], d: &Path) -> std::process::Output {
    std::process::Command::new(common::pbrl_bin())
        .args(args)
        .current_dir(d)
        .env("PBRL_THREADS", "1")
        .env("PBRL_TEST_KEY", "sk-iterate-secret")
        .output()
        .unwrap()
}

/// A server that fails each request once (a 429 with a zero Retry-After, a 500, a
/// stall past the timeout, truncated JSON, a body that is not UTF-8) costs a retry and changes
/// nothing: the round equals one against a server that never failed. A server that keeps
/// failing ends `iterate` with a one-line error naming the API (no panic), and once it is fixed
/// `--resume` finishes that same round.
#[test]
fn a_faulty_api_server_fails_cleanly_and_the_run_resumes_once_it_is_fixed() {
    let server = FaultServer::start();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d, &api_comparator(&server.url));
    let clean = with_key(&["iterate", "--config", "c.toml", "--run-dir", "clean"], d);
    assert!(clean.status.success(), "{}", String::from_utf8_lossy(&clean.stderr));
    let per_run = server.served();
    let transient = [
        Fault::RetryAfter("0"),
        Fault::Status(500),
        Fault::Stall(std::time::Duration::from_millis(1500)),
        Fault::Truncated,
        Fault::NonUtf8,
    ];
    // Each request fails once, then succeeds on its retry.
    server.queue(&transient.iter().cycle().take(per_run).flat_map(|f| [f.clone(), Fault::None]).collect::<Vec<_>>());
    let o = with_key(&["iterate", "--config", "c.toml", "--run-dir", "flaky"], d);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_same_run(d, "clean", "flaky", 1);
    assert_eq!(server.served(), 3 * per_run, "one failure and one retry per request");
    // Down for good: a clean failure, then a resume once fixed.
    for (k, fault) in [Fault::Status(503), Fault::NonUtf8, Fault::Truncated, Fault::Status(401), Fault::FewerChoices]
        .into_iter()
        .enumerate()
    {
        let run = format!("down{k}");
        server.standing(fault.clone());
        let o = with_key(&["iterate", "--config", "c.toml", "--run-dir", &run], d);
        let e = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{fault:?}: {e}");
        assert!(!e.contains("panicked") && e.contains("omparator API"), "{fault:?}: {e}");
        server.standing(Fault::None);
        let o = with_key(&["iterate", "--config", "c.toml", "--run-dir", &run, "--resume"], d);
        assert!(o.status.success(), "{fault:?}, resumed: {}", String::from_utf8_lossy(&o.stderr));
        assert_same_run(d, "clean", &run, 1);
    }
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// One MARLHF round: the comparison, a reward model fitted on it, RL on that model.
#[test]
fn a_marlhf_round() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(
        d,
        "num_iterations = 2\nalgorithm = \"marlhf\"\nreward_eval_fraction = 0\nnum_generations = 2\n\
         preference_scoring_reward = \"learned\"",
    );
    let o = ok(pbrl(&["iterate", "--config", "c.toml", "--print-config"], d));
    assert!(stdout(&o).contains("reward_num_train_epochs = 2") && stdout(&o).contains("num_train_epochs = 2"));
    let o = ok(pbrl(&["iterate", "--config", "c.toml"], d));
    assert!(stdout(&o).contains("round 2:"), "{}", stdout(&o));
    assert!(d.join("run/reward_model/reward_model.json").is_file());
    // Round 1 is scored by the task reward, round 2 by round 1's reward model (raw = processed).
    let r1 = RoundFile::load(&d.join("run/preference_replay/iteration_0001.json")).unwrap();
    let r2 = RoundFile::load(&d.join("run/preference_replay/iteration_0002.json")).unwrap();
    assert!(r1.pairs.iter().all(|p| (0.0..=1.0).contains(&p.winner_reward)), "the task reward is in [0, 1]");
    for p in &r2.pairs {
        assert_eq!(p.raw_rewards.as_deref(), Some(&[p.winner_reward, p.loser_reward][..]));
    }
    let o = pbrl(&["iterate", "--config", "c.toml", "--run-dir", "x", "algorithm=madpo"], d);
    assert!(String::from_utf8_lossy(&o.stderr).contains("needs algorithm = 'marlhf'"), "{o:?}");
    assert!(!common::metric_values(&d.join("run"), "marlhf/loss/agent_0").is_empty());
    assert_ne!(bytes(d, "run/agents/agent_0/model.safetensors"), bytes(d, "tiny/model.safetensors"));
}

/// A 3-round run killed (SIGKILL) at many moments and resumed each time ends with the round
/// files and agents of an uninterrupted run.
#[test]
fn killed_at_random_moments_and_resumed_it_ends_as_an_uninterrupted_run() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d, "num_iterations = 3");
    let started = std::time::Instant::now();
    ok(pbrl(&["iterate", "--config", "c.toml", "--run-dir", "a"], d));
    let full = started.elapsed();
    // Kill times spread over the run (a fixed pseudo-random sequence, so failures reproduce).
    let mut x: u64 = 12345;
    let (mut kills, mut finished) = (0, false);
    for _ in 0..40 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let after = full.mul_f64(0.05 + 0.55 * ((x >> 33) as f64 / (1u64 << 31) as f64));
        let mut args = vec!["iterate", "--config", "c.toml", "--run-dir", "b"];
        if d.join("b/iterate/fingerprint.json").exists() {
            args.push("--resume");
        }
        let mut child = std::process::Command::new(common::pbrl_bin())
            .args(&args)
            .current_dir(d)
            .env("PBRL_THREADS", "1")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(after);
        match child.try_wait().unwrap() {
            Some(status) => {
                let out = child.wait_with_output().unwrap();
                assert!(status.success(), "{}", String::from_utf8_lossy(&out.stderr));
                finished = true;
                break;
            }
            None => {
                child.kill().unwrap();
                child.wait().unwrap();
                kills += 1;
            }
        }
    }
    if !finished {
        ok(pbrl(&["iterate", "--config", "c.toml", "--run-dir", "b", "--resume"], d));
    }
    eprintln!("killed {kills} times");
    assert!(kills >= 1, "the run should have been cut at least once ({kills})");
    assert_same_run(d, "a", "b", 3);
}

/// `current_copy` on the agents' own devices is `current` (the reference's rule), and the
/// replay selection draws across rounds (`nearest_k`, a fixed sample size). The team as its
/// own comparator samples both sides in one call: its first round is the one a `model`
/// comparator of the same weights (sampled in calls of its own) gives.
#[test]
fn current_copy_and_replay_across_rounds() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d, "num_iterations = 2\npreference_replay_mode = \"nearest_k\"\npreference_replay_k = 2\npreference_replay_sample_size = 5");
    ok(pbrl(&["iterate", "--config", "c.toml", "--run-dir", "cur"], d));
    ok(pbrl(&["iterate", "--config", "c.toml", "--run-dir", "copy", "comparator_policy=online_copy"], d));
    for r in 1..=2 {
        let p = format!("preference_replay/iteration_{r:04}.json");
        assert!(bytes(d, &format!("cur/{p}")) == bytes(d, &format!("copy/{p}")), "round {r}");
    }
    let model = format!("comparator_model_name=\"{}\"", d.join("tiny").display());
    let argv = ["iterate", "--config", "c.toml", "--run-dir", "model", "num_iterations=1", "comparator_policy=model"];
    ok(pbrl(&[&argv[..], &[model.as_str()]].concat(), d));
    let p = "preference_replay/iteration_0001.json";
    assert!(bytes(d, &format!("cur/{p}")) == bytes(d, &format!("model/{p}")), "round 1, current against model");
    let trained = common::metric_values(&d.join("cur"), "iter/train_preference_pairs");
    assert_eq!(trained, vec![0.0, 5.0, 5.0], "round 0 (base eval), then 5 pairs drawn from the last 2 rounds");
}

/// `items_per_round = 2` of 4 train items: rounds 1 and 2 compare on disjoint halves, round 3
/// wraps around to round 1's half; without the key every round compares on every item.
#[test]
fn items_per_round_splits_the_train_items_over_the_rounds() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d, "num_iterations = 3");
    ok(pbrl(&["iterate", "--config", "c.toml", "--run-dir", "split", "items_per_round=2"], d));
    ok(pbrl(&["iterate", "--config", "c.toml", "--run-dir", "all", "num_iterations=1"], d));
    let prompts = |run: &str, r: u32| -> std::collections::BTreeSet<String> {
        let f = RoundFile::load(&d.join(format!("{run}/preference_replay/iteration_{r:04}.json"))).unwrap();
        f.pairs.iter().map(|p| p.prompts[0].clone()).collect()
    };
    let (r1, r2, r3) = (prompts("split", 1), prompts("split", 2), prompts("split", 3));
    assert!((1..=2).contains(&r1.len()) && (1..=2).contains(&r2.len()), "{r1:?} {r2:?}");
    assert!(r1.is_disjoint(&r2), "rounds 1 and 2 share items: {r1:?} {r2:?}");
    assert!(r3.is_disjoint(&r2) && !r3.is_empty(), "round 3 takes round 1's half again: {r3:?} {r2:?}");
    assert_eq!(prompts("all", 1).len(), 4, "every item without the key");
    let items = |run: &str, r: u32| -> u64 {
        let f = d.join(format!("{run}/iterate/round_{r:04}.json"));
        serde_json::from_slice::<serde_json::Value>(&std::fs::read(f).unwrap()).unwrap()["items"].as_u64().unwrap()
    };
    assert_eq!(((1..=3).map(|r| items("split", r)).collect::<Vec<_>>(), items("all", 1)), (vec![2, 2, 2], 4));
    let e = pbrl(&["iterate", "--config", "c.toml", "--run-dir", "split", "--resume", "items_per_round=3"], d);
    assert!(String::from_utf8_lossy(&e.stderr).contains("items_per_round"), "a resume under another split is refused");
}

/// An item whose prompt is empty is refused before the run directory records anything (no base
/// evaluation, no fingerprint), naming the item and the agent; fixed, the same command runs.
#[test]
fn an_empty_prompt_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d, "num_iterations = 1");
    let good = std::fs::read_to_string(d.join("train.jsonl")).unwrap();
    let mut lines: Vec<&str> = good.lines().collect();
    lines[2] = "{\"prompt\": \"  \"}";
    std::fs::write(d.join("train.jsonl"), lines.join("\n") + "\n").unwrap();
    let o = pbrl(&["iterate", "--config", "c.toml"], d);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("train item 2: agent 0's prompt is empty"), "{e}");
    assert!(!d.join("run/iterate").exists() && !d.join("run/eval").exists(), "nothing recorded");
    std::fs::write(d.join("train.jsonl"), good).unwrap();
    ok(pbrl(&["iterate", "--config", "c.toml"], d));
}

/// The team as its own comparator samples both sides' rows at once, so the memory check counts
/// both: a comparator side too large for memory is refused before the round samples anything.
#[test]
fn both_sides_rows_are_counted_when_the_team_is_its_own_comparator() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d, "num_iterations = 1");
    let o = pbrl(&["iterate", "--config", "c.toml", "comparator_num_candidates=100000000"], d);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("collect_batch_size × (both sides' candidates)"), "{e}");
    assert!(!d.join("run/preference_replay/iteration_0001.json").exists());
}
