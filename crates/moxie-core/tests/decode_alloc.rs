//! Decode's MoE layer allocates nothing per token: after one token has sized its buffers, the
//! one-token path (router, top-k, every selected and shared expert, the weighted sum) runs out
//! of its `MoeScratch`. Checked with a counting global allocator, so this file holds a single
//! test (other tests running beside it would be counted too).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use moxie_core::blocks::moe::{self, MoeScratch};
use moxie_core::blocks::Ffn;
use moxie_core::synth::{self, SynthSpec, SynthType};
use moxie_core::{Model, Parallel};
use moxie_gguf::GgufFile;

mod common;

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call forwards to the system allocator unchanged; the counter is the only
// addition.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract for `alloc` is passed on as is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` through `alloc` / `realloc` above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as for `dealloc`; the caller guarantees `new_size` is valid for `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Pseudo-random layer inputs, one row of `n` per call index.
fn input(n: usize, call: u64) -> Vec<f32> {
    let mut s = call.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

#[test]
fn one_token_moe_allocates_nothing_after_the_first_token() {
    let base = std::env::var_os("CARGO_TARGET_TMPDIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let dir = base.join(format!("moxie-decode-alloc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // deepseek2 has a shared expert and biased sigmoid routing in groups; qwen3moe softmax
    // routing without one; Q4_K_M mixes weight types, Q8_0 does not. qwen3next (a fixture:
    // `moxie gen` does not write it) gates its shared expert.
    for (preset, ty) in [
        ("deepseek2-tiny", "Q4_K_M"),
        ("qwen3moe-tiny", "Q4_K_M"),
        ("glm4moe-tiny", "Q8_0"),
        ("qwen3next-tiny", "Q4_K_M"),
    ] {
        let path = if preset == "qwen3next-tiny" {
            common::fixtures().join(format!("models/{preset}-{ty}.gguf"))
        } else {
            let mut spec = SynthSpec::preset(preset).unwrap();
            spec.ty = SynthType::parse(ty).unwrap();
            let path = dir.join(format!("{preset}-{ty}.gguf"));
            synth::generate(&spec, &path).unwrap();
            path
        };
        let model = Model::load(Arc::new(GgufFile::open(&path).unwrap())).unwrap();
        let c = &model.config;
        let inputs: Vec<Vec<f32>> = (0..8).map(|i| input(c.n_embd, i)).collect();
        for threads in [1, 2] {
            let par = Parallel::new(threads);
            let mut scratch = MoeScratch::default();
            let mut first = None;
            for (il, layer) in model.layers.iter().enumerate() {
                let Ffn::Moe(m) = &layer.ffn else { continue };
                // Sized by the first token of the first MoE layer; every other layer has the
                // same shapes.
                if first.is_none() {
                    moe::forward(m, &inputs[0], 1, &par, &mut scratch).unwrap();
                    first = Some(il);
                }
                for h in &inputs {
                    let before = ALLOCATIONS.load(Ordering::SeqCst);
                    let out = moe::forward(m, h, 1, &par, &mut scratch).unwrap();
                    let after = ALLOCATIONS.load(Ordering::SeqCst);
                    assert_eq!(out.len(), c.n_embd);
                    assert!(out.iter().all(|v| v.is_finite()));
                    assert_eq!(
                        after - before,
                        0,
                        "{preset} {ty} layer {il}, {threads} threads: one-token MoE allocated"
                    );
                }
            }
            assert!(first.is_some(), "{preset} has MoE layers");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
