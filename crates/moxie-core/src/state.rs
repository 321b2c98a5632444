//! What a sequence keeps between forward passes ([`SeqState`]): for every layer, the state its
//! blocks declared ([`LayerStateSpec`]):
//!
//! - attention rows per position: GQA keys and values, or MLA's latent (keys only; its values
//!   are the first `kv_lora_rank` of each key row), stored as f16 like llama.cpp's default cache
//!   (the rounding is part of the numerics being matched), or f32 / q8_0 when asked (`-ctk` /
//!   `-ctv`, llama.cpp's `--cache-type-k` / `--cache-type-v`);
//! - DSA indexer keys per position (the key type, as llama.cpp's indexer cache);
//! - recurrent state of a fixed size (gated DeltaNet: the convolution window and the SSM
//!   matrices, f32), which is overwritten by every token instead of growing.
//!
//! Rows are truncated by position. Recurrent state cannot be: [`SeqState::checkpoint`] keeps a
//! copy of it at the current length, and [`SeqState::truncate`] returns to the latest
//! checkpoint at or before the asked position (or to the start), telling the caller how many
//! tokens are still held so it can evaluate the rest again. Prefix reuse (server slots) and
//! speculative decoding's rollback stay correct for recurrent layers that way.
//!
//! A layer whose blocks run on a GPU keeps its state in that GPU's memory.

use moxie_gpu::Buffer;
use moxie_quant::{DequantizeFn, GgmlType, QuantizeFn};

use crate::device::Reservation;
use crate::{Error, Result};

/// Rows a block stores per position: `width` values, in heads of `head` values (a quantized
/// cache needs whole blocks per head).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowSpec {
    pub width: usize,
    pub head: usize,
}

/// Fixed-size recurrent state (f32 values).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecurrentSpec {
    /// The convolution's window of past inputs.
    pub conv: usize,
    /// The SSM / DeltaNet state matrices.
    pub ssm: usize,
}

impl RecurrentSpec {
    pub fn bytes(&self) -> u64 {
        4 * (self.conv + self.ssm) as u64
    }
}

/// What one layer keeps between forward passes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LayerStateSpec {
    /// Attention keys (GQA), or MLA's latent plus rotary key: the key type.
    pub keys: Option<RowSpec>,
    /// Attention values (GQA): the value type. MLA reads its values from the keys.
    pub values: Option<RowSpec>,
    /// DSA indexer keys: the key type.
    pub indexer_keys: Option<RowSpec>,
    /// Recurrent state (gated DeltaNet).
    pub recurrent: Option<RecurrentSpec>,
}

impl LayerStateSpec {
    /// The row parts with the cache type each is stored as.
    fn rows(&self, types: KvTypes) -> [(&'static str, Option<RowSpec>, GgmlType); 3] {
        [
            ("key", self.keys, types.k),
            ("value", self.values, types.v),
            ("indexer key", self.indexer_keys, types.k),
        ]
    }

    /// Check that each head is a whole number of blocks of its cache type (`il` names the
    /// layer in the error).
    pub fn check_types(&self, il: usize, types: KvTypes) -> Result<()> {
        for (what, spec, ty) in self.rows(types) {
            let Some(RowSpec { width, head }) = spec else {
                continue;
            };
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

    /// Bytes one position takes in this layer's rows stored as `types` (the widths must be
    /// whole blocks: [`check_types`](Self::check_types)).
    pub fn bytes_per_position(&self, types: KvTypes) -> u64 {
        self.rows(types)
            .iter()
            .filter_map(|&(_, spec, ty)| spec.and_then(|s| ty.row_bytes(s.width as u64)))
            .sum()
    }

    /// Bytes of the fixed-size (recurrent) part.
    pub fn fixed_bytes(&self) -> u64 {
        self.recurrent.map_or(0, |r| r.bytes())
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

/// One part of a layer's rows: `width` elements of type `ty` per position, in host memory or
/// (for a layer run by a GPU) in that GPU's memory for the whole context.
pub struct Rows {
    pub ty: GgmlType,
    pub width: usize,
    row_bytes: usize,
    host: Vec<u8>,
    /// Positions the host rows may grow to (the context's): growth never reserves past it.
    max_rows: usize,
    gpu: Option<Buffer>,
    // The type's conversions, looked up once (attention converts rows on every token).
    quantize: QuantizeFn,
    dequantize: DequantizeFn,
}

impl Rows {
    /// `ty` is one of [`KV_TYPES`].
    pub(crate) fn new(ty: GgmlType, width: usize) -> Rows {
        Rows {
            ty,
            width,
            row_bytes: ty.row_bytes(width as u64).unwrap_or(0) as usize,
            host: Vec::new(),
            max_rows: usize::MAX,
            gpu: None,
            quantize: moxie_quant::quantize_fn(ty).expect("cache types can be quantized"),
            dequantize: moxie_quant::dequantize_fn(ty).expect("cache types can be dequantized"),
        }
    }

    /// Append the rows of `x` (converted to the cache type) after what is held on the host.
    pub fn append(&mut self, x: &[f32]) {
        debug_assert!(self.gpu.is_none(), "host append to GPU rows");
        let quantize = self.quantize;
        let n = x.len() / self.width;
        let at = self.host.len();
        let need = at + n * self.row_bytes;
        if need > self.host.capacity() {
            // The whole context at once where it is known: pages are resident only once
            // written, while doubling copied the rows at every step and left the freed
            // buffers in the heap (+25 MB of RSS at 30K positions of a 3-layer cache).
            // Without a context, doubling as `Vec` grows.
            let cap = match self.max_rows {
                usize::MAX => 2 * self.host.capacity(),
                rows => rows.saturating_mul(self.row_bytes),
            };
            self.host.reserve_exact(cap.max(need) - at);
        }
        self.host.resize(need, 0);
        for (src, dst) in x
            .chunks_exact(self.width)
            .zip(self.host[at..].chunks_exact_mut(self.row_bytes))
        {
            quantize(src, dst);
        }
    }

    /// The rows held on the host.
    pub fn view(&self) -> CacheRows<'_> {
        CacheRows {
            ty: self.ty,
            width: self.width,
            row_bytes: self.row_bytes,
            data: &self.host,
            dequantize: self.dequantize,
        }
    }

    /// The rows' buffer in GPU memory, if they live there.
    pub fn gpu(&self) -> Option<&Buffer> {
        self.gpu.as_ref()
    }

    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    fn truncate(&mut self, pos: usize) {
        self.host.truncate(pos * self.row_bytes);
    }
}

/// Cached rows of one layer part: `width` elements of type `ty`, `row_bytes`, per position.
#[derive(Clone, Copy)]
pub struct CacheRows<'a> {
    pub ty: GgmlType,
    pub width: usize,
    pub row_bytes: usize,
    pub data: &'a [u8],
    dequantize: DequantizeFn,
}

impl<'a> CacheRows<'a> {
    /// Rows of `width` f32 values (`data` holds whole rows): attention over values computed
    /// for one batch rather than cached (MLA's expanded keys and values).
    pub fn f32(data: &'a [f32], width: usize) -> CacheRows<'a> {
        CacheRows {
            ty: GgmlType::F32,
            width,
            row_bytes: 4 * width,
            data: bytemuck::cast_slice(data),
            dequantize: moxie_quant::dequantize_fn(GgmlType::F32).expect("F32 converts"),
        }
    }

    /// The rows as f32 values, when they are f32 (and aligned as such).
    pub fn as_f32(&self) -> Option<&'a [f32]> {
        (self.ty == GgmlType::F32)
            .then(|| bytemuck::try_cast_slice(self.data).ok())
            .flatten()
    }

    /// Bytes of `n` elements starting `first` elements into position `pos`'s row (`first`
    /// and `n` are whole blocks: the state checked head widths when it was made).
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

/// A layer's recurrent state (f32): in host vectors, or in GPU memory for a layer run by a GPU.
pub struct Recurrent {
    pub spec: RecurrentSpec,
    pub conv: Vec<f32>,
    pub ssm: Vec<f32>,
    /// `(conv, ssm)` in GPU memory.
    gpu: Option<(Buffer, Buffer)>,
}

impl Recurrent {
    fn new(spec: RecurrentSpec) -> Recurrent {
        Recurrent {
            spec,
            conv: vec![0.0; spec.conv],
            ssm: vec![0.0; spec.ssm],
            gpu: None,
        }
    }

    /// The `(conv, ssm)` buffers in GPU memory, if the state lives there.
    pub fn gpu(&self) -> Option<&(Buffer, Buffer)> {
        self.gpu.as_ref()
    }

    /// Back to the state before any token.
    fn reset(&mut self) -> Result<()> {
        self.conv.fill(0.0);
        self.ssm.fill(0.0);
        if let Some((c, s)) = &self.gpu {
            c.write_f32(0, &self.conv)?;
            s.write_f32(0, &self.ssm)?;
        }
        Ok(())
    }

    /// A host copy of the state.
    fn save(&self) -> Result<(Vec<f32>, Vec<f32>)> {
        let (mut conv, mut ssm) = (self.conv.clone(), self.ssm.clone());
        if let Some((c, s)) = &self.gpu {
            c.read_f32(0, &mut conv)?;
            s.read_f32(0, &mut ssm)?;
        }
        Ok((conv, ssm))
    }

    fn restore(&mut self, (conv, ssm): &(Vec<f32>, Vec<f32>)) -> Result<()> {
        match &self.gpu {
            Some((c, s)) => {
                c.write_f32(0, conv)?;
                s.write_f32(0, ssm)?;
            }
            None => {
                self.conv.copy_from_slice(conv);
                self.ssm.copy_from_slice(ssm);
            }
        }
        Ok(())
    }
}

/// What one layer keeps (the parts its [`LayerStateSpec`] asked for).
pub struct LayerState {
    pub spec: LayerStateSpec,
    pub keys: Option<Rows>,
    pub values: Option<Rows>,
    pub indexer_keys: Option<Rows>,
    pub recurrent: Option<Recurrent>,
}

impl LayerState {
    fn rows_mut(&mut self) -> impl Iterator<Item = &mut Rows> {
        [&mut self.keys, &mut self.values, &mut self.indexer_keys]
            .into_iter()
            .flatten()
    }

    /// Keep this layer's rows in GPU memory (`alloc(bytes)` gives a buffer of that size), for
    /// `n_ctx` positions, and its recurrent state there too.
    pub fn move_to_gpu(
        &mut self,
        n_ctx: usize,
        mut alloc: impl FnMut(usize) -> Result<Buffer>,
    ) -> Result<()> {
        for rows in self.rows_mut() {
            rows.gpu = Some(alloc(n_ctx * rows.row_bytes)?);
        }
        if let Some(r) = &mut self.recurrent {
            let conv = alloc(4 * r.spec.conv)?;
            let ssm = alloc(4 * r.spec.ssm)?;
            conv.write_f32(0, &r.conv)?;
            ssm.write_f32(0, &r.ssm)?;
            r.gpu = Some((conv, ssm));
        }
        Ok(())
    }
}

/// Recurrent state of every recurrent layer at one length.
struct Checkpoint {
    len: usize,
    layers: Vec<Option<(Vec<f32>, Vec<f32>)>>,
}

/// The state of one sequence: every layer's [`LayerState`] for up to `n_ctx` positions.
pub struct SeqState {
    n_ctx: usize,
    len: usize,
    layers: Vec<LayerState>,
    /// Device memory held for the layers kept on accelerators.
    held: Vec<Reservation>,
    checkpoints: Vec<Checkpoint>,
    max_checkpoints: usize,
}

/// Recurrent checkpoints a sequence keeps by default (the oldest is dropped for a new one).
pub const DEFAULT_CHECKPOINTS: usize = 4;

impl SeqState {
    /// The state for `n_ctx` positions of layers declaring `specs`, rows stored as `types`.
    /// Host memory is taken as positions are written. Fails if a head's width is not a whole
    /// number of its type's blocks.
    pub fn new(specs: &[LayerStateSpec], n_ctx: usize, types: KvTypes) -> Result<SeqState> {
        let mut layers = Vec::with_capacity(specs.len());
        for (il, spec) in specs.iter().enumerate() {
            spec.check_types(il, types)?;
            let rows = |s: Option<RowSpec>, ty| {
                s.map(|s| Rows {
                    max_rows: n_ctx,
                    ..Rows::new(ty, s.width)
                })
            };
            layers.push(LayerState {
                spec: *spec,
                keys: rows(spec.keys, types.k),
                values: rows(spec.values, types.v),
                indexer_keys: rows(spec.indexer_keys, types.k),
                recurrent: spec.recurrent.map(Recurrent::new),
            });
        }
        Ok(SeqState {
            n_ctx,
            len: 0,
            layers,
            held: Vec::new(),
            checkpoints: Vec::new(),
            max_checkpoints: DEFAULT_CHECKPOINTS,
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

    pub fn layer(&self, il: usize) -> &LayerState {
        &self.layers[il]
    }

    pub fn layer_mut(&mut self, il: usize) -> &mut LayerState {
        &mut self.layers[il]
    }

    /// Whether some layer keeps recurrent state (which truncation can only restore from a
    /// checkpoint).
    pub fn is_recurrent(&self) -> bool {
        self.layers.iter().any(|l| l.recurrent.is_some())
    }

    /// Keep everything before position `pos` and forget the rest. Returns how many positions
    /// are held afterwards: `pos` (or the current length, if shorter), except for recurrent
    /// layers, whose state only exists at checkpoints: then the latest checkpoint at or before
    /// `pos`, or 0. The caller evaluates the tokens from there again.
    pub fn truncate(&mut self, pos: usize) -> Result<usize> {
        let mut keep = pos.min(self.len);
        if self.is_recurrent() && keep != self.len {
            let best = self
                .checkpoints
                .iter()
                .filter(|c| c.len <= keep)
                .max_by_key(|c| c.len)
                .map(|c| c.len);
            keep = best.unwrap_or(0);
            match self.checkpoints.iter().position(|c| c.len == keep) {
                Some(i) if keep > 0 => {
                    let cp = &self.checkpoints[i];
                    for (layer, saved) in self.layers.iter_mut().zip(&cp.layers) {
                        if let (Some(r), Some(saved)) = (&mut layer.recurrent, saved) {
                            r.restore(saved)?;
                        }
                    }
                }
                _ => {
                    for r in self.layers.iter_mut().filter_map(|l| l.recurrent.as_mut()) {
                        r.reset()?;
                    }
                }
            }
            // Checkpoints past the new end describe a future that no longer exists.
            self.checkpoints.retain(|c| c.len <= keep);
        }
        if keep < self.len {
            self.len = keep;
            for l in &mut self.layers {
                for rows in l.rows_mut() {
                    rows.truncate(keep);
                }
            }
        }
        Ok(self.len)
    }

    /// Remember the recurrent state at the current length, so that [`SeqState::truncate`] can
    /// come back here. Nothing is kept for a model without recurrent layers. At most the
    /// newest [`DEFAULT_CHECKPOINTS`] are kept.
    pub fn checkpoint(&mut self) -> Result<()> {
        if !self.is_recurrent() || self.checkpoints.iter().any(|c| c.len == self.len) {
            return Ok(());
        }
        let layers = self
            .layers
            .iter()
            .map(|l| l.recurrent.as_ref().map(Recurrent::save).transpose())
            .collect::<Result<Vec<_>>>()?;
        if self.checkpoints.len() == self.max_checkpoints {
            self.checkpoints.remove(0);
        }
        self.checkpoints.push(Checkpoint {
            len: self.len,
            layers,
        });
        Ok(())
    }

    /// The lengths at which checkpoints are kept, oldest first.
    pub fn checkpoint_lens(&self) -> Vec<usize> {
        self.checkpoints.iter().map(|c| c.len).collect()
    }

    /// Bytes of one position over all layers' rows.
    pub fn bytes_per_position(&self) -> usize {
        self.layers
            .iter()
            .flat_map(|l| [&l.keys, &l.values, &l.indexer_keys])
            .flatten()
            .map(|r| r.row_bytes)
            .sum()
    }

    /// Bytes the state takes when every position is filled (recurrent parts included, without
    /// checkpoints).
    pub fn bytes_when_full(&self) -> usize {
        (0..self.layers.len())
            .map(|il| self.layer_bytes_when_full(il))
            .sum()
    }

    /// Bytes layer `il`'s part takes when full.
    pub fn layer_bytes_when_full(&self, il: usize) -> usize {
        let l = &self.layers[il];
        let rows: usize = [&l.keys, &l.values, &l.indexer_keys]
            .into_iter()
            .flatten()
            .map(|r| r.row_bytes)
            .sum();
        rows * self.n_ctx + l.spec.fixed_bytes() as usize
    }

    /// Keep `r` (device memory for a layer's part) as long as the state lives.
    pub fn hold(&mut self, r: Reservation) {
        self.held.push(r);
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

    /// Mark `n` positions that every layer has appended as stored.
    pub fn commit(&mut self, n: usize) {
        self.len += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn types(k: GgmlType, v: GgmlType) -> KvTypes {
        KvTypes { k, v }
    }

    fn gqa(head: usize) -> LayerStateSpec {
        let rows = RowSpec {
            width: 2 * head,
            head,
        };
        LayerStateSpec {
            keys: Some(rows),
            values: Some(rows),
            ..Default::default()
        }
    }

    /// The host rows reserve the context once, at the first write (pages become resident as
    /// they are written), and never past it; without a context they double.
    #[test]
    fn rows_reserve_the_context_once() {
        let mut c = SeqState::new(&[gqa(64)], 5, types(GgmlType::F16, GgmlType::F16)).unwrap();
        let x = vec![0.5f32; 128];
        let keys = c.layer_mut(0).keys.as_mut().unwrap();
        keys.append(&x.repeat(3));
        assert_eq!(keys.host.capacity(), 5 * keys.row_bytes);
        let buffer = keys.host.as_ptr();
        keys.append(&x);
        keys.append(&x);
        assert_eq!(keys.host.len(), 5 * keys.row_bytes);
        assert_eq!(
            keys.host.as_ptr(),
            buffer,
            "no reallocation within the context"
        );
        let mut free = Rows::new(GgmlType::F16, 128);
        free.append(&x.repeat(3));
        free.append(&x);
        assert!(free.host.capacity() >= 6 * free.row_bytes);
    }

    #[test]
    fn q8_0_rows_round_trip_and_truncate() {
        let mut c = SeqState::new(&[gqa(64)], 8, types(GgmlType::Q8_0, GgmlType::F32)).unwrap();
        let k: Vec<f32> = (0..3 * 128).map(|i| (i as f32 * 0.37).sin()).collect();
        let l = c.layer_mut(0);
        l.keys.as_mut().unwrap().append(&k);
        l.values.as_mut().unwrap().append(&k);
        c.commit(3);
        assert_eq!(c.bytes_per_position(), 4 * 34 + 128 * 4);
        let mut row = vec![0f32; 64];
        c.layer(0)
            .keys
            .as_ref()
            .unwrap()
            .view()
            .to_f32(2, 64, &mut row);
        for (a, b) in row.iter().zip(&k[2 * 128 + 64..3 * 128]) {
            assert!((a - b).abs() <= 1.0 / 127.0, "{a} vs {b}");
        }
        c.layer(0)
            .values
            .as_ref()
            .unwrap()
            .view()
            .to_f32(1, 0, &mut row);
        assert_eq!(row, k[128..192]);
        assert_eq!(c.truncate(1).unwrap(), 1);
        assert_eq!(c.layer(0).keys.as_ref().unwrap().view().data.len(), 4 * 34);
    }

    #[test]
    fn cache_types_are_checked() {
        let q8 = types(GgmlType::Q8_0, GgmlType::F16);
        assert!(SeqState::new(&[gqa(40)], 8, q8).is_err());
        assert!(SeqState::new(&[gqa(40)], 8, KvTypes::default()).is_ok());
        assert_eq!(parse_kv_type("q8_0").unwrap(), GgmlType::Q8_0);
        let e = parse_kv_type("q4_0").unwrap_err().to_string();
        assert!(e.contains("q4_0") && e.contains("f32, f16, q8_0"), "{e}");
    }

    /// Recurrent state comes back from the latest checkpoint at or before the asked length;
    /// without one, from the start.
    #[test]
    fn recurrent_state_truncates_to_checkpoints() {
        let spec = LayerStateSpec {
            recurrent: Some(RecurrentSpec { conv: 2, ssm: 3 }),
            ..Default::default()
        };
        let mut s = SeqState::new(&[gqa(32), spec], 64, KvTypes::default()).unwrap();
        let step = |s: &mut SeqState, n: usize, v: f32| {
            let l = s.layer_mut(0);
            l.keys.as_mut().unwrap().append(&vec![v; 64 * n]);
            l.values.as_mut().unwrap().append(&vec![v; 64 * n]);
            let r = s.layer_mut(1).recurrent.as_mut().unwrap();
            r.conv.fill(v);
            r.ssm.fill(v);
            s.commit(n);
        };
        step(&mut s, 5, 1.0);
        s.checkpoint().unwrap();
        step(&mut s, 3, 2.0);
        s.checkpoint().unwrap();
        step(&mut s, 4, 3.0);
        assert_eq!(s.checkpoint_lens(), vec![5, 8]);
        // Back to 10: the checkpoint at 8 is the latest before it.
        assert_eq!(s.truncate(10).unwrap(), 8);
        assert_eq!(s.layer(1).recurrent.as_ref().unwrap().ssm, vec![2.0; 3]);
        assert_eq!(
            s.layer(0).keys.as_ref().unwrap().view().data.len(),
            8 * 64 * 2
        );
        // Back to 6: the one at 5; the one at 8 is gone with the positions it described.
        assert_eq!(s.truncate(6).unwrap(), 5);
        assert_eq!(s.checkpoint_lens(), vec![5]);
        assert_eq!(s.layer(1).recurrent.as_ref().unwrap().conv, vec![1.0; 2]);
        // Before every checkpoint: from the start.
        assert_eq!(s.truncate(3).unwrap(), 0);
        assert_eq!(s.layer(1).recurrent.as_ref().unwrap().conv, vec![0.0; 2]);
        // Truncating to the current length keeps the state as it is.
        step(&mut s, 2, 4.0);
        assert_eq!(s.truncate(2).unwrap(), 2);
        assert_eq!(s.layer(1).recurrent.as_ref().unwrap().conv, vec![4.0; 2]);
    }
}
