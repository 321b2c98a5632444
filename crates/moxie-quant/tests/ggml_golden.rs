//! Bit-exact comparison with vectors produced by ggml's own C code (see `data/gen_golden.c`):
//! `ggml-quants.c` built as ggml-base is (`-O2`, no `-march`), `ggml-cpu/quants.c` and
//! `ggml-cpu/arch/x86/quants.c` built with `-O3 -march=native` on the AVX-512 machine that made
//! the golden logits.
//!
//! Per weight type the file holds: random raw weight blocks (finite scales), random activations
//! `x`, ggml's x86 activation quantization of `x`, ggml's `dequantize_row` of the raw blocks,
//! ggml's x86 and generic `vec_dot` of (raw blocks, quantized activations), and llama-quantize's
//! quantization (`quantize_<type>` without imatrix) of `x` where the type has one without an
//! importance matrix (not the IQ1/IQ2/IQ3 code-book types); likewise for F32/F16/BF16 with
//! ggml-cpu's `ggml_vec_dot_f32/f16/bf16` (vec.cpp) as the x86 dot.

use moxie_quant::*;

struct Case {
    ty: GgmlType,
    /// The x86 dot was computed by ggml's vec.cpp built for AVX2 only (F32/F16 sections).
    avx2_build: bool,
    n: usize,
    w: Vec<u8>,
    x: Vec<f32>,
    act: Vec<u8>,
    dq: Vec<f32>,
    dot_x86: f32,
    dot_generic: f32,
    /// llama-quantize's weights, for types it quantizes without an importance matrix.
    wq: Option<Vec<u8>>,
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn cases() -> Vec<Case> {
    let data: &[u8] = include_bytes!("data/ggml_golden.bin");
    let mut p = 0usize;
    fn take<'a>(data: &'a [u8], p: &mut usize, k: usize) -> &'a [u8] {
        let s = &data[*p..*p + k];
        *p += k;
        s
    }
    let mut out = vec![];
    while p < data.len() {
        let mut take = |k: usize| take(data, &mut p, k);
        let hdr = take(8);
        let idv = u32::from_le_bytes(hdr[0..4].try_into().unwrap());
        let ty = GgmlType::from_id(idv & 0xff).unwrap();
        let n = u32::from_le_bytes(hdr[4..8].try_into().unwrap()) as usize;
        let at = vec_dot_type(ty).unwrap();
        let wb = ty.row_bytes(n as u64).unwrap() as usize;
        let ab = at.row_bytes(n as u64).unwrap() as usize;
        let w = take(wb).to_vec();
        let x = f32s(take(4 * n));
        let act = take(ab).to_vec();
        let dq = f32s(take(4 * n));
        let dots = f32s(take(8));
        let wq = (idv & 0x200 == 0).then(|| take(wb).to_vec());
        out.push(Case {
            ty,
            avx2_build: idv & 0x100 != 0,
            n,
            w,
            x,
            act,
            dq,
            dot_x86: dots[0],
            dot_generic: dots[1],
            wq,
        });
    }
    assert_eq!(out.len(), 32 + 13 + 6);
    assert_eq!(out.iter().filter(|c| c.wq.is_none()).count(), 14);
    out
}

#[test]
fn dequantize_is_bit_exact() {
    for c in cases() {
        let mut out = vec![0f32; c.n];
        dequantize_row(c.ty, &c.w, &mut out).unwrap();
        for (i, (o, e)) in out.iter().zip(&c.dq).enumerate() {
            assert_eq!(o.to_bits(), e.to_bits(), "{} element {i}", c.ty);
        }
    }
}

#[test]
fn activation_quantization_is_bit_exact() {
    for c in cases() {
        let at = vec_dot_type(c.ty).unwrap();
        let mut out = vec![0u8; c.act.len()];
        quantize_row(at, &c.x, &mut out).unwrap();
        assert_eq!(out, c.act, "{} activations ({at})", c.ty);
        let mut out2 = vec![0u8; c.act.len()];
        scalar::quantize_fn(at).unwrap()(&c.x, &mut out2);
        assert_eq!(out2, c.act, "{} activations ({at}), scalar", c.ty);
    }
}

#[test]
fn weight_quantization_is_bit_exact() {
    for c in cases() {
        let Some(wq) = &c.wq else {
            assert!(quantize_weights_fn(c.ty).is_none(), "{}", c.ty);
            continue;
        };
        let mut out = vec![0u8; wq.len()];
        quantize_weights_row(c.ty, &c.x, &mut out).unwrap();
        assert_eq!(&out, wq, "{}", c.ty);
    }
}

fn close(a: f32, b: f32, rel: f32) -> bool {
    (a - b).abs() <= rel * a.abs().max(b.abs()).max(1e-30)
}

#[test]
fn scalar_dot_is_bit_exact_with_ggml_generic() {
    for c in cases() {
        let s = scalar::vec_dot_fn(c.ty).unwrap()(c.n, &c.w, &c.act);
        assert_eq!(
            s.to_bits(),
            c.dot_generic.to_bits(),
            "{} n={}: {s} vs ggml generic {}",
            c.ty,
            c.n,
            c.dot_generic
        );
    }
}

/// The SIMD levels whose kernels reproduce the ggml build that computed `c.dot_x86`, if any:
/// quantized types are the same at AVX2 and AVX-512 (ggml's AVX2 kernels, VNNI only changes
/// integer instructions); F32/F16 follow vec.cpp's AVX-512 layout at both levels (the golden
/// logits' build, so exact numerics give the same bits on any x86 host; the AVX2-only build's
/// 8-lane order is not ported); BF16 follows the AVX512_BF16 build (`vdpbf16ps`).
fn exact_levels(c: &Case) -> Vec<SimdLevel> {
    let mut v = match c.ty {
        GgmlType::BF16 | GgmlType::F32 | GgmlType::F16 if c.avx2_build => vec![],
        GgmlType::BF16 => vec![SimdLevel::Avx512],
        _ => vec![SimdLevel::Avx2, SimdLevel::Avx512],
    };
    v.retain(|l| *l <= hardware_simd_level());
    v
}

#[test]
fn simd_dots_are_bit_exact_with_ggml_x86() {
    let mut checked = 0;
    for c in cases() {
        for level in exact_levels(&c) {
            let s = vec_dot_fn_for_level(c.ty, level).unwrap()(c.n, &c.w, &c.act);
            assert_eq!(
                s.to_bits(),
                c.dot_x86.to_bits(),
                "{} n={} {}: {s} vs ggml x86 {}",
                c.ty,
                c.n,
                level.name(),
                c.dot_x86
            );
            checked += 1;
        }
    }
    eprintln!("{checked} (case, level) pairs bit-exact");
}

#[test]
fn every_level_is_close_to_ggml_x86() {
    for c in cases() {
        for level in [SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512] {
            let Some(f) = vec_dot_fn_for_level(c.ty, level) else {
                continue;
            };
            let s = f(c.n, &c.w, &c.act);
            assert!(
                close(s, c.dot_x86, 1e-5),
                "{} n={} {}: {s} vs ggml x86 {}",
                c.ty,
                c.n,
                level.name(),
                c.dot_x86
            );
        }
        let s = vec_dot(c.ty, c.n, &c.w, &c.act).unwrap();
        assert!(close(s, c.dot_x86, 1e-5), "{} dispatched", c.ty);
    }
}
