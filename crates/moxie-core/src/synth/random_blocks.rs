//! Random valid blocks of the IQ1/IQ2/IQ3 types moxie can read but not quantize to (IQ1_S,
//! IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S: llama-quantize's grid searches are not
//! ported). `moxie gen` writes tensors of these types (e.g. most of an IQ2_M model) as random
//! blocks, **not** as a quantization of a Normal draw: every grid index, sign and sub-block
//! scale byte is random (any bit pattern is a valid block), and each block's f16 super-scale
//! `d` is set so that the block's dequantized values have the root mean square the tensor's
//! initialisation asks for (its standard deviation: the values have mean ≈ 0). The values are
//! finite by construction (a finite, non-negative `d`), so the blocks load and run like any
//! other, with the spread of the Normal weights they stand in for; their distribution is
//! the type's grid's, not a Normal one.

use moxie_quant::{f32_to_fp16, fp16_to_f32, GgmlType};

use super::rng::Xoshiro256;

/// Whether `moxie gen` writes `ty` as random blocks (see the module documentation).
pub fn random_blocks(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        IQ1_S | IQ1_M | IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S
    )
}

/// Stores the f16 bits `d` as the super-scale of one `ty` block.
fn set_d(ty: GgmlType, block: &mut [u8], d: u16) {
    if ty == GgmlType::IQ1_M {
        // No `d` field: it is spread over the top nibbles of the scale words.
        moxie_quant::iq1::set_iq1m_scale(block, d);
    } else {
        // Every other random-block type starts with `ggml_half d`.
        debug_assert_eq!(ty.f16_scale_offsets(), &[0]);
        block[..2].copy_from_slice(&d.to_le_bytes());
    }
}

/// Fills `row` (whole blocks of `ty`, one of the [`random_blocks`] types) with random blocks
/// from `rng` whose dequantized values each have root mean square `std` (up to the rounding
/// of `d` to f16). `scratch` holds one block's values.
pub fn fill_row(ty: GgmlType, rng: &mut Xoshiro256, std: f32, row: &mut [u8], scratch: &mut [f32]) {
    debug_assert!(random_blocks(ty));
    let dequantize = moxie_quant::dequantize_fn(ty).expect("random-block types dequantize");
    let bs = ty.block_size();
    let scratch = &mut scratch[..bs];
    for block in row.chunks_exact_mut(ty.type_size()) {
        for chunk in block.chunks_mut(8) {
            let r = rng.next_u64().to_le_bytes();
            chunk.copy_from_slice(&r[..chunk.len()]);
        }
        // The values are linear in d: measure them at d = 1, then scale.
        set_d(ty, block, f32_to_fp16(1.0));
        dequantize(block, scratch);
        let rms = (scratch
            .iter()
            .map(|&x| f64::from(x) * f64::from(x))
            .sum::<f64>()
            / bs as f64)
            .sqrt();
        let mut d = f32_to_fp16((f64::from(std) / rms) as f32);
        // Clamp to a positive finite f16: the smallest subnormal or the largest normal.
        if fp16_to_f32(d) == 0.0 {
            d = 1;
        } else if !fp16_to_f32(d).is_finite() {
            d = 0x7bff;
        }
        set_d(ty, block, d);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_blocks_have_the_asked_spread_and_are_valid() {
        use GgmlType::*;
        for ty in [IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S] {
            assert!(random_blocks(ty));
            for std in [0.003f32, 0.05, 1.0] {
                let n = 4 * ty.block_size();
                let mut row = vec![0u8; 4 * ty.type_size()];
                let mut scratch = vec![0f32; ty.block_size()];
                let mut rng = Xoshiro256::new(7);
                fill_row(ty, &mut rng, std, &mut row, &mut scratch);
                moxie_quant::validate_row_data(ty, &row).unwrap();
                let mut v = vec![0f32; n];
                moxie_quant::dequantize_fn(ty).unwrap()(&row, &mut v);
                assert!(v.iter().all(|x| x.is_finite()), "{ty}");
                let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / n as f64;
                let var = v
                    .iter()
                    .map(|&x| (f64::from(x) - mean).powi(2))
                    .sum::<f64>()
                    / n as f64;
                let got = var.sqrt() as f32;
                assert!(
                    got > std / 1.25 && got < std * 1.25,
                    "{ty}: std {got} for {std}"
                );
                assert!(mean.abs() < 0.25 * f64::from(std), "{ty}: mean {mean}");
            }
        }
        assert!(!random_blocks(Q4_K) && !random_blocks(IQ4_XS) && !random_blocks(TQ1_0));
    }
}
