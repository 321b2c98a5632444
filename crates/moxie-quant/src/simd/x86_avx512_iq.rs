//! AVX-512 dot products of ggml's code-book types with Q8_K activations (IQ2_XXS, IQ2_XS,
//! IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M), bit-identical to the AVX2 ports (`x86_avx2.rs`,
//! `x86_avx2_iq1_iq3s.rs`) and so to ggml's x86 build.
//!
//! What has to match: ggml's AVX2 kernels form, per super-block, 8 int32 lanes (lane k holds,
//! summed over the 32-element sub-blocks, the products of a sub-block's elements 4k..4k+3 times
//! its scale), convert them to float and accumulate them with one FMA per block, then
//! `hsum_float_8`. Integer sums are exact (nothing saturates: magnitudes are at most 62, so
//! `vpmaddubsw` pairs stay below 2^14), so any way of forming the same lane sums gives the same
//! bits. Here one 512-bit register holds two sub-blocks (the low half the even, the high half
//! the odd one), lanes are formed with `vpmaddubsw` + `vpdpwssd` (the scales) or, for IQ1_S /
//! IQ1_M, whose grid values are -1, 0, 1 and scales at most 15, with one `vpdpbusd` of
//! `scale * |g|` (a byte), and the two halves are added before the conversion. Signs are applied
//! to the activations with `vpsubb` under a k-mask (`0 - q` wraps for -128 exactly as `vpsignb`
//! does in ggml's kernels), so the results are the AVX2 kernels' for every input.
//!
//! The work that dominates ggml's kernels is fetching code-book rows one by one. Here the books
//! of the IQ2 / IQ3 types are compressed (2 bits per value for the 3-level IQ2 books, 3 bits for
//! the 8-level IQ3 books: 16 bits per row) and kept as two byte planes (low and high byte of
//! each row's code) in registers; 64 rows are looked up at once with `vpermi2b` (128 rows per
//! instruction, blended by the index's high bits; the IQ2 types have 32 rows per super-block
//! and look up two super-blocks at a time) and expanded to bytes with `vpmultishiftqb` (each
//! output byte takes its field from the row's code) and `vpermb` (field -> magnitude). The 7-bit
//! sign fields of IQ2_XXS / IQ2_XS / IQ3_XXS become sign bytes with `vpermi2b` over ggml's
//! `ksigns_iq2xs`. A sub-block pair's scales come from one `vpermb` of a register holding the
//! block's scale bytes. IQ1_S / IQ1_M's book (2048 rows) is too large for registers: its rows
//! are loaded one by one as in ggml, merged into registers with masked broadcast loads.
//!
//! All kernels need AVX512_VBMI, detected at run time ([`super::has_avx512_vbmi`]); without it
//! the entry points run the AVX2 kernels (same bits). Tuned on Zen 4, where 512-bit shuffles
//! issue at one per cycle and bound these kernels; a few values go through memory (behind an
//! empty `asm!`) or are merged in `asm!` because LLVM would otherwise rebuild them with
//! shuffles. Speed-ups over the AVX2 kernels there (`cargo bench -p moxie-quant --bench dot --
//! matvec`, one thread): IQ2_XXS 2.3x, IQ2_XS 1.9x, IQ2_S 1.5x, IQ3_XXS 2.6x, IQ3_S 2.3x,
//! IQ1_S 1.6x, IQ1_M 1.25x.
//!
//! Verified by: `tests/simd_props.rs` (AVX-512 == AVX2 bit for bit, and both against the scalar
//! reference, on random raw blocks) and `tests/ggml_golden.rs` (bit-exact against ggml).
//!
//! Every `unsafe` block is an unaligned load/store through a pointer derived from a slice or
//! array of sufficient length, an `asm!` that loads from such memory (or only names a buffer),
//! or a call of a `#[target_feature]` kernel after run-time detection.

use core::arch::asm;
use core::arch::x86_64::*;

use super::x86_avx2::{self as avx2, h2f, hsum_float_8, ld128, ld256};
use super::x86_avx2_iq1_iq3s as avx2_iq;
use super::x86_avx512::{fold, join, ld512};
use crate::common::{rd_f32, rd_u32};
use crate::f16::fp16_to_f32;
use crate::iq1::{iq1m_scale_bits, IQ1_DELTA, IQ1_M_BYTES, IQ1_S_BYTES};
use crate::iq2_3::{IQ2_S_BYTES, IQ2_XS_BYTES, IQ2_XXS_BYTES, IQ3_XXS_BYTES};
use crate::iq3s::IQ3_S_BYTES;
use crate::iq_grids::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS,
};
use crate::kquants::Q8_K_BYTES;

/// Declares the safe entry point `$name` (a `VecDotFn`): checks that `w` and `a` hold `n / 256`
/// super-blocks and calls the `#[target_feature]` kernel `$imp` on exactly those bytes where
/// the CPU has AVX512_VBMI, else the AVX2 kernel `$avx2` (which gives the same bits).
macro_rules! entry {
    ($name:ident, $imp:ident, $avx2:path, $wts:expr) => {
        pub(crate) fn $name(n: usize, w: &[u8], a: &[u8]) -> f32 {
            if !super::has_avx512_vbmi() {
                return $avx2(n, w, a);
            }
            let nb = n / 256;
            let w = &w[..nb * $wts];
            let a = &a[..nb * Q8_K_BYTES];
            // SAFETY: this function is only handed out through its type's table row at the
            // AVX-512 level (`Simd::at`), i.e. after AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C
            // were detected, and AVX512_VBMI was checked above; the slices were bounds-checked.
            unsafe { $imp(w, a) }
        }
    };
}

entry!(
    dot_iq2_xxs,
    dot_iq2_xxs_imp,
    avx2::dot_iq2_xxs,
    IQ2_XXS_BYTES
);
entry!(dot_iq2_xs, dot_iq2_xs_imp, avx2::dot_iq2_xs, IQ2_XS_BYTES);
entry!(dot_iq2_s, dot_iq2_s_imp, avx2::dot_iq2_s, IQ2_S_BYTES);
entry!(
    dot_iq3_xxs,
    dot_iq3_xxs_imp,
    avx2::dot_iq3_xxs,
    IQ3_XXS_BYTES
);
entry!(dot_iq3_s, dot_iq3_s_imp, avx2_iq::dot_iq3_s, IQ3_S_BYTES);
entry!(dot_iq1_s, dot_iq1_s_imp, avx2_iq::dot_iq1_s, IQ1_S_BYTES);
entry!(dot_iq1_m, dot_iq1_m_imp, avx2_iq::dot_iq1_m, IQ1_M_BYTES);

// ---------------------------------------------------------------------------------------------
// compressed code books (built at compile time from `iq_grids`)

/// Row codes of an 8-value book over the magnitudes `v`: value `i` as its index in `v`, in bits
/// 2i..2i+2.
const fn codes2<const N: usize>(grid: &[u64; N], v: [u8; 3]) -> [u16; N] {
    let mut out = [0u16; N];
    let mut e = 0;
    while e < N {
        let mut i = 0;
        while i < 8 {
            let b = (grid[e] >> (8 * i)) as u8;
            let c = if b == v[0] {
                0
            } else if b == v[1] {
                1
            } else {
                assert!(b == v[2]);
                2
            };
            out[e] |= c << (2 * i);
            i += 1;
        }
        e += 1;
    }
    out
}

/// Row codes of a 4-value book over the magnitudes `v`: value `i` in bits 3i..3i+3.
const fn codes3<const N: usize>(grid: &[u32; N], v: [u8; 8]) -> [u16; N] {
    let mut out = [0u16; N];
    let mut e = 0;
    while e < N {
        let mut i = 0;
        while i < 4 {
            let b = (grid[e] >> (8 * i)) as u8;
            let mut c = 0;
            while v[c] != b {
                c += 1;
            }
            out[e] |= (c as u16) << (3 * i);
            i += 1;
        }
        e += 1;
    }
    out
}

/// The codes as two byte planes: `N` low bytes, then `N` high bytes (`M` = 2N).
const fn planes<const N: usize, const M: usize>(codes: [u16; N]) -> [u8; M] {
    assert!(M == 2 * N);
    let mut out = [0u8; M];
    let mut e = 0;
    while e < N {
        out[e] = codes[e] as u8;
        out[N + e] = (codes[e] >> 8) as u8;
        e += 1;
    }
    out
}

const IQ2_VALUES: [u8; 3] = [8, 25, 43];
const IQ3XXS_VALUES: [u8; 8] = [4, 12, 20, 28, 36, 44, 52, 62];
const IQ3S_VALUES: [u8; 8] = [1, 3, 5, 7, 9, 11, 13, 15];

static IQ2XXS_PLANES: [u8; 512] = planes(codes2(&IQ2XXS_GRID, IQ2_VALUES));
static IQ2XS_PLANES: [u8; 1024] = planes(codes2(&IQ2XS_GRID, IQ2_VALUES));
static IQ2S_PLANES: [u8; 2048] = planes(codes2(&IQ2S_GRID, IQ2_VALUES));
static IQ3XXS_PLANES: [u8; 512] = planes(codes3(&IQ3XXS_GRID, IQ3XXS_VALUES));
static IQ3S_PLANES: [u8; 1024] = planes(codes3(&IQ3S_GRID, IQ3S_VALUES));

// ---------------------------------------------------------------------------------------------
// helpers

/// Little-endian u64 at byte offset `off`.
#[inline(always)]
fn rd_u64(s: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(s[off..off + 8].try_into().unwrap())
}

/// The `R` consecutive 64-byte registers of `t`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn regs<const R: usize>(t: &[u8]) -> [__m512i; R] {
    core::array::from_fn(|r| ld512(t, 64 * r))
}

/// Stores `v` in `buf` and returns the array behind an optimization barrier, so that reads of
/// single 64-bit lanes are loads (LLVM would otherwise extract them from `v` with shuffles).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn spill(v: __m512i, buf: &mut [u64; 8]) -> &[u64; 8] {
    // SAFETY: `buf` is 64 writable bytes; `storeu` has no alignment requirement. The empty
    // `asm!` only names the buffer's address: to LLVM it may read and write the buffer, so
    // the store stays and later reads load from memory.
    unsafe {
        _mm512_storeu_si512(buf.as_mut_ptr().cast(), v);
        asm!("/* {0} */", in(reg) buf.as_mut_ptr(), options(nostack, preserves_flags));
    }
    buf
}

/// One byte plane of a code book of `2 * Q` registers (128 rows each) at the 64 row indices
/// whose low 8 bits are the bytes of `idx`: `vpermi2b` takes index bits 0..7 from the bytes,
/// the masks `hi[0]`, `hi[1]`, ... hold index bits 7 (the bytes' top bit), 8, ... and pick
/// among the `Q` partial results.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
fn plane_lookup<const Q: usize>(idx: __m512i, hi: &[__mmask64], t: &[__m512i]) -> __m512i {
    let mut r: [__m512i; Q] =
        core::array::from_fn(|q| _mm512_permutex2var_epi8(t[2 * q], idx, t[2 * q + 1]));
    let mut n = Q;
    let mut level = 0;
    while n > 1 {
        for q in 0..n / 2 {
            r[q] = _mm512_mask_blend_epi8(hi[level], r[2 * q], r[2 * q + 1]);
        }
        n /= 2;
        level += 1;
    }
    r[0]
}

/// The 16-bit row codes of a code book given as byte planes (`2 * Q` registers each) at the
/// 64 byte indices `idx`: `(unpacklo, unpackhi)` of the two planes, i.e. word `8L + m` of the
/// first holds the row at index byte `16L + m`, of the second at `16L + 8 + m` (`m < 8`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
fn codes_lookup<const Q: usize>(
    idx: __m512i,
    hi: &[__mmask64],
    lo_plane: &[__m512i],
    hi_plane: &[__m512i],
) -> (__m512i, __m512i) {
    let lo = plane_lookup::<Q>(idx, hi, lo_plane);
    let hi = plane_lookup::<Q>(idx, hi, hi_plane);
    (_mm512_unpacklo_epi8(lo, hi), _mm512_unpackhi_epi8(lo, hi))
}

/// `ksigns_iq2xs` (7 sign bits -> 8 with even parity) as the two tables of a `vpermi2b`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn ksigns() -> [__m512i; 2] {
    regs::<2>(&KSIGNS_IQ2XS)
}

/// A `vpmultishiftqb` control with the same 8 bit offsets in every 64-bit lane.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn shifts(o: [u8; 8]) -> __m512i {
    _mm512_set1_epi64(i64::from_le_bytes(o))
}

/// `vpermb` table mapping the value of a byte's low bits (as many as the `N` magnitudes `v`
/// need) to `v[...]` (0 for the codes `v` does not have).
const fn value_table<const N: usize>(v: [u8; N]) -> [u8; 64] {
    let mut t = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        let c = i % N.next_power_of_two();
        if c < N {
            t[i] = v[c];
        }
        i += 1;
    }
    t
}

/// A byte permutation (the index operand of `vpermb`) computed at compile time.
macro_rules! byte_perm {
    (|$p:ident| $body:expr) => {{
        const T: [u8; 64] = {
            let mut t = [0u8; 64];
            let mut $p = 0;
            while $p < 64 {
                t[$p] = $body;
                $p += 1;
            }
            t
        };
        ld512(&T, 0)
    }};
}

// ---------------------------------------------------------------------------------------------
// the 8-value books (IQ2_XXS, IQ2_XS, IQ2_S): 32 rows per super-block, looked up for two
// super-blocks at once

/// Where the row codes of the 8-value books go: word 4q + s of a super-block's code register
/// holds the row of output 64-bit lane q of sub-block pair s, i.e. row q % 4 of sub-block
/// 2s + q / 4. With `codes_lookup`'s order, index byte p feeds word 8 (p / 16) + p % 8 of
/// super-block (p / 8) % 2. Returns (super-block, sub-block, row) for index byte p.
const fn iq2_row_for_byte(p: usize) -> (usize, usize, usize) {
    let w = 8 * (p / 16) + p % 8;
    let (q, s) = (w / 4, w % 4);
    ((p / 8) % 2, 2 * s + q / 4, q % 4)
}

/// `vpmultishiftqb` controls of the 8-value books: pair s's row in word slot s, value i at
/// bit 2i.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn iq2_field_shifts() -> [__m512i; 4] {
    core::array::from_fn(|s| {
        let o = 16 * s as u8;
        shifts([o, o + 2, o + 4, o + 6, o + 8, o + 10, o + 12, o + 14])
    })
}

/// The super-blocks of `w` and `a` in order, each block's 8 int32 lanes (`block(x, y,
/// codes)`) accumulated as ggml does (`d * lanes` with one FMA per block); the rows of two
/// blocks are looked up at a time (`codes(xa, xb)`, the second block repeated for an odd
/// count).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
fn two_at_a_time<T>(
    w: &[u8],
    a: &[u8],
    bytes: usize,
    mut codes: impl FnMut(&[u8], &[u8]) -> (T, T),
    mut block: impl FnMut(&[u8], &[u8], T) -> __m256i,
) -> __m256 {
    let mut accumf = _mm256_setzero_ps();
    let mut add = |x: &[u8], y: &[u8], codes: T| {
        let d = h2f(x, 0) * rd_f32(y, 0);
        let lanes = _mm256_cvtepi32_ps(block(x, y, codes));
        accumf = _mm256_fmadd_ps(_mm256_set1_ps(d), lanes, accumf);
    };
    let mut xs = w.chunks_exact(2 * bytes);
    let mut ys = a.chunks_exact(2 * Q8_K_BYTES);
    for (x2, y2) in (&mut xs).zip(&mut ys) {
        let (xa, xb) = x2.split_at(bytes);
        let (ya, yb) = y2.split_at(Q8_K_BYTES);
        let (ca, cb) = codes(xa, xb);
        add(xa, ya, ca);
        add(xb, yb, cb);
    }
    if xs.remainder().len() == bytes && ys.remainder().len() == Q8_K_BYTES {
        let (x, y) = (xs.remainder(), ys.remainder());
        add(x, y, codes(x, x).0);
    }
    accumf
}

/// One super-block of an 8-value book: `masks[j]`, `scales(j)` and the codes of sub-block
/// pair j, summed into ggml's 8 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
fn iq2_block(
    y: &[u8],
    codes: __m512i,
    masks: impl Fn(usize) -> u64,
    scales: impl Fn(usize) -> __m512i,
) -> __m256i {
    let zero = _mm512_setzero_si512();
    let field_shifts = iq2_field_shifts();
    let values = ld512(&const { value_table(IQ2_VALUES) }, 0);
    let mut acc = zero;
    for j in 0..4 {
        let q8 = ld512(y, 4 + 64 * j);
        let q8s = _mm512_mask_sub_epi8(q8, masks(j), zero, q8);
        let fields = _mm512_multishift_epi64_epi8(field_shifts[j], codes);
        let q2 = _mm512_permutexvar_epi8(fields, values);
        acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(q2, q8s), scales(j));
    }
    fold(acc)
}

/// The scales `2 * s + 1` of the 4-bit fields `s` of `scales` (up to 8 bytes, little-endian),
/// field k (nibble k % 2 of byte k / 2) in byte k. IQ2_XS / IQ2_S: 16 fields, the low nibble
/// weighting the first 16 values of a sub-block, the high nibble the last 16; IQ3_S: 8 fields,
/// one per sub-block.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn nibble_scales(scales: u64) -> __m512i {
    let b = _mm_cvtsi64_si128(scales as i64);
    let m4 = _mm_set1_epi8(0xf);
    let n = _mm_unpacklo_epi8(
        _mm_and_si128(b, m4),
        _mm_and_si128(_mm_srli_epi16::<4>(b), m4),
    );
    _mm512_castsi128_si512(_mm_or_si128(_mm_add_epi8(n, n), _mm_set1_epi8(1)))
}

/// A scale vector of one sub-block pair from a register `s` of scale bytes: 128-bit lane L
/// all byte `at[L]` of `s`, as i16 lanes (`WIDE`, for `vpdpwssd`) or as bytes (for
/// `vpdpbusd`). One permute (cheaper than merging broadcast loads).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
fn scale_lanes<const WIDE: bool>(s: __m512i, at: [usize; 4]) -> __m512i {
    let q = |l: usize| (at[l] as u64 * 0x0101_0101_0101_0101) as i64;
    let perm = _mm512_set_epi64(q(3), q(3), q(2), q(2), q(1), q(1), q(0), q(0));
    if WIDE {
        _mm512_maskz_permutexvar_epi8(0x5555_5555_5555_5555, perm, s)
    } else {
        _mm512_permutexvar_epi8(perm, s)
    }
}

// IQ2_XXS: 4 x u64 per 32: 4 grid indices (bytes), then 4 x 7 sign bits + the 4-bit scale

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
fn dot_iq2_xxs_imp(w: &[u8], a: &[u8]) -> f32 {
    let lo_plane = regs::<4>(&IQ2XXS_PLANES[..256]);
    let hi_plane = regs::<4>(&IQ2XXS_PLANES[256..]);
    let ks = ksigns();
    // grid index r of sub-block ib: byte 8 ib + r of `qs` (bytes 2..66); two blocks' `qs`
    let idx_perm = byte_perm!(|p| {
        let (h, sb, r) = iq2_row_for_byte(p);
        (64 * h + 8 * sb + r) as u8
    });
    // the sign words are the high halves of the 64-bit lanes: both blocks' in one register,
    // then the 4 x 7 bits of 32-bit lane i at bits 32 (i % 2) + 7k of 64-bit lane i / 2
    let sign_words = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    let sign_shifts = shifts([0, 7, 14, 21, 32, 39, 46, 53]);
    let mut mbuf = [0u64; 8];
    let codes = |xa: &[u8], xb: &[u8]| {
        let (qa, qb) = (ld512(xa, 2), ld512(xb, 2));
        let idx = _mm512_permutex2var_epi8(qa, idx_perm, qb);
        let (ca, cb) = codes_lookup::<2>(idx, &[_mm512_movepi8_mask(idx)], &lo_plane, &hi_plane);
        // the sign masks of the blocks' pairs, 64-bit lane 4 h + j for pair j of block h
        let s = _mm512_multishift_epi64_epi8(
            sign_shifts,
            _mm512_permutex2var_epi32(qa, sign_words, qb),
        );
        let m = spill(_mm512_permutex2var_epi8(ks[0], s, ks[1]), &mut mbuf);
        (
            (ca, [m[0], m[1], m[2], m[3]]),
            (cb, [m[4], m[5], m[6], m[7]]),
        )
    };
    let block = |x: &[u8], y: &[u8], (codes, masks): (__m512i, [u64; 4])| {
        // the scale 2 * (aux >> 28) + 1 in byte 8 ib
        let scales = _mm512_or_si512(
            _mm512_slli_epi64::<1>(_mm512_srli_epi64::<60>(ld512(x, 2))),
            _mm512_set1_epi64(1),
        );
        iq2_block(
            y,
            codes,
            |j| masks[j],
            |j| {
                let (a, b) = (16 * j, 16 * j + 8);
                scale_lanes::<true>(scales, [a, a, b, b])
            },
        )
    };
    0.125 * hsum_float_8(two_at_a_time(w, a, IQ2_XXS_BYTES, codes, block))
}

// IQ2_XS: per 8 values a u16 (9-bit grid index, 7 sign bits), then 8 scale bytes

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
fn dot_iq2_xs_imp(w: &[u8], a: &[u8]) -> f32 {
    let lo_plane = regs::<8>(&IQ2XS_PLANES[..512]);
    let hi_plane = regs::<8>(&IQ2XS_PLANES[512..]);
    let ks = ksigns();
    // row r of sub-block ib: u16 4 ib + r of `qs` (bytes 2..66); its low byte, then the high
    // byte whose bit 0 is the 9th index bit
    let idx_perm = byte_perm!(|p| {
        let (h, sb, r) = iq2_row_for_byte(p);
        (64 * h + 2 * (4 * sb + r)) as u8
    });
    let idx_hi_perm = byte_perm!(|p| {
        let (h, sb, r) = iq2_row_for_byte(p);
        (64 * h + 2 * (4 * sb + r) + 1) as u8
    });
    // the high bytes in value order (row 8j + k of block h at byte 32 h + 8j + k): the 7 sign
    // bits of a row are its high byte >> 1
    let sign_perm = byte_perm!(|p| (64 * (p / 32) + 2 * (p % 32) + 1) as u8);
    let mut mbuf = [0u64; 8];
    let codes = |xa: &[u8], xb: &[u8]| {
        let (qa, qb) = (ld512(xa, 2), ld512(xb, 2));
        let idx = _mm512_permutex2var_epi8(qa, idx_perm, qb);
        let hi = _mm512_permutex2var_epi8(qa, idx_hi_perm, qb);
        let k8 = _mm512_test_epi8_mask(hi, _mm512_set1_epi8(1));
        let (ca, cb) =
            codes_lookup::<4>(idx, &[_mm512_movepi8_mask(idx), k8], &lo_plane, &hi_plane);
        // the sign masks of the blocks' pairs, 64-bit lane 4 h + j for pair j of block h
        // (`vpermi2b` ignores the bit shifted in from the low byte)
        let s = _mm512_srli_epi16::<1>(_mm512_permutex2var_epi8(qa, sign_perm, qb));
        let m = spill(_mm512_permutex2var_epi8(ks[0], s, ks[1]), &mut mbuf);
        (
            (ca, [m[0], m[1], m[2], m[3]]),
            (cb, [m[4], m[5], m[6], m[7]]),
        )
    };
    let block = |x: &[u8], y: &[u8], (codes, masks): (__m512i, [u64; 4])| {
        let scales = nibble_scales(rd_u64(x, 66));
        iq2_block(
            y,
            codes,
            |j| masks[j],
            |j| scale_lanes::<true>(scales, [4 * j, 4 * j + 1, 4 * j + 2, 4 * j + 3]),
        )
    };
    0.125 * hsum_float_8(two_at_a_time(w, a, IQ2_XS_BYTES, codes, block))
}

// IQ2_S: 32 grid index low bytes, 32 sign bytes (one bit per value), `qh[8]` (two high index
// bits per row), 8 scale bytes

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
fn dot_iq2_s_imp(w: &[u8], a: &[u8]) -> f32 {
    let lo_plane = regs::<16>(&IQ2S_PLANES[..1024]);
    let hi_plane = regs::<16>(&IQ2S_PLANES[1024..]);
    // row r of sub-block ib: byte 4 ib + r of `qs` (bytes 2..34); index bits 8, 9 are bits
    // 2r, 2r + 1 of qh byte ib (the two blocks' qh side by side)
    let idx_perm = byte_perm!(|p| {
        let (h, sb, r) = iq2_row_for_byte(p);
        (64 * h + 4 * sb + r) as u8
    });
    let qh_perm = byte_perm!(|p| {
        let (h, sb, _) = iq2_row_for_byte(p);
        (8 * h + sb) as u8
    });
    let bit8 = byte_perm!(|p| 1 << (2 * iq2_row_for_byte(p).2));
    let bit9 = byte_perm!(|p| 2 << (2 * iq2_row_for_byte(p).2));
    let codes = |xa: &[u8], xb: &[u8]| {
        let idx = _mm512_permutex2var_epi8(ld512(xa, 2), idx_perm, ld512(xb, 2));
        let qh = _mm_set_epi64x(rd_u64(xb, 66) as i64, rd_u64(xa, 66) as i64);
        let qh = _mm512_permutexvar_epi8(qh_perm, _mm512_castsi128_si512(qh));
        let k8 = _mm512_test_epi8_mask(qh, bit8);
        let k9 = _mm512_test_epi8_mask(qh, bit9);
        codes_lookup::<8>(
            idx,
            &[_mm512_movepi8_mask(idx), k8, k9],
            &lo_plane,
            &hi_plane,
        )
    };
    let block = |x: &[u8], y: &[u8], codes: __m512i| {
        let scales = nibble_scales(rd_u64(x, 74));
        iq2_block(
            y,
            codes,
            |j| rd_u64(x, 34 + 8 * j),
            |j| scale_lanes::<true>(scales, [4 * j, 4 * j + 1, 4 * j + 2, 4 * j + 3]),
        )
    };
    0.125 * hsum_float_8(two_at_a_time(w, a, IQ2_S_BYTES, codes, block))
}

// ---------------------------------------------------------------------------------------------
// IQ3_XXS: 64 grid indices (bytes; two 4-value rows per 8 values), then per 32 one u32 of
// 4 x 7 sign bits + the 4-bit scale

/// For the 4-value books: `codes_lookup` order such that 64-bit lane q of the first (h = 0) or
/// second (h = 1) code register holds, in word slots 2r and 2r + 1, the two rows of output
/// lane q of sub-block pair j = 2h + r. Output lane q of a pair: rows 2(q % 4), 2(q % 4) + 1 of
/// its sub-block 2j + q / 4. Returns the row number (8 * sub-block + row) for index byte p.
const fn iq3_row_for_byte(p: usize) -> usize {
    let (l, h, m) = (p / 16, (p / 8) % 2, p % 8);
    let w = 8 * l + m;
    let (q, slot) = (w / 4, w % 4);
    let j = 2 * h + slot / 2;
    8 * (2 * j + q / 4) + 2 * (q % 4) + slot % 2
}

/// `vpmultishiftqb` controls of the 4-value books: pair j's two rows sit in word slots
/// 2 (j % 2) and 2 (j % 2) + 1; value i of a row at bits 3i.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn iq3_field_shifts() -> [__m512i; 2] {
    core::array::from_fn(|r| {
        let (a, b) = (32 * r as u8, 32 * r as u8 + 16);
        shifts([a, a + 3, a + 6, a + 9, b, b + 3, b + 6, b + 9])
    })
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
fn dot_iq3_xxs_imp(w: &[u8], a: &[u8]) -> f32 {
    let zero = _mm512_setzero_si512();
    let lo_plane = regs::<4>(&IQ3XXS_PLANES[..256]);
    let hi_plane = regs::<4>(&IQ3XXS_PLANES[256..]);
    let ks = ksigns();
    let idx_perm = byte_perm!(|p| iq3_row_for_byte(p) as u8);
    // the sign words are 32-bit lanes 0..8: pair j's two in 64-bit lane j
    let sign_shifts = shifts([0, 7, 14, 21, 32, 39, 46, 53]);
    let field_shifts = iq3_field_shifts();
    let values = ld512(&const { value_table(IQ3XXS_VALUES) }, 0);
    let mut sbuf = [0u64; 8];
    let mut accumf = _mm256_setzero_ps();
    for (x, y) in w
        .chunks_exact(IQ3_XXS_BYTES)
        .zip(a.chunks_exact(Q8_K_BYTES))
    {
        let d = h2f(x, 0) * rd_f32(y, 0);
        let idx = _mm512_permutexvar_epi8(idx_perm, ld512(x, 2));
        let codes = codes_lookup::<2>(idx, &[_mm512_movepi8_mask(idx)], &lo_plane, &hi_plane);
        let aux = _mm512_castsi256_si512(ld256(x, 66));
        // sign bytes of pair j in 64-bit lane j
        let s =
            _mm512_permutex2var_epi8(ks[0], _mm512_multishift_epi64_epi8(sign_shifts, aux), ks[1]);
        let signs = spill(s, &mut sbuf);
        // the scale 2 * (aux >> 28) + 1 in byte 4 ib
        let scales = _mm512_or_si512(
            _mm512_slli_epi32::<1>(_mm512_srli_epi32::<28>(aux)),
            _mm512_set1_epi32(1),
        );
        let mut acc = zero;
        for j in 0..4 {
            let q8 = ld512(y, 4 + 64 * j);
            let q8s = _mm512_mask_sub_epi8(q8, signs[j], zero, q8);
            let c = if j < 2 { codes.0 } else { codes.1 };
            let q3 = _mm512_permutexvar_epi8(
                _mm512_multishift_epi64_epi8(field_shifts[j % 2], c),
                values,
            );
            let dot = _mm512_maddubs_epi16(q3, q8s);
            let (a, b) = (8 * j, 8 * j + 4);
            acc = _mm512_dpwssd_epi32(acc, dot, scale_lanes::<true>(scales, [a, a, b, b]));
        }
        accumf = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(fold(acc)), accumf);
    }
    0.25 * hsum_float_8(accumf)
}

// ---------------------------------------------------------------------------------------------
// IQ3_S: 64 grid index low bytes, `qh[8]` (9th bits), `signs[32]` (one bit per value),
// `scales[4]` (4-bit, odd multipliers 2 s + 1)

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
fn dot_iq3_s_imp(w: &[u8], a: &[u8]) -> f32 {
    let zero = _mm512_setzero_si512();
    let lo_plane = regs::<8>(&IQ3S_PLANES[..512]);
    let hi_plane = regs::<8>(&IQ3S_PLANES[512..]);
    let idx_perm = byte_perm!(|p| iq3_row_for_byte(p) as u8);
    // the 9th index bit of the row at index byte p: bit (row % 8) of qh byte row / 8
    let qh_perm = byte_perm!(|p| (iq3_row_for_byte(p) / 8) as u8);
    let qh_bit = byte_perm!(|p| 1 << (iq3_row_for_byte(p) % 8));
    let field_shifts = iq3_field_shifts();
    let values = ld512(&const { value_table(IQ3S_VALUES) }, 0);
    let mut accumf = _mm256_setzero_ps();
    for (x, y) in w.chunks_exact(IQ3_S_BYTES).zip(a.chunks_exact(Q8_K_BYTES)) {
        let d = h2f(x, 0) * rd_f32(y, 0);
        let idx = _mm512_permutexvar_epi8(idx_perm, ld512(x, 2));
        let qh = _mm512_castsi128_si512(_mm_cvtsi64_si128(rd_u64(x, 66) as i64));
        let k8 = _mm512_test_epi8_mask(_mm512_permutexvar_epi8(qh_perm, qh), qh_bit);
        let codes = codes_lookup::<4>(idx, &[_mm512_movepi8_mask(idx), k8], &lo_plane, &hi_plane);
        // scales: nibble ib % 2 of byte ib / 2, as 2 s + 1 in byte ib
        let scales = nibble_scales(rd_u32(x, 106) as u64);
        let mut acc = zero;
        for j in 0..4 {
            let q8 = ld512(y, 4 + 64 * j);
            let m = rd_u64(x, 74 + 8 * j);
            let q8s = _mm512_mask_sub_epi8(q8, m, zero, q8);
            let c = if j < 2 { codes.0 } else { codes.1 };
            let q3 = _mm512_permutexvar_epi8(
                _mm512_multishift_epi64_epi8(field_shifts[j % 2], c),
                values,
            );
            let dot = _mm512_maddubs_epi16(q3, q8s);
            let (a, b) = (2 * j, 2 * j + 1);
            acc = _mm512_dpwssd_epi32(acc, dot, scale_lanes::<true>(scales, [a, a, b, b]));
        }
        accumf = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(fold(acc)), accumf);
    }
    hsum_float_8(accumf)
}

// ---------------------------------------------------------------------------------------------
// IQ1_S / IQ1_M: 11-bit indices into a book of 2048 rows of 8 values -1, 0, 1 (too large to
// keep in registers: its rows are loaded one by one, as ggml does)

/// The 8 rows whose indices (below 2048) are the u16 lanes of `idx`, row k in 64-bit lane k.
/// The indices are moved to general registers 4 at a time and split there (an empty `asm!`
/// hides the two words from LLVM, which would otherwise extract every index with a shuffle or
/// a load).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn iq1_rows(idx: __m128i) -> __m512i {
    let mut w = [
        _mm_cvtsi128_si64(idx) as u64,
        _mm_extract_epi64::<1>(idx) as u64,
    ];
    for v in &mut w {
        // SAFETY: an empty `asm!` that takes and returns one register.
        unsafe {
            asm!(
                "/* {0} */",
                inout(reg) * v,
                options(pure, nomem, nostack, preserves_flags)
            )
        };
    }
    let i = |k: usize| (w[k / 4] >> (16 * (k % 4))) as u16 as usize;
    let quad = |k: usize| {
        let v: __m256i;
        // SAFETY: the callers form the indices as a byte plus 3 bits times 256, so they are
        // below 2048, the length of the book: the loads read rows of `IQ1S_GRID`.
        unsafe {
            asm!(
                "vpbroadcastq {v}, qword ptr [{t} + 8 * {i0}]",
                "vpbroadcastq {v} {{{k1}}}, qword ptr [{t} + 8 * {i1}]",
                "vpbroadcastq {v} {{{k2}}}, qword ptr [{t} + 8 * {i2}]",
                "vpbroadcastq {v} {{{k3}}}, qword ptr [{t} + 8 * {i3}]",
                v = out(ymm_reg) v,
                t = in(reg) IQ1S_GRID.as_ptr(),
                i0 = in(reg) i(k),
                i1 = in(reg) i(k + 1),
                i2 = in(reg) i(k + 2),
                i3 = in(reg) i(k + 3),
                k1 = in(kreg) 2u8,
                k2 = in(kreg) 4u8,
                k3 = in(kreg) 8u8,
                options(pure, readonly, nostack, preserves_flags),
            );
        }
        v
    };
    join(quad(0), quad(4))
}

/// 128-bit lane `j` of `v`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn lane128(v: __m512i, j: usize) -> __m128i {
    match j {
        0 => _mm512_castsi512_si128(v),
        1 => _mm512_extracti32x4_epi32::<1>(v),
        2 => _mm512_extracti32x4_epi32::<2>(v),
        _ => _mm512_extracti32x4_epi32::<3>(v),
    }
}

/// `acc` plus, per 32-bit lane, the sum over its 4 values of `s * g * q` for grid values `g`
/// (-1, 0, 1) and the scale bytes `s` (at most 15): `vpdpbusd` of `s * |g|` (a byte) with `q`
/// under g's sign, which is ggml's `vpmaddubsw(|g|, sign(q, g))` times the scale, exactly.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn iq1_dot(acc: __m512i, g: __m512i, s: __m512i, q: __m512i) -> __m512i {
    let qs = _mm512_mask_sub_epi8(q, _mm512_movepi8_mask(g), _mm512_setzero_si512(), q);
    let sg = _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(g, g), s);
    _mm512_dpbusd_epi32(acc, sg, qs)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
fn dot_iq1_s_imp(w: &[u8], a: &[u8]) -> f32 {
    let zero = _mm512_setzero_si512();
    // row r = 4 ib + l: qh word ib shifted right by 3 l
    let qh_perm = _mm512_set_epi16(
        7, 7, 7, 7, 6, 6, 6, 6, 5, 5, 5, 5, 4, 4, 4, 4, 3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0,
        0, 0,
    );
    let qh_shift = _mm512_set4_epi32(9 << 16 | 6, 3 << 16, 9 << 16 | 6, 3 << 16);
    let mut accum = _mm256_setzero_ps();
    let mut accum1 = 0f32;
    for (x, y) in w.chunks_exact(IQ1_S_BYTES).zip(a.chunks_exact(Q8_K_BYTES)) {
        let qh = _mm512_castsi128_si512(ld128(x, 34));
        let hi = _mm512_srlv_epi16(_mm512_permutexvar_epi16(qh_perm, qh), qh_shift);
        let qs = _mm512_cvtepu8_epi16(ld256(x, 2));
        let idx = _mm512_or_si512(
            qs,
            _mm512_slli_epi16::<8>(_mm512_and_si512(hi, _mm512_set1_epi16(7))),
        );
        // the scale 2 ((qh >> 12) & 7) + 1 in the 4 bytes of 32-bit lane ib (for `iq1_dot`)
        let sc = _mm512_cvtepu16_epi32(_mm512_castsi512_si256(qh));
        let sc = _mm512_and_si512(_mm512_srli_epi32::<11>(sc), _mm512_set1_epi32(14));
        let scales = _mm512_or_si512(sc, _mm512_set1_epi32(1));
        let mut acc = zero;
        for j in 0..4 {
            let q8 = ld512(y, 4 + 64 * j);
            let (a, b) = (8 * j, 8 * j + 4);
            let sc = scale_lanes::<false>(scales, [a, a, b, b]);
            acc = iq1_dot(acc, iq1_rows(lane128(idx, j)), sc, q8);
        }
        // the delta term: sum over ib of (bsums[2 ib] + bsums[2 ib + 1]) * ls * (-1 where qh
        // bit 15 is set), an exact integer sum
        let qh8 = _mm512_castsi512_si128(qh);
        let ls = _mm_or_si128(
            _mm_and_si128(_mm_srli_epi16::<11>(qh8), _mm_set1_epi16(14)),
            _mm_set1_epi16(1),
        );
        let neg = _mm_srai_epi16::<15>(qh8);
        let ls = _mm_sub_epi16(_mm_xor_si128(ls, neg), neg);
        let ls = _mm256_set_m128i(_mm_unpackhi_epi16(ls, ls), _mm_unpacklo_epi16(ls, ls));
        let p = _mm256_madd_epi16(ld256(y, 260), ls);
        let p = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256::<1>(p));
        let p = _mm_add_epi32(p, _mm_unpackhi_epi64(p, p));
        let sumi1 = _mm_cvtsi128_si32(_mm_add_epi32(p, _mm_srli_epi64::<32>(p)));
        let d = rd_f32(y, 0) * h2f(x, 0);
        accum = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(fold(acc)), accum);
        // GCC contracts `accum1 += d * sumi1`
        accum1 = d.mul_add(sumi1 as f32, accum1);
    }
    hsum_float_8(accum) + IQ1_DELTA * accum1
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
fn dot_iq1_m_imp(w: &[u8], a: &[u8]) -> f32 {
    let zero = _mm512_setzero_si512();
    // the 3-bit scale of (sub-block ib, half h) at bit 16 (ib / 2) + 6 (ib % 2) + 3 h of the
    // scale words, in byte 2 ib + h
    let scale_shifts = _mm_set_epi64x(
        i64::from_le_bytes([32, 35, 38, 41, 48, 51, 54, 57]),
        i64::from_le_bytes([0, 3, 6, 9, 16, 19, 22, 25]),
    );
    // the delta sign of row r: bit 3 + 4 (r % 2) of qh byte r / 2
    let delta_bits = _mm256_set1_epi16(0x8008_u16 as i16);
    let mut dbuf = [0u64; 8];
    // pair j: scale byte 4 j + L in 128-bit lane L
    let scale_perm: [__m512i; 4] = core::array::from_fn(|j| {
        let b = |l: usize| (4 * j + l) as i32 * 0x0101_0101;
        _mm512_set_epi32(
            b(3),
            b(3),
            b(3),
            b(3),
            b(2),
            b(2),
            b(2),
            b(2),
            b(1),
            b(1),
            b(1),
            b(1),
            b(0),
            b(0),
            b(0),
            b(0),
        )
    });
    let mut accum1 = _mm256_setzero_ps();
    let mut accum2 = _mm256_setzero_ps();
    for (x, y) in w.chunks_exact(IQ1_M_BYTES).zip(a.chunks_exact(Q8_K_BYTES)) {
        // row r = 4 ib + l: index bits 8..11 in the low 3 bits of nibble r % 2 of qh byte r / 2
        let qh = ld128(x, 32);
        let m7 = _mm_set1_epi8(7);
        let lo = _mm_and_si128(qh, m7);
        let hi = _mm_and_si128(_mm_srli_epi16::<4>(qh), m7);
        let nib = _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
        let idx = _mm512_or_si512(
            _mm512_cvtepu8_epi16(ld256(x, 0)),
            _mm512_slli_epi16::<8>(_mm512_cvtepu8_epi16(nib)),
        );
        // delta signs: byte r 0xff where row r's delta is negative (so 64-bit lane j is the
        // element mask of pair j)
        let qh2 = _mm256_set_m128i(_mm_unpackhi_epi8(qh, qh), _mm_unpacklo_epi8(qh, qh));
        let neg = _mm256_movm_epi8(_mm256_test_epi8_mask(qh2, delta_bits));
        let deltas = spill(_mm512_castsi256_si512(neg), &mut dbuf);
        // scales 2 s + 1 in byte 2 ib + h
        let sc = _mm_multishift_epi64_epi8(scale_shifts, _mm_set1_epi64x(rd_u64(x, 48) as i64));
        let sc = _mm_or_si128(_mm_slli_epi16::<1>(_mm_and_si128(sc, m7)), _mm_set1_epi8(1));
        let sc = _mm512_castsi128_si512(sc);
        let mut acc1 = zero;
        let mut acc2 = zero;
        for j in 0..4 {
            let q8 = ld512(y, 4 + 64 * j);
            let sc = _mm512_permutexvar_epi8(scale_perm[j], sc);
            acc1 = iq1_dot(acc1, iq1_rows(lane128(idx, j)), sc, q8);
            let q8d = _mm512_mask_sub_epi8(q8, deltas[j], zero, q8);
            acc2 = _mm512_dpbusd_epi32(acc2, sc, q8d);
        }
        let d = _mm256_set1_ps(rd_f32(y, 0) * fp16_to_f32(iq1m_scale_bits(x)));
        accum1 = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(fold(acc1)), accum1);
        accum2 = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(fold(acc2)), accum2);
    }
    // GCC contracts `hsum1 + IQ1M_DELTA * hsum2`
    hsum_float_8(accum2).mul_add(IQ1_DELTA, hsum_float_8(accum1))
}
