//! K-quants: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (256-element super-blocks) and the Q8_K activation
//! format they are multiplied with.
//!
//! Layouts (little-endian; `d`, `dmin` are IEEE halves), from ggml-common.h:
//!
//! | type | bytes | layout                                                             |
//! |------|-------|--------------------------------------------------------------------|
//! | Q2_K | 84    | `scales[16]` (lo nibble scale, hi nibble min), `qs[64]`, d, dmin   |
//! | Q3_K | 110   | `hmask[32]`, `qs[64]`, `scales[12]` (16 x 6 bit), d                |
//! | Q4_K | 144   | d, dmin, `scales[12]` (8 x 6-bit scale + 8 x 6-bit min), `qs[128]` |
//! | Q5_K | 176   | d, dmin, `scales[12]`, `qh[32]`, `qs[128]`                         |
//! | Q6_K | 210   | `ql[128]`, `qh[64]`, `scales[16]` (i8), d                          |
//! | Q8_K | 292   | d (f32), `qs[256]` (i8), `bsums[16]` (i16, sums of 16 quants)      |
//!
//! Ports of ggml-quants.c `dequantize_row_*`, `quantize_row_*_ref` (with `make_qx_quants`,
//! `make_q3_quants`, `make_qkx2_quants`, `nearest_int`; this is what llama-quantize runs without
//! an importance matrix — ggml-base is built without `-march=native`, so no FMA contraction and
//! these plain f32 ports are bit-exact), `quantize_row_q8_K_ref` (what x86 ggml-cpu uses for
//! activations) and ggml-cpu/quants.c `ggml_vec_dot_*_q8_K_generic` (same integer sums, same
//! 8-lane `aux32` accumulation and per-super-block float formula).
//!
//! Verified by: known-answer blocks, round-trip error bounds, vec_dot vs dequantized dot, and
//! SIMD-vs-scalar property tests on random raw blocks (`tests/`).

use crate::common::*;
use crate::f16::{f32_to_fp16, fp16_to_f32};
use crate::QK_K;

pub const Q2_K_BYTES: usize = 84;
pub const Q3_K_BYTES: usize = 110;
pub const Q4_K_BYTES: usize = 144;
pub const Q5_K_BYTES: usize = 176;
pub const Q6_K_BYTES: usize = 210;
pub const Q8_K_BYTES: usize = 292;

pub(crate) const GROUP_MAX_EPS: f32 = 1e-15;

// ---------------------------------------------------------------------------------------------
// quantization helpers (ggml-quants.c)

/// `make_qx_quants`: symmetric scale search; `qw` are importance weights (`None`: weights from
/// `rmse_type`). Used by Q6_K and, with weights, by the importance-matrix quantizers.
pub(crate) fn make_qx_quants(
    nmax: i32,
    x: &[f32],
    l_out: &mut [i8],
    rmse_type: i32,
    qw: Option<&[f32]>,
) -> f32 {
    let n = x.len();
    let mut max = 0f32;
    let mut amax = 0f32;
    for &xi in x {
        let ax = xi.abs();
        if ax > amax {
            amax = ax;
            max = xi;
        }
    }
    if amax < GROUP_MAX_EPS {
        l_out[..n].fill(0);
        return 0.0;
    }
    let mut iscale = (-nmax) as f32 / max;
    if rmse_type == 0 {
        for i in 0..n {
            let l = nearest_int(iscale * x[i]);
            l_out[i] = (nmax + (-nmax).max((nmax - 1).min(l))) as i8;
        }
        return 1.0 / iscale;
    }
    let mut rmse_type = rmse_type;
    let mut return_early = false;
    if rmse_type < 0 {
        rmse_type = -rmse_type;
        return_early = true;
    }
    let weight = |i: usize| -> f32 {
        let xi = x[i];
        match (qw, rmse_type) {
            (Some(qw), _) => qw[i],
            (None, 1) => xi * xi,
            (None, 2) => 1.0,
            (None, 3) => xi.abs(),
            (None, _) => xi.abs().sqrt(),
        }
    };
    let mut sumlx = 0f32;
    let mut suml2 = 0f32;
    for i in 0..n {
        let mut l = nearest_int(iscale * x[i]);
        l = (-nmax).max((nmax - 1).min(l));
        l_out[i] = (l + nmax) as i8;
        let w = weight(i);
        let lf = l as f32;
        sumlx += w * x[i] * lf;
        suml2 += w * lf * lf;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    if return_early {
        return if suml2 > 0.0 {
            0.5 * (scale + 1.0 / iscale)
        } else {
            1.0 / iscale
        };
    }
    let mut best = scale * sumlx;
    for is in -9i32..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for i in 0..n {
            let mut l = nearest_int(iscale * x[i]);
            l = (-nmax).max((nmax - 1).min(l));
            let w = weight(i);
            let lf = l as f32;
            sumlx += w * x[i] * lf;
            suml2 += w * lf * lf;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for i in 0..n {
                let l = nearest_int(iscale * x[i]);
                l_out[i] = (nmax + (-nmax).max((nmax - 1).min(l))) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// `make_q3_quants` (used by Q3_K with `do_rmse = true`).
fn make_q3_quants(nmax: i32, x: &[f32], l_out: &mut [i8], do_rmse: bool) -> f32 {
    let n = x.len();
    let mut max = 0f32;
    let mut amax = 0f32;
    for &xi in x {
        let ax = xi.abs();
        if ax > amax {
            amax = ax;
            max = xi;
        }
    }
    if amax < GROUP_MAX_EPS {
        l_out[..n].fill(0);
        return 0.0;
    }
    let iscale = (-nmax) as f32 / max;
    if do_rmse {
        let mut sumlx = 0f32;
        let mut suml2 = 0f32;
        for i in 0..n {
            let mut l = nearest_int(iscale * x[i]);
            l = (-nmax).max((nmax - 1).min(l));
            l_out[i] = l as i8;
            let w = x[i] * x[i];
            let lf = l as f32;
            sumlx += w * x[i] * lf;
            suml2 += w * lf * lf;
        }
        for _itry in 0..5 {
            let mut n_changed = 0;
            for i in 0..n {
                let w = x[i] * x[i];
                let li = l_out[i] as f32;
                let mut slx = sumlx - w * x[i] * li;
                if slx > 0.0 {
                    let mut sl2 = suml2 - w * li * li;
                    let mut new_l = nearest_int(x[i] * sl2 / slx);
                    new_l = (-nmax).max((nmax - 1).min(new_l));
                    if new_l != l_out[i] as i32 {
                        let nl = new_l as f32;
                        slx += w * x[i] * nl;
                        sl2 += w * nl * nl;
                        if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                            l_out[i] = new_l as i8;
                            sumlx = slx;
                            suml2 = sl2;
                            n_changed += 1;
                        }
                    }
                }
            }
            if n_changed == 0 {
                break;
            }
        }
        for li in l_out[..n].iter_mut() {
            *li += nmax as i8;
        }
        return if suml2 > 0.0 { sumlx / suml2 } else { 0.0 };
    }
    for i in 0..n {
        let mut l = nearest_int(iscale * x[i]);
        l = (-nmax).max((nmax - 1).min(l));
        l_out[i] = (l + nmax) as i8;
    }
    1.0 / iscale
}

/// ggml's `make_qkx2_quants` and `make_qkx3_quants`: asymmetric (scale + min) search with
/// weights, used by Q2_K, Q4_K and Q5_K and by the importance-matrix quantizers (Q2_K, Q4_K,
/// Q5_K, Q4_1, Q5_1). Returns `(scale, the_min)` where `the_min` is the (non-negative) value
/// stored as "min".
///
/// The two C functions do the same float operations in the same order; they differ only in
/// `make_qkx3_quants` accepting NULL weights (then `x^2`; no caller here passes none) and
/// testing `max <= min` where `make_qkx2_quants` tests `max == min`. The tests agree: `min <=
/// x[0] <= max` unless `x[0]` is NaN, and clamping `min` to at most 0 keeps `min <= max`, so
/// `max < min` never holds; a NaN `x[0]` leaves `min` and `max` NaN and both tests false.
///
/// Inlined into each of its six callers, which fix `nmax`, `nstep` and `use_mad` (left to
/// LLVM, one out-of-line copy serves them all and the quantizers run ~25% more instructions).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn make_qkx_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l_out: &mut [u8],
    laux: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let n = x.len();
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l_out[..n].fill(0);
        return (0.0, -min);
    }
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min));
        l_out[i] = 0.max(nmax.min(l)) as u8;
        let mut diff = scale * l_out[i] as f32 + min - x[i];
        diff = if use_mad { diff.abs() } else { diff * diff };
        best_error += weights[i] * diff;
    }
    if nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let mut sum_l = 0f32;
        let mut sum_l2 = 0f32;
        let mut sum_xl = 0f32;
        for i in 0..n {
            let mut l = nearest_int(iscale * (x[i] - min));
            l = 0.max(nmax.min(l));
            laux[i] = l as u8;
            let w = weights[i];
            let lf = l as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let dd = sum_w * sum_l2 - sum_l * sum_l;
        if dd > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / dd;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / dd;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0f32;
            for i in 0..n {
                let mut diff = this_scale * laux[i] as f32 + this_min - x[i];
                diff = if use_mad { diff.abs() } else { diff * diff };
                cur_error += weights[i] * diff;
            }
            if cur_error < best_error {
                l_out[..n].copy_from_slice(&laux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

// ---------------------------------------------------------------------------------------------
// Q2_K

/// Dequantize a Q2_K row (`dst.len()` a multiple of 256).
pub fn dequantize_row_q2_k(src: &[u8], dst: &mut [f32]) {
    let nb = dst.len() / QK_K;
    for (x, y) in src[..nb * Q2_K_BYTES]
        .chunks_exact(Q2_K_BYTES)
        .zip(dst.chunks_exact_mut(QK_K))
    {
        let scales = &x[0..16];
        let qs = &x[16..80];
        let d = rd_f16(x, 80);
        let min = rd_f16(x, 82);
        let mut is = 0;
        let mut yi = 0;
        for half in 0..2 {
            let q = &qs[32 * half..32 * half + 32];
            for shift in [0u32, 2, 4, 6] {
                for part in 0..2 {
                    let sc = scales[is];
                    is += 1;
                    let dl = d * (sc & 0xF) as f32;
                    let ml = min * (sc >> 4) as f32;
                    for l in 0..16 {
                        let qv = ((q[16 * part + l] >> shift) & 3) as f32;
                        y[yi] = dl * qv - ml;
                        yi += 1;
                    }
                }
            }
        }
    }
}

/// Quantize a row to Q2_K (`quantize_row_q2_K_ref`).
pub fn quantize_row_q2_k(src: &[f32], dst: &mut [u8]) {
    let nb = src.len() / QK_K;
    let mut l = [0u8; QK_K];
    let mut laux = [0u8; 16];
    let mut weights = [0f32; 16];
    let mut mins = [0f32; QK_K / 16];
    let mut scales = [0f32; QK_K / 16];
    const Q4SCALE: f32 = 15.0;
    for (x, y) in src
        .chunks_exact(QK_K)
        .zip(dst[..nb * Q2_K_BYTES].chunks_exact_mut(Q2_K_BYTES))
    {
        let mut max_scale = 0f32;
        let mut max_min = 0f32;
        for j in 0..QK_K / 16 {
            let xs = &x[16 * j..16 * j + 16];
            for (w, v) in weights.iter_mut().zip(xs) {
                *w = v.abs();
            }
            let (s, m) = make_qkx_quants(
                3,
                xs,
                &weights,
                &mut l[16 * j..16 * j + 16],
                &mut laux,
                -0.5,
                0.1,
                15,
                true,
            );
            scales[j] = s;
            mins[j] = m;
            if s > max_scale {
                max_scale = s;
            }
            if m > max_min {
                max_min = m;
            }
        }
        let (ysc, rest) = y.split_at_mut(16);
        if max_scale > 0.0 {
            let iscale = Q4SCALE / max_scale;
            for j in 0..QK_K / 16 {
                ysc[j] = nearest_int(iscale * scales[j]) as u8;
            }
            wr_u16(rest, 64, f32_to_fp16(max_scale / Q4SCALE));
        } else {
            ysc.fill(0);
            wr_u16(rest, 64, f32_to_fp16(0.0));
        }
        if max_min > 0.0 {
            let iscale = Q4SCALE / max_min;
            for j in 0..QK_K / 16 {
                let lm = nearest_int(iscale * mins[j]);
                ysc[j] |= (lm << 4) as u8;
            }
            wr_u16(rest, 66, f32_to_fp16(max_min / Q4SCALE));
        } else {
            wr_u16(rest, 66, f32_to_fp16(0.0));
        }
        q2_k_final_quants(x, y, &mut l);
    }
}

/// The end of both Q2_K quantizers once the block's packed scales (`y[0..16]`) and `d`,
/// `dmin` (`y[80..84]`) are written: the 2-bit quants of every value against them, packed
/// into `y[16..80]`. `l` holds the first pass's quants, kept where a scale is 0. Inlined (out
/// of line the reference Q2_K quantizer ran 5% more instructions).
#[inline(always)]
pub(crate) fn q2_k_final_quants(x: &[f32], y: &mut [u8], l: &mut [u8; QK_K]) {
    let yd = rd_f16(y, 80);
    let ydmin = rd_f16(y, 82);
    for j in 0..QK_K / 16 {
        let d = yd * (y[j] & 0xF) as f32;
        if d == 0.0 {
            continue;
        }
        let dm = ydmin * (y[j] >> 4) as f32;
        for ii in 0..16 {
            let li = nearest_int((x[16 * j + ii] + dm) / d);
            l[16 * j + ii] = 0.max(3.min(li)) as u8;
        }
    }
    pack_2bit(l, &mut y[16..80]);
}

/// 2-bit quants `l` into Q2_K / Q3_K's `qs[64]`: byte `32 i + k` of each 128-value half holds
/// values `k`, `k + 32`, `k + 64`, `k + 96` from the low bits up.
fn pack_2bit(l: &[u8; QK_K], qs: &mut [u8]) {
    for j in (0..QK_K).step_by(128) {
        for k in 0..32 {
            qs[j / 4 + k] =
                l[j + k] | (l[j + k + 32] << 2) | (l[j + k + 64] << 4) | (l[j + k + 96] << 6);
        }
    }
}

/// Q2_K weights x Q8_K activations (`ggml_vec_dot_q2_K_q8_K_generic`).
pub fn vec_dot_q2_k_q8_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let nb = n / QK_K;
    let mut sumf = 0f32;
    for (x, y) in w[..nb * Q2_K_BYTES]
        .chunks_exact(Q2_K_BYTES)
        .zip(a[..nb * Q8_K_BYTES].chunks_exact(Q8_K_BYTES))
    {
        let sc = &x[0..16];
        let q2 = &x[16..80];
        let yd = rd_f32(y, 0);
        let q8 = &y[4..260];
        let mut summs = 0i32;
        for (j, s) in sc.iter().enumerate() {
            summs += rd_i16(y, 260 + 2 * j) as i32 * (s >> 4) as i32;
        }
        let dall = yd * rd_f16(x, 80);
        let dmin = yd * rd_f16(x, 82);
        let mut isum = 0i32;
        let mut is = 0;
        let mut q8o = 0;
        for k in 0..2 {
            let q2k = &q2[32 * k..32 * k + 32];
            for shift in [0u32, 2, 4, 6] {
                for part in 0..2 {
                    let d = (sc[is] & 0xF) as i32;
                    is += 1;
                    let mut isuml = 0i32;
                    for l in 16 * part..16 * part + 16 {
                        isuml += (q8[q8o + l] as i8) as i32 * ((q2k[l] >> shift) & 3) as i32;
                    }
                    isum += d * isuml;
                }
                q8o += 32;
            }
        }
        sumf += dall * isum as f32 - dmin * summs as f32;
    }
    sumf
}

// ---------------------------------------------------------------------------------------------
// Q3_K

/// Dequantize a Q3_K row.
pub fn dequantize_row_q3_k(src: &[u8], dst: &mut [f32]) {
    let nb = dst.len() / QK_K;
    for (x, y) in src[..nb * Q3_K_BYTES]
        .chunks_exact(Q3_K_BYTES)
        .zip(dst.chunks_exact_mut(QK_K))
    {
        let hm = &x[0..32];
        let qs = &x[32..96];
        let scales = q3k_scales(&x[96..108]);
        let d_all = rd_f16(x, 108);
        let mut m = 1u8;
        let mut is = 0;
        let mut yi = 0;
        for half in 0..2 {
            let q = &qs[32 * half..32 * half + 32];
            for shift in [0u32, 2, 4, 6] {
                for part in 0..2 {
                    let dl = d_all * (scales[is] as i32 - 32) as f32;
                    is += 1;
                    for l in 16 * part..16 * part + 16 {
                        let v = ((q[l] >> shift) & 3) as i32 - if hm[l] & m != 0 { 0 } else { 4 };
                        y[yi] = dl * v as f32;
                        yi += 1;
                    }
                }
                m <<= 1;
            }
        }
    }
}

/// Quantize a row to Q3_K (`quantize_row_q3_K_ref`).
pub fn quantize_row_q3_k(src: &[f32], dst: &mut [u8]) {
    let nb = src.len() / QK_K;
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; QK_K / 16];
    for (x, y) in src
        .chunks_exact(QK_K)
        .zip(dst[..nb * Q3_K_BYTES].chunks_exact_mut(Q3_K_BYTES))
    {
        let mut max_scale = 0f32;
        let mut amax = 0f32;
        for j in 0..QK_K / 16 {
            scales[j] = make_q3_quants(
                4,
                &x[16 * j..16 * j + 16],
                &mut l[16 * j..16 * j + 16],
                true,
            );
            let scale = scales[j].abs();
            if scale > amax {
                amax = scale;
                max_scale = scales[j];
            }
        }
        let (hmask, rest) = y.split_at_mut(32);
        let (qs, rest) = rest.split_at_mut(64);
        let (ysc, yd) = rest.split_at_mut(12);
        ysc.fill(0);
        if max_scale != 0.0 {
            let iscale = -32.0f32 / max_scale;
            for j in 0..QK_K / 16 {
                let li = nearest_int(iscale * scales[j]) as i8;
                set_q3_k_scale(j, ((-32i8).max(31i8.min(li)) + 32) as u8, ysc);
            }
            wr_u16(yd, 0, f32_to_fp16(1.0 / iscale));
        } else {
            wr_u16(yd, 0, f32_to_fp16(0.0));
        }
        q3_k_final_quants(x, ysc, yd, &mut l, hmask, qs);
    }
}

/// Store sub-block `j`'s 6-bit scale `ls` (0..63) in the 12 scale bytes `ysc` of a Q3_K block
/// (the inverse of `q3k_scales`): its low four bits in the low nibble of byte `j` (for `j >= 8`
/// the high nibble of byte `j - 8`), its top two bits at bit `2 (j / 4)` of byte `8 + j % 4`.
/// `ysc` starts zeroed and `j` goes 0..16 in order (bits are ORed in).
#[inline(always)]
pub(crate) fn set_q3_k_scale(j: usize, ls: u8, ysc: &mut [u8]) {
    if j < 8 {
        ysc[j] = ls & 0xF;
    } else {
        ysc[j - 8] |= (ls & 0xF) << 4;
    }
    ysc[j % 4 + 8] |= (ls >> 4) << (2 * (j / 4));
}

/// The end of both Q3_K quantizers once the packed scales `ysc` and super-block scale `yd`
/// are written: the 3-bit quants of every value against them, split into the high bit
/// (`hmask`) and the 2-bit rest (`qs`).
pub(crate) fn q3_k_final_quants(
    x: &[f32],
    ysc: &[u8],
    yd: &[u8],
    l: &mut [i8; QK_K],
    hmask: &mut [u8],
    qs: &mut [u8],
) {
    let dall = fp16_to_f32(rd_u16(yd, 0));
    for j in 0..QK_K / 16 {
        let lo = if j < 8 { ysc[j] & 0xF } else { ysc[j - 8] >> 4 };
        let sc = (lo | (((ysc[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) as i32 - 32;
        let d = dall * sc as f32;
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            let li = nearest_int(x[16 * j + ii] / d);
            l[16 * j + ii] = ((-4).max(3.min(li)) + 4) as i8;
        }
    }
    hmask.fill(0);
    let mut m = 0;
    let mut hm = 1u8;
    for lj in l.iter_mut() {
        if *lj > 3 {
            hmask[m] |= hm;
            *lj -= 4;
        }
        m += 1;
        if m == QK_K / 8 {
            m = 0;
            hm = hm.wrapping_shl(1);
        }
    }
    let lu: [u8; QK_K] = std::array::from_fn(|i| l[i] as u8);
    pack_2bit(&lu, qs);
}

/// Q3_K weights x Q8_K activations (`ggml_vec_dot_q3_K_q8_K_generic`).
pub fn vec_dot_q3_k_q8_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let nb = n / QK_K;
    let mut sums = [0f32; 8];
    let mut aux8 = [0i8; QK_K];
    for (x, y) in w[..nb * Q3_K_BYTES]
        .chunks_exact(Q3_K_BYTES)
        .zip(a[..nb * Q8_K_BYTES].chunks_exact(Q8_K_BYTES))
    {
        let hm = &x[0..32];
        let q3 = &x[32..96];
        let q8 = &y[4..260];
        let mut ai = 0;
        let mut m = 1u8;
        for half in 0..2 {
            let q = &q3[32 * half..32 * half + 32];
            for shift in [0u32, 2, 4, 6] {
                for l in 0..32 {
                    aux8[ai + l] = ((q[l] >> shift) & 3) as i8 - if hm[l] & m != 0 { 0 } else { 4 };
                }
                ai += 32;
                m = m.wrapping_shl(1);
            }
        }
        let scales = q3k_scales(&x[96..108]);
        let mut aux32 = [0i32; 8];
        for j in 0..QK_K / 16 {
            let s = scales[j] as i32 - 32;
            for g in 0..2 {
                let o = 16 * j + 8 * g;
                for l in 0..8 {
                    aux32[l] += s * ((q8[o + l] as i8) as i32 * aux8[o + l] as i32);
                }
            }
        }
        let d = rd_f16(x, 108) * rd_f32(y, 0);
        for l in 0..8 {
            sums[l] += d * aux32[l] as f32;
        }
    }
    let mut sumf = 0f32;
    for s in sums {
        sumf += s;
    }
    sumf
}

/// The 256 quants of a Q4_K block in element order (0..15).
#[inline]
pub(crate) fn q4_k_quants(x: &[u8], out: &mut [u8]) {
    let q4 = &x[16..144];
    for j in 0..4 {
        for l in 0..32 {
            out[64 * j + l] = q4[32 * j + l] & 0xF;
            out[64 * j + 32 + l] = q4[32 * j + l] >> 4;
        }
    }
}

/// The 256 quants of a Q5_K block in element order (0..31).
#[inline]
pub(crate) fn q5_k_quants(x: &[u8], out: &mut [u8]) {
    let hm = &x[16..48];
    let q4 = &x[48..176];
    for j in 0..4 {
        for l in 0..32 {
            let h0 = ((hm[l] >> (2 * j)) & 1) << 4;
            let h1 = ((hm[l] >> (2 * j + 1)) & 1) << 4;
            out[64 * j + l] = (q4[32 * j + l] & 0xF) | h0;
            out[64 * j + 32 + l] = (q4[32 * j + l] >> 4) | h1;
        }
    }
}

/// The 256 stored six-bit quants of a Q6_K block in element order (0..63; the value is q - 32).
#[inline]
pub(crate) fn q6_k_quants(x: &[u8], out: &mut [u8]) {
    for half in 0..2 {
        let ql = &x[64 * half..64 * half + 64];
        let qh = &x[128 + 32 * half..128 + 32 * half + 32];
        let o = &mut out[128 * half..128 * half + 128];
        for l in 0..32 {
            o[l] = (ql[l] & 0xF) | ((qh[l] & 3) << 4);
            o[l + 32] = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
            o[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
            o[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Q4_K

/// Dequantize a Q4_K row.
pub fn dequantize_row_q4_k(src: &[u8], dst: &mut [f32]) {
    let nb = dst.len() / QK_K;
    for (x, y) in src[..nb * Q4_K_BYTES]
        .chunks_exact(Q4_K_BYTES)
        .zip(dst.chunks_exact_mut(QK_K))
    {
        let d = rd_f16(x, 0);
        let min = rd_f16(x, 2);
        let scales = &x[4..16];
        let qs = &x[16..144];
        for j in 0..4 {
            let (sc1, m1) = get_scale_min_k4(2 * j, scales);
            let (sc2, m2) = get_scale_min_k4(2 * j + 1, scales);
            let d1 = d * sc1 as f32;
            let m1 = min * m1 as f32;
            let d2 = d * sc2 as f32;
            let m2 = min * m2 as f32;
            let q = &qs[32 * j..32 * j + 32];
            let yo = &mut y[64 * j..64 * j + 64];
            for l in 0..32 {
                yo[l] = d1 * (q[l] & 0xF) as f32 - m1;
                yo[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
            }
        }
    }
}

/// Shared tail of Q4_K / Q5_K quantization: pack 8 (scale, min) pairs into 12 bytes and return
/// the fp16 super-block scales.
fn pack_k4_scales(scales: &[f32; 8], mins: &[f32; 8], out: &mut [u8]) -> (u16, u16) {
    let mut max_scale = 0f32;
    let mut max_min = 0f32;
    for j in 0..8 {
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    for j in 0..8 {
        let ls = 63u8.min(nearest_int(inv_scale * scales[j]) as u8);
        let lm = 63u8.min(nearest_int(inv_min * mins[j]) as u8);
        set_scale_min_k4(j, ls, lm, out);
    }
    (f32_to_fp16(max_scale / 63.0), f32_to_fp16(max_min / 63.0))
}

/// Store sub-block `j`'s 6-bit scale `sc` and min `m` in the 12 packed scale bytes `q` of a
/// Q4_K / Q5_K block (the inverse of [`get_scale_min_k4`]). Call it for `j` = 0..8 in order:
/// 4..8 OR their top bits into bytes that 0..4 set.
#[inline(always)]
pub(crate) fn set_scale_min_k4(j: usize, sc: u8, m: u8, q: &mut [u8]) {
    if j < 4 {
        q[j] = sc;
        q[j + 4] = m;
    } else {
        q[j + 4] = (sc & 0xF) | ((m & 0xF) << 4);
        q[j - 4] |= (sc >> 4) << 6;
        q[j] |= (m >> 4) << 6;
    }
}

/// First stage of Q4_K / Q5_K quantization: per 32-element sub-block `make_qkx_quants` with
/// weights `sqrt(mean(x^2)) + |x|`.
fn k4_subblock_scales(
    x: &[f32],
    nmax: i32,
    rmin: f32,
    nstep: i32,
    l: &mut [u8; QK_K],
) -> ([f32; 8], [f32; 8]) {
    let mut scales = [0f32; 8];
    let mut mins = [0f32; 8];
    let mut weights = [0f32; 32];
    let mut laux = [0u8; 32];
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0f32;
        for v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        let (s, m) = make_qkx_quants(
            nmax,
            xs,
            &weights,
            &mut l[32 * j..32 * j + 32],
            &mut laux,
            rmin,
            0.1,
            nstep,
            false,
        );
        scales[j] = s;
        mins[j] = m;
    }
    (scales, mins)
}

/// Final quants of Q4_K / Q5_K given the packed scales.
pub(crate) fn k4_final_quants(
    x: &[f32],
    d: u16,
    dmin: u16,
    packed: &[u8],
    nmax: i32,
    l: &mut [u8; QK_K],
) {
    let d = fp16_to_f32(d);
    let dmin = fp16_to_f32(dmin);
    for j in 0..8 {
        let (sc, m) = get_scale_min_k4(j, packed);
        let dd = d * sc as f32;
        if dd == 0.0 {
            continue;
        }
        let dm = dmin * m as f32;
        for ii in 0..32 {
            let li = nearest_int((x[32 * j + ii] + dm) / dd);
            l[32 * j + ii] = 0.max(nmax.min(li)) as u8;
        }
    }
}

/// Quantize a row to Q4_K (`quantize_row_q4_K_ref`).
pub fn quantize_row_q4_k(src: &[f32], dst: &mut [u8]) {
    let nb = src.len() / QK_K;
    let mut l = [0u8; QK_K];
    for (x, y) in src
        .chunks_exact(QK_K)
        .zip(dst[..nb * Q4_K_BYTES].chunks_exact_mut(Q4_K_BYTES))
    {
        let (scales, mins) = k4_subblock_scales(x, 15, -1.0, 20, &mut l);
        let (d, dmin) = pack_k4_scales(&scales, &mins, &mut y[4..16]);
        wr_u16(y, 0, d);
        wr_u16(y, 2, dmin);
        k4_final_quants(x, d, dmin, &y[4..16], 15, &mut l);
        pack_q4_k_quants(&l, &mut y[16..144]);
    }
}

/// The 4-bit quants `l` of a Q4_K block into its `qs[128]`: byte `32 j + k` holds value
/// `64 j + k` in its low nibble and `64 j + k + 32` in its high nibble.
pub(crate) fn pack_q4_k_quants(l: &[u8; QK_K], qs: &mut [u8]) {
    for j in 0..4 {
        for k in 0..32 {
            qs[32 * j + k] = l[64 * j + k] | (l[64 * j + k + 32] << 4);
        }
    }
}

/// Q4_K weights x Q8_K activations (`ggml_vec_dot_q4_K_q8_K_generic`).
pub fn vec_dot_q4_k_q8_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    k_dot_with_mins(n, w, a, Q4_K_BYTES, q4_k_quants)
}

/// The generic Q4_K / Q5_K dot product: `unpack` gives a block's quants, mins via bsums.
fn k_dot_with_mins(
    n: usize,
    w: &[u8],
    a: &[u8],
    block_bytes: usize,
    unpack: fn(&[u8], &mut [u8]),
) -> f32 {
    let nb = n / QK_K;
    let mut sums = [0f32; 8];
    let mut sumf = 0f32;
    let mut aux8 = [0u8; QK_K];
    for (x, y) in w[..nb * block_bytes]
        .chunks_exact(block_bytes)
        .zip(a[..nb * Q8_K_BYTES].chunks_exact(Q8_K_BYTES))
    {
        unpack(x, &mut aux8);
        k_dot_tail(x, y, &aux8, &mut sums, &mut sumf);
    }
    for s in sums {
        sumf += s;
    }
    sumf
}

/// Common part of the Q4_K / Q5_K generic dot: mins via bsums, 8-lane scaled integer sums.
#[inline(always)]
fn k_dot_tail(x: &[u8], y: &[u8], aux8: &[u8; QK_K], sums: &mut [f32; 8], sumf: &mut f32) {
    let packed = &x[4..16];
    let mut scales = [0u8; 8];
    let mut mins = [0u8; 8];
    for j in 0..8 {
        let (s, m) = get_scale_min_k4(j, packed);
        scales[j] = s;
        mins[j] = m;
    }
    let q8 = &y[4..260];
    let mut sumi = 0i32;
    for j in 0..16 {
        sumi += rd_i16(y, 260 + 2 * j) as i32 * mins[j / 2] as i32;
    }
    let mut aux32 = [0i32; 8];
    for j in 0..8 {
        let scale = scales[j] as i32;
        for g in 0..4 {
            let o = 32 * j + 8 * g;
            for l in 0..8 {
                aux32[l] += scale * ((q8[o + l] as i8) as i32 * aux8[o + l] as i32);
            }
        }
    }
    let d = rd_f16(x, 0) * rd_f32(y, 0);
    for l in 0..8 {
        sums[l] += d * aux32[l] as f32;
    }
    let dmin = rd_f16(x, 2) * rd_f32(y, 0);
    *sumf -= dmin * sumi as f32;
}

// ---------------------------------------------------------------------------------------------
// Q5_K

/// Dequantize a Q5_K row.
pub fn dequantize_row_q5_k(src: &[u8], dst: &mut [f32]) {
    let nb = dst.len() / QK_K;
    for (x, y) in src[..nb * Q5_K_BYTES]
        .chunks_exact(Q5_K_BYTES)
        .zip(dst.chunks_exact_mut(QK_K))
    {
        let d = rd_f16(x, 0);
        let min = rd_f16(x, 2);
        let scales = &x[4..16];
        let qh = &x[16..48];
        let ql = &x[48..176];
        let mut u1 = 1u8;
        let mut u2 = 2u8;
        for j in 0..4 {
            let (sc1, m1) = get_scale_min_k4(2 * j, scales);
            let (sc2, m2) = get_scale_min_k4(2 * j + 1, scales);
            let d1 = d * sc1 as f32;
            let m1 = min * m1 as f32;
            let d2 = d * sc2 as f32;
            let m2 = min * m2 as f32;
            let q = &ql[32 * j..32 * j + 32];
            let yo = &mut y[64 * j..64 * j + 64];
            for l in 0..32 {
                let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
                let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
                yo[l] = d1 * ((q[l] & 0xF) as i32 + h1) as f32 - m1;
                yo[l + 32] = d2 * ((q[l] >> 4) as i32 + h2) as f32 - m2;
            }
            u1 = u1.wrapping_shl(2);
            u2 = u2.wrapping_shl(2);
        }
    }
}

/// Quantize a row to Q5_K (`quantize_row_q5_K_ref`).
pub fn quantize_row_q5_k(src: &[f32], dst: &mut [u8]) {
    let nb = src.len() / QK_K;
    let mut l = [0u8; QK_K];
    for (x, y) in src
        .chunks_exact(QK_K)
        .zip(dst[..nb * Q5_K_BYTES].chunks_exact_mut(Q5_K_BYTES))
    {
        let (scales, mins) = k4_subblock_scales(x, 31, -0.5, 15, &mut l);
        let (d, dmin) = pack_k4_scales(&scales, &mins, &mut y[4..16]);
        wr_u16(y, 0, d);
        wr_u16(y, 2, dmin);
        k4_final_quants(x, d, dmin, &y[4..16], 31, &mut l);
        pack_q5_k_quants(&l, &mut y[16..176]);
    }
}

/// The 5-bit quants `l` of a Q5_K block into its `qh[32]` and `qs[128]` (`out`).
pub(crate) fn pack_q5_k_quants(l: &[u8; QK_K], out: &mut [u8]) {
    let (qh, ql) = out.split_at_mut(32);
    qh.fill(0);
    let mut m1 = 1u8;
    let mut m2 = 2u8;
    for nblk in 0..4 {
        let n = 64 * nblk;
        for j in 0..32 {
            let mut l1 = l[n + j];
            if l1 > 15 {
                l1 -= 16;
                qh[j] |= m1;
            }
            let mut l2 = l[n + j + 32];
            if l2 > 15 {
                l2 -= 16;
                qh[j] |= m2;
            }
            ql[32 * nblk + j] = l1 | (l2 << 4);
        }
        m1 = m1.wrapping_shl(2);
        m2 = m2.wrapping_shl(2);
    }
}

/// Q5_K weights x Q8_K activations (`ggml_vec_dot_q5_K_q8_K_generic`).
pub fn vec_dot_q5_k_q8_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    k_dot_with_mins(n, w, a, Q5_K_BYTES, q5_k_quants)
}

// ---------------------------------------------------------------------------------------------
// Q6_K

/// Dequantize a Q6_K row.
pub fn dequantize_row_q6_k(src: &[u8], dst: &mut [f32]) {
    let nb = dst.len() / QK_K;
    let mut q = [0u8; QK_K];
    for (x, y) in src[..nb * Q6_K_BYTES]
        .chunks_exact(Q6_K_BYTES)
        .zip(dst.chunks_exact_mut(QK_K))
    {
        let d = rd_f16(x, 208);
        q6_k_quants(x, &mut q);
        // Element i belongs to the sub-block of 16 with scale x[192 + i/16].
        for (i, (yi, &qi)) in y.iter_mut().zip(&q).enumerate() {
            *yi = d * (x[192 + i / 16] as i8) as f32 * (qi as i32 - 32) as f32;
        }
    }
}

/// Quantize a row to Q6_K (`quantize_row_q6_K_ref`).
pub fn quantize_row_q6_k(src: &[f32], dst: &mut [u8]) {
    let nb = src.len() / QK_K;
    for (x, y) in src
        .chunks_exact(QK_K)
        .zip(dst[..nb * Q6_K_BYTES].chunks_exact_mut(Q6_K_BYTES))
    {
        quantize_block_q6_k(x, None, y);
    }
}

/// One Q6_K block of both Q6_K quantizers: `quantize_row_q6_K_ref` (`qw` `None`) and, with the
/// block's importance weights `qw`, `quantize_row_q6_K_impl` (the imatrix values themselves
/// are the weights of `make_qx_quants`; everything else is the same). Inlined, so that each
/// quantizer's `make_qx_quants` loops know whether there are weights (out of line, the
/// reference quantizer ran 30% more instructions).
#[inline(always)]
pub(crate) fn quantize_block_q6_k(x: &[f32], qw: Option<&[f32]>, y: &mut [u8]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; QK_K / 16];
    let mut max_scale = 0f32;
    let mut max_abs_scale = 0f32;
    for ib in 0..QK_K / 16 {
        let r = 16 * ib..16 * ib + 16;
        let scale = make_qx_quants(32, &x[r.clone()], &mut l[r.clone()], 1, qw.map(|qw| &qw[r]));
        scales[ib] = scale;
        let abs_scale = scale.abs();
        if abs_scale > max_abs_scale {
            max_abs_scale = abs_scale;
            max_scale = scale;
        }
    }
    if max_abs_scale < GROUP_MAX_EPS {
        y.fill(0);
        wr_u16(y, 208, f32_to_fp16(0.0));
        return;
    }
    let iscale = -128.0f32 / max_scale;
    wr_u16(y, 208, f32_to_fp16(1.0 / iscale));
    for ib in 0..QK_K / 16 {
        y[192 + ib] = 127.min(nearest_int(iscale * scales[ib])) as i8 as u8;
    }
    let yd = rd_f16(y, 208);
    for j in 0..QK_K / 16 {
        let d = yd * (y[192 + j] as i8) as f32;
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            let li = nearest_int(x[16 * j + ii] / d);
            l[16 * j + ii] = ((-32).max(31.min(li)) + 32) as i8;
        }
    }
    let (ql, rest) = y.split_at_mut(128);
    let qh = &mut rest[0..64];
    for half in 0..2 {
        let j = 128 * half;
        for k in 0..32 {
            let lu = |o: usize| l[j + k + o] as u8;
            let q1 = lu(0) & 0xF;
            let q2 = lu(32) & 0xF;
            let q3 = lu(64) & 0xF;
            let q4 = lu(96) & 0xF;
            ql[64 * half + k] = q1 | (q3 << 4);
            ql[64 * half + k + 32] = q2 | (q4 << 4);
            qh[32 * half + k] =
                (lu(0) >> 4) | ((lu(32) >> 4) << 2) | ((lu(64) >> 4) << 4) | ((lu(96) >> 4) << 6);
        }
    }
}

/// Q6_K weights x Q8_K activations (`ggml_vec_dot_q6_K_q8_K_generic`).
pub fn vec_dot_q6_k_q8_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let nb = n / QK_K;
    let mut sums = [0f32; 8];
    let mut aux8 = [0u8; QK_K];
    for (x, y) in w[..nb * Q6_K_BYTES]
        .chunks_exact(Q6_K_BYTES)
        .zip(a[..nb * Q8_K_BYTES].chunks_exact(Q8_K_BYTES))
    {
        q6_k_quants(x, &mut aux8);
        let q8 = &y[4..260];
        let mut aux32 = [0i32; 8];
        for j in 0..QK_K / 16 {
            let scale = (x[192 + j] as i8) as i32;
            for g in 0..2 {
                let o = 16 * j + 8 * g;
                for l in 0..8 {
                    aux32[l] += scale * ((q8[o + l] as i8) as i32 * (aux8[o + l] as i32 - 32));
                }
            }
        }
        let d = rd_f16(x, 208) * rd_f32(y, 0);
        for l in 0..8 {
            sums[l] += d * aux32[l] as f32;
        }
    }
    let mut sumf = 0f32;
    for s in sums {
        sumf += s;
    }
    sumf
}

// ---------------------------------------------------------------------------------------------
// Q8_K

/// Dequantize a Q8_K row.
pub fn dequantize_row_q8_k(src: &[u8], dst: &mut [f32]) {
    let nb = dst.len() / QK_K;
    for (x, y) in src[..nb * Q8_K_BYTES]
        .chunks_exact(Q8_K_BYTES)
        .zip(dst.chunks_exact_mut(QK_K))
    {
        let d = rd_f32(x, 0);
        for (yj, q) in y.iter_mut().zip(&x[4..260]) {
            *yj = d * (*q as i8) as f32;
        }
    }
}

/// Quantize activations to Q8_K (`quantize_row_q8_K_ref`, which x86 ggml-cpu uses as is):
/// `iscale = -127/max` (signed max), `nearest_int` (ties to even), block sums of 16.
/// For an all-zero block the sums are written as zero (ggml leaves them untouched).
pub fn quantize_row_q8_k(src: &[f32], dst: &mut [u8]) {
    let nb = src.len() / QK_K;
    for (x, y) in src
        .chunks_exact(QK_K)
        .zip(dst[..nb * Q8_K_BYTES].chunks_exact_mut(Q8_K_BYTES))
    {
        let mut max = 0f32;
        let mut amax = 0f32;
        for &v in x {
            let ax = v.abs();
            if ax > amax {
                amax = ax;
                max = v;
            }
        }
        if amax == 0.0 {
            y.fill(0);
            continue;
        }
        let iscale = -127.0f32 / max;
        for j in 0..QK_K {
            let v = nearest_int(iscale * x[j]);
            y[4 + j] = 127.min(v) as i8 as u8;
        }
        for j in 0..QK_K / 16 {
            let mut sum = 0i32;
            for ii in 0..16 {
                sum += (y[4 + 16 * j + ii] as i8) as i32;
            }
            wr_i16(y, 260 + 2 * j, sum as i16);
        }
        wr_f32(y, 0, 1.0 / iscale);
    }
}
