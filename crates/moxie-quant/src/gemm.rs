//! Batched quantized matrix products on AVX-512 VNNI (or AVX2): the prompt-processing fast
//! path.
//!
//! Weights are decoded 16 rows at a time into unsigned bytes (`q + offset`) with one float
//! scale (and, for K-quants with mins, one float min) per sub-block of `S` elements, and stored
//! interleaved in groups of four (`[k/4][16 rows][4]`) so that one `vpdpbusd` multiplies four
//! elements of 16 weight rows by four broadcast activation bytes. Activations stay ggml's dot
//! partner (Q8_K, Q8_0, or Q8_1 for Q4_1) with their headers stripped. Each sub-block's integer sum is exactly
//! ggml's (the offset is removed with the activation block sums, in integers); only the float
//! accumulation order differs from `vec_dot`, so results agree to float rounding, not bit for
//! bit. moxie's exact mode keeps ggml's order and does not come here.
//!
//! CPUs with AVX2 but not AVX-512 multiply the same tiles with `vpmaddubsw` + `vpmaddwd`
//! (`gemm/avx2.rs`); their tiles come from the portable decoders.
//!
//! The decoded tile is reused for every token, so the decode cost is spread over the batch:
//! this pays from a few tokens on (prefill, experts with several routed tokens).

use crate::common::{get_scale_min_k4, rd_f16, rd_f32, rd_i16, rd_u32};
use crate::iq2_3::{
    iq2_s_group, iq2_xs_group, iq2_xxs_group, iq3_xxs_group, Group32, IQ2_S_BYTES, IQ2_XS_BYTES,
    IQ2_XXS_BYTES, IQ3_XXS_BYTES,
};
use crate::kquants::{q4_k_quants, q5_k_quants, q6_k_quants};
use crate::legacy::{quants_4bit, quants_5bit};
use crate::pool::{give_back, take_fitting};
use crate::GgmlType;

/// Weight rows per decoded tile (one i32 lane per row in a 512-bit register).
pub const GEMM_TILE_ROWS: usize = 16;

/// Whether the int8 batched path can run here (AVX2, or AVX-512 with VNNI; not lowered by
/// `MOXIE_QUANT_SIMD`).
pub fn gemm_available() -> bool {
    crate::simd_level() >= crate::SimdLevel::Avx2
}

/// Whether the tiles are built and multiplied by the AVX-512 kernels here (`vpdpbusd`, the
/// whole-tile decoders and group fills); otherwise, where [`gemm_available`], the AVX2
/// products (`gemm/avx2.rs`) run on tiles from the portable decoders.
pub fn gemm_avx512() -> bool {
    crate::simd_level() == crate::SimdLevel::Avx512
}

#[cfg(target_arch = "x86_64")]
mod avx2;

/// One weight row decoded to unsigned bytes `q` (the value plus the layout's offset) with the
/// scale and min of every sub-block.
pub(crate) type DecodeRowFn = fn(row: &[u8], q: &mut [u8], scale: &mut [f32], min: &mut [f32]);

/// Up to 16 weight rows decoded straight into a tile (`rows`, `n_rows`, `row_bytes`, `n_in`,
/// scratch for a copy of the rows, the tile); `false` (tile untouched) where the fast path is
/// unavailable.
pub(crate) type UnpackTileFn = fn(&[u8], usize, usize, usize, &mut [u8], TileOut) -> bool;

/// How a weight type maps onto unsigned-by-signed int8 products (its row of the type table).
#[derive(Clone, Copy)]
pub(crate) struct GemmLayout {
    /// Elements per scaled sub-block (16 or 32).
    pub sub: usize,
    /// Whether a per-sub-block min is subtracted (`w = d*sc*q - dmin*m`).
    pub mins: bool,
    /// Added to the signed weight values to make them unsigned (a power of two).
    pub offset: i32,
    /// Bits of the unsigned codes (4, 5, 6; 8 for the signed layouts stored with offset 128):
    /// how many groups the AVX2 kernel may sum in i16 before widening.
    pub code_bits: u32,
    /// The portable decoder of one row.
    pub decode: DecodeRowFn,
    /// A faster whole-tile decoder (AVX-512), where there is one.
    pub unpack_tile: Option<UnpackTileFn>,
}

/// A type's [`GemmLayout`] with the activation type it pairs with.
#[derive(Clone, Copy)]
struct Layout {
    sub: usize,
    act: GgmlType,
    mins: bool,
    offset: i32,
    code_bits: u32,
    decode: DecodeRowFn,
    unpack_tile: Option<UnpackTileFn>,
}

fn layout(ty: GgmlType) -> Option<Layout> {
    let dot = crate::table::row(ty).dot.as_ref()?;
    let g = dot.gemm?;
    Some(Layout {
        sub: g.sub,
        act: dot.act,
        mins: g.mins,
        offset: g.offset,
        code_bits: g.code_bits,
        decode: g.decode,
        unpack_tile: g.unpack_tile,
    })
}

/// Whether [`gemm_q8`] handles weights of type `ty` with rows of `n_in` elements.
pub fn gemm_supports(ty: GgmlType, n_in: usize) -> bool {
    layout(ty).is_some_and(|l| n_in > 0 && n_in.is_multiple_of(l.act.block_size()))
}

/// Activation rows prepared for [`gemm_q8`]: int8 values without block headers, the scale of
/// each activation block and the sum of every 16 values. It depends only on the activation
/// type, so every matrix reading the same activations can share one.
pub struct GemmActs {
    act: GgmlType,
    n_in: usize,
    n_tok: usize,
    /// Activation blocks per token.
    n_blk: usize,
    /// Whether `buf.tiles` holds the values in the AMX kernel's operand layout too.
    tiled: bool,
    /// The values, scales and sums, from this thread's pool ([`ActsBuffers::take`]): each holds
    /// at least what these rows need, and only that prefix is read.
    buf: ActsBuffers,
}

/// The buffers of a [`GemmActs`]: `[token][n_in]` int8 (as bytes: the kernel reads four at a
/// time), the scale per `[token][activation block]` (256 values for Q8_K, 32 for Q8_0), and the
/// sums per sub-block of 16 and of 32 values (the weight layouts' two sub-block sizes).
/// Q8_0 rows for the AMX-INT8 kernel also have their values as its A operands, `tiles`:
/// `[16 tokens][block][token][32 bytes]`, so that each tile load reads 512 consecutive bytes
/// (loads of 16 rows `n_in` apart, 32 bytes of each line, took a third of the kernel's time).
#[derive(Default)]
struct ActsBuffers {
    q: Vec<u8>,
    tiles: Vec<u8>,
    dx: Vec<f32>,
    by16: SubBlockSums,
    by32: SubBlockSums,
}

/// Per `[token][sub-block]`: the sum of the int8 values and that sum times the scale.
#[derive(Default)]
struct SubBlockSums {
    sum: Vec<i32>,
    scaled: Vec<f32>,
}

/// Tokens in one AMX A operand ([`ActsBuffers`]'s `tiles`). The AMX kernel reads whole tiles
/// of them, values and scales: a last, partial tile's padding rows give sums it then drops.
const AMX_TILE_TOKENS: usize = 16;

/// Sets of buffers a thread keeps for the next [`GemmActs`] it prepares. A prompt batch
/// prepares several activations per layer, MBs each: fresh buffers were zeroed by the thread
/// that asked for them (the main thread, while the others waited) and then overwritten.
const ACTS_POOLED: usize = 4;

thread_local! {
    static ACTS_POOL: std::cell::RefCell<Vec<ActsBuffers>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Row `from` of `src` into row `to` of `dst` (rows of `per` values).
fn copy_row<T: Copy>(src: &[T], dst: &mut [T], per: usize, from: usize, to: usize) {
    dst[to * per..(to + 1) * per].copy_from_slice(&src[from * per..(from + 1) * per]);
}

/// `v` at least `n` long: grown with zeros where it was shorter, otherwise left as it is.
fn at_least<T: Copy + Default>(v: &mut Vec<T>, n: usize) {
    if v.len() < n {
        v.resize(n, T::default());
    }
}

impl ActsBuffers {
    /// The values this set has room for (its other buffers grow with them).
    fn values(&self) -> usize {
        self.q.len()
    }

    /// A set with room for `n` values in blocks of `block`, from this thread's pool where it has
    /// one (`pool::take_fitting`: the smallest that holds them, else its largest, grown). What it held is left in
    /// place: every reader's prefix is written before it is read. With `tiled`, `tiles` and
    /// the scales hold whole tiles of [`AMX_TILE_TOKENS`] tokens (what the AMX kernel reads).
    fn take(n: usize, n_in: usize, block: usize, tiled: bool) -> ActsBuffers {
        let mut b = ACTS_POOL
            .try_with(|pool| take_fitting(&mut pool.borrow_mut(), n, ActsBuffers::values))
            .ok()
            .flatten()
            .unwrap_or_default();
        at_least(&mut b.q, n);
        let padded = if tiled {
            tiled_values(n / n_in, n_in)
        } else {
            n
        };
        if tiled {
            at_least(&mut b.tiles, padded);
        }
        at_least(&mut b.dx, padded / block);
        for (by, sub) in [(&mut b.by16, 16), (&mut b.by32, 32)] {
            at_least(&mut by.sum, n / sub);
            at_least(&mut by.scaled, n / sub);
        }
        b
    }
}

impl Drop for GemmActs {
    fn drop(&mut self) {
        let b = std::mem::take(&mut self.buf);
        if b.q.is_empty() {
            return;
        }
        // `try_with`: buffers dropped while the thread's locals are torn down are just freed.
        let _ = ACTS_POOL.try_with(|pool| {
            give_back(&mut pool.borrow_mut(), b, ACTS_POOLED, ActsBuffers::values)
        });
    }
}

/// The sum of 16 int8 values (written so that it vectorizes).
fn sum16(q: &[u8; 16]) -> i32 {
    let mut s = [0i16; 16];
    for (s, &v) in s.iter_mut().zip(q) {
        *s = v as i8 as i16;
    }
    s.iter().map(|&v| v as i32).sum()
}

/// (values per block, bytes per block, bytes before the values) of an activation type
/// [`GemmActs`] takes.
fn act_blocks(act: GgmlType) -> Option<(usize, usize, usize)> {
    match act {
        GgmlType::Q8_K => Some((256, 292, 4)),
        GgmlType::Q8_0 => Some((32, 34, 2)),
        // Q8_0 with the block sum's f16 after the scale; the sums are recomputed here.
        GgmlType::Q8_1 => Some((32, 36, 4)),
        _ => None,
    }
}

/// Byte `at` of block `b` of token `t`'s values in the AMX operand layout (`ActsBuffers::tiles`)
/// of rows of `n_in` values.
fn tile_offset(n_in: usize, t: usize, b: usize) -> usize {
    (t / AMX_TILE_TOKENS) * AMX_TILE_TOKENS * n_in
        + b * 32 * AMX_TILE_TOKENS
        + (t % AMX_TILE_TOKENS) * 32
}

/// Values in the AMX operand layout of `n_tok` rows of `n_in`: whole tiles of
/// [`AMX_TILE_TOKENS`] tokens.
fn tiled_values(n_tok: usize, n_in: usize) -> usize {
    n_tok.next_multiple_of(AMX_TILE_TOKENS) * n_in
}

/// Token `t`'s values `row` into `tiles`, the AMX operand layout of rows of `n_in` values.
fn put_tile_row(tiles: &mut [u8], n_in: usize, t: usize, row: &[u8]) {
    for (b, v) in row.chunks_exact(32).enumerate() {
        let at = tile_offset(n_in, t, b);
        tiles[at..at + 32].copy_from_slice(v);
    }
}

/// Whether [`GemmActs`] of type `act` are also laid out for the AMX-INT8 kernel.
fn amx_tiled(act: GgmlType) -> bool {
    act == GgmlType::Q8_0 && crate::amx::int8_available()
}

impl GemmActs {
    /// Prepare `acts`: `row_bytes` per token of activation type `act` (Q8_K, Q8_0, Q8_1), `n_in`
    /// values each. `None` for another type or sizes that disagree.
    pub fn new(act: GgmlType, n_in: usize, acts: &[u8], row_bytes: usize) -> Option<GemmActs> {
        if act.row_bytes(n_in as u64)? as usize != row_bytes
            || !acts.len().is_multiple_of(row_bytes)
        {
            return None;
        }
        let mut g = GemmActs::unfilled(act, n_in, acts.len() / row_bytes)?;
        if let Some(mut all) = g.parts(usize::MAX).pop() {
            all.fill(acts);
        }
        Some(g)
    }

    /// `n_tok` rows to be written part by part ([`GemmActs::parts`]), every value of them
    /// before any is read (the buffers may hold an earlier set's values). `None` for an
    /// activation type other than Q8_K, Q8_0 and Q8_1, or `n_in` not whole blocks of it.
    pub fn unfilled(act: GgmlType, n_in: usize, n_tok: usize) -> Option<GemmActs> {
        let (block, _, _) = act_blocks(act)?;
        if n_in == 0 || !n_in.is_multiple_of(block) {
            return None;
        }
        let tiled = amx_tiled(act);
        Some(GemmActs {
            act,
            n_in,
            n_tok,
            n_blk: n_in / block,
            tiled,
            buf: ActsBuffers::take(n_tok * n_in, n_in, block, tiled),
        })
    }

    /// The rows in parts of `per_part` rows (the last may be shorter), each to be written
    /// by [`GemmRows::fill`] on any thread. Where the values are also laid out in tiles of 16
    /// tokens for the AMX kernel, a part is whole tiles: `per_part` is rounded up to a
    /// multiple of 16.
    pub fn parts(&mut self, per_part: usize) -> Vec<GemmRows<'_>> {
        if self.n_tok == 0 {
            return Vec::new();
        }
        let (n_in, n_blk) = (self.n_in, self.n_blk);
        let n = self.n_tok * n_in;
        let mut per = per_part.clamp(1, self.n_tok);
        if self.tiled {
            per = per.next_multiple_of(AMX_TILE_TOKENS);
        }
        let ActsBuffers {
            q,
            tiles,
            dx,
            by16,
            by32,
        } = &mut self.buf;
        let (s16, c16) = (&mut by16.sum[..n / 16], &mut by16.scaled[..n / 16]);
        let (s32, c32) = (&mut by32.sum[..n / 32], &mut by32.scaled[..n / 32]);
        let n_tiled = if self.tiled {
            tiled_values(self.n_tok, n_in)
        } else {
            0
        };
        let mut tiles = tiles[..n_tiled].chunks_mut(per * n_in);
        q[..n]
            .chunks_mut(per * n_in)
            .zip(dx[..self.n_tok * n_blk].chunks_mut(per * n_blk))
            .zip(
                s16.chunks_mut(per * n_in / 16)
                    .zip(c16.chunks_mut(per * n_in / 16)),
            )
            .zip(
                s32.chunks_mut(per * n_in / 32)
                    .zip(c32.chunks_mut(per * n_in / 32)),
            )
            .map(|(((q, dx), (s16, c16)), (s32, c32))| GemmRows {
                act: self.act,
                n_in,
                q,
                tiles: tiles.next(),
                dx,
                by16: (s16, c16),
                by32: (s32, c32),
            })
            .collect()
    }

    /// The rows `rows` of these activations (in that order), as [`GemmActs::new`] would
    /// prepare them from those rows: a copy, without quantizing or summing again.
    pub fn gather(&self, rows: &[usize]) -> GemmActs {
        let (n_in, n_blk) = (self.n_in, self.n_blk);
        let mut g = GemmActs {
            act: self.act,
            n_in,
            n_tok: rows.len(),
            n_blk,
            tiled: self.tiled,
            buf: ActsBuffers::take(rows.len() * n_in, n_in, n_in / n_blk, self.tiled),
        };
        let (from, to) = (&self.buf, &mut g.buf);
        for (i, &r) in rows.iter().enumerate() {
            copy_row(&from.q, &mut to.q, n_in, r, i);
            if self.tiled {
                put_tile_row(&mut to.tiles, n_in, i, &from.q[r * n_in..(r + 1) * n_in]);
            }
            copy_row(&from.dx, &mut to.dx, n_blk, r, i);
            for (f, t, sub) in [
                (&from.by16, &mut to.by16, 16),
                (&from.by32, &mut to.by32, 32),
            ] {
                copy_row(&f.sum, &mut t.sum, n_in / sub, r, i);
                copy_row(&f.scaled, &mut t.scaled, n_in / sub, r, i);
            }
        }
        g
    }
}

/// What one pass of a GEMM kernel reads of [`GemmActs`]: tokens `t0..t0 + n` with their
/// per-block scales and per-sub-block sums, for weight sub-blocks of `sub` values.
struct PassActs<'a> {
    /// `[token][n_in]` int8.
    x: &'a [u8],
    /// `[token][activation block]` scales.
    dx: &'a [f32],
    /// `[token][sub-block]` sums and scaled sums.
    sums: &'a [i32],
    scaled: &'a [f32],
    /// Values per activation block (256 for Q8_K, else 32), blocks and sub-blocks per row.
    act_block: usize,
    n_blocks: usize,
    n_sub: usize,
}

impl GemmActs {
    /// Tokens `t0..t0 + n` for weight sub-blocks of `sub` (16 or 32) values.
    fn pass(&self, sub: usize, t0: usize, n: usize) -> PassActs<'_> {
        let (n_in, n_blocks) = (self.n_in, self.n_blk);
        let (act_block, n_sub) = (n_in / n_blocks, n_in / sub);
        let by = if sub == 16 {
            &self.buf.by16
        } else {
            &self.buf.by32
        };
        PassActs {
            x: &self.buf.q[t0 * n_in..(t0 + n) * n_in],
            dx: &self.buf.dx[t0 * n_blocks..(t0 + n) * n_blocks],
            sums: &by.sum[t0 * n_sub..(t0 + n) * n_sub],
            scaled: &by.scaled[t0 * n_sub..(t0 + n) * n_sub],
            act_block,
            n_blocks,
            n_sub,
        }
    }
}

/// Consecutive rows of a [`GemmActs`] being written (see [`GemmActs::parts`]).
pub struct GemmRows<'a> {
    act: GgmlType,
    n_in: usize,
    q: &'a mut [u8],
    /// These rows' whole tiles in the AMX operand layout, where the [`GemmActs`] has them.
    tiles: Option<&'a mut [u8]>,
    dx: &'a mut [f32],
    /// The sums and scaled sums of 16 and of 32 values.
    by16: (&'a mut [i32], &'a mut [f32]),
    by32: (&'a mut [i32], &'a mut [f32]),
}

impl GemmRows<'_> {
    /// Write these rows from `acts`, the same rows in the activation type's block format.
    pub fn fill(&mut self, acts: &[u8]) {
        let (block, block_bytes, header) = act_blocks(self.act).expect("checked by unfilled");
        assert_eq!(
            acts.len() / block_bytes * block,
            self.q.len(),
            "GemmRows::fill: the rows' sizes"
        );
        #[cfg(target_arch = "x86_64")]
        if self.act == GgmlType::Q8_0 && gemm_available() {
            // SAFETY: gemm_available: AVX2 was detected; the sizes were checked above.
            return unsafe { self.fill_q8_0_avx2(acts) };
        }
        let (n16, n32) = (block / 16, block / 32);
        for (b, blk) in acts.chunks_exact(block_bytes).enumerate() {
            let d = match self.act {
                GgmlType::Q8_K => rd_f32(blk, 0),
                _ => rd_f16(blk, 0),
            };
            self.dx[b] = d;
            let qs = &blk[header..header + block];
            self.q[b * block..(b + 1) * block].copy_from_slice(qs);
            let (s16, c16) = (&mut self.by16.0[b * n16..], &mut self.by16.1[b * n16..]);
            for (j, q16) in qs.chunks_exact(16).enumerate() {
                // Q8_K carries its sums of 16; Q8_0's are computed.
                let sum = match self.act {
                    GgmlType::Q8_K => rd_i16(blk, 260 + 2 * j) as i32,
                    _ => sum16(q16.try_into().expect("chunks of 16")),
                };
                s16[j] = sum;
                c16[j] = d * sum as f32;
            }
            for j in 0..n32 {
                let sum = s16[2 * j] + s16[2 * j + 1];
                self.by32.0[b * n32 + j] = sum;
                // Q8_1's own `d * sum` per block (rounded to f16 as ggml stores it): the
                // mins term takes it, as ggml's Q4_1 dot does.
                self.by32.1[b * n32 + j] = match self.act {
                    GgmlType::Q8_1 => rd_f16(blk, 2),
                    _ => d * sum as f32,
                };
            }
        }
        if let Some(tiles) = self.tiles.as_deref_mut() {
            for (t, row) in self.q.chunks_exact(self.n_in).enumerate() {
                put_tile_row(tiles, self.n_in, t, row);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
impl GemmRows<'_> {
    /// [`GemmRows::fill`] for Q8_0 rows (`acts` whole blocks of these rows): the same values,
    /// each block's two sums of 16 from one `vpsadbw` of its bytes + 128 (the scalar sums
    /// were 3% of a ds Q8_0 pp512 profile).
    ///
    /// # Safety
    /// AVX2; `acts` holds `self.q.len() / 32` blocks.
    #[target_feature(enable = "avx2")]
    unsafe fn fill_q8_0_avx2(&mut self, acts: &[u8]) {
        use std::arch::x86_64::*;
        let nb = self.q.len() / 32;
        let nbr = self.n_in / 32;
        assert!(acts.len() >= nb * 34 && self.dx.len() >= nb);
        assert!(self.by16.0.len() >= 2 * nb && self.by32.0.len() >= nb);
        let n_tok = nb / nbr;
        let tiles = self.tiles.as_deref_mut().map(|t| {
            assert!(t.len() >= tile_offset(self.n_in, n_tok - 1, nbr - 1) + 32);
            t.as_mut_ptr()
        });
        let bias = _mm256_set1_epi8(-128);
        for (b, blk) in acts.chunks_exact(34).take(nb).enumerate() {
            let d = rd_f16(blk, 0);
            // SAFETY: bytes 2..34 of the block; values b*32..b*32+32 of `q` (nb blocks); the
            // tiles hold every block of these tokens (asserted above).
            let q = unsafe {
                let q = _mm256_loadu_si256(blk.as_ptr().add(2).cast());
                _mm256_storeu_si256(self.q.as_mut_ptr().add(32 * b).cast(), q);
                if let Some(t) = tiles {
                    let at = tile_offset(self.n_in, b / nbr, b % nbr);
                    _mm256_storeu_si256(t.add(at).cast(), q);
                }
                q
            };
            // Sums of each 8 bytes + 128, in the four 64-bit lanes.
            let sad = _mm256_sad_epu8(_mm256_xor_si256(q, bias), _mm256_setzero_si256());
            let mut lanes = [0i64; 4];
            // SAFETY: `lanes` is 32 writable bytes.
            unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), sad) };
            let s0 = (lanes[0] + lanes[1]) as i32 - 16 * 128;
            let s1 = (lanes[2] + lanes[3]) as i32 - 16 * 128;
            self.dx[b] = d;
            self.by16.0[2 * b] = s0;
            self.by16.0[2 * b + 1] = s1;
            self.by16.1[2 * b] = d * s0 as f32;
            self.by16.1[2 * b + 1] = d * s1 as f32;
            self.by32.0[b] = s0 + s1;
            self.by32.1[b] = d * (s0 + s1) as f32;
        }
    }
}

// The row decoders ([`DecodeRowFn`]; Q4_K, Q6_K and ik_llama.cpp's super-block types' tiles
// are usually built by their `unpack_tile` instead).

/// Q4_K / Q5_K: 8 sub-blocks of 32 per block, scale and min from the 6-bit packed pairs.
fn decode_k4_k5(bytes: usize, row: &[u8], q: &mut [u8], scale: &mut [f32], min: &mut [f32]) {
    for (b, x) in row.chunks_exact(bytes).enumerate() {
        let d = rd_f16(x, 0);
        let dmin = rd_f16(x, 2);
        for j in 0..8 {
            let (sc, m) = get_scale_min_k4(j, &x[4..16]);
            scale[8 * b + j] = d * sc as f32;
            min[8 * b + j] = dmin * m as f32;
        }
        let out = &mut q[256 * b..256 * (b + 1)];
        if bytes == 144 {
            q4_k_quants(x, out);
        } else {
            q5_k_quants(x, out);
        }
    }
}

pub(crate) fn decode_q4_k(row: &[u8], q: &mut [u8], scale: &mut [f32], min: &mut [f32]) {
    decode_k4_k5(144, row, q, scale, min)
}

pub(crate) fn decode_q5_k(row: &[u8], q: &mut [u8], scale: &mut [f32], min: &mut [f32]) {
    decode_k4_k5(176, row, q, scale, min)
}

/// Values 0..63; the -32 is the layout's offset.
pub(crate) fn decode_q6_k(row: &[u8], q: &mut [u8], scale: &mut [f32], _min: &mut [f32]) {
    for (b, x) in row.chunks_exact(210).enumerate() {
        let d = rd_f16(x, 208);
        for j in 0..16 {
            scale[16 * b + j] = d * (x[192 + j] as i8) as f32;
        }
        q6_k_quants(x, &mut q[256 * b..256 * (b + 1)]);
    }
}

pub(crate) fn decode_q8_0(row: &[u8], q: &mut [u8], scale: &mut [f32], _min: &mut [f32]) {
    for (b, x) in row.chunks_exact(34).enumerate() {
        scale[b] = rd_f16(x, 0);
        for (o, &v) in q[32 * b..32 * (b + 1)].iter_mut().zip(&x[2..34]) {
            *o = v ^ 0x80; // two's complement + 128
        }
    }
}

pub(crate) fn decode_q4_0(row: &[u8], q: &mut [u8], scale: &mut [f32], _min: &mut [f32]) {
    for (b, x) in row.chunks_exact(18).enumerate() {
        scale[b] = rd_f16(x, 0);
        q[32 * b..32 * (b + 1)].copy_from_slice(&quants_4bit(&x[2..18]));
    }
}

/// Q4_1: `w = d * q + m` with q in 0..16, so the min the kernel subtracts is `-m`.
pub(crate) fn decode_q4_1(row: &[u8], q: &mut [u8], scale: &mut [f32], min: &mut [f32]) {
    for (b, x) in row.chunks_exact(20).enumerate() {
        scale[b] = rd_f16(x, 0);
        min[b] = -rd_f16(x, 2);
        q[32 * b..32 * (b + 1)].copy_from_slice(&quants_4bit(&x[4..20]));
    }
}

pub(crate) fn decode_q5_0(row: &[u8], q: &mut [u8], scale: &mut [f32], _min: &mut [f32]) {
    for (b, x) in row.chunks_exact(22).enumerate() {
        scale[b] = rd_f16(x, 0);
        q[32 * b..32 * (b + 1)].copy_from_slice(&quants_5bit(&x[6..22], rd_u32(x, 2)));
    }
}

/// The IQ2/IQ3 code-book types: the signed values plus 128, and per sub-block of `sub` (32, or
/// 16 for the types with two scales per 32) the dequantization's `d * (0.5 + ls) * sub_scale`.
fn decode_grid(
    row: &[u8],
    q: &mut [u8],
    scale: &mut [f32],
    block_bytes: usize,
    sub: usize,
    sub_scale: f32,
    group: fn(&[u8], usize) -> Group32,
) {
    let per_block = 256 / sub;
    for (b, x) in row.chunks_exact(block_bytes).enumerate() {
        let d = rd_f16(x, 0);
        for ib32 in 0..8 {
            let g = group(x, ib32);
            for (o, &v) in q[256 * b + 32 * ib32..256 * b + 32 * ib32 + 32]
                .iter_mut()
                .zip(&g.v)
            {
                *o = (v as i32 + 128) as u8;
            }
            for (h, &ls) in g.ls[..32 / sub].iter().enumerate() {
                scale[per_block * b + 32 / sub * ib32 + h] = d * (0.5 + ls as f32) * sub_scale;
            }
        }
    }
}

pub(crate) fn decode_iq2_xxs(row: &[u8], q: &mut [u8], scale: &mut [f32], _min: &mut [f32]) {
    decode_grid(row, q, scale, IQ2_XXS_BYTES, 32, 0.25, iq2_xxs_group)
}

pub(crate) fn decode_iq2_xs(row: &[u8], q: &mut [u8], scale: &mut [f32], _min: &mut [f32]) {
    decode_grid(row, q, scale, IQ2_XS_BYTES, 16, 0.25, iq2_xs_group)
}

pub(crate) fn decode_iq2_s(row: &[u8], q: &mut [u8], scale: &mut [f32], _min: &mut [f32]) {
    decode_grid(row, q, scale, IQ2_S_BYTES, 16, 0.25, iq2_s_group)
}

pub(crate) fn decode_iq3_xxs(row: &[u8], q: &mut [u8], scale: &mut [f32], _min: &mut [f32]) {
    decode_grid(row, q, scale, IQ3_XXS_BYTES, 32, 0.5, iq3_xxs_group)
}

/// The parts of a [`WeightTile`] an [`UnpackTileFn`] writes.
pub(crate) struct TileOut<'a> {
    /// `[n_in/4][16 rows][4]` unsigned bytes.
    pub q: &'a mut [u8],
    /// `[sub-block][16 rows]`.
    pub scale: &'a mut [f32],
    /// `[sub-block][16 rows]` (empty without mins).
    pub min: &'a mut [f32],
}

/// 16 weight rows, decoded and interleaved for `vpdpbusd`.
struct WeightTile {
    /// `[n_in/4][16 rows][4]` unsigned bytes.
    q: Vec<u8>,
    /// `[sub-block][16 rows]`.
    scale: Vec<f32>,
    /// `[sub-block][16 rows]` (empty without mins).
    min: Vec<f32>,
    /// Scratch: the 16 decoded rows, row-major, and one row's scales.
    rows: Vec<u8>,
    row_scale: Vec<f32>,
    row_min: Vec<f32>,
}

impl WeightTile {
    fn new(l: Layout, n_in: usize) -> WeightTile {
        let n_sub = n_in / l.sub;
        WeightTile {
            q: vec![0; GEMM_TILE_ROWS * n_in],
            scale: vec![0.0; n_sub * GEMM_TILE_ROWS],
            min: vec![0.0; if l.mins { n_sub * GEMM_TILE_ROWS } else { 0 }],
            rows: vec![0; GEMM_TILE_ROWS * n_in],
            row_scale: vec![0.0; n_sub],
            row_min: vec![0.0; n_sub],
        }
    }

    /// Whether this tile's buffers are the right size for (`l`, `n_in`).
    fn fits(&self, l: Layout, n_in: usize) -> bool {
        let n_sub = n_in / l.sub;
        self.q.len() == GEMM_TILE_ROWS * n_in
            && self.scale.len() == n_sub * GEMM_TILE_ROWS
            && self.min.len() == if l.mins { n_sub * GEMM_TILE_ROWS } else { 0 }
    }

    /// Decode `rows` (at most 16 rows of `row_bytes`); missing rows become zeros. Returns
    /// whether the layout's tile decoder did it (rather than its row decoder).
    fn fill(&mut self, l: Layout, n_in: usize, rows: &[u8], row_bytes: usize) -> bool {
        let n_sub = n_in / l.sub;
        let n_rows = rows.len() / row_bytes;
        // Q4_K and Q6_K go from the rows straight into the tile (quants, scales and mins);
        // `self.rows` is the scratch for the copy of the rows they gather from. ik_llama.cpp's
        // super-block types decode each row's blocks and transpose them into the tile
        // (`x86_avx512_iqk.rs`).
        if let Some(unpack) = l.unpack_tile {
            let out = TileOut {
                q: &mut self.q,
                scale: &mut self.scale,
                min: &mut self.min,
            };
            if unpack(rows, n_rows, row_bytes, n_in, &mut self.rows, out) {
                return true;
            }
        }
        for (m, row) in self.rows.chunks_exact_mut(n_in).enumerate() {
            if m < n_rows {
                let src = &rows[m * row_bytes..(m + 1) * row_bytes];
                (l.decode)(src, row, &mut self.row_scale, &mut self.row_min);
            } else {
                row.fill(0);
                self.row_scale.fill(0.0);
                self.row_min.fill(0.0);
            }
            for s in 0..n_sub {
                self.scale[s * GEMM_TILE_ROWS + m] = self.row_scale[s];
                if l.mins {
                    self.min[s * GEMM_TILE_ROWS + m] = self.row_min[s];
                }
            }
        }
        platform::interleave_quads(&self.rows, n_in, &mut self.q);
        false
    }
}

impl WeightTile {
    /// The tile of one interleaved 16-row group (`crate::repack`): quants, scales and mins as
    /// [`WeightTile::fill`] decodes them from the same rows in GGUF order.
    fn fill_from_group(&mut self, ty: GgmlType, n_in: usize, group: &[u8]) {
        #[cfg(target_arch = "x86_64")]
        if gemm_avx512() {
            let out = TileOut {
                q: &mut self.q,
                scale: &mut self.scale,
                min: &mut self.min,
            };
            if platform::fill_from_group_simd(ty, n_in, group, out) {
                return;
            }
        }
        #[cfg(target_arch = "x86_64")]
        if gemm_available() {
            // SAFETY: gemm_available: AVX2, FMA and F16C were detected at run time.
            return unsafe { self.fill_from_group_avx2(ty, n_in, group) };
        }
        self.fill_from_group_portable(ty, n_in, group);
    }

    /// [`WeightTile::fill_from_group_portable`] compiled for AVX2 (its byte loops then take
    /// 32 bytes a step, its f16 scales `vcvtph2ps`): 4% of a prefill on an AVX2-only CPU
    /// before.
    ///
    /// # Safety
    /// AVX2, FMA and F16C are present.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn fill_from_group_avx2(&mut self, ty: GgmlType, n_in: usize, group: &[u8]) {
        self.fill_from_group_with::<true>(ty, n_in, group);
    }

    /// [`WeightTile::fill_from_group`] without SIMD (every type; the AVX-512 fill of the
    /// K-quants and Q8_0 gives the same bytes, checked in the tests).
    fn fill_from_group_portable(&mut self, ty: GgmlType, n_in: usize, group: &[u8]) {
        self.fill_from_group_with::<false>(ty, n_in, group);
    }

    /// The float scales and mins of Q4_K/Q5_K super-block `b` of a group (its bytes `o`), row
    /// by row as ggml unpacks them.
    fn q4_k_scales_portable(&mut self, b: usize, o: &[u8]) {
        let r16 = GEMM_TILE_ROWS;
        for r in 0..r16 {
            let d = rd_f16(o, 2 * r);
            let dmin = rd_f16(o, 32 + 2 * r);
            let w = |i: usize| rd_u32(o, 64 + 64 * i + 4 * r);
            let (sc, mn) = crate::repack::unpack_scales_mins(w(0), w(1), w(2));
            for s in 0..8 {
                self.scale[(8 * b + s) * r16 + r] = d * sc[s] as f32;
                self.min[(8 * b + s) * r16 + r] = dmin * mn[s] as f32;
            }
        }
    }

    /// The portable fill, and with `AVX2` (only where AVX2, FMA and F16C are present) the
    /// same bytes with Q4_K's and Q5_K's scales and mins from [`avx2::q4_k_scales`].
    #[inline(always)]
    fn fill_from_group_with<const AVX2: bool>(&mut self, ty: GgmlType, n_in: usize, group: &[u8]) {
        let r16 = GEMM_TILE_ROWS;
        match ty {
            GgmlType::Q4_K | GgmlType::Q5_K => {
                // Q5_K: Q4_K's fields with 8 words of fifth bits before the quants.
                let q5 = ty == GgmlType::Q5_K;
                let (block, qs) = if q5 { (176, 768) } else { (144, 256) };
                for (b, o) in group.chunks_exact(r16 * block).enumerate().take(n_in / 256) {
                    #[cfg(target_arch = "x86_64")]
                    if AVX2 {
                        let at = 8 * b * r16..8 * (b + 1) * r16;
                        let (scale, min) = (&mut self.scale[at.clone()], &mut self.min[at]);
                        // SAFETY: AVX2, FMA and F16C are present (this function's `AVX2`).
                        unsafe { avx2::q4_k_scales(o, scale, min) };
                    } else {
                        self.q4_k_scales_portable(b, o);
                    }
                    #[cfg(not(target_arch = "x86_64"))]
                    self.q4_k_scales_portable(b, o);
                    for j in 0..4 {
                        for g in 0..8 {
                            let src: &[u8; 64] =
                                o[qs + (8 * j + g) * 64..][..64].try_into().unwrap();
                            let high = &o[256 + 64 * g..][..64];
                            let lo = (64 * b + 16 * j + g) * 64;
                            let (head, tail) = self.q.split_at_mut(lo + 8 * 64);
                            let dl: &mut [u8; 64] = (&mut head[lo..lo + 64]).try_into().unwrap();
                            let dh: &mut [u8; 64] = (&mut tail[..64]).try_into().unwrap();
                            for i in 0..64 {
                                let (h0, h1) = if q5 {
                                    ((high[i] >> (2 * j)) & 1, (high[i] >> (2 * j + 1)) & 1)
                                } else {
                                    (0, 0)
                                };
                                dl[i] = (src[i] & 0xF) | h0 << 4;
                                dh[i] = (src[i] >> 4) | h1 << 4;
                            }
                        }
                    }
                }
            }
            GgmlType::Q6_K => {
                for (b, o) in group.chunks_exact(r16 * 210).enumerate().take(n_in / 256) {
                    let d: [f32; 16] = core::array::from_fn(|r| rd_f16(o, 2 * r));
                    for s in 0..16 {
                        let at = (16 * b + s) * r16;
                        let out = self.scale[at..at + r16].iter_mut().zip(&d);
                        let sc = &o[32 + 16 * s..32 + 16 * s + r16];
                        out.zip(sc)
                            .for_each(|((o, &d), &c)| *o = d * c as i8 as f32);
                    }
                    for n in 0..2 {
                        for g in 0..8 {
                            let step = 288 + (8 * n + g) * 192;
                            let unit =
                                |at: usize| -> [u8; 64] { o[at..at + 64].try_into().unwrap() };
                            let (a, bb, h) = (unit(step), unit(step + 64), unit(step + 128));
                            let mut v = [[0u8; 64]; 4];
                            for i in 0..64 {
                                v[0][i] = (a[i] & 0xF) | ((h[i] & 3) << 4);
                                v[1][i] = (bb[i] & 0xF) | (((h[i] >> 2) & 3) << 4);
                                v[2][i] = (a[i] >> 4) | (((h[i] >> 4) & 3) << 4);
                                v[3][i] = (bb[i] >> 4) | (((h[i] >> 6) & 3) << 4);
                            }
                            for (k, v) in v.iter().enumerate() {
                                let grp = 64 * b + 32 * n + 8 * k + g;
                                self.q[grp * 64..grp * 64 + 64].copy_from_slice(v);
                            }
                        }
                    }
                }
            }
            GgmlType::Q8_0 => {
                for (b, o) in group.chunks_exact(r16 * 34).enumerate().take(n_in / 32) {
                    for r in 0..r16 {
                        self.scale[b * r16 + r] = rd_f16(o, 2 * r);
                    }
                    for g in 0..8 {
                        let src: &[u8; 64] = o[32 + 64 * g..][..64].try_into().unwrap();
                        let at = (8 * b + g) * 64;
                        let dst: &mut [u8; 64] = (&mut self.q[at..at + 64]).try_into().unwrap();
                        for i in 0..64 {
                            dst[i] = src[i] ^ 0x80; // two's complement + 128, as decode_q8_0
                        }
                    }
                }
            }
            GgmlType::Q4_0 | GgmlType::Q5_0 => {
                // Codes (value + 8, or + 16) as decode_q4_0 / decode_q5_0 give them.
                let q5 = ty == GgmlType::Q5_0;
                let block = if q5 { 22 } else { 18 };
                // Unit g of the quants holds bytes 4g..4g+4 of every row, in the tile's order:
                // its low nibbles are elements 4g.. (tile group g of the block), its high ones
                // 16 + 4g.. (group 4 + g); Q5_0's fifth bit e of a row's word goes to element e.
                let qs = if q5 { 96 } else { 32 };
                for (b, o) in group.chunks_exact(r16 * block).enumerate().take(n_in / 32) {
                    for r in 0..r16 {
                        self.scale[b * r16 + r] = rd_f16(o, 2 * r);
                    }
                    let high: [u32; 16] =
                        core::array::from_fn(|r| if q5 { rd_u32(o, 32 + 4 * r) } else { 0 });
                    for g in 0..4 {
                        let src: &[u8; 64] = o[qs + 64 * g..][..64].try_into().unwrap();
                        let at = (8 * b + g) * 64;
                        let (lo, hi) = self.q[at..at + 5 * 64].split_at_mut(4 * 64);
                        for i in 0..64 {
                            let (r, e) = (i / 4, 4 * g + i % 4);
                            let h0 = ((high[r] >> e) & 1) as u8;
                            let h1 = ((high[r] >> (16 + e)) & 1) as u8;
                            // Q4_0's codes are the nibbles (value + 8); Q5_0's take the
                            // fifth bit too (value + 16).
                            lo[i] = (src[i] & 0xF) | h0 << 4;
                            hi[i] = (src[i] >> 4) | h1 << 4;
                        }
                    }
                }
            }
            _ => unreachable!("gemm_q8_interleaved checked the type has an interleaved layout"),
        }
    }
}

/// A tile as [`gemm_q8`] multiplies it (see [`gemm_decode_tile`]).
#[doc(hidden)]
pub struct DecodedTile {
    /// `[n_in/4][16 rows][4]` unsigned bytes (the values plus the layout's offset).
    pub q: Vec<u8>,
    /// `[sub-block][16 rows]`.
    pub scale: Vec<f32>,
    /// `[sub-block][16 rows]`, empty for layouts without mins.
    pub min: Vec<f32>,
    /// Whether the type's whole-tile decoder made it (rather than its row decoder).
    pub by_tile_decoder: bool,
}

/// The tile [`gemm_q8`] multiplies for `rows` (at most 16 rows of type `ty`, `n_in` values
/// each; missing rows are zeros), decoded by the type's whole-tile decoder where
/// `tile_decoder` is set and it has one that runs here, otherwise by its row decoder. `None`
/// where `gemm_q8` does not take `ty` with `n_in` or `rows` is not whole rows. For tests: the
/// two decoders must give the same tile.
#[doc(hidden)]
pub fn gemm_decode_tile(
    ty: GgmlType,
    n_in: usize,
    rows: &[u8],
    tile_decoder: bool,
) -> Option<DecodedTile> {
    let mut l = layout(ty)?;
    let row_bytes = ty.row_bytes(n_in as u64)? as usize;
    if !gemm_supports(ty, n_in)
        || !rows.len().is_multiple_of(row_bytes)
        || rows.len() > GEMM_TILE_ROWS * row_bytes
    {
        return None;
    }
    if !tile_decoder {
        l.unpack_tile = None;
    }
    let mut t = WeightTile::new(l, n_in);
    let by_tile_decoder = t.fill(l, n_in, rows, row_bytes);
    Some(DecodedTile {
        q: t.q,
        scale: t.scale,
        min: t.min,
        by_tile_decoder,
    })
}

/// `q[(g*16 + m)*4 + i] = rows[m*n_in + 4*g + i]`: groups of four bytes of 16 rows side by side.
fn interleave_quads_scalar(rows: &[u8], n_in: usize, q: &mut [u8]) {
    for (m, row) in rows.chunks_exact(n_in).enumerate() {
        for (g, quad) in row.chunks_exact(4).enumerate() {
            let o = (g * GEMM_TILE_ROWS + m) * 4;
            q[o..o + 4].copy_from_slice(quad);
        }
    }
}

/// `out[tile][t][i] = W[16*tile + i] · x[t]` for the weight rows in `rows` (type `ty`, `n_in`
/// elements each) and every token of `acts`: `out` holds, per 16-row tile, `n_tok` runs of 16
/// results (rows past the end of `rows` are zero). Returns `false` and leaves `out` alone if
/// the path is unavailable or the inputs do not fit ([`gemm_supports`], [`GemmActs::new`] for
/// the weight type's activation type). `next` (may be empty) is prefetched while the last
/// tile computes: the weight bytes the caller reads next, e.g. the following rows of the same
/// matrix, so that the copy starting each tile does not wait on memory.
pub fn gemm_q8(
    ty: GgmlType,
    n_in: usize,
    rows: &[u8],
    acts: &GemmActs,
    out: &mut [f32],
    next: &[u8],
) -> bool {
    gemm_q8_rows(ty, n_in, rows, acts, out, next, false)
}

/// [`gemm_q8`] for rows interleaved 16 at a time (`crate::repack`; whole groups of 16): each
/// tile comes straight from a group, with the same values as from the rows in GGUF order.
pub fn gemm_q8_interleaved(
    ty: GgmlType,
    n_in: usize,
    groups: &[u8],
    acts: &GemmActs,
    out: &mut [f32],
    next: &[u8],
) -> bool {
    let Some(row_bytes) = ty.row_bytes(n_in as u64) else {
        return false;
    };
    crate::repack::repack_supports(ty, GEMM_TILE_ROWS, n_in)
        && groups
            .len()
            .is_multiple_of(GEMM_TILE_ROWS * row_bytes as usize)
        && gemm_q8_rows(ty, n_in, groups, acts, out, next, true)
}

fn gemm_q8_rows(
    ty: GgmlType,
    n_in: usize,
    rows: &[u8],
    acts: &GemmActs,
    out: &mut [f32],
    next: &[u8],
    interleaved: bool,
) -> bool {
    let Some(l) = layout(ty) else { return false };
    let Some(row_bytes) = ty.row_bytes(n_in as u64).map(|b| b as usize) else {
        return false;
    };
    let n_rows = rows.len().checked_div(row_bytes).unwrap_or(0);
    let n_tiles = n_rows.div_ceil(GEMM_TILE_ROWS);
    if !gemm_available()
        || l.act != acts.act
        || n_in != acts.n_in
        || !rows.len().is_multiple_of(row_bytes)
        || out.len() != n_tiles * acts.n_tok * GEMM_TILE_ROWS
    {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    if interleaved && ty == GgmlType::Q8_0 && acts.tiled {
        // SAFETY: AMX-INT8 and AVX-512 were detected (`acts.tiled`: int8_available); the
        // groups are whole 16-row groups of `n_in` values (checked by the caller), `out` holds
        // n_tiles * n_tok * 16 floats (checked above) and the activations have their tiles.
        unsafe { platform::q8_0_groups_amx(n_in, rows, acts, out, next) };
        return true;
    }
    // The tile buffers are kept per thread: MoE calls this once per (expert, chunk of rows).
    // Two tiles: the kernel runs 32 rows at a time where there are that many, so that each
    // activation load feeds two weight vectors.
    thread_local! {
        static TILES: std::cell::RefCell<Option<[WeightTile; 2]>> =
            const { std::cell::RefCell::new(None) };
    }
    TILES.with_borrow_mut(|slot| {
        let [a, b] = match slot {
            Some(t) if t[0].fits(l, n_in) => t,
            _ => slot.insert([WeightTile::new(l, n_in), WeightTile::new(l, n_in)]),
        };
        let per_tile = acts.n_tok * GEMM_TILE_ROWS;
        let pair_bytes = 2 * GEMM_TILE_ROWS * row_bytes;
        for (i, (w, o)) in rows
            .chunks(pair_bytes)
            .zip(out.chunks_mut(2 * per_tile))
            .enumerate()
        {
            // The next pair's bytes (not the whole rest of the matrix).
            let ahead = rows
                .get((i + 1) * pair_bytes..)
                .map(|r| &r[..r.len().min(pair_bytes)])
                .filter(|r| !r.is_empty());
            let next = ahead.unwrap_or(next);
            let (wa, wb) = w.split_at(w.len().min(GEMM_TILE_ROWS * row_bytes));
            let fill = |t: &mut WeightTile, w: &[u8]| {
                if interleaved {
                    t.fill_from_group(ty, n_in, w);
                } else {
                    t.fill(l, n_in, w, row_bytes);
                }
            };
            fill(a, wa);
            if wb.is_empty() {
                platform::tiles_times_tokens(l, n_in, [&*a], acts, [o], next);
            } else {
                fill(b, wb);
                let (oa, ob) = o.split_at_mut(per_tile);
                platform::tiles_times_tokens(l, n_in, [&*a, &*b], acts, [oa, ob], next);
            }
        }
    });
    true
}

#[cfg(target_arch = "x86_64")]
pub(crate) use platform::{lane_byte, q6_k_quads, unpack_tile_q4_k, unpack_tile_q6_k};

#[cfg(target_arch = "x86_64")]
mod platform {
    use std::arch::x86_64::*;

    use super::{GemmActs, Layout, WeightTile, GEMM_TILE_ROWS};

    pub(super) fn interleave_quads(rows: &[u8], n_in: usize, q: &mut [u8]) {
        assert!(
            rows.len() == GEMM_TILE_ROWS * n_in && q.len() == rows.len() && n_in.is_multiple_of(4)
        );
        assert!(n_in <= i32::MAX as usize / GEMM_TILE_ROWS);
        if !super::gemm_avx512() {
            return super::interleave_quads_scalar(rows, n_in, q);
        }
        // SAFETY: AVX-512F is present (gemm_avx512) and the lengths were asserted above.
        unsafe { interleave_avx512(rows, n_in, q) }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn interleave_avx512(rows: &[u8], n_in: usize, q: &mut [u8]) {
        let offsets = _mm512_mullo_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32(n_in as i32),
        );
        for g in 0..n_in / 4 {
            // SAFETY: gathered offsets m*n_in + 4g + 3 < 16*n_in = rows.len(); the store
            // writes q[64g..64g+64] with 64g + 64 <= 16*n_in = q.len() (caller asserted).
            unsafe {
                let v = _mm512_i32gather_epi32::<1>(offsets, rows.as_ptr().add(4 * g).cast());
                _mm512_storeu_si512(q.as_mut_ptr().add(64 * g).cast(), v);
            }
        }
    }

    /// Q4_K or Q6_K rows (`n_rows <= 16` of `row_bytes`, `n_in` elements each) unpacked into
    /// the tile in one pass, from 4-byte gathers of the 16 rows: the quants in the interleaved
    /// layout of [`super::interleave_quads_scalar`], the scales and mins as `[sub-block][row]`
    /// floats (what the row decoders give, transposed). Missing rows are zero. Returns `false`
    /// (tile untouched) without AVX-512. The rows are copied into `scratch` first and gathered
    /// from there: one sequential read streams from memory, while gathers across 16 cold rows
    /// wait on 16 cache misses each.
    pub(crate) fn unpack_tile_q4_k(
        rows_in: &[u8],
        n_rows: usize,
        row_bytes: usize,
        n_in: usize,
        scratch: &mut [u8],
        out: super::TileOut,
    ) -> bool {
        unpack_tile(144, rows_in, n_rows, row_bytes, n_in, scratch, out)
    }

    /// [`unpack_tile_q4_k`] for Q6_K.
    pub(crate) fn unpack_tile_q6_k(
        rows_in: &[u8],
        n_rows: usize,
        row_bytes: usize,
        n_in: usize,
        scratch: &mut [u8],
        out: super::TileOut,
    ) -> bool {
        unpack_tile(210, rows_in, n_rows, row_bytes, n_in, scratch, out)
    }

    /// Q4_K (`block` 144 bytes) or Q6_K (210) rows into the tile.
    fn unpack_tile(
        block: usize,
        rows_in: &[u8],
        n_rows: usize,
        row_bytes: usize,
        n_in: usize,
        scratch: &mut [u8],
        out: super::TileOut,
    ) -> bool {
        if !super::gemm_avx512() {
            return false;
        }
        assert!(n_rows <= GEMM_TILE_ROWS && rows_in.len() == n_rows * row_bytes);
        assert!(scratch.len() >= rows_in.len());
        assert!(n_in.is_multiple_of(256) && row_bytes == n_in / 256 * block);
        assert!(out.q.len() == GEMM_TILE_ROWS * n_in);
        // Sub-blocks of 32 (Q4_K, with mins) or 16 (Q6_K) values.
        let n_sub = if block == 144 { n_in / 32 } else { n_in / 16 };
        assert!(out.scale.len() == n_sub * GEMM_TILE_ROWS);
        assert!(block == 210 || out.min.len() == n_sub * GEMM_TILE_ROWS);
        assert!(row_bytes <= i32::MAX as usize / GEMM_TILE_ROWS);
        let rows = &mut scratch[..rows_in.len()];
        rows.copy_from_slice(rows_in);
        // SAFETY: AVX-512F is present (gemm_avx512) and the sizes were asserted above.
        unsafe {
            if block == 144 {
                unpack_q4_k_avx512(rows, n_rows, row_bytes, n_in, out)
            } else {
                unpack_q6_k_avx512(rows, n_rows, row_bytes, n_in, out)
            }
        };
        true
    }

    /// Byte `i` of every 32-bit lane, zero-extended.
    #[target_feature(enable = "avx512f")]
    pub(crate) fn lane_byte(v: __m512i, i: u32) -> __m512i {
        _mm512_and_si512(
            _mm512_srlv_epi32(v, _mm512_set1_epi32(8 * i as i32)),
            _mm512_set1_epi32(0xFF),
        )
    }

    /// The f16 in the low (`shift` 0) or high (`shift` 16) half of every lane, as f32.
    #[target_feature(enable = "avx512f")]
    fn lane_f16(v: __m512i, shift: u32) -> __m512 {
        let halves = _mm512_srlv_epi32(v, _mm512_set1_epi32(shift as i32));
        _mm512_cvtph_ps(_mm512_cvtepi32_epi16(halves))
    }

    /// `out[16s..16s+16] = v` (sub-block `s`, one float per row).
    ///
    /// # Safety
    /// AVX-512F; `16 * s + 16 <= out.len()`.
    #[target_feature(enable = "avx512f")]
    unsafe fn store_sub(out: &mut [f32], s: usize, v: __m512) {
        debug_assert!(16 * s + 16 <= out.len());
        // SAFETY: per the function's contract.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(16 * s), v) }
    }

    /// Lane `m` gathers 4 bytes at `at` of row `m` (rows past `n_rows` read nothing, give 0).
    ///
    /// # Safety
    /// AVX-512F; `at + 4 <= row_bytes` and `rows` holds `n_rows` rows of `row_bytes`.
    #[target_feature(enable = "avx512f")]
    unsafe fn gather_rows(rows: &[u8], live: __mmask16, offsets: __m512i, at: usize) -> __m512i {
        // SAFETY: per the function's contract.
        unsafe {
            _mm512_mask_i32gather_epi32::<1>(
                _mm512_setzero_si512(),
                live,
                offsets,
                rows.as_ptr().add(at).cast(),
            )
        }
    }

    /// `q[64g..64g+64] = v` (group `g` of the tile).
    ///
    /// # Safety
    /// AVX-512F; `64 * g + 64 <= q.len()`.
    #[target_feature(enable = "avx512f")]
    unsafe fn store_group(q: &mut [u8], g: usize, v: __m512i) {
        debug_assert!(64 * g + 64 <= q.len());
        // SAFETY: per the function's contract.
        unsafe { _mm512_storeu_si512(q.as_mut_ptr().add(64 * g).cast(), v) }
    }

    fn tile_lanes(n_rows: usize, row_bytes: usize) -> (__mmask16, __m512i) {
        let live: __mmask16 = if n_rows >= 16 {
            0xFFFF
        } else {
            (1u16 << n_rows) - 1
        };
        let mut offs = [0i32; 16];
        for (m, o) in offs.iter_mut().enumerate() {
            *o = (m * row_bytes) as i32;
        }
        // SAFETY: reading 16 i32 from a 16-element array.
        (live, unsafe { _mm512_loadu_si512(offs.as_ptr().cast()) })
    }

    /// One Q4_K block's scales and mins of 16 rows (`get_scale_min_k4` on 16 lanes): `d`,
    /// `dmin` per row, `words` the three 32-bit scale words per row; writes sub-blocks
    /// `8b..8b+8` of `scale` and `min`.
    ///
    /// # Safety
    /// AVX-512F; `16 * (8 * b + 8) <= scale.len(), min.len()`.
    #[target_feature(enable = "avx512f")]
    unsafe fn store_q4_k_scales(
        d: __m512,
        dmin: __m512,
        words: [__m512i; 3],
        b: usize,
        scale: &mut [f32],
        min: &mut [f32],
    ) {
        let [s0, s1, s2] = words;
        let m6 = _mm512_set1_epi32(63);
        let low4 = _mm512_set1_epi32(0xF);
        for j in 0..4u32 {
            let (a, m, c) = (lane_byte(s0, j), lane_byte(s1, j), lane_byte(s2, j));
            let sc_lo = _mm512_and_si512(a, m6);
            let mn_lo = _mm512_and_si512(m, m6);
            let hi2 = |v: __m512i| _mm512_slli_epi32::<4>(_mm512_srli_epi32::<6>(v));
            let sc_hi = _mm512_or_si512(_mm512_and_si512(c, low4), hi2(a));
            let mn_hi = _mm512_or_si512(_mm512_srli_epi32::<4>(c), hi2(m));
            let sb = 8 * b + j as usize;
            let f = _mm512_cvtepi32_ps;
            // SAFETY: sb + 4 < 8 * b + 8 (the function's contract).
            unsafe {
                store_sub(scale, sb, _mm512_mul_ps(d, f(sc_lo)));
                store_sub(min, sb, _mm512_mul_ps(dmin, f(mn_lo)));
                store_sub(scale, sb + 4, _mm512_mul_ps(d, f(sc_hi)));
                store_sub(min, sb + 4, _mm512_mul_ps(dmin, f(mn_hi)));
            }
        }
    }

    /// Q6_K's four groups of 6-bit codes from low-nibble units `a`, `c` and the high-bit unit
    /// `h` (any unit width: every shift is masked back to its own byte), as `q6_k_quants`
    /// assembles elements l, l + 32, l + 64 and l + 96.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) fn q6_k_quads(a: __m512i, c: __m512i, h: __m512i) -> [__m512i; 4] {
        let lo = |v: __m512i| _mm512_and_si512(v, _mm512_set1_epi32(0x0F0F_0F0F));
        let hi = |v: __m512i| _mm512_and_si512(v, _mm512_set1_epi32(0x3030_3030));
        [
            _mm512_or_si512(lo(a), hi(_mm512_slli_epi32::<4>(h))),
            _mm512_or_si512(lo(c), hi(_mm512_slli_epi32::<2>(h))),
            _mm512_or_si512(lo(_mm512_srli_epi32::<4>(a)), hi(h)),
            _mm512_or_si512(lo(_mm512_srli_epi32::<4>(c)), hi(_mm512_srli_epi32::<2>(h))),
        ]
    }

    /// Each 4-byte gather holds the low nibbles of one group of 4 elements and the high
    /// nibbles of the group 32 elements on.
    #[target_feature(enable = "avx512f")]
    unsafe fn unpack_q4_k_avx512(
        rows: &[u8],
        n_rows: usize,
        row_bytes: usize,
        n_in: usize,
        out: super::TileOut,
    ) {
        let (live, offsets) = tile_lanes(n_rows, row_bytes);
        let q = out.q;
        let m4 = _mm512_set1_epi32(0x0F0F_0F0F);
        for b in 0..n_in / 256 {
            // SAFETY: bytes b*144 .. b*144 + 16 (d, dmin and the 12 scale bytes) of live rows;
            // sub-blocks 8b..8b+8 are below n_in / 32.
            unsafe {
                let head = gather_rows(rows, live, offsets, b * 144);
                let (d, dmin) = (lane_f16(head, 0), lane_f16(head, 16));
                let s0 = gather_rows(rows, live, offsets, b * 144 + 4);
                let s1 = gather_rows(rows, live, offsets, b * 144 + 8);
                let s2 = gather_rows(rows, live, offsets, b * 144 + 12);
                store_q4_k_scales(d, dmin, [s0, s1, s2], b, out.scale, out.min);
            }
            for j in 0..4 {
                for i in 0..8 {
                    let g = 64 * b + 16 * j + i;
                    // SAFETY: the gather reads bytes b*144 + 16 + 32j + 4i .. +4 <= row_bytes
                    // of live rows; groups g and g + 8 are below n_in / 4 = q.len() / 64.
                    unsafe {
                        let v = gather_rows(rows, live, offsets, b * 144 + 16 + 32 * j + 4 * i);
                        store_group(q, g, _mm512_and_si512(v, m4));
                        store_group(q, g + 8, _mm512_and_si512(_mm512_srli_epi32::<4>(v), m4));
                    }
                }
            }
        }
    }

    /// Per half block and 4 positions `l`: ql[l], ql[l + 32] and qh[l] give the groups of
    /// elements l, l + 32, l + 64 and l + 96 (as `q6_k_quants` assembles them).
    #[target_feature(enable = "avx512f")]
    unsafe fn unpack_q6_k_avx512(
        rows: &[u8],
        n_rows: usize,
        row_bytes: usize,
        n_in: usize,
        out: super::TileOut,
    ) {
        let (live, offsets) = tile_lanes(n_rows, row_bytes);
        let q = out.q;
        for b in 0..n_in / 256 {
            // SAFETY: bytes b*210 + 192 .. b*210 + 210 (16 i8 scales, then d) of live rows;
            // sub-blocks 16b..16b+16 are below n_in / 16.
            unsafe {
                // d is the high half of the 4 bytes ending the block.
                let d = lane_f16(gather_rows(rows, live, offsets, b * 210 + 206), 16);
                for k in 0..4u32 {
                    let v = gather_rows(rows, live, offsets, b * 210 + 192 + 4 * k as usize);
                    for i in 0..4u32 {
                        // Byte i of the lane, sign-extended.
                        let sc = _mm512_srai_epi32::<24>(_mm512_sllv_epi32(
                            v,
                            _mm512_set1_epi32(24 - 8 * i as i32),
                        ));
                        let sb = 16 * b + (4 * k + i) as usize;
                        store_sub(out.scale, sb, _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc)));
                    }
                }
            }
            for half in 0..2 {
                let ql = b * 210 + 64 * half;
                let qh = b * 210 + 128 + 32 * half;
                for i in 0..8 {
                    let g = 64 * b + 32 * half + i;
                    // SAFETY: the gathers read within the block's ql (128 bytes) and qh (64
                    // bytes) of live rows; groups up to g + 24 < 64 * (b + 1) <= q.len() / 64.
                    unsafe {
                        let a = gather_rows(rows, live, offsets, ql + 4 * i);
                        let c = gather_rows(rows, live, offsets, ql + 32 + 4 * i);
                        let h = gather_rows(rows, live, offsets, qh + 4 * i);
                        for (k, v) in q6_k_quads(a, c, h).into_iter().enumerate() {
                            store_group(q, g + 8 * k, v);
                        }
                    }
                }
            }
        }
    }

    /// [`super::WeightTile::fill_from_group`] for Q4_K, Q5_K, Q6_K, Q8_0, Q4_0 and Q5_0 on
    /// AVX-512: the
    /// interleaved group already holds each field for the 16 rows side by side (a lane per
    /// row), so scales are 16-lane vector products and quants are masks and shifts of 64-byte
    /// units; the same values as the portable fill, bit for bit. `false` (nothing written)
    /// for the other types.
    pub(super) fn fill_from_group_simd(
        ty: crate::GgmlType,
        n_in: usize,
        group: &[u8],
        out: super::TileOut,
    ) -> bool {
        let (elems, block, n_sub, mins) = match ty {
            crate::GgmlType::Q4_K => (256, crate::repack::Q4K_GROUP_BLOCK, n_in / 32, true),
            crate::GgmlType::Q5_K => (256, crate::repack::Q5K_GROUP_BLOCK, n_in / 32, true),
            crate::GgmlType::Q6_K => (256, crate::repack::Q6K_GROUP_BLOCK, n_in / 16, false),
            crate::GgmlType::Q8_0 => (32, crate::repack::Q8_0_GROUP_BLOCK, n_in / 32, false),
            crate::GgmlType::Q4_0 => (32, crate::repack::Q4_0_GROUP_BLOCK, n_in / 32, false),
            crate::GgmlType::Q5_0 => (32, crate::repack::Q5_0_GROUP_BLOCK, n_in / 32, false),
            _ => return false,
        };
        let nb = n_in / elems;
        assert!(super::gemm_avx512() && group.len() >= nb * block);
        assert!(out.q.len() >= GEMM_TILE_ROWS * n_in && out.scale.len() >= n_sub * 16);
        assert!(!mins || out.min.len() >= n_sub * 16);
        // SAFETY: AVX-512 F/BW is present (gemm_avx512); the group holds `nb` blocks and
        // the tile `n_in` columns of 16 rows (asserted above), which bound every access.
        unsafe {
            match ty {
                crate::GgmlType::Q4_K => fill_group_q4_k::<false>(nb, group, out),
                crate::GgmlType::Q5_K => fill_group_q4_k::<true>(nb, group, out),
                crate::GgmlType::Q6_K => fill_group_q6_k(nb, group, out),
                crate::GgmlType::Q4_0 => fill_group_q4_0::<false>(nb, group, out),
                crate::GgmlType::Q5_0 => fill_group_q4_0::<true>(nb, group, out),
                _ => fill_group_q8_0(nb, group, out),
            }
        }
        true
    }

    /// 64 bytes at `at` of `s`.
    ///
    /// # Safety
    /// AVX-512F; `at + 64 <= s.len()`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn ld64(s: &[u8], at: usize) -> __m512i {
        debug_assert!(at + 64 <= s.len());
        // SAFETY: per the function's contract.
        unsafe { _mm512_loadu_si512(s.as_ptr().add(at).cast()) }
    }

    /// 16 f16 at `at` of `s` as f32.
    ///
    /// # Safety
    /// AVX-512F; `at + 32 <= s.len()`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn ld_f16x16(s: &[u8], at: usize) -> __m512 {
        debug_assert!(at + 32 <= s.len());
        // SAFETY: per the function's contract.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(s.as_ptr().add(at).cast())) }
    }

    /// Q4_K (`Q5`: Q5_K) groups: per block d, dmin and the three scale words of the 16 rows
    /// (`crate::repack`'s layout), then 32 quant units whose low and high nibbles are
    /// sub-blocks 2j and 2j + 1 (Q5_K: plus bit 2j / 2j + 1 of the fifth-bit units).
    ///
    /// # Safety
    /// AVX-512F/BW; `group` holds `nb` blocks; the tile has `256 * nb` columns.
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn fill_group_q4_k<const Q5: bool>(nb: usize, group: &[u8], out: super::TileOut) {
        let (block, qs) = if Q5 {
            (crate::repack::Q5K_GROUP_BLOCK, 768)
        } else {
            (crate::repack::Q4K_GROUP_BLOCK, 256)
        };
        let q = out.q;
        let m4 = _mm512_set1_epi8(0x0F);
        let b4 = _mm512_set1_epi8(0x10);
        for b in 0..nb {
            let o = &group[b * block..(b + 1) * block];
            // SAFETY (this block): every offset is inside the block (`o`), every sub-block
            // below 8 * nb and every tile group below 64 * nb (the caller's contract).
            unsafe {
                let (d, dmin) = (ld_f16x16(o, 0), ld_f16x16(o, 32));
                let (s0, s1, s2) = (ld64(o, 64), ld64(o, 128), ld64(o, 192));
                store_q4_k_scales(d, dmin, [s0, s1, s2], b, out.scale, out.min);
                for j in 0..4 {
                    for g in 0..8 {
                        let v = ld64(o, qs + (8 * j + g) * 64);
                        let mut lo = _mm512_and_si512(v, m4);
                        let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4);
                        if Q5 {
                            // Bits 2j and 2j + 1 of each byte, moved to bit 4.
                            let h = _mm512_srl_epi16(
                                ld64(o, 256 + 64 * g),
                                _mm_cvtsi32_si128(2 * j as i32),
                            );
                            lo = _mm512_or_si512(
                                lo,
                                _mm512_and_si512(_mm512_slli_epi16::<4>(h), b4),
                            );
                            hi = _mm512_or_si512(
                                hi,
                                _mm512_and_si512(_mm512_slli_epi16::<3>(h), b4),
                            );
                        }
                        let at = 64 * b + 16 * j + g;
                        store_group(q, at, lo);
                        store_group(q, at + 8, hi);
                    }
                }
            }
        }
    }

    /// Q8_0 groups: per block of 32 the 16 rows' d, then 8 units of quants, stored with the
    /// +128 offset the tile's unsigned bytes carry (as `decode_q8_0`).
    ///
    /// # Safety
    /// AVX-512F; `group` holds `nb` blocks; the tile has `32 * nb` columns.
    #[target_feature(enable = "avx512f")]
    unsafe fn fill_group_q8_0(nb: usize, group: &[u8], out: super::TileOut) {
        let block = crate::repack::Q8_0_GROUP_BLOCK;
        let flip = _mm512_set1_epi32(0x8080_8080_u32 as i32);
        for b in 0..nb {
            let o = &group[b * block..(b + 1) * block];
            // SAFETY: offsets inside the block; sub-block b and tile groups 8b..8b+8 are
            // inside the tile (the caller's contract).
            unsafe {
                store_sub(out.scale, b, ld_f16x16(o, 0));
                for g in 0..8 {
                    store_group(
                        out.q,
                        8 * b + g,
                        _mm512_xor_si512(ld64(o, 32 + 64 * g), flip),
                    );
                }
            }
        }
    }

    /// Q4_0 (`Q5`: Q5_0) groups: per block of 32 the 16 rows' d, (Q5_0) their fifth-bit
    /// words, then 4 units of quant words whose low and high nibbles are elements 4u..4u+4 and
    /// 16+4u..16+4u+4; stored as the codes (value + 8, or + 16) `legacy_codes` gives.
    ///
    /// # Safety
    /// AVX-512F/BW; `group` holds `nb` blocks; the tile has `32 * nb` columns.
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn fill_group_q4_0<const Q5: bool>(nb: usize, group: &[u8], out: super::TileOut) {
        let block = if Q5 {
            crate::repack::Q5_0_GROUP_BLOCK
        } else {
            crate::repack::Q4_0_GROUP_BLOCK
        };
        for b in 0..nb {
            let o = &group[b * block..(b + 1) * block];
            // SAFETY: offsets inside the block; sub-block b and tile groups 8b..8b+8 are
            // inside the tile (the caller's contract). `legacy_unit_codes` needs the AVX-512
            // level's features, which `gemm_avx512` (the caller's check) means.
            unsafe {
                store_sub(out.scale, b, ld_f16x16(o, 0));
                let qh = if Q5 {
                    ld64(o, 32)
                } else {
                    _mm512_setzero_si512()
                };
                for u in 0..4 {
                    let [lo, hi] = crate::repack::legacy_unit_codes::<Q5>(o, qh, u);
                    store_group(out.q, 8 * b + u, lo);
                    store_group(out.q, 8 * b + 4 + u, hi);
                }
            }
        }
    }

    /// Q6_K groups: per block d and the 16 i8 scales of the 16 rows per sub-block, then per
    /// half and unit the low-nibble units `a`, `b` and the high-bit unit `h` of four groups.
    ///
    /// # Safety
    /// AVX-512F/BW; `group` holds `nb` blocks; the tile has `256 * nb` columns.
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn fill_group_q6_k(nb: usize, group: &[u8], out: super::TileOut) {
        let block = crate::repack::Q6K_GROUP_BLOCK;
        let q = out.q;
        for b in 0..nb {
            let o = &group[b * block..(b + 1) * block];
            // SAFETY (this block): as in fill_group_q4_k.
            unsafe {
                let d = ld_f16x16(o, 0);
                for s in 0..16 {
                    let sc: &[u8; 16] = o[32 + 16 * s..48 + 16 * s].try_into().unwrap();
                    let sc = _mm512_cvtepi8_epi32(_mm_loadu_si128(sc.as_ptr().cast()));
                    store_sub(
                        out.scale,
                        16 * b + s,
                        _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc)),
                    );
                }
                for n in 0..2 {
                    for g in 0..8 {
                        let step = 288 + (8 * n + g) * 192;
                        let (a, bb, h) = (ld64(o, step), ld64(o, step + 64), ld64(o, step + 128));
                        for (k, v) in q6_k_quads(a, bb, h).into_iter().enumerate() {
                            store_group(q, 64 * b + 32 * n + 8 * k + g, v);
                        }
                    }
                }
            }
        }
    }

    /// `R` tiles (1 or 2) times every token of `acts`: `out[r]` receives tile `r`'s `n_tok`
    /// runs of 16 results. Prefetches `next` along the way.
    pub(super) fn tiles_times_tokens<const R: usize>(
        l: Layout,
        n_in: usize,
        w: [&WeightTile; R],
        acts: &GemmActs,
        mut out: [&mut [f32]; R],
        next: &[u8],
    ) {
        if !super::gemm_avx512() {
            // SAFETY: `gemm_available()` (checked by the caller) without the AVX-512 level
            // means the AVX2 level: AVX2, FMA and F16C; the sizes were checked by the caller.
            return unsafe { super::avx2::tiles_times_tokens(l, n_in, w, acts, out, next) };
        }
        // Passes of up to 8 (one tile) or 6 (two tiles) tokens: 8 or 12 independent chains of
        // `vpdpbusd`, whose latency (5 cycles) 8 chains cannot hide where the CPU issues two a
        // cycle (Sapphire Rapids and later).
        let full = if R == 2 { 6 } else { 8 };
        // `next`'s cache lines, spread over the passes, and within a pass over its
        // sub-blocks: a burst of prefetches to DRAM at the start of a pass stalls once the
        // core's line fill buffers are all taken.
        let per_pass = next.len().div_ceil(64 * acts.n_tok.div_ceil(full).max(1)) * 64;
        let mut ahead = next.chunks(per_pass.max(64));
        let mut t = 0;
        while t < acts.n_tok {
            let pf = ahead.next().unwrap_or(&[]);
            let left = acts.n_tok - t;
            let o = out.each_mut().map(|o| &mut o[t * GEMM_TILE_ROWS..]);
            // SAFETY: `gemm_avx512()` (checked above) means AVX-512 F/BW/VNNI.
            unsafe {
                t += if l.sub == 16 {
                    pass::<R, 16>(l, n_in, w, acts, t, o, left, pf)
                } else {
                    pass::<R, 32>(l, n_in, w, acts, t, o, left, pf)
                };
            }
        }
    }

    /// One block's product on AMX tiles: C = the 16 tokens' block at `xa` (512 bytes, the
    /// tiled activations' layout) times the interleaved Q8_0 group block at `gb`, its sums
    /// stored at `sums`.
    ///
    /// # Safety
    /// Tiles configured as `TileConfig::INT8_BLOCKS`; 512 bytes readable at `xa`; a whole
    /// group block at `gb`; 1 KiB writable at `sums`.
    #[inline(always)]
    unsafe fn amx_block<const C: u8, const A: u8, const B: u8>(
        xa: *const u8,
        gb: *const u8,
        sums: *mut i32,
    ) {
        use crate::amx::{dp_s8, load, store, zero};
        // SAFETY: the caller's contract; the quants of a group block follow its 32 bytes of
        // scales as 8 rows of 64 bytes (B's layout).
        unsafe {
            zero::<C>();
            load::<A>(xa, 32);
            load::<B>(gb.add(32), 64);
            dp_s8::<C, A, B>();
            store::<C>(sums.cast(), 64);
        }
    }

    /// `out` = the interleaved Q8_0 `groups` (whole groups of 16 rows of `n_in` values) times
    /// the Q8_0 activations `acts`, on AMX-INT8 tiles: per group and 16 tokens, one
    /// `tdpbssd` per 32-value block reads the group's signed quants in place (no tile fill,
    /// no offset to take back), and its 16 x 16 integer sums are scaled with AVX-512
    /// (`d_w · d_x`, as ggml) two blocks behind the products, into one accumulator of 16
    /// rows per token. Laid out as the VNNI kernel's results: per group, `[token][16 rows]`.
    /// The lines of the group after next (past the last, the caller's `next`) are asked for
    /// into L2 during the group's products: the tile loads run in order, so one that waits
    /// on memory holds up every product behind it.
    ///
    /// # Safety
    /// AMX-INT8 and AVX-512 F/BW (`crate::amx::int8_available`); `groups` whole groups of
    /// `n_in` values; `out` n_groups * n_tok * 16 floats; `acts` tiled.
    #[target_feature(enable = "avx512f,avx512bw,f16c")]
    pub(super) unsafe fn q8_0_groups_amx(
        n_in: usize,
        groups: &[u8],
        acts: &GemmActs,
        out: &mut [f32],
        next: &[u8],
    ) {
        let nb = n_in / 32;
        let group_bytes = nb * crate::repack::Q8_0_GROUP_BLOCK;
        let n_tok = acts.n_tok;
        assert!(groups.len().is_multiple_of(group_bytes) && acts.n_blk == nb);
        assert!(out.len() == groups.len() / group_bytes * n_tok * GEMM_TILE_ROWS);
        assert!(acts.tiled && acts.buf.tiles.len() >= n_tok.next_multiple_of(16) * n_in);
        assert!(acts.buf.dx.len() >= n_tok.next_multiple_of(16) * nb);
        // SAFETY: AMX-INT8 is available (the caller's contract).
        unsafe { crate::amx::configure(&crate::amx::TileConfig::INT8_BLOCKS) };
        let mut sums = std::mem::MaybeUninit::<AmxSums>::uninit();
        let n_groups = groups.len() / group_bytes;
        for (i, (g, o)) in groups
            .chunks_exact(group_bytes)
            .zip(out.chunks_exact_mut(n_tok * GEMM_TILE_ROWS))
            .enumerate()
        {
            let ahead = match groups.get((i + 2) * group_bytes..(i + 3) * group_bytes) {
                Some(next_group) => next_group,
                None => {
                    let k = i + 2 - n_groups;
                    next.get(k * group_bytes..(k + 1) * group_bytes)
                        .unwrap_or(&[])
                }
            };
            // Two groups ahead, spread over every tile of tokens: 5-10% faster from DRAM
            // (`batch64_gemm_interleaved_dram` at rows of 1536) than the next group during
            // the first tile alone.
            let per_tile = ahead.len().div_ceil(64 * n_tok.div_ceil(16)) * 64;
            let mut ahead = ahead.chunks(per_tile.max(64));
            for t0 in (0..n_tok).step_by(16) {
                let pf = ahead.next().unwrap_or(&[]);
                let m = (n_tok - t0).min(16);
                let o = &mut o[t0 * GEMM_TILE_ROWS..(t0 + m) * GEMM_TILE_ROWS];
                // 16 tokens' scales, the padding's among them.
                let dx = &acts.buf.dx[t0 * nb..(t0 + 16) * nb];
                // SAFETY: per this function's contract and the asserts above: the tokens'
                // rows from t0 on (16 of them with the padding) and their scales.
                unsafe {
                    let x = acts.buf.tiles.as_ptr().add(t0 * n_in);
                    // The scaling costs what its rows do: the last tokens scale a multiple
                    // of 4 rows.
                    match m {
                        13.. => amx_tokens::<16>(nb, g, x, dx, o, pf, &mut sums),
                        9..=12 => amx_tokens::<12>(nb, g, x, dx, o, pf, &mut sums),
                        5..=8 => amx_tokens::<8>(nb, g, x, dx, o, pf, &mut sums),
                        _ => amx_tokens::<4>(nb, g, x, dx, o, pf, &mut sums),
                    }
                }
            }
        }
    }

    /// Four slots of one block's 16 x 16 sums, in the order the products are issued.
    #[repr(C, align(64))]
    struct AmxSums([i32; 4 * 256]);

    /// The products of one group (`g`) with the tile of 16 tokens at `x` (tiled layout), of
    /// which the first `M` are scaled (with `dx`, `[token][block]`) and the first
    /// `out.len() / 16` (at most `M`) written to `out` (`[token][16 rows]`); the others are
    /// padding rows.
    ///
    /// # Safety
    /// As [`q8_0_groups_amx`]; 16 x `nb * 32` bytes readable at `x`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,f16c")]
    unsafe fn amx_tokens<const M: usize>(
        nb: usize,
        g: &[u8],
        x: *const u8,
        dx: &[f32],
        out: &mut [f32],
        pf: &[u8],
        sums: &mut std::mem::MaybeUninit<AmxSums>,
    ) {
        assert!(dx.len() >= M * nb && out.len() <= M * GEMM_TILE_ROWS);
        let per_block = pf.len().div_ceil(64 * nb);
        // Written by the tile stores before it is read (a slot two blocks after its store).
        let sp = sums.as_mut_ptr().cast::<i32>();
        let mut acc = [_mm512_setzero_ps(); M];
        // Block b's product is issued two blocks before its sums are scaled, so that the
        // tile unit works while the vector units scale; the loop's body is one steady
        // state (a product, then the scaling of the block two before).
        macro_rules! product {
            ($b:expr) => {{
                let b = $b;
                prefetch_share::<_MM_HINT_T1>(pf, b, per_block);
                // SAFETY: block b of the group and of the tokens' rows; slot b % 4 of `sums`.
                unsafe {
                    let xb = x.add(32 * 16 * b);
                    let gb = g.as_ptr().add(b * crate::repack::Q8_0_GROUP_BLOCK);
                    match b % 4 {
                        0 => amx_block::<0, 4, 6>(xb, gb, sp),
                        1 => amx_block::<1, 5, 7>(xb, gb, sp.add(256)),
                        2 => amx_block::<2, 4, 6>(xb, gb, sp.add(512)),
                        _ => amx_block::<3, 5, 7>(xb, gb, sp.add(768)),
                    }
                }
            }};
        }
        macro_rules! scale {
            ($pb:expr) => {{
                let pb = $pb;
                // SAFETY: block pb's 16 f16 scales start its group block; its sums are slot
                // pb % 4 (stored two blocks ago); dx holds M x nb (asserted above).
                unsafe {
                    let dw = ld_f16x16(g, pb * crate::repack::Q8_0_GROUP_BLOCK);
                    let s = sp.add(256 * (pb % 4));
                    // Each token's sums times its scale, then the rows' scales: every step
                    // waits on the sums' load, so the compiler does not hoist 16 scale
                    // products ahead of them (and spill them).
                    for (t, a) in acc.iter_mut().enumerate() {
                        let v = _mm512_cvtepi32_ps(_mm512_load_si512(s.add(16 * t).cast()));
                        let v = _mm512_mul_ps(v, _mm512_set1_ps(*dx.get_unchecked(t * nb + pb)));
                        *a = _mm512_fmadd_ps(v, dw, *a);
                    }
                }
            }};
        }
        for b in 0..nb.min(2) {
            product!(b);
        }
        for b in 2..nb {
            product!(b);
            scale!(b - 2);
        }
        for pb in nb.saturating_sub(2)..nb {
            scale!(pb);
        }
        for (o, a) in out.chunks_exact_mut(GEMM_TILE_ROWS).zip(acc) {
            // SAFETY: `o` is 16 floats.
            unsafe { _mm512_storeu_ps(o.as_mut_ptr(), a) };
        }
    }

    /// Asks for the lines of `pf` that sub-block `sb` of `n_sub` takes (`per_sub` lines
    /// each), with `_mm_prefetch`'s hint `HINT` (`_MM_HINT_T0`: into L1; `_MM_HINT_T1`: L2).
    #[inline(always)]
    pub(super) fn prefetch_share<const HINT: i32>(pf: &[u8], sb: usize, per_sub: usize) {
        let lines = pf.len().div_ceil(64);
        for l in sb * per_sub..((sb + 1) * per_sub).min(lines) {
            // SAFETY: a prefetch never faults; the address is inside `pf`.
            unsafe { _mm_prefetch::<HINT>(pf.as_ptr().add(64 * l).cast()) };
        }
    }

    /// One pass of up to 8 (one tile) or 6 (two tiles) of the `left` tokens from `t0`, with
    /// sub-blocks of `S` values (a constant, so the group loop unrolls), prefetching `pf`;
    /// returns the tokens done.
    ///
    /// # Safety
    /// AVX-512 F/BW/VNNI; as [`tokens`].
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn pass<const R: usize, const S: usize>(
        l: Layout,
        n_in: usize,
        w: [&WeightTile; R],
        acts: &GemmActs,
        t0: usize,
        out: [&mut [f32]; R],
        left: usize,
        pf: &[u8],
    ) -> usize {
        debug_assert_eq!(l.sub, S);
        // SAFETY: per this function's contract.
        unsafe {
            if R == 1 && left >= 8 {
                tokens::<R, 8, S>(l, n_in, w, acts, t0, out, pf)
            } else if R == 2 && left >= 6 {
                tokens::<R, 6, S>(l, n_in, w, acts, t0, out, pf)
            } else if left >= 4 {
                tokens::<R, 4, S>(l, n_in, w, acts, t0, out, pf)
            } else if left >= 2 {
                tokens::<R, 2, S>(l, n_in, w, acts, t0, out, pf)
            } else {
                tokens::<R, 1, S>(l, n_in, w, acts, t0, out, pf)
            }
        }
    }

    /// Tokens `t0..t0+N` against the 16 rows of each of the `R` tiles `w` (sub-blocks of `S`
    /// values); writes `N` runs of 16 results into each `out[r]`. The lines of `pf` are
    /// prefetched a few per sub-block.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn tokens<const R: usize, const N: usize, const S: usize>(
        l: Layout,
        n_in: usize,
        w: [&WeightTile; R],
        acts: &GemmActs,
        t0: usize,
        out: [&mut [f32]; R],
        pf: &[u8],
    ) -> usize {
        let s = S;
        let mut facc = [[_mm512_setzero_ps(); N]; R];
        let super::PassActs {
            x,
            dx,
            sums,
            scaled,
            act_block,
            n_blocks,
            n_sub,
        } = acts.pass(s, t0, N);
        // Sub-blocks sharing one activation scale (a Q8_K block) are summed with the weight
        // scales first and multiplied by the activation scale once.
        let per_dx = act_block / s;
        let per_sub = pf.len().div_ceil(64 * n_sub);
        for blk in 0..n_blocks {
            let mut fblk = [[_mm512_setzero_ps(); N]; R];
            for sb in blk * per_dx..(blk + 1) * per_dx {
                prefetch_share::<_MM_HINT_T0>(pf, sb, per_sub);
                let mut iacc = [[_mm512_setzero_si512(); N]; R];
                if l.offset != 0 {
                    // Undo the unsigned weight offset: -offset * sum(x).
                    for j in 0..N {
                        // SAFETY: j < N and sb < n_sub index inside `sums`.
                        let b = unsafe { *sums.get_unchecked(j * n_sub + sb) };
                        let v = _mm512_set1_epi32(-l.offset * b);
                        for acc in iacc.iter_mut() {
                            acc[j] = v;
                        }
                    }
                }
                for g in 0..s / 4 {
                    let k = sb * s + 4 * g;
                    // SAFETY: each tile holds n_in/4 groups of 64 bytes; k/4 < n_in/4.
                    let wv =
                        w.map(|t| unsafe { _mm512_loadu_si512(t.q.as_ptr().add(k * 16).cast()) });
                    for j in 0..N {
                        // SAFETY: k + 4 <= n_in, inside token j's row of `x`.
                        let xv =
                            unsafe { x.as_ptr().add(j * n_in + k).cast::<i32>().read_unaligned() };
                        let xb = _mm512_set1_epi32(xv);
                        for r in 0..R {
                            iacc[r][j] = _mm512_dpbusd_epi32(iacc[r][j], wv[r], xb);
                        }
                    }
                }
                for r in 0..R {
                    // SAFETY: both arrays hold n_sub * 16 floats.
                    let sc = unsafe { _mm512_loadu_ps(w[r].scale.as_ptr().add(sb * 16)) };
                    for j in 0..N {
                        fblk[r][j] =
                            _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc[r][j]), sc, fblk[r][j]);
                    }
                }
                if l.mins {
                    // SAFETY: as above.
                    let mn = w.map(|t| unsafe { _mm512_loadu_ps(t.min.as_ptr().add(sb * 16)) });
                    for j in 0..N {
                        // SAFETY: as for `sums`.
                        let xs = _mm512_set1_ps(unsafe { *scaled.get_unchecked(j * n_sub + sb) });
                        for r in 0..R {
                            facc[r][j] = _mm512_fnmadd_ps(mn[r], xs, facc[r][j]);
                        }
                    }
                }
            }
            for j in 0..N {
                // SAFETY: j < N and blk < n_blocks index inside `dx`.
                let d = _mm512_set1_ps(unsafe { *dx.get_unchecked(j * n_blocks + blk) });
                for r in 0..R {
                    facc[r][j] = _mm512_fmadd_ps(fblk[r][j], d, facc[r][j]);
                }
            }
        }
        for (o, acc) in out.into_iter().zip(facc) {
            for (j, v) in acc.into_iter().enumerate() {
                // SAFETY: each `out[r]` holds at least N runs of 16 floats (sliced at t0).
                unsafe { _mm512_storeu_ps(o.as_mut_ptr().add(j * GEMM_TILE_ROWS), v) };
            }
        }
        N
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod platform {
    use super::{GemmActs, Layout, WeightTile};

    pub(super) fn interleave_quads(rows: &[u8], n_in: usize, q: &mut [u8]) {
        super::interleave_quads_scalar(rows, n_in, q)
    }

    pub(super) fn tiles_times_tokens<const R: usize>(
        _l: Layout,
        _n_in: usize,
        _w: [&WeightTile; R],
        _acts: &GemmActs,
        _out: [&mut [f32]; R],
        _next: &[u8],
    ) {
        unreachable!("gemm_available() is false off x86_64")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_data::{act_rows, weight_rows, INTERLEAVED_TYPES};

    /// Interleaved groups give the int8 GEMM the tiles of their rows in GGUF order: the same
    /// results bit for bit (Q8_0 on AMX-INT8 tiles is another kernel, whose float sums run in
    /// another order: `gemm_products_match_the_dequantized_sums` bounds it).
    #[test]
    fn interleaved_groups_give_the_same_products() {
        if !gemm_available() {
            eprintln!("int8 GEMM not available here (needs AVX2): skipped");
            return;
        }
        let mut seed = 5u64;
        for (ty, n_in) in [
            (GgmlType::Q4_K, 512),
            (GgmlType::Q5_K, 512),
            (GgmlType::Q6_K, 512),
            (GgmlType::Q8_0, 512),
            (GgmlType::Q8_0, 160),
            (GgmlType::Q4_0, 128),
            (GgmlType::Q5_0, 160),
        ] {
            if ty == GgmlType::Q8_0 && crate::amx::int8_available() {
                continue;
            }
            let (n_rows, n_tok) = (48, 7);
            let wq = weight_rows(ty, n_rows, n_in, &mut seed);
            let xq = act_rows(ty, n_in, n_tok, &mut seed);
            let act = crate::vec_dot_type(ty).unwrap();
            let arb = xq.len() / n_tok;
            let acts = GemmActs::new(act, n_in, &xq, arb).unwrap();
            let mut packed = vec![0u8; wq.len()];
            crate::repack::repack(ty, &wq, n_rows, n_in, &mut packed);
            let len = n_rows / GEMM_TILE_ROWS * n_tok * GEMM_TILE_ROWS;
            let (mut want, mut got) = (vec![0f32; len], vec![1f32; len]);
            assert!(gemm_q8(ty, n_in, &wq, &acts, &mut want, &[]));
            assert!(gemm_q8_interleaved(ty, n_in, &packed, &acts, &mut got, &[]));
            assert!(
                want.iter()
                    .zip(&got)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{ty}: interleaved tiles differ"
            );
        }
    }

    /// The int8 GEMM (VNNI or AVX2, whichever runs here) against f64 sums of the dequantized
    /// weights and activations, for passes of 1 to 8 tokens and a partial last pass: within
    /// 2^-16 of the sum of the terms' magnitudes (the integer sums are exact; what is left is
    /// f32 rounding of the scales, a few ulps), 2^-10 for Q4_1, whose mins term takes Q8_1's
    /// f16 `d * sum` as ggml does. A bf16 operand (8 bits) would miss this by two orders of
    /// magnitude (tried in session 17 with AMX-BF16 tiles: ~1e-4).
    #[test]
    fn gemm_products_match_the_dequantized_sums() {
        if !gemm_available() {
            eprintln!("int8 GEMM not available here (needs AVX2): skipped");
            return;
        }
        let mut seed = 11u64;
        for (ty, n_in) in [
            (GgmlType::Q4_K, 512),
            (GgmlType::Q5_K, 256),
            (GgmlType::Q6_K, 512),
            (GgmlType::Q8_0, 160),
            (GgmlType::Q4_0, 128),
            (GgmlType::Q4_1, 64),
            (GgmlType::Q5_0, 160),
        ] {
            // Every tail of a 16-token AMX tile (1-4, 5-8, 9-12, 13-15 tokens) and whole ones.
            for (n_tok, interleaved) in [1, 7, 16, 27, 37, 46]
                .into_iter()
                .flat_map(|n| [(n, false), (n, true)])
            {
                let n_rows = 48;
                let wq = weight_rows(ty, n_rows, n_in, &mut seed);
                let xq = act_rows(ty, n_in, n_tok, &mut seed);
                let act = crate::vec_dot_type(ty).unwrap();
                let (wrb, arb) = (wq.len() / n_rows, xq.len() / n_tok);
                let acts = GemmActs::new(act, n_in, &xq, arb).unwrap();
                let mut got = vec![0f32; n_rows * n_tok];
                if !interleaved {
                    assert!(gemm_q8(ty, n_in, &wq, &acts, &mut got, &[]));
                } else if crate::repack::repack_supports(ty, n_rows, n_in) {
                    // The groups the repacked weights give the GEMM (Q8_0: AMX-INT8 tiles
                    // where the CPU has them).
                    let mut packed = vec![0u8; wq.len()];
                    crate::repack::repack(ty, &wq, n_rows, n_in, &mut packed);
                    assert!(gemm_q8_interleaved(ty, n_in, &packed, &acts, &mut got, &[]));
                } else {
                    continue;
                }
                let deq = |t: GgmlType, rows: &[u8], rb: usize| -> Vec<Vec<f32>> {
                    rows.chunks_exact(rb)
                        .map(|row| {
                            let mut v = vec![0f32; n_in];
                            crate::dequantize_row(t, row, &mut v).unwrap();
                            v
                        })
                        .collect()
                };
                let (ws, xs) = (deq(ty, &wq, wrb), deq(act, &xq, arb));
                let tol = if ty == GgmlType::Q4_1 {
                    1024.0
                } else {
                    65536.0
                };
                for (r, w) in ws.iter().enumerate() {
                    for (t, x) in xs.iter().enumerate() {
                        let want: f64 = w.iter().zip(x).map(|(&a, &b)| a as f64 * b as f64).sum();
                        let mag: f64 = w
                            .iter()
                            .zip(x)
                            .map(|(&a, &b)| (a as f64 * b as f64).abs())
                            .sum();
                        let v = got[(r / 16 * n_tok + t) * 16 + r % 16] as f64;
                        assert!(
                            (v - want).abs() <= mag / tol + 1e-9,
                            "{ty} n_in {n_in}, {n_tok} tokens (interleaved: {interleaved}): row {r} token {t}: {v} against {want} (terms {mag})"
                        );
                    }
                }
            }
        }
    }

    /// Activations prepared in parts (any thread each) or copied row by row from prepared
    /// ones hold what preparing those rows at once gives, for each activation type.
    #[test]
    fn gemm_acts_in_parts_and_gathered_agree() {
        let mut seed = 3u64;
        for (weights, n_in) in [
            (GgmlType::Q4_K, 512),
            (GgmlType::Q8_0, 160),
            (GgmlType::Q4_1, 64),
        ] {
            let act = crate::vec_dot_type(weights).unwrap();
            let n_tok = 37;
            let xq = act_rows(weights, n_in, n_tok, &mut seed);
            let rb = xq.len() / n_tok;
            let whole = GemmActs::new(act, n_in, &xq, rb).unwrap();
            // What the rows read (the buffers may be longer).
            let fields = |g: &GemmActs| {
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                let (n, b) = (g.n_tok * g.n_in, &g.buf);
                // The AMX operands of the real tokens (not the last tile's padding).
                let tiles: Vec<u8> = (0..g.n_tok * g.n_blk)
                    .filter(|_| g.tiled)
                    .flat_map(|i| {
                        let at = tile_offset(g.n_in, i / g.n_blk, i % g.n_blk);
                        b.tiles[at..at + 32].to_vec()
                    })
                    .collect();
                (
                    g.n_tok,
                    b.q[..n].to_vec(),
                    tiles,
                    bits(&b.dx[..g.n_tok * g.n_blk]),
                    (
                        b.by16.sum[..n / 16].to_vec(),
                        bits(&b.by16.scaled[..n / 16]),
                    ),
                    (
                        b.by32.sum[..n / 32].to_vec(),
                        bits(&b.by32.scaled[..n / 32]),
                    ),
                )
            };
            // Buffers left in the thread's pool by other rows are overwritten, not read.
            let other = act_rows(weights, n_in, 2 * n_tok, &mut seed);
            for _ in 0..ACTS_POOLED {
                drop(GemmActs::new(act, n_in, &other, rb).unwrap());
            }
            let mut parted = GemmActs::unfilled(act, n_in, n_tok).unwrap();
            // Tiled activations are written in whole tiles of 16 tokens.
            let per = if parted.tiled { AMX_TILE_TOKENS } else { 5 };
            let mut parts = parted.parts(5);
            assert_eq!(parts.len(), n_tok.div_ceil(per));
            for (part, rows) in parts.iter_mut().zip(xq.chunks(per * rb)) {
                part.fill(rows);
            }
            drop(parts);
            assert!(fields(&parted) == fields(&whole), "{act}: parts differ");
            let pick = [36, 0, 5, 5, 17];
            let rows: Vec<u8> = pick
                .iter()
                .flat_map(|&r| xq[r * rb..(r + 1) * rb].to_vec())
                .collect();
            let want = GemmActs::new(act, n_in, &rows, rb).unwrap();
            assert!(
                fields(&whole.gather(&pick)) == fields(&want),
                "{act}: gathered rows differ"
            );
        }
    }

    /// Random 16-row weights of `ty` (`n_in` values a row) and the same rows interleaved.
    fn rows_and_group(ty: GgmlType, n_in: usize, seed: &mut u64) -> (Vec<u8>, Vec<u8>) {
        let wq = weight_rows(ty, GEMM_TILE_ROWS, n_in, seed);
        let mut packed = vec![0u8; wq.len()];
        crate::repack::repack(ty, &wq, GEMM_TILE_ROWS, n_in, &mut packed);
        (wq, packed)
    }

    /// Two tiles hold the same quants, and scales and mins to the bit.
    fn assert_same_tile(a: &WeightTile, b: &WeightTile, ty: GgmlType) {
        assert_eq!(a.q, b.q, "{ty}: quants");
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a.scale), bits(&b.scale), "{ty}: scales");
        assert_eq!(bits(&a.min), bits(&b.min), "{ty}: mins");
    }

    /// The AVX-512 tile fill from K-quant, Q8_0, Q4_0 and Q5_0 groups writes the portable
    /// fill's quants, scales and mins.
    #[test]
    fn group_tile_fills_agree() {
        if !gemm_avx512() {
            eprintln!("AVX-512 VNNI not available here: skipped");
            return;
        }
        let mut seed = 9u64;
        for ty in INTERLEAVED_TYPES {
            let n_in = 768;
            let l = layout(ty).unwrap();
            let (_, packed) = rows_and_group(ty, n_in, &mut seed);
            let (mut fast, mut portable) = (WeightTile::new(l, n_in), WeightTile::new(l, n_in));
            fast.fill_from_group(ty, n_in, &packed);
            portable.fill_from_group_portable(ty, n_in, &packed);
            assert_same_tile(&fast, &portable, ty);
        }
    }

    /// The tile of an interleaved group (this CPU's fill: AVX-512, AVX2 or portable) holds
    /// what the row decoders make of the same rows in GGUF order.
    #[test]
    fn group_tile_fill_matches_the_row_fill() {
        let mut seed = 19u64;
        for ty in INTERLEAVED_TYPES {
            let n_in = 512;
            let l = layout(ty).unwrap();
            let (wq, packed) = rows_and_group(ty, n_in, &mut seed);
            let (mut rows, mut group) = (WeightTile::new(l, n_in), WeightTile::new(l, n_in));
            rows.fill(l, n_in, &wq, wq.len() / GEMM_TILE_ROWS);
            group.fill_from_group(ty, n_in, &packed);
            assert_same_tile(&rows, &group, ty);
        }
    }

    /// The int8 products equal `vec_dot` up to float rounding, for every supported type,
    /// ragged row and token counts included.
    #[test]
    fn gemm_matches_vec_dot() {
        if !gemm_available() {
            eprintln!("int8 GEMM not available here (needs AVX2): skipped");
            return;
        }
        let mut seed = 7u64;
        let types = [
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
            GgmlType::Q8_0,
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
        ];
        for ty in types.into_iter().chain(GgmlType::IQ_GRID) {
            let n_in = 512;
            let (n_rows, n_tok) = (37, 15);
            let rb = ty.row_bytes(n_in as u64).unwrap() as usize;
            let wq = weight_rows(ty, n_rows, n_in, &mut seed);
            let xq = act_rows(ty, n_in, n_tok, &mut seed);
            let act = crate::vec_dot_type(ty).unwrap();
            let arb = xq.len() / n_tok;
            let acts = GemmActs::new(act, n_in, &xq, arb).unwrap();
            let n_tiles = n_rows.div_ceil(GEMM_TILE_ROWS);
            let mut out = vec![f32::NAN; n_tiles * n_tok * GEMM_TILE_ROWS];
            assert!(gemm_q8(ty, n_in, &wq, &acts, &mut out, &[]));
            let dot = crate::vec_dot_fn(ty).unwrap();
            for r in 0..n_rows {
                for t in 0..n_tok {
                    let want = dot(n_in, &wq[r * rb..(r + 1) * rb], &xq[t * arb..(t + 1) * arb]);
                    let (tile, i) = (r / GEMM_TILE_ROWS, r % GEMM_TILE_ROWS);
                    let got = out[(tile * n_tok + t) * GEMM_TILE_ROWS + i];
                    assert!(
                        (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                        "{ty} row {r} token {t}: int8 gemm {got}, vec_dot {want}"
                    );
                }
            }
        }
    }

    /// The largest codes against the most negative activations: the AVX2 kernel's i16 sums
    /// (a whole sub-block of 4-bit codes before widening) must not saturate.
    #[test]
    fn gemm_extreme_codes_match_vec_dot() {
        if !gemm_available() {
            eprintln!("int8 GEMM not available here (needs AVX2): skipped");
            return;
        }
        let (n_in, n_rows, n_tok) = (512, GEMM_TILE_ROWS, 5);
        for ty in [
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
            GgmlType::Q4_0,
        ] {
            let mut wq = vec![0xFFu8; ty.row_bytes(n_in as u64).unwrap() as usize * n_rows];
            let d = crate::f32_to_fp16(1.0 / 64.0).to_le_bytes();
            for blk in wq.chunks_exact_mut(ty.type_size()) {
                for &off in ty.f16_scale_offsets() {
                    blk[off..off + 2].copy_from_slice(&d);
                }
            }
            // Every activation value at the type's most negative (Q8_K: -128; Q8_0: -127).
            let act = crate::vec_dot_type(ty).unwrap();
            let x = vec![-1.0f32; n_in * n_tok];
            let arb = act.row_bytes(n_in as u64).unwrap() as usize;
            let mut xq = vec![0u8; arb * n_tok];
            for (row, xr) in xq.chunks_exact_mut(arb).zip(x.chunks_exact(n_in)) {
                crate::quantize_fn(act).unwrap()(xr, row);
            }
            let acts = GemmActs::new(act, n_in, &xq, arb).unwrap();
            let mut out = vec![f32::NAN; n_tok * GEMM_TILE_ROWS];
            assert!(gemm_q8(ty, n_in, &wq, &acts, &mut out, &[]));
            let rb = wq.len() / n_rows;
            let want = crate::vec_dot_fn(ty).unwrap()(n_in, &wq[..rb], &xq[..arb]);
            for (i, &got) in out.iter().enumerate() {
                assert!(
                    (got - want).abs() <= 1e-4 * want.abs(),
                    "{ty} output {i}: int8 gemm {got}, vec_dot {want}"
                );
            }
        }
    }
}
