//! ggml's code-book ("grid") 2- and 3-bit types IQ2_XXS, IQ2_XS, IQ2_S and IQ3_XXS
//! (256-element super-blocks). Each group of 8 (IQ3_XXS: 2 x 4) magnitudes is one entry of a
//! code book in [`crate::iq_grids`]; a sign byte negates some of the 8 values; a 4-bit scale
//! `ls` per 32 (IQ2_XS / IQ2_S: per 16) weights a sub-block by `2 * ls + 1`. Layouts
//! (little-endian, `d` an IEEE half; `u16` fields as stored by x86):
//!
//! | type    | bytes | layout                                                               |
//! |---------|-------|----------------------------------------------------------------------|
//! | IQ2_XXS | 66    | d, `qs[32]` u16: per 32 two u32 = 4 grid indices (bytes of the 1st), |
//! |         |       | 4 x 7 sign bits + `ls` in the top nibble (the 2nd); `IQ2XXS_GRID`    |
//! | IQ2_XS  | 74    | d, `qs[32]` u16: 9-bit grid index + 7 sign bits per 8, `scales[8]`   |
//! |         |       | (low nibble: first 16 of a 32, high nibble: last 16); `IQ2XS_GRID`   |
//! | IQ2_S   | 82    | d, `qs[32]` grid index low bytes, `signs[32]` (8 explicit sign bits  |
//! |         |       | per 8), `qh[8]` (2 high index bits per 8), `scales[8]` as IQ2_XS;    |
//! |         |       | `IQ2S_GRID`                                                          |
//! | IQ3_XXS | 98    | d, `qs[64]` grid indices (per 8 values: two 4-value entries),        |
//! |         |       | then per 32 one u32: 4 x 7 sign bits + `ls` on top; `IQ3XXS_GRID`   |
//!
//! 7-bit sign fields expand through [`KSIGNS_IQ2XS`] (the 8th sign makes the count of
//! negative values even). Values are `d * (0.5 + ls) * 0.25 * grid` (IQ3_XXS: `* 0.5`), in
//! the dot products `d * (2 * ls + 1) * sum(grid * q8) / 8` (IQ3_XXS: `/ 4`).
//!
//! Ports of ggml-quants.c `dequantize_row_iq2_xxs/iq2_xs/iq2_s/iq3_xxs` and ggml-cpu/quants.c
//! `ggml_vec_dot_*_q8_K_generic`. ggml-cpu has no `from_float` for these types (their
//! quantizers search the code books with an importance matrix), so moxie only reads them.
//!
//! Verified by: `tests/ggml_golden.rs` (dequantization and the generic dots bit-exact against
//! ggml's compiled C), `tests/known_answers.rs`, `tests/roundtrip.rs` (vec_dot vs the f64 dot
//! of the dequantized operands).

use crate::common::{rd_f16, rd_f32, rd_u16, rd_u32};
use crate::iq_grids::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS};
use crate::kquants::Q8_K_BYTES;
use crate::QK_K;

pub const IQ2_XXS_BYTES: usize = 66;
pub const IQ2_XS_BYTES: usize = 74;
pub const IQ2_S_BYTES: usize = 82;
pub const IQ3_XXS_BYTES: usize = 98;

/// The signed values of one 32-element sub-block (`|v| <= 62`) and its 4-bit scale(s):
/// `ls[0]` for the first 16 elements, `ls[1]` for the last 16 (equal for the types with one
/// scale per 32).
pub(crate) struct Group32 {
    pub v: [i8; 32],
    pub ls: [u8; 2],
}

/// 8 grid magnitudes with the signs of `signs` (bit `j` negates value `j`), eight bytes at
/// once: `(g ^ m) + (m & 1)` is `-g` in the bytes where the mask `m` is 0xff; no carry leaves
/// a byte, every magnitude being at least 1.
#[inline(always)]
fn signed8(grid: u64, signs: u8, out: &mut [i8]) {
    const LOW: u64 = 0x0101_0101_0101_0101;
    // bit j of `signs` to the top bit of byte j, then to 0xff / 0x00
    let bits = ((signs as u64).wrapping_mul(LOW) & 0x8040_2010_0804_0201)
        .wrapping_add(0x7f7f_7f7f_7f7f_7f7f)
        & 0x8080_8080_8080_8080;
    let m = (bits >> 7).wrapping_mul(0xff);
    let v = (grid ^ m).wrapping_add(m & LOW);
    for (o, b) in out.iter_mut().zip(v.to_le_bytes()) {
        *o = b as i8;
    }
}

/// Sub-block `ib32` of an IQ2_XXS block.
#[inline(always)]
pub(crate) fn iq2_xxs_group(x: &[u8], ib32: usize) -> Group32 {
    let idx = rd_u32(x, 2 + 8 * ib32);
    let aux = rd_u32(x, 6 + 8 * ib32);
    let mut v = [0i8; 32];
    for l in 0..4 {
        let grid = IQ2XXS_GRID[((idx >> (8 * l)) & 0xff) as usize];
        let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
        signed8(grid, signs, &mut v[8 * l..8 * l + 8]);
    }
    let ls = (aux >> 28) as u8;
    Group32 { v, ls: [ls, ls] }
}

/// Sub-block `ib32` of an IQ2_XS block.
#[inline(always)]
pub(crate) fn iq2_xs_group(x: &[u8], ib32: usize) -> Group32 {
    let mut v = [0i8; 32];
    for l in 0..4 {
        let q = rd_u16(x, 2 + 2 * (4 * ib32 + l));
        let grid = IQ2XS_GRID[(q & 511) as usize];
        let signs = KSIGNS_IQ2XS[(q >> 9) as usize];
        signed8(grid, signs, &mut v[8 * l..8 * l + 8]);
    }
    let sc = x[66 + ib32];
    Group32 {
        v,
        ls: [sc & 0xf, sc >> 4],
    }
}

/// Sub-block `ib32` of an IQ2_S block.
#[inline(always)]
pub(crate) fn iq2_s_group(x: &[u8], ib32: usize) -> Group32 {
    let qs = &x[2 + 4 * ib32..2 + 4 * ib32 + 4];
    let signs = &x[34 + 4 * ib32..34 + 4 * ib32 + 4];
    let qh = x[66 + ib32] as usize;
    let mut v = [0i8; 32];
    for l in 0..4 {
        let grid = IQ2S_GRID[qs[l] as usize | ((qh << (8 - 2 * l)) & 0x300)];
        signed8(grid, signs[l], &mut v[8 * l..8 * l + 8]);
    }
    let sc = x[74 + ib32];
    Group32 {
        v,
        ls: [sc & 0xf, sc >> 4],
    }
}

/// Sub-block `ib32` of an IQ3_XXS block.
#[inline(always)]
pub(crate) fn iq3_xxs_group(x: &[u8], ib32: usize) -> Group32 {
    let qs = &x[2 + 8 * ib32..2 + 8 * ib32 + 8];
    let aux = rd_u32(x, 66 + 4 * ib32);
    let mut v = [0i8; 32];
    for l in 0..4 {
        // two 4-value entries make the 8 values one sign byte covers
        let grid = IQ3XXS_GRID[qs[2 * l] as usize] as u64
            | (IQ3XXS_GRID[qs[2 * l + 1] as usize] as u64) << 32;
        let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
        signed8(grid, signs, &mut v[8 * l..8 * l + 8]);
    }
    let ls = (aux >> 28) as u8;
    Group32 { v, ls: [ls, ls] }
}

/// The shared dequantization: `y = d * (0.5 + ls) * sub_scale * v` (ggml multiplies by the
/// sign after the magnitude; negating the product is the same float).
fn dequantize_with(
    src: &[u8],
    dst: &mut [f32],
    block_bytes: usize,
    sub_scale: f32,
    group: fn(&[u8], usize) -> Group32,
) {
    let nb = dst.len() / QK_K;
    for (x, y) in src[..nb * block_bytes]
        .chunks_exact(block_bytes)
        .zip(dst.chunks_exact_mut(QK_K))
    {
        let d = rd_f16(x, 0);
        for ib32 in 0..QK_K / 32 {
            let g = group(x, ib32);
            let db = [
                d * (0.5 + g.ls[0] as f32) * sub_scale,
                d * (0.5 + g.ls[1] as f32) * sub_scale,
            ];
            for (j, (o, &v)) in y[32 * ib32..32 * ib32 + 32]
                .iter_mut()
                .zip(&g.v)
                .enumerate()
            {
                *o = db[j / 16] * v as f32;
            }
        }
    }
}

/// Dequantize an IQ2_XXS row (`dst.len()` a multiple of 256).
pub fn dequantize_row_iq2_xxs(src: &[u8], dst: &mut [f32]) {
    dequantize_with(src, dst, IQ2_XXS_BYTES, 0.25, iq2_xxs_group)
}

/// Dequantize an IQ2_XS row (`dst.len()` a multiple of 256).
pub fn dequantize_row_iq2_xs(src: &[u8], dst: &mut [f32]) {
    dequantize_with(src, dst, IQ2_XS_BYTES, 0.25, iq2_xs_group)
}

/// Dequantize an IQ2_S row (`dst.len()` a multiple of 256).
pub fn dequantize_row_iq2_s(src: &[u8], dst: &mut [f32]) {
    dequantize_with(src, dst, IQ2_S_BYTES, 0.25, iq2_s_group)
}

/// Dequantize an IQ3_XXS row (`dst.len()` a multiple of 256).
pub fn dequantize_row_iq3_xxs(src: &[u8], dst: &mut [f32]) {
    dequantize_with(src, dst, IQ3_XXS_BYTES, 0.5, iq3_xxs_group)
}

/// The shared generic dot: per block the exact integer `sum (2 ls + 1) * v * q8`, then
/// `sumf += d * bsum` in f32, and `final_scale * sumf` at the end.
fn vec_dot_with(
    n: usize,
    w: &[u8],
    a: &[u8],
    block_bytes: usize,
    final_scale: f32,
    group: fn(&[u8], usize) -> Group32,
) -> f32 {
    let nb = n / QK_K;
    let mut sumf = 0f32;
    for (x, y) in w[..nb * block_bytes]
        .chunks_exact(block_bytes)
        .zip(a[..nb * Q8_K_BYTES].chunks_exact(Q8_K_BYTES))
    {
        let d = rd_f16(x, 0) * rd_f32(y, 0);
        let q8 = &y[4..4 + QK_K];
        let mut bsum = 0i32;
        for ib32 in 0..QK_K / 32 {
            let g = group(x, ib32);
            for half in 0..2 {
                let mut sumi = 0i32;
                for j in 16 * half..16 * half + 16 {
                    sumi += g.v[j] as i32 * q8[32 * ib32 + j] as i8 as i32;
                }
                bsum += sumi * (2 * g.ls[half] as i32 + 1);
            }
        }
        sumf += d * bsum as f32;
    }
    final_scale * sumf
}

/// IQ2_XXS weights x Q8_K activations (`ggml_vec_dot_iq2_xxs_q8_K_generic`).
pub fn vec_dot_iq2_xxs_q8_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    vec_dot_with(n, w, a, IQ2_XXS_BYTES, 0.125, iq2_xxs_group)
}

/// IQ2_XS weights x Q8_K activations (`ggml_vec_dot_iq2_xs_q8_K_generic`).
pub fn vec_dot_iq2_xs_q8_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    vec_dot_with(n, w, a, IQ2_XS_BYTES, 0.125, iq2_xs_group)
}

/// IQ2_S weights x Q8_K activations (`ggml_vec_dot_iq2_s_q8_K_generic`).
pub fn vec_dot_iq2_s_q8_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    vec_dot_with(n, w, a, IQ2_S_BYTES, 0.125, iq2_s_group)
}

/// IQ3_XXS weights x Q8_K activations (`ggml_vec_dot_iq3_xxs_q8_K_generic`).
pub fn vec_dot_iq3_xxs_q8_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    vec_dot_with(n, w, a, IQ3_XXS_BYTES, 0.25, iq3_xxs_group)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `signed8` relies on every code-book magnitude being at least 1 (and below 128).
    #[test]
    fn code_book_magnitudes_are_between_1_and_127() {
        let bytes = IQ2XXS_GRID
            .iter()
            .chain(&IQ2XS_GRID)
            .chain(&IQ2S_GRID)
            .flat_map(|g| g.to_le_bytes())
            .chain(IQ3XXS_GRID.iter().flat_map(|g| g.to_le_bytes()));
        for b in bytes {
            assert!((1..128).contains(&b), "{b}");
        }
    }

    #[test]
    fn signed8_negates_the_flagged_values() {
        let grid = u64::from_le_bytes([8, 25, 43, 1, 62, 127, 4, 12]);
        for signs in 0..=255u8 {
            let mut out = [0i8; 8];
            signed8(grid, signs, &mut out);
            for (j, (&o, g)) in out.iter().zip(grid.to_le_bytes()).enumerate() {
                let want = if signs >> j & 1 == 1 {
                    -(g as i8)
                } else {
                    g as i8
                };
                assert_eq!(o, want, "signs {signs:#x} value {j}");
            }
        }
    }
}
