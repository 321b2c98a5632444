//! Load-time repacking (`Model::interleave_cpu_weights`): weight rows interleaved 16 at a time
//! (routed experts, attention projections, dense and shared FFNs, the output head) change no number under exact numerics (prompt batch and one-token decode give
//! the plain model's logits bit for bit: every product sees its rows back in GGUF order), and
//! keep every tensor's size. The fast kernels on them are checked against the goldens in
//! `tests/golden.rs` (fast numerics load the models interleaved, as the command line does).
//!
//! Fixtures come from $MOXIE_FIXTURES or ../shared/fixtures next to the checkout; a missing
//! directory fails the test.

use std::sync::Arc;

use moxie_core::blocks::Ffn;
use moxie_core::{Model, Numerics, Parallel};
use moxie_gguf::GgufFile;

mod common;
use common::{golden_index, prefill_and_decode, supported_models};

/// Every layer's matrices, then the output head.
fn matrices(m: &Model) -> Vec<&moxie_core::tensor::Tensor> {
    let mut v: Vec<_> = m
        .layers
        .iter()
        .flat_map(|l| [l.mixer.matrices(), l.ffn.matrices()].concat())
        .collect();
    v.push(&m.head.output);
    v
}

fn load(path: &std::path::Path) -> Model {
    Model::load(Arc::new(GgufFile::open(path).unwrap())).unwrap()
}

#[test]
fn interleaved_weights_change_no_exact_logit() {
    let index = golden_index();
    let par = Parallel::new(2).with_numerics(Numerics::Exact);
    let mut interleaved_files = 0;
    for case in &supported_models(&index) {
        let plain = load(&case.path);
        let mut model = load(&case.path);
        let change = model.set_cpu_weight_layout(&par, true, &moxie_core::progress::NoProgress);
        let (n, bytes) = (change.interleaved, change.interleaved_bytes);
        if n == 0 {
            continue;
        }
        interleaved_files += 1;
        // Same tensors, same sizes, some now interleaved.
        let mut seen = 0u64;
        for (x, y) in matrices(&plain).into_iter().zip(matrices(&model)) {
            assert_eq!(x.name, y.name);
            assert_eq!(x.data().len(), y.data().len(), "{}", x.name);
            if y.is_interleaved() {
                seen += y.data().len() as u64;
                assert_ne!(x.data(), y.data(), "{}: not repacked", x.name);
            }
        }
        assert_eq!(seen, bytes, "{}", case.stem);
        let want = prefill_and_decode(&plain, &par);
        let got = prefill_and_decode(&model, &par);
        assert!(
            want.iter()
                .zip(&got)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{}: exact logits changed by interleaving {n} tensors",
            case.stem
        );
        // Rows read back through the interleaved layout are the original rows.
        for (a, b) in plain.layers.iter().zip(&model.layers) {
            if let (Ffn::Moe(a), Ffn::Moe(b)) = (&a.ffn, &b.ffn) {
                let (mut x, mut y) = (vec![0f32; a.gate_exps.ne[0]], vec![0f32; a.gate_exps.ne[0]]);
                for r in [0, 5, 17, a.gate_exps.ne[1] * a.gate_exps.ne[2] - 1] {
                    a.gate_exps.row_to_f32(r, &mut x).unwrap();
                    b.gate_exps.row_to_f32(r, &mut y).unwrap();
                    assert_eq!(x, y, "{} row {r}", a.gate_exps.name);
                }
            }
        }
    }
    assert!(
        interleaved_files >= 2,
        "expected fixtures with Q4_K routed experts, found {interleaved_files}"
    );
}
