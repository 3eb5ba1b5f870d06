//! Evaluation with the task reward: every held-out item answered `eval_samples_per_item` times
//! by the team, each joint response scored (after reward_processor); the mean and its standard
//! error over items. Used by `pbrl eval` and `iterate` (`evaluate_run`: a team of the run directory,
//! recorded there) and by the periodic evaluation during training (`evaluate`).
use anyhow::{bail, Context, Result};
use serde_json::json;

use crate::algo::trend::{item_means, paired_gain, MeanSe};
use crate::config::{Config, EvalSplit};
use crate::oracle::Oracle;
use crate::progress;
use crate::rng::{derive_seed, purpose};
use crate::run::{atomic_create, atomic_write, RunDir};
use crate::task::split::held_out_items;
use crate::task::{load_items, TaskItem};
use crate::team::rollout::rollout;
use crate::team::{check_fits, load_members, Agent, Members};

/// The first `eval_num_samples` items of a held-out file (`split` names it in errors), each
/// checked to give every role a prompt.
fn held_out_file_items(
    cfg: &Config,
    file: Option<&std::path::PathBuf>,
    key: &str,
    split: &str,
) -> Result<Vec<TaskItem>> {
    let file = file.with_context(|| format!("{key} is not set: this evaluation needs its items"))?;
    let mut items = load_items(file)?;
    items.truncate(cfg.eval_num_samples as usize);
    crate::task::check_prompts(&cfg.role_templates(), items.iter().enumerate(), split)?;
    Ok(items)
}

/// The held-out items an evaluation uses (`None` when `eval_num_samples` is 0).
pub fn eval_items(cfg: &Config) -> Result<Option<Vec<TaskItem>>> {
    if cfg.eval_num_samples == 0 {
        return Ok(None);
    }
    Ok(Some(held_out_file_items(cfg, cfg.task.eval_file.as_ref(), "task.eval_file", "eval")?))
}

/// The items of the periodic evaluation during training: the eval file's (as `pbrl eval`), the
/// validation file's, or with `eval_split = x` the held-out train items; at most `eval_num_samples`.
pub fn periodic_eval_items(cfg: &Config) -> Result<Option<Vec<TaskItem>>> {
    if cfg.eval_num_samples == 0 {
        return Ok(None);
    }
    Ok(Some(match cfg.eval_split {
        EvalSplit::EvalFile => return eval_items(cfg),
        EvalSplit::ValidationFile => {
            held_out_file_items(cfg, cfg.task.validation_file.as_ref(), "task.validation_file", "validation")?
        }
        EvalSplit::TrainShare(_) => {
            let mut items = held_out_items(cfg)?;
            items.truncate(cfg.eval_num_samples as usize);
            items
        }
    }))
}

pub struct Evaluation {
    /// One per (item, sample), item-major.
    pub records: Vec<serde_json::Value>,
    pub rewards: Vec<f64>,
    /// Standard error of the mean over items (each item's samples averaged first, since they
    /// share a prompt); 0 with a single item.
    pub reward_stderr: f64,
    pub tokens: usize,
}

impl Evaluation {
    pub fn reward_mean(&self) -> f64 {
        crate::algo::trend::mean(&self.rewards)
    }

    /// Each item's mean reward over its samples, in item order (what paired comparisons
    /// between two evaluations of the same items read).
    pub fn item_means(&self, samples_per_item: usize) -> Vec<f64> {
        item_means(&self.rewards, samples_per_item)
    }

    /// Mean length in characters of each role's responses.
    pub fn response_chars_mean(&self) -> Vec<f64> {
        let mut sums: Vec<f64> = Vec::new();
        for r in &self.records {
            for (a, c) in r["completions"].as_array().into_iter().flatten().enumerate() {
                if sums.len() <= a {
                    sums.resize(a + 1, 0.0);
                }
                sums[a] += c.as_str().map_or(0, |c| c.chars().count()) as f64;
            }
        }
        sums.iter().map(|s| s / self.records.len().max(1) as f64).collect()
    }

    /// `line` (an object) with [`Evaluation::metrics`] added: a metrics.jsonl line.
    pub fn with_metrics(&self, mut line: serde_json::Value) -> serde_json::Value {
        if let (Some(l), serde_json::Value::Object(m)) = (line.as_object_mut(), self.metrics()) {
            l.extend(m);
        }
        line
    }

    /// The metrics every evaluation logs: reward mean, its standard error, each role's response
    /// length.
    pub fn metrics(&self) -> serde_json::Value {
        let mean = self.reward_mean();
        let mut m = json!({"eval/turn_1/reward_mean": mean, "eval/turn_1/expected_return": mean,
            "eval/turn_1/reward_stderr": self.reward_stderr});
        for (a, chars) in self.response_chars_mean().iter().enumerate() {
            m[format!("eval/agent_{a}/response_chars_mean")] = json!(chars);
        }
        m
    }
}

/// Each agent samples `eval_samples_per_item` completions per item (batches of
/// `eval_batch_size` items, a prompt's samples sharing its prefill); each joint response is
/// scored with the task reward and reward_processor. The draws come from the streams under
/// `stream` (`cfg.seed` for `pbrl eval`; see [`periodic_eval_stream`]). Used by `pbrl eval` and
/// by the periodic evaluation during training.
pub fn evaluate(
    cfg: &Config,
    team: &[Agent],
    items: &[TaskItem],
    oracle: &mut Oracle,
    stream: u64,
) -> Result<Evaluation> {
    check_fits(team, items, &cfg.max_new_tokens(), cfg.eval_rows(), "eval")?;
    let params = cfg.sampling();
    let k = cfg.eval_samples_per_item as usize;
    let centralized = cfg.modes.centralized;
    let bar = progress::bar(items.len() as u64, "eval");
    let started = std::time::Instant::now();
    let mut generated = 0usize;
    let mut records = Vec::with_capacity(items.len());
    let mut rewards = Vec::with_capacity(items.len());
    for (batch_idx, batch) in items.chunks(cfg.eval_batch_size as usize).enumerate() {
        let first = batch_idx * cfg.eval_batch_size as usize;
        let seed = |j: usize, a: usize, r: usize| eval_seed(stream, first + j, a, r);
        let out = rollout(team, batch, k, &params, seed, |n| {
            generated += n;
            bar.set_message(format!("{:.1} tok/s", generated as f64 / started.elapsed().as_secs_f64()));
        })?;
        for (j, item) in batch.iter().enumerate() {
            let p = out.prompts[j].clone();
            let joints: Vec<Vec<String>> = (0..k).map(|draw| out.texts(j, draw)).collect();
            let scores = oracle.score(item, &p, &joints)?.processed;
            for (draw, (actor_outputs, r)) in joints.iter().zip(scores).enumerate() {
                let c = oracle.role_outputs(actor_outputs);
                if !r.is_finite() {
                    bail!("the reward of eval item {} (sample {draw}) is not finite ({r})", first + j);
                }
                rewards.push(r);
                let mut record = json!({"item": item, "sample": draw, "prompts": p, "completions": c, "reward": r});
                if centralized {
                    record["joint_completion"] = json!(actor_outputs[0]);
                }
                records.push(record);
            }
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    let reward_stderr = stderr_over_items(&rewards, k);
    let out = Evaluation { records, rewards, reward_stderr, tokens: generated };
    let mean = out.reward_mean();
    if !(mean.is_finite() && reward_stderr.is_finite()) {
        bail!(
            "the eval rewards overflow when averaged (mean {mean}, standard error {reward_stderr}); lower reward.scale \
             / reward.shift"
        );
    }
    Ok(out)
}

/// The stream of the periodic evaluations of a training on `rounds`: `seed`'s (that of
/// `pbrl eval`) up to round 1, a stream of its own for each later round. Within one training
/// every evaluation draws the same samples, so keep-best compares its checkpoints on common
/// random numbers; across rounds the streams differ, so a round's starting team, which the
/// previous round kept *because* it scored best on its stream, is scored afresh instead of
/// carrying that selected (optimistic) score as the bar the next round must beat.
pub fn periodic_eval_stream(seed: u64, rounds: &[u32]) -> u64 {
    match rounds.iter().max() {
        Some(&newest) if newest > 1 => derive_seed(seed, &[purpose::EVAL_ROUND, newest as u64]),
        _ => seed,
    }
}

/// The seed of agent `agent`'s sample `sample` for eval item `item`. Sample 0 keeps the
/// one-sample stream, so `eval_samples_per_item = 1` evaluates exactly as before it existed.
fn eval_seed(seed: u64, item: usize, agent: usize, sample: usize) -> u64 {
    let mut path = vec![purpose::EVAL, item as u64, agent as u64];
    if sample > 0 {
        path.push(sample as u64);
    }
    derive_seed(seed, &path)
}

/// Standard error of the mean reward over items: rewards come item-major, `k` per item; an
/// item's samples are averaged first (they share a prompt, so they are not independent).
fn stderr_over_items(rewards: &[f64], k: usize) -> f64 {
    let means = item_means(rewards, k);
    if means.len() < 2 {
        return 0.0;
    }
    MeanSe::of(&means).se
}

/// One `pbrl eval` report as the history reads it.
pub struct PastEval {
    pub team: String,
    pub reward_mean: f64,
    pub reward_stderr: f64,
    /// Each item's mean over its samples, with the item (what pairs two evaluations).
    pub item_means: Vec<(String, f64)>,
    pub samples_per_item: u64,
}

/// An evaluation of a run directory's team, recorded there.
pub struct RunEvaluation {
    pub evaluation: Evaluation,
    /// Each eval item's mean reward over its samples, in the eval file's order.
    pub item_means: Vec<f64>,
    /// The report written (`eval/eval-<time>.json`).
    pub path: std::path::PathBuf,
    /// The run directory's evaluations so far, this one last.
    pub history: EvalHistory,
}

impl RunEvaluation {
    pub fn mean(&self) -> f64 {
        self.evaluation.reward_mean()
    }
}

/// Evaluate a team of the run directory (`members`) on the eval items, and record it there: the
/// report `eval/eval-<UTC time>.json` (every joint response), a metrics line, and the plot of
/// the run directory's evaluations so far (`eval/eval_reward.svg`).
pub fn evaluate_run(cfg: &Config, run_dir: &RunDir, members: &Members) -> Result<RunEvaluation> {
    let items = eval_items(cfg)?.context("eval_num_samples is 0: nothing to evaluate")?;
    let mut oracle = Oracle::new(cfg)?;
    let team = load_members(cfg, run_dir, members)?;
    let started = std::time::Instant::now();
    let evaluation = evaluate(cfg, &team, &items, &mut oracle, cfg.seed)?;
    let team_label = match members {
        Members::Base => "base".to_string(),
        Members::Current if run_dir.agents().is_dir() => "agents".to_string(),
        Members::Current => "base".to_string(),
        Members::Saved(dir) => dir.display().to_string(),
    };
    let report = json!({"metrics": evaluation.metrics(), "team": team_label,
        "samples_per_item": cfg.eval_samples_per_item, "items": evaluation.records});
    let stem = chrono::Utc::now().format("eval-%Y%m%dT%H%M%SZ").to_string();
    let path = write_new_report(&run_dir.eval(), &stem, serde_json::to_string_pretty(&report)?.as_bytes())?;
    run_dir.log_metrics(&evaluation.with_metrics(json!({
        "stage": "eval", "time": chrono::Utc::now().to_rfc3339(), "num_items": items.len(),
        "samples_per_item": cfg.eval_samples_per_item,
        "tokens_per_s": evaluation.tokens as f64 / started.elapsed().as_secs_f64(),
    })))?;
    let item_means = evaluation.item_means(cfg.eval_samples_per_item as usize);
    let history = EvalHistory::read(&run_dir.eval())?;
    atomic_write(&run_dir.eval_plot(), history.svg(&run_dir.root).as_bytes())?;
    Ok(RunEvaluation { evaluation, item_means, path, history })
}

/// Write `<dir>/<stem>.json`, or `<stem>-2.json`, ... when a report of the same second exists;
/// each name is created exclusively, so two evals never write the same report.
fn write_new_report(dir: &std::path::Path, stem: &str, bytes: &[u8]) -> Result<std::path::PathBuf> {
    for k in 1.. {
        let p = if k == 1 { dir.join(format!("{stem}.json")) } else { dir.join(format!("{stem}-{k}.json")) };
        if p.exists() {
            continue;
        }
        match atomic_create(&p, bytes) {
            Ok(()) => return Ok(p),
            Err(_) if p.exists() => continue,
            Err(e) => return Err(e),
        }
    }
    unreachable!("an unused report name exists")
}

/// The evaluations of a run directory (`<run_dir>/eval/eval-*.json`), oldest first.
pub struct EvalHistory {
    pub reports: Vec<PastEval>,
}

impl EvalHistory {
    pub fn read(dir: &std::path::Path) -> Result<Self> {
        let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("eval-") && n.ends_with(".json"))
            })
            .collect();
        // Names are UTC timestamps (`eval-20261204T011712Z[-k].json`): their order is the runs' order.
        files.sort_by_key(|p| report_order(p));
        let mut reports = Vec::with_capacity(files.len());
        for f in files {
            let bytes = std::fs::read(&f).with_context(|| format!("reading {}", f.display()))?;
            let v: serde_json::Value =
                serde_json::from_slice(&bytes).with_context(|| format!("{}: not an eval report", f.display()))?;
            reports.push(PastEval::of(&v));
        }
        Ok(Self { reports })
    }

    /// The last evaluation's gain over the first, paired by prompt: when both scored the same
    /// items, as many samples each.
    pub fn gain_over_first(&self) -> Option<MeanSe> {
        let (first, last) = (self.reports.first()?, self.reports.last()?);
        let same_items = first.item_means.len() == last.item_means.len()
            && first.item_means.iter().zip(&last.item_means).all(|(a, b)| a.0 == b.0)
            && first.samples_per_item == last.samples_per_item;
        (self.reports.len() >= 2 && same_items && !first.item_means.is_empty()).then(|| {
            let values = |r: &PastEval| r.item_means.iter().map(|m| m.1).collect::<Vec<f64>>();
            paired_gain(&values(first), &values(last))
        })
    }

    /// Each evaluation's mean ± s.e. in order; the title names the first and the last team and
    /// the paired gain between them.
    pub fn svg(&self, run_dir: &std::path::Path) -> String {
        let x = |i: usize| (i + 1) as f64;
        let line = |f: &dyn Fn(&PastEval) -> f64| -> Vec<(f64, f64)> {
            self.reports.iter().enumerate().map(|(i, r)| (x(i), f(r))).collect()
        };
        let panel = crate::plot::Panel {
            title: "eval/turn_1/reward_mean ± s.e. over items".into(),
            series: vec![
                ("mean".into(), line(&|r| r.reward_mean)),
                ("+1 s.e.".into(), line(&|r| r.reward_mean + r.reward_stderr)),
                ("-1 s.e.".into(), line(&|r| r.reward_mean - r.reward_stderr)),
            ],
        };
        let describe = |r: &PastEval| format!("{} {:.3}", r.team, r.reward_mean);
        let mut title = format!("pbrl eval: {}", run_dir.display());
        if let (Some(first), Some(last)) = (self.reports.first(), self.reports.last()) {
            title += &format!(": {} -> {}", describe(first), describe(last));
        }
        if let Some(g) = self.gain_over_first() {
            title += &format!(" (paired gain {:+.3} ± {:.3})", g.mean, g.se);
        }
        crate::plot::line_panels(&title, "evaluation", &[panel])
    }
}

impl PastEval {
    /// From a report's JSON; fields a report of an older pbrl lacks read as unknown.
    fn of(v: &serde_json::Value) -> Self {
        let metric = |k: &str| v["metrics"][k].as_f64().unwrap_or(f64::NAN);
        let mut item_means: Vec<(String, f64, usize)> = Vec::new();
        for r in v["items"].as_array().into_iter().flatten() {
            let (item, reward) = (r["item"].to_string(), r["reward"].as_f64().unwrap_or(f64::NAN));
            // Records are item-major: an item's samples are consecutive.
            match item_means.last_mut() {
                Some(last) if last.0 == item => {
                    last.1 += reward;
                    last.2 += 1;
                }
                _ => item_means.push((item, reward, 1)),
            }
        }
        Self {
            team: v["team"].as_str().unwrap_or("?").to_string(),
            reward_mean: metric("eval/turn_1/reward_mean"),
            reward_stderr: metric("eval/turn_1/reward_stderr"),
            item_means: item_means.into_iter().map(|(i, s, n)| (i, s / n as f64)).collect(),
            samples_per_item: v["samples_per_item"].as_u64().unwrap_or(0),
        }
    }
}

/// A report's place in time: its timestamp, then its `-k` suffix (`eval-T.json` before `eval-T-2.json`).
fn report_order(p: &std::path::Path) -> (String, u64) {
    let stem = p.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    match stem.rsplit_once('-') {
        Some((t, k)) if t.contains('T') && k.chars().all(|c| c.is_ascii_digit()) => {
            (t.to_string(), k.parse().unwrap_or(0))
        }
        _ => (stem.to_string(), 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stderr_averages_each_items_samples_first() {
        // Two items, two samples each: item means 0.5 and 1.0 → sd 0.3536, se 0.25.
        assert!((stderr_over_items(&[0.0, 1.0, 1.0, 1.0], 2) - 0.25).abs() < 1e-12);
        // Identical item means: no spread between items, whatever the samples do.
        assert_eq!(stderr_over_items(&[0.0, 1.0, 1.0, 0.0], 2), 0.0);
        assert_eq!(stderr_over_items(&[0.3], 1), 0.0);
    }

    #[test]
    fn periodic_evaluations_draw_a_fresh_stream_after_round_one() {
        assert_eq!(periodic_eval_stream(42, &[]), 42);
        assert_eq!(periodic_eval_stream(42, &[1]), 42);
        let (r2, r3) = (periodic_eval_stream(42, &[1, 2]), periodic_eval_stream(42, &[3]));
        assert!(r2 != 42 && r3 != 42 && r2 != r3);
        assert_eq!(periodic_eval_stream(42, &[2, 1]), r2);
    }

    /// Each `eval_split` takes the periodic evaluation's items from its own place, and only a
    /// share takes them out of the train items.
    #[test]
    fn each_eval_split_evaluates_its_own_items() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, n: usize| {
            let path = dir.path().join(name);
            let lines: Vec<String> = (0..n).map(|i| json!({"prompt": format!("{name} {i}")}).to_string()).collect();
            std::fs::write(&path, lines.join("\n")).unwrap();
            path
        };
        let mut cfg = Config::default();
        cfg.task.train_file = Some(file("train", 10));
        cfg.task.eval_file = Some(file("eval", 6));
        cfg.task.validation_file = Some(file("validation", 5));
        cfg.eval_num_samples = 4;
        let prompts = |cfg: &Config| -> Vec<String> {
            periodic_eval_items(cfg).unwrap().unwrap().iter().map(|it| it["prompt"].to_string()).collect()
        };
        let trained = |cfg: &Config| crate::task::split::train_items(cfg).unwrap().len();
        cfg.eval_split = EvalSplit::ValidationFile;
        assert_eq!(prompts(&cfg), ["\"validation 0\"", "\"validation 1\"", "\"validation 2\"", "\"validation 3\""]);
        assert_eq!(trained(&cfg), 10, "every train item is trained on");
        cfg.eval_split = EvalSplit::EvalFile;
        assert!(prompts(&cfg).iter().all(|p| p.contains("eval")));
        assert_eq!(trained(&cfg), 10);
        cfg.eval_split = EvalSplit::TrainShare(0.3);
        assert!(prompts(&cfg).len() == 3 && prompts(&cfg).iter().all(|p| p.contains("train")));
        assert_eq!(trained(&cfg), 7, "the held-out share is not trained on");
        cfg.eval_num_samples = 0;
        assert!(periodic_eval_items(&cfg).unwrap().is_none());
    }

    #[test]
    fn the_first_sample_keeps_the_one_sample_seed() {
        assert_eq!(eval_seed(42, 3, 1, 0), derive_seed(42, &[purpose::EVAL, 3, 1]));
        assert_ne!(eval_seed(42, 3, 1, 1), eval_seed(42, 3, 1, 0));
        assert_ne!(eval_seed(42, 3, 1, 1), eval_seed(42, 3, 1, 2));
    }

    #[test]
    fn the_history_pairs_the_last_evaluation_with_the_first_by_item() {
        let dir = tempfile::tempdir().unwrap();
        let report = |team: &str, rewards: [f64; 4]| {
            let items: Vec<serde_json::Value> = rewards
                .iter()
                .enumerate()
                .map(|(k, r)| json!({"item": {"prompt": format!("p{}", k / 2)}, "sample": k % 2, "reward": r}))
                .collect();
            let mean = rewards.iter().sum::<f64>() / 4.0;
            json!({"metrics": {"eval/turn_1/reward_mean": mean, "eval/turn_1/reward_stderr": 0.1}, "team": team,
                "samples_per_item": 2, "items": items})
        };
        let write = |name: &str, v: serde_json::Value| std::fs::write(dir.path().join(name), v.to_string()).unwrap();
        // Named out of order on purpose: `-2` is the second report of the same second.
        write("eval-20261204T010000Z-2.json", report("agents", [1.0, 1.0, 0.5, 0.7]));
        write("eval-20261204T010000Z.json", report("base", [0.2, 0.4, 0.5, 0.5]));
        std::fs::write(dir.path().join("eval_reward.svg"), "not a report").unwrap();
        let h = EvalHistory::read(dir.path()).unwrap();
        assert_eq!(h.reports.iter().map(|r| r.team.as_str()).collect::<Vec<_>>(), ["base", "agents"]);
        // Item means 0.3, 0.5 then 1.0, 0.6: gains 0.7 and 0.1, mean 0.4, s.e. 0.3.
        let g = h.gain_over_first().unwrap();
        assert!((g.mean - 0.4).abs() < 1e-12 && (g.se - 0.3).abs() < 1e-12, "{g:?}");
        let svg = h.svg(std::path::Path::new("runs/x"));
        assert!(svg.contains("base 0.400 -&gt; agents 0.800 (paired gain +0.400 ± 0.300)"), "{svg}");
        // Other items (or sample counts) are not paired.
        write("eval-20261204T020000Z.json", json!({"metrics": {}, "items": [{"item": "q", "reward": 1.0}]}));
        assert!(EvalHistory::read(dir.path()).unwrap().gain_over_first().is_none());
    }
}
