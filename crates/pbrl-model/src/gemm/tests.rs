use super::*;

fn naive(m: usize, n: usize, k: usize, a: &[f32], b: &[f32]) -> Vec<f32> {
    let mut c = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k).map(|p| a[i * k + p] as f64 * b[p * n + j] as f64).sum::<f64>() as f32;
        }
    }
    c
}

/// Values in [-1, 1) in steps of 1/500, spread by a hash of the index.
pub(super) fn data(len: usize, seed: u32) -> Vec<f32> {
    (0..len)
        .map(|i| (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) % 1000) as f32 / 500.0 - 1.0)
        .collect()
}

#[test]
fn every_available_family_computes_the_product_in_any_layout() {
    for family in [KernelFamily::Avx512, KernelFamily::Avx2, KernelFamily::Scalar] {
        if !family.available() {
            continue;
        }
        for (m, n, k) in [(1, 1, 1), (4, 3, 0), (3, 5, 7), (8, 576, 64), (40, 33, 17), (64, 96, 128), (130, 140, 33)] {
            let (a, b) = (data(m * k, 1), data(k * n, 2));
            let want = naive(m, n, k, &a, &b);
            let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect(); // (n, k)
            let at: Vec<f32> = (0..k * m).map(|i| a[(i % m) * k + i / m]).collect(); // (k, m)
            for (lhs, rhs) in [
                (Operand::row_major(&a, k), Operand::row_major(&b, n)),
                (Operand::row_major(&a, k), Operand::transposed(&bt, k)),
                (Operand::transposed(&at, m), Operand::row_major(&b, n)),
            ] {
                let got = matmul(family, m, n, k, lhs, rhs).unwrap();
                for (g, w) in got.iter().zip(&want) {
                    assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "{family:?} {m}x{n}x{k}: {g} vs {w}");
                }
            }
        }
    }
}

/// A product cut into blocks for several threads gives the same bits as the whole one, in
/// every layout, along either side, accumulating or not.
#[test]
fn blocks_for_threads_change_no_bit_of_the_product() {
    for family in [KernelFamily::Avx512, KernelFamily::Avx2, KernelFamily::Scalar] {
        if !family.available() {
            continue;
        }
        // Longer rows or longer columns; a thin side of at most 64; a depth above 512; few
        // enough rows for the dot kernels, or for W read in place.
        for (m, n, k) in [
            (400, 96, 70),
            (96, 700, 70),
            (300, 16, 600),
            (50, 900, 1100),
            (12, 700, 600),
            (32, 700, 600),
            (48, 300, 70),
        ] {
            assert!(Blocks::of((m, n, k), 3).count > 1, "{m}x{n}x{k} is cut");
            let (a, b) = (data(m * k, 3), data(k * n, 4));
            let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
            let start = data(m * n, 5);
            for (lhs, rhs) in [
                (Operand::row_major(&a, k), Operand::row_major(&b, n)),
                (Operand::row_major(&a, k), Operand::transposed(&bt, k)),
            ] {
                for accumulate in [Accumulate::No, Accumulate::Yes] {
                    let run = |threads| {
                        let mut dst = start.clone();
                        gemm_in_blocks(family, (m, n, k), &mut dst, accumulate, 0.5, lhs, rhs, threads).unwrap();
                        dst
                    };
                    let whole = run(1);
                    let want = naive(m, n, k, &a, &b);
                    assert_scaled_product(&whole, &want, &start, accumulate, 1e-4, &format!("{family:?} {m}x{n}x{k}"));
                    for threads in [2, 3, 8] {
                        let cut = run(threads);
                        assert!(
                            cut.iter().zip(&whole).all(|(c, w)| c.to_bits() == w.to_bits()),
                            "{family:?} {m}x{n}x{k} on {threads} threads"
                        );
                    }
                }
            }
        }
    }
}

/// SmolLM2's products cut along the model's side (576, 1536 columns) split evenly over two
/// threads: every thread computes the same share of the output (the blocks are handed out in
/// turn, so equal blocks in an even count). Products cut along their rows (a batch's tokens,
/// any number) are not covered.
#[test]
fn smollm2_products_are_cut_evenly_for_two_threads() {
    for (m, n, k) in [(400, 576, 576), (400, 576, 1536), (400, 1536, 576), (288, 576, 49152), (64, 576, 576)] {
        let blocks = Blocks::of((m, n, k), 2);
        let sizes: Vec<usize> = (0..blocks.count).map(|b| blocks.block(b).1.len() * blocks.block(b).0.len()).collect();
        assert!(
            blocks.count.is_multiple_of(2) && sizes.iter().all(|&s| s == sizes[0]),
            "{m}x{n}x{k}: blocks {sizes:?}"
        );
    }
}

/// `got` is `[start +] 0.5 · want` (as `accumulate` says) within `tol` relative.
fn assert_scaled_product(got: &[f32], want: &[f32], start: &[f32], accumulate: Accumulate, tol: f32, case: &str) {
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let w = if accumulate == Accumulate::Yes { start[i] } else { 0.0 } + 0.5 * w;
        assert!((g - w).abs() <= tol * (1.0 + w.abs()), "{case}: {g} vs {w}");
    }
}

/// The dot kernels (a few rows, `x Wᵀ`'s layout) give each output the same bits whatever the
/// number of rows beside it, with every remainder of their tiles (rows of x and of W, the
/// depth's lanes), and agree with the exact product.
#[test]
fn a_dot_kernel_output_does_not_depend_on_the_rows_beside_it() {
    for family in [KernelFamily::Avx512, KernelFamily::Avx2] {
        if !family.available() {
            continue;
        }
        for (n, k) in [(1, 1), (7, 15), (9, 16), (5, 17), (13, 40), (6, 100)] {
            let m = DOT_MAX_ROWS;
            let (x, w) = (data(m * k, 6), data(n * k, 7));
            let start = data(m * n, 8);
            for accumulate in [Accumulate::No, Accumulate::Yes] {
                let product = |rows: usize| {
                    let mut dst = start[..rows * n].to_vec();
                    let (lhs, rhs) = (Operand::row_major(&x[..rows * k], k), Operand::transposed(&w, k));
                    gemm_in_blocks(family, (rows, n, k), &mut dst, accumulate, 0.5, lhs, rhs, 1).unwrap();
                    dst
                };
                let all = product(m);
                let wt: Vec<f32> = (0..k * n).map(|i| w[(i % n) * k + i / n]).collect(); // (k, n)
                let want = naive(m, n, k, &x, &wt);
                assert_scaled_product(&all, &want, &start, accumulate, 1e-5, &format!("{family:?} {m}x{n}x{k}"));
                for rows in 1..m {
                    let few = product(rows);
                    assert!(
                        few.iter().zip(&all).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{family:?} {rows} of {m} rows, {n}x{k}"
                    );
                }
            }
        }
    }
}

/// W stored in bf16 or q8_0 and read in place: bit for bit the dot kernels' product on the f32
/// copy (bf16 widened, q8_0 dequantized as candle does), within 1e-5 of the exact product.
#[test]
fn stored_weights_give_the_product_of_their_f32_copy() {
    for family in [KernelFamily::Avx512, KernelFamily::Avx2] {
        if !family.available() {
            continue;
        }
        for (m, n, k) in [(1, 3, 32), (5, 9, 64), (16, 130, 96), (3, 7, 15)] {
            let x = data(m * k, 9);
            let w = data(n * k, 10);
            let bf16: Vec<u16> = w.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
            let widened: Vec<f32> = bf16.iter().map(|&b| f32::from_bits((b as u32) << 16)).collect();
            let mut cases = vec![("bf16", WeightRows::Bf16 { ptr: bf16.as_ptr(), stride: k }, widened)];
            let (mut q8, mut dequantized) = (Vec::new(), Vec::new());
            if k % 32 == 0 {
                for (b, block) in w.chunks(32).enumerate() {
                    let scale = half::f16::from_f32(0.01 + (b % 5) as f32 * 0.003);
                    q8.extend(scale.to_bits().to_le_bytes());
                    for (i, v) in block.iter().enumerate() {
                        let q = ((v * 127.0) as i8).wrapping_add((i as i8) % 3);
                        q8.push(q as u8);
                        dequantized.push(q as f32 * scale.to_f32());
                    }
                }
                let stride = k / 32 * Q8_BLOCK_BYTES;
                cases.push(("q8_0", WeightRows::Q8_0 { ptr: q8.as_ptr(), stride }, dequantized.clone()));
            }
            for (name, rows, copy) in cases {
                // SAFETY: each view holds n rows of k elements and outlives the call.
                let product = |rows| unsafe { stored_product(family, (m, n, k), &x, rows) }.unwrap().unwrap();
                let stored = product(rows);
                let f32_copy = product(WeightRows::F32 { ptr: copy.as_ptr(), stride: k });
                assert!(
                    stored.iter().zip(&f32_copy).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{family:?} {name} {m}x{n}x{k}"
                );
                let wt: Vec<f32> = (0..k * n).map(|i| copy[(i % n) * k + i / n]).collect();
                for (got, want) in stored.iter().zip(naive(m, n, k, &x, &wt)) {
                    assert!((got - want).abs() <= 1e-5 * (1.0 + want.abs()), "{family:?} {name}: {got} vs {want}");
                }
            }
        }
        // Above the dot kernels' rows: not theirs to compute.
        let (x, w) = (data(17 * 32, 1), data(32, 2));
        let rows = WeightRows::F32 { ptr: w.as_ptr(), stride: 32 };
        assert!(unsafe { stored_product(family, (17, 1, 32), &x, rows) }.unwrap().is_none());
    }
}

#[test]
fn operands_too_small_for_their_shape_are_an_error() {
    let a = vec![0f32; 5];
    let err = matmul(KernelFamily::Scalar, 2, 2, 3, Operand::row_major(&a, 3), Operand::row_major(&a, 2));
    assert!(err.unwrap_err().contains("lhs"));
}

#[test]
fn the_choice_follows_the_output_shape_and_the_variable() {
    let auto = KernelChoice::Auto { wide: Some(KernelFamily::Avx512), narrow: KernelFamily::Avx2 };
    assert_eq!(auto.family(8, 49152), KernelFamily::Avx2);
    assert_eq!(auto.family(512, 576), KernelFamily::Avx512);
    assert_eq!(KernelChoice::Forced(KernelFamily::Scalar).family(512, 576), KernelFamily::Scalar);
    assert_eq!(parse_choice(Some("scalar")), Ok(KernelChoice::Forced(KernelFamily::Scalar)));
    assert!(parse_choice(Some("avx9")).unwrap_err().contains("expected auto, avx512, avx2 or scalar"));
    assert!(matches!(parse_choice(None), Ok(KernelChoice::Auto { .. })));
}
