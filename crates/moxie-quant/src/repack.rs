//! Interleaved-row weight layouts for one-token products (decode), built once at load time.
//!
//! In GGUF order each weight row is contiguous, so a one-token product is one dot product per
//! row: every row unpacks its own scales, multiplies by the same activations and ends in a
//! horizontal sum. That is compute-bound well below memory bandwidth on 2 cores (Q4_K: ~19 GB/s
//! per core). Here 16 rows are interleaved a few bytes at a time, as the int8 GEMM's tiles are
//! (`gemm.rs`), but still packed: one 64-byte load holds the same four bytes of 16 rows,
//! `vpdpbusd` with a broadcast activation word multiplies them, and the 16 results stay in the
//! 16 lanes of one register, so nothing is reduced horizontally and each activation load feeds
//! 16 rows. The repacked matrix has exactly the bytes of the original (ik_llama.cpp's `_R4` /
//! `_R8` types, `-rtr`, do the same with 4 or 8 rows).
//!
//! Layout: for each group of 16 rows and each block (256 elements for the K-quants, 32 for the
//! legacy types), the block's fields one after the other ([`fields`]), each as
//! `[unit index][row 0..16][unit bytes]`:
//! - Q4_K (2304 bytes): `d` (16 x f16), `dmin` (16 x f16), the 12 packed scale/min bytes as
//!   three words (`[word][row]` u32; the 16 rows' 6-bit scales and mins come out of three loads
//!   with ggml's `utmp` shuffle on 16 lanes), the 128 quant bytes as 32 words (word `8j + g`:
//!   low nibbles are elements `64j + 4g ..+4`, sub-block `2j`; high nibbles `64j + 32 + 4g ..+4`,
//!   sub-block `2j + 1`);
//! - Q5_K (2816 bytes): Q4_K's fields, with the 32 high-bit bytes as 8 words between the
//!   scales and the quants (word `g` holds the fifth bits of elements `32c + 4g ..+4`, bit `c`
//!   of each byte for the 32-element chunk `c`);
//! - Q8_0 (544 bytes): `d` (16 x f16) and its 8 quant words (signed bytes, made unsigned with
//!   `^ 0x80` for `vpdpbusd`, the offset taken back with the activations' block sum);
//! - Q4_0 (288 bytes) and Q5_0 (352 bytes): `d` (16 x f16), Q5_0's fifth bits (one word per
//!   row), then the 16 quant bytes as 4 words (word `g`: low nibbles are elements `4g ..+4`,
//!   high nibbles `16 + 4g ..+4`); the codes are unsigned (value + 8, value + 16) and the offset
//!   is taken back with the activations' block sum, as for Q8_0. Rows of 128 (MLA's `attn_k_b`,
//!   which llama.cpp's K-quant mixes store as Q5_0 or Q8_0) interleave too;
//! - Q6_K (3360 bytes): `d` (16 x f16), the 16 scales (`[sub-block][row]` i8), then for each of
//!   16 steps `8n + g` the words `ql[64n + 4g]`, `ql[64n + 32 + 4g]` and `qh[32n + 4g]`, which
//!   hold elements `128n + 32k + 4g ..+4` for k = 0..3 (sub-block `8n + 2k + g / 4`).
//!
//! The products are exact integers per sub-block (as in ggml) and the float work per row is
//! ggml's terms per super-block (`(d * y.d) * Σ_s sc_s·isum_s`, minus the mins term for Q4_K)
//! summed in another order, so results agree with `vec_dot` to float rounding (fast numerics
//! only; `--exact` keeps GGUF order).

use crate::common::{rd_f16, rd_f32, rd_i16, rd_u32};
use crate::legacy::{quants_4bit, quants_5bit};
use crate::GgmlType;

/// Rows interleaved per group.
pub const REPACK_ROWS: usize = 16;

const Q4K_BLOCK: usize = 144;
const Q5K_BLOCK: usize = 176;
const Q6K_BLOCK: usize = 210;
const Q8K_BLOCK: usize = 292;
/// Bytes of one 16-row group's super-block.
pub(crate) const Q4K_GROUP_BLOCK: usize = REPACK_ROWS * Q4K_BLOCK;
pub(crate) const Q5K_GROUP_BLOCK: usize = REPACK_ROWS * Q5K_BLOCK;
pub(crate) const Q6K_GROUP_BLOCK: usize = REPACK_ROWS * Q6K_BLOCK;
/// Bytes of one 16-row group's Q8_0 block: 16 x f16 scales, then 8 words of 16 rows.
pub(crate) const Q8_0_GROUP_BLOCK: usize = REPACK_ROWS * 34;
/// Q4_0 and Q5_0 group blocks: scales, (Q5_0: fifth-bit words,) 4 words of quants.
pub(crate) const Q4_0_GROUP_BLOCK: usize = REPACK_ROWS * 18;
pub(crate) const Q5_0_GROUP_BLOCK: usize = REPACK_ROWS * 22;

/// A run of `count` units of `unit` bytes at byte `src` of a block, stored interleaved as
/// `[unit index][row][unit]`.
struct Field {
    src: usize,
    unit: usize,
    count: usize,
}

const fn field(src: usize, unit: usize, count: usize) -> Field {
    Field { src, unit, count }
}

/// How `ty` interleaves: its blocks' fields in interleaved order (they cover the block), the
/// block's bytes and its elements.
struct Blocks {
    fields: &'static [Field],
    bytes: usize,
    elems: usize,
}

fn fields(ty: GgmlType) -> Option<Blocks> {
    const Q4K: &[Field] = &[
        field(0, 2, 1),
        field(2, 2, 1),
        field(4, 4, 3),
        field(16, 4, 32),
    ];
    const Q5K: &[Field] = &[
        field(0, 2, 1),
        field(2, 2, 1),
        field(4, 4, 3),
        field(16, 4, 8),
        field(48, 4, 32),
    ];
    const Q6K: &[Field] = &q6_k_fields();
    const Q80: &[Field] = &[field(0, 2, 1), field(2, 4, 8)];
    const Q40: &[Field] = &[field(0, 2, 1), field(2, 4, 4)];
    const Q50: &[Field] = &[field(0, 2, 1), field(2, 4, 1), field(6, 4, 4)];
    let (fields, bytes, elems) = match ty {
        GgmlType::Q4_K => (Q4K, Q4K_BLOCK, 256),
        GgmlType::Q5_K => (Q5K, Q5K_BLOCK, 256),
        GgmlType::Q6_K => (Q6K, Q6K_BLOCK, 256),
        GgmlType::Q8_0 => (Q80, 34, 32),
        GgmlType::Q4_0 => (Q40, 18, 32),
        GgmlType::Q5_0 => (Q50, 22, 32),
        _ => return None,
    };
    Some(Blocks {
        fields,
        bytes,
        elems,
    })
}

/// Q6_K: `d`, the scales, then per step (n, g) the three words the kernel reads together,
/// `ql[64n + 4g]`, `ql[64n + 32 + 4g]`, `qh[32n + 4g]`, so that it reads one forward stream
/// (three separate streams measured 3x slower from DRAM).
const fn q6_k_fields() -> [Field; 50] {
    let mut f = [const { field(0, 0, 0) }; 50];
    f[0] = field(208, 2, 1);
    f[1] = field(192, 1, 16);
    let mut step = 0;
    while step < 16 {
        let (n, g) = (step / 8, step % 8);
        f[2 + 3 * step] = field(64 * n + 4 * g, 4, 1);
        f[3 + 3 * step] = field(64 * n + 32 + 4 * g, 4, 1);
        f[4 + 3 * step] = field(128 + 32 * n + 4 * g, 4, 1);
        step += 1;
    }
    f
}

/// Whether `n_rows` rows of `n_in` elements of `ty` have an interleaved layout here.
pub fn repack_supports(ty: GgmlType, n_rows: usize, n_in: usize) -> bool {
    fields(ty).is_some_and(|b| n_in > 0 && n_in.is_multiple_of(b.elems))
        && n_rows.is_multiple_of(REPACK_ROWS)
}

/// What an interleaved `ty` matrix needs, for error messages: the row length and row count
/// [`repack_supports`] asks for, or the types that have a layout at all.
pub fn layout_requirement(ty: GgmlType) -> String {
    match fields(ty) {
        Some(b) => format!(
            "{ty} rows of a multiple of {} elements, a multiple of {REPACK_ROWS} rows per matrix",
            b.elems
        ),
        None => {
            let with: Vec<String> = GgmlType::ALL
                .into_iter()
                .filter(|&t| fields(t).is_some())
                .map(|t| t.to_string())
                .collect();
            format!("{ty} has none; {} do", with.join(", "))
        }
    }
}

/// Tensor type ids of interleaved tensors in files moxie writes (`moxie quantize --repack`):
/// this plus the base type's id (Q4_K 1012, Q5_K 1013, Q6_K 1014, Q8_0 1008, Q4_0 1002,
/// Q5_0 1006). Above every id of ggml and
/// ik_llama.cpp (whose `_R4`/`_R8` types end at 399), so both refuse such a file ("invalid
/// type") instead of reading interleaved bytes as rows.
pub const INTERLEAVED_TYPE_ID_BASE: u32 = 1000;

/// The id a file stores for a tensor of `ty` whose rows are interleaved; `None` where `ty` has
/// no interleaved layout.
pub fn interleaved_type_id(ty: GgmlType) -> Option<u32> {
    fields(ty).map(|_| INTERLEAVED_TYPE_ID_BASE + ty.id())
}

/// The base type of interleaved type id `id` ([`interleaved_type_id`]'s inverse).
pub fn interleaved_base_type(id: u32) -> Option<GgmlType> {
    let ty = GgmlType::from_id(id.checked_sub(INTERLEAVED_TYPE_ID_BASE)?)?;
    (interleaved_type_id(ty) == Some(id)).then_some(ty)
}

/// [`repack_supports`] for a tensor of ggml shape `dims` (`dims[0]` the row length, `dims[1]`
/// the rows of each matrix; 1 for a 1-D tensor).
pub fn repack_supports_shape(ty: GgmlType, dims: &[u64]) -> bool {
    let (n_in, per_matrix) = (
        dims.first().copied().unwrap_or(0),
        dims.get(1).copied().unwrap_or(1),
    );
    repack_supports(ty, per_matrix as usize, n_in as usize)
}

/// `src` (`n_rows` GGUF rows of `n_in` values of `ty`) interleaved into `dst` (same size),
/// group after group. Panics unless [`repack_supports`] and the sizes match.
pub fn repack(ty: GgmlType, src: &[u8], n_rows: usize, n_in: usize, dst: &mut [u8]) {
    shuffle(ty, src, n_rows, n_in, dst, true);
}

/// The inverse of [`repack`] (exact numerics and row reads put rows back in GGUF order).
pub fn unrepack(ty: GgmlType, src: &[u8], n_rows: usize, n_in: usize, dst: &mut [u8]) {
    shuffle(ty, src, n_rows, n_in, dst, false);
}

/// Copy every unit between GGUF order and interleaved order (`to_interleaved`: `src` is in
/// GGUF order).
fn shuffle(
    ty: GgmlType,
    src: &[u8],
    n_rows: usize,
    n_in: usize,
    dst: &mut [u8],
    to_interleaved: bool,
) {
    assert!(
        repack_supports(ty, n_rows, n_in),
        "{ty}: no interleaved layout for {n_rows} x {n_in}"
    );
    let Blocks {
        fields,
        bytes: block,
        elems,
    } = fields(ty).expect("checked above");
    let row_bytes = n_in / elems * block;
    assert!(src.len() == n_rows * row_bytes && dst.len() == src.len());
    let group_bytes = REPACK_ROWS * row_bytes;
    for (from, to) in src
        .chunks_exact(group_bytes)
        .zip(dst.chunks_exact_mut(group_bytes))
    {
        for b in 0..n_in / elems {
            // Interleaved side in address order: field, unit, row.
            let mut q = b * REPACK_ROWS * block;
            for f in fields {
                for i in 0..f.count {
                    for r in 0..REPACK_ROWS {
                        let p = r * row_bytes + b * block + f.src + i * f.unit;
                        if to_interleaved {
                            to[q..q + f.unit].copy_from_slice(&from[p..p + f.unit]);
                        } else {
                            to[p..p + f.unit].copy_from_slice(&from[q..q + f.unit]);
                        }
                        q += f.unit;
                    }
                }
            }
        }
    }
}

/// A one-token kernel over whole blocks of one group: (group, activations, out).
type GroupKernel = fn(&[u8], &[u8], &mut [f32; REPACK_ROWS]);

/// The 16 products of one interleaved row group of `ty` (`group`: `n_in` elements' blocks)
/// with one activation row `act` of its dot partner (Q8_K; Q8_0 for the legacy types), into
/// `out`: the AVX-512 VNNI kernel where the CPU has it, else the AVX2 one, else the portable
/// one (the same arithmetic, bit for bit). Panics for a type without an interleaved layout.
pub fn gemv(ty: GgmlType, n_in: usize, group: &[u8], act: &[u8], out: &mut [f32; REPACK_ROWS]) {
    // (elements per kernel block, group bytes per block, activation bytes per block, kernel)
    let (elems, group_block, act_block, portable): (usize, usize, usize, GroupKernel) = match ty {
        GgmlType::Q4_K => (
            256,
            Q4K_GROUP_BLOCK,
            Q8K_BLOCK,
            gemv_q4_k_r16_scalar::<false>,
        ),
        GgmlType::Q5_K => (
            256,
            Q5K_GROUP_BLOCK,
            Q8K_BLOCK,
            gemv_q4_k_r16_scalar::<true>,
        ),
        GgmlType::Q6_K => (256, Q6K_GROUP_BLOCK, Q8K_BLOCK, gemv_q6_k_r16_scalar),
        GgmlType::Q8_0 => (32, Q8_0_GROUP_BLOCK, 34, gemv_q8_0_r16_scalar),
        GgmlType::Q4_0 => (32, Q4_0_GROUP_BLOCK, 34, gemv_q4_0_r16_scalar::<false>),
        GgmlType::Q5_0 => (32, Q5_0_GROUP_BLOCK, 34, gemv_q4_0_r16_scalar::<true>),
        _ => panic!("{ty} has no interleaved layout"),
    };
    let nb = n_in / elems;
    let group = &group[..nb * group_block];
    let act = &act[..nb * act_block];
    // The SIMD modules' kernels of `ty` (each module has the same names).
    #[cfg(target_arch = "x86_64")]
    macro_rules! run_level {
        ($m:ident) => {
            match ty {
                GgmlType::Q4_K => $m::gemv_q4_k_r16::<false>(group, act, out),
                GgmlType::Q5_K => $m::gemv_q4_k_r16::<true>(group, act, out),
                GgmlType::Q6_K => $m::gemv_q6_k_r16(group, act, out),
                GgmlType::Q4_0 => $m::gemv_q4_0_r16::<false>(group, act, out),
                GgmlType::Q5_0 => $m::gemv_q4_0_r16::<true>(group, act, out),
                _ => $m::gemv_q8_0_r16(group, act, out),
            }
        };
    }
    #[cfg(target_arch = "x86_64")]
    match crate::simd_level() {
        // SAFETY: a level is only reported after its features were detected at run time
        // (AVX-512: F/BW/VL/VNNI on top of AVX2, FMA and F16C); the slices hold exactly `nb`
        // blocks (sliced above).
        crate::SimdLevel::Avx512 => unsafe { run_level!(avx512) },
        // SAFETY: as above, AVX2, FMA and F16C.
        crate::SimdLevel::Avx2 => unsafe { run_level!(avx2) },
        crate::SimdLevel::Scalar => portable(group, act, out),
    }
    #[cfg(not(target_arch = "x86_64"))]
    portable(group, act, out);
}

/// The portable Q4_K (`Q5`: Q5_K) kernel of [`gemv`]: per row, exact integer sums per
/// sub-block, then ggml's two float terms per super-block.
fn gemv_q4_k_r16_scalar<const Q5: bool>(group: &[u8], act: &[u8], out: &mut [f32; REPACK_ROWS]) {
    let mut acc = [0f32; REPACK_ROWS];
    let mut acc_m = [0f32; REPACK_ROWS];
    let (group_block, qs) = if Q5 {
        (Q5K_GROUP_BLOCK, 768)
    } else {
        (Q4K_GROUP_BLOCK, 256)
    };
    for (o, y) in group
        .chunks_exact(group_block)
        .zip(act.chunks_exact(Q8K_BLOCK))
    {
        let yd = rd_f32(y, 0);
        let yq = |i: usize| y[4 + i] as i8 as i32;
        let bsum32 = |s: usize| rd_i16(y, 260 + 4 * s) as i32 + rd_i16(y, 262 + 4 * s) as i32;
        for r in 0..REPACK_ROWS {
            let word = |w: usize| rd_u32(o, 64 + 64 * w + 4 * r);
            let (sc, mn) = unpack_scales_mins(word(0), word(1), word(2));
            let (mut sumi, mut summ) = (0i32, 0i32);
            for j in 0..4 {
                let (mut lo, mut hi) = (0i32, 0i32);
                for g in 0..8 {
                    let q = &o[qs + (j * 8 + g) * 64 + 4 * r..][..4];
                    for (i, &b) in q.iter().enumerate() {
                        // Q5_K: the fifth bits of chunks 2j and 2j + 1.
                        let h = if Q5 { o[256 + g * 64 + 4 * r + i] } else { 0 };
                        let (h0, h1) = ((h >> (2 * j)) & 1, (h >> (2 * j + 1)) & 1);
                        lo += ((b & 0xF) | h0 << 4) as i32 * yq(64 * j + 4 * g + i);
                        hi += ((b >> 4) | h1 << 4) as i32 * yq(64 * j + 32 + 4 * g + i);
                    }
                }
                sumi += lo * sc[2 * j] + hi * sc[2 * j + 1];
            }
            for s in 0..8 {
                summ += mn[s] * bsum32(s);
            }
            let d = rd_f16(o, 2 * r) * yd;
            let dmin = rd_f16(o, 32 + 2 * r) * yd;
            acc[r] = d.mul_add(sumi as f32, acc[r]);
            acc_m[r] = dmin.mul_add(summ as f32, acc_m[r]);
        }
    }
    for r in 0..REPACK_ROWS {
        out[r] = acc[r] - acc_m[r];
    }
}

/// The portable Q6_K kernel of [`gemv`]: per row and sub-block of 16, the exact integer
/// `Σ (q - 32)·y` (as `Σ q·y - 32·bsum`), times the scale, summed; then `(d * y.d) * sum`.
fn gemv_q6_k_r16_scalar(group: &[u8], act: &[u8], out: &mut [f32; REPACK_ROWS]) {
    let mut acc = [0f32; REPACK_ROWS];
    for (o, y) in group
        .chunks_exact(Q6K_GROUP_BLOCK)
        .zip(act.chunks_exact(Q8K_BLOCK))
    {
        let yd = rd_f32(y, 0);
        let yq = |i: usize| y[4 + i] as i8 as i32;
        for r in 0..REPACK_ROWS {
            let mut isum = [0i32; 16];
            for n in 0..2 {
                for g in 0..8 {
                    let step = 288 + (8 * n + g) * 192 + 4 * r;
                    let (a, b, h) = (&o[step..][..4], &o[step + 64..][..4], &o[step + 128..][..4]);
                    for i in 0..4 {
                        let q = [
                            (a[i] & 0xF) | ((h[i] & 3) << 4),
                            (b[i] & 0xF) | (((h[i] >> 2) & 3) << 4),
                            (a[i] >> 4) | (((h[i] >> 4) & 3) << 4),
                            (b[i] >> 4) | (((h[i] >> 6) & 3) << 4),
                        ];
                        for (k, &q) in q.iter().enumerate() {
                            let e = 128 * n + 32 * k + 4 * g + i;
                            isum[8 * n + 2 * k + g / 4] += q as i32 * yq(e);
                        }
                    }
                }
            }
            let mut sumi = 0i32;
            for (sb, &v) in isum.iter().enumerate() {
                let sc = o[32 + sb * REPACK_ROWS + r] as i8 as i32;
                sumi += sc * (v - 32 * rd_i16(y, 260 + 2 * sb) as i32);
            }
            let d = rd_f16(o, 2 * r) * yd;
            acc[r] = d.mul_add(sumi as f32, acc[r]);
        }
    }
    *out = acc;
}

/// The portable Q8_0 kernel of [`gemv`]: per row and block, the exact integer `Σ w·y` (computed as
/// `Σ (w + 128)·y - 128·Σ y`, as the unsigned-by-signed kernel does), then
/// `(d_w * d_y) * isum` as ggml.
fn gemv_q8_0_r16_scalar(group: &[u8], act: &[u8], out: &mut [f32; REPACK_ROWS]) {
    let mut acc = [0f32; REPACK_ROWS];
    for (o, y) in group
        .chunks_exact(Q8_0_GROUP_BLOCK)
        .zip(act.chunks_exact(34))
    {
        let dy = rd_f16(y, 0);
        let ysum: i32 = y[2..34].iter().map(|&v| v as i8 as i32).sum();
        for r in 0..REPACK_ROWS {
            let mut isum = 0i32;
            for g in 0..8 {
                let w = &o[32 + (g * REPACK_ROWS + r) * 4..][..4];
                for i in 0..4 {
                    isum += (w[i] ^ 0x80) as i32 * y[2 + 4 * g + i] as i8 as i32;
                }
            }
            let d = rd_f16(o, 2 * r) * dy;
            acc[r] = d.mul_add((isum - 128 * ysum) as f32, acc[r]);
        }
    }
    *out = acc;
}

/// Row `r`'s 32 codes (value + 8, or + 16 for Q5_0) in element order, from one group block of
/// the Q4_0 (`Q5`: Q5_0) layout: its 4 quant words and (Q5_0) fifth-bit word, decoded as a
/// GGUF block is ([`quants_4bit`], [`quants_5bit`]).
pub(crate) fn legacy_codes<const Q5: bool>(o: &[u8], r: usize) -> [u8; 32] {
    let qs_at = if Q5 { 96 } else { 32 };
    let qs: [u8; 16] = core::array::from_fn(|i| o[qs_at + (i / 4 * REPACK_ROWS + r) * 4 + i % 4]);
    if Q5 {
        quants_5bit(&qs, rd_u32(o, 32 + 4 * r))
    } else {
        quants_4bit(&qs)
    }
}

/// The portable Q4_0 (`Q5`: Q5_0) kernel of [`gemv`]: per row and block, the exact integer
/// `Σ w·y` (as `Σ code·y - offset·Σ y`, the code being the value plus 8, or 16 for Q5_0), then
/// `(d_w * d_y) * isum` as ggml.
fn gemv_q4_0_r16_scalar<const Q5: bool>(group: &[u8], act: &[u8], out: &mut [f32; REPACK_ROWS]) {
    let (group_block, offset) = if Q5 {
        (Q5_0_GROUP_BLOCK, 16)
    } else {
        (Q4_0_GROUP_BLOCK, 8)
    };
    let mut acc = [0f32; REPACK_ROWS];
    for (o, y) in group.chunks_exact(group_block).zip(act.chunks_exact(34)) {
        let dy = rd_f16(y, 0);
        let yq = |i: usize| y[2 + i] as i8 as i32;
        let ysum: i32 = (0..32).map(yq).sum();
        for r in 0..REPACK_ROWS {
            let codes = legacy_codes::<Q5>(o, r);
            let isum = (0..32).map(|e| codes[e] as i32 * yq(e)).sum::<i32>() - offset * ysum;
            let d = rd_f16(o, 2 * r) * dy;
            acc[r] = d.mul_add(isum as f32, acc[r]);
        }
    }
    *out = acc;
}

/// The 8 scales and 8 mins of a Q4_K super-block from its three packed words
/// (`get_scale_min_k4`, as ggml's `utmp` shuffle computes them).
pub(crate) fn unpack_scales_mins(u0: u32, u1: u32, u2: u32) -> ([i32; 8], [i32; 8]) {
    const M1: u32 = 0x3f3f_3f3f;
    const M2: u32 = 0x0f0f_0f0f;
    const M3: u32 = 0x0303_0303;
    let words = [
        u0 & M1,
        (u2 & M2) | (((u0 >> 6) & M3) << 4),
        u1 & M1,
        ((u2 >> 4) & M2) | (((u1 >> 6) & M3) << 4),
    ];
    let byte = |w: u32, i: usize| ((w >> (8 * i)) & 0xFF) as i32;
    let mut sc = [0i32; 8];
    let mut mn = [0i32; 8];
    for i in 0..4 {
        sc[i] = byte(words[0], i);
        sc[4 + i] = byte(words[1], i);
        mn[i] = byte(words[2], i);
        mn[4 + i] = byte(words[3], i);
    }
    (sc, mn)
}

/// `vpshufb` indices copying byte `k` of each row's fifth-bit word to the row's four bytes
/// (`vpshufb` indexes within 128-bit lanes, four rows each): 64 bytes for AVX-512, the first
/// 32 for AVX2.
#[cfg(target_arch = "x86_64")]
const SPREAD: [[u8; 64]; 4] = {
    let mut t = [[0u8; 64]; 4];
    let mut k = 0;
    while k < 4 {
        let mut b = 0;
        while b < 64 {
            t[k][b] = (b / 4 % 4 * 4 + k) as u8;
            b += 1;
        }
        k += 1;
    }
    t
};

#[cfg(target_arch = "x86_64")]
pub(crate) use avx512::legacy_unit_codes;

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use core::arch::x86_64::*;

    use super::avx2::q8_0_sum;
    use super::{
        Q4K_GROUP_BLOCK, Q4_0_GROUP_BLOCK, Q5K_GROUP_BLOCK, Q5_0_GROUP_BLOCK, Q8K_BLOCK,
        REPACK_ROWS, SPREAD,
    };
    use crate::common::{rd_f32, rd_i16, rd_u32};
    use crate::gemm::{lane_byte, q6_k_quads};
    use crate::prefetch::prefetch_ahead;
    use crate::simd::x86_avx512::ld512;

    /// 16 f16 at `off` of `s` as f32.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn ld_f16(s: &[u8], off: usize) -> __m512 {
        let s: &[u8; 32] = s[off..off + 32].try_into().unwrap();
        // SAFETY: `s` is exactly 32 readable bytes; `loadu` has no alignment requirement.
        let h = unsafe { _mm256_loadu_si256(s.as_ptr().cast()) };
        _mm512_cvtph_ps(h)
    }

    /// The fifth bits of one chunk (bit `B` of each byte of `h`) at bit 4.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn bit_at_4<const B: u32>(h: __m512i) -> __m512i {
        // 16-bit shifts by at most 4: bit 4 of each byte comes from its own byte.
        let moved = match B {
            0..=3 => _mm512_sll_epi16(h, _mm_cvtsi32_si128(4 - B as i32)),
            _ => _mm512_srl_epi16(h, _mm_cvtsi32_si128(B as i32 - 4)),
        };
        _mm512_and_si512(moved, _mm512_set1_epi8(0x10))
    }

    /// [`super::gemv`] for Q4_K (`Q5`: Q5_K); `group` and `act` hold the same number of
    /// super-blocks.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) fn gemv_q4_k_r16<const Q5: bool>(
        group: &[u8],
        act: &[u8],
        out: &mut [f32; REPACK_ROWS],
    ) {
        let (group_block, qs) = if Q5 {
            (Q5K_GROUP_BLOCK, 768)
        } else {
            (Q4K_GROUP_BLOCK, 256)
        };
        let m4 = _mm512_set1_epi8(0xF);
        let (m1, m2, m3) = (
            _mm512_set1_epi32(0x3f3f_3f3f),
            _mm512_set1_epi32(0x0f0f_0f0f),
            _mm512_set1_epi32(0x0303_0303),
        );
        let mut acc = _mm512_setzero_ps();
        let mut acc_m = _mm512_setzero_ps();
        for (o, y) in group
            .chunks_exact(group_block)
            .zip(act.chunks_exact(Q8K_BLOCK))
        {
            prefetch_ahead(o);
            let yd = _mm512_set1_ps(rd_f32(y, 0));
            let d = _mm512_mul_ps(ld_f16(o, 0), yd);
            let dmin = _mm512_mul_ps(ld_f16(o, 32), yd);
            let qh: [__m512i; 8] = if Q5 {
                core::array::from_fn(|g| ld512(o, 256 + 64 * g))
            } else {
                [_mm512_setzero_si512(); 8]
            };
            let (u0, u1, u2) = (ld512(o, 64), ld512(o, 128), ld512(o, 192));
            // ggml's utmp words on 16 lanes: scales 0..3, 4..7, mins 0..3, 4..7 (a byte each)
            let sc_lo = _mm512_and_si512(u0, m1);
            let sc_hi = _mm512_or_si512(
                _mm512_and_si512(u2, m2),
                _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(u0), m3)),
            );
            let mn_lo = _mm512_and_si512(u1, m1);
            let mn_hi = _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi32::<4>(u2), m2),
                _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(u1), m3)),
            );
            let mut sumi = _mm512_setzero_si512();
            let mut summ = _mm512_setzero_si512();
            for j in 0..4 {
                let mut lo = _mm512_setzero_si512();
                let mut hi = _mm512_setzero_si512();
                for g in 0..8 {
                    let q = ld512(o, qs + (j * 8 + g) * 64);
                    let mut ql = _mm512_and_si512(q, m4);
                    let mut qh_ = _mm512_and_si512(_mm512_srli_epi16::<4>(q), m4);
                    if Q5 {
                        let (h0, h1) = match j {
                            0 => (bit_at_4::<0>(qh[g]), bit_at_4::<1>(qh[g])),
                            1 => (bit_at_4::<2>(qh[g]), bit_at_4::<3>(qh[g])),
                            2 => (bit_at_4::<4>(qh[g]), bit_at_4::<5>(qh[g])),
                            _ => (bit_at_4::<6>(qh[g]), bit_at_4::<7>(qh[g])),
                        };
                        ql = _mm512_or_si512(ql, h0);
                        qh_ = _mm512_or_si512(qh_, h1);
                    }
                    let qh = qh_;
                    let ya = _mm512_set1_epi32(rd_u32(y, 4 + 64 * j + 4 * g) as i32);
                    let yb = _mm512_set1_epi32(rd_u32(y, 4 + 64 * j + 32 + 4 * g) as i32);
                    lo = _mm512_dpbusd_epi32(lo, ql, ya);
                    hi = _mm512_dpbusd_epi32(hi, qh, yb);
                }
                let scales = if j < 2 { sc_lo } else { sc_hi };
                let mins = if j < 2 { mn_lo } else { mn_hi };
                let (s0, s1) = ((2 * j % 4) as u32, (2 * j % 4 + 1) as u32);
                sumi = _mm512_add_epi32(sumi, _mm512_mullo_epi32(lo, lane_byte(scales, s0)));
                sumi = _mm512_add_epi32(sumi, _mm512_mullo_epi32(hi, lane_byte(scales, s1)));
                let bsum = |s: usize| rd_i16(y, 260 + 4 * s) as i32 + rd_i16(y, 262 + 4 * s) as i32;
                summ = _mm512_add_epi32(
                    summ,
                    _mm512_mullo_epi32(lane_byte(mins, s0), _mm512_set1_epi32(bsum(2 * j))),
                );
                summ = _mm512_add_epi32(
                    summ,
                    _mm512_mullo_epi32(lane_byte(mins, s1), _mm512_set1_epi32(bsum(2 * j + 1))),
                );
            }
            acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sumi), acc);
            acc_m = _mm512_fmadd_ps(dmin, _mm512_cvtepi32_ps(summ), acc_m);
        }
        let r = _mm512_sub_ps(acc, acc_m);
        // SAFETY: `out` is 16 f32 = 64 writable bytes; `storeu` has no alignment requirement.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), r) };
    }

    /// [`super::gemv`] for Q6_K; `group` and `act` hold the same number of super-blocks.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) fn gemv_q6_k_r16(group: &[u8], act: &[u8], out: &mut [f32; REPACK_ROWS]) {
        let mut acc = _mm512_setzero_ps();
        for (o, y) in group
            .chunks_exact(super::Q6K_GROUP_BLOCK)
            .zip(act.chunks_exact(Q8K_BLOCK))
        {
            prefetch_ahead(o);
            let yd = _mm512_set1_ps(rd_f32(y, 0));
            let d = _mm512_mul_ps(ld_f16(o, 0), yd);
            let mut isum = [_mm512_setzero_si512(); 16];
            for n in 0..2 {
                for g in 0..8 {
                    let step = 288 + (8 * n + g) * 192;
                    let (a, b, h) = (ld512(o, step), ld512(o, step + 64), ld512(o, step + 128));
                    let q = q6_k_quads(a, b, h);
                    for (k, &q) in q.iter().enumerate() {
                        let yw = _mm512_set1_epi32(rd_u32(y, 4 + 128 * n + 32 * k + 4 * g) as i32);
                        let s = 8 * n + 2 * k + g / 4;
                        isum[s] = _mm512_dpbusd_epi32(isum[s], q, yw);
                    }
                }
            }
            let mut sumi = _mm512_setzero_si512();
            for (s, &v) in isum.iter().enumerate() {
                let sc: &[u8; 16] = o[32 + 16 * s..48 + 16 * s].try_into().unwrap();
                // SAFETY: `sc` is exactly 16 readable bytes; `loadu` has no alignment requirement.
                let sc = _mm512_cvtepi8_epi32(unsafe { _mm_loadu_si128(sc.as_ptr().cast()) });
                let bsum = _mm512_set1_epi32(32 * rd_i16(y, 260 + 2 * s) as i32);
                sumi = _mm512_add_epi32(sumi, _mm512_mullo_epi32(sc, _mm512_sub_epi32(v, bsum)));
            }
            acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sumi), acc);
        }
        // SAFETY: `out` is 16 f32 = 64 writable bytes; `storeu` has no alignment requirement.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), acc) };
    }

    /// The codes (value + 8, or + 16 for Q5_0) of quant unit `g` (0..4) of a Q4_0 (`Q5`:
    /// Q5_0) group block `o`, a row per 32-bit lane: elements 4g..4g+4 (the low nibbles) and
    /// 16+4g..16+4g+4 (the high nibbles, plus each element's fifth bit from the block's
    /// fifth-bit words `qh` for Q5_0), as [`super::legacy_codes`] gives them.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(crate) fn legacy_unit_codes<const Q5: bool>(
        o: &[u8],
        qh: __m512i,
        g: usize,
    ) -> [__m512i; 2] {
        let qs = if Q5 { 96 } else { 32 };
        let m4 = _mm512_set1_epi8(0xF);
        let q = ld512(o, qs + 64 * g);
        let mut lo = _mm512_and_si512(q, m4);
        let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(q), m4);
        if Q5 {
            let b4 = _mm512_set1_epi8(0x10);
            // Byte i of a row tests bit i (even word) or bit 4 + i (odd word) of its copy.
            let t = _mm512_set1_epi32(if g.is_multiple_of(2) {
                0x0804_0201
            } else {
                0x8040_2010_u32 as i32
            });
            // Elements 4g + i (byte g / 2 of the word) and 16 + 4g + i (byte 2 + g / 2).
            let h_lo = _mm512_shuffle_epi8(qh, ld512(&SPREAD[g / 2], 0));
            let h_hi = _mm512_shuffle_epi8(qh, ld512(&SPREAD[2 + g / 2], 0));
            lo = _mm512_or_si512(
                lo,
                _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(h_lo, t), b4),
            );
            hi = _mm512_or_si512(
                hi,
                _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(h_hi, t), b4),
            );
        }
        [lo, hi]
    }

    /// [`super::gemv`] for Q4_0 (`Q5`: Q5_0); `group` and `act` hold the same number of blocks.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) fn gemv_q4_0_r16<const Q5: bool>(
        group: &[u8],
        act: &[u8],
        out: &mut [f32; REPACK_ROWS],
    ) {
        let (group_block, offset) = if Q5 {
            (Q5_0_GROUP_BLOCK, 16)
        } else {
            (Q4_0_GROUP_BLOCK, 8)
        };
        let mut acc = _mm512_setzero_ps();
        for (o, y) in group.chunks_exact(group_block).zip(act.chunks_exact(34)) {
            prefetch_ahead(o);
            let dy = _mm512_set1_ps(crate::common::rd_f16(y, 0));
            let d = _mm512_mul_ps(ld_f16(o, 0), dy);
            let mut isum = _mm512_set1_epi32(-offset * q8_0_sum(y));
            let qh = if Q5 {
                ld512(o, 32)
            } else {
                _mm512_setzero_si512()
            };
            for g in 0..4 {
                let [lo, hi] = legacy_unit_codes::<Q5>(o, qh, g);
                let ya = _mm512_set1_epi32(rd_u32(y, 2 + 4 * g) as i32);
                let yb = _mm512_set1_epi32(rd_u32(y, 18 + 4 * g) as i32);
                isum = _mm512_dpbusd_epi32(isum, lo, ya);
                isum = _mm512_dpbusd_epi32(isum, hi, yb);
            }
            acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(isum), acc);
        }
        // SAFETY: `out` is 16 f32 = 64 writable bytes; `storeu` has no alignment requirement.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), acc) };
    }

    /// [`super::gemv`] for Q8_0; `group` and `act` hold the same number of blocks.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) fn gemv_q8_0_r16(group: &[u8], act: &[u8], out: &mut [f32; REPACK_ROWS]) {
        let flip = _mm512_set1_epi8(-128);
        let mut acc = _mm512_setzero_ps();
        for (o, y) in group
            .chunks_exact(super::Q8_0_GROUP_BLOCK)
            .zip(act.chunks_exact(34))
        {
            prefetch_ahead(o);
            let dy = _mm512_set1_ps(crate::common::rd_f16(y, 0));
            let d = _mm512_mul_ps(ld_f16(o, 0), dy);
            // Σ y of the block for the weights' +128.
            let mut isum = _mm512_set1_epi32(-128 * q8_0_sum(y));
            for g in 0..8 {
                let w = _mm512_xor_si512(ld512(o, 32 + 64 * g), flip);
                let yw = _mm512_set1_epi32(rd_u32(y, 2 + 4 * g) as i32);
                isum = _mm512_dpbusd_epi32(isum, w, yw);
            }
            acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(isum), acc);
        }
        // SAFETY: `out` is 16 f32 = 64 writable bytes; `storeu` has no alignment requirement.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), acc) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_data::{act_rows, weight_rows, INTERLEAVED_TYPES as TYPES};

    #[test]
    fn interleaved_type_ids_round_trip_and_stay_clear_of_ggml_ids() {
        for ty in GgmlType::ALL {
            match interleaved_type_id(ty) {
                Some(id) => {
                    assert!(TYPES.contains(&ty), "{ty}");
                    assert!(GgmlType::from_id(id).is_none(), "{ty}: {id} is a ggml id");
                    assert_eq!(interleaved_base_type(id), Some(ty));
                }
                None => assert!(!TYPES.contains(&ty), "{ty}"),
            }
        }
        for id in [0, 8, 12, 999, 1000, 1003, 1010, u32::MAX] {
            assert_eq!(interleaved_base_type(id), None, "{id}");
        }
    }

    /// Random `ty` rows and one activation row of its dot partner.
    fn data(ty: GgmlType, n_rows: usize, n_in: usize, seed: &mut u64) -> (Vec<u8>, Vec<u8>) {
        (
            weight_rows(ty, n_rows, n_in, seed),
            act_rows(ty, n_in, 1, seed),
        )
    }

    #[test]
    fn repack_round_trips() {
        let mut seed = 3;
        for ty in TYPES {
            // Rows of 128: MLA's attn_k_b in the legacy types.
            let (n_rows, n_in) = (
                32,
                if fields(ty).unwrap().elems == 32 {
                    128
                } else {
                    512
                },
            );
            let (w, _) = data(ty, n_rows, n_in, &mut seed);
            let mut r = vec![0u8; w.len()];
            repack(ty, &w, n_rows, n_in, &mut r);
            assert_ne!(r, w);
            let mut back = vec![0u8; w.len()];
            unrepack(ty, &r, n_rows, n_in, &mut back);
            assert_eq!(back, w, "{ty}");
        }
    }

    /// The largest codes against activations of -128 everywhere: the SIMD kernels' i16 sums
    /// (of up to 8 code pairs before widening) must not saturate, so they still equal the
    /// portable kernels bit for bit.
    #[test]
    fn gemv_extreme_codes_match_the_portable_kernels() {
        let n_in = 512;
        let mut act = Vec::new();
        for _ in 0..n_in / 256 {
            act.extend_from_slice(&0.5f32.to_le_bytes());
            act.extend_from_slice(&[0x80; 256]);
            for _ in 0..16 {
                act.extend_from_slice(&(-16 * 128i16).to_le_bytes());
            }
        }
        for ty in [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K] {
            let n_rows = REPACK_ROWS;
            let mut w = vec![0xFFu8; ty.row_bytes(n_in as u64).unwrap() as usize * n_rows];
            let d = crate::f32_to_fp16(1.0 / 64.0).to_le_bytes();
            for blk in w.chunks_exact_mut(ty.type_size()) {
                for &off in ty.f16_scale_offsets() {
                    blk[off..off + 2].copy_from_slice(&d);
                }
            }
            let mut r = vec![0u8; w.len()];
            repack(ty, &w, n_rows, n_in, &mut r);
            let mut got = [0f32; REPACK_ROWS];
            gemv(ty, n_in, &r, &act, &mut got);
            let mut scalar = [0f32; REPACK_ROWS];
            match ty {
                GgmlType::Q4_K => gemv_q4_k_r16_scalar::<false>(&r, &act, &mut scalar),
                GgmlType::Q5_K => gemv_q4_k_r16_scalar::<true>(&r, &act, &mut scalar),
                _ => gemv_q6_k_r16_scalar(&r, &act, &mut scalar),
            }
            assert_eq!(got.map(f32::to_bits), scalar.map(f32::to_bits), "{ty}");
            let want = crate::vec_dot_fn(ty).unwrap()(n_in, &w[..w.len() / n_rows], &act);
            assert!(
                (got[0] - want).abs() <= 1e-5 * want.abs(),
                "{ty}: {} vs {want}",
                got[0]
            );
        }
    }

    /// The interleaved kernels equal `vec_dot` to float rounding, and the SIMD kernels equal
    /// the portable ones bit for bit.
    #[test]
    fn gemv_matches_vec_dot() {
        let mut seed = 11;
        for (ty, n_in) in TYPES.map(|t| (t, 1536)).into_iter().chain([
            (GgmlType::Q8_0, 128),
            (GgmlType::Q4_0, 160),
            (GgmlType::Q5_0, 128),
        ]) {
            let n_rows = 48;
            let (w, a) = data(ty, n_rows, n_in, &mut seed);
            let mut r = vec![0u8; w.len()];
            repack(ty, &w, n_rows, n_in, &mut r);
            let rb = w.len() / n_rows;
            let dot = crate::vec_dot_fn(ty).unwrap();
            for (gi, group) in r.chunks_exact(REPACK_ROWS * rb).enumerate() {
                let mut got = [0f32; REPACK_ROWS];
                gemv(ty, n_in, group, &a, &mut got);
                let mut scalar = [0f32; REPACK_ROWS];
                match ty {
                    GgmlType::Q4_K => gemv_q4_k_r16_scalar::<false>(group, &a, &mut scalar),
                    GgmlType::Q5_K => gemv_q4_k_r16_scalar::<true>(group, &a, &mut scalar),
                    GgmlType::Q6_K => gemv_q6_k_r16_scalar(group, &a, &mut scalar),
                    GgmlType::Q4_0 => gemv_q4_0_r16_scalar::<false>(group, &a, &mut scalar),
                    GgmlType::Q5_0 => gemv_q4_0_r16_scalar::<true>(group, &a, &mut scalar),
                    _ => gemv_q8_0_r16_scalar(group, &a, &mut scalar),
                }
                assert_eq!(got.map(f32::to_bits), scalar.map(f32::to_bits), "{ty}");
                for (i, &g) in got.iter().enumerate() {
                    let row = gi * REPACK_ROWS + i;
                    let want = dot(n_in, &w[row * rb..(row + 1) * rb], &a);
                    assert!(
                        (g - want).abs() <= 1e-5 * (1.0 + want.abs()),
                        "{ty} row {row}: {g} vs vec_dot {want}"
                    );
                }
            }
        }
    }
}
