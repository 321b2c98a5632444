//! (a) quantize -> dequantize error bounds and (b) `vec_dot(w, quantize_act(x))` versus the f64
//! dot of the dequantized operands, for every supported type and every available kernel level.

mod common;
use common::*;
use moxie_quant::*;

fn rel_rmse(x: &[f32], y: &[f32]) -> f64 {
    let mut e = 0f64;
    let mut s = 0f64;
    for (a, b) in x.iter().zip(y) {
        e += ((a - b) as f64).powi(2);
        s += (*a as f64).powi(2);
    }
    (e / s).sqrt()
}

fn roundtrip(ty: GgmlType, f: QuantizeFn, x: &[f32]) -> Vec<f32> {
    let mut q = vec![0u8; ty.row_bytes(x.len() as u64).unwrap() as usize];
    f(x, &mut q);
    let mut y = vec![0f32; x.len()];
    dequantize_row(ty, &q, &mut y).unwrap();
    y
}

#[test]
fn weight_round_trip_error_bounds() {
    // relative RMS error bounds on Gaussian-ish data with 1% outliers (about 1.25x the values
    // measured with this seed; they catch gross errors, not regressions of a few percent)
    let bounds: [(GgmlType, f64); 15] = [
        (GgmlType::F32, 0.0),
        (GgmlType::F16, 3e-4),
        (GgmlType::BF16, 2.5e-3),
        (GgmlType::Q8_0, 0.008),
        (GgmlType::Q6_K, 0.024),
        (GgmlType::Q5_0, 0.058),
        (GgmlType::Q5_1, 0.049),
        (GgmlType::Q5_K, 0.048),
        (GgmlType::Q4_0, 0.134),
        (GgmlType::Q4_1, 0.105),
        (GgmlType::Q4_K, 0.098),
        (GgmlType::IQ4_NL, 0.1),
        (GgmlType::IQ4_XS, 0.112),
        (GgmlType::Q3_K, 0.197),
        (GgmlType::Q2_K, 0.41),
    ];
    let mut rng = Rng(0x5eed);
    for (ty, bound) in bounds {
        let x = random_row(&mut rng, 4096);
        let f = quantize_weights_fn(ty).unwrap();
        let y = roundtrip(ty, f, &x);
        let e = rel_rmse(&x, &y);
        eprintln!("{:7} relative rmse {e:.5} (bound {bound})", ty.name());
        assert!(e <= bound, "{ty}: {e} > {bound}");
        // the activation-side quantizer of weight types (ggml-cpu from_float) is as good
        let y2 = roundtrip(ty, quantize_fn(ty).unwrap(), &x);
        assert!(rel_rmse(&x, &y2) <= bound * 1.2, "{ty} from_float");
    }
}

#[test]
fn per_element_bounds_of_simple_types() {
    let mut rng = Rng(77);
    let x = random_row(&mut rng, 2048);
    // Q8_0 (both quantizers): |x - y| <= 0.5 d (+ f16 rounding of d)
    for f in [
        scalar::quantize_row_q8_0 as QuantizeFn,
        scalar::quantize_row_q8_0_ref,
    ] {
        let y = roundtrip(GgmlType::Q8_0, f, &x);
        for (xb, yb) in x.chunks(32).zip(y.chunks(32)) {
            let d = xb.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
            for (a, b) in xb.iter().zip(yb) {
                assert!((a - b).abs() <= 0.57 * d, "{a} {b} {d}");
            }
        }
    }
    // Q4_0: one step (the positive end clamps at 7)
    let y = roundtrip(GgmlType::Q4_0, scalar::quantize_row_q4_0, &x);
    for (xb, yb) in x.chunks(32).zip(y.chunks(32)) {
        let d = xb.iter().fold(0f32, |m, v| m.max(v.abs())) / 8.0;
        for (a, b) in xb.iter().zip(yb) {
            assert!((a - b).abs() <= 1.01 * d, "{a} {b} {d}");
        }
    }
    // Q8_K activations: |x - y| <= 0.5 |d|
    let y = roundtrip(GgmlType::Q8_K, scalar::quantize_row_q8_k, &x);
    for (xb, yb) in x.chunks(256).zip(y.chunks(256)) {
        let d = xb.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
        for (a, b) in xb.iter().zip(yb) {
            assert!((a - b).abs() <= 0.5001 * d, "{a} {b} {d}");
        }
    }
    // Q8_1: values and the stored sum
    let mut q = vec![0u8; 2048 / 32 * 36];
    scalar::quantize_row_q8_1(&x, &mut q);
    for (xb, qb) in x.chunks(32).zip(q.chunks(36)) {
        let d = fp16_to_f32(u16::from_le_bytes([qb[0], qb[1]]));
        let s = fp16_to_f32(u16::from_le_bytes([qb[2], qb[3]]));
        let sum: i32 = qb[4..].iter().map(|&v| v as i8 as i32).sum();
        // s = fp16(d_f32 * sum); d here is the f16-rounded d
        let ds = d * sum as f32;
        assert!((s - ds).abs() <= ds.abs() * 2e-3 + 1e-6, "{s} {ds}");
        for (a, v) in xb.iter().zip(&qb[4..]) {
            assert!((a - d * (*v as i8) as f32).abs() <= 0.57 * d);
        }
    }
}

fn deq(ty: GgmlType, b: &[u8], n: usize) -> Vec<f32> {
    let mut y = vec![0f32; n];
    dequantize_row(ty, b, &mut y).unwrap();
    y
}

fn check_dot(ty: GgmlType, w: &[u8], x: &[f32], what: &str) {
    let n = x.len();
    let at = vec_dot_type(ty).unwrap();
    let mut a = vec![0u8; at.row_bytes(n as u64).unwrap() as usize];
    quantize_row(at, x, &mut a).unwrap();
    let wd = deq(ty, w, n);
    let ad = deq(at, &a, n);
    let mut exact = 0f64;
    let mut mag = 0f64;
    for (p, q) in wd.iter().zip(&ad) {
        exact += *p as f64 * *q as f64;
        mag += (*p as f64 * *q as f64).abs();
    }
    // Q4_1/Q5_1 use the f16-rounded block sums `s` of Q8_1 for the min term
    let rel = if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
        1e-3
    } else {
        1e-4
    };
    let mut levels = vec![SimdLevel::Scalar];
    for l in [SimdLevel::Avx2, SimdLevel::Avx512] {
        if l <= hardware_simd_level() {
            levels.push(l);
        }
    }
    for level in levels {
        let f = vec_dot_fn_for_level(ty, level).unwrap();
        let got = f(n, w, &a) as f64;
        assert!(
            (got - exact).abs() <= rel * mag + 1e-30,
            "{ty} {what} {}: {got} vs {exact} (sum |w a| = {mag})",
            level.name()
        );
    }
    let got = vec_dot(ty, n, w, &a).unwrap() as f64;
    assert!((got - exact).abs() <= rel * mag + 1e-30, "{ty} {what}");
}

#[test]
fn vec_dot_matches_dequantized_dot() {
    let mut rng = Rng(1234);
    for ty in ALL_WEIGHT_TYPES {
        for rep in 0..4 {
            let n = 256 * (1 + rep);
            let xw = random_row(&mut rng, n);
            let x = random_row(&mut rng, n);
            // the IQ1/IQ2/IQ3 code-book types have no weight quantizer: raw blocks only
            if quantize_weights_fn(ty).is_some() {
                let mut w = vec![0u8; ty.row_bytes(n as u64).unwrap() as usize];
                quantize_weights_row(ty, &xw, &mut w).unwrap();
                check_dot(ty, &w, &x, "quantized weights");
            }
            if !has_random_blocks(ty) {
                continue;
            }
            let w = random_blocks(&mut rng, ty, n);
            check_dot(ty, &w, &x, "raw blocks");
        }
    }
}

#[test]
fn float_dots_with_odd_lengths() {
    // F32/F16/BF16 have block size 1: lengths that leave SIMD remainders
    let mut rng = Rng(99);
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
        for n in [
            1usize, 7, 15, 16, 17, 31, 33, 63, 64, 65, 100, 127, 129, 1000,
        ] {
            let xw = random_row(&mut rng, n);
            let mut w = vec![0u8; ty.row_bytes(n as u64).unwrap() as usize];
            quantize_weights_row(ty, &xw, &mut w).unwrap();
            let x = random_row(&mut rng, n);
            check_dot(ty, &w, &x, "odd length");
        }
    }
}
