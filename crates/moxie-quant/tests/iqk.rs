//! ik_llama.cpp's types (IQ2_K .. IQ6_K, IQ2_KS .. IQ5_KS, Q6_0): hand-built blocks with
//! per-value expected results, `vec_dot` against the f64 dot of the dequantized values, every
//! SIMD kernel against the scalar reference (bit for bit: they share its integer sums and float
//! steps) and the int8 GEMM against `vec_dot`. That the dequantization equals ik_llama.cpp's
//! own to the bit is checked on the fixture tensors (moxie-core `tests/ik_quants.rs`).

mod common;
use common::Rng;
use moxie_quant::*;
use proptest::prelude::*;

/// The ik_llama.cpp types moxie computes with.
const IK_TYPES: [GgmlType; 10] = [
    GgmlType::IQ2_K,
    GgmlType::IQ3_K,
    GgmlType::IQ4_K,
    GgmlType::IQ5_K,
    GgmlType::IQ6_K,
    GgmlType::IQ2_KS,
    GgmlType::IQ3_KS,
    GgmlType::IQ4_KS,
    GgmlType::IQ5_KS,
    GgmlType::Q6_0,
];

/// A finite scale of moderate size with a random sign.
fn scale(rng: &mut Rng) -> f32 {
    let mag = 2f32.powi(-((rng.next_u64() % 10) as i32) - 2) * (1.0 + rng.f32().abs());
    if rng.next_u64().is_multiple_of(2) {
        mag
    } else {
        -mag
    }
}

/// A random row of `n` values of `ty`: every byte random except the scales `d` (finite), per
/// block or, for the `_KS` types, per row.
fn random_row(rng: &mut Rng, ty: GgmlType, n: usize) -> Vec<u8> {
    let mut b = rng.bytes(ty.row_bytes(n as u64).unwrap() as usize);
    let meta = ty.row_meta_bytes();
    match meta {
        0 => {}
        2 => b[..2].copy_from_slice(&f32_to_fp16(scale(rng)).to_le_bytes()),
        4 => b[..4].copy_from_slice(&scale(rng).to_le_bytes()),
        _ => unreachable!("{ty}: row prefix of {meta} bytes"),
    }
    for blk in b[meta..].chunks_exact_mut(ty.type_size()) {
        for &off in ty.f16_scale_offsets() {
            blk[off..off + 2].copy_from_slice(&f32_to_fp16(scale(rng)).to_le_bytes());
        }
    }
    b
}

/// Quantized random activations of the dot partner of `ty`.
fn activations(rng: &mut Rng, ty: GgmlType, n: usize) -> Vec<u8> {
    let at = vec_dot_type(ty).unwrap();
    let x = common::random_row(rng, n);
    let mut a = vec![0u8; at.row_bytes(n as u64).unwrap() as usize];
    quantize_row(at, &x, &mut a).unwrap();
    a
}

fn deq(ty: GgmlType, b: &[u8], n: usize) -> Vec<f32> {
    let mut y = vec![0f32; n];
    dequantize_row(ty, b, &mut y).unwrap();
    y
}

/// `(exact f64 dot of the dequantized rows, sum of |w_i a_i|)`.
fn f64_dot(ty: GgmlType, w: &[u8], a: &[u8], n: usize) -> (f64, f64) {
    let wd = deq(ty, w, n);
    let ad = deq(vec_dot_type(ty).unwrap(), a, n);
    wd.iter().zip(&ad).fold((0.0, 0.0), |(s, m), (&p, &q)| {
        let v = p as f64 * q as f64;
        (s + v, m + v.abs())
    })
}

#[test]
fn layouts_match_ik_llama_cpp() {
    // (type, bytes per block, row prefix): ik_llama.cpp's block structs and row_meta_size.
    for (ty, bytes, meta) in [
        (GgmlType::Q6_0, 26, 0),
        (GgmlType::IQ2_K, 76, 0),
        (GgmlType::IQ3_K, 110, 0),
        (GgmlType::IQ4_K, 144, 0),
        (GgmlType::IQ5_K, 176, 0),
        (GgmlType::IQ6_K, 212, 0),
        (GgmlType::IQ2_KS, 70, 2),
        (GgmlType::IQ3_KS, 102, 2),
        (GgmlType::IQ4_KS, 136, 4),
        (GgmlType::IQ5_KS, 168, 4),
    ] {
        assert_eq!((ty.type_size(), ty.row_meta_bytes()), (bytes, meta), "{ty}");
        let bs = ty.block_size() as u64;
        assert_eq!(ty.row_bytes(3 * bs), Some(meta as u64 + 3 * bytes as u64));
        let want = if ty == GgmlType::Q6_0 {
            GgmlType::Q8_0
        } else {
            GgmlType::Q8_K
        };
        assert_eq!(vec_dot_type(ty), Some(want), "{ty}");
        assert_eq!(GgmlType::from_name(ty.name()), Some(ty));
    }
    for (id, ty) in [
        (133, GgmlType::Q6_0),
        (137, GgmlType::IQ2_K),
        (156, GgmlType::IQ3_KS),
    ] {
        assert_eq!(GgmlType::from_id(id), Some(ty));
    }
}

/// Q6_0 packed as ik_llama.cpp's `quantize_row_q6_0_ref` packs it: element j's low nibble in
/// `qs[j]` (j + 16: high nibble), its two high bits at `4 (j/8)` (j + 16: `4 (j/8) + 2`) of
/// `qh[j % 8]`.
fn pack_q6_0(d: f32, q: &[u8; 32]) -> Vec<u8> {
    let mut b = vec![0u8; 26];
    b[..2].copy_from_slice(&f32_to_fp16(d).to_le_bytes());
    for j in 0..16 {
        b[10 + j] = (q[j] & 0xf) | ((q[j + 16] & 0xf) << 4);
        let h = (q[j] >> 4) | ((q[j + 16] >> 4) << 2);
        b[2 + j % 8] |= h << (4 * (j / 8));
    }
    b
}

#[test]
fn q6_0_known_block() {
    let q: [u8; 32] = std::array::from_fn(|i| ((i * 37 + 5) % 64) as u8);
    let d = 0.375f32;
    let b = pack_q6_0(d, &q);
    let y = deq(GgmlType::Q6_0, &b, 32);
    for i in 0..32 {
        assert_eq!(y[i], (q[i] as i32 - 32) as f32 * d, "value {i}");
    }
    // Against activations 1, -1, 2, ...: the integer sum times d * 1.
    let mut a = vec![0u8; 34];
    a[..2].copy_from_slice(&f32_to_fp16(1.0).to_le_bytes());
    let av: Vec<i8> = (0..32).map(|i| (i % 5) as i8 - 2).collect();
    for (o, &v) in a[2..].iter_mut().zip(&av) {
        *o = v as u8;
    }
    let want: i32 = (0..32).map(|i| (q[i] as i32 - 32) * av[i] as i32).sum();
    assert_eq!(
        vec_dot(GgmlType::Q6_0, 32, &b, &a).unwrap(),
        want as f32 * d
    );
}

/// IQ4_KS by hand: row scale 0.5; block 0's scale bytes `2s + half` give group scales
/// `2s - 127`; value `0.5 * scale * iq4k[16 half + q]`.
#[test]
fn iq4_ks_known_row() {
    let mut row = vec![0u8; 4 + 136];
    row[..4].copy_from_slice(&0.5f32.to_le_bytes());
    let scale_bytes = [0u8, 1, 130, 131, 254, 255, 127, 200];
    row[4..12].copy_from_slice(&scale_bytes);
    for j in 0..128 {
        row[12 + j] = (j as u8).wrapping_mul(29);
    }
    let y = deq(GgmlType::IQ4_KS, &row, 256);
    for s in 0..8 {
        let sb = scale_bytes[s];
        let dl = 0.5 * ((sb & 254) as i32 - 127) as f32;
        let book = &iqk::IQ4K[16 * (sb & 1) as usize..];
        for j in 0..16 {
            let b = row[12 + 16 * s + j];
            assert_eq!(y[32 * s + j], dl * book[(b & 0xf) as usize] as f32);
            assert_eq!(y[32 * s + 16 + j], dl * book[(b >> 4) as usize] as f32);
        }
    }
}

/// IQ2_KS by hand: an f16 row scale, then `extra` (bits 0-7 halves, 8-15 the scales' fifth
/// bits), 4 scale bytes (two nibbles each, minus 16), 2-bit quants.
#[test]
fn iq2_ks_known_row() {
    let mut row = vec![0u8; 2 + 70];
    row[..2].copy_from_slice(&f32_to_fp16(0.25).to_le_bytes());
    let extra: u16 = 0b1010_0110_0101_1001;
    row[2..4].copy_from_slice(&extra.to_le_bytes());
    row[4..8].copy_from_slice(&[0x1f, 0x80, 0x37, 0xe2]);
    for j in 0..64 {
        row[8 + j] = (j as u8).wrapping_mul(113).wrapping_add(7);
    }
    let y = deq(GgmlType::IQ2_KS, &row, 256);
    for s in 0..8 {
        let nib = (row[4 + s / 2] >> (4 * (s % 2))) & 0xf;
        let sc = (nib | ((((extra >> (8 + s)) & 1) as u8) << 4)) as i32 - 16;
        let dl = 0.25 * sc as f32;
        let book = &iqk::IQ2NL[4 * ((extra >> s) & 1) as usize..];
        for j in 0..32 {
            let q = (row[8 + 32 * (s / 4) + j] >> (2 * (s % 4))) & 3;
            assert_eq!(
                y[32 * s + j],
                dl * book[q as usize] as f32,
                "group {s} value {j}"
            );
        }
    }
}

/// `vec_dot` equals the exact dot of the dequantized rows up to f32 rounding, for random raw
/// weights (IQ6_K aside: its dequantized values are its curve, its dots use the rounded
/// code book, see `iq6_k_dot_uses_the_code_book`).
#[test]
fn vec_dot_matches_dequantized_dot() {
    let mut rng = Rng(4242);
    for ty in IK_TYPES {
        if ty == GgmlType::IQ6_K {
            continue;
        }
        for blocks in [1usize, 2, 5] {
            let n = blocks * 256;
            let w = random_row(&mut rng, ty, n);
            let a = activations(&mut rng, ty, n);
            let (exact, mag) = f64_dot(ty, &w, &a, n);
            let got = vec_dot(ty, n, &w, &a).unwrap() as f64;
            assert!(
                (got - exact).abs() <= 1e-5 * mag + 1e-30,
                "{ty} n={n}: vec_dot {got}, exact {exact} (sum |w a| {mag})"
            );
        }
    }
}

/// With d = 1 and every group scale 1, an IQ6_K value is its curve at the index, whose
/// rounding is the code-book value the dot product uses: the dot equals the f64 dot of the
/// rounded dequantized values.
#[test]
fn iq6_k_dot_uses_the_code_book() {
    let mut rng = Rng(66);
    let n = 3 * 256;
    let mut w = random_row(&mut rng, GgmlType::IQ6_K, n);
    for blk in w.chunks_exact_mut(212) {
        blk[..2].copy_from_slice(&f32_to_fp16(1.0).to_le_bytes());
        blk[4..20].fill(1);
    }
    let a = activations(&mut rng, GgmlType::IQ6_K, n);
    let wd = deq(GgmlType::IQ6_K, &w, n);
    let ad = deq(GgmlType::Q8_K, &a, n);
    let exact: f64 = wd
        .iter()
        .zip(&ad)
        .map(|(&p, &q)| p.round() as f64 * q as f64)
        .sum();
    let mag: f64 = wd
        .iter()
        .zip(&ad)
        .map(|(&p, &q)| (p * q).abs() as f64)
        .sum();
    let got = vec_dot(GgmlType::IQ6_K, n, &w, &a).unwrap() as f64;
    assert!((got - exact).abs() <= 1e-5 * mag, "{got} vs {exact}");
    for (i, &v) in wd.iter().enumerate() {
        assert!(
            (v - v.round()).abs() < 0.5 && v.abs() <= 128.0,
            "value {i}: {v}"
        );
    }
}

/// A row's scale is read from its own prefix: rows of a `_KS` matrix dequantize alone, and the
/// checked entry points refuse a row without it.
#[test]
fn row_scaled_types_need_their_prefix() {
    let mut rng = Rng(9);
    for ty in [
        GgmlType::IQ2_KS,
        GgmlType::IQ3_KS,
        GgmlType::IQ4_KS,
        GgmlType::IQ5_KS,
    ] {
        let w = random_row(&mut rng, ty, 512);
        let meta = ty.row_meta_bytes();
        let mut y = vec![0f32; 512];
        assert!(matches!(
            dequantize_row(ty, &w[meta..], &mut y),
            Err(QuantError::Length { .. })
        ));
        // Doubling the row scale doubles every value.
        let mut w2 = w.clone();
        if meta == 2 {
            let d = fp16_to_f32(u16::from_le_bytes([w[0], w[1]]));
            w2[..2].copy_from_slice(&f32_to_fp16(2.0 * d).to_le_bytes());
        } else {
            let d = f32::from_le_bytes(w[..4].try_into().unwrap());
            w2[..4].copy_from_slice(&(2.0 * d).to_le_bytes());
        }
        let (y1, y2) = (deq(ty, &w, 512), deq(ty, &w2, 512));
        for (p, q) in y1.iter().zip(&y2) {
            assert_eq!(2.0 * p, *q, "{ty}");
        }
    }
}

fn check_levels(ty: GgmlType, n: usize, w: &[u8], a: &[u8]) -> Result<(), TestCaseError> {
    let reference = scalar::vec_dot_fn(ty).unwrap()(n, w, a);
    for level in [SimdLevel::Avx2, SimdLevel::Avx512] {
        if let Some(f) = vec_dot_fn_for_level(ty, level) {
            let got = f(n, w, a);
            prop_assert_eq!(
                got.to_bits(),
                reference.to_bits(),
                "{} {} n={}: {} vs scalar {}",
                ty,
                level.name(),
                n,
                got,
                reference
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::default())]

    #[test]
    fn simd_dots_equal_scalar(seed in any::<u64>(), blocks in 1usize..9, ti in 0usize..9) {
        let ty = IK_TYPES[ti];
        let n = blocks * 256;
        let mut rng = Rng(seed | 1);
        let w = random_row(&mut rng, ty, n);
        let a = activations(&mut rng, ty, n);
        check_levels(ty, n, &w, &a)?;
    }

    #[test]
    fn q6_0_simd_dot_equals_scalar(seed in any::<u64>(), blocks in 1usize..40) {
        let ty = GgmlType::Q6_0;
        let n = blocks * 32;
        let mut rng = Rng(seed | 1);
        let w = random_row(&mut rng, ty, n);
        let a = activations(&mut rng, ty, n);
        check_levels(ty, n, &w, &a)?;
    }
}

/// The int8 GEMM's whole-tile decoder of `ty` (AVX-512) against its portable row decoder
/// (`iqk::gemm_decode` then the tile's interleaving): the same bytes and bit-identical scales.
fn check_tile(ty: GgmlType, n: usize, rows: &[u8]) -> Result<(), TestCaseError> {
    let want = gemm_decode_tile(ty, n, rows, false).unwrap();
    let got = gemm_decode_tile(ty, n, rows, true).unwrap();
    prop_assert!(!want.by_tile_decoder);
    // The tile decoders run where the int8 GEMM's AVX-512 kernels do.
    prop_assert_eq!(got.by_tile_decoder, gemm_avx512(), "{}", ty);
    let n_rows = rows.len() / ty.row_bytes(n as u64).unwrap() as usize;
    if let Some(i) = (0..want.q.len()).find(|&i| got.q[i] != want.q[i]) {
        let (g, m, e) = (i / 64, i / 4 % 16, i % 4);
        prop_assert!(
            false,
            "{} n={} rows={}: value {} of row {}: tile decoder {}, row decoder {}",
            ty,
            n,
            n_rows,
            4 * g + e,
            m,
            got.q[i],
            want.q[i]
        );
    }
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    prop_assert_eq!(bits(&got.scale), bits(&want.scale), "{} scales", ty);
    prop_assert_eq!(bits(&got.min), bits(&want.min), "{} mins", ty);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::default())]

    #[test]
    fn gemm_tile_decoders_equal_row_decoder(
        seed in any::<u64>(),
        blocks in 1usize..5,
        n_rows in 1usize..17,
        ti in 0usize..9,
    ) {
        let ty = IK_TYPES[ti];
        let n = blocks * 256;
        let mut rng = Rng(seed | 1);
        let rows: Vec<u8> = (0..n_rows).flat_map(|_| random_row(&mut rng, ty, n)).collect();
        check_tile(ty, n, &rows)?;
    }

    #[test]
    fn q6_0_gemm_tile_decoder_equals_row_decoder(
        seed in any::<u64>(),
        blocks in 1usize..40,
        n_rows in 1usize..17,
    ) {
        let ty = GgmlType::Q6_0;
        let n = blocks * 32;
        let mut rng = Rng(seed | 1);
        let rows: Vec<u8> = (0..n_rows).flat_map(|_| random_row(&mut rng, ty, n)).collect();
        check_tile(ty, n, &rows)?;
    }
}

/// Every SIMD level the CPU has runs a kernel of its own, not a lower level's (`Simd::at` falls
/// back to one where a type has none): the property tests above then check each level's code.
#[test]
fn every_simd_level_has_its_own_kernel() {
    for ty in IK_TYPES {
        let mut seen = vec![scalar::vec_dot_fn(ty).unwrap() as usize];
        for level in [SimdLevel::Avx2, SimdLevel::Avx512] {
            if level <= hardware_simd_level() {
                let f = vec_dot_fn_for_level(ty, level).unwrap() as usize;
                assert!(
                    !seen.contains(&f),
                    "{ty} {}: a lower level's kernel",
                    level.name()
                );
                seen.push(f);
            }
        }
    }
}

#[test]
fn zero_length_dots_are_zero() {
    for ty in IK_TYPES {
        for level in [SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512] {
            if let Some(f) = vec_dot_fn_for_level(ty, level) {
                assert_eq!(f(0, &[], &[]), 0.0, "{ty} {}", level.name());
            }
        }
    }
}

/// The int8 GEMM (fast numerics' batched path) equals `vec_dot` up to float rounding: same
/// integer sums, scales applied per group instead of per block.
#[test]
fn gemm_matches_vec_dot() {
    if !gemm_available() {
        eprintln!("int8 GEMM not available here (needs AVX2): skipped");
        return;
    }
    let mut rng = Rng(77);
    for ty in IK_TYPES {
        let n_in = 512;
        let (n_rows, n_tok): (usize, usize) = (37, 15);
        assert!(gemm_supports(ty, n_in), "{ty}");
        let rb = ty.row_bytes(n_in as u64).unwrap() as usize;
        let w: Vec<u8> = (0..n_rows)
            .flat_map(|_| random_row(&mut rng, ty, n_in))
            .collect();
        let at = vec_dot_type(ty).unwrap();
        let arb = at.row_bytes(n_in as u64).unwrap() as usize;
        let x: Vec<u8> = (0..n_tok)
            .flat_map(|_| activations(&mut rng, ty, n_in))
            .collect();
        let acts = GemmActs::new(at, n_in, &x, arb).unwrap();
        let n_tiles = n_rows.div_ceil(GEMM_TILE_ROWS);
        let mut out = vec![f32::NAN; n_tiles * n_tok * GEMM_TILE_ROWS];
        assert!(gemm_q8(ty, n_in, &w, &acts, &mut out, &[]), "{ty}");
        for r in 0..n_rows {
            let wr = &w[r * rb..(r + 1) * rb];
            for t in 0..n_tok {
                let xr = &x[t * arb..(t + 1) * arb];
                let want = vec_dot(ty, n_in, wr, xr).unwrap();
                // (IQ6_K's dequantized values are within 0.5 of the code book's it multiplies
                // with: close enough for a scale of the rounding.)
                let (_, mag) = f64_dot(ty, wr, xr, n_in);
                let (tile, i) = (r / GEMM_TILE_ROWS, r % GEMM_TILE_ROWS);
                let got = out[(tile * n_tok + t) * GEMM_TILE_ROWS + i];
                assert!(
                    ((got - want) as f64).abs() <= 2e-5 * mag + 1e-30,
                    "{ty} row {r} token {t}: int8 gemm {got}, vec_dot {want} (sum |w a| {mag})"
                );
            }
        }
    }
}
