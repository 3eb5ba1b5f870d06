//! The JSON-lines command reward: the shipped example equals the built-in length-ratio reward,
//! and every way a reward program can fail is a clear error naming the command.
mod common;

use pbrl::task::command::CommandReward;
use pbrl::task::reward::{LengthRatio, TaskReward};
use pbrl::task::TaskItem;

fn item() -> TaskItem {
    serde_json::json!({"prompt": "Describe the sea."}).as_object().unwrap().clone()
}

fn joints() -> Vec<Vec<String>> {
    let pairs = [("short", "a bit longer!"), ("", "x"), ("abc", "abcdefgh"), ("hello there", "hi"), ("é", "日本")];
    pairs.iter().map(|(a, b)| vec![a.to_string(), b.to_string()]).collect()
}

fn python(code: &str) -> Vec<String> {
    vec!["python3".into(), "-c".into(), code.into()]
}

#[test]
fn example_program_equals_the_builtin_reward() {
    let script = common::repo().join("examples/rewards/length_ratio.py");
    let mut cmd = CommandReward::spawn(&["python3".into(), script.display().to_string()], &[], 30.0).unwrap();
    let prompts = vec!["p0".to_string(), "p1".to_string()];
    let got = cmd.score_batch(&item(), &prompts, &joints()).unwrap();
    let mut builtin = LengthRatio { target_min: 2.0, target_max: 3.0 };
    for (g, j) in got.iter().zip(joints()) {
        let want = builtin.score(&item(), &prompts, &j).unwrap();
        assert!((g - want).abs() < 1e-12, "{j:?}: command {g} vs built-in {want}");
    }
    // The same process answers again (long-lived), one joint at a time too.
    assert_eq!(cmd.score(&item(), &prompts, &joints()[2]).unwrap(), got[2]);
}

fn failure(code: &str, timeout_s: f64) -> String {
    let mut cmd = CommandReward::spawn(&python(code), &[], timeout_s).unwrap();
    let prompts = vec!["p0".to_string(), "p1".to_string()];
    format!("{:#}", cmd.score_batch(&item(), &prompts, &joints()).unwrap_err())
}

/// A reward program gets PATH, HOME, LANG and what `reward.env` names, nothing else of pbrl's
/// environment (cargo sets CARGO_MANIFEST_DIR for this test process; an API key would be alike).
#[test]
fn a_reward_program_gets_a_minimal_environment() {
    let code = "import sys, json, os\nfor line in sys.stdin:\n    n = len(json.loads(line)['items'])\n    \
                r = 10.0 * ('PATH' in os.environ) + ('CARGO_MANIFEST_DIR' in os.environ) + 100.0 * ('CARGO_PKG_NAME' in os.environ)\n    \
                print(json.dumps({'rewards': [r] * n}), flush=True)";
    assert!(std::env::var_os("CARGO_MANIFEST_DIR").is_some(), "run under cargo test");
    let prompts = vec!["p0".to_string(), "p1".to_string()];
    let mut minimal = CommandReward::spawn(&python(code), &[], 10.0).unwrap();
    assert_eq!(minimal.score(&item(), &prompts, &joints()[0]).unwrap(), 10.0);
    let mut named = CommandReward::spawn(&python(code), &["CARGO_MANIFEST_DIR".into()], 10.0).unwrap();
    assert_eq!(named.score(&item(), &prompts, &joints()[0]).unwrap(), 11.0);
}

#[test]
fn failing_programs_give_clear_errors() {
    let read = "import sys, json\nfor line in sys.stdin:\n    n = len(json.loads(line)['items'])\n";
    let e = failure("import sys\nsys.stderr.write('boom: bad config\\n')\nsys.exit(3)", 10.0);
    assert!(e.contains("reward command `python3 -c") && e.contains("exit") && e.contains("boom: bad config"), "{e}");
    let e = failure(&format!("{read}    import time; time.sleep(30)"), 0.5);
    assert!(e.contains("no answer within 0.5 s"), "{e}");
    let e = failure(&format!("{read}    print(json.dumps({{'rewards': [1.0]}}), flush=True)"), 10.0);
    assert!(e.contains("answered 1 rewards for 5 joint responses"), "{e}");
    let e = failure(&format!("{read}    print('not json', flush=True)"), 10.0);
    assert!(e.contains("answered `not json`"), "{e}");
    let e = failure(&format!("{read}    print(json.dumps({{'rewards': [float('nan')] * n}}), flush=True)"), 10.0);
    assert!(e.contains("not {\"rewards\": [numbers]}") || e.contains("non-finite"), "{e}");
    let e = format!("{:#}", CommandReward::spawn(&["/nonexistent/reward-program".into()], &[], 1.0).err().unwrap());
    assert!(e.contains("cannot start reward command `/nonexistent/reward-program`"), "{e}");
}

/// A reward program's own children end with it: pbrl starts it in its own process group and
/// ends the group.
#[test]
fn the_reward_programs_children_do_not_outlive_it() {
    let d = tempfile::tempdir().unwrap();
    let pidfile = d.path().join("child.pid");
    let code = format!(
        "import json, subprocess, sys\np = subprocess.Popen(['sleep', '300'])\nopen({:?}, 'w').write(str(p.pid))\n\
         for line in sys.stdin:\n    n = len(json.loads(line)['completions'][0])\n    print(json.dumps({{'rewards': [0.0] * n}}), flush=True)\n",
        pidfile.display().to_string()
    );
    let mut cmd = CommandReward::spawn(&python(&code), &[], 30.0).unwrap();
    cmd.score_batch(&item(), &["p".into(), "q".into()], &joints()).unwrap();
    let pid: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
    drop(cmd);
    let alive = || {
        std::path::Path::new(&format!("/proc/{pid}")).exists()
            && !std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default().contains(") Z ")
    };
    let start = std::time::Instant::now();
    while alive() && start.elapsed().as_secs() < 5 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(!alive(), "the reward program's child {pid} outlived it");
}
