//! The KV cache: per layer, keys and values of every position so far, stored as f16 like
//! llama.cpp's default cache (the rounding is part of the numerics being matched), or as f32
//! or q8_0 when asked (`-ctk` / `-ctv`, llama.cpp's `--cache-type-k` / `--cache-type-v`).
//!
//! MLA layers (deepseek2) store only the compressed latent plus the rotary key part per token
//! (`kv_lora_rank + n_rot` values); their "values" are the first `kv_lora_rank` of those, so
//! they take the key type and have no value cache (as in llama.cpp).

use moxie_quant::{DequantizeFn, GgmlType, QuantizeFn};

use crate::device::Reservation;
use crate::{Error, Result};

/// Per-layer cache geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerKvShape {
    /// Values stored per position for keys (all kv heads together).
    pub k_width: usize,
    /// Values stored per position for values; 0 when values are a prefix of the keys (MLA).
    pub v_width: usize,
    /// Width of one head's key and value: a quantized cache needs whole blocks per head.
    pub head_k: usize,
    pub head_v: usize,
}

impl LayerKvShape {
    /// Check that each head is a whole number of blocks of its cache type (`il` names the
    /// layer in the error).
    pub fn check_types(&self, il: usize, types: KvTypes) -> Result<()> {
        for (what, ty, head, width) in [
            ("key", types.k, self.head_k, self.k_width),
            ("value", types.v, self.head_v, self.v_width),
        ] {
            if width == 0 {
                continue;
            }
            if !KV_TYPES.contains(&ty) {
                return Err(Error::Model(format!("{ty} is not a KV cache type")));
            }
            let bs = ty.block_size();
            if head == 0 || !head.is_multiple_of(bs) || !width.is_multiple_of(head) {
                return Err(Error::Model(format!(
                    "layer {il}: a {what} head of {head} values is not a whole number of \
                     {} blocks ({bs} values); use another cache type",
                    kv_type_name(ty)
                )));
            }
        }
        Ok(())
    }

    /// Bytes one position takes in this layer's cache (keys and values) stored as `types`;
    /// the widths must be whole blocks ([`check_types`](Self::check_types)).
    pub fn bytes_per_position(&self, types: KvTypes) -> u64 {
        let row = |ty: GgmlType, width: usize| ty.row_bytes(width as u64).unwrap_or(0);
        row(types.k, self.k_width) + row(types.v, self.v_width)
    }
}

/// The element types of a cache's keys and values (`-ctk` / `-ctv`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvTypes {
    pub k: GgmlType,
    pub v: GgmlType,
}

impl Default for KvTypes {
    /// llama.cpp's default: f16 keys and values.
    fn default() -> Self {
        KvTypes {
            k: GgmlType::F16,
            v: GgmlType::F16,
        }
    }
}

/// The element types a cache can hold (llama.cpp's names: `f32`, `f16`, `q8_0`).
pub const KV_TYPES: [GgmlType; 3] = [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0];

/// A cache type as llama.cpp spells it (`f16`, `q8_0`).
pub fn kv_type_name(ty: GgmlType) -> String {
    ty.name().to_ascii_lowercase()
}

/// A `-ctk` / `-ctv` value as a cache type; the error names the supported ones.
pub fn parse_kv_type(name: &str) -> Result<GgmlType> {
    GgmlType::from_name(name)
        .filter(|t| KV_TYPES.contains(t))
        .ok_or_else(|| {
            let names: Vec<String> = KV_TYPES.iter().map(|&t| kv_type_name(t)).collect();
            Error::Model(format!(
                "unsupported KV cache type '{name}' (supported: {})",
                names.join(", ")
            ))
        })
}

/// One layer's keys or values: `width` elements per position of type `ty`.
struct Store {
    ty: GgmlType,
    width: usize,
    row_bytes: usize,
    data: Vec<u8>,
    // The type's conversions, looked up once (attention converts rows on every token).
    quantize: QuantizeFn,
    dequantize: DequantizeFn,
}

impl Store {
    /// `ty` is one of [`KV_TYPES`].
    fn new(ty: GgmlType, width: usize) -> Store {
        let row_bytes = ty.row_bytes(width as u64).unwrap_or(0) as usize;
        Store {
            ty,
            width,
            row_bytes,
            data: Vec::new(),
            quantize: moxie_quant::quantize_fn(ty).expect("cache types can be quantized"),
            dequantize: moxie_quant::dequantize_fn(ty).expect("cache types can be dequantized"),
        }
    }

    fn append(&mut self, x: &[f32]) {
        if self.width == 0 {
            return;
        }
        let quantize = self.quantize;
        let n = x.len() / self.width;
        let at = self.data.len();
        self.data.resize(at + n * self.row_bytes, 0);
        for (src, dst) in x
            .chunks_exact(self.width)
            .zip(self.data[at..].chunks_exact_mut(self.row_bytes))
        {
            quantize(src, dst);
        }
    }
}

pub struct KvCache {
    n_ctx: usize,
    len: usize,
    shapes: Vec<LayerKvShape>,
    k: Vec<Store>,
    v: Vec<Store>,
    /// Accelerator memory held for layers cached there.
    held: Vec<Reservation>,
    /// Layers whose attention runs on a GPU keep their rows in its memory instead.
    gpu: Vec<Option<GpuKv>>,
}

/// One layer's cache in a GPU's memory: `n_ctx` rows of keys and of values (none for MLA),
/// f16 or f32, written and read by the GPU's kernels.
pub struct GpuKv {
    pub k: moxie_gpu::Buffer,
    pub v: moxie_gpu::Buffer,
    pub f16: bool,
}

/// Cached rows of one layer: `width` elements of type `ty`, `row_bytes`, per position.
#[derive(Clone, Copy)]
pub struct CacheRows<'a> {
    pub ty: GgmlType,
    pub width: usize,
    pub row_bytes: usize,
    pub data: &'a [u8],
    dequantize: DequantizeFn,
}

impl CacheRows<'_> {
    /// Bytes of `n` elements starting `first` elements into position `pos`'s row (`first`
    /// and `n` are whole blocks: the cache checked head widths when it was made).
    pub fn span(&self, pos: usize, first: usize, n: usize) -> &[u8] {
        let bs = self.ty.block_size();
        let block_bytes = self.ty.type_size();
        let at = pos * self.row_bytes + first / bs * block_bytes;
        &self.data[at..at + n / bs * block_bytes]
    }

    /// Positions `pos..pos + n_pos`, `width` elements of each from element `first`, as f32
    /// rows of `width` in `out`: one conversion call when those are whole rows (contiguous).
    pub fn block_to_f32(
        &self,
        pos: usize,
        n_pos: usize,
        first: usize,
        width: usize,
        out: &mut [f32],
    ) {
        if first == 0 && width == self.width {
            let bytes = &self.data[pos * self.row_bytes..(pos + n_pos) * self.row_bytes];
            (self.dequantize)(bytes, &mut out[..n_pos * width]);
            return;
        }
        for (i, row) in out.chunks_exact_mut(width).take(n_pos).enumerate() {
            (self.dequantize)(self.span(pos + i, first, width), row);
        }
    }

    /// `n` elements of position `pos` from element `first`, as f32.
    pub fn to_f32(&self, pos: usize, first: usize, out: &mut [f32]) {
        (self.dequantize)(self.span(pos, first, out.len()), out);
    }
}

impl KvCache {
    /// An f16 cache for `n_ctx` positions. Memory is reserved as positions are written.
    pub fn new(shapes: Vec<LayerKvShape>, n_ctx: usize) -> KvCache {
        Self::typed(shapes, n_ctx, KvTypes::default()).expect("f16 holds any head width")
    }

    /// A cache holding keys and values as `types` (each one of [`KV_TYPES`]). Fails if a
    /// head's width is not a whole number of the type's blocks.
    pub fn typed(shapes: Vec<LayerKvShape>, n_ctx: usize, types: KvTypes) -> Result<KvCache> {
        let (k_ty, v_ty) = (types.k, types.v);
        for (il, s) in shapes.iter().enumerate() {
            s.check_types(il, types)?;
        }
        let k = shapes.iter().map(|s| Store::new(k_ty, s.k_width)).collect();
        let v = shapes.iter().map(|s| Store::new(v_ty, s.v_width)).collect();
        Ok(KvCache {
            n_ctx,
            len: 0,
            gpu: shapes.iter().map(|_| None).collect(),
            shapes,
            k,
            v,
            held: Vec::new(),
        })
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
            for s in self.k.iter_mut().chain(self.v.iter_mut()) {
                s.data.truncate(pos * s.row_bytes);
            }
        }
    }

    /// Bytes of one position over all layers.
    pub fn bytes_per_position(&self) -> usize {
        self.k.iter().chain(&self.v).map(|s| s.row_bytes).sum()
    }

    /// Bytes the cache would take when full.
    pub fn bytes_when_full(&self) -> usize {
        self.bytes_per_position() * self.n_ctx
    }

    /// Bytes layer `il`'s part takes when full.
    pub fn layer_bytes_when_full(&self, il: usize) -> usize {
        (self.k[il].row_bytes + self.v[il].row_bytes) * self.n_ctx
    }

    /// Keep `r` (device memory for a layer's part) as long as the cache lives.
    pub fn hold(&mut self, r: Reservation) {
        self.held.push(r);
    }

    /// Keep layer `il`'s rows in GPU memory (its host store stays empty).
    pub fn set_gpu(&mut self, il: usize, kv: GpuKv) {
        self.gpu[il] = Some(kv);
    }

    /// Layer `il`'s rows in GPU memory, if they live there.
    pub fn gpu(&self, il: usize) -> Option<&GpuKv> {
        self.gpu[il].as_ref()
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

    /// Append keys/values of `n` new positions for layer `il` (converted to the cache types).
    /// Callers append the same number of positions to every layer, then call
    /// [`KvCache::commit`].
    pub fn append(&mut self, il: usize, k: &[f32], v: &[f32]) {
        self.k[il].append(k);
        self.v[il].append(v);
    }

    /// Mark `n` appended positions as stored.
    pub fn commit(&mut self, n: usize) {
        self.len += n;
    }

    pub fn keys(&self, il: usize) -> CacheRows<'_> {
        rows(&self.k[il])
    }

    pub fn values(&self, il: usize) -> CacheRows<'_> {
        rows(&self.v[il])
    }

    pub fn shape(&self, il: usize) -> LayerKvShape {
        self.shapes[il]
    }
}

fn rows(s: &Store) -> CacheRows<'_> {
    CacheRows {
        ty: s.ty,
        width: s.width,
        row_bytes: s.row_bytes,
        data: &s.data,
        dequantize: s.dequantize,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn types(k: GgmlType, v: GgmlType) -> KvTypes {
        KvTypes { k, v }
    }

    fn shape(head: usize) -> LayerKvShape {
        LayerKvShape {
            k_width: 2 * head,
            v_width: 2 * head,
            head_k: head,
            head_v: head,
        }
    }

    #[test]
    fn q8_0_rows_round_trip_and_truncate() {
        let mut c =
            KvCache::typed(vec![shape(64)], 8, types(GgmlType::Q8_0, GgmlType::F32)).unwrap();
        let k: Vec<f32> = (0..3 * 128).map(|i| (i as f32 * 0.37).sin()).collect();
        c.append(0, &k, &k);
        c.commit(3);
        assert_eq!(c.bytes_per_position(), 4 * 34 + 128 * 4);
        let mut row = vec![0f32; 64];
        c.keys(0).to_f32(2, 64, &mut row);
        for (a, b) in row.iter().zip(&k[2 * 128 + 64..3 * 128]) {
            assert!((a - b).abs() <= 1.0 / 127.0, "{a} vs {b}");
        }
        c.values(0).to_f32(1, 0, &mut row);
        assert_eq!(row, k[128..192]);
        c.truncate(1);
        assert_eq!(c.keys(0).data.len(), 4 * 34);
    }

    #[test]
    fn cache_types_are_checked() {
        assert!(KvCache::typed(vec![shape(40)], 8, types(GgmlType::Q8_0, GgmlType::F16)).is_err());
        assert!(KvCache::typed(vec![shape(40)], 8, KvTypes::default()).is_ok());
        assert_eq!(parse_kv_type("q8_0").unwrap(), GgmlType::Q8_0);
        let e = parse_kv_type("q4_0").unwrap_err().to_string();
        assert!(e.contains("q4_0") && e.contains("f32, f16, q8_0"), "{e}");
    }
}
