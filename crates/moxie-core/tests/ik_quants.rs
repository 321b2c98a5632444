//! ik_llama.cpp's own block types on the fixture files it quantized: every entry of the golden
//! index with a `dequant_golden` (experts 0 and 1 of `blk.1.ffn_down_exps.weight` as ik_llama.cpp
//! dequantizes them) is reproduced bit for bit by moxie's dequantization of the file's tensor.
//!
//! Fixtures come from $MOXIE_FIXTURES or ../shared/fixtures next to the checkout; a missing
//! directory fails the test.

use moxie_gguf::GgufFile;

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
