//! AVX-512 (F/BW/VL/VNNI) dot products of ik_llama.cpp's types (`iqk.rs`): IQ2_K .. IQ6_K,
//! IQ2_KS .. IQ5_KS (x Q8_K) and Q6_0 (x Q8_0); and their int8 GEMM tile decoders
//! (`gemm::UnpackTileFn`), which run the same block decoding on 16 rows and transpose the
//! results into the tile.
//!
//! A block's group scales are unpacked into i16 lanes at once (one function per scale layout,
//! shared with the AVX2 kernels: `x86_avx2_iqk.rs`).
//! A super-block is four 64-value chunks. Each chunk's code-book indices are gathered into one
//! register in value order (the bit fields are laid out so that every 128-bit lane holds one
//! 16-value group, or half of a 32-value group), looked up with `vpshufb` in the lower half of
//! the code book, and the upper half's constant added where the group's half bit is set. The
//! products with the activations go through the sign trick (|w| as unsigned times `a` with w's
//! sign: exact, as Q8_K and Q8_0 activations lie in -127..127), `vpmaddubsw` to pairs and
//! `vpdpwssd` with the group scales. The block's integer sum is then exactly the scalar
//! reference's, and the float steps are the reference's too (`sum += (d_w * d_a) * sumi` per
//! block), so the result is bit-identical to it.
//!
//! Verified by: `tests/iqk.rs` (property tests against the scalar reference, bit for bit; the
//! tiles against the row decoder's, byte for byte).
//!
//! Every `unsafe` block is an unaligned load or store through a pointer derived from a slice of
//! checked length, or a call of a `#[target_feature]` kernel after run-time detection.

use core::arch::x86_64::*;

use super::x86_avx2::{h2f, ld128, ld256};
use super::x86_avx2_iqk::{
    hsum_i32_8, q6_0_quants, quant_fields, scales_iq2_k, scales_iq2_ks, scales_iq3_k_abs,
    scales_iq3_k_signs, scales_iq3_ks, scales_iq6_k, scales_k6, scales_ks,
};
use super::x86_avx512::{halves_epi16, ld512};
use crate::common::rd_f32;
use crate::gemm::{TileOut, GEMM_TILE_ROWS};
use crate::iqk::{self, Kind};
use crate::kquants::Q8_K_BYTES;
use crate::legacy::Q8_0_BYTES;

// The entry points `dot_iq2_k` .. `dot_iq5_ks`, `dot_q6_0` (`VecDotFn`s, at the AVX-512 level).
iqk_dot_entries!();

/// The 32 bytes at `off`, twice: `[b0..16, b16..32, b0..16, b16..32]` by 128-bit lane.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn twice(s: &[u8], off: usize) -> __m512i {
    _mm512_broadcast_i64x4(ld256(s, off))
}

/// Bits `[lo, lo + 2)` of every byte of `twice(s, off)`'s lanes 0, 1 and `[hi, hi + 2)` of
/// lanes 2, 3 (shifts below 8: the 16-bit shift brings in zeros or the next byte's bits, which
/// the mask drops).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn bits_of_twice(s: &[u8], off: usize, lo: i16, hi: i16, mask: i8) -> __m512i {
    _mm512_and_si512(
        _mm512_srlv_epi16(twice(s, off), halves_epi16(lo, hi)),
        _mm512_set1_epi8(mask),
    )
}

/// A 16-entry code-book slice as a register (each 128-bit lane a copy).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn table(values: &[i8], first: usize) -> __m512i {
    let mut b = [0u8; 16];
    for (o, &v) in b.iter_mut().zip(&values[first..]) {
        *o = v as u8;
    }
    _mm512_broadcast_i32x4(ld128(&b, 0))
}

/// `LANES16[b]`: the byte mask of the 128-bit lanes whose bit is set in `b` (4 groups of 16).
const LANES16: [u64; 16] = {
    let mut t = [0u64; 16];
    let mut b = 0;
    while b < 16 {
        let mut l = 0;
        while l < 4 {
            if (b >> l) & 1 == 1 {
                t[b] |= 0xffff << (16 * l);
            }
            l += 1;
        }
        b += 1;
    }
    t
};

/// `LANES32[b]`: the byte mask of the 256-bit halves whose bit is set in `b` (2 groups of 32).
const LANES32: [u64; 4] = [0, 0xffff_ffff, 0xffff_ffff << 32, u64::MAX];

/// The half mask of chunk `c`: its 4 groups of 16 or 2 groups of 32.
#[inline(always)]
fn chunk_halves(halves: u16, group: usize, c: usize) -> __mmask64 {
    if group == 16 {
        LANES16[((halves >> (4 * c)) & 0xf) as usize]
    } else {
        LANES32[((halves >> (2 * c)) & 3) as usize]
    }
}

/// IQ3_K's scales, negated under a mask (the AVX2 way, a compare and two more operations, is
/// measurably slower here).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn scales_iq3_k(x: &[u8]) -> __m256i {
    let v = scales_iq3_k_abs(x);
    _mm256_mask_sub_epi16(v, scales_iq3_k_signs(x), _mm256_setzero_si256(), v)
}

/// For each chunk c, which group scale every i16 pair lane takes (pair lane i holds values
/// 2i, 2i + 1 of the chunk: group `64c / group + i / (group / 2)`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn scale_index(group: usize) -> [__m512i; 4] {
    let per_group = (group / 2) as i16;
    let mut idx = [[0i16; 32]; 4];
    for (c, row) in idx.iter_mut().enumerate() {
        for (i, v) in row.iter_mut().enumerate() {
            *v = (64 * c / group) as i16 + i as i16 / per_group;
        }
    }
    // SAFETY: each row of `idx` is 64 readable bytes; `loadu` has no alignment requirement.
    idx.map(|row| unsafe { _mm512_loadu_si512(row.as_ptr().cast()) })
}

/// `acc` + the products of code values `v` and activations `a`, pairs summed and times their
/// scale `sc` (i16 lanes).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn madd_chunk(acc: __m512i, v: __m512i, a: __m512i, sc: __m512i) -> __m512i {
    let neg = _mm512_movepi8_mask(v);
    let av = _mm512_abs_epi8(v);
    let sa = _mm512_mask_sub_epi8(a, neg, _mm512_setzero_si512(), a);
    _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(av, sa), sc)
}

/// A code book's lower half in 16-entry parts (1 to 4) and the upper half's shift.
struct Books {
    t: [__m512i; 4],
    parts: usize,
    shift: __m512i,
}

impl Books {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn new(values: &'static [i8]) -> Books {
        let half = values.len() / 2;
        let parts = half.div_ceil(16);
        let mut t = [_mm512_setzero_si512(); 4];
        for (p, tp) in t.iter_mut().enumerate().take(parts) {
            *tp = table(&values[..half], 16 * p);
        }
        Books {
            t,
            parts,
            shift: _mm512_set1_epi8(values[half] - values[0]),
        }
    }

    /// The values of lower-half index `16 hi + lo` per byte (`hi` 0 where the book has one
    /// part), moved to the upper half in the bytes of `upper`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn lookup(&self, lo: __m512i, hi: __m512i, upper: __mmask64) -> __m512i {
        let mut v = _mm512_shuffle_epi8(self.t[0], lo);
        for p in 1..self.parts {
            let m = _mm512_cmpeq_epi8_mask(hi, _mm512_set1_epi8(p as i8));
            v = _mm512_mask_shuffle_epi8(v, m, self.t[p], lo);
        }
        _mm512_mask_add_epi8(v, upper, v, self.shift)
    }
}

/// Groups 4c..4c+3 (or 32-groups 2c, 2c+1) of the 2- and 3-bit layouts read bit pairs
/// 2 (c%2) and 2 (c%2) + 1 of `qs[32 (c/2) ..+32]`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn pairs(qs: &[u8], c: usize) -> __m512i {
    let s = 4 * (c % 2) as i16;
    bits_of_twice(qs, 32 * (c / 2), s, s + 2, 3)
}

/// Nibbles of IQ5/IQ6: nibble `L/2` of `qs[32c + 16 (L%2) + j]` in lane L.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn nibbles_5_6(qs: &[u8], c: usize) -> __m512i {
    bits_of_twice(qs, 32 * c, 0, 4, 0xf)
}

// Chunk `c`'s values of each layout, from the super-block `x` (the `_K` and `_KS` variants of a
// bit width share their bit-field layout: `quant_fields`): its lower-half indices (and 16-entry
// part where the book has more than one) looked up in `b`, moved to the upper half in `upper`.

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn chunk_2bit(x: &[u8], c: usize, b: &Books, upper: __mmask64) -> __m512i {
    let (qs, _) = quant_fields(x, 64, 0);
    b.lookup(pairs(qs, c), _mm512_setzero_si512(), upper)
}

/// [`pairs`] with bit `2c + L/2` of `qh[16 (L%2) + j]` as the third bit.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn chunk_3bit(x: &[u8], c: usize, b: &Books, upper: __mmask64) -> __m512i {
    let (qs, qh) = quant_fields(x, 64, 32);
    let h = bits_of_twice(qh, 0, 2 * c as i16, 2 * c as i16 + 1, 1);
    let idx = _mm512_or_si512(pairs(qs, c), _mm512_slli_epi16::<2>(h));
    b.lookup(idx, _mm512_setzero_si512(), upper)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn chunk_4bit(x: &[u8], c: usize, b: &Books, upper: __mmask64) -> __m512i {
    let (qs, _) = quant_fields(x, 128, 0);
    // [lo nibbles of qs[32c..+16], their hi nibbles, the same of qs[32c+16..+16]].
    let t = _mm512_castsi256_si512(ld256(qs, 32 * c));
    let z = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3), t);
    let four = 0x0004_0004_0004_0004;
    let sh = _mm512_setr_epi64(0, 0, four, four, 0, 0, four, four);
    let idx = _mm512_and_si512(_mm512_srlv_epi16(z, sh), _mm512_set1_epi8(0xf));
    b.lookup(idx, _mm512_setzero_si512(), upper)
}

/// Nibbles as IQ6_K, fifth bit `2c + L/2` of `qh[16 (L%2) + j]`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn chunk_5bit(x: &[u8], c: usize, b: &Books, upper: __mmask64) -> __m512i {
    let (qs, qh) = quant_fields(x, 128, 32);
    let hi = bits_of_twice(qh, 0, 2 * c as i16, 2 * c as i16 + 1, 1);
    b.lookup(nibbles_5_6(qs, c), hi, upper)
}

/// IQ6_K: high bit pair `4 (c%2) + 2 (L/2)` of `qh[32 (c/2) + 16 (L%2) + j]`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn chunk_6bit(x: &[u8], c: usize, b: &Books, upper: __mmask64) -> __m512i {
    let (qs, qh) = quant_fields(x, 128, 64);
    let s = 4 * (c % 2) as i16;
    let hi = bits_of_twice(qh, 32 * (c / 2), s, s + 2, 3);
    b.lookup(nibbles_5_6(qs, c), hi, upper)
}

/// One super-block kernel: `$chunk(x, c, books, upper)` gives chunk c's values.
macro_rules! super_block_kernel {
    ($imp:ident, $kind:path, $chunk:ident, $scales:ident) => {
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        fn $imp(w: &[u8], a: &[u8]) -> f32 {
            let k: &Kind = &$kind;
            let books = Books::new(k.values);
            let scale_idx = scale_index(k.group);
            let (row_d, blocks) = k.split_row(w);
            let mut sum = 0f32;
            for (x, y) in blocks.chunks_exact(k.bytes).zip(a.chunks_exact(Q8_K_BYTES)) {
                let d = k.block_d(row_d, x);
                let sc16 = _mm512_castsi256_si512($scales(x));
                let halves = (k.halves)(x);
                let mut acc = _mm512_setzero_si512();
                for c in 0..4 {
                    let upper = chunk_halves(halves, k.group, c);
                    let v = $chunk(x, c, &books, upper);
                    let s = _mm512_permutexvar_epi16(scale_idx[c], sc16);
                    acc = madd_chunk(acc, v, ld512(y, 4 + 64 * c), s);
                }
                let sumi = _mm512_reduce_add_epi32(acc);
                sum += (d * rd_f32(y, 0)) * sumi as f32;
            }
            sum
        }
    };
}

super_block_kernel!(dot_iq2_k_imp, iqk::IQ2_K, chunk_2bit, scales_iq2_k);
super_block_kernel!(dot_iq3_k_imp, iqk::IQ3_K, chunk_3bit, scales_iq3_k);
super_block_kernel!(dot_iq4_k_imp, iqk::IQ4_K, chunk_4bit, scales_k6);
super_block_kernel!(dot_iq5_k_imp, iqk::IQ5_K, chunk_5bit, scales_k6);
super_block_kernel!(dot_iq6_k_imp, iqk::IQ6_K, chunk_6bit, scales_iq6_k);
super_block_kernel!(dot_iq2_ks_imp, iqk::IQ2_KS, chunk_2bit, scales_iq2_ks);
super_block_kernel!(dot_iq3_ks_imp, iqk::IQ3_KS, chunk_3bit, scales_iq3_ks);
super_block_kernel!(dot_iq4_ks_imp, iqk::IQ4_KS, chunk_4bit, scales_ks);
super_block_kernel!(dot_iq5_ks_imp, iqk::IQ5_KS, chunk_5bit, scales_ks);

/// Q6_0: per block [`q6_0_quants`], `sum (q - 32) a` from two `vpdpbusd`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn dot_q6_0_imp(w: &[u8], a: &[u8]) -> f32 {
    let k32 = _mm256_set1_epi8(32);
    let zero = _mm256_setzero_si256();
    let mut sum = 0f32;
    for (x, y) in w
        .chunks_exact(iqk::Q6_0_BYTES)
        .zip(a.chunks_exact(Q8_0_BYTES))
    {
        let q = q6_0_quants(x);
        let qy = ld256(y, 2);
        let p = _mm256_sub_epi32(
            _mm256_dpbusd_epi32(zero, q, qy),
            _mm256_dpbusd_epi32(zero, k32, qy),
        );
        sum += (h2f(x, 0) * h2f(y, 0)) * hsum_i32_8(p) as f32;
    }
    sum
}

// ---------------------------------------------------------------------------------------------
// int8 GEMM tiles (`gemm.rs`): 16 rows decoded at once into the interleaved tile

/// The 16 x 16 matrix of 32-bit lanes whose row i is `r[i]`, transposed: lane i of result j is
/// lane j of `r[i]`. Pairs of lanes, then 4 x 4 blocks inside 128-bit lanes, then the 128-bit
/// lanes (64 shuffles). Also transposes the AMX products' 16 x 16 f32 sums (`bf16gemm.rs`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) fn transpose_16x16(r: [__m512i; 16]) -> [__m512i; 16] {
    let z = _mm512_setzero_si512();
    // t[2i] lane L: (2i, 4L), (2i+1, 4L), (2i, 4L+1), (2i+1, 4L+1); t[2i+1] the same of
    // columns 4L+2, 4L+3 ((row, column) of r).
    let mut t = [z; 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    // u[4i + k] lane L: column 4L + k of rows 4i..4i+3.
    let mut u = [z; 16];
    for i in 0..4 {
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    // Column 4L + k is lane L of u[k], u[4+k], u[8+k], u[12+k].
    let mut o = [z; 16];
    for k in 0..4 {
        let s0 = _mm512_shuffle_i32x4::<0x44>(u[k], u[4 + k]);
        let s1 = _mm512_shuffle_i32x4::<0xEE>(u[k], u[4 + k]);
        let s2 = _mm512_shuffle_i32x4::<0x44>(u[8 + k], u[12 + k]);
        let s3 = _mm512_shuffle_i32x4::<0xEE>(u[8 + k], u[12 + k]);
        o[k] = _mm512_shuffle_i32x4::<0x88>(s0, s2);
        o[4 + k] = _mm512_shuffle_i32x4::<0xDD>(s0, s2);
        o[8 + k] = _mm512_shuffle_i32x4::<0x88>(s1, s3);
        o[12 + k] = _mm512_shuffle_i32x4::<0xDD>(s1, s3);
    }
    o
}

/// `q[off..off + 64] = v`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn st512(q: &mut [u8], off: usize, v: __m512i) {
    let q: &mut [u8; 64] = (&mut q[off..off + 64]).try_into().unwrap();
    // SAFETY: `q` is exactly 64 writable bytes; `storeu` has no alignment requirement.
    unsafe { _mm512_storeu_si512(q.as_mut_ptr().cast(), v) }
}

/// `s[off..off + 16] = v`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn st512_ps(s: &mut [f32], off: usize, v: __m512) {
    let s: &mut [f32; 16] = (&mut s[off..off + 16]).try_into().unwrap();
    // SAFETY: `s` is exactly 16 writable floats; `storeu` has no alignment requirement.
    unsafe { _mm512_storeu_ps(s.as_mut_ptr(), v) }
}

/// Declares `$name`, the `gemm::UnpackTileFn` of super-block type `$kind`: checks the sizes
/// and calls `$imp`. `false` (tile untouched) where the int8 GEMM is unavailable.
macro_rules! tile_entry {
    ($name:ident, $imp:ident, $kind:path) => {
        pub(crate) fn $name(
            rows: &[u8],
            n_rows: usize,
            row_bytes: usize,
            n_in: usize,
            _scratch: &mut [u8],
            out: TileOut,
        ) -> bool {
            if !crate::gemm::gemm_avx512() {
                return false;
            }
            let k: &Kind = &$kind;
            assert!(n_rows <= GEMM_TILE_ROWS && rows.len() == n_rows * row_bytes);
            assert!(n_in.is_multiple_of(256) && row_bytes == k.row_prefix() + n_in / 256 * k.bytes);
            assert!(out.q.len() == GEMM_TILE_ROWS * n_in);
            assert!(out.scale.len() == n_in / k.group * GEMM_TILE_ROWS);
            // SAFETY: `gemm_avx512()` means the AVX-512 level, i.e. AVX-512 F/BW/VL/VNNI,
            // AVX2, FMA and F16C were detected (`simd::detect`).
            unsafe { $imp(rows, n_rows, row_bytes, out) };
            true
        }
    };
}

/// One tile kernel: block by block, the 16 rows' group scales (`$scales`, times the block's
/// or row's `d`, transposed to `[group][row]`) and their four 64-value chunks (`$chunk`,
/// values + 128, transposed to groups of 4 values of the 16 rows). As `iqk::gemm_decode`
/// followed by the tile's interleaving; rows past `n_rows` are zeros.
macro_rules! tile_kernel {
    ($imp:ident, $kind:path, $chunk:ident, $scales:ident) => {
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        fn $imp(rows: &[u8], n_rows: usize, row_bytes: usize, out: TileOut) {
            let k: &Kind = &$kind;
            let books = Books::new(k.values);
            let z = _mm512_setzero_si512();
            let bias = _mm512_set1_epi8(-128);
            let groups = 256 / k.group;
            let nb = (row_bytes - k.row_prefix()) / k.bytes;
            let row = |m: usize| &rows[m * row_bytes..(m + 1) * row_bytes];
            let mut row_d = [0f32; GEMM_TILE_ROWS];
            for (m, d) in row_d.iter_mut().enumerate().take(n_rows) {
                *d = k.split_row(row(m)).0;
            }
            let block = |m: usize, b: usize| {
                let at = m * row_bytes + k.row_prefix() + b * k.bytes;
                &rows[at..at + k.bytes]
            };
            for b in 0..nb {
                let mut halves = [0u16; GEMM_TILE_ROWS];
                let mut sc = [z; GEMM_TILE_ROWS];
                for m in 0..n_rows {
                    let x = block(m, b);
                    halves[m] = (k.halves)(x);
                    let d = _mm512_set1_ps(k.block_d(row_d[m], x));
                    let s = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32($scales(x)));
                    sc[m] = _mm512_castps_si512(_mm512_mul_ps(d, s));
                }
                let sc = transpose_16x16(sc);
                for (g, &s) in sc.iter().enumerate().take(groups) {
                    st512_ps(out.scale, (groups * b + g) * 16, _mm512_castsi512_ps(s));
                }
                for c in 0..4 {
                    let mut v = [z; GEMM_TILE_ROWS];
                    for m in 0..n_rows {
                        let upper = chunk_halves(halves[m], k.group, c);
                        v[m] = _mm512_xor_si512($chunk(block(m, b), c, &books, upper), bias);
                    }
                    for (j, &g) in transpose_16x16(v).iter().enumerate() {
                        st512(out.q, 64 * (64 * b + 16 * c + j), g);
                    }
                }
            }
        }
    };
}

tile_entry!(unpack_tile_iq2_k, tile_iq2_k_imp, iqk::IQ2_K);
tile_entry!(unpack_tile_iq3_k, tile_iq3_k_imp, iqk::IQ3_K);
tile_entry!(unpack_tile_iq4_k, tile_iq4_k_imp, iqk::IQ4_K);
tile_entry!(unpack_tile_iq5_k, tile_iq5_k_imp, iqk::IQ5_K);
tile_entry!(unpack_tile_iq6_k, tile_iq6_k_imp, iqk::IQ6_K);
tile_entry!(unpack_tile_iq2_ks, tile_iq2_ks_imp, iqk::IQ2_KS);
tile_entry!(unpack_tile_iq3_ks, tile_iq3_ks_imp, iqk::IQ3_KS);
tile_entry!(unpack_tile_iq4_ks, tile_iq4_ks_imp, iqk::IQ4_KS);
tile_entry!(unpack_tile_iq5_ks, tile_iq5_ks_imp, iqk::IQ5_KS);

tile_kernel!(tile_iq2_k_imp, iqk::IQ2_K, chunk_2bit, scales_iq2_k);
tile_kernel!(tile_iq3_k_imp, iqk::IQ3_K, chunk_3bit, scales_iq3_k);
tile_kernel!(tile_iq4_k_imp, iqk::IQ4_K, chunk_4bit, scales_k6);
tile_kernel!(tile_iq5_k_imp, iqk::IQ5_K, chunk_5bit, scales_k6);
tile_kernel!(tile_iq6_k_imp, iqk::IQ6_K, chunk_6bit, scales_iq6_k);
tile_kernel!(tile_iq2_ks_imp, iqk::IQ2_KS, chunk_2bit, scales_iq2_ks);
tile_kernel!(tile_iq3_ks_imp, iqk::IQ3_KS, chunk_3bit, scales_iq3_ks);
tile_kernel!(tile_iq4_ks_imp, iqk::IQ4_KS, chunk_4bit, scales_ks);
tile_kernel!(tile_iq5_ks_imp, iqk::IQ5_KS, chunk_5bit, scales_ks);

/// Q6_0's `gemm::UnpackTileFn`: checks the sizes and calls [`tile_q6_0_imp`]. `false` (tile
/// untouched) where the int8 GEMM is unavailable.
pub(crate) fn unpack_tile_q6_0(
    rows: &[u8],
    n_rows: usize,
    row_bytes: usize,
    n_in: usize,
    _scratch: &mut [u8],
    out: TileOut,
) -> bool {
    if !crate::gemm::gemm_avx512() {
        return false;
    }
    assert!(n_rows <= GEMM_TILE_ROWS && rows.len() == n_rows * row_bytes);
    assert!(n_in.is_multiple_of(32) && row_bytes == n_in / 32 * iqk::Q6_0_BYTES);
    assert!(out.q.len() == GEMM_TILE_ROWS * n_in);
    assert!(out.scale.len() == n_in / 32 * GEMM_TILE_ROWS);
    // SAFETY: as for the super-block types' tile decoders (`tile_entry!`).
    unsafe { tile_q6_0_imp(rows, n_rows, row_bytes, out) };
    true
}

/// Q6_0 rows into the tile, two blocks (64 values) at a time: [`q6_0_quants`] of the 16 rows
/// transposed (the values are `gemm_decode_q6_0`'s, 0..63), and each block's `d` per row.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn tile_q6_0_imp(rows: &[u8], n_rows: usize, row_bytes: usize, out: TileOut) {
    const B: usize = iqk::Q6_0_BYTES;
    let z = _mm512_setzero_si512();
    let nb = row_bytes / B;
    let block = |m: usize, b: usize| &rows[m * row_bytes + b * B..m * row_bytes + (b + 1) * B];
    for c in 0..nb.div_ceil(2) {
        let pair = 2 * c + 1 < nb;
        let mut d = [[0u16; GEMM_TILE_ROWS]; 2];
        let mut v = [z; GEMM_TILE_ROWS];
        for m in 0..n_rows {
            let lo = block(m, 2 * c);
            d[0][m] = u16::from_le_bytes([lo[0], lo[1]]);
            let mut q = _mm512_castsi256_si512(q6_0_quants(lo));
            if pair {
                let hi = block(m, 2 * c + 1);
                d[1][m] = u16::from_le_bytes([hi[0], hi[1]]);
                q = _mm512_inserti64x4::<1>(q, q6_0_quants(hi));
            }
            v[m] = q;
        }
        for (h, d) in d.iter().enumerate().take(1 + pair as usize) {
            // SAFETY: `d` is 16 readable u16 (32 bytes); `loadu` has no alignment requirement.
            let d = unsafe { _mm256_loadu_si256(d.as_ptr().cast()) };
            st512_ps(out.scale, (2 * c + h) * 16, _mm512_cvtph_ps(d));
        }
        let groups = if pair { 16 } else { 8 };
        for (j, &g) in transpose_16x16(v).iter().enumerate().take(groups) {
            st512(out.q, 64 * (16 * c + j), g);
        }
    }
}
