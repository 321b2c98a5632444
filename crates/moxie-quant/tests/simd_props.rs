//! (d) Every SIMD kernel against the scalar reference on random inputs (proptest): random raw
//! weight blocks (every byte random except finite f16 scales) and quantized random activations.
//! Integer sums are exact in every kernel, so the only difference is float summation order:
//! the tolerance is 1e-5 relative to sum |w_i a_i| (the natural scale of rounding error; the
//! result itself can be near zero through cancellation). The AVX-512 kernels must also equal
//! the AVX2 kernels bit for bit for the quantized types (same ggml float order), and SIMD
//! activation quantizers must equal the scalar ones bit for bit.

mod common;
use common::*;
use moxie_quant::*;
use proptest::prelude::*;

fn simd_levels() -> Vec<SimdLevel> {
    [SimdLevel::Avx2, SimdLevel::Avx512]
        .into_iter()
        .filter(|l| *l <= hardware_simd_level())
        .collect()
}

fn deq(ty: GgmlType, b: &[u8], n: usize) -> Vec<f32> {
    let mut y = vec![0f32; n];
    dequantize_row(ty, b, &mut y).unwrap();
    y
}

/// Random weights of `ty` (raw blocks, or a quantized random row for the float types) and
/// quantized activations for `n` elements.
fn operands(ty: GgmlType, n: usize, seed: u64, scale_pow: i32) -> (Vec<u8>, Vec<u8>) {
    let mut rng = Rng(seed | 1);
    let at = vec_dot_type(ty).unwrap();
    let w = if !has_random_blocks(ty) {
        let xw: Vec<f32> = random_row(&mut rng, n)
            .into_iter()
            .map(|v| v * 2f32.powi(scale_pow))
            .collect();
        let mut w = vec![0u8; ty.row_bytes(n as u64).unwrap() as usize];
        quantize_weights_row(ty, &xw, &mut w).unwrap();
        w
    } else {
        random_blocks(&mut rng, ty, n)
    };
    let x: Vec<f32> = random_row(&mut rng, n)
        .into_iter()
        .map(|v| v * 2f32.powi(-scale_pow))
        .collect();
    let mut a = vec![0u8; at.row_bytes(n as u64).unwrap() as usize];
    quantize_row(at, &x, &mut a).unwrap();
    (w, a)
}

fn check_all_levels(ty: GgmlType, n: usize, w: &[u8], a: &[u8]) -> Result<(), TestCaseError> {
    let at = vec_dot_type(ty).unwrap();
    let wd = deq(ty, w, n);
    let ad = deq(at, a, n);
    let mag: f64 = wd
        .iter()
        .zip(&ad)
        .map(|(p, q)| (*p as f64 * *q as f64).abs())
        .sum();
    let reference = scalar::vec_dot_fn(ty).unwrap()(n, w, a);
    let mut avx2 = None;
    for level in simd_levels() {
        let got = vec_dot_fn_for_level(ty, level).unwrap()(n, w, a);
        prop_assert!(
            ((got - reference) as f64).abs() <= 1e-5 * mag + 1e-30,
            "{} {} n={}: simd {} scalar {} (sum |w a| {})",
            ty,
            level.name(),
            n,
            got,
            reference,
            mag
        );
        let float_type = matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16);
        if level == SimdLevel::Avx2 {
            avx2 = Some(got);
        } else if let (Some(v2), false) = (avx2, float_type) {
            prop_assert_eq!(got.to_bits(), v2.to_bits(), "{} avx512 vs avx2", ty);
        }
    }
    Ok(())
}

proptest! {
    // 256 cases per property by default; set PROPTEST_CASES to run more
    #![proptest_config(ProptestConfig::default())]

    #[test]
    fn quantized_dots_match_scalar(seed in any::<u64>(), blocks in 1usize..9, ti in 0usize..QUANT_WEIGHT_TYPES.len()) {
        let ty = QUANT_WEIGHT_TYPES[ti];
        let n = blocks * 256;
        let (w, a) = operands(ty, n, seed, 0);
        check_all_levels(ty, n, &w, &a)?;
    }

    // the grid types' kernels gather grid rows by index bits spread over several fields (and
    // the AVX-512 ones look them up in compressed code books)
    #[test]
    fn iq_grid_dots_match_scalar(seed in any::<u64>(), blocks in 1usize..5, ti in 0usize..GgmlType::IQ_GRID.len()) {
        let ty = GgmlType::IQ_GRID[ti];
        let n = blocks * 256;
        let (w, a) = operands(ty, n, seed, 0);
        check_all_levels(ty, n, &w, &a)?;
    }

    #[test]
    fn legacy_dots_with_odd_block_counts(seed in any::<u64>(), blocks in 1usize..40, ti in 0usize..5) {
        let ty = [GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::IQ4_NL, GgmlType::Q4_1][ti];
        let n = blocks * 32;
        let (w, a) = operands(ty, n, seed, 0);
        check_all_levels(ty, n, &w, &a)?;
    }

    #[test]
    fn float_dots_match_scalar(seed in any::<u64>(), n in 1usize..700, ti in 0usize..3, sp in -8i32..8) {
        let ty = [GgmlType::F32, GgmlType::F16, GgmlType::BF16][ti];
        let (w, a) = operands(ty, n, seed, sp);
        check_all_levels(ty, n, &w, &a)?;
    }

    #[test]
    fn simd_activation_quantizers_are_bit_identical(
        seed in any::<u64>(),
        blocks in 1usize..5,
        ai in 0usize..4,
        sp in -20i32..20,
        special in 0u8..4,
    ) {
        let at = [GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8_K, GgmlType::F16][ai];
        let n = blocks * 256;
        let mut rng = Rng(seed | 1);
        let mut x: Vec<f32> = random_row(&mut rng, n).into_iter().map(|v| v * 2f32.powi(sp)).collect();
        match special {
            // an all-zero block and a block of exact ties
            1 => x[..256].fill(0.0),
            2 => {
                for (i, v) in x[..256].iter_mut().enumerate() {
                    *v = (i % 255) as f32 - 127.0 + 0.5 * (i % 2) as f32;
                }
            }
            // the largest magnitude appears with both signs
            3 => {
                x[3] = -1000.0;
                x[200] = 1000.0;
            }
            _ => {}
        }
        let bytes = at.row_bytes(n as u64).unwrap() as usize;
        let mut reference = vec![0u8; bytes];
        scalar::quantize_fn(at).unwrap()(&x, &mut reference);
        for level in simd_levels() {
            let mut got = vec![0u8; bytes];
            quantize_fn_for_level(at, level).unwrap()(&x, &mut got);
            prop_assert_eq!(&got, &reference, "{} {}", at, level.name());
        }
    }
}

#[test]
fn zero_length_dots_are_zero() {
    for ty in ALL_WEIGHT_TYPES {
        for level in [SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512] {
            if let Some(f) = vec_dot_fn_for_level(ty, level) {
                assert_eq!(f(0, &[], &[]), 0.0, "{ty} {}", level.name());
            }
        }
    }
}

#[test]
#[should_panic]
fn unchecked_kernels_panic_on_short_input() {
    let f = vec_dot_fn(GgmlType::Q4_K).unwrap();
    f(512, &[0u8; 144], &[0u8; 584]);
}
