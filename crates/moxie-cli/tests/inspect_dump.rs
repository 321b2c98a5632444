//! `moxie inspect MODEL --dump TENSOR --out FILE.npy`: one tensor dequantized to F32, shaped
//! like numpy sees ggml tensors (ne reversed).

use moxie_core::npy;

mod common;
use common::{fixture_model as model, moxie, tmp};

fn dump(file: &str, tensor: &str, out: &str) -> (Vec<usize>, Vec<f32>) {
    let out = tmp("dump", out);
    let o = moxie(&[
        "inspect",
        &model(file),
        "--dump",
        tensor,
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(
        o.status.success(),
        "{file} {tensor}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let r = npy::read_f32(&out).unwrap();
    std::fs::remove_file(&out).unwrap();
    r
}

#[test]
fn f32_dump_is_the_tensor_data_with_ne_reversed() {
    let name = "blk.1.ffn_down_exps.weight";
    let (shape, vals) = dump("qwen3moe-tiny-F32.gguf", name, "f32.npy");
    let f =
        moxie_gguf::GgufFile::open(std::path::Path::new(&model("qwen3moe-tiny-F32.gguf"))).unwrap();
    let t = f.tensor(name).unwrap();
    let ne: Vec<usize> = t.dims.iter().map(|&d| d as usize).collect();
    assert_eq!(shape, ne.iter().rev().copied().collect::<Vec<_>>());
    let raw: Vec<f32> = f
        .tensor_data(t)
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert!(raw
        .iter()
        .zip(&vals)
        .all(|(a, b)| a.to_bits() == b.to_bits()));
    assert_eq!(raw.len(), vals.len());
}

#[test]
fn quantized_dump_is_close_to_the_f32_master() {
    let name = "blk.0.ffn_up_exps.weight";
    let (s32, master) = dump("qwen3moe-tiny-F32.gguf", name, "m.npy");
    let (s8, q8) = dump("qwen3moe-tiny-Q8_0.gguf", name, "q8.npy");
    assert_eq!(s32, s8);
    // Q8_0 keeps each value within half a step (amax / 127 / 2 per 32-block) of the master,
    // plus the f16 rounding of the step (up to 127 steps of 2^-11 relative error).
    for (m, q) in master.chunks_exact(32).zip(q8.chunks_exact(32)) {
        let amax = m.iter().fold(0f32, |a, v| a.max(v.abs()));
        for (a, b) in m.iter().zip(q) {
            assert!((a - b).abs() <= amax / 127.0 * 0.57 + 1e-6, "{a} vs {b}");
        }
    }
}

#[test]
fn dump_errors_name_the_problem() {
    let m = model("qwen3moe-tiny-Q8_0.gguf");
    let out = tmp("dump", "never.npy");
    let o = moxie(&[
        "inspect",
        &m,
        "--dump",
        "blk.9.nope.weight",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("no tensor 'blk.9.nope.weight'"), "{err}");
    assert!(!out.exists());
    let o = moxie(&["inspect", &m, "--dump", "output.weight"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--out"));
}
