//! The `cuda` feature on a GPU: every computation pbrl runs on a model, done on `cuda:0` and on
//! the CPU from the same weights, must agree; and the stages run end to end on the GPU.
//! Built only with `--features cuda`, and needs a CUDA GPU (`cargo test --features cuda --test
//! cuda`). The device-generic tests (transformers_fixtures, golden_madpo) also run on a GPU with
//! `PBRL_TEST_DEVICE=cuda:0`.
#![cfg(feature = "cuda")]
mod common;

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use common::{ok, pbrl};
use pbrl::prefs::RoundFile;
use pbrl::train::optim::{AdamW, AdamWConfig};
use pbrl_model::batch::{PaddedBatch, Padding};
use pbrl_model::sampling::{greedy, sample, SampleRequest, SamplingParams};
use pbrl_model::scoring::{sequence_log_probs, LastToken, ScoreRow};
use pbrl_model::weight_grads::backward;
use pbrl_model::{tiny::tiny_model, Architecture, LoadedModel, Mode};

fn gpu() -> Device {
    Device::new_cuda(0).expect("tests/cuda.rs needs a CUDA GPU at cuda:0")
}

const MODELS: [(Architecture, bool); 3] =
    [(Architecture::Llama, true), (Architecture::Qwen2, false), (Architecture::Qwen2, true)];

/// The same tiny random model on the CPU and on the GPU (through a saved HF directory, as a
/// user's model would arrive).
fn cpu_and_gpu(arch: Architecture, tie: bool, seed: u64, dir: &Path) -> (LoadedModel, LoadedModel) {
    let path = dir.join(format!("{arch:?}_{tie}_{seed}"));
    tiny_model(arch, tie, seed, DType::F32).unwrap().save_hf_dir(&path, None).unwrap();
    let p = path.to_str().unwrap();
    (LoadedModel::load(p, &Device::Cpu).unwrap(), LoadedModel::load(p, &gpu()).unwrap())
}

fn rows() -> Vec<ScoreRow> {
    vec![
        ScoreRow { prompt: vec![5, 9, 13, 2], completion: vec![7, 22, 31, 1] },
        ScoreRow { prompt: vec![3, 8], completion: vec![4, 30, 11] },
        ScoreRow { prompt: vec![3, 8], completion: vec![6] },
    ]
}

fn host(t: &Tensor) -> Tensor {
    t.to_device(&Device::Cpu).unwrap()
}

#[test]
fn logits_and_log_probs_match_the_cpu() {
    common::init();
    let dir = tempfile::tempdir().unwrap();
    for (arch, tie) in MODELS {
        let (c, g) = cpu_and_gpu(arch, tie, 11, dir.path());
        let seqs: Vec<Vec<u32>> = rows().iter().map(|r| [r.prompt.clone(), r.completion.clone()].concat()).collect();
        for mode in [Mode::Train, Mode::Infer] {
            let logits = |m: &LoadedModel| {
                let b = PaddedBatch::new(&seqs, 0, Padding::Right, m.model.device()).unwrap();
                host(&m.model.forward(&b.ids, &b.positions, &b.bias, None, mode).unwrap())
            };
            let d = common::max_abs_diff(&logits(&c), &logits(&g));
            assert!(d < 1e-4, "{arch:?} tied={tie} {mode:?}: logits differ by {d}");
        }
        for last in [LastToken::Include, LastToken::Exclude] {
            let lp = |m: &LoadedModel| host(&sequence_log_probs(&m.model, &rows(), last, 0, Mode::Train).unwrap());
            let d = common::max_abs_diff(&lp(&c), &lp(&g));
            assert!(d < 1e-4, "{arch:?} tied={tie} {last:?}: log-probs differ by {d}");
        }
    }
}

#[test]
fn gradients_match_the_cpu() {
    common::init();
    let dir = tempfile::tempdir().unwrap();
    for (arch, tie) in MODELS {
        let (c, g) = cpu_and_gpu(arch, tie, 12, dir.path());
        let grads = |m: &LoadedModel| {
            let lp = sequence_log_probs(&m.model, &rows(), LastToken::Exclude, 0, Mode::Train).unwrap();
            // Rows weighted differently, as a preference loss weighs winners and losers.
            let w = Tensor::new(&[0.7f32, -1.3, 0.4], lp.device()).unwrap();
            (lp * w).unwrap().sum_all().unwrap().backward().unwrap()
        };
        let (gc, gg) = (grads(&c), grads(&g));
        let (vc, vg) = (c.varmap.data().lock().unwrap(), g.varmap.data().lock().unwrap());
        for (name, var) in vc.iter() {
            let want = gc.get(var.as_tensor()).unwrap_or_else(|| panic!("{name}: no CPU gradient"));
            let got = host(gg.get(vg[name].as_tensor()).unwrap_or_else(|| panic!("{name}: no GPU gradient")));
            let scale = want.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
            let d = common::max_abs_diff(&got, want);
            assert!(d <= 1e-4 * scale.max(1e-6), "{arch:?} tied={tie} {name}: |Δ| {d:e} vs scale {scale:e}");
        }
    }
}

#[test]
fn sampling_on_the_gpu_is_seeded_and_greedy_matches_the_cpu() {
    common::init();
    let dir = tempfile::tempdir().unwrap();
    let (c, g) = cpu_and_gpu(Architecture::Qwen2, false, 13, dir.path());
    let prompts: Vec<Vec<u32>> = rows().into_iter().map(|r| r.prompt).collect();
    let reqs: Vec<SampleRequest> =
        prompts.iter().enumerate().map(|(i, p)| SampleRequest { prompt: p.clone(), seed: 40 + i as u64 }).collect();
    let params = |t| SamplingParams { temperature: t, top_p: 0.9, top_k: Some(20), max_new_tokens: 10 };
    let a = sample(&g.model, &reqs, &params(1.0), &[1], 0, |_| {}).unwrap();
    assert_eq!(a, sample(&g.model, &reqs, &params(1.0), &[1], 0, |_| {}).unwrap(), "same seed, same samples");
    // Greedy decoding (batched, KV cache) picks the CPU's tokens.
    let greedy_gpu = sample(&g.model, &reqs, &params(0.0), &[1], 0, |_| {}).unwrap();
    for (p, got) in prompts.iter().zip(&greedy_gpu) {
        assert_eq!(got, &greedy(&c.model, p, 10, &[1]).unwrap(), "greedy tokens of prompt {p:?}");
    }
}

#[test]
fn adamw_steps_match_the_cpu() {
    common::init();
    let init = common::random_like(&Tensor::zeros((6, 5), DType::F32, &Device::Cpu).unwrap(), 1);
    let run = |dev: &Device| {
        let var = candle_core::Var::from_tensor(&init.to_device(dev).unwrap()).unwrap();
        let mut opt = AdamW::new(vec![("w".into(), var.clone())], AdamWConfig::torch_defaults(1e-2)).unwrap();
        let mut norms = vec![];
        for k in 0..3 {
            let target = common::random_like(var.as_tensor(), 10 + k);
            let loss = (var.as_tensor() - target).unwrap().sqr().unwrap().sum_all().unwrap();
            norms.push(opt.step(&backward(&loss).unwrap()).unwrap());
        }
        (host(var.as_tensor()), norms)
    };
    let ((wc, nc), (wg, ng)) = (run(&Device::Cpu), run(&gpu()));
    let d = common::max_abs_diff(&wc, &wg);
    assert!(d < 1e-6, "weights after 3 AdamW steps differ by {d}");
    for (a, b) in nc.iter().zip(&ng) {
        assert!((a - b).abs() <= 1e-5 * a.abs(), "gradient norms {nc:?} vs {ng:?}");
    }
}

/// A tiny Llama and a 2-agent MADPO config on `cuda:0` in `d` (`extra` appended, e.g. a table).
fn gpu_run_setup(d: &Path, extra: &str) {
    tiny_model(Architecture::Llama, true, 21, DType::F32).unwrap().save_hf_dir(&d.join("tiny"), None).unwrap();
    let items: String = (0..4).map(|i| format!("{{\"prompt\": \"w{i} w{} w7\"}}\n", i + 3)).collect();
    std::fs::write(d.join("items.jsonl"), items).unwrap();
    let cfg = format!(
        "agent_model = \"{}\"\nagent_devices = \"cuda:0\"\nrun_dir = \"run\"\nseed = 3\nmax_new_tokens = 6\n\
         temperature = 1.0\ntop_p = 1.0\npreference_num_candidates = 4\npreference_pairs_per_sample = 2\n\
         agent_learning_rate = 1e-3\ntrain_batch_size = 2\nnum_train_epochs = 4\neval_interval = 0\n\
         eval_num_samples = 4\n[task]\ntrain_file = \"items.jsonl\"\neval_file = \"items.jsonl\"\n\
         formatters = [\"{{prompt}}\", \"{{prompt}} w9\"]\nchat_template = false\n{extra}",
        d.join("tiny").display()
    );
    std::fs::write(d.join("c.toml"), cfg).unwrap();
}

/// collect → train-madpo → eval on `cuda:0` through the binary; the same seed gives the same
/// round twice on the GPU.
#[test]
fn stages_run_on_the_gpu() {
    common::init();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    gpu_run_setup(d, "");
    ok(pbrl(&["collect", "--config", "c.toml"], d));
    ok(pbrl(&["collect", "--config", "c.toml", "--run-dir", "again"], d));
    let round = |run: &str| RoundFile::load(&d.join(run).join("preference_replay/iteration_0001.json")).unwrap();
    let first = round("run");
    assert!(first.num_pairs > 0, "a round of pairs was collected");
    assert_eq!(first, round("again"), "same seed, same pairs on the GPU");
    ok(pbrl(&["train-madpo", "--config", "c.toml"], d));
    common::assert_madpo_loss_falls(&d.join("run"));
    // eval loads the trained agents onto the GPU.
    let o = ok(pbrl(&["eval", "--config", "c.toml"], d));
    assert!(String::from_utf8_lossy(&o.stdout).contains("eval/turn_1/reward_mean"));
}

/// A LoRA team on one base on `cuda:0`: collect → train-madpo → fit-rm → train-marlhf → eval
/// through the binary; the adapters trained on the GPU give the CPU's logits when loaded on both.
#[test]
fn a_lora_team_runs_on_the_gpu() {
    common::init();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    gpu_run_setup(d, "[agent_lora]\nr = 4\nalpha = 8.0\ntarget_modules = [\"all-linear\"]\n");
    let mh = common::SMALL_MARLHF;
    for stage in ["collect", "train-madpo", "fit-rm", "train-marlhf", "eval"] {
        ok(pbrl(&[&[stage, "--config", "c.toml"][..], &mh].concat(), d));
    }
    common::assert_madpo_loss_falls(&d.join("run"));
    let agent = d.join("run/agents/agent_1");
    let (c, g) = (
        LoadedModel::load(agent.to_str().unwrap(), &Device::Cpu).unwrap(),
        LoadedModel::load(agent.to_str().unwrap(), &gpu()).unwrap(),
    );
    let base = LoadedModel::load(d.join("tiny").to_str().unwrap(), &Device::Cpu).unwrap();
    assert!(c.lora.is_some() && g.lora.is_some(), "an adapter over the base");
    let seqs = vec![vec![3u32, 8, 5, 9, 4]];
    let logits = |m: &LoadedModel| {
        let b = PaddedBatch::new(&seqs, 0, Padding::Right, m.model.device()).unwrap();
        host(&m.model.forward(&b.ids, &b.positions, &b.bias, None, Mode::Infer).unwrap())
    };
    let (lc, lg) = (logits(&c), logits(&g));
    assert!(common::max_abs_diff(&lc, &logits(&base)) > 1e-6, "the adapters trained");
    let d = common::max_abs_diff(&lc, &lg);
    assert!(d < 1e-4, "the trained adapter's logits differ by {d} between CPU and GPU");
}
