//! BF16 x BF16 dot products in the orders of ggml built for CPUs with AVX512_BF16 (the machine
//! that made the golden logits, and the ones moxie runs on), where every product goes through
//! `VDPBF16PS`:
//!
//! * one instruction lane ([`dpbf16_lane`]): `acc + w[1]*a[1]`, rounded to f32, then
//!   `+ w[0]*a[0]`, rounded, each sum of the exact product; denormal inputs (`acc` too) and
//!   results are flushed to zero. Emulated here bit for bit (checked against the instruction
//!   by the tests below where the CPU has it) so that CPUs without it give the same numbers;
//! * `ggml_vec_dot_bf16` (decode): two 16-lane accumulators over 64-element steps (the first
//!   32 elements into one, the next 32 into the other), each `_mm512_reduce_add_ps`-ed and
//!   added in f64, then the leftover `n % 64` products (f32) added in f64;
//! * llamafile tinyBLAS `<32, __m512, __m512bh>` (prompt batches): one 16-lane accumulator over
//!   32-element steps, `_mm512_reduce_add_ps` at the end; taken when `n % 32 == 0`.
//!
//! Where the CPU has AVX512_BF16 the chains run on the instruction itself
//! (`simd/x86_avx512.rs`), two 32-value multiply-adds per lane and cycle instead of a widening
//! multiply and an add.

use crate::f16::bf16_to_f32;
use crate::tinyblas::reduce_add_16;

/// A bf16 value as the instruction reads it: denormals are zero.
#[inline]
fn daz(x: f32) -> f32 {
    if x.is_subnormal() {
        0f32.copysign(x)
    } else {
        x
    }
}

/// `acc + w * a` with one rounding (the product of two bf16 is exact in f64, and so is the
/// sum while the exponents are within 37 of each other; beyond that the smaller term cannot
/// change the f32 rounding), the result flushed to zero if denormal.
#[inline]
fn add_product(acc: f32, w: f32, a: f32) -> f32 {
    daz((acc as f64 + w as f64 * a as f64) as f32)
}

/// One lane of `VDPBF16PS`: `acc` plus the products of the bf16 pairs `w` and `a`.
#[inline]
pub(crate) fn dpbf16_lane(acc: f32, w: [u16; 2], a: [u16; 2]) -> f32 {
    let w = [daz(bf16_to_f32(w[0])), daz(bf16_to_f32(w[1]))];
    let a = [daz(bf16_to_f32(a[0])), daz(bf16_to_f32(a[1]))];
    add_product(add_product(daz(acc), w[1], a[1]), w[0], a[0])
}

#[inline]
fn bf16_at(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[2 * i], b[2 * i + 1]])
}

/// `VDPBF16PS` on 32 bf16 of `w` and `a` starting at element `at`, into `acc`.
#[inline]
pub(crate) fn dpbf16_step(acc: &mut [f32; 16], w: &[u8], a: &[u8], at: usize) {
    for (l, c) in acc.iter_mut().enumerate() {
        let i = at + 2 * l;
        *c = dpbf16_lane(
            *c,
            [bf16_at(w, i), bf16_at(w, i + 1)],
            [bf16_at(a, i), bf16_at(a, i + 1)],
        );
    }
}

/// `ggml_vec_dot_bf16` of an AVX512_BF16 build, emulated: see the module docs.
pub(crate) fn vec_dot_emulated(n: usize, w: &[u8], a: &[u8]) -> f32 {
    assert!(w.len() >= 2 * n && a.len() >= 2 * n);
    let np = n & !63;
    let (mut c1, mut c2) = ([0f32; 16], [0f32; 16]);
    for i in (0..np).step_by(64) {
        dpbf16_step(&mut c1, w, a, i);
        dpbf16_step(&mut c2, w, a, i + 32);
    }
    vec_dot_finish(n, np, w, a, &c1, &c2)
}

/// The end of `ggml_vec_dot_bf16` after its chains over the first `np` elements.
pub(crate) fn vec_dot_finish(
    n: usize,
    np: usize,
    w: &[u8],
    a: &[u8],
    c1: &[f32; 16],
    c2: &[f32; 16],
) -> f32 {
    let mut sumf = reduce_add_16(c1) as f64;
    sumf += reduce_add_16(c2) as f64;
    for i in np..n {
        sumf += (bf16_to_f32(bf16_at(w, i)) * bf16_to_f32(bf16_at(a, i))) as f64;
    }
    sumf as f32
}

/// tinyBLAS's BF16 dot (`n % 32 == 0`), emulated: see the module docs.
pub(crate) fn tinyblas_emulated(n: usize, w: &[u8], a: &[u8]) -> f32 {
    assert!(w.len() >= 2 * n && a.len() >= 2 * n && n.is_multiple_of(32));
    let mut acc = [0f32; 16];
    for i in (0..n).step_by(32) {
        dpbf16_step(&mut acc, w, a, i);
    }
    reduce_add_16(&acc)
}

/// `ggml_vec_dot_bf16` in the order of an AVX512_BF16 build (the type table's AVX-512
/// column): on the instruction where the CPU has it, else emulated (same bits).
pub(crate) fn vec_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx512_bf16() {
        return crate::simd::x86_avx512::dot_bf16(n, w, a);
    }
    vec_dot_emulated(n, w, a)
}

/// tinyBLAS's BF16 dot of one weight row and one activation row (`n % 32 == 0`).
pub(crate) fn tinyblas_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx512_bf16() {
        return crate::simd::x86_avx512::tinyblas_bf16(n, w, a);
    }
    tinyblas_emulated(n, w, a)
}

/// [`tinyblas_dot`] of one weight row against `out.len()` activation rows `stride` bytes
/// apart; on the instruction, four activation rows share each load of the weights.
pub(crate) fn tinyblas_many(n: usize, w: &[u8], acts: &[u8], stride: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx512_bf16() {
        return crate::simd::x86_avx512::tinyblas_bf16_many(n, w, acts, stride, out);
    }
    for (t, o) in out.iter_mut().enumerate() {
        *o = tinyblas_emulated(n, w, &acts[t * stride..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::f16::f32_to_bf16;

    fn xorshift(s: &mut u64) -> u64 {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        *s
    }

    /// Random bf16 near 1 with occasional denormals and zeros, as raw bytes.
    fn random_bf16(s: &mut u64, n: usize) -> Vec<u8> {
        (0..n)
            .flat_map(|_| {
                let r = xorshift(s);
                let exp = if r.is_multiple_of(50) {
                    (r >> 8) % 3
                } else {
                    117 + (r >> 8) % 20
                };
                let h = ((r >> 20) & 1) << 15 | exp << 7 | (r >> 24) & 127;
                (h as u16).to_le_bytes()
            })
            .collect()
    }

    #[test]
    fn lane_rounds_after_each_product_odd_first() {
        // 1 + 2^-24 is not an f32: `acc + p1` rounds to 1 before `p0` is added, while a
        // single rounding of the exact sum (or the even product first) would differ.
        let one = f32_to_bf16(1.0);
        let tiny = f32_to_bf16(2f32.powi(-12)); // tiny * tiny = 2^-24, half an ulp of 1
        let r = dpbf16_lane(1.0, [tiny, tiny], [tiny, tiny]);
        assert_eq!(r, 1.0);
        let r = dpbf16_lane(0.0, [one, tiny], [one, tiny]);
        assert_eq!(r, 1.0);
        // denormal accumulator and inputs are zero
        assert_eq!(dpbf16_lane(f32::from_bits(1), [0, 0], [0, 0]), 0.0);
        assert_eq!(dpbf16_lane(1.0, [1, 0], [0x7f00, 0]), 1.0);
    }

    #[test]
    fn emulation_equals_the_instruction() {
        #[cfg(target_arch = "x86_64")]
        if crate::simd::has_avx512_bf16() {
            let mut s = 0x9e3779b97f4a7c15u64;
            for n in [32, 64, 96, 128, 200, 256, 1000, 4096] {
                for _ in 0..20 {
                    let w = random_bf16(&mut s, n);
                    let a = random_bf16(&mut s, n);
                    let hw = crate::simd::x86_avx512::dot_bf16(n, &w, &a);
                    assert_eq!(hw.to_bits(), vec_dot_emulated(n, &w, &a).to_bits(), "n {n}");
                    if n.is_multiple_of(32) {
                        let hw = crate::simd::x86_avx512::tinyblas_bf16(n, &w, &a);
                        assert_eq!(hw.to_bits(), tinyblas_emulated(n, &w, &a).to_bits());
                    }
                }
            }
            // many rows: same as one at a time
            let n = 256;
            let w = random_bf16(&mut s, n);
            let acts = random_bf16(&mut s, n * 7);
            let mut out = [0f32; 7];
            tinyblas_many(n, &w, &acts, 2 * n, &mut out);
            for (t, o) in out.iter().enumerate() {
                assert_eq!(
                    o.to_bits(),
                    tinyblas_emulated(n, &w, &acts[2 * n * t..]).to_bits()
                );
            }
        } else {
            eprintln!("no AVX512_BF16 on this CPU: the emulation is not compared");
        }
    }

    #[test]
    fn orders_are_close_to_the_f64_dot() {
        let mut s = 7u64;
        for n in [64, 256, 4096] {
            let w = random_bf16(&mut s, n);
            let a = random_bf16(&mut s, n);
            let exact: f64 = (0..n)
                .map(|i| bf16_to_f32(bf16_at(&w, i)) as f64 * bf16_to_f32(bf16_at(&a, i)) as f64)
                .sum();
            let mag: f64 = (0..n)
                .map(|i| (bf16_to_f32(bf16_at(&w, i)) * bf16_to_f32(bf16_at(&a, i))).abs() as f64)
                .sum();
            for got in [vec_dot(n, &w, &a), tinyblas_dot(n, &w, &a)] {
                assert!(
                    (got as f64 - exact).abs() <= 1e-5 * mag + 1e-30,
                    "{got} {exact}"
                );
            }
        }
    }
}
