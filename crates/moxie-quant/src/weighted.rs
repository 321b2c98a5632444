//! What llama-quantize writes when it has an importance matrix: ggml-quants.c's
//! `quantize_row_<type>_impl(x, y, n_per_row, quant_weights)` for Q2_K..Q6_K and
//! Q4_0/Q4_1/Q5_0/Q5_1 (IQ4_NL / IQ4_XS take theirs in `iq4`). Without weights ggml runs the
//! `_ref` quantizers instead (`kquants`, `legacy`); with them it searches scales that minimise
//! the weighted error, `weight = qw * sqrt(sigma2 + x^2)` for most types.
//!
//! Each function quantizes one row: `src` and `qw` are `n_per_row` long (several types take
//! statistics over the whole row), `dst` holds the row's blocks. Plain f32 arithmetic in C's
//! evaluation order (ggml-base is built without FMA contraction), so results are bit-exact;
//! `tests/imatrix_golden.rs` checks them against ggml's compiled code.

use crate::common::*;
use crate::f16::f32_to_fp16;
use crate::kquants::{
    k4_final_quants, make_qkx_quants, make_qx_quants, pack_q4_k_quants, pack_q5_k_quants,
    q2_k_final_quants, q3_k_final_quants, quantize_block_q6_k, set_q3_k_scale, set_scale_min_k4,
    GROUP_MAX_EPS, Q2_K_BYTES, Q3_K_BYTES, Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES,
};
use crate::legacy::{pack_4bit, pack_5bit, Q4_0_BYTES, Q4_1_BYTES, Q5_0_BYTES, Q5_1_BYTES, QK};
use crate::QK_K;

/// Signature of the row quantizers with importance weights.
pub type QuantizeImatrixFn = fn(src: &[f32], dst: &mut [u8], qw: &[f32]);

/// `make_qp_quants`: quantize non-negative `x` (sub-block scales or mins) to `0..=nmax` with
/// weights. Like the C code, a negative input wraps when stored in the `u8` quants, while the
/// sums use the unwrapped value.
fn make_qp_quants(nmax: i32, x: &[f32], l: &mut [u8], qw: &[f32]) -> f32 {
    let n = x.len();
    let mut max = 0f32;
    for &v in x {
        max = if max > v { max } else { v };
    }
    if max < GROUP_MAX_EPS {
        l[..n].fill(0);
        return 0.0;
    }
    let mut iscale = nmax as f32 / max;
    for i in 0..n {
        l[i] = nearest_int(iscale * x[i]) as u8;
    }
    let scale = 1.0 / iscale;
    let mut best_mse = 0f32;
    for i in 0..n {
        let diff = x[i] - scale * l[i] as f32;
        best_mse += qw[i] * diff * diff;
    }
    for is in -4i32..=4 {
        if is == 0 {
            continue;
        }
        let iscale_is = (0.1 * is as f32 + nmax as f32) / max;
        let scale_is = 1.0 / iscale_is;
        let mut mse = 0f32;
        for i in 0..n {
            let li = nmax.min(nearest_int(iscale_is * x[i]));
            let diff = x[i] - scale_is * li as f32;
            mse += qw[i] * diff * diff;
        }
        if mse < best_mse {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    let mut sumlx = 0f32;
    let mut suml2 = 0f32;
    for i in 0..n {
        let li = nmax.min(nearest_int(iscale * x[i]));
        l[i] = li as u8;
        let w = qw[i];
        let lf = li as f32;
        sumlx += w * x[i] * lf;
        suml2 += w * lf * lf;
    }
    for _itry in 0..5 {
        let mut n_changed = 0;
        for i in 0..n {
            let w = qw[i];
            let lo = l[i] as f32;
            let mut slx = sumlx - w * x[i] * lo;
            let mut sl2 = suml2 - w * lo * lo;
            if slx > 0.0 && sl2 > 0.0 {
                let new_l = nmax.min(nearest_int(x[i] * sl2 / slx));
                if new_l != i32::from(l[i]) {
                    let nl = new_l as f32;
                    slx += w * x[i] * nl;
                    sl2 += w * nl * nl;
                    if slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l[i] = new_l as u8;
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
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// Sum of squares, in order.
fn sum_sq(x: &[f32]) -> f32 {
    let mut s = 0f32;
    for v in x {
        s += v * v;
    }
    s
}

/// Sum, in order.
fn sum(x: &[f32]) -> f32 {
    let mut s = 0f32;
    for v in x {
        s += v;
    }
    s
}

/// The weights of the `N` values of a (sub-)block: `qw * sqrt(sigma2 + x^2)`.
fn block_weights<const N: usize>(xb: &[f32], qwb: &[f32], sigma2: f32) -> [f32; N] {
    std::array::from_fn(|j| qwb[j] * (sigma2 + xb[j] * xb[j]).sqrt())
}

/// Q2_K with importance weights (`quantize_row_q2_K_impl`).
pub fn quantize_row_q2_k_imatrix(src: &[f32], dst: &mut [u8], qw: &[f32]) {
    let mut l = [0u8; QK_K];
    let mut laux = [0u8; 16];
    let mut mins = [0f32; 16];
    let mut scales = [0f32; 16];
    let mut sw = [0f32; 16];
    let mut ls = [0u8; 16];
    let mut lm = [0u8; 16];
    for ((x, y), qwb) in src
        .chunks_exact(QK_K)
        .zip(dst.chunks_exact_mut(Q2_K_BYTES))
        .zip(qw.chunks_exact(QK_K))
    {
        let sigma2 = sum_sq(x) / QK_K as f32;
        for j in 0..16 {
            let xs = &x[16 * j..16 * j + 16];
            let weight: [f32; 16] = block_weights(xs, &qwb[16 * j..], sigma2);
            sw[j] = sum(&weight);
            let (s, m) = make_qkx_quants(
                3,
                xs,
                &weight,
                &mut l[16 * j..16 * j + 16],
                &mut laux,
                -0.9,
                0.05,
                36,
                false,
            );
            scales[j] = s;
            mins[j] = m;
        }
        let dm = make_qp_quants(15, &scales, &mut ls, &sw);
        let mm = make_qp_quants(15, &mins, &mut lm, &sw);
        wr_u16(y, 80, f32_to_fp16(dm));
        wr_u16(y, 82, f32_to_fp16(mm));
        for j in 0..16 {
            y[j] = ls[j] | (lm[j] << 4);
        }
        q2_k_final_quants(x, y, &mut l);
    }
}

/// Q3_K with importance weights (`quantize_row_q3_K_impl`).
pub fn quantize_row_q3_k_imatrix(src: &[f32], dst: &mut [u8], qw: &[f32]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; 16];
    let mut sw = [0f32; 16];
    let mut ls = [0i8; 16];
    for ((x, y), qwb) in src
        .chunks_exact(QK_K)
        .zip(dst.chunks_exact_mut(Q3_K_BYTES))
        .zip(qw.chunks_exact(QK_K))
    {
        let sigma2 = 2.0 * sum_sq(x) / QK_K as f32;
        for j in 0..16 {
            let xs = &x[16 * j..16 * j + 16];
            let weight: [f32; 16] = block_weights(xs, &qwb[16 * j..], sigma2);
            sw[j] = sum(&weight);
            scales[j] = make_qx_quants(4, xs, &mut l[16 * j..16 * j + 16], 1, Some(&weight));
        }
        let (hmask, rest) = y.split_at_mut(32);
        let (qs, rest) = rest.split_at_mut(64);
        let (ysc, yd) = rest.split_at_mut(12);
        ysc.fill(0);
        let d_block = make_qx_quants(32, &scales, &mut ls, 1, Some(&sw));
        for j in 0..16 {
            // make_qx_quants's quants are 0..2 nmax - 1
            set_q3_k_scale(j, ls[j] as u8, ysc);
        }
        wr_u16(yd, 0, f32_to_fp16(d_block));
        q3_k_final_quants(x, ysc, yd, &mut l, hmask, qs);
    }
}

/// Sub-block scales and mins of Q4_K / Q5_K with importance weights, packed into the 12-byte
/// scale array; returns the super-block `(d, dmin)` as stored (fp16 bits) and leaves the first
/// quants in `l`. `clamp63` is Q5_K's extra `MIN(63, ...)` on the packed values.
fn k4_imatrix_scales(
    x: &[f32],
    qwb: &[f32],
    nmax: i32,
    clamp63: bool,
    l: &mut [u8; QK_K],
    packed: &mut [u8],
) -> (u16, u16) {
    let mut laux = [0u8; 32];
    let mut ls = [0u8; 8];
    let mut lm = [0u8; 8];
    let mut sw = [0f32; 8];
    let mut mins = [0f32; 8];
    let mut scales = [0f32; 8];
    let sigma2 = 2.0 * sum_sq(x) / QK_K as f32;
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let weights: [f32; 32] = block_weights(xs, &qwb[32 * j..], sigma2);
        sw[j] = sum(&weights);
        let (s, m) = make_qkx_quants(
            nmax,
            xs,
            &weights,
            &mut l[32 * j..32 * j + 32],
            &mut laux,
            -0.9,
            0.05,
            36,
            false,
        );
        scales[j] = s;
        mins[j] = m;
    }
    let d_block = make_qp_quants(63, &scales, &mut ls, &sw);
    let m_block = make_qp_quants(63, &mins, &mut lm, &sw);
    for j in 0..8 {
        let (s, m) = if clamp63 {
            (ls[j].min(63), lm[j].min(63))
        } else {
            (ls[j], lm[j])
        };
        set_scale_min_k4(j, s, m, packed);
    }
    (f32_to_fp16(d_block), f32_to_fp16(m_block))
}

/// Q4_K with importance weights (`quantize_row_q4_K_impl`).
pub fn quantize_row_q4_k_imatrix(src: &[f32], dst: &mut [u8], qw: &[f32]) {
    let mut l = [0u8; QK_K];
    for ((x, y), qwb) in src
        .chunks_exact(QK_K)
        .zip(dst.chunks_exact_mut(Q4_K_BYTES))
        .zip(qw.chunks_exact(QK_K))
    {
        let (d, dmin) = k4_imatrix_scales(x, qwb, 15, false, &mut l, &mut y[4..16]);
        wr_u16(y, 0, d);
        wr_u16(y, 2, dmin);
        k4_final_quants(x, d, dmin, &y[4..16], 15, &mut l);
        pack_q4_k_quants(&l, &mut y[16..144]);
    }
}

/// Q5_K with importance weights (`quantize_row_q5_K_impl`).
pub fn quantize_row_q5_k_imatrix(src: &[f32], dst: &mut [u8], qw: &[f32]) {
    let mut l = [0u8; QK_K];
    for ((x, y), qwb) in src
        .chunks_exact(QK_K)
        .zip(dst.chunks_exact_mut(Q5_K_BYTES))
        .zip(qw.chunks_exact(QK_K))
    {
        let (d, dmin) = k4_imatrix_scales(x, qwb, 31, true, &mut l, &mut y[4..16]);
        wr_u16(y, 0, d);
        wr_u16(y, 2, dmin);
        k4_final_quants(x, d, dmin, &y[4..16], 31, &mut l);
        pack_q5_k_quants(&l, &mut y[16..176]);
    }
}

/// Q6_K with importance weights (`quantize_row_q6_K_impl`).
pub fn quantize_row_q6_k_imatrix(src: &[f32], dst: &mut [u8], qw: &[f32]) {
    for ((x, y), qwb) in src
        .chunks_exact(QK_K)
        .zip(dst.chunks_exact_mut(Q6_K_BYTES))
        .zip(qw.chunks_exact(QK_K))
    {
        quantize_block_q6_k(x, Some(qwb), y);
    }
}

/// `sigma2` of the 32-element types: mean square over the whole row.
fn row_sigma2(x: &[f32]) -> f32 {
    sum_sq(x) / x.len() as f32
}

/// Q4_0 with importance weights (`quantize_row_q4_0_impl`).
pub fn quantize_row_q4_0_imatrix(src: &[f32], dst: &mut [u8], qw: &[f32]) {
    let sigma2 = row_sigma2(src);
    let mut l = [0i8; QK];
    for ((xb, y), qwb) in src
        .chunks_exact(QK)
        .zip(dst.chunks_exact_mut(Q4_0_BYTES))
        .zip(qw.chunks_exact(QK))
    {
        let weight: [f32; QK] = block_weights(xb, qwb, sigma2);
        let d = make_qx_quants(8, xb, &mut l, 1, Some(&weight));
        wr_u16(y, 0, f32_to_fp16(d));
        let lu: [u8; QK] = std::array::from_fn(|i| l[i] as u8);
        pack_4bit(&lu, &mut y[2..18]);
    }
}

/// Q5_0 with importance weights (`quantize_row_q5_0_impl`).
pub fn quantize_row_q5_0_imatrix(src: &[f32], dst: &mut [u8], qw: &[f32]) {
    let sigma2 = row_sigma2(src);
    let mut l = [0i8; QK];
    for ((xb, y), qwb) in src
        .chunks_exact(QK)
        .zip(dst.chunks_exact_mut(Q5_0_BYTES))
        .zip(qw.chunks_exact(QK))
    {
        let weight: [f32; QK] = block_weights(xb, qwb, sigma2);
        let d = make_qx_quants(16, xb, &mut l, 1, Some(&weight));
        wr_u16(y, 0, f32_to_fp16(d));
        let lu: [u8; QK] = std::array::from_fn(|i| l[i] as u8);
        let qh = pack_5bit(&lu, &mut y[6..22]);
        wr_u32(y, 2, qh);
    }
}

/// Q4_1 with importance weights (`quantize_row_q4_1_impl`).
pub fn quantize_row_q4_1_imatrix(src: &[f32], dst: &mut [u8], qw: &[f32]) {
    let sigma2 = row_sigma2(src);
    let mut l = [0u8; QK];
    let mut laux = [0u8; QK];
    for ((xb, y), qwb) in src
        .chunks_exact(QK)
        .zip(dst.chunks_exact_mut(Q4_1_BYTES))
        .zip(qw.chunks_exact(QK))
    {
        let weight: [f32; QK] = block_weights(xb, qwb, sigma2);
        let (d, the_min) =
            make_qkx_quants(15, xb, &weight, &mut l, &mut laux, -0.9, 0.05, 36, false);
        wr_u16(y, 0, f32_to_fp16(d));
        wr_u16(y, 2, f32_to_fp16(-the_min));
        pack_4bit(&l, &mut y[4..20]);
    }
}

/// Q5_1 with importance weights (`quantize_row_q5_1_impl`).
pub fn quantize_row_q5_1_imatrix(src: &[f32], dst: &mut [u8], qw: &[f32]) {
    let sigma2 = row_sigma2(src);
    let mut l = [0u8; QK];
    let mut laux = [0u8; QK];
    for ((xb, y), qwb) in src
        .chunks_exact(QK)
        .zip(dst.chunks_exact_mut(Q5_1_BYTES))
        .zip(qw.chunks_exact(QK))
    {
        let weight: [f32; QK] = block_weights(xb, qwb, sigma2);
        let (d, the_min) =
            make_qkx_quants(31, xb, &weight, &mut l, &mut laux, -0.9, 0.05, 36, false);
        wr_u16(y, 0, f32_to_fp16(d));
        wr_u16(y, 2, f32_to_fp16(-the_min));
        let qh = pack_5bit(&l, &mut y[8..24]);
        wr_u32(y, 4, qh);
    }
}
