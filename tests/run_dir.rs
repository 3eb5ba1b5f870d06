//! A run directory that fails closed, through the binary on a tiny model: a half-saved team,
//! resumes under a changed setup, a finished run, two commands at once, leftovers of killed
//! commands, non-finite agents.
mod common;

use common::{ok, pbrl};

use std::path::Path;
use std::process::{Command, Stdio};

use candle_core::DType;
use pbrl_model::{tiny::tiny_model, Architecture};

fn setup(d: &Path, extra: &str) {
    tiny_model(Architecture::Llama, true, 41, DType::F32).unwrap().save_hf_dir(&d.join("tiny"), None).unwrap();
    let items: String = (0..4).map(|i| format!("{{\"prompt\": \"w{i} w{} w7\"}}\n", i + 3)).collect();
    std::fs::write(d.join("train.jsonl"), &items).unwrap();
    let cfg = format!(
        "agent_model = \"{}\"\nrun_dir = \"run\"\nseed = 3\nmax_new_tokens = 6\ntemperature = 1.0\ntop_p = 1.0\n\
         preference_num_candidates = 4\npreference_pairs_per_sample = 2\nagent_learning_rate = 1e-3\ntrain_batch_size = 2\n\
         eval_interval = 0\neval_num_samples = 2\ncheckpoint_interval = 1\n{extra}\n[task]\ntrain_file = \"train.jsonl\"\n\
         eval_file = \"train.jsonl\"\nformatters = [\"{{prompt}}\", \"{{prompt}} w9\"]\nchat_template = false\n",
        d.join("tiny").display()
    );
    std::fs::write(d.join("c.toml"), cfg).unwrap();
    ok(pbrl(&["collect", "--config", "c.toml"], d));
}

fn err(o: &std::process::Output) -> String {
    assert_eq!(o.status.code(), Some(2), "expected a user error: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stderr).to_string()
}

#[test]
fn a_partial_team_is_an_error_not_a_base_model() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d, "num_train_epochs = 1");
    ok(pbrl(&["train-madpo", "--config", "c.toml"], d));
    assert!(d.join("run/agents/team.json").is_file());
    // A manifest that lists more agents than the team has, or one outside the team directory.
    let manifest = std::fs::read_to_string(d.join("run/agents/team.json")).unwrap();
    for (agents, want) in [
        (r#"["agent_0", "agent_1", "agent_1"]"#, "lists 3 agents for a team of 2"),
        (r#"["agent_0", "../agents/agent_1"]"#, "agent `../agents/agent_1` is not a subdirectory"),
        (r#"["agent_0", "/tmp"]"#, "agent `/tmp` is not a subdirectory"),
    ] {
        let v: serde_json::Value = serde_json::from_str(&manifest).unwrap();
        let mut v = v.as_object().unwrap().clone();
        v.insert("agents".into(), serde_json::from_str(agents).unwrap());
        std::fs::write(d.join("run/agents/team.json"), serde_json::to_string(&v).unwrap()).unwrap();
        let e = err(&pbrl(&["eval", "--config", "c.toml"], d));
        assert!(e.contains(want), "{agents}: {e}");
    }
    std::fs::write(d.join("run/agents/team.json"), &manifest).unwrap();
    // A kill between two agents' renames (what pbrl before whole-team saves could leave).
    std::fs::remove_dir_all(d.join("run/agents/agent_1")).unwrap();
    let e = err(&pbrl(&["eval", "--config", "c.toml"], d));
    assert!(e.contains("agent_1") && e.contains("missing"), "{e}");
    std::fs::remove_file(d.join("run/agents/team.json")).unwrap();
    let e = err(&pbrl(&["collect", "--config", "c.toml"], d));
    assert!(e.contains("partial"), "{e}");
}

#[test]
fn resume_refuses_a_changed_setup_and_a_finished_run() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d, "num_train_epochs = 2");
    ok(pbrl(&["train-madpo", "--config", "c.toml"], d));
    // Pretend the run was killed after epoch 1: drop what epoch 2 and the end wrote.
    std::fs::remove_dir_all(d.join("run/checkpoints/checkpoint-2")).unwrap();
    std::fs::remove_dir_all(d.join("run/agents")).unwrap();
    for (set, field) in [
        ("agent_learning_rate=1e-4", "agent_learning_rate"),
        ("train_batch_size=1", "train_batch_size"),
        ("seed=4", "seed"),
        ("dpo_beta=0.5", "dpo_beta"),
        ("score_last_token=true", "score_last_token"),
    ] {
        let e = err(&pbrl(&["train-madpo", "--config", "c.toml", "--resume", set], d));
        assert!(e.contains("different setup") && e.contains(field), "{set}: {e}");
    }
    // A changed round file.
    let round = d.join("run/preference_replay/iteration_0001.json");
    let text = std::fs::read_to_string(&round).unwrap();
    std::fs::write(&round, text.replacen("\"iteration\":1", "\"iteration\":1 ", 1)).unwrap();
    let e = err(&pbrl(&["train-madpo", "--config", "c.toml", "--resume"], d));
    assert!(e.contains("round 0001"), "{e}");
    std::fs::write(&round, text).unwrap();
    // A fresh run does not throw away the unfinished run's checkpoints.
    let e = err(&pbrl(&["train-madpo", "--config", "c.toml"], d));
    assert!(e.contains("unfinished") && e.contains("--resume"), "{e}");
    let o = ok(pbrl(&["train-madpo", "--config", "c.toml", "--resume"], d));
    assert!(String::from_utf8_lossy(&o.stdout).contains("resuming from checkpoint-1"));
    // Now finished: resuming again has nothing to continue.
    let e = err(&pbrl(&["train-madpo", "--config", "c.toml", "--resume"], d));
    assert!(e.contains("finished"), "{e}");
    // A fresh run replaces the finished run's checkpoints.
    ok(pbrl(&["train-madpo", "--config", "c.toml"], d));
}

#[test]
fn a_second_command_on_a_locked_run_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d, "num_train_epochs = 1");
    // Hold the lock from another process, as a long collect would; it says when it holds it
    // (a collect started before that would take the lock itself and write its round).
    std::fs::create_dir_all(d.join("run")).unwrap();
    let mut holder = Command::new("flock")
        .args(["-o", "run/.pbrl.lock", "sh", "-c", "touch run/held && sleep 30"])
        .current_dir(d)
        .stdout(Stdio::null())
        .spawn()
        .expect("flock(1) is part of util-linux");
    let lock = d.join("run/.pbrl.lock");
    let start = std::time::Instant::now();
    while !d.join("run/held").exists() && start.elapsed().as_secs() < 20 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let o = pbrl(&["collect", "--config", "c.toml", "--round", "2"], d);
    let last = String::from_utf8_lossy(&o.stderr).to_string();
    assert_eq!(o.status.code(), Some(2), "{last}");
    holder.kill().unwrap();
    holder.wait().unwrap();
    assert!(last.contains("is in use by"), "{last}");
    assert!(lock.exists());
    assert!(!d.join("run/preference_replay/iteration_0002.json").exists(), "nothing written while locked");
    ok(pbrl(&["collect", "--config", "c.toml", "--round", "2"], d));
}

#[test]
fn leftovers_of_killed_commands_are_swept() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d, "num_train_epochs = 1");
    // Names a killed pbrl leaves (pid above the kernel's pid_max: surely dead).
    for p in [
        "run/preference_replay/.iteration_0002.json.tmp-4194305",
        "run/.config.toml.tmp-4194305",
        "run/checkpoints/.checkpoint-1.tmp-4194305/state.json",
        "run/.agents.tmp-4194305/agent_0/config.json",
    ] {
        let p = d.join(p);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, b"partial").unwrap();
    }
    ok(pbrl(&["eval", "--config", "c.toml"], d));
    let mut left = Vec::new();
    for sub in ["run", "run/preference_replay", "run/checkpoints"] {
        for e in std::fs::read_dir(d.join(sub)).unwrap().flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if name.contains(".tmp-") {
                left.push(format!("{sub}/{name}"));
            }
        }
    }
    assert!(left.is_empty(), "{left:?}");
}

/// Nothing outside the run directory is truncated, appended to or removed through a symbolic
/// link: the lock and the metrics are refused as links, the sweep does not enter a linked
/// directory nor follow a linked temporary, a temporary name linked outside is replaced.
#[test]
fn no_file_outside_the_run_directory_changes_through_a_link() {
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d, "num_train_epochs = 1");
    let outside = d.join("outside");
    std::fs::create_dir_all(outside.join("rounds")).unwrap();
    let victim = outside.join("victim.txt");
    std::fs::write(&victim, "precious").unwrap();
    let unchanged = || assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");

    // The lock file and the metrics as links: refused, the target untouched.
    for name in [".pbrl.lock", "metrics.jsonl"] {
        let link = d.join("run").join(name);
        let _ = std::fs::remove_file(&link);
        symlink(&victim, &link).unwrap();
        let e = err(&pbrl(&["eval", "--config", "c.toml"], d));
        assert!(e.contains(&format!("{name} (a symbolic link there is refused)")), "{e}");
        unchanged();
        std::fs::remove_file(&link).unwrap();
    }

    // A dead process's temporaries: in a linked directory (kept), and one that is itself a link
    // to an outside directory (the link removed, the directory kept).
    let stale_outside = outside.join("rounds/.iteration_0009.json.tmp-4194305");
    std::fs::write(&stale_outside, "not ours").unwrap();
    symlink(outside.join("rounds"), d.join("run/linked_rounds")).unwrap();
    symlink(&outside, d.join("run/.agents.tmp-4194305")).unwrap();
    // A temporary name a writer will use, planted as a link to the victim: replaced, not followed.
    let planted = d.join(format!("run/.notes.txt.tmp-{}", std::process::id()));
    symlink(&victim, &planted).unwrap();
    pbrl::run::atomic_write(&d.join("run/notes.txt"), b"mine").unwrap();
    unchanged();
    ok(pbrl(&["eval", "--config", "c.toml"], d));
    assert!(stale_outside.is_file(), "a linked directory is not swept");
    assert!(!d.join("run/.agents.tmp-4194305").exists() && victim.is_file(), "the link went, not its target");
    unchanged();
}

/// Round files, the team and the checkpoints through links: a round name planted as a link is
/// never written through (rounds are created only where nothing is), a linked `agents/` is replaced as a link
/// (its target untouched), and a linked `checkpoints/` (state on another disk, on purpose)
/// receives new checkpoints but loses none of the files already there.
#[test]
fn rounds_agents_and_checkpoints_through_links_leave_outside_files_alone() {
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d, "num_train_epochs = 1");
    let outside = d.join("outside");
    for sub in ["team", "ckpt"] {
        std::fs::create_dir_all(outside.join(sub)).unwrap();
        std::fs::write(outside.join(sub).join("keep.txt"), "precious").unwrap();
    }
    let victim = outside.join("victim.txt");
    std::fs::write(&victim, "precious").unwrap();
    let kept = |p: &Path| assert_eq!(std::fs::read_to_string(p).unwrap(), "precious", "{}", p.display());

    // The round a collect would write next, planted as a link: the name counts as taken, the
    // new round goes to the next one, the link's target is never written.
    let round = d.join("run/preference_replay/iteration_0002.json");
    symlink(&victim, &round).unwrap();
    let o = pbrl(&["collect", "--config", "c.toml"], d);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let next = d.join("run/preference_replay/iteration_0003.json");
    assert!(next.is_file() && !next.is_symlink(), "the new round goes past the planted name");
    kept(&victim);
    std::fs::remove_file(&round).unwrap();
    let _ = std::fs::remove_file(d.join("run/preference_replay/iteration_0003.json"));

    // agents/ and checkpoints/ as links to outside directories.
    symlink(outside.join("team"), d.join("run/agents")).unwrap();
    symlink(outside.join("ckpt"), d.join("run/checkpoints")).unwrap();
    let o = pbrl(&["train-madpo", "--config", "c.toml"], d);
    let e = String::from_utf8_lossy(&o.stderr);
    kept(&outside.join("team/keep.txt"));
    assert!(!outside.join("team/team.json").exists(), "no team written into the link's target");
    kept(&outside.join("ckpt/keep.txt"));
    kept(&victim);
    if o.status.success() {
        assert!(d.join("run/agents/team.json").is_file() && !d.join("run/agents").is_symlink(), "{e}");
    } else {
        assert!(e.contains("agents"), "{e}");
    }
}

/// Saved agents keep the user's umask (027 here: no access for others).
#[test]
fn saved_agents_keep_the_users_umask() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d, "num_train_epochs = 1");
    let cmd = format!("umask 027 && exec '{}' train-madpo --config c.toml", common::pbrl_bin().display());
    let o =
        std::process::Command::new("sh").args(["-c", &cmd]).current_dir(d).env("PBRL_THREADS", "1").output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for f in ["model.safetensors", "config.json", "tokenizer.json"] {
        let mode = std::fs::metadata(d.join("run/agents/agent_0").join(f)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o640, "{f}: {mode:o}");
    }
}

#[test]
fn eval_reports_of_the_same_second_get_distinct_names() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d, "num_train_epochs = 1");
    for _ in 0..3 {
        ok(pbrl(&["eval", "--config", "c.toml"], d));
    }
    assert_eq!(common::eval_reports(&d.join("run")).len(), 3, "one report per eval");
}

#[test]
fn hostile_values_are_refused_with_their_key() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d, "num_train_epochs = 1");
    let cases: &[(&[&str], &str)] = &[
        (&["--threads", "0"], "--threads 0"),
        (&["dpo_beta=nan"], "`dpo_beta` = nan is not a finite number"),
        (&["agent_learning_rate=-1e-5"], "agent_learning_rate must be > 0"),
        (&["reward_timeout_s=1e20"], "reward_timeout_s"),
        (&["max_new_tokens=1000000000000"], "max_new_tokens = 1000000000000"),
        (&["preference_num_candidates=100000000"], "collect_batch_size × preference_num_candidates"),
        (&["reward.kind=command"], "reward: missing field `command`"),
    ];
    for (args, want) in cases {
        let mut all = vec!["collect", "--config", "c.toml", "--round", "9"];
        all.extend_from_slice(args);
        let e = err(&pbrl(&all, d));
        assert!(e.contains(want), "{args:?}: {e}");
        assert!(e.lines().count() == 1 && !e.contains("panicked"), "{args:?}: one line, no panic: {e}");
    }
    let o = Command::new(common::pbrl_bin())
        .args(["collect", "--config", "c.toml", "--round", "9"])
        .current_dir(d)
        .env("PBRL_THREADS", "abc")
        .output()
        .unwrap();
    assert!(err(&o).contains("PBRL_THREADS=\"abc\""));
    // Rewards that overflow once processed: no round file.
    let e = err(&pbrl(&["collect", "--config", "c.toml", "--round", "9", "reward.scale=0.0", "reward.shift=1e308"], d));
    assert!(e.contains("overflow"), "{e}");
    assert!(!d.join("run/preference_replay/iteration_0009.json").exists());
    // Weights driven to infinity: the agents are not saved.
    let e = err(&pbrl(&["train-madpo", "--config", "c.toml", "agent_learning_rate=1e39"], d));
    assert!(e.contains("non-finite"), "{e}");
    assert!(!d.join("run/agents").exists(), "no agents saved");
}

/// Kill train-madpo at random moments (seeded), inside epochs, checkpoint saves and the team
/// save included, resuming each time, until one run completes: the agents equal an
/// uninterrupted run's bit for bit and no temporary file is left.
#[test]
fn killed_at_random_moments_and_resumed_ends_bit_identical() {
    use rand::{Rng, SeedableRng};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d, "num_train_epochs = 24\ncheckpoint_total_limit = 2");
    for run in ["whole", "killed"] {
        std::fs::create_dir_all(d.join(format!("{run}/preference_replay"))).unwrap();
        let round = "preference_replay/iteration_0001.json";
        std::fs::copy(d.join("run").join(round), d.join(run).join(round)).unwrap();
    }
    let t0 = std::time::Instant::now();
    ok(pbrl(&["train-madpo", "--config", "c.toml", "--run-dir", "whole"], d));
    let whole = t0.elapsed();
    assert!(pbrl::run::checkpoint::finished(&d.join("whole")).unwrap().is_some(), "a finished run is marked");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let (mut kills, mut done) = (0, false);
    let args = || {
        let resume = d.join("killed/checkpoints").is_dir()
            && std::fs::read_dir(d.join("killed/checkpoints"))
                .unwrap()
                .flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with("checkpoint-"));
        let mut args = vec!["train-madpo", "--config", "c.toml", "--run-dir", "killed"];
        if resume {
            args.push("--resume");
        }
        args
    };
    for _ in 0..10 {
        // A kill that came after the run marked itself finished (its agents saved) ended a
        // complete run: there is nothing left to resume (and `--resume` says so).
        if pbrl::run::checkpoint::finished(&d.join("killed")).unwrap().is_some() {
            done = true;
            break;
        }
        let args = args();
        let mut child = Command::new(common::pbrl_bin())
            .args(&args)
            .current_dir(d)
            .env("PBRL_THREADS", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let wait = whole.mul_f64(rng.random_range(0.02..0.4));
        let start = std::time::Instant::now();
        while start.elapsed() < wait {
            if child.try_wait().unwrap().is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        match child.try_wait().unwrap() {
            Some(status) => {
                let out = child.wait_with_output().unwrap();
                assert!(status.success(), "a resumed run failed: {}", String::from_utf8_lossy(&out.stderr));
                done = true;
                break;
            }
            None => {
                child.kill().unwrap();
                child.wait().unwrap();
                kills += 1;
            }
        }
    }
    if !done {
        ok(pbrl(&args(), d));
    }
    eprintln!("{kills} kills before a run completed (uninterrupted run: {whole:?})");
    for i in 0..2 {
        let a = std::fs::read(d.join(format!("whole/agents/agent_{i}/model.safetensors"))).unwrap();
        let b = std::fs::read(d.join(format!("killed/agents/agent_{i}/model.safetensors"))).unwrap();
        assert!(a == b, "agent {i}: the killed-and-resumed run's weights differ");
    }
    let mut temps = Vec::new();
    let mut stack = vec![d.join("killed")];
    while let Some(p) = stack.pop() {
        for e in std::fs::read_dir(&p).unwrap().flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if name.contains(".tmp-") || name.contains(".old-") {
                temps.push(e.path());
            }
            if e.path().is_dir() {
                stack.push(e.path());
            }
        }
    }
    assert!(temps.is_empty(), "temporary files left: {temps:?}");
}
