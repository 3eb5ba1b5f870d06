//! The key/value cache of incremental decoding.
use candle_core::{Result, Tensor};

/// Per-layer key/value cache for incremental decoding.
///
/// With a capacity, each layer's keys and values live in buffers of (b, n_kv_heads, capacity,
/// head_dim) that new positions are written into in place, so a decoding step copies only its
/// own keys instead of the whole cache; without one (or past it), the cache grows by
/// concatenation.
#[derive(Debug, Clone, Default)]
pub struct KvCache {
    pub(super) layers: Vec<Option<LayerKv>>,
    pub(super) capacity: usize,
}

#[derive(Debug, Clone)]
pub(super) struct LayerKv {
    k: Tensor,
    v: Tensor,
    /// Valid positions at the start of the buffers.
    len: usize,
}

impl LayerKv {
    /// Append keys/values (b, n_kv, s, d); return views of every cached position.
    pub(super) fn append(
        slot: &mut Option<LayerKv>,
        k: Tensor,
        v: Tensor,
        capacity: usize,
    ) -> Result<(Tensor, Tensor)> {
        let s = k.dim(2)?;
        match slot {
            None if capacity > s => {
                let (b, n, _, d) = k.dims4()?;
                let kb = Tensor::zeros((b, n, capacity, d), k.dtype(), k.device())?;
                let vb = kb.zeros_like()?;
                kb.slice_set(&k.contiguous()?, 2, 0)?;
                vb.slice_set(&v.contiguous()?, 2, 0)?;
                *slot = Some(LayerKv { k: kb, v: vb, len: s });
            }
            None => *slot = Some(LayerKv { k, v, len: s }),
            Some(c) if c.len + s <= c.k.dim(2)? => {
                c.k.slice_set(&k.contiguous()?, 2, c.len)?;
                c.v.slice_set(&v.contiguous()?, 2, c.len)?;
                c.len += s;
            }
            Some(c) => {
                c.k = Tensor::cat(&[&c.k.narrow(2, 0, c.len)?, &k], 2)?;
                c.v = Tensor::cat(&[&c.v.narrow(2, 0, c.len)?, &v], 2)?;
                c.len += s;
            }
        }
        let c = slot.as_ref().expect("just filled");
        Ok((c.k.narrow(2, 0, c.len)?, c.v.narrow(2, 0, c.len)?))
    }
}

impl KvCache {
    pub fn new(num_layers: usize) -> Self {
        Self { layers: vec![None; num_layers], capacity: 0 }
    }

    /// Preallocate room for `capacity` positions per row at the first forward pass.
    pub fn with_capacity(num_layers: usize, capacity: usize) -> Self {
        Self { layers: vec![None; num_layers], capacity }
    }

    /// Number of cached positions.
    pub fn len(&self) -> usize {
        self.layers.first().and_then(|l| l.as_ref()).map_or(0, |c| c.len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keep (or repeat) the given batch rows: finished sequences leave the batch, and a shared
    /// prompt's rows are copied to each of its candidates.
    pub fn select_rows(&mut self, rows: &Tensor) -> Result<()> {
        for c in self.layers.iter_mut().flatten() {
            c.k = c.k.index_select(rows, 0)?;
            c.v = c.v.index_select(rows, 0)?;
        }
        Ok(())
    }
}
