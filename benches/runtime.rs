//! Runtime benchmark on the real model (not a test): batched sampling and one full training step.
//! `scripts/bench.sh` runs it beside the PyTorch baseline (scripts/bench_torch.py) on the same
//! token ids and reports ratios.
//!
//!   cargo bench --bench runtime -- sample|train|gemm --model M.gguf --out result.json [--steps N] [--device cuda:0]
//!     [--lora R]   (train, sample: adapters of rank R on a frozen base instead of a whole model)
//!     [--base-dtype f32|bf16|q8_0]   (with --lora: how the frozen base stores its matrices)
//!     [--lora-dropout P]   (with --lora: dropout on the adapters' inputs)
//!     [--compute-dtype f32|bf16]   (with --lora: what the frozen base's products read)
//!
//! train: B = 4 × 128 tokens (2 pairs of chosen/rejected, ~48-token ChatML prompts), forward +
//! completion log-probs + a DPO-style loss + backward + AdamW; the median of `steps` steps after
//! one warm-up step, per phase. sample: 8 candidates × 64 new tokens from one ChatML prompt.
use std::time::Instant;

use anyhow::{Context, Result};
use candle_core::Var;
use candle_nn::VarMap;
use pbrl::train::optim::{AdamW, AdamWConfig};
use pbrl_model::linear::FrozenStorage;
use pbrl_model::lora::{LoraSpec, ALL_LINEAR};
use pbrl_model::sampling::{sample, SampleRequest, SamplingParams};
use pbrl_model::scoring::{sequence_log_probs, LastToken, ScoreRow};
use pbrl_model::{LoadedModel, Mode};
use serde_json::json;

const SEQ: usize = 128;

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned())
}

fn peak_rss_mib() -> f64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Two prompts, each with a chosen and a rejected completion, every row exactly SEQ tokens.
fn train_rows(m: &LoadedModel) -> Result<Vec<ScoreRow>> {
    let tok = &m.tokenizer;
    let prompts = [
        "Summarize the following in one sentence: The committee met on Tuesday to discuss the budget and agreed to fund libraries.",
        "You are an agent in a grid world. The key is two cells east and the door is far south. What is your next action?",
    ];
    let completions = [
        [
            "The committee agreed to fund libraries more and spend less on roads.",
            "The the committee committee met met on on Tuesday and it rained all day.",
        ],
        [
            "I will move east twice to pick up the key, then head south to open the door.",
            "north north north north north north north north north north",
        ],
    ];
    let mut rows = Vec::new();
    for (p, cs) in prompts.iter().zip(completions.iter()) {
        let prompt = tok.encode(&tok.format_prompt(tok.chat_template.is_some(), None, p)?)?;
        for c in cs {
            let unit = tok.encode(&format!(" {c}"))?;
            let mut completion = Vec::new();
            while prompt.len() + completion.len() < SEQ {
                completion.extend_from_slice(&unit);
            }
            completion.truncate(SEQ - prompt.len());
            rows.push(ScoreRow { prompt: prompt.clone(), completion });
        }
    }
    Ok(rows)
}

/// A LoRA agent as pbrl builds one: adapters of rank r (alpha 2r) on every projection of the
/// frozen base, stored as asked (its products on bf16 inputs with `bf16_products`), with
/// `dropout` on their inputs.
fn lora_agent(m: LoadedModel, (r, storage, dropout, bf16_products): LoraArgs) -> Result<LoadedModel> {
    let targets = ALL_LINEAR.map(String::from).to_vec();
    let spec = LoraSpec { r, alpha: 2.0 * r as f64, target_modules: targets, use_rslora: false };
    let base = m.into_frozen_base(storage)?;
    let base = if bf16_products { base.compute_in_bf16()? } else { base };
    let mut m = LoadedModel::with_lora(&base, &spec, 0)?;
    m.set_lora_dropout(dropout)?;
    Ok(m)
}

/// --lora's rank, --base-dtype, --lora-dropout, --compute-dtype bf16.
type LoraArgs = (usize, FrozenStorage, f64, bool);

fn bench_train(m: LoadedModel, lora: Option<LoraArgs>, steps: usize) -> Result<serde_json::Value> {
    let rows = train_rows(&m)?;
    let dev = m.model.device().clone();
    eprintln!("loaded: peak RSS {:.0} MiB", peak_rss_mib());
    let vars = |map: &VarMap| -> Vec<(String, Var)> {
        map.data().lock().expect("lock").iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    };
    // Full fine-tuning trains every weight; with --lora R, a LoRA agent (`lora_agent`).
    let m = match lora {
        Some(lora) => lora_agent(m, lora)?,
        None => m,
    };
    let (model, params) = (m.model.clone(), vars(&m.varmap));
    let model = &model;
    let mut opt = AdamW::new(params, AdamWConfig::torch_defaults(1e-6))?;
    let beta = 0.1;
    let (mut fwd, mut bwd, mut adam, mut losses) = (vec![], vec![], vec![], vec![]);
    for step in 0..=steps {
        let t = Instant::now();
        let lp = sequence_log_probs(model, &rows, LastToken::Include, m.tokenizer.pad_id, Mode::Train)?;
        let lp = lp.reshape((2, 2))?; // (pair, [chosen, rejected])
        let margin = ((lp.narrow(1, 0, 1)? - lp.narrow(1, 1, 1)?)? * beta)?;
        // -log σ(z) = softplus(-z) = log(1 + e^{-z})
        let loss = (margin.neg()?.exp()? + 1.0)?.log()?.mean_all()?;
        let loss_value: f32 = loss.to_scalar()?;
        let t_f = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let grads = pbrl_model::weight_grads::backward(&loss)?;
        dev.synchronize()?; // GPU kernels run asynchronously: time them to their end
        let t_b = t.elapsed().as_secs_f64();
        let t = Instant::now();
        opt.step(&grads)?;
        dev.synchronize()?;
        drop(grads);
        let t_o = t.elapsed().as_secs_f64();
        eprintln!("step {step}: loss {loss_value:.6} forward {t_f:.2}s backward {t_b:.2}s adamw {t_o:.2}s (peak RSS so far {:.0} MiB)", peak_rss_mib());
        if step > 0 {
            fwd.push(t_f);
            bwd.push(t_b);
            adam.push(t_o);
        }
        losses.push(loss_value);
    }
    let (f, b, o) = (median(fwd), median(bwd), median(adam));
    Ok(json!({"forward_s": f, "backward_s": b, "adamw_s": o, "step_s": f + b + o, "losses": losses,
              "peak_rss_mib": peak_rss_mib(), "rows": rows.iter().map(|r| json!({"prompt": r.prompt, "completion": r.completion})).collect::<Vec<_>>()}))
}

fn bench_sample(m: &LoadedModel) -> Result<serde_json::Value> {
    let tok = &m.tokenizer;
    let prompt = tok.encode(&tok.format_prompt(
        tok.chat_template.is_some(),
        None,
        "Write a short story about a robot who learns to paint, in a few sentences.",
    )?)?;
    let params = SamplingParams { temperature: 0.6, top_p: 0.9, top_k: Some(50), max_new_tokens: 64 };
    let requests: Vec<SampleRequest> = (0..8).map(|i| SampleRequest { prompt: prompt.clone(), seed: i }).collect();
    // Warm-up, then the timed run; no stop tokens, so every row makes all 64 tokens.
    sample(&m.model, &requests[..1], &SamplingParams { max_new_tokens: 4, ..params.clone() }, &[], tok.pad_id, |_| {})?;
    let t = Instant::now();
    let out = sample(&m.model, &requests, &params, &[], tok.pad_id, |_| {})?;
    let secs = t.elapsed().as_secs_f64();
    let n: usize = out.iter().map(|o| o.len()).sum();
    Ok(json!({"tokens": n, "seconds": secs, "tokens_per_s": n as f64 / secs, "prompt_tokens": prompt.len(),
              "prompt": prompt, "peak_rss_mib": peak_rss_mib()}))
}

/// Each kernel family this CPU has on SmolLM2-135M's linear products (x (rows, in) · Wᵀ, W
/// (out, in): attention 576→576, MLP 576→1536 and 1536→576, the LM head 576→49152) at the
/// row counts of decode steps (8, 16) up to training's (512): GFLOP/s, the best of 10 runs.
fn bench_gemm() -> Result<serde_json::Value> {
    use pbrl_model::gemm::{matmul, KernelFamily, Operand};
    let mut out = Vec::new();
    for family in [KernelFamily::Avx512, KernelFamily::Avx2] {
        if !family.available() {
            continue;
        }
        for (k, n) in [(576, 576), (576, 1536), (1536, 576), (576, 49152)] {
            for rows in [8, 16, 32, 64, 128, 512] {
                let x: Vec<f32> = (0..rows * k).map(|i| (i % 7) as f32 * 0.1).collect();
                let w: Vec<f32> = (0..n * k).map(|i| (i % 5) as f32 * 0.1).collect();
                let mut best = f64::INFINITY;
                for _ in 0..10 {
                    let t = Instant::now();
                    let y = matmul(family, rows, n, k, Operand::row_major(&x, k), Operand::transposed(&w, k))
                        .map_err(anyhow::Error::msg)?;
                    best = best.min(t.elapsed().as_secs_f64());
                    std::hint::black_box(y);
                }
                let gflops = 2.0 * (rows * n * k) as f64 / best / 1e9;
                eprintln!("{:<7} rows {rows:>4} in {k:>5} out {n:>6}: {gflops:>7.1} GFLOP/s", family.name());
                out.push(json!({"family": family.name(), "rows": rows, "in": k, "out": n, "gflops": gflops}));
            }
        }
    }
    // The frozen base's products at `compute_dtype = "bf16"`: the input rounded in each
    // product, W packed once (`gemm::bf16`).
    if pbrl_model::gemm::bf16::native() {
        use pbrl_model::gemm::{bf16, Accumulate};
        for (k, n) in [(576, 576), (576, 1536), (1536, 576), (576, 49152)] {
            let w: Vec<f32> = (0..n * k).map(|i| (i % 5) as f32 * 0.1).collect();
            let packed = bf16::Packed::from_fn(k, n, |i, j| bf16::round_bits(w[j * k + i]));
            for rows in [8, 16, 32, 64, 128, 512] {
                let x: Vec<f32> = (0..rows * k).map(|i| (i % 7) as f32 * 0.1).collect();
                let mut best = f64::INFINITY;
                for _ in 0..10 {
                    let t = Instant::now();
                    let mut y = vec![0f32; rows * n];
                    let a = bf16::Rows::round(&x, rows, k).map_err(anyhow::Error::msg)?;
                    bf16::gemm(&mut y, Accumulate::No, &a, &packed).map_err(anyhow::Error::msg)?;
                    best = best.min(t.elapsed().as_secs_f64());
                    std::hint::black_box(y);
                }
                let gflops = 2.0 * (rows * n * k) as f64 / best / 1e9;
                eprintln!("bf16    rows {rows:>4} in {k:>5} out {n:>6}: {gflops:>7.1} GFLOP/s");
                out.push(json!({"family": "bf16", "rows": rows, "in": k, "out": n, "gflops": gflops}));
            }
        }
    }
    Ok(json!({"gemm": out}))
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let mode = args
        .iter()
        .skip(1)
        .find(|a| ["sample", "train", "gemm"].contains(&a.as_str()))
        .cloned()
        .context("mode: sample | train | gemm")?;
    let model = arg(&args, "--model").unwrap_or_else(|| "models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf".into());
    let threads = pbrl::device::init_threads(arg(&args, "--threads").and_then(|t| t.parse().ok()));
    let steps = arg(&args, "--steps").and_then(|s| s.parse().ok()).unwrap_or(3);
    let device = pbrl::device::parse_device(&arg(&args, "--device").unwrap_or_else(|| "cpu".into()), "--device")?;
    let lora = arg(&args, "--lora").map(|r| r.parse::<usize>()).transpose().context("--lora R")?;
    let storage = match arg(&args, "--base-dtype").as_deref() {
        None | Some("f32") => FrozenStorage::F32,
        Some("bf16") => FrozenStorage::Bf16,
        Some("q8_0") => FrozenStorage::Q8_0,
        Some(other) => anyhow::bail!("--base-dtype {other}: use f32, bf16 or q8_0"),
    };
    let dropout = arg(&args, "--lora-dropout").map(|p| p.parse::<f64>()).transpose().context("--lora-dropout P")?;
    let bf16_products = match arg(&args, "--compute-dtype").as_deref() {
        None | Some("f32") => false,
        Some("bf16") => true,
        Some(other) => anyhow::bail!("--compute-dtype {other}: use f32 or bf16"),
    };
    let lora = lora.map(|r| (r, storage, dropout.unwrap_or(0.0), bf16_products));
    let mut result = match mode.as_str() {
        "gemm" => bench_gemm()?,
        "train" => bench_train(LoadedModel::load(&model, &device)?, lora, steps)?,
        _ => {
            let m = LoadedModel::load(&model, &device)?;
            bench_sample(&match lora {
                Some(lora) => lora_agent(m, lora)?,
                None => m,
            })?
        }
    };
    result["threads"] = json!(threads);
    result["gemm_kernels"] = json!(pbrl_model::gemm::kernel_choice().map_err(anyhow::Error::msg)?.describe());
    result["device"] = json!(format!("{device:?}"));
    let text = serde_json::to_string(&result)?;
    match arg(&args, "--out") {
        Some(p) => std::fs::write(&p, &text).with_context(|| format!("writing {p}"))?,
        None => println!("{text}"),
    }
    Ok(())
}
