//! The log-probability of a target token, fused forward and backward.
use std::sync::Mutex;

use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor, D};

use super::exp::ExpSlice;
use super::{contiguous_slice, cpu_float};
use crate::pool;

// ---------------------------------------------------------------------------------------------
// Log-probability of a target token: log softmax(logits)[target]

/// lp[r] = logits[r, t_r] − logsumexp(logits[r]), one pass per row; its backward is
/// g[r]·(onehot(t_r) − softmax(logits[r])), also one pass, with each row's logsumexp kept from
/// the forward. No (n, vocab) temporaries besides the gradient itself.
#[derive(Default)]
struct TokenLogProb {
    /// Each row's logsumexp, as the forward computed it (f64 holds an f32 or an f64 exactly).
    logsumexp: Mutex<Option<Vec<f64>>>,
}

fn u32_slice<'a>(s: &'a CpuStorage, l: &Layout, what: &str) -> Result<&'a [u32]> {
    match s {
        CpuStorage::U32(v) => contiguous_slice(v, l, what),
        _ => candle_core::bail!("{what}: targets must be u32"),
    }
}

/// Accumulated in f64: a vocabulary-sized f32 sum drifts by ~1e-4, which shows in
/// sequence log-prob differences. The exponentials are taken a block at a time on the stack.
fn logsumexp<T: ExpSlice>(row: &[T]) -> T {
    const BLOCK: usize = 256;
    let max = row.iter().fold(T::neg_infinity(), |a, &b| a.max(b));
    let mut block = [T::zero(); BLOCK];
    let mut sum = 0f64;
    for part in row.chunks(BLOCK) {
        let e = &mut block[..part.len()];
        e.iter_mut().zip(part).for_each(|(e, &v)| *e = v - max);
        T::exp_in_place(e);
        // One running sum in the row's order, as a single sum over the row would make it.
        sum = e.iter().fold(sum, |s, v| s + v.to_f64().unwrap_or(0.0));
    }
    max + T::from(sum.ln()).unwrap()
}

impl CustomOp2 for TokenLogProb {
    fn name(&self) -> &'static str {
        "token-log-prob"
    }

    fn cpu_fwd(&self, x: &CpuStorage, lx: &Layout, t: &CpuStorage, lt: &Layout) -> Result<(CpuStorage, Shape)> {
        fn run<T: ExpSlice + Send + Sync>(x: &[T], t: &[u32], v: usize, kept: &Mutex<Option<Vec<f64>>>) -> Vec<T> {
            let lse = pool::map(t.len(), |r| logsumexp(&x[r * v..][..v]));
            let lp = (0..t.len()).map(|r| x[r * v + t[r] as usize] - lse[r]).collect();
            *kept.lock().unwrap_or_else(|e| e.into_inner()) =
                Some(lse.iter().map(|l| l.to_f64().unwrap_or(f64::NAN)).collect());
            lp
        }
        let (n, v) = lx.shape().dims2()?;
        let t = u32_slice(t, lt, "token-log-prob")?;
        if t.iter().any(|&i| i as usize >= v) {
            candle_core::bail!("token-log-prob: target id out of the vocabulary");
        }
        let out = dispatch!(x, |x| run(contiguous_slice(x, lx, "token-log-prob")?, t, v, &self.logsumexp));
        Ok((out, Shape::from(n)))
    }

    fn bwd(&self, x: &Tensor, t: &Tensor, _y: &Tensor, g: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let logsumexp = self.logsumexp.lock().unwrap_or_else(|e| e.into_inner()).clone();
        Ok((Some(x.apply_op3_no_bwd(t, &g.contiguous()?, &TokenLogProbGrad { logsumexp })?), None))
    }
}

struct TokenLogProbGrad {
    /// The forward's logsumexp of each row; recomputed when absent.
    logsumexp: Option<Vec<f64>>,
}

impl CustomOp3 for TokenLogProbGrad {
    fn name(&self) -> &'static str {
        "token-log-prob-grad"
    }

    fn cpu_fwd(
        &self,
        x: &CpuStorage,
        lx: &Layout,
        t: &CpuStorage,
        lt: &Layout,
        g: &CpuStorage,
        lg: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        fn run<T: ExpSlice + Send + Sync>(x: &[T], t: &[u32], g: &[T], v: usize, kept: Option<&[f64]>) -> Vec<T> {
            let mut dx = vec![T::zero(); x.len()];
            pool::for_each_chunk_mut(&mut dx, v, |r, dx| {
                let (row, t, g) = (&x[r * v..][..v], t[r] as usize, g[r]);
                let lse = match kept {
                    Some(kept) => T::from(kept[r]).unwrap_or(T::nan()),
                    None => logsumexp(row),
                };
                for i in 0..v {
                    dx[i] = row[i] - lse;
                }
                T::exp_in_place(dx);
                for d in dx.iter_mut() {
                    *d = -g * *d;
                }
                dx[t] = dx[t] + g;
            });
            dx
        }
        let n = "token-log-prob-grad";
        let (rows, v) = lx.shape().dims2()?;
        let t = u32_slice(t, lt, n)?;
        let kept = self.logsumexp.as_deref().filter(|k| k.len() == rows);
        let out = dispatch2!(n, (x, lx), (g, lg), |x, g| run(x, t, g, v, kept));
        Ok((out, lx.shape().clone()))
    }
}

/// log softmax(logits)[target] per row: logits (n, vocab), targets (n,) u32 → (n,).
pub fn token_log_probs(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    if cpu_float(logits) {
        return logits.contiguous()?.apply_op2(&targets.contiguous()?, TokenLogProb::default());
    }
    token_log_probs_composite(logits, targets)
}

/// Token log-probabilities from differentiable candle ops.
pub fn token_log_probs_composite(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let max = logits.max_keepdim(D::Minus1)?.detach();
    let lse = (logits.broadcast_sub(&max)?.exp()?.sum_keepdim(D::Minus1)?.log()? + &max)?;
    let picked = logits.gather(&targets.unsqueeze(1)?, D::Minus1)?;
    (picked - lse)?.squeeze(1)
}
