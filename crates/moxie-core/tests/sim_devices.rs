//! Placement over simulated devices: every fixture model split across `sim0`, `sim1` and the CPU
//! (attention, FFN and routed experts of a layer on different devices, experts of some layers
//! left on the CPU as `-ot exps=CPU` does) gives the all-CPU logits bit for bit, weights and KV
//! cache are held against each device's budget, and every crossing is a counted copy.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use moxie_core::device::{DeviceId, Devices, CPU};
use moxie_core::model::Placement;
use moxie_core::{Model, Parallel};
use moxie_gguf::GgufFile;

mod common;
use common::{block, fixtures, golden_index, prefill_and_decode as run, supported_models};

const SIM0: DeviceId = 1;
const SIM1: DeviceId = 2;

/// Attention of even layers on sim0 and odd ones on sim1, their FFN part on the other sim,
/// routed experts with the FFN part except in every third layer (left on the CPU); token
/// embeddings on the CPU, the output on sim1.
fn spread(file: &GgufFile, devices: Devices) -> Placement {
    let mut tensors = HashMap::new();
    for t in file.tensors() {
        let dev = match block(&t.name) {
            None if t.name.starts_with("output") => SIM1,
            None => CPU,
            Some((il, rest)) => {
                let (attn, ffn) = if il % 2 == 0 {
                    (SIM0, SIM1)
                } else {
                    (SIM1, SIM0)
                };
                if rest.contains("_exps") {
                    if il % 3 == 0 {
                        CPU
                    } else {
                        ffn
                    }
                } else if rest.starts_with("ffn_")
                    || rest.starts_with("exp_probs_b")
                    || rest.starts_with("post_attention_norm")
                {
                    ffn
                } else {
                    attn
                }
            }
        };
        tensors.insert(t.name.clone(), dev);
    }
    Placement {
        devices,
        tensors,
        ..Default::default()
    }
}

fn open(path: &Path) -> Arc<GgufFile> {
    Arc::new(GgufFile::open(path).unwrap())
}

#[test]
fn sim_placement_gives_the_cpu_logits_on_every_fixture() {
    let par = Parallel::new(2);
    let mut checked = 0;
    for fixture in supported_models(&golden_index()) {
        let path = &fixture.path;
        let file = open(path);
        let cpu =
            Model::load(Arc::clone(&file)).unwrap_or_else(|e| panic!("{}: {e}", fixture.stem));
        let want = run(&cpu, &par);
        let placed = Model::load_placed(
            Arc::clone(&file),
            &spread(&file, Devices::with_sims(&[1 << 30, 1 << 30])),
        )
        .unwrap();
        let got = run(&placed, &par);
        let name = path.file_name().unwrap().to_string_lossy();
        assert!(got == want, "{name}: logits differ from the all-CPU run");

        // Both sims held weights and KV, and the hidden state crossed in and out of each.
        let stats = placed.devices.stats();
        for (dev, s) in &stats[1..] {
            assert!(s.resident_bytes > 0, "{name}: {dev} holds nothing");
            assert!(s.copies_in > 0 && s.copies_out > 0, "{name}: {dev}: {s:?}");
        }
        checked += 1;
    }
    assert!(
        checked >= 17,
        "expected the fixture models, checked {checked}"
    );
}

/// What each device holds is exactly the bytes of the tensors placed on it, plus its layers'
/// KV cache while a cache lives; a budget too small for them is refused with the device named.
#[test]
fn budgets_hold_weights_and_cache_and_refuse_overflow() {
    let path = fixtures().join("models/deepseek2-tiny-Q4_K_M.gguf");
    let file = open(&path);
    let placement = spread(&file, Devices::with_sims(&[1 << 30, 1 << 30]));
    let mut want = [0u64; 3];
    for t in file.tensors() {
        want[placement.device_of(&t.name)] += file.tensor_data(t).unwrap().len() as u64;
    }
    let model = Model::load_placed(Arc::clone(&file), &placement).unwrap();
    let held = |d: DeviceId| model.devices.get(d).stats().resident_bytes;
    for t in file.tensors() {
        if placement.device_of(&t.name) == SIM0 {
            eprintln!("{} {}", t.name, file.tensor_data(t).unwrap().len());
        }
    }
    assert_eq!((held(SIM0), held(SIM1)), (want[SIM0], want[SIM1]));
    // Weights cross once, at load.
    assert_eq!(model.devices.get(SIM0).stats().bytes_in, want[SIM0]);

    let cache = model.new_state(Some(64)).unwrap();
    let kv: u64 = (0..model.config.n_layer)
        .filter(|il| model.layers[*il].devices().attn == SIM0)
        .map(|il| cache.layer_bytes_when_full(il) as u64)
        .sum();
    assert!(kv > 0);
    assert_eq!(held(SIM0), want[SIM0] + kv);
    drop(cache);
    assert_eq!(held(SIM0), want[SIM0]);
    // Everything is given back with the model.
    let devices = model.devices.clone();
    drop(model);
    assert_eq!(devices.get(SIM0).stats().resident_bytes, 0);
    assert_eq!(devices.get(SIM1).stats().resident_bytes, 0);

    // Weights that do not fit.
    let small = spread(&file, Devices::with_sims(&[want[SIM0] - 1, 1 << 30]));
    let err = Model::load_placed(Arc::clone(&file), &small)
        .err()
        .expect("over budget")
        .to_string();
    assert!(
        err.contains("sim0") && err.contains("out of memory"),
        "{err}"
    );

    // Weights fit, a long context's cache does not.
    let tight = spread(&file, Devices::with_sims(&[want[SIM0] + kv / 2, 1 << 30]));
    let model = Model::load_placed(Arc::clone(&file), &tight).unwrap();
    let err = model
        .new_state(Some(64))
        .err()
        .expect("cache over budget")
        .to_string();
    assert!(err.contains("sim0") && err.contains("KV cache"), "{err}");
}

/// A layer's attention split over two devices is refused with both tensors named.
#[test]
fn a_stage_split_over_devices_is_refused() {
    let path = fixtures().join("models/qwen3moe-tiny-Q4_K_M.gguf");
    let file = open(&path);
    let mut placement = Placement {
        devices: Devices::with_sims(&[1 << 30, 1 << 30]),
        tensors: HashMap::new(),
        ..Default::default()
    };
    for t in file.tensors() {
        if t.name.starts_with("blk.1.attn_") {
            placement.tensors.insert(t.name.clone(), SIM0);
        }
    }
    placement.tensors.insert("blk.1.attn_k.weight".into(), SIM1);
    let err = Model::load_placed(file, &placement)
        .err()
        .expect("split attention")
        .to_string();
    assert!(
        err.contains("layer 1")
            && err.contains("on sim0")
            && err.contains("'blk.1.attn_k.weight' is on sim1"),
        "{err}"
    );
}

/// glm-dsa past its indexer's top-k, with layers 1 and 2 sharing layer 0's selection (GLM-5.2's
/// shared indexer layers) while their attention runs on other devices: bit for bit the CPU's.
#[test]
fn sparse_attention_across_sim_devices_gives_the_cpu_logits() {
    let path = fixtures().join("models/glm-dsa-tiny-Q4_K_M.gguf");
    let file = open(&path);
    let par = Parallel::new(2);
    let share = |m: &mut Model| {
        for layer in m.layers.iter_mut().skip(1) {
            if let moxie_core::blocks::Mixer::Mla(mla) = &mut layer.mixer {
                mla.sparse = Some(moxie_core::blocks::mla::Sparse::Shared);
            }
        }
    };
    let tokens: Vec<u32> = (0..70u32).map(|i| (i * 53 + 11) % 2000).collect();
    let run = |m: &Model| {
        let mut s = m.new_state(Some(128)).unwrap();
        let mut all = m
            .forward(&tokens[..60], &mut s, &par, moxie_core::Logits::All)
            .unwrap();
        for &t in &tokens[60..] {
            all.extend(
                m.forward(&[t], &mut s, &par, moxie_core::Logits::Last)
                    .unwrap(),
            );
        }
        all
    };
    for shared in [false, true] {
        let mut cpu = Model::load(Arc::clone(&file)).unwrap();
        let mut placed = Model::load_placed(
            Arc::clone(&file),
            &spread(&file, Devices::with_sims(&[1 << 30, 1 << 30])),
        )
        .unwrap();
        if shared {
            share(&mut cpu);
            share(&mut placed);
        }
        assert!(run(&placed) == run(&cpu), "shared indexers: {shared}");
    }
}

/// Counts what loading reports: each step's total and the bytes advanced in it.
#[derive(Default)]
struct Steps(std::sync::Mutex<Vec<(String, u64, u64)>>);

impl moxie_core::progress::Progress for Steps {
    fn start(&self, what: &str, total: u64) {
        self.0.lock().unwrap().push((what.to_owned(), total, 0));
    }
    fn advance(&self, bytes: u64) {
        self.0.lock().unwrap().last_mut().expect("a started step").2 += bytes;
    }
    fn finish(&self) {}
}

impl Steps {
    /// The one step reported since the last call: (what, total, advanced).
    fn take(&self) -> (String, u64, u64) {
        let mut steps = self.0.lock().unwrap();
        assert_eq!(steps.len(), 1, "{steps:?}");
        steps.pop().unwrap()
    }
}

/// Loading's steps report their bytes (what the CLI's bar draws) and the buffer summary adds
/// up: the copy to the sims covers every tensor placed there, repacking every host matrix,
/// the page-in the weights still mapped (the `CPU_Mapped` buffer) but the token embeddings,
/// and --no-mmap's copy leaves nothing mapped.
#[test]
fn loading_reports_its_bytes_and_buffers() {
    let m = supported_models(&golden_index())
        .into_iter()
        .find(|m| m.stem == "deepseek2-tiny-Q4_K_M")
        .expect("the deepseek2 Q4_K_M fixture");
    let file = open(&m.path);
    // Block 1 on the CPU, so that it has matrices to repack.
    let mut placement = spread(&file, Devices::with_sims(&[1 << 30, 1 << 30]));
    for (name, dev) in placement.tensors.iter_mut() {
        if name.starts_with("blk.1.") {
            *dev = CPU;
        }
    }
    let on_sims: u64 = file
        .tensors()
        .iter()
        .filter(|t| placement.device_of(&t.name) != CPU)
        .map(|t| t.n_bytes)
        .sum();
    let steps = Steps::default();
    let opts = Default::default();
    let mut model = Model::load_reporting(Arc::clone(&file), &placement, opts, &steps).unwrap();
    let (what, total, done) = steps.take();
    assert_eq!(
        (what.as_str(), total, done),
        ("copying weights to sim0, sim1", on_sims, on_sims)
    );

    let change = model.set_cpu_weight_layout(&Parallel::new(2), true, &steps);
    let (_, total, done) = steps.take();
    assert_eq!(total, done);
    assert!(change.interleaved > 0 && total >= change.interleaved_bytes);

    let buffers = model.weight_buffers();
    let buffer = |name: &str| buffers.iter().find(|(n, _)| n == name).map(|&(_, b)| b);
    let mapped = buffer("CPU_Mapped").expect("the token embeddings stay mapped");
    assert!(
        buffer("sim0").is_some() && buffer("sim1").is_some(),
        "{buffers:?}"
    );
    assert_eq!(buffer("CPU"), Some(change.interleaved_bytes), "{buffers:?}");
    // The page-in covers what stays mapped except the token embeddings (read a row per
    // token); --no-mmap copies all of it.
    let embd = file.tensor("token_embd.weight").unwrap().n_bytes;
    let paged = model.page_in_mapped_weights(&steps);
    assert_eq!(paged.bytes, mapped - embd);
    assert!(paged.skipped.is_none() && paged.tensors > 0);
    let (_, total, done) = steps.take();
    assert_eq!((total, done), (mapped - embd, mapped - embd));

    let (n, bytes) = model.own_mapped_weights(&steps);
    assert_eq!((n, bytes), (paged.tensors + 1, mapped));
    assert_eq!(steps.take().2, mapped);
    let buffers = model.weight_buffers();
    assert!(
        buffers.iter().all(|(n, _)| n != "CPU_Mapped"),
        "{buffers:?}"
    );
}

/// The routed-expert weights each device reads are counted: a one-token pass reads each of a
/// layer's top-k experts once on the device that holds them; a prompt batch each expert that
/// any of its tokens chose, once (the distinct experts the routing telemetry saw in it).
#[test]
fn expert_reads_are_counted_per_device_and_phase() {
    use moxie_core::blocks::Ffn;
    use moxie_core::telemetry::Phase;
    let par = Parallel::new(2);
    for stem in ["deepseek2-tiny-Q4_K_M", "qwen3moe-tiny-Q4_K_M"] {
        let file = open(&fixtures().join(format!("models/{stem}.gguf")));
        let devices = Devices::with_sims(&[1 << 30, 1 << 30]);
        let model = Model::load_placed(Arc::clone(&file), &spread(&file, devices)).unwrap();
        run(&model, &par); // 19 prompt tokens in one batch, then 3 one-token passes
        let profile = model.routing_profile().unwrap();
        let mut want = vec![[0u64; 2]; 3];
        for (il, layer) in model.layers.iter().enumerate() {
            let Ffn::Moe(m) = &layer.ffn else { continue };
            let p = profile.layers.iter().find(|l| l.layer == il).unwrap();
            let distinct = p.counts(Phase::Prefill).iter().filter(|&&c| c > 0).count();
            let w = &mut want[m.experts_device];
            w[Phase::Prefill as usize] += distinct as u64 * m.expert_bytes();
            w[Phase::Decode as usize] += 3 * m.routing.n_expert_used as u64 * m.expert_bytes();
        }
        let got: Vec<[u64; 2]> = model
            .devices
            .stats()
            .iter()
            .map(|(_, s)| s.expert_bytes)
            .collect();
        assert_eq!(got, want, "{stem}: [prefill, decode] bytes per device");
        assert!(
            want.iter().filter(|w| w[1] > 0).count() >= 2,
            "{stem}: {want:?}"
        );
    }
}

/// Per-expert placement (`-oe`) on a simulated device: the logits stay the all-CPU ones, the
/// hot experts are held against the device's budget, their reads are booked there (the cold
/// ones on the CPU) by what the routing telemetry saw, and the rows crossing to the device and
/// back are counted.
#[test]
fn experts_placed_one_by_one_on_a_sim() {
    use moxie_core::telemetry::Phase;
    let par = Parallel::new(2);
    for stem in ["deepseek2-tiny-Q4_K_M", "qwen3moe-tiny-Q4_K_M"] {
        let file = open(&fixtures().join(format!("models/{stem}.gguf")));
        let cpu = Model::load(Arc::clone(&file)).unwrap();
        let want = run(&cpu, &par);
        let n_expert = cpu.config.n_expert;
        let hot: Vec<usize> = (0..n_expert).filter(|e| e % 3 == 0).collect();
        let moe_layers: Vec<usize> = cpu.moe_layers().map(|(il, _)| il).collect();
        let placement = Placement {
            devices: Devices::with_sims(&[1 << 30]),
            tensors: HashMap::new(),
            experts: moe_layers
                .iter()
                .map(|&il| (il, (SIM0, hot.clone())))
                .collect(),
            expert_cache: None,
        };
        let model = Model::load_placed(Arc::clone(&file), &placement).unwrap();
        let got = run(&model, &par);
        assert!(got == want, "{stem}: logits differ from the all-CPU run");

        let profile = model.routing_profile().unwrap();
        let (mut cpu_reads, mut sim_reads, mut held) = ([0u64; 2], [0u64; 2], 0u64);
        for (il, m) in model.moe_layers() {
            let eb = m.expert_bytes();
            held += eb * hot.len() as u64;
            let p = profile.layers.iter().find(|l| l.layer == il).unwrap();
            for phase in [Phase::Prefill, Phase::Decode] {
                for (e, &c) in p.counts(phase).iter().enumerate() {
                    // A prompt batch reads a chosen expert once; a decode pass once per token.
                    let reads = if phase == Phase::Prefill {
                        (c > 0) as u64
                    } else {
                        c
                    };
                    let side = if e % 3 == 0 {
                        &mut sim_reads
                    } else {
                        &mut cpu_reads
                    };
                    side[phase as usize] += reads * eb;
                }
            }
        }
        let stats = model.devices.stats();
        assert_eq!(stats[CPU].1.expert_bytes, cpu_reads, "{stem}: CPU");
        assert_eq!(stats[SIM0].1.expert_bytes, sim_reads, "{stem}: sim0");
        assert!(sim_reads[1] > 0 && cpu_reads[1] > 0, "{stem}");
        assert_eq!(stats[SIM0].1.resident_bytes, held, "{stem}: held on sim0");
        assert!(
            stats[SIM0].1.copies_in > 0 && stats[SIM0].1.copies_out > 0,
            "{stem}"
        );
    }
}

/// The dynamic expert cache (`--expert-cache`) on a simulated device: the logits stay the
/// all-CPU ones, its slots are held against the device's budget, prompt batches compute nothing
/// in it, and decode hits are booked there. With a slot for every expert, the prompt batch
/// fills it with what the prompt used, so a decode step misses exactly the experts no token
/// chose before (counted independently, from the routing telemetry).
#[test]
fn the_expert_cache_on_a_sim() {
    use moxie_core::loader::CachePlacement;
    use moxie_core::telemetry::{CachePolicy, Phase};
    let par = Parallel::new(2);
    for stem in ["deepseek2-tiny-Q4_K_M", "qwen3moe-tiny-Q4_K_M"] {
        let file = open(&fixtures().join(format!("models/{stem}.gguf")));
        let cpu = Model::load(Arc::clone(&file)).unwrap();
        let want = run(&cpu, &par);
        let n_expert = cpu.config.n_expert;
        let moe_layers: Vec<usize> = cpu.moe_layers().map(|(il, _)| il).collect();
        for policy in [CachePolicy::Lru, CachePolicy::Lfu, CachePolicy::Decay] {
            let placement = Placement {
                devices: Devices::with_sims(&[1 << 30]),
                expert_cache: Some(CachePlacement {
                    device: SIM0,
                    policy,
                    layers: moe_layers
                        .iter()
                        .map(|&il| (il, (n_expert, None)))
                        .collect(),
                }),
                ..Default::default()
            };
            let model = Model::load_placed(Arc::clone(&file), &placement).unwrap();
            let got = run(&model, &par);
            assert!(got == want, "{stem}: logits differ from the all-CPU run");

            let profile = model.routing_profile().unwrap();
            let (mut held, mut misses, mut selections) = (0u64, [0u64; 2], [0u64; 2]);
            let (mut distinct_prefill, mut decode) = (0u64, 0u64);
            for (il, m) in model.moe_layers() {
                let eb = m.expert_bytes();
                held += eb * n_expert as u64;
                let p = profile.layers.iter().find(|l| l.layer == il).unwrap();
                let (pre, dec) = (p.counts(Phase::Prefill), p.counts(Phase::Decode));
                for e in 0..n_expert {
                    distinct_prefill += eb * (pre[e] > 0) as u64;
                    decode += eb * dec[e];
                    // First chosen while decoding: its first decode selection misses.
                    if pre[e] == 0 && dec[e] > 0 {
                        misses[1] += eb;
                        misses[0] += 1;
                    }
                    selections[1] += eb * dec[e];
                    selections[0] += dec[e];
                }
            }
            let stats = model.devices.stats();
            let (on_cpu, on_sim) = (stats[CPU].1.expert_bytes, stats[SIM0].1.expert_bytes);
            assert_eq!(on_sim[Phase::Prefill as usize], 0, "{stem}: prompt batch");
            assert_eq!(on_cpu[Phase::Prefill as usize], distinct_prefill, "{stem}");
            assert_eq!(on_cpu[Phase::Decode as usize], misses[1], "{stem}: misses");
            assert_eq!(
                on_sim[Phase::Decode as usize],
                decode - misses[1],
                "{stem}: hits"
            );
            assert!(on_sim[Phase::Decode as usize] > 0, "{stem}");
            assert_eq!(stats[SIM0].1.resident_bytes, held, "{stem}: held on sim0");
            let c = model.expert_cache_counts().unwrap();
            assert_eq!(c.lookups, selections[0], "{stem}: one lookup per selection");
            assert_eq!(c.lookups - c.hits, misses[0], "{stem}");
        }
    }
}
