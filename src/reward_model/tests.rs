//! The reward model's unit tests (tiny random backbones).
use super::*;
use pbrl_model::tiny::tiny_model;
use pbrl_model::Architecture;

/// A reward model on a tiny random Llama backbone, for two agents.
pub(crate) fn tiny_reward_model() -> JointRewardModel {
    tiny_reward_model_with(RewardHeadKind::LastToken)
}

pub(crate) fn tiny_reward_model_with(kind: RewardHeadKind) -> JointRewardModel {
    let backbone = tiny_model(Architecture::Llama, true, 7, candle_core::DType::F32).unwrap();
    JointRewardModel::fresh(backbone, 2, None, kind, 5, 3).unwrap()
}

/// Token row `i` of a family of rows of different lengths (3 + 2i tokens).
pub(crate) fn test_row(i: u32) -> Vec<u32> {
    (0..(3 + 2 * i)).map(|t| 4 + (t * 5 + i) % 30).collect()
}

/// [`test_row`] as a joint row: agent 1's response its tokens 1..2 + i, agent 2's the rest
/// but the first.
pub(crate) fn test_joint_row(i: u32) -> JointRow {
    let (n, i) = (3 + 2 * i as usize, i as usize);
    JointRow { ids: test_row(i as u32), responses: vec![1..2 + i, 2 + i..n], response_tokens: vec![1 + i, n - 2 - i] }
}

#[test]
fn pairs_packed_on_their_common_prefix_score_and_train_as_two_passes_do() {
    let rm = tiny_reward_model();
    // Pairs that share a prefix of 0, 2 and 5 tokens, one row a prefix of the other, lengths unequal.
    let base: Vec<Vec<u32>> = (0..6).map(test_row).collect();
    let row =
        |ids: Vec<u32>| JointRow { responses: vec![0..1, 1..ids.len()], response_tokens: vec![1, ids.len() - 1], ids };
    let with_prefix = |p: &[u32], r: &[u32]| row(p.iter().chain(r).copied().collect());
    let pairs: Vec<(JointRow, JointRow)> = vec![
        (row(base[1].clone()), row(base[2].clone())),
        (with_prefix(&base[0][..2], &base[3]), with_prefix(&base[0][..2], &base[1])),
        (with_prefix(&base[5][..5], &base[4]), row(base[5][..5].to_vec())),
    ];
    let refs: Vec<(&JointRow, &JointRow)> = pairs.iter().map(|(a, b)| (a, b)).collect();
    let two_passes = || {
        let side = |i: usize| pairs.iter().map(|p| if i == 0 { p.0.clone() } else { p.1.clone() }).collect::<Vec<_>>();
        (rm.score_rows(&side(0), Mode::Train).unwrap(), rm.score_rows(&side(1), Mode::Train).unwrap())
    };
    let (w0, l0) = two_passes();
    let (w1, l1) = rm.score_pairs(&refs, Mode::Train).unwrap();
    let v = |t: &Tensor| t.to_vec1::<f32>().unwrap();
    for (a, b) in v(&w1).iter().chain(&v(&l1)).zip(v(&w0).iter().chain(&v(&l0))) {
        assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{a} vs {b}");
    }
    let g0 = crate::algo::bradley_terry::bradley_terry_loss(&w0, &l0).unwrap().backward().unwrap();
    let g1 = crate::algo::bradley_terry::bradley_terry_loss(&w1, &l1).unwrap().backward().unwrap();
    for (name, var) in rm.trainable(false) {
        let (a, b) = (g1.get(var.as_tensor()), g0.get(var.as_tensor()));
        let (Some(a), Some(b)) = (a, b) else {
            assert!(a.is_none() && b.is_none(), "{name}: a gradient on one path only");
            continue;
        };
        let scale = b.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap().max(1e-6);
        let diff = (a - b).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        assert!(diff <= 1e-4 * scale, "{name}: gradients differ by {diff} (scale {scale})");
        if name == "reward_head.bias" {
            assert_eq!(a.to_vec1::<f32>().unwrap(), vec![0.0], "the bias's gradient is exactly 0");
        }
    }
    let empty = JointRow { ids: vec![], responses: vec![0..0, 0..0], response_tokens: vec![0, 0] };
    let (we, le) = rm.score_pairs(&[(&test_joint_row(0), &empty)], Mode::Infer).unwrap();
    assert_eq!((we.dims(), le.dims()), (&[1][..], &[1][..]), "an empty row falls back to the padded passes");
}

#[test]
fn frozen_features_score_as_the_backbone_does() {
    for kind in [RewardHeadKind::LastToken, RewardHeadKind::PooledMlp] {
        let rm = tiny_reward_model_with(kind);
        let rows: Vec<JointRow> = (0..7).map(test_joint_row).collect();
        let through = rm.score_rows(&rows, Mode::Train).unwrap().to_vec1::<f32>().unwrap();
        let hidden = rm.backbone.model.config.hidden_size;
        let width = if kind.is_last_token() { hidden } else { 2 * (hidden + 1) };
        // Other batchings (other padding) than the one pass through the backbone.
        for batch in [1, 3, 8] {
            let f = rm.features(&rows, batch).unwrap();
            assert_eq!(f.dims(), &[7, width]);
            let s = rm.score_features(&f).unwrap().to_vec1::<f32>().unwrap();
            for (a, b) in s.iter().zip(&through) {
                assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{kind:?}, batch {batch}: {s:?} vs {through:?}");
            }
        }
        assert!(rm.features(&[], 8).is_err());
    }
}

#[test]
fn the_pooled_head_reads_each_responses_mean_state_and_log_token_count() {
    let rm = tiny_reward_model_with(RewardHeadKind::PooledMlp);
    let (prompts, responses) = (vec!["w1 w2".to_string(), "w3".into()], vec!["w4 w5 w6".to_string(), "".into()]);
    let row = rm.encode(&prompts, &responses).unwrap();
    assert_eq!(row.ids[row.responses[0].clone()], [7, 8, 9], "agent 1's response tokens");
    assert_eq!((row.responses[1].len(), row.response_tokens.clone()), (0, vec![3, 0]));
    assert_eq!(rm.text(&prompts, &responses).split_whitespace().count(), row.ids.len());
    // By hand: the states of one row, averaged over the response's positions.
    let batch = PaddedBatch::new(std::slice::from_ref(&row.ids), 0, Padding::Right, &Device::Cpu).unwrap();
    let h = rm.backbone.model.forward_rows(&batch.ids, &batch.positions, &batch.bias, None, Mode::Infer).unwrap();
    let h: Vec<Vec<f32>> = h.to_vec2().unwrap();
    let f: Vec<f32> = rm.features(std::slice::from_ref(&row), 1).unwrap().squeeze(0).unwrap().to_vec1().unwrap();
    let width = h[0].len();
    for c in 0..width {
        let mean = row.responses[0].clone().map(|t| h[t][c]).sum::<f32>() / 3.0;
        assert!((f[c] - mean).abs() < 1e-5, "column {c}: {} vs {mean}", f[c]);
        assert_eq!(f[width + c], 0.0, "an empty response pools to zeros");
    }
    assert_eq!(&f[2 * width..], &[4f32.ln(), 0.0], "log(1 + tokens) per agent");
    // Cut to max_length: the ranges are cut, the counts are not.
    let short = JointRewardModel { max_length: row.responses[0].start + 1, ..rm };
    let cut = short.encode(&prompts, &responses).unwrap();
    assert_eq!((cut.responses[0].len(), cut.response_tokens[0]), (1, 3));
}

#[test]
fn a_saved_pooled_reward_model_scores_the_same_and_its_description_is_checked() {
    let dir = tempfile::tempdir().unwrap();
    let rm = tiny_reward_model_with(RewardHeadKind::PooledMlp);
    let rows: Vec<JointRow> = (0..4).map(test_joint_row).collect();
    let path = dir.path().join("rm");
    rm.save(&path).unwrap();
    let back = JointRewardModel::load(&path, &Device::Cpu, FrozenStorage::F32).unwrap();
    assert_eq!(back.kind(), RewardHeadKind::PooledMlp);
    assert_eq!(back.score(&rows, 4).unwrap(), rm.score(&rows, 4).unwrap(), "the same batching, the same scores");
    let (w, l) = rm.score_pairs(&[(&rows[0], &rows[1]), (&rows[2], &rows[3])], Mode::Infer).unwrap();
    let both: Vec<f32> = w.to_vec1::<f32>().unwrap().into_iter().chain(l.to_vec1::<f32>().unwrap()).collect();
    let each: Vec<f32> = [0, 2, 1, 3].iter().map(|&i| rm.score(&rows[i..=i], 1).unwrap()[0] as f32).collect();
    assert!(both.iter().zip(&each).all(|(a, b)| (a - b).abs() < 1e-5), "{both:?} vs {each:?}");
    let info = path.join("reward_model.json");
    let text = std::fs::read_to_string(&info).unwrap();
    assert!(text.contains(POOLED) && text.contains("\"mlp_hidden\": 5"), "{text}");
    std::fs::write(&info, text.replace("\"mlp_hidden\": 5", "\"mlp_hidden\": 6")).unwrap();
    let e = format!("{:#}", JointRewardModel::load(&path, &Device::Cpu, FrozenStorage::F32).err().unwrap());
    assert!(e.contains("pre_projection.0.weight` has shape [5, 66], the head needs [6, 66]"), "{e}");
    std::fs::write(&info, text.replace(POOLED, "mean")).unwrap();
    let e = format!("{:#}", JointRewardModel::load(&path, &Device::Cpu, FrozenStorage::F32).err().unwrap());
    assert!(e.contains("a head this pbrl does not read (pooling `mean`"), "{e}");
}
