//! Non-linear 4-bit formats: IQ4_NL (32-element blocks) and IQ4_XS (256-element super-blocks).
//!
//! Both map a 4-bit index through the table [`KVALUES_IQ4NL`] (`kvalues_iq4nl` in
//! ggml-common.h). Layouts (little-endian, `d` an IEEE half):
//!
//! | type   | bytes | layout                                                    |
//! |--------|-------|-----------------------------------------------------------|
//! | IQ4_NL | 18    | d, `qs[16]` (element j low nibble, j+16 high nibble)      |
//! | IQ4_XS | 136   | d, scales_h (u16), `scales_l[4]`, `qs[128]`: 8 sub-blocks |
//! |        |       | of 32, 6-bit scale `ls = lo4 + 16 * hi2`,                 |
//! |        |       | value `d * (ls - 32) * kv[q]`                             |
//!
//! Ports of ggml-quants.c `dequantize_row_iq4_nl/xs`, `quantize_row_iq4_nl_impl` (with and
//! without an importance matrix) and ggml-cpu/quants.c `ggml_vec_dot_iq4_nl_q8_0_generic` /
//! `ggml_vec_dot_iq4_xs_q8_K_generic`.
//!
//! Two IQ4_NL quantizers exist in ggml and they differ: `quantize_row_iq4_nl_ref` (what the CPU
//! backend's `from_float` runs; `ntry = -1`) and `quantize_iq4_nl` (what llama-quantize runs;
//! `ntry = 7`). [`quantize_row_iq4_nl`] is the llama-quantize one, [`quantize_row_iq4_nl_ref`]
//! the other. IQ4_XS has only one (`quantize_iq4_xs`, `ntry = 7`).
//!
//! Verified by: known-answer blocks, round-trip error bounds, vec_dot vs dequantized dot
//! (`tests/`).

use crate::common::*;
use crate::f16::f32_to_fp16;
use crate::QK_K;

pub const QK4_NL: usize = 32;
pub const IQ4_NL_BYTES: usize = 18;
pub const IQ4_XS_BYTES: usize = 136;

/// The IQ4_NL / IQ4_XS code book.
pub const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

const GROUP_MAX_EPS: f32 = 1e-15;

/// Dequantize an IQ4_NL row (`dst.len()` a multiple of 32).
pub fn dequantize_row_iq4_nl(src: &[u8], dst: &mut [f32]) {
    let nb = dst.len() / QK4_NL;
    for (x, y) in src[..nb * IQ4_NL_BYTES]
        .chunks_exact(IQ4_NL_BYTES)
        .zip(dst.chunks_exact_mut(QK4_NL))
    {
        let d = rd_f16(x, 0);
        let qs = &x[2..18];
        for j in 0..16 {
            y[j] = d * KVALUES_IQ4NL[(qs[j] & 0xf) as usize] as f32;
            y[j + 16] = d * KVALUES_IQ4NL[(qs[j] >> 4) as usize] as f32;
        }
    }
}

/// Dequantize an IQ4_XS row (`dst.len()` a multiple of 256).
pub fn dequantize_row_iq4_xs(src: &[u8], dst: &mut [f32]) {
    let nb = dst.len() / QK_K;
    for (x, y) in src[..nb * IQ4_XS_BYTES]
        .chunks_exact(IQ4_XS_BYTES)
        .zip(dst.chunks_exact_mut(QK_K))
    {
        let d = rd_f16(x, 0);
        let scales_h = rd_u16(x, 2) as i32;
        let scales_l = &x[4..8];
        for ib in 0..8 {
            let ls = ((scales_l[ib / 2] as i32 >> (4 * (ib % 2))) & 0xf)
                | (((scales_h >> (2 * ib)) & 3) << 4);
            let dl = d * (ls - 32) as f32;
            let qs = &x[8 + 16 * ib..8 + 16 * ib + 16];
            let yo = &mut y[32 * ib..32 * ib + 32];
            for j in 0..16 {
                yo[j] = dl * KVALUES_IQ4NL[(qs[j] & 0xf) as usize] as f32;
                yo[j + 16] = dl * KVALUES_IQ4NL[(qs[j] >> 4) as usize] as f32;
            }
        }
    }
}

/// ggml's `best_index_int8`: index of the code-book entry nearest to `x` (ties go up).
#[inline]
fn best_index_int8(val: &[i8; 16], x: f32) -> u8 {
    if x <= val[0] as f32 {
        return 0;
    }
    if x >= val[15] as f32 {
        return 15;
    }
    let mut ml = 0usize;
    let mut mu = 15usize;
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < val[mav] as f32 {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - (val[mu - 1] as f32) < (val[mu] as f32) - x {
        (mu - 1) as u8
    } else {
        mu as u8
    }
}

/// Output of [`quantize_iq4_impl`] besides the packed quants.
struct Iq4Out {
    dh: u16,
    scales_h: u16,
    scales_l: [u8; 4],
}

/// `quantize_row_iq4_nl_impl`, `block_size = 32`, for a super-block of 32 (IQ4_NL) or 256
/// (IQ4_XS) values, with importance weights `qw` (the super-block's slice) or without (`x^2`).
/// `l` persists between calls like the C stack buffer (matters only for all-zero IQ4_NL
/// blocks with `ntry <= 0`).
fn quantize_iq4_impl(
    x: &[f32],
    q4: &mut [u8],
    l: &mut [u8],
    ntry: i32,
    qw: Option<&[f32]>,
) -> Iq4Out {
    let super_block_size = x.len();
    let mut sigma2 = 0f32;
    for v in x {
        sigma2 += v * v;
    }
    sigma2 *= 2.0 / super_block_size as f32;
    let values = &KVALUES_IQ4NL;
    let nblocks = super_block_size / 32;
    let mut scales = [0f32; QK_K / 32];
    let mut weight = [0f32; 32];
    q4[..super_block_size / 2].fill(0);
    let mut out = Iq4Out {
        dh: f32_to_fp16(0.0),
        scales_h: 0,
        scales_l: [0; 4],
    };

    let mut max_scale = 0f32;
    let mut amax_scale = 0f32;
    for ib in 0..nblocks {
        let xb = &x[32 * ib..32 * ib + 32];
        let lb = &mut l[32 * ib..32 * ib + 32];
        match qw {
            Some(qw) => {
                let qwb = &qw[32 * ib..32 * ib + 32];
                for j in 0..32 {
                    weight[j] = qwb[j] * (sigma2 + xb[j] * xb[j]).sqrt();
                }
            }
            None => {
                for (w, v) in weight.iter_mut().zip(xb) {
                    *w = v * v;
                }
            }
        }
        let mut amax = 0f32;
        let mut max = 0f32;
        for &v in xb {
            let ax = v.abs();
            if ax > amax {
                amax = ax;
                max = v;
            }
        }
        if amax < GROUP_MAX_EPS {
            scales[ib] = 0.0;
            continue;
        }
        let mut d = if ntry > 0 {
            -max / values[0] as f32
        } else {
            max / values[0] as f32
        };
        let mut id = 1.0 / d;
        let mut sumqx = 0f32;
        let mut sumq2 = 0f32;
        for j in 0..32 {
            let al = id * xb[j];
            let li = best_index_int8(values, al);
            lb[j] = li;
            let q = values[li as usize] as f32;
            let w = weight[j];
            sumqx += w * q * xb[j];
            sumq2 += w * q * q;
        }
        d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
        let mut best = d * sumqx;
        for itry in -ntry..=ntry {
            id = (itry + values[0] as i32) as f32 / max;
            sumqx = 0.0;
            sumq2 = 0.0;
            for j in 0..32 {
                let al = id * xb[j];
                let li = best_index_int8(values, al);
                let q = values[li as usize] as f32;
                let w = weight[j];
                sumqx += w * q * xb[j];
                sumq2 += w * q * q;
            }
            if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scales[ib] = d;
        let abs_d = d.abs();
        if abs_d > amax_scale {
            amax_scale = abs_d;
            max_scale = d;
        }
    }

    if nblocks > 1 {
        let d = -max_scale / 32.0;
        out.dh = f32_to_fp16(d);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for ib in 0..nblocks {
            let mut li = nearest_int(id * scales[ib]);
            li = (-32).max(31.min(li));
            let dl = d * li as f32;
            let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
            let xb = &x[32 * ib..32 * ib + 32];
            for j in 0..32 {
                l[32 * ib + j] = best_index_int8(values, idl * xb[j]);
            }
            li += 32;
            let l_l = (li & 0xf) as u8;
            let l_h = (li >> 4) as u16;
            if ib % 2 == 0 {
                out.scales_l[ib / 2] = l_l;
            } else {
                out.scales_l[ib / 2] |= l_l << 4;
            }
            out.scales_h |= l_h << (2 * (ib % 8));
        }
    } else {
        out.dh = f32_to_fp16(scales[0]);
        if ntry > 0 {
            let id = if scales[0] != 0.0 {
                1.0 / scales[0]
            } else {
                0.0
            };
            for j in 0..super_block_size {
                l[j] = best_index_int8(values, id * x[j]);
            }
        }
    }

    for i in 0..super_block_size / 32 {
        for j in 0..16 {
            q4[16 * i + j] = l[32 * i + j] | (l[32 * i + 16 + j] << 4);
        }
    }
    out
}

fn quantize_iq4_nl_with(src: &[f32], dst: &mut [u8], ntry: i32, qw: Option<&[f32]>) {
    let nb = src.len() / QK4_NL;
    let mut l = [0u8; QK4_NL];
    for (ib, (x, y)) in src
        .chunks_exact(QK4_NL)
        .zip(dst[..nb * IQ4_NL_BYTES].chunks_exact_mut(IQ4_NL_BYTES))
        .enumerate()
    {
        let qwb = qw.map(|w| &w[QK4_NL * ib..QK4_NL * (ib + 1)]);
        let out = quantize_iq4_impl(x, &mut y[2..18], &mut l, ntry, qwb);
        wr_u16(y, 0, out.dh);
    }
}

/// Quantize a row to IQ4_NL as llama-quantize does (`quantize_iq4_nl`, no imatrix, `ntry = 7`).
pub fn quantize_row_iq4_nl(src: &[f32], dst: &mut [u8]) {
    quantize_iq4_nl_with(src, dst, 7, None);
}

/// Quantize a row to IQ4_NL with `quantize_row_iq4_nl_ref` (`ntry = -1`), which is what
/// ggml-cpu's `from_float` for IQ4_NL runs.
pub fn quantize_row_iq4_nl_ref(src: &[f32], dst: &mut [u8]) {
    quantize_iq4_nl_with(src, dst, -1, None);
}

/// Quantize a row to IQ4_NL with importance weights (`quantize_iq4_nl` with `quant_weights`).
pub fn quantize_row_iq4_nl_imatrix(src: &[f32], dst: &mut [u8], qw: &[f32]) {
    quantize_iq4_nl_with(src, dst, 7, Some(qw));
}

/// Quantize a row to IQ4_XS (`quantize_iq4_xs` / `quantize_row_iq4_xs_ref`, no imatrix).
pub fn quantize_row_iq4_xs(src: &[f32], dst: &mut [u8]) {
    quantize_iq4_xs_with(src, dst, None);
}

/// Quantize a row to IQ4_XS with importance weights (`quantize_iq4_xs` with `quant_weights`).
pub fn quantize_row_iq4_xs_imatrix(src: &[f32], dst: &mut [u8], qw: &[f32]) {
    quantize_iq4_xs_with(src, dst, Some(qw));
}

fn quantize_iq4_xs_with(src: &[f32], dst: &mut [u8], qw: Option<&[f32]>) {
    let nb = src.len() / QK_K;
    let mut l = [0u8; QK_K];
    for (ib, (x, y)) in src
        .chunks_exact(QK_K)
        .zip(dst[..nb * IQ4_XS_BYTES].chunks_exact_mut(IQ4_XS_BYTES))
        .enumerate()
    {
        let qwb = qw.map(|w| &w[QK_K * ib..QK_K * (ib + 1)]);
        let out = quantize_iq4_impl(x, &mut y[8..136], &mut l, 7, qwb);
        wr_u16(y, 0, out.dh);
        wr_u16(y, 2, out.scales_h);
        y[4..8].copy_from_slice(&out.scales_l);
    }
}

/// IQ4_NL weights x Q8_0 activations (`ggml_vec_dot_iq4_nl_q8_0_generic`).
pub fn vec_dot_iq4_nl_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let nb = n / QK4_NL;
    let mut sumf = 0f32;
    for (x, y) in w[..nb * IQ4_NL_BYTES]
        .chunks_exact(IQ4_NL_BYTES)
        .zip(a[..nb * 34].chunks_exact(34))
    {
        let d = rd_f16(y, 0) * rd_f16(x, 0);
        let (xq, yq) = (&x[2..18], &y[2..34]);
        let mut sumi1 = 0i32;
        let mut sumi2 = 0i32;
        for j in 0..16 {
            sumi1 += (yq[j] as i8) as i32 * KVALUES_IQ4NL[(xq[j] & 0xf) as usize] as i32;
            sumi2 += (yq[j + 16] as i8) as i32 * KVALUES_IQ4NL[(xq[j] >> 4) as usize] as i32;
        }
        sumf += d * (sumi1 + sumi2) as f32;
    }
    sumf
}

/// IQ4_XS weights x Q8_K activations (`ggml_vec_dot_iq4_xs_q8_K_generic`).
pub fn vec_dot_iq4_xs_q8_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let nb = n / QK_K;
    let mut sumf = 0f32;
    for (x, y) in w[..nb * IQ4_XS_BYTES]
        .chunks_exact(IQ4_XS_BYTES)
        .zip(a[..nb * 292].chunks_exact(292))
    {
        let d4d8 = rd_f16(x, 0) * rd_f32(y, 0);
        let mut h = rd_u16(x, 2);
        let scales_l = &x[4..8];
        let q8 = &y[4..260];
        for ib2 in 0..4 {
            let ls1 = ((scales_l[ib2] & 0xf) as u16 | ((h << 4) & 0x30)) as i32;
            let ls2 = ((scales_l[ib2] >> 4) as u16 | ((h << 2) & 0x30)) as i32;
            h >>= 4;
            for (k, ls) in [ls1, ls2].into_iter().enumerate() {
                let ib = 2 * ib2 + k;
                let dl = d4d8 * (ls - 32) as f32;
                let qs = &x[8 + 16 * ib..8 + 16 * ib + 16];
                let q8b = &q8[32 * ib..32 * ib + 32];
                let mut sumi1 = 0i32;
                let mut sumi2 = 0i32;
                for j in 0..16 {
                    sumi1 += (q8b[j] as i8) as i32 * KVALUES_IQ4NL[(qs[j] & 0xf) as usize] as i32;
                    sumi2 +=
                        (q8b[j + 16] as i8) as i32 * KVALUES_IQ4NL[(qs[j] >> 4) as usize] as i32;
                }
                sumf += dl * (sumi1 + sumi2) as f32;
            }
        }
    }
    sumf
}
