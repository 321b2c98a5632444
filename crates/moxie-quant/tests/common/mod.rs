//! Shared test helpers: a deterministic RNG and generators of random data and raw blocks.
#![allow(dead_code)]

use moxie_quant::{f32_to_fp16, GgmlType};

/// xorshift64* — deterministic and dependency-free.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [-1, 1).
    pub fn f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    /// Roughly normal (sum of uniforms).
    pub fn gauss(&mut self) -> f32 {
        (0..4).map(|_| self.f32()).sum::<f32>() * 0.866
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

/// Random data with per-block varying magnitude and a few outliers.
pub fn random_row(rng: &mut Rng, n: usize) -> Vec<f32> {
    let mut v = vec![0f32; n];
    for (i, x) in v.iter_mut().enumerate() {
        let scale = 1.0 + (i / 32 % 5) as f32;
        *x = rng.gauss() * scale;
        if rng.next_u64().is_multiple_of(97) {
            *x *= 4.0;
        }
    }
    v
}

/// Random raw weight blocks with finite, moderate f16 scales (every other byte random).
pub fn random_blocks(rng: &mut Rng, ty: GgmlType, n: usize) -> Vec<u8> {
    let nb = n / ty.block_size();
    let ts = ty.type_size();
    let mut b = rng.bytes(nb * ts);
    for blk in b.chunks_exact_mut(ts) {
        for &off in ty.f16_scale_offsets() {
            let mag = 2f32.powi(-((rng.next_u64() % 10) as i32) - 2) * (1.0 + rng.f32().abs());
            let v = if rng.next_u64().is_multiple_of(2) {
                mag
            } else {
                -mag
            };
            blk[off..off + 2].copy_from_slice(&f32_to_fp16(v).to_le_bytes());
        }
        if ty == GgmlType::IQ1_M {
            // no f16 field: the scale is the top nibbles of the 4 u16 scale words
            let mag = 2f32.powi(-((rng.next_u64() % 10) as i32) - 2) * (1.0 + rng.f32().abs());
            let d = f32_to_fp16(if rng.next_u64().is_multiple_of(2) {
                mag
            } else {
                -mag
            });
            moxie_quant::iq1::set_iq1m_scale(blk, d);
        }
    }
    b
}

/// Whether [`random_blocks`] gives `ty` finite scales (the quantized types; the float types
/// take quantized random rows instead).
pub fn has_random_blocks(ty: GgmlType) -> bool {
    !ty.f16_scale_offsets().is_empty() || ty == GgmlType::IQ1_M
}

/// The weight types moxie computes with (excluding the float types). The IQ1/IQ2/IQ3 types
/// have no weight quantizer (llama-quantize needs an importance matrix for them).
pub const QUANT_WEIGHT_TYPES: [GgmlType; 19] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_S,
    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S,
    GgmlType::IQ1_S,
    GgmlType::IQ1_M,
];

pub const ALL_WEIGHT_TYPES: [GgmlType; 22] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_S,
    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S,
    GgmlType::IQ1_S,
    GgmlType::IQ1_M,
];
