//! Shared test helpers.
#![allow(dead_code)]
pub mod api_server;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Once;

use candle_core::Tensor;
use rand::{Rng, SeedableRng};

/// Pin candle and rayon to one thread: test binaries run tests in parallel, and
/// oversubscribing the two cores collapses throughput.
pub fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        pbrl::device::init_threads(Some(1));
    });
}

/// A seeded random tensor shaped like `t` (same dtype), entries in [-1, 1).
pub fn random_like(t: &Tensor, seed: u64) -> Tensor {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let v: Vec<f64> = (0..t.elem_count()).map(|_| rng.random::<f64>() * 2.0 - 1.0).collect();
    Tensor::from_vec(v, t.shape(), t.device()).unwrap().to_dtype(t.dtype()).unwrap()
}

/// The checkout: `PBRL_TEST_REPO` when test binaries run away from where they were built (the
/// GPU machine), else the crate's own directory.
pub fn repo() -> PathBuf {
    std::env::var_os("PBRL_TEST_REPO").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// The device the device-generic tests run on: `PBRL_TEST_DEVICE` (`cpu` or `cuda:N`), else the CPU.
pub fn device() -> candle_core::Device {
    let spec = std::env::var("PBRL_TEST_DEVICE").unwrap_or_else(|_| "cpu".into());
    pbrl::device::parse_device(&spec, "PBRL_TEST_DEVICE").unwrap()
}

/// The pbrl binary: `PBRL_TEST_BIN` when test binaries run away from where they were built.
pub fn pbrl_bin() -> PathBuf {
    std::env::var_os("PBRL_TEST_BIN").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_pbrl")))
}

/// The bundled SmolLM2 GGUF; tests that need it fail with a clear message when it is missing.
pub fn smollm2() -> PathBuf {
    let p = repo().join("models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(p.is_file(), "{} is missing: run scripts/fetch-model.sh first", p.display());
    p
}

pub fn fixtures() -> PathBuf {
    repo().join("tests/fixtures")
}

/// The eval reports (`eval-*.json`) in a run directory's `eval/`, in name (time) order.
pub fn eval_reports(run: &std::path::Path) -> Vec<PathBuf> {
    let mut reports: Vec<PathBuf> = std::fs::read_dir(run.join("eval"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    reports.sort();
    reports
}

/// The tensor names in a safetensors file, sorted.
pub fn safetensors_names(path: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> =
        candle_core::safetensors::load(path, &candle_core::Device::Cpu).unwrap().into_keys().collect();
    names.sort();
    names
}

/// Largest absolute elementwise difference, as f32.
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_dtype(candle_core::DType::F32)
        .unwrap()
        .to_scalar()
        .unwrap()
}

/// Check every gradient of `m`'s weights against the reference's, stored under
/// `prefix` + the weight's name as `torch_name` gives it (the tied `lm_head.weight` has none):
/// each within 1e-4 of its largest entry, and every reference gradient under `prefix` matched.
/// Returns (gradients checked, worst relative difference).
#[allow(dead_code)]
pub fn check_grads(
    m: &pbrl_model::LoadedModel,
    grads: &candle_core::backprop::GradStore,
    want: &std::collections::HashMap<String, Tensor>,
    prefix: &str,
    torch_name: impl Fn(&str) -> String,
) -> (usize, f64) {
    let (mut checked, mut worst) = (0, 0f64);
    for (param, var) in m.varmap.data().lock().unwrap().iter() {
        let key = format!("{prefix}{}", torch_name(param));
        let Some(w) = want.get(&key) else {
            assert!(param == "lm_head.weight", "{key}: no reference gradient");
            continue;
        };
        let got = grads.get(var.as_tensor()).unwrap_or_else(|| panic!("{key}: no gradient"));
        worst = worst.max(assert_grad_close(&key, got, w));
        checked += 1;
    }
    assert_eq!(checked, want.keys().filter(|k| k.starts_with(prefix)).count(), "{prefix}");
    (checked, worst)
}

/// Assert a gradient is within 1e-4 of the reference tensor's largest entry (on the CPU);
/// returns the difference relative to that scale.
#[allow(dead_code)]
pub fn assert_grad_close(key: &str, got: &Tensor, want: &Tensor) -> f64 {
    let got = got.to_device(&candle_core::Device::Cpu).unwrap();
    let scale = want.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap() as f64;
    let diff = max_abs_diff(&got, want) as f64;
    assert!(scale > 0.0 && diff <= 1e-4 * scale, "{key}: max |Δ| {diff:.3e} vs scale {scale:.3e}");
    diff / scale
}

/// Every value of `key` in a run's metrics.jsonl, in order.
pub fn metric_values(run: &Path, key: &str) -> Vec<f64> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v[key].as_f64())
        .collect()
}

/// Run the pbrl binary in `cwd` with one thread.
pub fn pbrl(args: &[&str], cwd: &Path) -> Output {
    Command::new(pbrl_bin()).args(args).current_dir(cwd).env("PBRL_THREADS", "1").output().unwrap()
}

/// The output of a run that must succeed (its stderr shown if not).
pub fn ok(o: Output) -> Output {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    o
}

/// The Python of a venv with torch and transformers (`PBRL_REF_PYTHON`), for the tests that check
/// pbrl's exports in transformers; those tests skip, saying so, where it is not set.
pub fn ref_python() -> Option<PathBuf> {
    std::env::var_os("PBRL_REF_PYTHON").map(PathBuf::from).filter(|p| p.is_file())
}

/// Export `m` with `sampling`, then load the export in transformers (scripts/check_export.py) and
/// compare its logits on `ids` with pbrl's (within `tolerance`); returns the script's report. `None` where no
/// reference Python is set.
pub fn check_export_in_transformers(
    m: &pbrl_model::LoadedModel,
    ids: &[u32],
    sampling: &pbrl_model::SamplingParams,
    tolerance: f64,
) -> Option<serde_json::Value> {
    let Some(py) = ref_python() else {
        eprintln!("skipped: PBRL_REF_PYTHON is not set (scripts/test.sh sets it when the baseline venv exists)");
        return None;
    };
    let d = tempfile::tempdir().unwrap();
    let agent = d.path().join("agent_0");
    m.save_hf_dir(&agent, Some(sampling)).unwrap();
    let back = pbrl_model::LoadedModel::load(agent.to_str().unwrap(), &candle_core::Device::Cpu).unwrap();
    let dev = candle_core::Device::Cpu;
    let batch =
        pbrl_model::batch::PaddedBatch::new(&[ids.to_vec()], 0, pbrl_model::batch::Padding::Right, &dev).unwrap();
    let logits = back.model.forward(&batch.ids, &batch.positions, &batch.bias, None, pbrl_model::Mode::Infer).unwrap();
    let case = d.path().join("case.safetensors");
    let ids_t = Tensor::new(ids, &dev).unwrap().to_dtype(candle_core::DType::I64).unwrap().unsqueeze(0).unwrap();
    candle_core::safetensors::save(
        &[("ids".to_string(), ids_t), ("logits".to_string(), logits)].into_iter().collect(),
        &case,
    )
    .unwrap();
    let script = repo().join("scripts/check_export.py");
    let o = Command::new(py).arg(script).arg(&agent).arg(&case).arg(tolerance.to_string()).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "transformers on the export: {out}\n{}", String::from_utf8_lossy(&o.stderr));
    let report: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    eprintln!("transformers on the export: {report}");
    Some(report)
}

/// A model's variables in name order (a `VarMap` iterates in no fixed order), each set to
/// seeded values in [-scale, scale) (`seed`, `seed + 1`, ... in that order): adapters that
/// change the model, the same on every run.
pub fn set_vars_random(varmap: &candle_nn::VarMap, seed: u64, scale: f64) -> Vec<(String, candle_core::Var)> {
    let mut vars: Vec<(String, candle_core::Var)> =
        varmap.data().lock().unwrap().iter().map(|(n, v)| (n.clone(), v.clone())).collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    for (i, (_, var)) in vars.iter().enumerate() {
        var.set(&random_like(var.as_tensor(), seed + i as u64).affine(scale, 0.0).unwrap()).unwrap();
    }
    vars
}

/// Small MARLHF settings for the tiny-model tests (3 generations, 2 items per update, a reward
/// model fit on every pair), as `key=value` overrides.
pub const SMALL_MARLHF: [&str; 4] =
    ["num_generations=3", "rollout_buffer_size=2", "reward_train_batch_size=2", "reward_eval_fraction=0"];

/// The mean of the last two logged MADPO losses of `run` is below that of the first two.
pub fn assert_madpo_loss_falls(run: &Path) {
    let l = metric_values(run, "madpo/loss");
    assert!(l.len() >= 4 && l[l.len() - 2..].iter().sum::<f64>() < l[..2].iter().sum::<f64>(), "loss falls: {l:?}");
}
