//! The MTP (nextn) head as a draft model: loaded only when asked for, skipped otherwise as
//! llama.cpp does; drafting continues from the main model's output-normed hidden state, with
//! its own one-layer state, the same whether a batch is drafted at once or token by token, and
//! the same on simulated devices and (within the emulator's bounds) on emulated GPUs.
//!
//! The drafts equal llama.cpp's MTP drafts bit for bit on glm-dsa-tiny-F32 (the fixtures have
//! no MTP golden: the reference is `scripts/mtp_reference.py`'s, see
//! `drafts_equal_llama_cpp`).

use std::collections::HashMap;
use std::sync::Arc;

use moxie_core::device::{Devices, CPU};
use moxie_core::model::{LoadOptions, Placement};
use moxie_core::{KvTypes, Logits, Model, Numerics, Parallel};
use moxie_gguf::GgufFile;
use moxie_gpu::emu::EmuGpu;
use moxie_gpu::Gpu;

mod common;
use common::{block, fixtures, kld_per_row};

fn glm_dsa() -> Arc<GgufFile> {
    Arc::new(GgufFile::open(&fixtures().join("models/glm-dsa-tiny-F32.gguf")).unwrap())
}

const MTP: LoadOptions = LoadOptions { mtp: true };

/// Tokens, the main model's hidden state at each position, and the draft inputs: token
/// `t + 1` with hidden state `t`.
fn draft_inputs(model: &Model, par: &Parallel) -> (Vec<u32>, Vec<f32>) {
    let tokens: Vec<u32> = (0..24u32).map(|i| (i * 97 + 13) % 2000).collect();
    let mut state = model.new_state(Some(64)).unwrap();
    let (_, hidden) = model
        .forward_hidden(&tokens, &mut state, par, Logits::All)
        .unwrap();
    let e = model.config.n_embd;
    (
        tokens[1..].to_vec(),
        hidden[..(tokens.len() - 1) * e].to_vec(),
    )
}

/// All drafts in one batch, then (from a fresh draft state) one at a time.
fn drafts(model: &Model, par: &Parallel) -> (Vec<f32>, Vec<f32>) {
    let (tokens, hidden) = draft_inputs(model, par);
    let e = model.config.n_embd;
    let mut st = model.new_draft_state(64, KvTypes::default()).unwrap();
    let (batch, next_hidden) = model
        .draft(&tokens, &hidden, &mut st, par, Logits::All)
        .unwrap();
    assert_eq!(next_hidden.len(), tokens.len() * e);
    assert_eq!(st.len(), tokens.len());
    let mut st = model.new_draft_state(64, KvTypes::default()).unwrap();
    let mut steps = Vec::new();
    for (i, &t) in tokens.iter().enumerate() {
        let (l, h) = model
            .draft(
                &[t],
                &hidden[i * e..(i + 1) * e],
                &mut st,
                par,
                Logits::Last,
            )
            .unwrap();
        assert_eq!(h.len(), e);
        steps.extend(l);
    }
    (batch, steps)
}

/// FNV-1a 64 over the logits' bits, little-endian.
fn fnv1a(x: &[f32]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for v in x {
        for b in v.to_bits().to_le_bytes() {
            h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// llama.cpp's MTP drafts (llama-cpp-python 0.3.36 = llama.cpp 0c1e57098, an MTP context on
/// glm-dsa-tiny-F32 with its MTP block loaded; `python3 scripts/mtp_reference.py
/// ../shared/fixtures/models/glm-dsa-tiny-F32.gguf 2040,5,77,1024,9,300,1500,42 out.npz`): the
/// target's logits and output-normed hidden state from one batch, then token k drafted at
/// position k with hidden state k - 1 (zeros for the first), one batch. Exact numerics give
/// the same draft logits bit for bit: the hash of their bits and each row's best token and
/// its logit (bits) as that run printed them.
#[test]
fn drafts_equal_llama_cpp() {
    const TOKENS: [u32; 8] = [2040, 5, 77, 1024, 9, 300, 1500, 42];
    const HASH: u64 = 0x62e4_8d60_f3b5_1efb;
    const ARGMAX: [(usize, u32); 8] = [
        (566, 0x414d_7f49),
        (1308, 0x416b_5e64),
        (1934, 0x416f_15b6),
        (371, 0x413c_e018),
        (1913, 0x416f_bcda),
        (333, 0x4150_5ac3),
        (2040, 0x4148_27a2),
        (234, 0x4164_9aa2),
    ];
    let model = Model::load_with(glm_dsa(), &Placement::default(), MTP).unwrap();
    let par = Parallel::new(2).with_numerics(Numerics::Exact);
    let e = model.config.n_embd;
    let mut state = model.new_state(Some(64)).unwrap();
    let (_, hidden) = model
        .forward_hidden(&TOKENS, &mut state, &par, Logits::All)
        .unwrap();
    let mut input = vec![0f32; TOKENS.len() * e];
    input[e..].copy_from_slice(&hidden[..(TOKENS.len() - 1) * e]);
    let mut draft_state = model.new_draft_state(64, KvTypes::default()).unwrap();
    let (logits, _) = model
        .draft(&TOKENS, &input, &mut draft_state, &par, Logits::All)
        .unwrap();
    let n_vocab = model.config.n_vocab;
    for (r, (row, &(best, bits))) in logits.chunks_exact(n_vocab).zip(&ARGMAX).enumerate() {
        let top = moxie_core::sampling::argmax(row) as usize;
        assert_eq!(
            (top, row[top].to_bits()),
            (best, bits),
            "draft row {r}: best token {top} logit {} vs llama.cpp's {best} {}",
            row[top],
            f32::from_bits(bits)
        );
    }
    assert_eq!(
        fnv1a(&logits),
        HASH,
        "draft logits differ from llama.cpp's in some bit"
    );
}

#[test]
fn the_mtp_block_loads_only_on_request() {
    let file = glm_dsa();
    let par = Parallel::new(2);
    let plain = Model::load(Arc::clone(&file)).unwrap();
    assert!(plain.mtp.is_none());
    let err = plain
        .new_draft_state(8, KvTypes::default())
        .err()
        .expect("no MTP block loaded")
        .to_string();
    assert!(err.contains("MTP") && err.contains("mtp: true"), "{err}");

    // Every tensor of the MTP block (blk.3) on sim0: with the block loaded, sim0 holds exactly
    // its tensors except the indexer's, which llama.cpp's MTP graph does not run, and the
    // shared head norm, which goes with the LM head it feeds (the model's, on the CPU).
    let mut tensors = HashMap::new();
    let mut want = 0u64;
    for t in file.tensors() {
        if block(&t.name).is_some_and(|(il, _)| il == 3) {
            tensors.insert(t.name.clone(), 1);
            if !t.name.contains(".indexer.") && !t.name.contains("shared_head_norm") {
                want += t.n_bytes;
            }
        }
    }
    let placement = || Placement {
        devices: Devices::with_sims(&[1 << 30]),
        tensors: tensors.clone(),
        ..Default::default()
    };
    let skipped = Model::load_placed(Arc::clone(&file), &placement()).unwrap();
    assert_eq!(skipped.devices.get(1).stats().resident_bytes, 0);
    let with = Model::load_with(Arc::clone(&file), &placement(), MTP).unwrap();
    assert_eq!(with.devices.get(1).stats().resident_bytes, want);
    // The main graph is the same with or without the MTP block.
    let tokens = [5u32, 77, 1024, 9];
    let run = |m: &Model| {
        let mut s = m.new_state(Some(8)).unwrap();
        m.forward(&tokens, &mut s, &par, Logits::All).unwrap()
    };
    assert!(run(&plain) == run(&with));

    // A model without an MTP block says so.
    let ds = Arc::new(GgufFile::open(&fixtures().join("models/deepseek2-tiny-F32.gguf")).unwrap());
    let err = Model::load_with(ds, &Placement::default(), MTP)
        .err()
        .expect("deepseek2-tiny has no MTP block")
        .to_string();
    assert!(err.contains("no MTP block"), "{err}");
}

/// Drafting a batch at once and token by token (each draft step attending to the earlier ones
/// through the draft state) agree up to the batch kernels' float rounding; both are finite and
/// not constant.
#[test]
fn drafts_agree_batched_and_token_by_token() {
    let model = Model::load_with(glm_dsa(), &Placement::default(), MTP).unwrap();
    let par = Parallel::new(2).with_numerics(Numerics::Exact);
    let (batch, steps) = drafts(&model, &par);
    assert_eq!(batch.len(), steps.len());
    assert!(batch.iter().all(|v| v.is_finite()));
    let n_vocab = model.config.n_vocab;
    let spread = batch[..n_vocab]
        .iter()
        .fold(0f32, |m, &v| m.max((v - batch[0]).abs()));
    assert!(spread > 1.0, "draft logits look constant");
    let klds = kld_per_row(&batch, &steps, n_vocab);
    let worst = klds.iter().copied().fold(0f64, f64::max);
    assert!(
        worst < 1e-6,
        "batched vs one-at-a-time drafts: KLD {worst:.2e}"
    );
}

/// On simulated devices (the MTP layer's attention, FFN and experts on different devices),
/// drafts are the CPU's bit for bit; on emulated GPUs within the F32 emulator bound.
#[test]
fn drafts_on_other_devices() {
    let file = glm_dsa();
    let par = Parallel::new(2);
    let cpu = Model::load_with(Arc::clone(&file), &Placement::default(), MTP).unwrap();
    let (want, _) = drafts(&cpu, &par);
    let n_vocab = cpu.config.n_vocab;

    let mut tensors = HashMap::new();
    for t in file.tensors() {
        let dev = match block(&t.name) {
            Some((3, rest)) if rest.contains("_exps") => CPU,
            Some((3, rest)) if rest.starts_with("ffn") || rest.starts_with("exp_probs") => 2,
            Some((3, _)) => 1,
            _ => CPU,
        };
        tensors.insert(t.name.clone(), dev);
    }
    let sims = Model::load_with(
        Arc::clone(&file),
        &Placement {
            devices: Devices::with_sims(&[1 << 30, 1 << 30]),
            tensors: tensors.clone(),
            ..Default::default()
        },
        MTP,
    )
    .unwrap();
    assert!(
        drafts(&sims, &par).0 == want,
        "drafts on sims differ from the CPU's"
    );

    let mut gpus = Devices::cpu_only();
    for name in ["CUDA0", "CUDA1"] {
        gpus.push_gpu(Gpu::new(EmuGpu::new(name, 1 << 30)), 1 << 30);
    }
    let all_gpu: HashMap<String, usize> =
        file.tensors().iter().map(|t| (t.name.clone(), 1)).collect();
    let on_gpu = Model::load_with(
        Arc::clone(&file),
        &Placement {
            devices: gpus,
            tensors: all_gpu,
            ..Default::default()
        },
        MTP,
    )
    .unwrap();
    let (got, _) = drafts(&on_gpu, &par);
    let klds = kld_per_row(&want, &got, n_vocab);
    let mean = klds.iter().sum::<f64>() / klds.len() as f64;
    assert!(
        mean <= 1e-5,
        "drafts on an emulated GPU: mean KLD {mean:.2e}"
    );
}
