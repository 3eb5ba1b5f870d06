//! The joint reward model (reference §7.2): a causal-LM backbone with a scalar head on the final
//! hidden state (after the final norm) of the last real token of the joint text of all agents'
//! prompts and responses.
//!
//! Saved as `<dir>/backbone/` (a Hugging Face directory transformers loads as it is),
//! `<dir>/reward_head.safetensors` (`reward_head.weight` (1, hidden), `reward_head.bias` (1,)) and
//! `<dir>/reward_model.json` (how to build and tokenize the joint text), written into a temporary
//! sibling and swapped into place, so a reward model directory is whole or absent.
use std::path::Path;

use anyhow::{bail, Context, Result};
use candle_core::{Device, Tensor, Var};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::algo::bradley_terry::joint_text;
use crate::model::heads::{last_token_hidden, pair_last_token_hidden, ScalarHead};
use crate::model::{LoadedModel, Mode};

/// The head's prefix in the backbone's `VarMap` (and in `reward_head.safetensors`).
pub const HEAD: &str = "reward_head";
const FORMAT: &str = "pbrl-joint-reward-model";

/// `reward_model.json`: what a reader needs to score joint responses as pbrl does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RewardModelInfo {
    pub format: String,
    pub version: u32,
    /// Agents in the joint text (numbered from 1 in it).
    pub num_agents: usize,
    /// Tokens kept of a joint text (the rest is cut from the end).
    pub max_length: usize,
    /// The joint text, with `{i}` the agent's number, `{prompt}` and `{response}` its texts;
    /// the header and each agent's two parts are joined by `separator`.
    pub joint_text: JointTextFormat,
    /// Tokenized with the tokenizer's own special tokens (transformers' default).
    pub add_special_tokens: bool,
    /// The score: `reward_head` applied to the final hidden state (after the final norm) at the
    /// last non-padding token.
    pub pooling: String,
    /// Where the backbone came from when the model was fitted.
    pub backbone_source: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JointTextFormat {
    pub header: String,
    pub agent_prompt: String,
    pub agent_response: String,
    pub separator: String,
}

impl JointTextFormat {
    fn reference() -> Self {
        Self {
            header: "Joint multi-agent response".into(),
            agent_prompt: "Agent {i} prompt:\n{prompt}".into(),
            agent_response: "Agent {i} response:\n{response}".into(),
            separator: "\n\n".into(),
        }
    }
}

pub struct JointRewardModel {
    /// The backbone; its `VarMap` also holds the head's weights (under [`HEAD`]).
    pub backbone: LoadedModel,
    head: ScalarHead,
    pub num_agents: usize,
    pub max_length: usize,
    pub device: Device,
}

impl JointRewardModel {
    /// A fresh reward model on `backbone` (the head drawn from `seed` with PyTorch's default
    /// init); `max_length` defaults to the backbone's context.
    pub fn fresh(backbone: LoadedModel, num_agents: usize, max_length: Option<usize>, seed: u64) -> Result<Self> {
        let device = backbone.model.device().clone();
        let hidden = backbone.model.config.hidden_size;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let head = ScalarHead::init(&backbone.varmap, HEAD, hidden, &mut rng, &device)?;
        let max_length = max_length.unwrap_or_else(|| backbone.model.config.context_length());
        Ok(Self { backbone, head, num_agents, max_length, device })
    }

    /// A reward model from given head weights (the golden tests use the reference's).
    pub fn with_head(
        backbone: LoadedModel,
        num_agents: usize,
        max_length: usize,
        w: Tensor,
        b: Tensor,
    ) -> Result<Self> {
        let device = backbone.model.device().clone();
        let head = ScalarHead::insert(&backbone.varmap, HEAD, w, b)?;
        Ok(Self { backbone, head, num_agents, max_length, device })
    }

    /// Load a reward model saved by [`JointRewardModel::save`].
    pub fn load(dir: &Path, device: &Device) -> Result<Self> {
        let info_path = dir.join("reward_model.json");
        let info: RewardModelInfo = serde_json::from_slice(
            &std::fs::read(&info_path).with_context(|| format!("reading {}", info_path.display()))?,
        )
        .with_context(|| format!("{}: not a pbrl reward model description", info_path.display()))?;
        if info.format != FORMAT || info.version != 1 || info.joint_text != JointTextFormat::reference() {
            bail!("{}: a reward model format this pbrl does not read", info_path.display());
        }
        let backbone = LoadedModel::load(&dir.join("backbone").display().to_string(), device)
            .with_context(|| format!("loading the reward model's backbone from {}", dir.display()))?;
        let hidden = backbone.model.config.hidden_size;
        let head = ScalarHead::load(&backbone.varmap, HEAD, hidden, &dir.join("reward_head.safetensors"), device)?;
        Ok(Self { backbone, head, num_agents: info.num_agents, max_length: info.max_length, device: device.clone() })
    }

    /// The weights an optimizer updates: the head only (`freeze_backbone`), or everything.
    pub fn trainable(&self, freeze_backbone: bool) -> Vec<(String, Var)> {
        let data = self.backbone.varmap.data().lock().expect("VarMap lock");
        let mut out: Vec<(String, Var)> = data
            .iter()
            .filter(|(k, _)| !freeze_backbone || k.starts_with(&format!("{HEAD}.")))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// The joint text of one joint response.
    pub fn text(&self, prompts: &[String], completions: &[String]) -> String {
        joint_text(self.num_agents, prompts, completions)
    }

    /// Token ids of a joint text: with the tokenizer's special tokens, cut to `max_length`.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = self.backbone.tokenizer.encode_with_special_tokens(text)?;
        ids.truncate(self.max_length);
        Ok(ids)
    }

    /// Scores (b,) of token rows (right-padded into one batch). With `Mode::Infer` the
    /// backbone's output carries no graph, so gradients reach the head only.
    pub fn score_rows(&self, rows: &[Vec<u32>], mode: Mode) -> Result<Tensor> {
        self.head.forward(&last_token_hidden(&self.backbone, rows, mode)?)
    }

    /// Scores (b,), (b,) of pairs of token rows, each pair's common prefix (the header and the
    /// first agent's prompt, for a winner and a loser of one item) run once: the same scores
    /// as [`JointRewardModel::score_rows`] on each side, in one forward pass. The head is
    /// applied to each side apart, so its bias gets exactly opposite gradients from the two
    /// (under a Bradley–Terry loss its true gradient, 0), not a rounding residue of one sum.
    pub fn score_pairs(&self, pairs: &[(&[u32], &[u32])], mode: Mode) -> Result<(Tensor, Tensor)> {
        if pairs.iter().any(|(a, b)| a.is_empty() || b.is_empty()) {
            // An empty row scores at its padded position 0 (as the reference): only a padded batch has one.
            let winners: Vec<Vec<u32>> = pairs.iter().map(|p| p.0.to_vec()).collect();
            let losers: Vec<Vec<u32>> = pairs.iter().map(|p| p.1.to_vec()).collect();
            return Ok((self.score_rows(&winners, mode)?, self.score_rows(&losers, mode)?));
        }
        let (w, l) = pair_last_token_hidden(&self.backbone, pairs, mode)?;
        Ok((self.head.forward(&w)?, self.head.forward(&l)?))
    }

    /// The final hidden states (n, hidden) at the rows' last real tokens, without gradients,
    /// `batch` rows per forward pass. With a frozen backbone these never change, so a fit
    /// computes them once and trains the head on them ([`JointRewardModel::score_features`]).
    pub fn features(&self, rows: &[Vec<u32>], batch: usize) -> Result<Tensor> {
        let parts = rows
            .chunks(batch.max(1))
            .map(|c| last_token_hidden(&self.backbone, c, Mode::Infer))
            .collect::<Result<Vec<_>>>()?;
        match parts.is_empty() {
            true => bail!("no joint texts to compute features of"),
            false => Ok(Tensor::cat(&parts, 0)?),
        }
    }

    /// Scores (b,) of final hidden states from [`JointRewardModel::features`] (differentiable in
    /// the head).
    pub fn score_features(&self, features: &Tensor) -> Result<Tensor> {
        self.head.forward(features)
    }

    /// Scores of joint texts, without gradients.
    pub fn score_texts(&self, texts: &[String]) -> Result<Vec<f64>> {
        let rows = texts.iter().map(|t| self.encode(t)).collect::<Result<Vec<_>>>()?;
        let s = self.score_rows(&rows, Mode::Infer)?.detach();
        Ok(s.to_dtype(candle_core::DType::F64)?.to_vec1()?)
    }

    /// Save into `dir`, all or nothing (a previous reward model there is replaced in one atomic
    /// exchange once the new one is complete).
    pub fn save(&self, dir: &Path) -> Result<()> {
        crate::run::atomic::install_dir(dir, |tmp| {
            self.backbone.save_hf_dir(&tmp.join("backbone"), None)?;
            let head: std::collections::HashMap<String, Tensor> = self.head.tensors().into_iter().collect();
            candle_core::safetensors::save(&head, tmp.join("reward_head.safetensors"))?;
            let info = RewardModelInfo {
                format: FORMAT.into(),
                version: 1,
                num_agents: self.num_agents,
                max_length: self.max_length,
                joint_text: JointTextFormat::reference(),
                add_special_tokens: true,
                pooling: "last_non_padding_token".into(),
                backbone_source: self.backbone.source.clone(),
            };
            crate::run::atomic_write(&tmp.join("reward_model.json"), &serde_json::to_vec_pretty(&info)?)
        })
        .with_context(|| format!("saving the reward model to {}", dir.display()))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::tiny::tiny_model;
    use crate::model::Architecture;

    /// A reward model on a tiny random Llama backbone, for two agents.
    pub(crate) fn tiny_reward_model() -> JointRewardModel {
        let backbone = tiny_model(Architecture::Llama, true, 7, candle_core::DType::F32).unwrap();
        JointRewardModel::fresh(backbone, 2, None, 3).unwrap()
    }

    /// Token row `i` of a family of rows of different lengths (3 + 2i tokens).
    pub(crate) fn test_row(i: u32) -> Vec<u32> {
        (0..(3 + 2 * i)).map(|t| 4 + (t * 5 + i) % 30).collect()
    }

    #[test]
    fn pairs_packed_on_their_common_prefix_score_and_train_as_two_passes_do() {
        let rm = tiny_reward_model();
        // Pairs that share a prefix of 0, 2 and 5 tokens, one row a prefix of the other, lengths unequal.
        let base: Vec<Vec<u32>> = (0..6).map(test_row).collect();
        let with_prefix = |p: &[u32], r: &[u32]| -> Vec<u32> { p.iter().chain(r).copied().collect() };
        let pairs: Vec<(Vec<u32>, Vec<u32>)> = vec![
            (base[1].clone(), base[2].clone()),
            (with_prefix(&base[0][..2], &base[3]), with_prefix(&base[0][..2], &base[1])),
            (with_prefix(&base[5][..5], &base[4]), base[5][..5].to_vec()),
        ];
        let refs: Vec<(&[u32], &[u32])> = pairs.iter().map(|(a, b)| (a.as_slice(), b.as_slice())).collect();
        let two_passes = || {
            let side =
                |i: usize| pairs.iter().map(|p| if i == 0 { p.0.clone() } else { p.1.clone() }).collect::<Vec<_>>();
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
        let (we, le) = rm.score_pairs(&[(&[5, 6][..], &[][..])], Mode::Infer).unwrap();
        assert_eq!((we.dims(), le.dims()), (&[1][..], &[1][..]), "an empty row falls back to the padded passes");
    }

    #[test]
    fn frozen_features_score_as_the_backbone_does() {
        let rm = tiny_reward_model();
        let rows: Vec<Vec<u32>> = (0..7).map(test_row).collect();
        let through = rm.score_rows(&rows, Mode::Train).unwrap().to_vec1::<f32>().unwrap();
        // Other batchings (other padding) than the one pass through the backbone.
        for batch in [1, 3, 8] {
            let f = rm.features(&rows, batch).unwrap();
            assert_eq!(f.dims(), &[7, rm.backbone.model.config.hidden_size]);
            let s = rm.score_features(&f).unwrap().to_vec1::<f32>().unwrap();
            for (a, b) in s.iter().zip(&through) {
                assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "batch {batch}: {s:?} vs {through:?}");
            }
        }
        assert!(rm.features(&[], 8).is_err());
    }
}
