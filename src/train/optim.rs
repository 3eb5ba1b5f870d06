//! AdamW with PyTorch's semantics and defaults (betas 0.9/0.999, eps 1e-8, weight decay 0.01),
//! as the reference uses for every agent.
//!
//! On the CPU the update is one fused in-place pass per parameter (read p, g, m, v; write p, m,
//! v), which is pure memory traffic; candle's op-by-op AdamW allocates a dozen temporaries per
//! parameter and took ~1.4 s per step on SmolLM2-135M. On other devices it falls back to
//! the same update written with tensor ops. The chunks' squared-gradient sums (the gradient
//! norm) add up in chunk order, so the norm is the same under any thread count.
use std::sync::Mutex;

use anyhow::{Context, Result};
use candle_core::backprop::GradStore;
use candle_core::{CpuStorage, Layout, Tensor, Var};

use pbrl_model::pool::{self, Chunks};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWConfig {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

impl AdamWConfig {
    /// torch.optim.AdamW's defaults with the given learning rate.
    pub fn torch_defaults(lr: f64) -> Self {
        Self { lr, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01 }
    }
}

pub use crate::config::LrSchedule;

/// First and second moments of one parameter.
enum Moments {
    /// Host vectors updated by the fused CPU kernel; empty until the parameter's first update,
    /// which writes them without reading (see [`FusedAdamW`]).
    Host(Mutex<(Vec<f32>, Vec<f32>)>),
    /// Device tensors for the op-based fallback, replaced each step.
    Device(Mutex<(Tensor, Tensor)>),
}

struct Slot {
    name: String,
    var: Var,
    moments: Moments,
}

pub struct AdamW {
    pub config: AdamWConfig,
    slots: Vec<Slot>,
    /// Number of steps taken (the bias-correction exponent).
    pub step: u64,
}

impl AdamW {
    /// Named parameters, in a fixed order (sorted by name) so saved state lines up on resume.
    pub fn new(mut params: Vec<(String, Var)>, config: AdamWConfig) -> Result<Self> {
        params.sort_by(|a, b| a.0.cmp(&b.0));
        let slots = params
            .into_iter()
            .map(|(name, var)| {
                let host = var.device().is_cpu() && var.dtype() == candle_core::DType::F32;
                let moments = if host {
                    Moments::Host(Mutex::new((Vec::new(), Vec::new())))
                } else {
                    let z = var.as_tensor().zeros_like()?;
                    Moments::Device(Mutex::new((z.clone(), z)))
                };
                Ok(Slot { name, var, moments })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { config, slots, step: 0 })
    }

    /// One update of every parameter that has a gradient in `grads`; returns the gradients'
    /// global L2 norm (read in the same pass on the CPU; summed on the device and read once
    /// otherwise, so a GPU step does not wait on the host once per parameter).
    pub fn step(&mut self, grads: &GradStore) -> Result<f64> {
        self.step += 1;
        let mut sq = 0.0;
        let mut device_sq: Option<Tensor> = None;
        let c = self.config;
        let bc1 = 1.0 - c.beta1.powi(self.step as i32);
        let bc2 = 1.0 - c.beta2.powi(self.step as i32);
        for slot in &self.slots {
            let Some(g) = grads.get(slot.var.as_tensor()) else {
                continue;
            };
            match &slot.moments {
                Moments::Host(mv) => {
                    let op = FusedAdamW { c, bc1, bc2, moments: mv, grad_sq: Mutex::new(0.0) };
                    slot.var
                        .as_tensor()
                        .inplace_op2(&g.contiguous()?, &op)
                        .with_context(|| format!("AdamW on {}", slot.name))?;
                    sq += *op.grad_sq.lock().expect("grad_sq lock");
                }
                Moments::Device(mv) => {
                    // A weight's gradient still references the forward graph it came from
                    // (candle's backward does not detach them): moments built from it without
                    // a detach would keep every step's activations alive through the chain of
                    // moments, gigabytes per update on a GPU.
                    let g = &g.detach();
                    let g2 = g.sqr()?;
                    let slot_sq = g2.sum_all()?.to_dtype(candle_core::DType::F64)?;
                    device_sq = Some(match device_sq {
                        Some(total) => (total + slot_sq)?,
                        None => slot_sq,
                    });
                    let mut mv = mv.lock().expect("moments lock");
                    let p = slot.var.as_tensor();
                    let m = ((&mv.0 * c.beta1)? + (g * (1.0 - c.beta1))?)?;
                    let v = ((&mv.1 * c.beta2)? + (g2 * (1.0 - c.beta2))?)?;
                    let update = ((&m / bc1)? / ((&v / bc2)?.sqrt()? + c.eps)?)?;
                    let decayed = (p * (1.0 - c.lr * c.weight_decay))?;
                    slot.var.set(&(decayed - (update * c.lr)?)?)?;
                    *mv = (m, v);
                }
            }
        }
        if let Some(total) = device_sq {
            sq += total.to_scalar::<f64>()?;
        }
        Ok(sq.sqrt())
    }

    /// Restore the step count and the moments saved by [`AdamW::moments`] (matched by name).
    pub fn restore(&mut self, step: u64, moments: &std::collections::HashMap<String, (Tensor, Tensor)>) -> Result<()> {
        for slot in &self.slots {
            let (m, v) =
                moments.get(&slot.name).with_context(|| format!("checkpoint has no AdamW state for {}", slot.name))?;
            match &slot.moments {
                Moments::Host(mv) => {
                    let mut g = mv.lock().expect("moments lock");
                    g.0 = m.flatten_all()?.to_vec1()?;
                    g.1 = v.flatten_all()?.to_vec1()?;
                }
                Moments::Device(mv) => {
                    let dev = slot.var.device();
                    *mv.lock().expect("moments lock") = (m.to_device(dev)?, v.to_device(dev)?);
                }
            }
        }
        self.step = step;
        Ok(())
    }

    /// (name, first moment, second moment) of every parameter, for checkpoints.
    pub fn moments(&self) -> Result<Vec<(String, Tensor, Tensor)>> {
        self.slots
            .iter()
            .map(|s| {
                let shape = s.var.shape().clone();
                Ok(match &s.moments {
                    Moments::Host(mv) => {
                        let g = mv.lock().expect("moments lock");
                        let dev = candle_core::Device::Cpu;
                        let host = |x: &Vec<f32>| match x.is_empty() {
                            true => Tensor::zeros(&shape, candle_core::DType::F32, &dev), // not yet updated
                            false => Tensor::from_slice(x, &shape, &dev),
                        };
                        (s.name.clone(), host(&g.0)?, host(&g.1)?)
                    }
                    Moments::Device(mv) => {
                        let g = mv.lock().expect("moments lock");
                        (s.name.clone(), g.0.copy()?, g.1.copy()?)
                    }
                })
            })
            .collect()
    }
}

/// p ← p·(1 − lr·wd) − lr·m̂/(√v̂ + eps), with m, v updated in the same pass.
struct FusedAdamW<'a> {
    c: AdamWConfig,
    bc1: f64,
    bc2: f64,
    moments: &'a Mutex<(Vec<f32>, Vec<f32>)>,
    /// Σ g², accumulated while the gradient is read anyway.
    grad_sq: Mutex<f64>,
}

/// What a checkpoint saves of the optimizer and puts back (`run::checkpoint`).
impl crate::run::checkpoint::OptimizerState for AdamW {
    fn moments(&self) -> Result<Vec<(String, Tensor, Tensor)>> {
        AdamW::moments(self)
    }
    fn restore(&mut self, step: u64, moments: &std::collections::HashMap<String, (Tensor, Tensor)>) -> Result<()> {
        AdamW::restore(self, step, moments)
    }
}

impl candle_core::InplaceOp2 for FusedAdamW<'_> {
    fn name(&self) -> &'static str {
        "fused-adamw"
    }

    fn cpu_fwd(&self, s1: &mut CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> candle_core::Result<()> {
        let (CpuStorage::F32(p), CpuStorage::F32(g)) = (s1, s2) else {
            candle_core::bail!("fused-adamw expects f32 parameters and gradients")
        };
        let (Some((p0, p1)), Some((g0, g1))) = (l1.contiguous_offsets(), l2.contiguous_offsets()) else {
            candle_core::bail!("fused-adamw expects contiguous tensors")
        };
        let p = &mut p[p0..p1];
        let g = &g[g0..g1];
        let mut mv = self.moments.lock().expect("moments lock");
        let (m, v) = &mut *mv;
        let c = self.c;
        let (b1, b2) = (c.beta1 as f32, c.beta2 as f32);
        let decay = (1.0 - c.lr * c.weight_decay) as f32;
        let step = (c.lr / self.bc1) as f32; // lr · m̂ = step · m
        let inv_bc2_sqrt = (1.0 / self.bc2.sqrt()) as f32; // √v̂ = √v / √bc2
        let eps = c.eps as f32;
        // One element: p, m, v from their old values (0 for the moments at the first update).
        let update = |p: f32, gi: f32, m: f32, v: f32| {
            let mi = b1 * m + (1.0 - b1) * gi;
            let vi = b2 * v + (1.0 - b2) * gi * gi;
            (p * decay - step * mi / (vi.sqrt() * inv_bc2_sqrt + eps), mi, vi)
        };
        let sq2 = |g: &[f32]| g.iter().map(|&x| (x as f64) * (x as f64)).sum::<f64>();
        const CHUNK: usize = 1 << 14;
        let sq: f64 = if m.is_empty() {
            // The first update writes the moments without reading them. Zeroed vectors would be
            // fresh pages mapped to the kernel's zero page, so reading then writing them faults
            // twice per page and flushes the other cores' TLBs: about half of train-madpo's
            // first update on SmolLM2-135M.
            let n = p.len();
            m.reserve_exact(n);
            v.reserve_exact(n);
            let sq = {
                let ps = Chunks::new(p, CHUNK);
                let ms = Chunks::new(&mut m.spare_capacity_mut()[..n], CHUNK);
                let vs = Chunks::new(&mut v.spare_capacity_mut()[..n], CHUNK);
                pool::map(ps.count(), |c| {
                    let (p, m, v) = (ps.get(c), ms.get(c), vs.get(c));
                    let g = &g[c * CHUNK..][..p.len()];
                    for i in 0..p.len() {
                        let (pi, mi, vi) = update(p[i], g[i], 0.0, 0.0);
                        (p[i], m[i], v[i]) = (pi, std::mem::MaybeUninit::new(mi), std::mem::MaybeUninit::new(vi));
                    }
                    sq2(g)
                })
                .into_iter()
                .sum()
            };
            // SAFETY: every one of the n elements was written just above.
            unsafe {
                m.set_len(n);
                v.set_len(n);
            }
            sq
        } else {
            let (ps, ms, vs) = (Chunks::new(p, CHUNK), Chunks::new(m, CHUNK), Chunks::new(v, CHUNK));
            pool::map(ps.count(), |c| {
                let (p, m, v) = (ps.get(c), ms.get(c), vs.get(c));
                let g = &g[c * CHUNK..][..p.len()];
                for i in 0..p.len() {
                    (p[i], m[i], v[i]) = update(p[i], g[i], m[i], v[i]);
                }
                sq2(g)
            })
            .into_iter()
            .sum()
        };
        *self.grad_sq.lock().expect("grad_sq lock") += sq;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};

    /// The fused CPU kernel equals the tensor-op formula of torch.optim.AdamW, step after step.
    #[test]
    fn a_linear_schedule_falls_from_the_full_rate_to_one_update_worth() {
        let f: Vec<f64> = (0..4).map(|u| LrSchedule::Linear.factor(u, 4)).collect();
        assert_eq!(f, vec![1.0, 0.75, 0.5, 0.25]);
        assert_eq!(LrSchedule::Constant.factor(3, 4), 1.0);
        assert_eq!(LrSchedule::Linear.factor(9, 4), 0.0, "never negative");
    }

    #[test]
    fn fused_update_matches_reference_formula() {
        let dev = Device::Cpu;
        let p0: Vec<f32> = (0..1000).map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0).collect();
        let var = Var::from_tensor(&Tensor::from_vec(p0.clone(), 1000, &dev).unwrap()).unwrap();
        let cfg = AdamWConfig::torch_defaults(1e-2);
        let mut opt = AdamW::new(vec![("w".into(), var.clone())], cfg).unwrap();
        let (mut p, mut m, mut v) =
            (p0.iter().map(|&x| x as f64).collect::<Vec<_>>(), vec![0f64; 1000], vec![0f64; 1000]);
        for t in 1..=5 {
            let loss = (var.as_tensor().sqr().unwrap() * (t as f64)).unwrap().sum_all().unwrap();
            let grads = loss.backward().unwrap();
            let g: Vec<f32> = grads.get(var.as_tensor()).unwrap().to_vec1().unwrap();
            let norm = opt.step(&grads).unwrap();
            let want_norm = g.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
            assert!((norm - want_norm).abs() < 1e-9 * want_norm.max(1.0), "grad norm {norm} vs {want_norm}");
            for i in 0..1000 {
                let gi = g[i] as f64;
                p[i] *= 1.0 - 1e-2 * 0.01;
                m[i] = 0.9 * m[i] + 0.1 * gi;
                v[i] = 0.999 * v[i] + 0.001 * gi * gi;
                let mh = m[i] / (1.0 - 0.9f64.powi(t));
                let vh = v[i] / (1.0 - 0.999f64.powi(t));
                p[i] -= 1e-2 * mh / (vh.sqrt() + 1e-8);
            }
            let got: Vec<f32> = var.as_tensor().to_vec1().unwrap();
            for i in 0..1000 {
                assert!((got[i] as f64 - p[i]).abs() < 1e-5, "step {t} elem {i}: {} vs {}", got[i], p[i]);
            }
        }
        assert_eq!(opt.step, 5);
    }

    /// Host moments start empty (the first update writes them): a checkpoint taken before any
    /// update still holds zero moments of the parameter's shape, and restoring it gives the
    /// same update as a fresh optimizer.
    #[test]
    fn moments_before_the_first_update_are_zeros_of_the_shape() {
        let dev = Device::Cpu;
        let init = Tensor::new(&[[0.5f32, -1.0, 2.0], [0.25, 3.0, -0.5]], &dev).unwrap();
        let (a, b) = (Var::from_tensor(&init).unwrap(), Var::from_tensor(&init.copy().unwrap()).unwrap());
        let cfg = AdamWConfig::torch_defaults(1e-2);
        let mut fresh = AdamW::new(vec![("w".into(), a.clone())], cfg).unwrap();
        let mut restored = AdamW::new(vec![("w".into(), b.clone())], cfg).unwrap();
        let saved = fresh.moments().unwrap();
        let (name, m, v) = &saved[0];
        assert_eq!((name.as_str(), m.dims(), v.dims()), ("w", &[2usize, 3][..], &[2usize, 3][..]));
        assert_eq!(m.sqr().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap(), 0.0);
        assert_eq!(v.sqr().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap(), 0.0);
        let map = saved.into_iter().map(|(n, m, v)| (n, (m, v))).collect();
        restored.restore(0, &map).unwrap();
        for (opt, var) in [(&mut fresh, &a), (&mut restored, &b)] {
            for _ in 0..2 {
                let grads = var.as_tensor().sqr().unwrap().sum_all().unwrap().backward().unwrap();
                opt.step(&grads).unwrap();
            }
        }
        let (pa, pb): (Vec<Vec<f32>>, Vec<Vec<f32>>) =
            (a.as_tensor().to_vec2().unwrap(), b.as_tensor().to_vec2().unwrap());
        assert_eq!(pa, pb, "restored zero moments must update exactly as fresh ones");
        assert_ne!(pa, init.to_vec2::<f32>().unwrap(), "the premise: the weights moved");
    }

    /// The tensor-op path (GPU weights, or f64 ones) keeps plain moments: a gradient still tied
    /// to its forward graph must not chain every step's activations into them.
    #[test]
    fn moments_hold_no_autograd_graph() {
        let dev = Device::Cpu;
        let var = Var::from_tensor(&Tensor::new(&[0.5f64, -1.0, 2.0], &dev).unwrap()).unwrap();
        let mut opt = AdamW::new(vec![("w".into(), var.clone())], AdamWConfig::torch_defaults(1e-2)).unwrap();
        for _ in 0..2 {
            let hidden = (var.as_tensor() * 3.0).unwrap().exp().unwrap(); // an activation on the graph
            let grads = (hidden * var.as_tensor()).unwrap().sum_all().unwrap().backward().unwrap();
            let g = grads.get(var.as_tensor()).unwrap();
            assert!(g.track_op(), "the premise: gradients carry the graph");
            let want_norm = g.to_vec1::<f64>().unwrap().iter().map(|x| x * x).sum::<f64>().sqrt();
            let norm = opt.step(&grads).unwrap();
            assert!((norm - want_norm).abs() < 1e-12 * want_norm, "grad norm {norm} vs {want_norm}");
        }
        for (_, m, v) in opt.moments().unwrap() {
            assert!(!m.track_op() && !v.track_op(), "moments reference the autograd graph");
        }
        let Moments::Device(mv) = &opt.slots[0].moments else { panic!("f64 weights use the tensor-op path") };
        let mv = mv.lock().unwrap();
        assert!(!mv.0.track_op() && !mv.1.track_op(), "moments reference the autograd graph");
    }
}
