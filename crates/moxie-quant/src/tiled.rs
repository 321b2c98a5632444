//! Dot products in the summation order of ggml-cpu's "tiled" K-quant matmul
//! (`ggml-cpu/tiled/{tiled.cpp,tiled-kernel.cpp}`), which this llama.cpp version runs instead of
//! `vec_dot` for Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S,
//! IQ1_S and IQ1_M weights when enough activation rows are multiplied at once:
//!
//! * `mul_mat`: when the activation has `ne[1] >= 8` rows ([`tiled_used_for_mul_mat`]);
//! * `mul_mat_id` (routed experts): per expert, when at least 8 (token, slot) rows are routed to
//!   it ([`tiled_used_for_mul_mat_id`]); other experts of the same op keep `vec_dot`.
//!
//! (ggml also takes the path when `GGML_CPU_TILED_MM_FORCE=1` and skips it when
//! `GGML_CPU_TILED_MM=0`, with `--use-ref`, or for weights in a repack buffer; moxie follows the
//! defaults.) The activation is the same Q8_K row `vec_dot` uses.
//!
//! Numerics of one output element (the AVX-512 VNNI microkernel `tiled_run_micro_vnni_8x16`,
//! as GCC 12 `-O3 -march=sapphirerapids` compiles it; checked in its disassembly): the weights
//! are unpacked per 256-element block into unsigned codes `q` (biased by `BIAS`), integer
//! sub-block scales `sc[s]` and, for Q2_K/Q4_K/Q5_K, mins `m[s]`; per sub-block (16 or 32
//! elements) `raw[s] = sum q * a` (dpbusd) and `bsum[s]` = the Q8_K `bsums` of the sub-block.
//! Then, in wrapping int32 arithmetic,
//!
//! ```text
//! s1 = sum_s sc[s] * (raw[s] - BIAS * bsum[s])      s2 = sum_s m[s] * bsum[s]
//! ```
//!
//! and in f32, with `d0`/`dmin` the weight block's halves (IQ1_S/IQ1_M: `d / 8`, their codes
//! being 8 times the grid value plus the ±1 delta) and `d1` the Q8_K scale:
//!
//! ```text
//! r   = d0 * (f32)s1
//! r   = fma(-dmin, (f32)s2, r)        // only with mins (_mm512_fnmadd_ps)
//! acc = fma(r, d1, acc)               // GCC contracts _mm512_add_ps(acc, _mm512_mul_ps(r, d1))
//! ```
//!
//! with `acc` starting at 0 and the blocks taken in K order. The order does not depend on the
//! matrix shape or the tile position: the narrow path (<= 16 activation rows) splits K into
//! chunks (`ggml_tiled_narrow_k_extent`) but still adds one block at a time into the same
//! accumulator, in K order; tile edges only pad with rows that are never stored. (ggml's
//! `ACTBIAS` template flag of the IQ types, Q3_K and Q6_K only changes the AVX2 microkernel;
//! the VNNI one ignores it.)
//!
//! Verified bit-exact against ggml's tiled.cpp/tiled-kernel.cpp compiled for Sapphire Rapids
//! (`tests/ggml_tiled_golden.rs`, generator `tests/data/gen_tiled.c`), for both `mul_mat`
//! (narrow path, several K slabs per chunk) and `mul_mat_id` (narrow and standard paths).

use crate::common::{get_scale_min_k4, q3k_scales, rd_f16, rd_f32, rd_i16, rd_u16};
use crate::dispatch::VecDotFn;
use crate::iq2_3::{
    iq2_s_group, iq2_xs_group, iq2_xxs_group, iq3_xxs_group, Group32, IQ2_S_BYTES, IQ2_XS_BYTES,
    IQ2_XXS_BYTES, IQ3_XXS_BYTES,
};
use crate::iq4::{IQ4_XS_BYTES, KVALUES_IQ4NL};
// IQ3_S, IQ1_S, IQ1_M
use crate::f16::fp16_to_f32;
use crate::iq1::{
    iq1_grid, iq1m_delta_negative, iq1m_index, iq1m_scale, iq1m_scale_bits, iq1s_index, iq1s_qh,
    iq1s_scale, IQ1_M_BYTES, IQ1_S_BYTES,
};
use crate::iq3s::{iq3s_index, iq3s_scale, iq3s_signs, IQ3_S_BYTES};
use crate::iq_grids::IQ3S_GRID;
use crate::kquants::{Q2_K_BYTES, Q3_K_BYTES, Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES, Q8_K_BYTES};
use crate::table::row;
use crate::types::{GgmlType, QK_K};

/// `ggml_tiled_min_batch`: the path is taken from 8 activation rows on.
const MIN_BATCH: usize = 8;

/// Whether ggml's `mul_mat` of weights of type `ty` with `n_act_rows` activation rows
/// (`src1->ne[1]`, e.g. the tokens of a batch) runs the tiled path (`ggml_tiled_supported`'s
/// types: the type table's `ggml_tiled` column).
pub fn tiled_used_for_mul_mat(ty: GgmlType, n_act_rows: usize) -> bool {
    row(ty).ggml_tiled && n_act_rows >= MIN_BATCH
}

/// Whether ggml's `mul_mat_id` runs the tiled path for one expert of type `ty` to which
/// `n_rows_for_expert` (token, slot) rows are routed (`cne1`); decided per expert.
pub fn tiled_used_for_mul_mat_id(ty: GgmlType, n_rows_for_expert: usize) -> bool {
    row(ty).ggml_tiled && n_rows_for_expert >= MIN_BATCH
}

/// The tiled order's kernels for `ty` with rows of `n_in` elements, if ported.
fn ported(ty: GgmlType, n_in: usize) -> Option<crate::table::Tiled> {
    if !n_in.is_multiple_of(QK_K) {
        return None;
    }
    row(ty).dot.as_ref()?.tiled
}

/// The tiled path's dot of one weight row (type `ty`, `n_in` elements) with one Q8_K activation
/// row, for the types ported here (the type table's `tiled` column); `None` otherwise or
/// when `n_in` is not a multiple of 256. Same signature and panics as [`crate::vec_dot_fn`]'s.
pub fn tiled_dot_fn(ty: GgmlType, n_in: usize) -> Option<VecDotFn> {
    ported(ty, n_in).map(|t| t.dot)
}

/// One weight row against several activation rows: `(n, w_row, acts, act_stride, out)`.
pub type DotManyFn = fn(usize, &[u8], &[u8], usize, &mut [f32]);

/// [`tiled_dot_fn`] for many activation rows at once (each weight block unpacked once);
/// results are identical to calling the single-row function per activation row.
pub fn tiled_dot_many_fn(ty: GgmlType, n_in: usize) -> Option<DotManyFn> {
    ported(ty, n_in).map(|t| t.many)
}

/// One weight block as `tiled_unpack_src0` leaves it in the tile.
struct Unpacked {
    /// Unsigned codes in element order (the weight value plus `BIAS`).
    q: [u8; QK_K],
    /// Per sub-block scales (16 for 16-element sub-blocks, else the first 8).
    scales: [i32; 16],
    /// Per sub-block mins (types with a min only).
    mins: [i32; 16],
    d: f32,
    dmin: f32,
}

impl Unpacked {
    fn new() -> Unpacked {
        Unpacked {
            q: [0; QK_K],
            scales: [0; 16],
            mins: [0; 16],
            d: 0.0,
            dmin: 0.0,
        }
    }
}

/// The accumulation shared by all types. `SUBBLK`: sub-block width (16 or 32); `HAS_MIN`: the
/// type has per-sub-block mins; `BIAS`: the code offset removed through the Q8_K bsums.
#[inline(always)]
/// Dots of one weight row with `out.len()` activation rows (`Q8_K`, `act_stride` bytes apart
/// in `acts`), unpacking each weight block once. Each output keeps the block-by-block
/// accumulation order of ggml's tiled kernel.
fn dot_tiled_many<const SUBBLK: usize, const HAS_MIN: bool, const BIAS: i32>(
    n: usize,
    w: &[u8],
    acts: &[u8],
    act_stride: usize,
    out: &mut [f32],
    w_block: usize,
    unpack: fn(&[u8], &mut Unpacked),
) {
    let nb = n / QK_K;
    let n_act = out.len();
    assert!(
        n.is_multiple_of(QK_K)
            && w.len() >= nb * w_block
            && act_stride >= nb * Q8_K_BYTES
            && (n_act == 0 || acts.len() >= (n_act - 1) * act_stride + nb * Q8_K_BYTES)
    );
    let n_sub = QK_K / SUBBLK;
    let per16 = SUBBLK / 16;
    let mut blk = Unpacked::new();
    out.iter_mut().for_each(|o| *o = 0.0);
    for b in 0..nb {
        unpack(&w[b * w_block..(b + 1) * w_block], &mut blk);
        for (t, acc) in out.iter_mut().enumerate() {
            let y = &acts[t * act_stride + b * Q8_K_BYTES..t * act_stride + (b + 1) * Q8_K_BYTES];
            let d1 = rd_f32(y, 0);
            let qa = &y[4..4 + QK_K];
            let mut s1 = 0i32;
            let mut s2 = 0i32;
            for s in 0..n_sub {
                let mut raw = 0i32;
                for (&qw, &qx) in blk.q[s * SUBBLK..(s + 1) * SUBBLK]
                    .iter()
                    .zip(&qa[s * SUBBLK..(s + 1) * SUBBLK])
                {
                    raw = raw.wrapping_add(qw as i32 * qx as i8 as i32);
                }
                let mut bsum = 0i32;
                for u in 0..per16 {
                    bsum = bsum.wrapping_add(rd_i16(y, 4 + QK_K + 2 * (s * per16 + u)) as i32);
                }
                let corr = raw.wrapping_sub(BIAS.wrapping_mul(bsum));
                s1 = s1.wrapping_add(corr.wrapping_mul(blk.scales[s]));
                if HAS_MIN {
                    s2 = s2.wrapping_add(bsum.wrapping_mul(blk.mins[s]));
                }
            }
            let mut r = blk.d * s1 as f32;
            if HAS_MIN {
                r = (-blk.dmin).mul_add(s2 as f32, r);
            }
            *acc = r.mul_add(d1, *acc);
        }
    }
}

/// Q2_K: `scales[16]` (scale lo nibble, min hi nibble), `qs[64]`, d, dmin; codes 0..3.
fn unpack_q2_k(x: &[u8], t: &mut Unpacked) {
    t.d = rd_f16(x, 80);
    t.dmin = rd_f16(x, 82);
    for half in 0..2 {
        let qs = &x[16 + 32 * half..16 + 32 * half + 32];
        for g in 0..4 {
            for l in 0..32 {
                t.q[128 * half + 32 * g + l] = (qs[l] >> (2 * g)) & 3;
            }
        }
    }
    for s in 0..16 {
        t.scales[s] = (x[s] & 0xf) as i32;
        t.mins[s] = (x[s] >> 4) as i32;
    }
}

/// Q3_K: `hmask[32]`, `qs[64]`, `scales[12]`, d; codes `low2 | high << 2` (0..7, bias 4),
/// scales stored as `scale - 32`.
fn unpack_q3_k(x: &[u8], t: &mut Unpacked) {
    t.d = rd_f16(x, 108);
    let hmask = &x[0..32];
    for half in 0..2 {
        let qs = &x[32 + 32 * half..32 + 32 * half + 32];
        for g in 0..4 {
            for l in 0..32 {
                let lo = (qs[l] >> (2 * g)) & 3;
                let hi = (hmask[l] >> (4 * half + g)) & 1;
                t.q[128 * half + 32 * g + l] = lo | (hi << 2);
            }
        }
    }
    let sc = q3k_scales(&x[96..108]);
    for s in 0..16 {
        t.scales[s] = sc[s] as i32 - 32;
    }
}

/// Q4_K / Q5_K shared part: d, dmin and the 6-bit scales/mins of 8 sub-blocks of 32.
fn unpack_k4_scales(x: &[u8], t: &mut Unpacked) {
    t.d = rd_f16(x, 0);
    t.dmin = rd_f16(x, 2);
    for s in 0..8 {
        let (sc, m) = get_scale_min_k4(s, &x[4..16]);
        t.scales[s] = sc as i32;
        t.mins[s] = m as i32;
    }
}

/// Q4_K: d, dmin, `scales[12]`, `qs[128]`; codes 0..15.
fn unpack_q4_k(x: &[u8], t: &mut Unpacked) {
    unpack_k4_scales(x, t);
    let qs = &x[16..144];
    for j in 0..4 {
        for l in 0..32 {
            t.q[64 * j + l] = qs[32 * j + l] & 0xf;
            t.q[64 * j + 32 + l] = qs[32 * j + l] >> 4;
        }
    }
}

/// Q5_K: d, dmin, `scales[12]`, `qh[32]`, `qs[128]`; codes 0..31 (bit 4 from `qh`).
fn unpack_q5_k(x: &[u8], t: &mut Unpacked) {
    unpack_k4_scales(x, t);
    let qh = &x[16..48];
    let qs = &x[48..176];
    for j in 0..4 {
        for l in 0..32 {
            let h0 = (qh[l] >> (2 * j)) & 1;
            let h1 = (qh[l] >> (2 * j + 1)) & 1;
            t.q[64 * j + l] = (qs[32 * j + l] & 0xf) | (h0 << 4);
            t.q[64 * j + 32 + l] = (qs[32 * j + l] >> 4) | (h1 << 4);
        }
    }
}

/// Q6_K: `ql[128]`, `qh[64]`, `scales[16]` (i8), d; codes 0..63 (bias 32).
fn unpack_q6_k(x: &[u8], t: &mut Unpacked) {
    t.d = rd_f16(x, 208);
    for half in 0..2 {
        let ql = &x[64 * half..64 * half + 64];
        let qh = &x[128 + 32 * half..128 + 32 * half + 32];
        let out = &mut t.q[128 * half..128 * half + 128];
        for l in 0..32 {
            out[l] = (ql[l] & 0xf) | ((qh[l] & 3) << 4);
            out[32 + l] = (ql[32 + l] & 0xf) | (((qh[l] >> 2) & 3) << 4);
            out[64 + l] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
            out[96 + l] = (ql[32 + l] >> 4) | (((qh[l] >> 6) & 3) << 4);
        }
    }
    for s in 0..16 {
        t.scales[s] = x[192 + s] as i8 as i32;
    }
}

/// IQ4_XS: d, `scales_h` (u16), `scales_l[4]`, `qs[128]`; codes `kvalues_iq4nl + 128`
/// (bias 128), 6-bit scales stored as `ls - 32`.
fn unpack_iq4_xs(x: &[u8], t: &mut Unpacked) {
    t.d = rd_f16(x, 0);
    let scales_h = rd_u16(x, 2) as i32;
    for s in 0..8 {
        let lo = ((x[4 + s / 2] >> (4 * (s % 2))) & 0xf) as i32;
        let ls = lo | (((scales_h >> (2 * s)) & 3) << 4);
        t.scales[s] = ls - 32;
    }
    let qs = &x[8..136];
    for ib in 0..8 {
        for j in 0..16 {
            let b = qs[16 * ib + j];
            t.q[32 * ib + j] = (KVALUES_IQ4NL[(b & 0xf) as usize] as i32 + 128) as u8;
            t.q[32 * ib + 16 + j] = (KVALUES_IQ4NL[(b >> 4) as usize] as i32 + 128) as u8;
        }
    }
}

/// The grid types (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS): signed code-book values stored as
/// `v + 128` (bias 128), scales `2 ls + 1` per sub-block of `sub` (32, or 16 for the types with
/// two scales per 32); `d` carries the format's constant factor (`d * 0.125f`, IQ3_XXS
/// `d * 0.25f`, rounded to f32 as ggml does when unpacking).
fn unpack_grid(
    x: &[u8],
    t: &mut Unpacked,
    sub: usize,
    d_factor: f32,
    group: fn(&[u8], usize) -> Group32,
) {
    t.d = rd_f16(x, 0) * d_factor;
    for ib32 in 0..QK_K / 32 {
        let g = group(x, ib32);
        if sub == 32 {
            t.scales[ib32] = 2 * g.ls[0] as i32 + 1;
        } else {
            t.scales[2 * ib32] = 2 * g.ls[0] as i32 + 1;
            t.scales[2 * ib32 + 1] = 2 * g.ls[1] as i32 + 1;
        }
        for (q, &v) in t.q[32 * ib32..32 * ib32 + 32].iter_mut().zip(&g.v) {
            *q = (v as i32 + 128) as u8;
        }
    }
}

fn unpack_iq2_xxs(x: &[u8], t: &mut Unpacked) {
    unpack_grid(x, t, 32, 0.125, iq2_xxs_group)
}

fn unpack_iq2_xs(x: &[u8], t: &mut Unpacked) {
    unpack_grid(x, t, 16, 0.125, iq2_xs_group)
}

fn unpack_iq2_s(x: &[u8], t: &mut Unpacked) {
    unpack_grid(x, t, 16, 0.125, iq2_s_group)
}

fn unpack_iq3_xxs(x: &[u8], t: &mut Unpacked) {
    unpack_grid(x, t, 32, 0.25, iq3_xxs_group)
}

pub(crate) fn many_q2_k(n: usize, w: &[u8], acts: &[u8], stride: usize, out: &mut [f32]) {
    dot_tiled_many::<16, true, 0>(n, w, acts, stride, out, Q2_K_BYTES, unpack_q2_k)
}

pub(crate) fn dot_q2_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut out = [0f32];
    many_q2_k(n, w, a, a.len(), &mut out);
    out[0]
}

pub(crate) fn many_q3_k(n: usize, w: &[u8], acts: &[u8], stride: usize, out: &mut [f32]) {
    dot_tiled_many::<16, false, 4>(n, w, acts, stride, out, Q3_K_BYTES, unpack_q3_k)
}

pub(crate) fn dot_q3_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut out = [0f32];
    many_q3_k(n, w, a, a.len(), &mut out);
    out[0]
}

pub(crate) fn many_q4_k(n: usize, w: &[u8], acts: &[u8], stride: usize, out: &mut [f32]) {
    dot_tiled_many::<32, true, 0>(n, w, acts, stride, out, Q4_K_BYTES, unpack_q4_k)
}

pub(crate) fn dot_q4_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut out = [0f32];
    many_q4_k(n, w, a, a.len(), &mut out);
    out[0]
}

pub(crate) fn many_q5_k(n: usize, w: &[u8], acts: &[u8], stride: usize, out: &mut [f32]) {
    dot_tiled_many::<32, true, 0>(n, w, acts, stride, out, Q5_K_BYTES, unpack_q5_k)
}

pub(crate) fn dot_q5_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut out = [0f32];
    many_q5_k(n, w, a, a.len(), &mut out);
    out[0]
}

pub(crate) fn many_q6_k(n: usize, w: &[u8], acts: &[u8], stride: usize, out: &mut [f32]) {
    dot_tiled_many::<16, false, 32>(n, w, acts, stride, out, Q6_K_BYTES, unpack_q6_k)
}

pub(crate) fn dot_q6_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut out = [0f32];
    many_q6_k(n, w, a, a.len(), &mut out);
    out[0]
}

pub(crate) fn many_iq4_xs(n: usize, w: &[u8], acts: &[u8], stride: usize, out: &mut [f32]) {
    dot_tiled_many::<32, false, 128>(n, w, acts, stride, out, IQ4_XS_BYTES, unpack_iq4_xs)
}

pub(crate) fn dot_iq4_xs(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut out = [0f32];
    many_iq4_xs(n, w, a, a.len(), &mut out);
    out[0]
}

// ggml dispatches the grid types with `ACTBIAS = true`, which only changes the AVX2-only
// microkernel; the AVX-512 VNNI one (the golden machine's) ignores it.
pub(crate) fn many_iq2_xxs(n: usize, w: &[u8], acts: &[u8], stride: usize, out: &mut [f32]) {
    dot_tiled_many::<32, false, 128>(n, w, acts, stride, out, IQ2_XXS_BYTES, unpack_iq2_xxs)
}

pub(crate) fn dot_iq2_xxs(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut out = [0f32];
    many_iq2_xxs(n, w, a, a.len(), &mut out);
    out[0]
}

pub(crate) fn many_iq2_xs(n: usize, w: &[u8], acts: &[u8], stride: usize, out: &mut [f32]) {
    dot_tiled_many::<16, false, 128>(n, w, acts, stride, out, IQ2_XS_BYTES, unpack_iq2_xs)
}

pub(crate) fn dot_iq2_xs(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut out = [0f32];
    many_iq2_xs(n, w, a, a.len(), &mut out);
    out[0]
}

pub(crate) fn many_iq2_s(n: usize, w: &[u8], acts: &[u8], stride: usize, out: &mut [f32]) {
    dot_tiled_many::<16, false, 128>(n, w, acts, stride, out, IQ2_S_BYTES, unpack_iq2_s)
}

pub(crate) fn dot_iq2_s(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut out = [0f32];
    many_iq2_s(n, w, a, a.len(), &mut out);
    out[0]
}

pub(crate) fn many_iq3_xxs(n: usize, w: &[u8], acts: &[u8], stride: usize, out: &mut [f32]) {
    dot_tiled_many::<32, false, 128>(n, w, acts, stride, out, IQ3_XXS_BYTES, unpack_iq3_xxs)
}

pub(crate) fn dot_iq3_xxs(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut out = [0f32];
    many_iq3_xxs(n, w, a, a.len(), &mut out);
    out[0]
}

/// IQ3_S: d, `qs[64]`, `qh[8]`, `signs[32]`, `scales[4]`; codes `128 ± grid magnitude`
/// (bias 128), scales `1 + 2 * sc` per 32.
fn unpack_iq3_s(x: &[u8], t: &mut Unpacked) {
    t.d = rd_f16(x, 0);
    for ib in 0..QK_K / 32 {
        t.scales[ib] = iq3s_scale(x, ib);
        for l in 0..4 {
            let lo = IQ3S_GRID[iq3s_index(x, ib, 2 * l)].to_le_bytes();
            let hi = IQ3S_GRID[iq3s_index(x, ib, 2 * l + 1)].to_le_bytes();
            let signs = iq3s_signs(x, ib, l);
            for j in 0..8 {
                let v = if j < 4 { lo[j] } else { hi[j - 4] };
                t.q[32 * ib + 8 * l + j] = if signs & (1 << j) != 0 {
                    128 - v
                } else {
                    128 + v
                };
            }
        }
    }
}

/// IQ1_S / IQ1_M group of 8 as `tiled_unpk_tern8` writes it: `128 + delta + 8 * grid` (bias
/// 128; the factor 8 keeps the ±1 delta, i.e. ±1/8 of a grid step, an integer, and `d` carries
/// the 1/8).
fn unpack_tern8(idx: usize, negative_delta: bool, out: &mut [u8]) {
    let delta = if negative_delta { -1 } else { 1 };
    for (o, g) in out.iter_mut().zip(iq1_grid(idx)) {
        *o = (128 + delta + 8 * g as i32) as u8;
    }
}

/// IQ1_S: d, `qs[32]`, `qh[8]` (u16); `d / 8`, scales `2 s + 1` per 32.
fn unpack_iq1_s(x: &[u8], t: &mut Unpacked) {
    t.d = rd_f16(x, 0) * 0.125;
    for ib in 0..QK_K / 32 {
        let qh = iq1s_qh(x, ib);
        t.scales[ib] = iq1s_scale(qh);
        for l in 0..4 {
            let o = 32 * ib + 8 * l;
            unpack_tern8(iq1s_index(x, ib, l), qh & 0x8000 != 0, &mut t.q[o..o + 8]);
        }
    }
}

/// IQ1_M: `qs[32]`, `qh[16]`, `scales[8]` (the f16 scale in the top nibbles); `d / 8`, scales
/// `2 s + 1` per 16.
fn unpack_iq1_m(x: &[u8], t: &mut Unpacked) {
    t.d = fp16_to_f32(iq1m_scale_bits(x)) * 0.125;
    for ib in 0..QK_K / 32 {
        t.scales[2 * ib] = iq1m_scale(x, ib, 0);
        t.scales[2 * ib + 1] = iq1m_scale(x, ib, 1);
        for l in 0..4 {
            let o = 32 * ib + 8 * l;
            let neg = iq1m_delta_negative(x, ib, l);
            unpack_tern8(iq1m_index(x, ib, l), neg, &mut t.q[o..o + 8]);
        }
    }
}

pub(crate) fn many_iq3_s(n: usize, w: &[u8], acts: &[u8], stride: usize, out: &mut [f32]) {
    dot_tiled_many::<32, false, 128>(n, w, acts, stride, out, IQ3_S_BYTES, unpack_iq3_s)
}

pub(crate) fn dot_iq3_s(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut out = [0f32];
    many_iq3_s(n, w, a, a.len(), &mut out);
    out[0]
}

pub(crate) fn many_iq1_s(n: usize, w: &[u8], acts: &[u8], stride: usize, out: &mut [f32]) {
    dot_tiled_many::<32, false, 128>(n, w, acts, stride, out, IQ1_S_BYTES, unpack_iq1_s)
}

pub(crate) fn dot_iq1_s(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut out = [0f32];
    many_iq1_s(n, w, a, a.len(), &mut out);
    out[0]
}

pub(crate) fn many_iq1_m(n: usize, w: &[u8], acts: &[u8], stride: usize, out: &mut [f32]) {
    dot_tiled_many::<16, false, 128>(n, w, acts, stride, out, IQ1_M_BYTES, unpack_iq1_m)
}

pub(crate) fn dot_iq1_m(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut out = [0f32];
    many_iq1_m(n, w, a, a.len(), &mut out);
    out[0]
}

/// The int8 GEMM's row decoder (fast numerics, `gemm.rs`) for the grid types, from their tiled
/// unpack: the codes (the value plus 128, the GEMM layout's offset; IQ1's 8 times the value)
/// and `d * scale` per sub-block of `SUBBLK`.
fn gemm_decode<const SUBBLK: usize>(
    bytes: usize,
    unpack: fn(&[u8], &mut Unpacked),
    row: &[u8],
    q: &mut [u8],
    scale: &mut [f32],
) {
    let n_sub = QK_K / SUBBLK;
    let mut t = Unpacked::new();
    for (b, x) in row.chunks_exact(bytes).enumerate() {
        unpack(x, &mut t);
        q[QK_K * b..QK_K * (b + 1)].copy_from_slice(&t.q);
        for s in 0..n_sub {
            scale[n_sub * b + s] = t.d * t.scales[s] as f32;
        }
    }
}

pub(crate) fn gemm_decode_iq3_s(row: &[u8], q: &mut [u8], scale: &mut [f32], _min: &mut [f32]) {
    gemm_decode::<32>(IQ3_S_BYTES, unpack_iq3_s, row, q, scale)
}

pub(crate) fn gemm_decode_iq1_s(row: &[u8], q: &mut [u8], scale: &mut [f32], _min: &mut [f32]) {
    gemm_decode::<32>(IQ1_S_BYTES, unpack_iq1_s, row, q, scale)
}

pub(crate) fn gemm_decode_iq1_m(row: &[u8], q: &mut [u8], scale: &mut [f32], _min: &mut [f32]) {
    gemm_decode::<16>(IQ1_M_BYTES, unpack_iq1_m, row, q, scale)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{dequantize_row, quantize_row, quantize_weights_row};

    fn data(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2654435761).wrapping_add(12345);
        (0..n)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                ((s % 2001) as f32 / 1000.0 - 1.0) * (1.0 + (i % 7) as f32)
            })
            .collect()
    }

    const TYPES: [GgmlType; 6] = [
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::IQ4_XS,
    ];

    #[test]
    fn close_to_vec_dot_and_dequantized_dot() {
        let n = 1024;
        let x = data(n, 1);
        let y = data(n, 2);
        let mut a = vec![0u8; GgmlType::Q8_K.row_bytes(n as u64).unwrap() as usize];
        quantize_row(GgmlType::Q8_K, &y, &mut a).unwrap();
        let mut ad = vec![0f32; n];
        dequantize_row(GgmlType::Q8_K, &a, &mut ad).unwrap();
        for ty in TYPES {
            let mut w = vec![0u8; ty.row_bytes(n as u64).unwrap() as usize];
            quantize_weights_row(ty, &x, &mut w).unwrap();
            let mut wd = vec![0f32; n];
            dequantize_row(ty, &w, &mut wd).unwrap();
            let want: f64 = wd.iter().zip(&ad).map(|(p, q)| *p as f64 * *q as f64).sum();
            let got = tiled_dot_fn(ty, n).unwrap()(n, &w, &a) as f64;
            assert!(
                (got - want).abs() < 1e-3 * want.abs().max(1.0),
                "{ty}: {got} vs {want}"
            );
            let vd = crate::vec_dot(ty, n, &w, &a).unwrap() as f64;
            assert!(
                (got - vd).abs() < 1e-3 * vd.abs().max(1.0),
                "{ty}: {got} vs {vd}"
            );
        }
    }

    /// The IQ1/IQ2/IQ3 types (no weight quantizer): random raw blocks with a finite scale of
    /// about 1/64.
    #[test]
    fn iq_types_close_to_vec_dot_and_dequantized_dot() {
        let n = 1024;
        let y = data(n, 2);
        let mut a = vec![0u8; GgmlType::Q8_K.row_bytes(n as u64).unwrap() as usize];
        quantize_row(GgmlType::Q8_K, &y, &mut a).unwrap();
        let mut ad = vec![0f32; n];
        dequantize_row(GgmlType::Q8_K, &a, &mut ad).unwrap();
        for ty in GgmlType::IQ_GRID {
            let ts = ty.type_size();
            let mut w: Vec<u8> = data(n / QK_K * ts, 3)
                .iter()
                .map(|v| (v.to_bits() >> 7) as u8)
                .collect();
            for blk in w.chunks_exact_mut(ts) {
                let d = crate::f32_to_fp16(1.0 / 64.0);
                if ty == GgmlType::IQ1_M {
                    crate::iq1::set_iq1m_scale(blk, d);
                } else {
                    blk[..2].copy_from_slice(&d.to_le_bytes());
                }
            }
            let mut wd = vec![0f32; n];
            dequantize_row(ty, &w, &mut wd).unwrap();
            let want: f64 = wd.iter().zip(&ad).map(|(p, q)| *p as f64 * *q as f64).sum();
            let mag: f64 = wd
                .iter()
                .zip(&ad)
                .map(|(p, q)| (*p as f64 * *q as f64).abs())
                .sum();
            let got = tiled_dot_fn(ty, n).unwrap()(n, &w, &a) as f64;
            assert!((got - want).abs() < 1e-5 * mag, "{ty}: {got} vs {want}");
            let vd = crate::vec_dot(ty, n, &w, &a).unwrap() as f64;
            assert!((got - vd).abs() < 1e-5 * mag, "{ty}: {got} vs {vd}");
        }
    }

    #[test]
    fn eligibility() {
        for ty in TYPES.into_iter().chain(GgmlType::IQ_GRID) {
            assert!(!tiled_used_for_mul_mat(ty, 7));
            assert!(tiled_used_for_mul_mat(ty, 8));
            assert!(tiled_used_for_mul_mat_id(ty, 8));
            assert!(!tiled_used_for_mul_mat_id(ty, 1));
            assert!(tiled_dot_fn(ty, 512).is_some());
        }
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q8_0,
            GgmlType::F32,
            GgmlType::IQ4_NL,
        ] {
            assert!(!tiled_used_for_mul_mat(ty, 64));
            assert!(tiled_dot_fn(ty, 512).is_none());
        }
    }
}
