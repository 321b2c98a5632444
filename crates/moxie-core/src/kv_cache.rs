//! The KV cache: per layer, keys and values of every position so far, stored as f16 like
//! llama.cpp's default cache (the rounding is part of the numerics being matched).
//!
//! MLA layers (deepseek2) store only the compressed latent plus the rotary key part per token
//! (`kv_lora_rank + n_rot` values); their "values" are the first `kv_lora_rank` of those.

use half::f16;

use crate::{Error, Result};

/// Per-layer cache geometry.
#[derive(Clone, Copy, Debug)]
pub struct LayerKvShape {
    /// Values stored per position for keys (all kv heads together).
    pub k_width: usize,
    /// Values stored per position for values; 0 when values are a prefix of the keys (MLA).
    pub v_width: usize,
}

pub struct KvCache {
    n_ctx: usize,
    len: usize,
    shapes: Vec<LayerKvShape>,
    k: Vec<Vec<f16>>,
    v: Vec<Vec<f16>>,
}

impl KvCache {
    /// A cache for `n_ctx` positions. Memory is reserved as positions are written.
    pub fn new(shapes: Vec<LayerKvShape>, n_ctx: usize) -> KvCache {
        let n = shapes.len();
        KvCache {
            n_ctx,
            len: 0,
            shapes,
            k: vec![Vec::new(); n],
            v: vec![Vec::new(); n],
        }
    }

    /// Positions stored.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Forget everything from position `pos` on.
    pub fn truncate(&mut self, pos: usize) {
        if pos < self.len {
            self.len = pos;
            for (il, s) in self.shapes.iter().enumerate() {
                self.k[il].truncate(pos * s.k_width);
                self.v[il].truncate(pos * s.v_width);
            }
        }
    }

    /// Bytes the cache would take when full.
    pub fn bytes_when_full(&self) -> usize {
        self.shapes
            .iter()
            .map(|s| (s.k_width + s.v_width) * 2 * self.n_ctx)
            .sum()
    }

    /// Check that `n` more positions fit.
    pub fn check_room(&self, n: usize) -> Result<()> {
        if self.len + n > self.n_ctx {
            return Err(Error::ContextFull {
                n_ctx: self.n_ctx,
                needed: self.len + n,
            });
        }
        Ok(())
    }

    /// Append keys/values of `n` new positions for layer `il` (rounded to f16). Callers append
    /// the same number of positions to every layer, then call [`KvCache::commit`].
    pub fn append(&mut self, il: usize, k: &[f32], v: &[f32]) {
        self.k[il].extend(k.iter().map(|&x| f16::from_f32(x)));
        self.v[il].extend(v.iter().map(|&x| f16::from_f32(x)));
    }

    /// Mark `n` appended positions as stored.
    pub fn commit(&mut self, n: usize) {
        self.len += n;
    }

    pub fn keys(&self, il: usize) -> &[f16] {
        &self.k[il]
    }

    pub fn values(&self, il: usize) -> &[f16] {
        &self.v[il]
    }

    pub fn shape(&self, il: usize) -> LayerKvShape {
        self.shapes[il]
    }
}
