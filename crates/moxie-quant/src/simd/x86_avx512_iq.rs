//! AVX-512 dot products of ggml's code-book types with Q8_K activations, bit-identical to the
//! AVX2 ports (`x86_avx2.rs`, `x86_avx2_iq1_iq3s.rs`) and so to ggml's x86 build.
//!
//! What has to match: ggml's AVX2 kernels form, per super-block, 8 int32 lanes (lane k of a
//! 32-element sub-block holds the products of its elements 4k..4k+3 times the sub-block's scale,
//! summed over the sub-blocks), convert them to float and accumulate them with one FMA per
//! block, then `hsum_float_8`. Integer sums are exact (nothing saturates: grid magnitudes are at
//! most 62, so `vpmaddubsw` pairs stay below 2^14), so any way of forming the same lane sums
//! gives the same bits. Here one 512-bit register holds two sub-blocks (the low half the even,
//! the high half the odd one), lanes are formed with `vpmaddubsw` + `vpdpwssd` (scale), and the
//! two halves are added before the conversion. Signs are applied to the activations with
//! `vpsubb` under a k-mask (`0 - q` wraps for -128 exactly as `vpsignb` does).
//!
//! The work that dominates ggml's kernels is fetching code-book rows one by one. Here the code
//! books are compressed (2 bits per value for the 3-level IQ2 books, 3 bits for the 8-level IQ3
//! books: 16 bits per row) and kept as two byte planes (low and high byte of each row's code)
//! in registers; 64 rows are looked up at once with `vpermi2b` (128 entries per instruction,
//! blended by the index's high bits) and expanded to bytes with `vpmultishiftqb` (each output
//! byte takes its field from the row's code) and `vpermb` (field -> magnitude). The 7-bit sign
//! fields of IQ2_XXS / IQ2_XS / IQ3_XXS become sign bytes with `vpmultishiftqb` + `vpermi2b`
//! over ggml's `ksigns_iq2xs`. These need AVX512_VBMI, detected at run time
//! ([`super::has_avx512_vbmi`]); without it the entry points run the AVX2 kernels (same bits).
//!
//! Zen 4 (where this was tuned) runs 512-bit shuffles at one per cycle, and those are the
//! bottleneck: scale vectors are therefore built from two broadcast loads (inline `asm!`, as
//! LLVM turns the obvious intrinsics back into a permute), and sign masks go through memory.
//!
//! Verified by: `tests/simd_props.rs` (AVX-512 == AVX2 bit for bit, and both against the scalar
//! reference, on random raw blocks) and `tests/ggml_golden.rs` (bit-exact against ggml).
//!
//! Every `unsafe` block is an unaligned load/store through a pointer derived from a slice or
//! array of sufficient length, an `asm!` broadcast load from such an array, or a call of a
//! `#[target_feature]` kernel after run-time detection.

use core::arch::asm;
use core::arch::x86_64::*;

use super::x86_avx2::{h2f, hsum_float_8, ld256};
use crate::common::{rd_f32, rd_u32};
use crate::iq2_3::{IQ2_XXS_BYTES, IQ3_XXS_BYTES};
use crate::iq3s::IQ3_S_BYTES;
use crate::iq_grids::{IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS};
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
    super::x86_avx2::dot_iq2_xxs,
    IQ2_XXS_BYTES
);
entry!(
    dot_iq3_xxs,
    dot_iq3_xxs_imp,
    super::x86_avx2::dot_iq3_xxs,
    IQ3_XXS_BYTES
);
entry!(
    dot_iq3_s,
    dot_iq3_s_imp,
    super::x86_avx2_iq1_iq3s::dot_iq3_s,
    IQ3_S_BYTES
);

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
static IQ3XXS_PLANES: [u8; 512] = planes(codes3(&IQ3XXS_GRID, IQ3XXS_VALUES));
static IQ3S_PLANES: [u8; 1024] = planes(codes3(&IQ3S_GRID, IQ3S_VALUES));

// ---------------------------------------------------------------------------------------------
// helpers

/// Little-endian u64 at byte offset `off`.
#[inline(always)]
fn rd_u64(s: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(s[off..off + 8].try_into().unwrap())
}

/// Unaligned 64-byte load.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn ld512(s: &[u8], off: usize) -> __m512i {
    let s: &[u8; 64] = s[off..off + 64].try_into().unwrap();
    // SAFETY: `s` is exactly 64 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm512_loadu_si512(s.as_ptr().cast()) }
}

/// The `R` consecutive 64-byte registers of `t`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn regs<const R: usize>(t: &[u8]) -> [__m512i; R] {
    core::array::from_fn(|r| ld512(t, 64 * r))
}

/// Low 256 bits + high 256 bits (i32 lanes): the 8 lanes of ggml's AVX2 kernels.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn fold(v: __m512i) -> __m256i {
    _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v))
}

/// Stores `v` in `buf` and returns the array behind an optimization barrier, so that reads of
/// single elements are loads (LLVM would otherwise extract them from `v` with shuffles).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn spill(v: __m512i, buf: &mut [u32; 16]) -> &[u32; 16] {
    // SAFETY: `buf` is 64 writable bytes; `storeu` has no alignment requirement. The empty
    // `asm!` only names the buffer's address: to LLVM it may read and write the buffer, so
    // the store stays and later reads load from memory.
    unsafe {
        _mm512_storeu_si512(buf.as_mut_ptr().cast(), v);
        asm!("/* {0} */", in(reg) buf.as_mut_ptr(), options(nostack, preserves_flags));
    }
    buf
}

/// i32 lanes 0..8 all `lo`, lanes 8..16 all `hi`, from two broadcast loads (no shuffle).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn halves(lo: &u32, hi: &u32) -> __m512i {
    let v: __m512i;
    let k: __mmask16 = 0xff00;
    // SAFETY: reads the two `u32`s behind the references; writes only the output registers.
    unsafe {
        asm!(
            "vpbroadcastd {v}, dword ptr [{lo}]",
            "vpbroadcastd {v} {{{k}}}, dword ptr [{hi}]",
            v = out(zmm_reg) v,
            lo = in(reg) lo as *const u32,
            hi = in(reg) hi as *const u32,
            k = in(kreg) k,
            options(pure, readonly, nostack, preserves_flags),
        );
    }
    v
}

/// The 64-bit sign mask of sub-blocks `2j`, `2j + 1` from `s`, where the low 32 bits of 64-bit
/// lane `ib` hold sub-block `ib`'s.
#[inline(always)]
fn pair_mask(s: &[u32; 16], j: usize) -> u64 {
    s[4 * j] as u64 | (s[4 * j + 2] as u64) << 32
}

/// One byte plane of a code book of `2 * Q` registers (128 rows each) at the 64 byte indices
/// `idx`, whose 9th, 10th... index bits are `hi[0]`, `hi[1]`... (bit 8 of a byte: its bit 7).
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
// IQ2_XXS: 4 x u64 per 32: 4 grid indices (bytes), then 4 x 7 sign bits + the 4-bit scale

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
fn dot_iq2_xxs_imp(w: &[u8], a: &[u8]) -> f32 {
    let zero = _mm512_setzero_si512();
    let lo_plane = regs::<4>(&IQ2XXS_PLANES[..256]);
    let hi_plane = regs::<4>(&IQ2XXS_PLANES[256..]);
    let ks = ksigns();
    // Word 4q + s of the codes is the row of output 64-bit lane q of sub-block pair s: byte
    // 8 * (2s + q / 4) + q % 4 of `qs`; by `codes_lookup`'s order, word w comes from index
    // byte 16 (w / 8) + w % 8. (The other 32 index bytes are not used.)
    let idx_perm = byte_perm!(|p| {
        let w = (p / 16) * 8 + p % 8;
        let (q, s) = (w / 4, w % 4);
        (8 * (2 * s + q / 4) + q % 4) as u8
    });
    let sign_shifts = shifts([32, 39, 46, 53, 32, 39, 46, 53]);
    let field_shifts: [__m512i; 4] = core::array::from_fn(|s| {
        let o = 16 * s as u8;
        shifts([o, o + 2, o + 4, o + 6, o + 8, o + 10, o + 12, o + 14])
    });
    let values = ld512(&const { value_table(IQ2_VALUES) }, 0);
    let (mut sbuf, mut cbuf) = ([0u32; 16], [0u32; 16]);
    let mut accumf = _mm256_setzero_ps();
    for (x, y) in w
        .chunks_exact(IQ2_XXS_BYTES)
        .zip(a.chunks_exact(Q8_K_BYTES))
    {
        let d = h2f(x, 0) * rd_f32(y, 0);
        let qs = ld512(x, 2);
        let idx = _mm512_permutexvar_epi8(idx_perm, qs);
        let (codes, _) = codes_lookup::<2>(idx, &[_mm512_movepi8_mask(idx)], &lo_plane, &hi_plane);
        // sign bytes of sub-block ib in the low 32 bits of 64-bit lane ib
        let s =
            _mm512_permutex2var_epi8(ks[0], _mm512_multishift_epi64_epi8(sign_shifts, qs), ks[1]);
        let signs = spill(s, &mut sbuf);
        // the scale 2 * (aux >> 28) + 1 twice (i16) in the low 32 bits of 64-bit lane ib
        let sc = _mm512_or_si512(
            _mm512_slli_epi64::<1>(_mm512_srli_epi64::<60>(qs)),
            _mm512_set1_epi64(1),
        );
        let scales = spill(_mm512_or_si512(sc, _mm512_slli_epi64::<16>(sc)), &mut cbuf);
        let mut acc = zero;
        for j in 0..4 {
            let q8 = ld512(y, 4 + 64 * j);
            let q8s = _mm512_mask_sub_epi8(q8, pair_mask(signs, j), zero, q8);
            let fields = _mm512_multishift_epi64_epi8(field_shifts[j], codes);
            let q2 = _mm512_permutexvar_epi8(fields, values);
            let dot = _mm512_maddubs_epi16(q2, q8s);
            acc = _mm512_dpwssd_epi32(acc, dot, halves(&scales[4 * j], &scales[4 * j + 2]));
        }
        accumf = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(fold(acc)), accumf);
    }
    0.125 * hsum_float_8(accumf)
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
    let (mut sbuf, mut cbuf) = ([0u32; 16], [0u32; 16]);
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
        // the scale 2 * (aux >> 28) + 1 twice (i16) in 32-bit lane ib
        let sc = _mm512_or_si512(
            _mm512_slli_epi32::<1>(_mm512_srli_epi32::<28>(aux)),
            _mm512_set1_epi32(1),
        );
        let scales = spill(_mm512_or_si512(sc, _mm512_slli_epi32::<16>(sc)), &mut cbuf);
        let mut acc = zero;
        for j in 0..4 {
            let q8 = ld512(y, 4 + 64 * j);
            let m = signs[2 * j] as u64 | (signs[2 * j + 1] as u64) << 32;
            let q8s = _mm512_mask_sub_epi8(q8, m, zero, q8);
            let c = if j < 2 { codes.0 } else { codes.1 };
            let q3 = _mm512_permutexvar_epi8(
                _mm512_multishift_epi64_epi8(field_shifts[j % 2], c),
                values,
            );
            let dot = _mm512_maddubs_epi16(q3, q8s);
            acc = _mm512_dpwssd_epi32(acc, dot, halves(&scales[2 * j], &scales[2 * j + 1]));
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
    let nibble_shift = _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4);
    let mut cbuf = [0u32; 16];
    let mut accumf = _mm256_setzero_ps();
    for (x, y) in w.chunks_exact(IQ3_S_BYTES).zip(a.chunks_exact(Q8_K_BYTES)) {
        let d = h2f(x, 0) * rd_f32(y, 0);
        let idx = _mm512_permutexvar_epi8(idx_perm, ld512(x, 2));
        let qh = _mm512_castsi128_si512(_mm_cvtsi64_si128(rd_u64(x, 66) as i64));
        let k8 = _mm512_test_epi8_mask(_mm512_permutexvar_epi8(qh_perm, qh), qh_bit);
        let codes = codes_lookup::<4>(idx, &[_mm512_movepi8_mask(idx), k8], &lo_plane, &hi_plane);
        // scales: byte ib / 2, nibble ib % 2, as 2 s + 1 twice (i16) in 32-bit lane ib
        let b = _mm_cvtsi32_si128(rd_u32(x, 106) as i32);
        let b = _mm256_cvtepu8_epi32(_mm_unpacklo_epi8(b, b));
        let nib = _mm256_and_si256(_mm256_srlv_epi32(b, nibble_shift), _mm256_set1_epi32(0xf));
        let sc = _mm256_or_si256(_mm256_slli_epi32::<1>(nib), _mm256_set1_epi32(1));
        let sc = _mm256_or_si256(sc, _mm256_slli_epi32::<16>(sc));
        let scales = spill(_mm512_castsi256_si512(sc), &mut cbuf);
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
            acc = _mm512_dpwssd_epi32(acc, dot, halves(&scales[2 * j], &scales[2 * j + 1]));
        }
        accumf = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(fold(acc)), accumf);
    }
    hsum_float_8(accumf)
}
