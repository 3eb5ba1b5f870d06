//! The model runtime on tiny random models built in the test: padding, KV cache, scorer,
//! gradients, sampling and save/load.
mod common;

use candle_core::{DType, Device, IndexOp, Tensor, D};
use pbrl_model::batch::{PaddedBatch, Padding};
use pbrl_model::sampling::{argmax, greedy, sample, SampleRequest, SamplingParams};
use pbrl_model::scoring::{sequence_log_probs, LastToken, ScoreRow};
use pbrl_model::tiny::tiny_model;
use pbrl_model::{Architecture, LoadedModel, Mode};
use rand::{Rng, SeedableRng};

fn rows() -> Vec<Vec<u32>> {
    vec![vec![5, 9, 13, 7, 22, 31], vec![3, 4], vec![11, 12, 38, 20], vec![6]]
}

/// Logits of one unpadded sequence: (len, vocab).
fn single_logits(m: &LoadedModel, ids: &[u32], mode: Mode) -> Tensor {
    let b = PaddedBatch::new(&[ids.to_vec()], 0, Padding::Right, &Device::Cpu).unwrap();
    m.model.forward(&b.ids, &b.positions, &b.bias, None, mode).unwrap().squeeze(0).unwrap()
}

#[test]
fn padded_batches_equal_unpadded_sequences() {
    common::init();
    for arch in [Architecture::Llama, Architecture::Qwen2] {
        let m = tiny_model(arch, false, 1, DType::F32).unwrap();
        for padding in [Padding::Left, Padding::Right] {
            for mode in [Mode::Train, Mode::Infer] {
                let b = PaddedBatch::new(&rows(), 0, padding, &Device::Cpu).unwrap();
                let logits = m.model.forward(&b.ids, &b.positions, &b.bias, None, mode).unwrap();
                for (i, r) in rows().iter().enumerate() {
                    let got = logits.i(i).unwrap().narrow(0, b.offsets[i], r.len()).unwrap();
                    let want = single_logits(&m, r, mode);
                    let d = common::max_abs_diff(&got, &want);
                    assert!(d < 1e-5, "{arch:?} {padding:?} {mode:?} row {i}: max diff {d}");
                }
            }
        }
    }
}

#[test]
fn train_and_infer_kernels_agree() {
    common::init();
    let m = tiny_model(Architecture::Llama, true, 2, DType::F32).unwrap();
    let r = &rows()[0];
    let d = common::max_abs_diff(&single_logits(&m, r, Mode::Train), &single_logits(&m, r, Mode::Infer));
    assert!(d < 1e-5, "{d}");
}

/// Inference keeps no autograd graph (the weights are variables, so it would otherwise hold
/// every layer's activations): its results are detached; training's are not.
#[test]
fn inference_returns_tensors_without_a_graph() {
    common::init();
    let m = tiny_model(Architecture::Llama, false, 1, DType::F32).unwrap();
    let b = PaddedBatch::new(&rows(), 0, Padding::Right, &Device::Cpu).unwrap();
    for (mode, tracked) in [(Mode::Infer, false), (Mode::Train, true)] {
        let logits = m.model.forward(&b.ids, &b.positions, &b.bias, None, mode).unwrap();
        let hidden = m.model.forward_rows(&b.ids, &b.positions, &b.bias, None, mode).unwrap();
        assert_eq!((logits.track_op(), hidden.track_op()), (tracked, tracked), "{mode:?}");
    }
}

#[test]
fn kv_cache_incremental_logits_equal_full_forward() {
    common::init();
    let m = tiny_model(Architecture::Qwen2, true, 3, DType::F32).unwrap();
    let prompts = vec![vec![5u32, 9, 13], vec![7, 8, 21, 30, 2]];
    let continuation = [[4u32, 17, 25], [19, 6, 33]];
    let dev = Device::Cpu;
    let b = PaddedBatch::new(&prompts, 0, Padding::Left, &dev).unwrap();
    let mut cache = m.model.new_cache();
    let mut key_mask = b.key_mask.clone();
    let first = m.model.forward(&b.ids, &b.positions, &b.bias, Some(&mut cache), Mode::Infer).unwrap();
    let mut steps = vec![first.narrow(1, first.dim(1).unwrap() - 1, 1).unwrap().squeeze(1).unwrap()];
    for (a, b) in continuation[0].iter().zip(&continuation[1]) {
        key_mask.iter_mut().for_each(|k| k.push(1));
        let ids = Tensor::new(&[[*a], [*b]], &dev).unwrap();
        let pos = pbrl_model::batch::position_ids(&key_mask, 1, &dev).unwrap();
        let bias = pbrl_model::batch::attention_bias(&key_mask, 1, &dev).unwrap();
        let l = m.model.forward(&ids, &pos, &bias, Some(&mut cache), Mode::Infer).unwrap();
        steps.push(l.squeeze(1).unwrap());
    }
    assert_eq!(cache.len(), b.ids.dim(1).unwrap() + 3);
    for (row, p) in prompts.iter().enumerate() {
        let mut full = p.clone();
        full.extend_from_slice(&continuation[row]);
        let want = single_logits(&m, &full, Mode::Train);
        for (t, step) in steps.iter().enumerate() {
            let d = common::max_abs_diff(&step.i(row).unwrap(), &want.i(p.len() - 1 + t).unwrap());
            assert!(d < 1e-5, "row {row} step {t}: {d}");
        }
    }
}

#[test]
fn scorer_equals_hand_computation() {
    common::init();
    let m = tiny_model(Architecture::Llama, false, 4, DType::F32).unwrap();
    let score_rows = vec![
        ScoreRow { prompt: vec![5, 9, 13], completion: vec![7, 22, 31] },
        ScoreRow { prompt: vec![3], completion: vec![4] },
        ScoreRow { prompt: vec![11, 12], completion: vec![] },
    ];
    for last in [LastToken::Include, LastToken::Exclude] {
        let got: Vec<f32> = sequence_log_probs(&m.model, &score_rows, last, 0, Mode::Train).unwrap().to_vec1().unwrap();
        for (i, r) in score_rows.iter().enumerate() {
            let mut full = r.prompt.clone();
            full.extend_from_slice(&r.completion);
            let lp = candle_nn::ops::log_softmax(&single_logits(&m, &full, Mode::Train), D::Minus1).unwrap();
            let lp: Vec<Vec<f32>> = lp.to_vec2().unwrap();
            let n = match last {
                LastToken::Include => r.completion.len(),
                LastToken::Exclude => r.completion.len().saturating_sub(1),
            };
            let want: f32 = (0..n).map(|k| lp[r.prompt.len() - 1 + k][r.completion[k] as usize]).sum();
            assert!((got[i] - want).abs() < 1e-4, "{last:?} row {i}: {} vs {want}", got[i]);
        }
    }
}

/// Rows sharing a prompt are packed with one copy of it, several prompts per packed sequence
/// and several packed sequences when they overflow: each row's log-prob and the gradient of a
/// weighted sum equal those of the rows scored one at a time.
#[test]
fn packed_shared_prompt_scoring_equals_rows_scored_alone() {
    common::init();
    let m = tiny_model(Architecture::Qwen2, true, 8, DType::F64).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    let mut words = |n: usize| -> Vec<u32> { (0..n).map(|_| rng.random_range(3..40u32)).collect() };
    let mut rows = Vec::new();
    // Long prompts force more than one packed sequence (their groups exceed 256 tokens together).
    for (p, completions) in [(60, vec![30, 5, 41]), (90, vec![1, 70]), (7, vec![12, 12]), (100, vec![0, 55])] {
        let prompt = words(p);
        for c in completions {
            rows.push(ScoreRow { prompt: prompt.clone(), completion: words(c) });
        }
    }
    rows.swap(1, 6); // groups need not be contiguous
    let weights: Vec<f64> = (0..rows.len()).map(|i| (i as f64 * 0.37).sin()).collect();
    let weighted = |lp: &Tensor, w: &[f64]| (lp * Tensor::new(w, &Device::Cpu).unwrap()).unwrap().sum_all().unwrap();
    for last in [LastToken::Include, LastToken::Exclude] {
        let packed = sequence_log_probs(&m.model, &rows, last, 0, Mode::Train).unwrap();
        let got: Vec<f64> = packed.to_vec1().unwrap();
        let grads = weighted(&packed, &weights).backward().unwrap();
        let mut alone = Vec::new();
        let mut sum: Option<Tensor> = None;
        for (r, w) in rows.iter().zip(&weights) {
            let lp = sequence_log_probs(&m.model, std::slice::from_ref(r), last, 0, Mode::Train).unwrap();
            alone.push(lp.to_vec1::<f64>().unwrap()[0]);
            let term = weighted(&lp, &[*w]);
            sum = Some(match sum {
                Some(s) => (s + term).unwrap(),
                None => term,
            });
        }
        for (i, (g, a)) in got.iter().zip(&alone).enumerate() {
            assert!((g - a).abs() < 1e-9, "{last:?} row {i}: packed {g} vs alone {a}");
        }
        let want = sum.unwrap().backward().unwrap();
        for (name, var) in m.varmap.data().lock().unwrap().iter() {
            let (g, w) = (grads.get(var.as_tensor()).unwrap(), want.get(var.as_tensor()).unwrap());
            let d = common::max_abs_diff(g, w);
            assert!(d < 1e-9, "{last:?} {name}: gradient differs by {d}");
        }
    }
}

/// Finite differences in f64 along a random direction of several weights.
#[test]
fn gradients_match_finite_differences() {
    common::init();
    for arch in [Architecture::Llama, Architecture::Qwen2] {
        let m = tiny_model(arch, true, 5, DType::F64).unwrap();
        let score_rows = vec![
            ScoreRow { prompt: vec![5, 9, 13], completion: vec![7, 22, 31] },
            ScoreRow { prompt: vec![3, 8], completion: vec![4, 30] },
        ];
        let loss = |m: &LoadedModel| -> Tensor {
            let lp = sequence_log_probs(&m.model, &score_rows, LastToken::Include, 0, Mode::Train).unwrap();
            // Not just a sum: weight rows differently, like a preference loss would.
            ((lp.i(0).unwrap() * 0.7).unwrap() - (lp.i(1).unwrap() * 1.3).unwrap()).unwrap()
        };
        let grads = loss(&m).backward().unwrap();
        let mut names = vec![
            "model.embed_tokens.weight",
            "model.layers.0.self_attn.q_proj.weight",
            "model.layers.1.self_attn.k_proj.weight",
            "model.layers.0.input_layernorm.weight",
            "model.layers.1.mlp.down_proj.weight",
            "model.norm.weight",
        ];
        if arch == Architecture::Qwen2 {
            names.push("model.layers.0.self_attn.v_proj.bias");
        }
        let data = m.varmap.data().lock().unwrap().clone();
        for (k, name) in names.iter().enumerate() {
            let var = &data[*name];
            let g = grads.get(var.as_tensor()).unwrap_or_else(|| panic!("no gradient for {name}"));
            let dir = common::random_like(var.as_tensor(), 100 + k as u64);
            let analytic: f64 = (g * &dir).unwrap().sum_all().unwrap().to_scalar().unwrap();
            let orig = var.as_tensor().copy().unwrap();
            let eps = 1e-5;
            var.set(&(&orig + (&dir * eps).unwrap()).unwrap()).unwrap();
            let plus: f64 = loss(&m).to_scalar().unwrap();
            var.set(&(&orig - (&dir * eps).unwrap()).unwrap()).unwrap();
            let minus: f64 = loss(&m).to_scalar().unwrap();
            var.set(&orig).unwrap();
            let numeric = (plus - minus) / (2.0 * eps);
            let rel = (analytic - numeric).abs() / numeric.abs().max(1e-6);
            assert!(rel < 1e-5, "{arch:?} {name}: analytic {analytic} numeric {numeric} rel {rel}");
        }
        // Every weight receives a gradient (no op silently cuts the graph).
        for (name, var) in data.iter() {
            assert!(grads.get(var.as_tensor()).is_some(), "{arch:?}: {name} got no gradient");
        }
    }
}

fn params(temperature: f64) -> SamplingParams {
    SamplingParams { temperature, top_p: 0.9, top_k: Some(20), max_new_tokens: 12 }
}

#[test]
fn same_seed_same_samples_different_seed_different() {
    common::init();
    let m = tiny_model(Architecture::Llama, true, 6, DType::F32).unwrap();
    let reqs = |base: u64| -> Vec<SampleRequest> {
        rows().into_iter().enumerate().map(|(i, prompt)| SampleRequest { prompt, seed: base + i as u64 }).collect()
    };
    let run = |base| sample(&m.model, &reqs(base), &params(1.0), &[1], 0, |_| {}).unwrap();
    let a = run(10);
    assert_eq!(a, run(10));
    assert_ne!(a, run(99));
    // A row's tokens depend on its own seed, not on its batch neighbours.
    let alone = sample(&m.model, &reqs(10)[2..3], &params(1.0), &[1], 0, |_| {}).unwrap();
    assert_eq!(alone[0], a[2]);
}

#[test]
fn greedy_sampling_is_argmax_and_matches_unbatched_decoding() {
    common::init();
    let m = tiny_model(Architecture::Qwen2, false, 7, DType::F32).unwrap();
    let reqs: Vec<SampleRequest> = rows().into_iter().map(|prompt| SampleRequest { prompt, seed: 0 }).collect();
    let batched = sample(&m.model, &reqs, &params(0.0), &[1], 0, |_| {}).unwrap();
    for (r, got) in reqs.iter().zip(&batched) {
        assert_eq!(got, &greedy(&m.model, &r.prompt, 12, &[1]).unwrap());
        // First token is the argmax of the prompt's last logits.
        let l: Vec<f32> = single_logits(&m, &r.prompt, Mode::Train).i(r.prompt.len() - 1).unwrap().to_vec1().unwrap();
        assert_eq!(got[0], argmax(&l));
    }
}

#[test]
fn sampling_stops_at_stop_tokens() {
    common::init();
    let m = tiny_model(Architecture::Llama, true, 8, DType::F32).unwrap();
    let reqs: Vec<SampleRequest> = (0..6).map(|i| SampleRequest { prompt: vec![5, 6 + i], seed: i as u64 }).collect();
    // Every token but 3 and 4 stops: each row ends as soon as it samples one.
    let stops: Vec<u32> = (0..40).filter(|t| *t != 3 && *t != 4).collect();
    let out = sample(&m.model, &reqs, &params(1.0), &stops, 0, |_| {}).unwrap();
    for o in &out {
        let pos = o.iter().position(|t| stops.contains(t));
        if let Some(p) = pos {
            assert_eq!(p, o.len() - 1, "tokens after a stop token: {o:?}");
        } else {
            assert_eq!(o.len(), 12);
        }
    }
}

#[test]
fn hf_dir_save_then_load_gives_identical_logits() {
    common::init();
    for (arch, tie) in [(Architecture::Llama, true), (Architecture::Qwen2, false)] {
        let m = tiny_model(arch, tie, 9, DType::F32).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent_0");
        m.save_hf_dir(&path, None).unwrap();
        for f in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"] {
            assert!(path.join(f).is_file(), "{f} missing");
        }
        let back = LoadedModel::load(path.to_str().unwrap(), &Device::Cpu).unwrap();
        assert_eq!(back.model.config, m.model.config);
        let r = &rows()[0];
        assert_eq!(
            common::max_abs_diff(&single_logits(&m, r, Mode::Train), &single_logits(&back, r, Mode::Train)),
            0.0
        );
        assert_eq!(back.tokenizer.encode("w1 w5 w2").unwrap(), vec![4, 8, 5]);
        // Saving again over an existing directory replaces it.
        back.save_hf_dir(&path, None).unwrap();
    }
}

#[test]
fn shared_prompts_are_prefilled_once_without_changing_samples() {
    common::init();
    let m = tiny_model(Architecture::Llama, false, 12, DType::F32).unwrap();
    // Three candidates each of two prompts, interleaved, as collection batches them.
    let prompts = [vec![5u32, 9, 13, 7], vec![3u32, 4]];
    let reqs: Vec<SampleRequest> =
        (0..6).map(|i| SampleRequest { prompt: prompts[i % 2].clone(), seed: 100 + i as u64 }).collect();
    let batched = sample(&m.model, &reqs, &params(1.0), &[1], 0, |_| {}).unwrap();
    for (r, got) in reqs.iter().zip(&batched) {
        let alone = sample(&m.model, std::slice::from_ref(r), &params(1.0), &[1], 0, |_| {}).unwrap();
        assert_eq!(&alone[0], got);
    }
    assert_ne!(batched[0], batched[2], "different seeds, different candidates");
}

/// Per-token log-probs of a rollout (what RL and KL terms need) equal log_softmax of one plain
/// forward pass over prompt + completion, and sum to the sequence log-prob.
#[test]
fn rollout_log_probs_equal_a_plain_forward() {
    use pbrl::config::Config;
    use pbrl::team::rollout::{add_log_probs, rollout};
    common::init();
    let d = tempfile::tempdir().unwrap();
    tiny_model(Architecture::Qwen3, false, 5, DType::F32).unwrap().save_hf_dir(&d.path().join("m"), None).unwrap();
    let toml = format!(
        "agent_model = \"{}\"\nmax_new_tokens = 5\ntemperature = 1.0\ntop_p = 1.0\ntop_k = \"none\"\n[task]\nchat_template = false\n",
        d.path().join("m").display()
    );
    let cfg = Config::from_toml_str(&toml, "t.toml", &[]).unwrap();
    let team = pbrl::team::load_team(&cfg.team().unwrap(), &pbrl::run::RunDir::new(d.path().join("run"))).unwrap();
    let items: Vec<pbrl::task::TaskItem> =
        ["w1 w2 w3", "w4"].iter().map(|p| serde_json::json!({ "prompt": p }).as_object().unwrap().clone()).collect();
    let mut out = rollout(&team, &items, 2, &cfg.sampling(), |j, a, k| (j * 10 + a * 3 + k) as u64, |_| {}).unwrap();
    add_log_probs(&team, &mut out).unwrap();
    for (j, responses) in out.responses.iter().enumerate() {
        for joint in responses {
            for (a, c) in joint.iter().enumerate() {
                let m = &team[a].model;
                let lp = c.log_probs.as_ref().unwrap();
                assert_eq!(lp.len(), c.ids.len());
                let prompt = m.tokenizer.encode(&out.prompts[j][a]).unwrap();
                let seq = [prompt.clone(), c.ids.clone()].concat();
                let batch =
                    PaddedBatch::new(std::slice::from_ref(&seq), 0, Padding::Right, &candle_core::Device::Cpu).unwrap();
                let logits = m.model.forward(&batch.ids, &batch.positions, &batch.bias, None, Mode::Infer).unwrap();
                let logp = candle_nn::ops::log_softmax(&logits.squeeze(0).unwrap(), 1).unwrap();
                let logp: Vec<Vec<f32>> = logp.to_vec2().unwrap();
                for (t, &id) in c.ids.iter().enumerate() {
                    let want = logp[prompt.len() - 1 + t][id as usize];
                    assert!((lp[t] - want).abs() < 1e-4, "token {t}: {} vs {want}", lp[t]);
                }
                let row = ScoreRow { prompt, completion: c.ids.clone() };
                let sum: f32 = sequence_log_probs(&m.model, &[row], LastToken::Include, 0, Mode::Infer)
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap()[0];
                assert!((sum - lp.iter().sum::<f32>()).abs() < 1e-4);
                assert_eq!(c.finished, m.tokenizer.stop_ids.contains(c.ids.last().unwrap()));
            }
        }
    }
}

/// As transformers' `nn.Embedding(padding_idx = pad_token_id)`: the pad token's embedding row
/// gets no gradient from the positions holding it (the values are unchanged), other rows do.
#[test]
fn the_pad_token_embedding_gets_no_gradient_from_its_positions() {
    let grad_of_rows = |pad: Option<u32>| -> (Tensor, Vec<f32>) {
        let mut m = tiny_model(Architecture::Llama, false, 4, DType::F64).unwrap();
        m.model.backbone.config.pad_token_id = pad;
        let b = PaddedBatch::new(&[vec![3, 5, 3, 7]], 0, Padding::Right, &Device::Cpu).unwrap();
        let h = m.model.forward_rows(&b.ids, &b.positions, &b.bias, None, Mode::Train).unwrap();
        let grads = h.sqr().unwrap().sum_all().unwrap().backward().unwrap();
        let data = m.varmap.data().lock().unwrap();
        let g = grads.get(data["model.embed_tokens.weight"].as_tensor()).unwrap().clone();
        let norms: Vec<f32> = [3usize, 5, 7]
            .iter()
            .map(|&r| {
                g.i(r).unwrap().sqr().unwrap().sum_all().unwrap().to_dtype(DType::F32).unwrap().to_scalar().unwrap()
            })
            .collect();
        (h, norms)
    };
    let (h_pad, with_pad) = grad_of_rows(Some(3));
    let (h_none, without) = grad_of_rows(None);
    assert_eq!(h_pad.to_vec2::<f64>().unwrap(), h_none.to_vec2::<f64>().unwrap(), "same values");
    assert_eq!(with_pad[0], 0.0, "the pad row");
    assert!(without[0] > 0.0 && with_pad[1] > 0.0 && with_pad[2] > 0.0);
    assert_eq!(with_pad[1], without[1], "other rows' gradients are untouched");
}

/// A backbone (what a reward model or a critic holds) has the same hidden states as the full
/// model, no LM head in memory (an untied model's `lm_head.weight` dropped), and saves and
/// loads back without one.
#[test]
fn a_backbone_has_the_hidden_states_without_an_lm_head() {
    let d = tempfile::tempdir().unwrap();
    tiny_model(Architecture::Llama, false, 9, DType::F32).unwrap().save_hf_dir(&d.path().join("m"), None).unwrap();
    let src = d.path().join("m").display().to_string();
    let full = LoadedModel::load(&src, &Device::Cpu).unwrap();
    let backbone = LoadedModel::load_backbone(&src, &Device::Cpu).unwrap();
    let names = |m: &LoadedModel| m.varmap.data().lock().unwrap().keys().cloned().collect::<Vec<_>>();
    assert!(names(&full).contains(&"lm_head.weight".to_string()));
    assert!(!names(&backbone).contains(&"lm_head.weight".to_string()), "the untied head is not in memory");
    assert_eq!(names(&backbone).len() + 1, names(&full).len());
    let batch = PaddedBatch::new(&[vec![1, 5, 7, 2]], 0, Padding::Right, &Device::Cpu).unwrap();
    let hidden =
        |m: &LoadedModel| m.model.forward_hidden(&batch.ids, &batch.positions, &batch.bias, None, Mode::Infer).unwrap();
    let (a, b) = (hidden(&full), hidden(&backbone));
    assert_eq!(common::max_abs_diff(&a, &b), 0.0);
    let e = backbone.model.lm_head(&b).unwrap_err().to_string();
    assert!(e.contains("no LM head"), "{e}");
    backbone.save_hf_dir(&d.path().join("b"), None).unwrap();
    let again = LoadedModel::load_backbone(&d.path().join("b").display().to_string(), &Device::Cpu).unwrap();
    assert_eq!(common::max_abs_diff(&hidden(&again), &a), 0.0);
    assert!(LoadedModel::load(&d.path().join("b").display().to_string(), &Device::Cpu).is_err(), "not a whole LM");
}
