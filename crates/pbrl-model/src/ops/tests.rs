//! Each fused op against its composite reference: values and gradients.
use super::*;
use candle_core::{Device, Var};
use rand::{Rng, SeedableRng};

fn random(shape: &[usize], seed: u64) -> Tensor {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n).map(|_| rng.random::<f64>() * 2.0 - 1.0).collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
}

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f64>().unwrap()
}

type Op<'a> = &'a dyn Fn(&[Tensor]) -> Tensor;

/// A fused op and its composite reference agree in value and in the gradient of every
/// input for a random upstream gradient (f64, so the tolerance is tight). The composite is
/// what runs on non-CPU devices.
fn check(inputs: &[Tensor], fused: Op, composite: Op) {
    let run = |f: Op| {
        let vars: Vec<Var> = inputs.iter().map(|t| Var::from_tensor(t).unwrap()).collect();
        let ts: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
        let y = f(&ts);
        let probe = random(y.dims(), 99);
        let grads = (&y * &probe).unwrap().sum_all().unwrap().backward().unwrap();
        let g: Vec<Tensor> = ts.iter().map(|t| grads.get(t).expect("gradient").clone()).collect();
        (y, g)
    };
    let (yf, gf) = run(fused);
    let (yc, gc) = run(composite);
    assert!(max_diff(&yf, &yc) < 1e-10, "values differ by {}", max_diff(&yf, &yc));
    for (i, (a, b)) in gf.iter().zip(&gc).enumerate() {
        assert!(max_diff(a, b) < 1e-10, "gradient of input {i} differs by {}", max_diff(a, b));
    }
}

/// An f32 op on two inputs against candle's composition in f64: the value and both inputs'
/// gradients (for the upstream gradient `probe`) agree within 1e-4. `op(a, b, ours)` runs pbrl's
/// op when `ours`, else the composition.
fn f32_matches_f64(inputs: [&Tensor; 2], probe: &Tensor, what: &str, op: impl Fn(&Tensor, &Tensor, bool) -> Tensor) {
    let run = |dtype: DType, ours: bool| {
        let vars = inputs.map(|t| Var::from_tensor(&t.to_dtype(dtype).unwrap()).unwrap());
        let y = op(vars[0].as_tensor(), vars[1].as_tensor(), ours);
        let g = (&y * probe.to_dtype(dtype).unwrap()).unwrap().sum_all().unwrap().backward().unwrap();
        let f64s = |t: &Tensor| t.to_dtype(DType::F64).unwrap();
        [f64s(&y), f64s(g.get(vars[0].as_tensor()).unwrap()), f64s(g.get(vars[1].as_tensor()).unwrap())]
    };
    let (got, want) = (run(DType::F32, true), run(DType::F64, false));
    for (name, (a, b)) in ["value", "gradient of input 0", "gradient of input 1"].iter().zip(got.iter().zip(&want)) {
        assert!(max_diff(a, b) < 1e-4, "{what}: {name} differs by {}", max_diff(a, b));
    }
}

/// The f32 linear layer (pbrl's kernel choice, `super::gemm`) against f64 candle matmuls,
/// in value and gradients, below and above the wide-kernel threshold.
#[test]
fn f32_linear_matches_f64_matmul_in_value_and_gradients() {
    for (m, n, k) in [(5, 3, 4), (130, 150, 140)] {
        let (x, w, probe) = (random(&[m, k], 20), random(&[n, k], 21), random(&[m, n], 22));
        f32_matches_f64([&x, &w], &probe, &format!("{m}x{n}x{k}"), |x, w, ours| {
            if ours { linear(x, w) } else { x.matmul(&w.t().unwrap()) }.unwrap()
        });
    }
}

/// A frozen weight (a plain tensor, not a variable) gets no gradient, and the input's is the
/// same as with a trainable weight.
#[test]
fn a_frozen_weight_gets_no_gradient() {
    let (x, w, probe) = (random(&[6, 4], 30), random(&[5, 4], 31), random(&[6, 5], 32));
    let xv = Var::from_tensor(&x).unwrap();
    let wv = Var::from_tensor(&w).unwrap();
    let grads =
        |w: &Tensor| (&linear(xv.as_tensor(), w).unwrap() * &probe).unwrap().sum_all().unwrap().backward().unwrap();
    let (frozen, trained) = (grads(&w), grads(wv.as_tensor()));
    assert!(frozen.get(&w).is_none(), "no gradient buffer for the frozen weight");
    assert!(trained.get(wv.as_tensor()).is_some());
    assert_eq!(max_diff(frozen.get(xv.as_tensor()).unwrap(), trained.get(xv.as_tensor()).unwrap()), 0.0);
}

#[test]
fn fused_ops_match_their_composite_references() {
    let (b, s, n, d) = (2, 5, 3, 8);
    let cos = random(&[b, s, d / 2], 1);
    let sin = random(&[b, s, d / 2], 2);
    let targets = Tensor::new(&[3u32, 0, 6, 2], &Device::Cpu).unwrap();
    check(&[random(&[4, 3, 7], 5)], &|t| softmax_last_dim(&t[0]).unwrap(), &|t| softmax_composite(&t[0]).unwrap());
    check(&[random(&[b * s, n * d], 7)], &|t| split_heads(&t[0], b, s, n, d, Some((&cos, &sin))).unwrap(), &|t| {
        split_heads_composite(&t[0], b, s, n, d, Some((&cos, &sin))).unwrap()
    });
    check(&[random(&[b * s, n * d], 8)], &|t| split_heads(&t[0], b, s, n, d, None).unwrap(), &|t| {
        split_heads_composite(&t[0], b, s, n, d, None).unwrap()
    });
    check(&[random(&[b, n, s, d], 9)], &|t| merge_heads(&t[0]).unwrap(), &|t| merge_heads_composite(&t[0]).unwrap());
    check(&[random(&[5, 4], 10), random(&[3, 4], 11)], &|t| linear(&t[0], &t[1]).unwrap(), &|t| {
        t[0].matmul(&t[1].t().unwrap()).unwrap()
    });
    // More rows than one block of the weight gradient's sum.
    check(&[random(&[130, 6], 13), random(&[6], 14)], &|t| rms_norm(&t[0], &t[1], 1e-5).unwrap(), &|t| {
        rms_norm_composite(&t[0], &t[1], 1e-5).unwrap()
    });
    // Attention's probabilities: 2 sequences, 3 heads, 4 queries, 5 keys; each sequence's mask
    // (read by all its heads) hides keys past query + 1 with -inf, and adds 0.5 in the second.
    let causal: Vec<f64> = (0..2 * 4 * 5)
        .map(|i| if i % 5 > (i / 5) % 4 + 1 { f64::NEG_INFINITY } else { (i / 20) as f64 * 0.5 })
        .collect();
    let mask = Tensor::from_vec(causal, (2, 4, 5), &Device::Cpu).unwrap();
    check(&[random(&[2, 3, 4, 5], 17)], &|t| masked_softmax(&t[0], &mask, 0.3).unwrap(), &|t| {
        masked_softmax_composite(&t[0], &mask, 0.3).unwrap()
    });
    // More elements than one chunk of the pool's work, so chunks past the first are checked.
    check(&[random(&[3, 4100], 15), random(&[3, 4100], 16)], &|t| silu_mul(&t[0], &t[1]).unwrap(), &|t| {
        silu_mul_composite(&t[0], &t[1]).unwrap()
    });
    // Targets carry no gradient: check the logits' gradient alone.
    let logits = random(&[4, 7], 12);
    check(&[logits], &|t| token_log_probs(&t[0], &targets).unwrap(), &|t| {
        token_log_probs_composite(&t[0], &targets).unwrap()
    });
}

/// A frozen weight stored in bf16 or q8_0: the product and dX equal the f32 product with the
/// stored weight read back (bf16 widened, q8_0 dequantized), and the weight gets no gradient.
#[test]
fn frozen_bf16_and_q8_0_weights_give_the_f32_product_of_the_stored_values() {
    use candle_core::quantized::{GgmlDType, QTensor};
    let (m, n, k) = (7, 5, 64);
    let x = random(&[m, k], 30).to_dtype(DType::F32).unwrap();
    let w = random(&[n, k], 31).to_dtype(DType::F32).unwrap();
    let probe = random(&[m, n], 32).to_dtype(DType::F32).unwrap();
    let q = Arc::new(QTensor::quantize(&w, GgmlDType::Q8_0).unwrap());
    let bf16 = w.to_dtype(DType::BF16).unwrap();
    type Frozen<'a> = &'a dyn Fn(&Tensor) -> Tensor;
    let cases: [(&str, Tensor, Frozen); 2] = [
        ("bf16", bf16.to_dtype(DType::F32).unwrap(), &|x| linear(x, &bf16).unwrap()),
        ("q8_0", q.dequantize(&Device::Cpu).unwrap(), &|x| quantized_linear(x, &q).unwrap()),
    ];
    for (name, stored, frozen) in cases {
        let run = |f: &dyn Fn(&Tensor) -> Tensor| {
            let xv = Var::from_tensor(&x).unwrap();
            let y = f(xv.as_tensor());
            let grads = (&y * &probe).unwrap().sum_all().unwrap().backward().unwrap();
            (y, grads.get(xv.as_tensor()).expect("dX").clone())
        };
        let (y, dx) = run(frozen);
        let (y_ref, dx_ref) = run(&|x| x.matmul(&stored.t().unwrap()).unwrap());
        let to64 = |t: &Tensor| t.to_dtype(DType::F64).unwrap();
        assert!(max_diff(&to64(&y), &to64(&y_ref)) < 1e-5, "{name}: values");
        assert!(max_diff(&to64(&dx), &to64(&dx_ref)) < 1e-5, "{name}: dX");
        // The stored weight is close to the original (what the tolerance of the model-level
        // test rests on), not equal.
        let err = max_diff(&to64(&stored), &to64(&w));
        assert!(err > 0.0 && err < 1e-2, "{name}: storage error {err}");
    }
}

/// The fused LoRA projection (f32) against the composition in f64 over the same stored base:
/// the value and the gradients of x, A and B, for f32, bf16 and q8_0 bases, below and above
/// the wide-kernel threshold, with and without adapter dropout (the composition reading
/// `x ⊙ mask` in the adapter's term); with x outside the graph it gets no gradient and A, B the
/// same.
#[test]
fn the_fused_lora_projection_matches_the_composition() {
    use candle_core::quantized::{GgmlDType, QTensor};
    let (s, f32s, f64s) =
        (0.75, |t: &Tensor| t.to_dtype(DType::F32).unwrap(), |t: &Tensor| t.to_dtype(DType::F64).unwrap());
    for (m, out, inp, r) in [(7, 5, 64, 3), (130, 160, 96, 16)] {
        let (x, w, a, b) =
            (random(&[m, inp], 40), random(&[out, inp], 41), random(&[r, inp], 42), random(&[out, r], 43));
        let probe = random(&[m, out], 44);
        let q = Arc::new(QTensor::quantize(&f32s(&w), GgmlDType::Q8_0).unwrap());
        let bf16 = w.to_dtype(DType::BF16).unwrap();
        let bases = [
            ("f32", BaseWeight::Dense(f32s(&w)), w.clone()),
            ("bf16", BaseWeight::Dense(bf16.clone()), f64s(&bf16)),
            ("q8_0", BaseWeight::Quantized(q.clone()), f64s(&q.dequantize(&Device::Cpu).unwrap())),
        ];
        let cases = bases.iter().flat_map(|b| [(b, None), (b, Some((0.3f32, 77u64)))]);
        for ((name, base, stored), dropout) in cases {
            let mask = dropout.map(|(p, key)| {
                Tensor::from_vec(crate::dropout::mask(key, m, inp, p), (m, inp), &Device::Cpu).unwrap()
            });
            for track_x in [true, false] {
                let run = |fused: bool| {
                    let dtype = if fused { DType::F32 } else { DType::F64 };
                    let cast = |t: &Tensor| t.to_dtype(dtype).unwrap();
                    let (xv, av, bv) = [&x, &a, &b].map(|t| Var::from_tensor(&cast(t)).unwrap()).into();
                    let xt = if track_x { xv.as_tensor().clone() } else { cast(&x) };
                    let y = if fused {
                        assert!(lora_fuses(&xt, base, &av, &bv), "{name}: the fused op applies");
                        lora_linear(&xt, base, &av, &bv, s, dropout).unwrap()
                    } else {
                        let read = match &mask {
                            Some(mask) => (&xt * cast(mask)).unwrap(),
                            None => xt.clone(),
                        };
                        let delta =
                            (read.matmul(&av.t().unwrap()).unwrap().matmul(&bv.t().unwrap()).unwrap() * s).unwrap();
                        (xt.matmul(&stored.t().unwrap()).unwrap() + delta).unwrap()
                    };
                    let grads = (&y * &cast(&probe)).unwrap().sum_all().unwrap().backward().unwrap();
                    let dx = grads.get(xv.as_tensor()).map(f64s);
                    (f64s(&y), dx, f64s(grads.get(&av).unwrap()), f64s(grads.get(&bv).unwrap()))
                };
                let ((y, dx, da, db), (y_ref, dx_ref, da_ref, db_ref)) = (run(true), run(false));
                let case = format!("{name} {m}x{out}x{inp} r {r}, dropout {dropout:?}, x tracked {track_x}");
                assert_eq!(dx.is_some(), track_x, "{case}: dX only for a tracked x");
                if let (Some(dx), Some(dx_ref)) = (&dx, &dx_ref) {
                    assert!(max_diff(dx, dx_ref) < 1e-4, "{case}: dX differs by {}", max_diff(dx, dx_ref));
                }
                for (what, got, want) in [("y", &y, &y_ref), ("dA", &da, &da_ref), ("dB", &db, &db_ref)] {
                    assert!(max_diff(got, want) < 1e-4, "{case}: {what} differs by {}", max_diff(got, want));
                }
            }
        }
    }
}

/// The f32 batched product against f64 candle matmuls, in value and gradients: strided batch
/// dimensions (a narrowed cache), a transposed operand, and batches smaller and larger than
/// the pool.
#[test]
fn f32_batched_matmul_matches_f64_matmul_in_value_and_gradients() {
    for (batch, m, n, k) in [(1, 40, 30, 20), (3, 70, 50, 64), (24, 9, 130, 16)] {
        let (a, cache, probe) =
            (random(&[2, batch, m, k], 30), random(&[2, batch, n + 5, k], 31), random(&[2, batch, m, n], 32));
        f32_matches_f64([&a, &cache], &probe, &format!("{batch}x{m}x{n}x{k}"), |a, cache, ours| {
            // (2, batch, n, k) rows of a longer cache, used transposed: (2, batch, k, n).
            let b = cache.narrow(2, 2, n).unwrap().t().unwrap();
            if ours { batched_matmul(a, &b) } else { a.matmul(&b) }.unwrap()
        });
    }
}

/// The f32 kernels with exponentials (softmax, attention's masked softmax, the MLP's gate, the
/// token log-prob over a vocabulary-sized row) against f64 candle compositions, in value and
/// gradients.
#[test]
fn f32_exp_kernels_match_f64_compositions() {
    let scaled = |t: Tensor, by: f64| (t * by).unwrap();
    let (x, y) = (scaled(random(&[6, 50], 40), 8.0), random(&[6, 50], 41));
    f32_matches_f64([&x, &y], &random(&[6, 50], 42), "softmax", |x, y, ours| {
        (if ours { softmax_last_dim(x) } else { softmax_composite(x) }.unwrap() * y).unwrap()
    });
    let (scores, mask) = (scaled(random(&[2, 3, 6, 50], 49), 20.0), scaled(random(&[2, 6, 50], 50), 5.0));
    f32_matches_f64(
        [&scores, &random(&[2, 3, 6, 50], 51)],
        &random(&[2, 3, 6, 50], 52),
        "masked softmax",
        |x, y, ours| {
            let mask = mask.to_dtype(x.dtype()).unwrap();
            (if ours { masked_softmax(x, &mask, 0.125) } else { masked_softmax_composite(x, &mask, 0.125) }.unwrap()
                * y)
                .unwrap()
        },
    );
    let (gate, up) = (scaled(random(&[7, 600], 43), 12.0), random(&[7, 600], 44));
    f32_matches_f64([&gate, &up], &random(&[7, 600], 45), "silu-mul", |a, u, ours| {
        if ours { silu_mul(a, u) } else { silu_mul_composite(a, u) }.unwrap()
    });
    let (logits, shift) = (scaled(random(&[5, 3000], 46), 10.0), random(&[5, 3000], 47));
    let targets = Tensor::new(&[3u32, 2999, 0, 1500, 7], &Device::Cpu).unwrap();
    f32_matches_f64([&logits, &shift], &random(&[5], 48), "token log-prob", |l, s, ours| {
        let l = (l + s).unwrap();
        if ours { token_log_probs(&l, &targets) } else { token_log_probs_composite(&l, &targets) }.unwrap()
    });
}

/// At `compute_dtype = "bf16"` each product with the frozen matrix reads its input rounded to
/// bf16 and the matrix's bf16 values, summing in f32: y = r(x) W̃ᵀ, dX = r(G) W̃ (r: rounding to
/// bf16, W̃ = r(W)); a LoRA adapter's own term and its gradients stay f32. The plain frozen
/// projection and the fused LoRA one, over a base stored in f32 or bf16, on shapes with short
/// tiles and strips, against f64 sums; and the rounding shows (the exact products differ).
#[test]
fn bf16_products_round_their_inputs_and_sum_in_f32() {
    let (s, m, out, inp, r) = (0.75, 21, 50, 70, 4);
    let (x, w, a, b, g) = (
        random(&[m, inp], 60),
        random(&[out, inp], 61),
        random(&[r, inp], 62),
        random(&[out, r], 63),
        random(&[m, out], 64),
    );
    let f32s = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
    let f64s = |t: &Tensor| t.to_dtype(DType::F64).unwrap();
    let round = |t: &Tensor| f32s(t).to_dtype(DType::BF16).unwrap().to_dtype(DType::F64).unwrap();
    let mm = |p: &Tensor, q: &Tensor| p.matmul(q).unwrap();
    let (w_r, x_a_b) = (round(&w), (mm(&mm(&x, &a.t().unwrap()), &b.t().unwrap()) * s).unwrap());
    let y_base = mm(&round(&x), &w_r.t().unwrap());
    let dx_base = mm(&round(&g), &w_r);
    let backward = |y: &Tensor, vars: &[&Var]| {
        let grads = (y * f32s(&g)).unwrap().sum_all().unwrap().backward().unwrap();
        vars.iter().map(|v| f64s(grads.get(v.as_tensor()).expect("gradient"))).collect::<Vec<_>>()
    };
    for stored in [f32s(&w), w.to_dtype(DType::BF16).unwrap()] {
        let matrix = Arc::new(Bf16Matrix::new(&stored).unwrap());
        let case = format!("stored {:?}", stored.dtype());
        assert_eq!(max_diff(&f64s(&matrix.f32_values().unwrap()), &w_r), 0.0, "{case}: W's bf16 values");
        let xv = Var::from_tensor(&f32s(&x)).unwrap();
        let y = bf16_linear(xv.as_tensor(), &matrix).unwrap();
        let dx = backward(&y, &[&xv]).remove(0);
        assert!(max_diff(&f64s(&y), &y_base) < 1e-4, "{case}: y");
        assert!(max_diff(&dx, &dx_base) < 1e-4, "{case}: dX");
        assert!(max_diff(&f64s(&y), &mm(&x, &w.t().unwrap())) > 1e-3, "{case}: the input is rounded");

        let base = BaseWeight::Bf16Products(matrix);
        let (xv, av, bv) = (
            Var::from_tensor(&f32s(&x)).unwrap(),
            Var::from_tensor(&f32s(&a)).unwrap(),
            Var::from_tensor(&f32s(&b)).unwrap(),
        );
        assert!(lora_fuses(xv.as_tensor(), &base, &av, &bv), "{case}: the fused op applies");
        let y = lora_linear(xv.as_tensor(), &base, &av, &bv, s, None).unwrap();
        let grads = backward(&y, &[&xv, &av, &bv]);
        let v = mm(&g, &b);
        let want = [
            ("y", (&y_base + &x_a_b).unwrap()),
            ("dX", (&dx_base + (mm(&v, &a) * s).unwrap()).unwrap()),
            ("dA", (mm(&v.t().unwrap(), &x) * s).unwrap()),
            ("dB", (mm(&g.t().unwrap(), &mm(&x, &a.t().unwrap())) * s).unwrap()),
        ];
        let got = [f64s(&y), grads[0].clone(), grads[1].clone(), grads[2].clone()];
        for ((what, want), got) in want.iter().zip(&got) {
            assert!(max_diff(got, want) < 1e-4, "{case}: LoRA {what} differs by {}", max_diff(got, want));
        }
    }
}
