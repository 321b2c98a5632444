//! ik_llama.cpp's own block types on the fixture files it quantized: every entry of the golden
//! index with a `dequant_golden` (experts 0 and 1 of `blk.1.ffn_down_exps.weight` as ik_llama.cpp
//! dequantizes them) is reproduced bit for bit by moxie's dequantization of the file's tensor.
//!
//! Fixtures come from $MOXIE_FIXTURES or ../shared/fixtures next to the checkout; a missing
//! directory fails the test.

use moxie_gguf::GgufFile;
use moxie_quant::GgmlType;

mod common;
use common::{fixtures, golden_index};

#[test]
fn dequantization_equals_ik_llama_cpp_bit_for_bit() {
    let fx = fixtures();
    let index = golden_index();
    let mut checked = Vec::new();
    let mut failures = Vec::new();
    for (stem, entry) in index["models"].as_object().unwrap() {
        let Some(g) = entry.get("dequant_golden") else {
            continue;
        };
        let file = GgufFile::open(&fx.join(entry["model_file"].as_str().unwrap()))
            .unwrap_or_else(|e| panic!("{stem}: {e}"));
        let name = g["tensor"].as_str().unwrap();
        let t = file
            .tensor(name)
            .unwrap_or_else(|| panic!("{stem}: no tensor {name}"));
        assert_eq!(Some(t.ty.name()), g["type"].as_str(), "{stem} {name}");
        let (shape, want) = moxie_core::npy::read_f32(&fx.join(g["file"].as_str().unwrap()))
            .unwrap_or_else(|e| panic!("{stem}: {e}"));
        // [experts, rows, row length] = ggml ne reversed, cut to the first experts.
        let n = t.row_len() as usize;
        assert_eq!(shape.len(), 3);
        assert_eq!(shape[2], n, "{stem}");
        assert_eq!(shape[1] as u64, t.dims[1], "{stem}");
        let rows = shape[0] * shape[1];
        let data = file.tensor_data(t).unwrap();
        let rb = t.row_bytes() as usize;
        let mut got = vec![0f32; rows * n];
        for (r, out) in got.chunks_exact_mut(n).enumerate() {
            moxie_quant::dequantize_row(t.ty, &data[r * rb..(r + 1) * rb], out)
                .unwrap_or_else(|e| panic!("{stem} row {r}: {e}"));
        }
        let differ = got
            .iter()
            .zip(&want)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        if let Some((i, (a, b))) = got
            .iter()
            .zip(&want)
            .enumerate()
            .find(|(_, (a, b))| a.to_bits() != b.to_bits())
        {
            failures.push(format!(
                "{stem} {}: {differ} of {} values differ, first at {i} (row {}): {a:e} vs ik's {b:e}",
                t.ty,
                want.len(),
                i / n
            ));
        }
        checked.push(format!("{stem} ({}, {} values)", t.ty, want.len()));
    }
    println!("checked: {}", checked.join(", "));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        checked.len() >= 9,
        "expected the 9 ik_llama.cpp fixtures, found {}",
        checked.len()
    );
}

/// xorshift64*: deterministic test data without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [-1, 1).
    fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

/// `n_out` random rows of `n_in` values of `ty`: random bytes with finite scales (the row's
/// scale of the `_KS` types, each block's `d` of the others), 0.01 .. 0.02 in size.
fn random_matrix(rng: &mut Rng, ty: GgmlType, n_in: usize, n_out: usize) -> Vec<u8> {
    let rb = ty.row_bytes(n_in as u64).unwrap() as usize;
    let meta = ty.row_meta_bytes();
    let mut data: Vec<u8> = (0..rb * n_out).map(|_| rng.next() as u8).collect();
    for row in data.chunks_exact_mut(rb) {
        let d = 0.01 * (1.0 + rng.f32().abs());
        match meta {
            0 => {}
            2 => row[..2].copy_from_slice(&moxie_quant::f32_to_fp16(d).to_le_bytes()),
            _ => row[..4].copy_from_slice(&d.to_le_bytes()),
        }
        for blk in row[meta..].chunks_exact_mut(ty.type_size()) {
            for &off in ty.f16_scale_offsets() {
                let d = 0.01 * (1.0 + rng.f32().abs());
                blk[off..off + 2].copy_from_slice(&moxie_quant::f32_to_fp16(d).to_le_bytes());
            }
        }
    }
    data
}

/// Weight matrices of ik_llama.cpp's types through moxie-core's matrix products, in both
/// numerics and at batch sizes on both sides of the int8 GEMM threshold: every output within
/// the activations' 8-bit quantization of the exact product of the dequantized weights with the
/// f32 input. Q6_0 (ik's fallback for short rows, absent from the fixtures) runs here with rows
/// of 96 values as well.
#[test]
fn ik_type_matrices_multiply_like_their_dequantized_weights() {
    use moxie_core::tensor::Tensor;
    use moxie_core::{Numerics, Parallel};
    let mut rng = Rng(2024);
    for (ty, n_in) in [
        (GgmlType::Q6_0, 96),
        (GgmlType::Q6_0, 512),
        (GgmlType::IQ2_KS, 512),
        (GgmlType::IQ4_KS, 512),
        (GgmlType::IQ5_K, 512),
        (GgmlType::IQ3_K, 256),
    ] {
        let n_out = 37;
        let data = random_matrix(&mut rng, ty, n_in, n_out);
        let t = Tensor::owned("w", ty, [n_in, n_out, 1, 1], data).unwrap();
        let mut w = vec![0f32; n_in * n_out];
        for (r, row) in w.chunks_exact_mut(n_in).enumerate() {
            t.row_to_f32(r, row).unwrap();
        }
        let m = t.matrix().unwrap();
        for numerics in [Numerics::Exact, Numerics::Fast] {
            let par = Parallel::new(2).with_numerics(numerics);
            for n_tok in [1, 3, 40] {
                let x: Vec<f32> = (0..n_in * n_tok).map(|_| rng.f32()).collect();
                let mut got = vec![f32::NAN; n_tok * n_out];
                m.matmul(&par, &x, &mut got);
                for (t_i, (xt, gt)) in x
                    .chunks_exact(n_in)
                    .zip(got.chunks_exact(n_out))
                    .enumerate()
                {
                    for (r, (wr, &g)) in w.chunks_exact(n_in).zip(gt).enumerate() {
                        let exact: f64 =
                            wr.iter().zip(xt).map(|(&a, &b)| a as f64 * b as f64).sum();
                        let mag: f64 = wr
                            .iter()
                            .zip(xt)
                            .map(|(&a, &b)| (a as f64 * b as f64).abs())
                            .sum();
                        assert!(
                            (g as f64 - exact).abs() <= 0.02 * mag,
                            "{ty} n_in {n_in} {numerics:?} {n_tok} tokens, token {t_i} row {r}: {g} vs {exact} (sum |w x| {mag})"
                        );
                    }
                }
            }
        }
    }
}
