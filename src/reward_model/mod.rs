//! The joint reward model (reference §7.2): a causal-LM backbone reading the joint text of all
//! agents' prompts and responses, and a head that scores its final hidden states (after the
//! final norm), one of two (`reward_head`):
//! - `last_token` (the reference's): a linear score of the last real token's hidden state;
//! - `pooled_mlp`: per agent, its response tokens' hidden states mean-pooled and log(1 + its
//!   token count), all agents' concatenated into `Linear → Tanh → Linear`. A linear score of
//!   one position is monotone in any feature it reads, and RoPE states carry a position weakly,
//!   so the last-token head cannot express a reward such as "the second answer 2-3x as long as
//!   the first"; per-agent features and a hidden layer can.
//!
//! Saved as `<dir>/backbone/` (a Hugging Face directory transformers loads as it is),
//! `<dir>/reward_head.safetensors` (last token: `reward_head.weight` (1, hidden),
//! `reward_head.bias` (1,); pooled: `reward_head.pre_projection.0.*`,
//! `reward_head.value_projection.*`) and `<dir>/reward_model.json` (how to build and tokenize
//! the joint text, and which head), written into a temporary sibling and swapped into place, so
//! a reward model directory is whole or absent.

use std::ops::Range;
use std::path::Path;

use anyhow::{bail, Context, Result};
use candle_core::{Device, Tensor, Var};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::algo::bradley_terry::{joint_text, joint_text_with_responses};
use pbrl_model::batch::{PaddedBatch, Padding};
use pbrl_model::heads::{last_token_hidden, pair_last_token_hidden, ScalarHead, ValueHead};
use pbrl_model::linear::FrozenStorage;
use pbrl_model::tokenizer::ByteRange;
use pbrl_model::{LoadedModel, Mode};

/// The head's prefix in the backbone's `VarMap` (and in `reward_head.safetensors`).
pub const HEAD: &str = "reward_head";
const FORMAT: &str = "pbrl-joint-reward-model";
/// A saved reward model's files: its description (written last), head and backbone.
const INFO_FILE: &str = "reward_model.json";
const HEAD_FILE: &str = "reward_head.safetensors";
const BACKBONE_DIR: &str = "backbone";

/// `reward_model.json`'s `pooling` of each head.
pub const LAST_TOKEN: &str = "last_non_padding_token";
pub const POOLED: &str = "agent_response_mean_and_log_tokens";

pub use crate::config::RewardHeadKind;

enum Head {
    LastToken(ScalarHead),
    PooledMlp(ValueHead),
}

/// One joint response as the reward model reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct JointRow {
    /// The joint text's tokens (cut to `max_length`).
    pub ids: Vec<u32>,
    /// Each agent's response as a range of `ids` (cut with them).
    pub responses: Vec<Range<usize>>,
    /// Each agent's response tokens before the cut.
    pub response_tokens: Vec<usize>,
}

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
    /// What the head reads: [`LAST_TOKEN`] (the final hidden state, after the final norm, at the
    /// last non-padding token) or [`POOLED`] (per agent, its response tokens' final hidden
    /// states mean-pooled, then per agent log(1 + its response's token count)).
    pub pooling: String,
    /// The pooled head's hidden layer width (absent for the last-token head).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mlp_hidden: Option<usize>,
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
    head: Head,
    pub num_agents: usize,
    pub max_length: usize,
    pub device: Device,
}

impl JointRewardModel {
    /// A fresh reward model on `backbone` with a `kind` head drawn from `seed` (last token:
    /// PyTorch's default `nn.Linear` init; pooled: N(0, 0.02) weights, zero biases, a hidden
    /// layer `mlp_hidden` wide); `max_length` defaults to the backbone's context.
    pub fn fresh(
        backbone: LoadedModel,
        num_agents: usize,
        max_length: Option<usize>,
        kind: RewardHeadKind,
        mlp_hidden: usize,
        seed: u64,
    ) -> Result<Self> {
        let device = backbone.model.device().clone();
        let hidden = backbone.model.config.hidden_size;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let head = match kind {
            RewardHeadKind::LastToken => {
                Head::LastToken(ScalarHead::init(&backbone.varmap, HEAD, hidden, &mut rng, &device)?)
            }
            RewardHeadKind::PooledMlp => {
                let input = pooled_width(num_agents, hidden);
                Head::PooledMlp(ValueHead::init(&backbone.varmap, HEAD, input, Some(mlp_hidden), &mut rng, &device)?)
            }
        };
        let max_length = max_length.unwrap_or_else(|| backbone.model.config.context_length());
        Ok(Self { backbone, head, num_agents, max_length, device })
    }

    /// A last-token reward model from given head weights (the golden tests use the reference's).
    pub fn with_head(
        backbone: LoadedModel,
        num_agents: usize,
        max_length: usize,
        w: Tensor,
        b: Tensor,
    ) -> Result<Self> {
        let device = backbone.model.device().clone();
        let head = Head::LastToken(ScalarHead::insert(&backbone.varmap, HEAD, w, b)?);
        Ok(Self { backbone, head, num_agents, max_length, device })
    }

    /// Whether `dir` holds a saved reward model (its description is written last).
    pub fn exists(dir: &Path) -> bool {
        dir.join(INFO_FILE).is_file()
    }

    /// What identifies a saved reward model: the digests of its head and its backbone.
    pub fn digest(dir: &Path) -> Result<String> {
        use crate::run::fingerprint::{file_digest, source_digest};
        Ok(format!(
            "{}+{}",
            file_digest(&dir.join(HEAD_FILE))?,
            source_digest(&dir.join(BACKBONE_DIR).display().to_string())?
        ))
    }

    /// Load a reward model saved by [`JointRewardModel::save`], its backbone stored as
    /// `storage` says (`frozen_dtype`: a loaded reward model only scores).
    pub fn load(dir: &Path, device: &Device, storage: FrozenStorage) -> Result<Self> {
        let info_path = dir.join(INFO_FILE);
        let info: RewardModelInfo = serde_json::from_slice(
            &std::fs::read(&info_path).with_context(|| format!("reading {}", info_path.display()))?,
        )
        .with_context(|| format!("{}: not a pbrl reward model description", info_path.display()))?;
        if info.format != FORMAT || info.version != 1 || info.joint_text != JointTextFormat::reference() {
            bail!("{}: a reward model format this pbrl does not read", info_path.display());
        }
        let backbone = LoadedModel::load_backbone(&dir.join(BACKBONE_DIR).display().to_string(), device)
            .and_then(|b| b.stored(storage))
            .with_context(|| format!("loading the reward model's backbone from {}", dir.display()))?;
        let hidden = backbone.model.config.hidden_size;
        let file = dir.join(HEAD_FILE);
        let head = match (info.pooling.as_str(), info.mlp_hidden) {
            (LAST_TOKEN, None) => Head::LastToken(ScalarHead::load(&backbone.varmap, HEAD, hidden, &file, device)?),
            (POOLED, Some(d)) if d >= 1 => {
                let input = pooled_width(info.num_agents, hidden);
                Head::PooledMlp(ValueHead::load(&backbone.varmap, HEAD, input, Some(d), &file, device)?)
            }
            (pooling, d) => bail!(
                "{}: a head this pbrl does not read (pooling `{pooling}`, mlp_hidden {d:?}; it reads `{LAST_TOKEN}` \
                 without mlp_hidden and `{POOLED}` with one >= 1)",
                info_path.display()
            ),
        };
        let rm =
            Self { backbone, head, num_agents: info.num_agents, max_length: info.max_length, device: device.clone() };
        // The head's weights are in the backbone's VarMap: one check covers both.
        crate::run::team::refuse_non_finite(&format!("the reward model in {}", dir.display()), &rm.backbone)?;
        Ok(rm)
    }

    pub fn kind(&self) -> RewardHeadKind {
        match self.head {
            Head::LastToken(_) => RewardHeadKind::LastToken,
            Head::PooledMlp(_) => RewardHeadKind::PooledMlp,
        }
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

    /// One joint response as the model reads it: its joint text's tokens (with the tokenizer's
    /// special tokens, cut to `max_length`) and where each agent's response lies in them.
    pub fn encode(&self, prompts: &[String], completions: &[String]) -> Result<JointRow> {
        let (text, spans) = joint_text_with_responses(self.num_agents, prompts, completions);
        let (mut ids, offsets) = self.backbone.tokenizer.encode_with_offsets(&text)?;
        let full: Vec<Range<usize>> = spans.iter().map(|span| tokens_within(&offsets, span)).collect();
        ids.truncate(self.max_length);
        let n = ids.len();
        Ok(JointRow {
            ids,
            responses: full.iter().map(|r| r.start.min(n)..r.end.min(n)).collect(),
            response_tokens: full.iter().map(Range::len).collect(),
        })
    }

    /// What the head reads of each row, (b, width): one pass of the rows (right-padded into
    /// one batch) through the backbone. With `Mode::Infer` the result carries no graph, so
    /// gradients reach the head only.
    fn head_input(&self, rows: &[JointRow], mode: Mode) -> Result<Tensor> {
        let ids: Vec<Vec<u32>> = rows.iter().map(|r| r.ids.clone()).collect();
        if let Head::LastToken(_) = self.head {
            return last_token_hidden(&self.backbone, &ids, mode);
        }
        let batch = PaddedBatch::new(&ids, self.backbone.tokenizer.pad_id, Padding::Right, &self.device)?;
        let seq = batch.ids.dim(1)?;
        let hidden =
            self.backbone.model.backbone.forward_rows(&batch.ids, &batch.positions, &batch.bias, None, mode)?;
        pool_responses(&hidden, seq, rows, self.num_agents)
    }

    fn apply_head(&self, input: &Tensor) -> Result<Tensor> {
        match &self.head {
            Head::LastToken(h) => h.forward(input),
            Head::PooledMlp(h) => h.forward(input),
        }
    }

    /// Scores (b,) of joint rows (right-padded into one batch).
    pub fn score_rows(&self, rows: &[JointRow], mode: Mode) -> Result<Tensor> {
        self.apply_head(&self.head_input(rows, mode)?)
    }

    /// Scores (b,), (b,) of pairs of joint rows: the same scores as
    /// [`JointRewardModel::score_rows`] on each side. The last-token head runs each pair packed
    /// on its common prefix (the header and the first agent's prompt, for a winner and a loser
    /// of one item) once, in one forward pass, and is applied to each side apart, so its bias
    /// gets exactly opposite gradients from the two (under a Bradley–Terry loss its true
    /// gradient, 0), not a rounding residue of one sum. The pooled head reads every response
    /// token of both sides, and runs them as two batches.
    pub fn score_pairs(&self, pairs: &[(&JointRow, &JointRow)], mode: Mode) -> Result<(Tensor, Tensor)> {
        let packable = pairs.iter().all(|(a, b)| !a.ids.is_empty() && !b.ids.is_empty());
        match (&self.head, packable) {
            (Head::LastToken(head), true) => {
                let ids: Vec<(&[u32], &[u32])> =
                    pairs.iter().map(|(a, b)| (a.ids.as_slice(), b.ids.as_slice())).collect();
                let (w, l) = pair_last_token_hidden(&self.backbone, &ids, mode)?;
                Ok((head.forward(&w)?, head.forward(&l)?))
            }
            // An empty row scores at its padded position 0 (as the reference): only a padded batch has one.
            _ => {
                let winners: Vec<JointRow> = pairs.iter().map(|p| p.0.clone()).collect();
                let losers: Vec<JointRow> = pairs.iter().map(|p| p.1.clone()).collect();
                Ok((self.score_rows(&winners, mode)?, self.score_rows(&losers, mode)?))
            }
        }
    }

    /// What the head reads of each row, (n, width), without gradients, `batch` rows per forward
    /// pass. With a frozen backbone these never change, so a fit computes them once and trains
    /// the head on them ([`JointRewardModel::score_features`]).
    pub fn features(&self, rows: &[JointRow], batch: usize) -> Result<Tensor> {
        let parts = rows.chunks(batch.max(1)).map(|c| self.head_input(c, Mode::Infer)).collect::<Result<Vec<_>>>()?;
        match parts.is_empty() {
            true => bail!("no joint texts to compute features of"),
            false => Ok(Tensor::cat(&parts, 0)?),
        }
    }

    /// Scores (b,) of features from [`JointRewardModel::features`] (differentiable in the head).
    pub fn score_features(&self, features: &Tensor) -> Result<Tensor> {
        self.apply_head(features)
    }

    /// Scores of joint rows, without gradients, `batch` rows per forward pass.
    pub fn score(&self, rows: &[JointRow], batch: usize) -> Result<Vec<f64>> {
        let mut out = Vec::with_capacity(rows.len());
        for part in rows.chunks(batch.max(1)) {
            let s = self.score_rows(part, Mode::Infer)?.detach();
            out.extend(s.to_dtype(candle_core::DType::F64)?.to_vec1::<f64>()?);
        }
        Ok(out)
    }

    /// Save into `dir`, all or nothing (a previous reward model there is replaced in one atomic
    /// exchange once the new one is complete).
    pub fn save(&self, dir: &Path) -> Result<()> {
        // A backbone under LoRA adapters is saved merged into a whole one; a backbone stored for
        // reading only (`frozen_dtype`) was never trained: the saved one is its source as on
        // disk, which a reader stores the same way again.
        let stored = !self.backbone.varmap.data().lock().expect("VarMap lock").keys().any(|k| !k.starts_with(HEAD));
        crate::run::atomic::install_dir(dir, |tmp| {
            let backbone = tmp.join(BACKBONE_DIR);
            match (&self.backbone.lora, stored) {
                (Some(_), _) => self.backbone.merged()?.save_hf_dir(&backbone, None)?,
                (None, true) => LoadedModel::load_backbone(&self.backbone.source, &self.device)
                    .with_context(|| format!("reloading the backbone `{}` to save it", self.backbone.source))?
                    .save_hf_dir(&backbone, None)?,
                (None, false) => self.backbone.save_hf_dir(&backbone, None)?,
            }
            let (tensors, pooling, mlp_hidden) = match &self.head {
                Head::LastToken(h) => (h.tensors(), LAST_TOKEN, None),
                Head::PooledMlp(h) => (h.tensors(), POOLED, Some(h.hidden_dim().unwrap_or(0))),
            };
            let head: std::collections::HashMap<String, Tensor> = tensors.into_iter().collect();
            candle_core::safetensors::save(&head, tmp.join(HEAD_FILE))?;
            let info = RewardModelInfo {
                format: FORMAT.into(),
                version: 1,
                num_agents: self.num_agents,
                max_length: self.max_length,
                joint_text: JointTextFormat::reference(),
                add_special_tokens: true,
                pooling: pooling.into(),
                mlp_hidden,
                backbone_source: self.backbone.source.clone(),
            };
            crate::run::atomic_write(&tmp.join(INFO_FILE), &serde_json::to_vec_pretty(&info)?)
        })
        .with_context(|| format!("saving the reward model to {}", dir.display()))
    }
}

/// The pooled head's input width for `num_agents` agents on a backbone of width `hidden`.
fn pooled_width(num_agents: usize, hidden: usize) -> usize {
    num_agents * (hidden + 1)
}

/// The tokens whose bytes overlap `span` (a response's tokens are contiguous; a token that
/// straddles its edge counts as its own), empty for an empty response.
fn tokens_within(offsets: &[ByteRange], span: &Range<usize>) -> Range<usize> {
    let inside = |&(s, e): &(usize, usize)| e > s && s < span.end && e > span.start;
    match (offsets.iter().position(inside), offsets.iter().rposition(inside)) {
        (Some(first), Some(last)) => first..last + 1,
        _ => 0..0,
    }
}

/// The pooled head's input from final hidden states as (b·seq, hidden) rows: per row, each
/// agent's response tokens' states averaged (zeros for an empty response), then each agent's
/// log(1 + response tokens); (b, A·hidden + A). One matrix product, so gradients reach the
/// backbone when the states carry a graph.
fn pool_responses(hidden_rows: &Tensor, seq: usize, rows: &[JointRow], num_agents: usize) -> Result<Tensor> {
    let (b, width) = (rows.len(), hidden_rows.dim(1)?);
    let mut weights = vec![0f32; b * num_agents * b * seq];
    for (r, row) in rows.iter().enumerate() {
        for (a, span) in row.responses.iter().enumerate().take(num_agents) {
            for t in span.clone() {
                weights[(r * num_agents + a) * b * seq + r * seq + t] = 1.0 / span.len() as f32;
            }
        }
    }
    let (device, dtype) = (hidden_rows.device(), hidden_rows.dtype());
    let weights = Tensor::from_vec(weights, (b * num_agents, b * seq), device)?.to_dtype(dtype)?;
    let pooled = weights.matmul(hidden_rows)?.reshape((b, num_agents * width))?;
    let log_tokens: Vec<f32> = rows
        .iter()
        .flat_map(|r| (0..num_agents).map(|a| (1.0 + r.response_tokens.get(a).copied().unwrap_or(0) as f32).ln()))
        .collect();
    let log_tokens = Tensor::from_vec(log_tokens, (b, num_agents), device)?.to_dtype(dtype)?;
    Ok(Tensor::cat(&[pooled, log_tokens], 1)?)
}

#[cfg(test)]
pub(crate) mod tests;
