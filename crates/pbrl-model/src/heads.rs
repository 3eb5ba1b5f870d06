//! Scalar heads on a transformer's final hidden states (the joint reward model's score; critics'
//! values). A head's weights live in the backbone's `VarMap` under their own prefix, so
//! checkpoints and optimizers see them with the backbone's weights, while an exported backbone
//! (`LoadedModel::save_hf_dir`, which writes the language model's weights only) leaves them out.
use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::VarMap;
use rand::Rng;

use super::batch::{PaddedBatch, Padding, PairBatch};
use super::{LoadedModel, Mode};

/// `score = h · w + b`: PyTorch's `nn.Linear(hidden, 1)` on one hidden state per row.
#[derive(Debug, Clone)]
pub struct ScalarHead {
    weight: Tensor, // (1, hidden)
    bias: Tensor,   // (1,)
    pub prefix: String,
}

impl ScalarHead {
    pub fn weight_name(prefix: &str) -> String {
        format!("{prefix}.weight")
    }

    pub fn bias_name(prefix: &str) -> String {
        format!("{prefix}.bias")
    }

    /// A fresh head in `varmap` with PyTorch's default `nn.Linear` init (weight and bias
    /// U(−1/√hidden, 1/√hidden)), drawn from `rng`.
    pub fn init(varmap: &VarMap, prefix: &str, hidden: usize, rng: &mut impl Rng, dev: &Device) -> Result<Self> {
        let bound = 1.0 / (hidden as f64).sqrt();
        let mut draw = |n: usize| -> Vec<f32> { (0..n).map(|_| rng.random_range(-bound..bound) as f32).collect() };
        let weight = Tensor::from_vec(draw(hidden), (1, hidden), dev)?;
        let bias = Tensor::from_vec(draw(1), 1, dev)?;
        Self::insert(varmap, prefix, weight, bias)
    }

    /// A head from given weights ((1, hidden) and (1,)), inserted into `varmap` as `Var`s.
    pub fn insert(varmap: &VarMap, prefix: &str, weight: Tensor, bias: Tensor) -> Result<Self> {
        let [weight, bias] =
            insert_vars(varmap, [(Self::weight_name(prefix), weight), (Self::bias_name(prefix), bias)])?;
        Ok(Self { weight, bias, prefix: prefix.into() })
    }

    /// The head's weights as stored (for saving): name → tensor.
    pub fn tensors(&self) -> Vec<(String, Tensor)> {
        vec![(Self::weight_name(&self.prefix), self.weight.clone()), (Self::bias_name(&self.prefix), self.bias.clone())]
    }

    /// Read a head saved by [`ScalarHead::tensors`] from a safetensors file.
    pub fn load(varmap: &VarMap, prefix: &str, hidden: usize, file: &std::path::Path, dev: &Device) -> Result<Self> {
        let t = read_head_file(file, dev, 2)?;
        let get = |name: String, dims: &[usize]| checked(&t, file, name, dims);
        Self::insert(varmap, prefix, get(Self::weight_name(prefix), &[1, hidden])?, get(Self::bias_name(prefix), &[1])?)
    }

    /// Scores (b,) of hidden states (b, hidden).
    pub fn forward(&self, hidden: &Tensor) -> Result<Tensor> {
        let w = self.weight.to_dtype(hidden.dtype())?;
        let b = self.bias.to_dtype(hidden.dtype())?;
        Ok(hidden.matmul(&w.t()?)?.broadcast_add(&b)?.squeeze(1)?)
    }
}

/// A saved head's tensors, which must be exactly `count` (no weight is silently ignored).
fn read_head_file(
    file: &std::path::Path,
    dev: &Device,
    count: usize,
) -> Result<std::collections::HashMap<String, Tensor>> {
    let t = candle_core::safetensors::load(file, dev).with_context(|| format!("reading {}", file.display()))?;
    if t.len() != count {
        bail!("{}: {} tensors, the head has {count}", file.display(), t.len());
    }
    Ok(t)
}

/// Tensor `name` of a head file, which must have the shape `dims`.
fn checked(
    t: &std::collections::HashMap<String, Tensor>,
    file: &std::path::Path,
    name: String,
    dims: &[usize],
) -> Result<Tensor> {
    let x = t.get(&name).with_context(|| format!("{}: no tensor `{name}`", file.display()))?;
    if x.dims() != dims {
        bail!("{}: `{name}` has shape {:?}, the head needs {dims:?}", file.display(), x.dims());
    }
    Ok(x.clone())
}

/// Insert tensors into `varmap` as f32 `Var`s under new names (an existing name is an error,
/// never silently replaced); returns the tensors the `Var`s hold.
fn insert_vars<const N: usize>(varmap: &VarMap, named: [(String, Tensor); N]) -> Result<[Tensor; N]> {
    let mut data = varmap.data().lock().expect("VarMap lock");
    if let Some((name, _)) = named.iter().find(|(n, _)| data.contains_key(n)) {
        bail!("the model already has a weight `{name}`");
    }
    let mut out = Vec::with_capacity(N);
    for (name, t) in named {
        let var = Var::from_tensor(&t.to_dtype(DType::F32)?)?;
        out.push(var.as_tensor().clone());
        data.insert(name, var);
    }
    Ok(out.try_into().expect("N tensors"))
}

/// A critic's value head (CoMLRL's `ValueHead`): `[Linear(hidden, d) → Tanh]? → Linear(·, 1)` on
/// each position's final hidden state, every weight drawn from N(0, 0.02) and every bias 0.
/// Named as PyTorch names it: `{prefix}.pre_projection.0.*`, `{prefix}.value_projection.*`.
#[derive(Debug, Clone)]
pub struct ValueHead {
    pre_projection: Option<(Tensor, Tensor)>, // (d, hidden), (d,)
    value_projection: (Tensor, Tensor),       // (1, d or hidden), (1,)
    pub prefix: String,
}

impl ValueHead {
    /// A fresh head in `varmap` (`hidden_dim`: the optional hidden layer's width).
    pub fn init(
        varmap: &VarMap,
        prefix: &str,
        hidden: usize,
        hidden_dim: Option<usize>,
        rng: &mut impl Rng,
        dev: &Device,
    ) -> Result<Self> {
        let mut normal = |rows: usize, cols: usize| -> Result<Tensor> {
            Ok(Tensor::from_vec(
                (0..rows * cols).map(|_| 0.02 * standard_normal(rng)).collect::<Vec<f32>>(),
                (rows, cols),
                dev,
            )?)
        };
        let pre = match hidden_dim {
            Some(d) => Some((normal(d, hidden)?, Tensor::zeros(d, DType::F32, dev)?)),
            None => None,
        };
        let out = (normal(1, hidden_dim.unwrap_or(hidden))?, Tensor::zeros(1, DType::F32, dev)?);
        Self::insert(varmap, prefix, pre, out)
    }

    /// A head from given weights (the golden tests use the reference's).
    pub fn insert(
        varmap: &VarMap,
        prefix: &str,
        pre_projection: Option<(Tensor, Tensor)>,
        value_projection: (Tensor, Tensor),
    ) -> Result<Self> {
        let pre_projection = match pre_projection {
            Some((w, b)) => {
                let names = (format!("{prefix}.pre_projection.0.weight"), format!("{prefix}.pre_projection.0.bias"));
                let [w, b] = insert_vars(varmap, [(names.0, w), (names.1, b)])?;
                Some((w, b))
            }
            None => None,
        };
        let (w, b) = value_projection;
        let names = (format!("{prefix}.value_projection.weight"), format!("{prefix}.value_projection.bias"));
        let [w, b] = insert_vars(varmap, [(names.0, w), (names.1, b)])?;
        Ok(Self { pre_projection, value_projection: (w, b), prefix: prefix.into() })
    }

    /// The head's weights as PyTorch names them (for saving): name → tensor.
    pub fn tensors(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        if let Some((w, b)) = &self.pre_projection {
            out.push((format!("{}.pre_projection.0.weight", self.prefix), w.clone()));
            out.push((format!("{}.pre_projection.0.bias", self.prefix), b.clone()));
        }
        out.push((format!("{}.value_projection.weight", self.prefix), self.value_projection.0.clone()));
        out.push((format!("{}.value_projection.bias", self.prefix), self.value_projection.1.clone()));
        out
    }

    /// Read a head saved by [`ValueHead::tensors`] from a safetensors file: inputs of width
    /// `input`, the hidden layer `hidden_dim` wide (none: no hidden layer).
    pub fn load(
        varmap: &VarMap,
        prefix: &str,
        input: usize,
        hidden_dim: Option<usize>,
        file: &std::path::Path,
        dev: &Device,
    ) -> Result<Self> {
        let t = read_head_file(file, dev, 2 + 2 * usize::from(hidden_dim.is_some()))?;
        let get = |name: String, dims: &[usize]| checked(&t, file, name, dims);
        let pre = match hidden_dim {
            Some(d) => Some((
                get(format!("{prefix}.pre_projection.0.weight"), &[d, input])?,
                get(format!("{prefix}.pre_projection.0.bias"), &[d])?,
            )),
            None => None,
        };
        let width = hidden_dim.unwrap_or(input);
        let out = (
            get(format!("{prefix}.value_projection.weight"), &[1, width])?,
            get(format!("{prefix}.value_projection.bias"), &[1])?,
        );
        Self::insert(varmap, prefix, pre, out)
    }

    /// The hidden layer's width (none without one).
    pub fn hidden_dim(&self) -> Option<usize> {
        self.pre_projection.as_ref().map(|(w, _)| w.dims()[0])
    }

    /// Values (b,) of hidden states (b, hidden).
    pub fn forward(&self, hidden: &Tensor) -> Result<Tensor> {
        let linear = |x: &Tensor, (w, b): &(Tensor, Tensor)| -> Result<Tensor> {
            Ok(x.matmul(&w.to_dtype(x.dtype())?.t()?)?.broadcast_add(&b.to_dtype(x.dtype())?)?)
        };
        let mut x = hidden.clone();
        if let Some(pre) = &self.pre_projection {
            x = linear(&x, pre)?.tanh()?;
        }
        Ok(linear(&x, &self.value_projection)?.squeeze(1)?)
    }

    /// The value at each token row's last token (rows right-padded into one batch).
    pub fn values(&self, model: &LoadedModel, rows: &[Vec<u32>], mode: Mode) -> Result<Tensor> {
        self.forward(&last_token_hidden(model, rows, mode)?)
    }
}

/// One draw of N(0, 1) (Box–Muller).
fn standard_normal(rng: &mut impl Rng) -> f32 {
    let u1: f64 = 1.0 - rng.random::<f64>(); // in (0, 1]
    let u2: f64 = rng.random::<f64>();
    ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
}

/// The final hidden state (after the final norm) at each token row's last token, (b, hidden):
/// the rows right-padded into one batch and run through the backbone once.
pub fn last_token_hidden(model: &LoadedModel, rows: &[Vec<u32>], mode: Mode) -> Result<Tensor> {
    let device = model.model.device().clone();
    let batch = PaddedBatch::new(rows, model.tokenizer.pad_id, Padding::Right, &device)?;
    let seq = batch.ids.dim(1)?;
    let hidden = model.model.backbone.forward_rows(&batch.ids, &batch.positions, &batch.bias, None, mode)?;
    last_token_rows(&hidden, seq, &batch.lengths)
}

/// The final hidden states at the last tokens of each pair's two rows, ((b, hidden), (b, hidden)):
/// the pairs packed with their common prefix run once ([`PairBatch`]), through the backbone once.
/// The same states as [`last_token_hidden`] on each side (both rows must be non-empty).
pub fn pair_last_token_hidden(model: &LoadedModel, pairs: &[(&[u32], &[u32])], mode: Mode) -> Result<(Tensor, Tensor)> {
    let device = model.model.device().clone();
    let batch = PairBatch::new(pairs, model.tokenizer.pad_id, &device)?;
    let seq = batch.ids.dim(1)?;
    let hidden = model.model.backbone.forward_rows(&batch.ids, &batch.positions, &batch.bias, None, mode)?;
    let winners: Vec<usize> = batch.last.iter().map(|l| l.0).collect();
    let losers: Vec<usize> = batch.last.iter().map(|l| l.1).collect();
    Ok((rows_at(&hidden, seq, &winners)?, rows_at(&hidden, seq, &losers)?))
}

/// Each right-padded row's last real token from hidden states as (b·seq, hidden) rows: the
/// reference's "last position whose mask is 1" (for right padding: length − 1; an empty row
/// takes position 0, as the reference does).
pub fn last_token_rows(hidden_rows: &Tensor, seq: usize, lengths: &[usize]) -> Result<Tensor> {
    let columns: Vec<usize> = lengths.iter().map(|&n| n.saturating_sub(1)).collect();
    rows_at(hidden_rows, seq, &columns)
}

/// Row `b`'s hidden state at column `columns[b]`, from hidden states as (b·seq, hidden) rows.
fn rows_at(hidden_rows: &Tensor, seq: usize, columns: &[usize]) -> Result<Tensor> {
    let idx: Vec<u32> = columns.iter().enumerate().map(|(b, &c)| (b * seq + c) as u32).collect();
    let idx = Tensor::new(idx.as_slice(), hidden_rows.device())?;
    Ok(hidden_rows.index_select(&idx, 0)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn a_head_scores_rows_and_picks_the_last_real_token() {
        let dev = Device::Cpu;
        let vm = VarMap::new();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let head = ScalarHead::init(&vm, "reward_head", 4, &mut rng, &dev).unwrap();
        let w: Vec<f32> = head.weight.flatten_all().unwrap().to_vec1().unwrap();
        assert!(w.iter().all(|x| x.abs() <= 0.5), "U(-1/sqrt(4), 1/sqrt(4))");
        assert_eq!(vm.all_vars().len(), 2);
        assert!(ScalarHead::init(&vm, "reward_head", 4, &mut rng, &dev).is_err(), "no silent replacement");
        // 2 rows of length 3 and 1, seq 3: rows 2 and 3 of the (6, 4) hidden states.
        let h = Tensor::arange(0f32, 24.0, &dev).unwrap().reshape((6, 4)).unwrap();
        let last = last_token_rows(&h, 3, &[3, 1]).unwrap();
        assert_eq!(last.to_vec2::<f32>().unwrap(), vec![vec![8.0, 9.0, 10.0, 11.0], vec![12.0, 13.0, 14.0, 15.0]]);
        let s: Vec<f32> = head.forward(&last).unwrap().to_vec1().unwrap();
        let b: f32 = head.bias.to_vec1::<f32>().unwrap()[0];
        let by_hand = (0..4).map(|j| w[j] * (8 + j) as f32).sum::<f32>() + b;
        assert!((s[0] - by_hand).abs() < 1e-5);
    }
}
