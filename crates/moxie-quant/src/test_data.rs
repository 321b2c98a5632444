//! Random weight and activation rows for the crate's unit tests (`gemm`, `repack`).

use crate::GgmlType;

/// The types with an interleaved 16-row layout (`repack`), which the group tile fill reads.
pub(crate) const INTERLEAVED_TYPES: [GgmlType; 6] = [
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q5_0,
];

/// The next value in [-1, 1) of a 64-bit LCG.
pub(crate) fn lcg(seed: &mut u64) -> f32 {
    *seed = seed
        .wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1_442_695_040_888_963_407);
    ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

/// `n_rows` rows of `n_in` values of `ty`: random values in [-1, 1) quantized, row by row; for
/// a code-book type (no weight quantizer) random raw blocks with the scale 1/64.
pub(crate) fn weight_rows(ty: GgmlType, n_rows: usize, n_in: usize, seed: &mut u64) -> Vec<u8> {
    let rb = ty.row_bytes(n_in as u64).unwrap() as usize;
    let mut w = vec![0u8; n_rows * rb];
    let Some(quantize) = crate::quantize_weights_fn(ty) else {
        for b in w.iter_mut() {
            *b = (lcg(seed).to_bits() >> 9) as u8;
        }
        let d = crate::f32_to_fp16(1.0 / 64.0);
        for blk in w.chunks_exact_mut(ty.type_size()) {
            if ty == GgmlType::IQ1_M {
                crate::iq1::set_iq1m_scale(blk, d);
            } else {
                blk[..2].copy_from_slice(&d.to_le_bytes());
            }
        }
        return w;
    };
    for row in w.chunks_exact_mut(rb) {
        let x: Vec<f32> = (0..n_in).map(|_| lcg(seed)).collect();
        quantize(&x, row);
    }
    w
}

/// `n_tok` rows of `n_in` random values in [-3, 3) converted to `ty`'s dot partner.
pub(crate) fn act_rows(ty: GgmlType, n_in: usize, n_tok: usize, seed: &mut u64) -> Vec<u8> {
    let act = crate::vec_dot_type(ty).unwrap();
    let rb = act.row_bytes(n_in as u64).unwrap() as usize;
    let mut a = vec![0u8; n_tok * rb];
    for row in a.chunks_exact_mut(rb) {
        let x: Vec<f32> = (0..n_in).map(|_| lcg(seed) * 3.0).collect();
        crate::quantize_fn(act).unwrap()(&x, row);
    }
    a
}
