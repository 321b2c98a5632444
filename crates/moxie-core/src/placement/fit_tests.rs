//! `--fit` on a small synthetic model (no files): a dense block 0 and five MoE blocks 1-5,
//! each block 100 MiB of attention, each MoE block 900 MiB of routed experts.

use moxie_gguf::TensorInfo;
use moxie_quant::GgmlType;

use super::*;
use crate::state::{KvTypes, LayerStateSpec, RowSpec};

const MIB: u64 = 1 << 20;

fn tensor(name: &str, bytes: u64) -> TensorInfo {
    TensorInfo {
        name: name.to_owned(),
        dims: vec![1],
        ty: GgmlType::F32,
        interleaved: false,
        split: 0,
        offset: 0,
        file_offset: 0,
        n_bytes: bytes,
    }
}

fn model() -> (ModelShape, Vec<TensorInfo>) {
    let mut tensors = vec![
        tensor("token_embd.weight", 50 * MIB),
        tensor("output.weight", 50 * MIB),
        tensor("output_norm.weight", MIB),
    ];
    for il in 0..6 {
        tensors.push(tensor(&format!("blk.{il}.attn_q.weight"), 100 * MIB));
        if il == 0 {
            tensors.push(tensor("blk.0.ffn_up.weight", 100 * MIB));
            continue;
        }
        tensors.push(tensor(&format!("blk.{il}.ffn_gate_inp.weight"), MIB));
        for p in ["gate", "up", "down"] {
            tensors.push(tensor(&format!("blk.{il}.ffn_{p}_exps.weight"), 300 * MIB));
        }
    }
    let rows = RowSpec {
        width: 64,
        head: 16,
    };
    let kv = LayerStateSpec {
        keys: Some(rows),
        values: Some(rows),
        ..Default::default()
    };
    let shape = ModelShape {
        arch: "test".into(),
        n_block: 6,
        n_nextn: 0,
        n_embd: 64,
        n_vocab: 1000,
        n_head: 4,
        head_q: 16,
        attn_kv_heads: 4,
        attn_head_k: 16,
        attn_head_v: 16,
        ffn_width: 64,
        n_ctx_train: Some(4096),
        mla: false,
        kv: vec![kv; 6],
    };
    (shape, tensors)
}

fn run() -> RunShape {
    RunShape {
        n_ctx: None,
        n_batch: 2048,
        n_ubatch: 512,
        kv_types: KvTypes::default(),
        n_seq: 1,
        n_threads: 2,
    }
}

fn fit(args: Vec<PlacementArg>, gpus: &[u64], sims: &[u64]) -> Plan {
    fit_with(
        PlacementOptions {
            args,
            fit: true,
            ..Default::default()
        },
        gpus,
        sims,
    )
}

fn fit_with(opts: PlacementOptions, gpus: &[u64], sims: &[u64]) -> Plan {
    let (shape, tensors) = model();
    let devices = device_list(64 << 30, gpus, sims);
    plan(&shape, &tensors, &opts, &devices, &run()).unwrap()
}

fn device_of<'a>(p: &'a Plan, tensor: &str) -> &'a str {
    let t = p
        .tensor(tensor)
        .unwrap_or_else(|| panic!("no tensor {tensor}"));
    &p.devices[t.device.expect("placed")].spec.name
}

/// MoE blocks whose experts are on `device`.
fn expert_blocks(p: &Plan, device: &str) -> Vec<usize> {
    let d = p.device_index(device).unwrap();
    p.layers
        .iter()
        .filter(|l| l.experts.iter().any(|&(e, _)| e == d))
        .map(|l| l.layer)
        .collect()
}

/// The GPU's bytes without experts: every block's attention and KV, the output layer,
/// compute and headroom.
fn base_gpu_bytes(p: &Plan) -> u64 {
    let gpu = &p.devices[1];
    gpu.total_bytes() - expert_blocks(p, &gpu.spec.name).len() as u64 * 900 * MIB
}

#[test]
fn expert_layers_go_by_default_priority_head_and_tail_alternating() {
    let roomy = fit(vec![], &[64 << 30], &[]);
    assert_eq!(expert_blocks(&roomy, "CUDA0"), [1, 2, 3, 4, 5]);
    let base = base_gpu_bytes(&roomy);

    // Room for two expert layers and a bit: blocks 1 and 5.
    let p = fit(vec![], &[base + 2 * 900 * MIB + 400 * MIB], &[]);
    assert!(p.fits, "{:?}", p.messages);
    assert_eq!(expert_blocks(&p, "CUDA0"), [1, 5]);
    assert_eq!(expert_blocks(&p, "CPU"), [2, 3, 4]);
    assert_eq!(
        p.describe(p.tensor("blk.5.ffn_up_exps.weight").unwrap().reason),
        "fit: expert layer"
    );
    assert_eq!(
        p.describe(p.tensor("blk.2.ffn_up_exps.weight").unwrap().reason),
        "fit: kept on CPU"
    );
    // Three: then the second.
    let p = fit(vec![], &[base + 3 * 900 * MIB + 400 * MIB], &[]);
    assert_eq!(expert_blocks(&p, "CUDA0"), [1, 2, 5]);
    // All attention stays on the GPU in both.
    assert!((0..6).all(|il| p.layers[il].device == Some(1)));
    assert_eq!(device_of(&p, "token_embd.weight"), "CPU");
    assert_eq!(device_of(&p, "output.weight"), "CUDA0");
}

#[test]
fn an_explicit_priority_comes_first() {
    let roomy = fit(vec![], &[64 << 30], &[]);
    let budget = base_gpu_bytes(&roomy) + 2 * 900 * MIB + 400 * MIB;
    let opts = PlacementOptions {
        fit: true,
        expert_priority: Some(vec![3, 4]),
        ..Default::default()
    };
    let p = fit_with(opts.clone(), &[budget], &[]);
    assert_eq!(expert_blocks(&p, "CUDA0"), [3, 4]);

    let bad = PlacementOptions {
        expert_priority: Some(vec![0]),
        ..opts.clone()
    };
    let (shape, tensors) = model();
    let e = plan(
        &shape,
        &tensors,
        &bad,
        &device_list(1 << 40, &[budget], &[]),
        &run(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("block 0, which has no routed experts"), "{e}");
    let twice = PlacementOptions {
        expert_priority: Some(vec![3, 3]),
        ..opts
    };
    let e = plan(
        &shape,
        &tensors,
        &twice,
        &device_list(1 << 40, &[budget], &[]),
        &run(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("twice"), "{e}");
}

#[test]
fn pins_are_never_moved() {
    let ot = |v: &str| PlacementArg::OverrideTensor(v.to_owned());
    let p = fit(
        vec![
            ot(r"blk\.1\.ffn_(gate|up|down)_exps=CPU"),
            ot(r"blk\.2\.attn_q=sim0"),
            ot(r"blk\.3\.ffn_up_exps=sim0"),
        ],
        &[64 << 30],
        &[8 << 30],
    );
    assert!(p.fits, "{:?}", p.messages);
    // Plenty of room on CUDA0, yet the pinned tensors stay where the rules put them.
    for p_ in ["gate", "up", "down"] {
        let name = format!("blk.1.ffn_{p_}_exps.weight");
        assert_eq!(device_of(&p, &name), "CPU");
        assert_eq!(p.describe(p.tensor(&name).unwrap().reason), "user rule 1");
    }
    assert_eq!(device_of(&p, "blk.2.attn_q.weight"), "sim0");
    assert_eq!(device_of(&p, "blk.3.ffn_up_exps.weight"), "sim0");
    // The rest of block 3's experts is placed as a unit of its own.
    assert_eq!(
        device_of(&p, "blk.3.ffn_gate_exps.weight"),
        device_of(&p, "blk.3.ffn_down_exps.weight")
    );
    assert_eq!(device_of(&p, "blk.4.ffn_up_exps.weight"), "CUDA0");
}

#[test]
fn a_gpu_over_budget_by_its_pins_does_not_fit_and_gets_nothing_else() {
    let p = fit(
        vec![PlacementArg::OverrideTensor(
            r"blk\.(1|2)\.ffn_up_exps=sim0".into(),
        )],
        &[64 << 30],
        &[MIB * 700],
    );
    assert!(!p.fits);
    let sim = &p.devices[p.device_index("sim0").unwrap()];
    assert_eq!(sim.weights_bytes, 600 * MIB);
    assert!(
        p.messages
            .iter()
            .any(|m| m.starts_with("sim0 is over its budget by")),
        "{:?}",
        p.messages
    );
    assert!(p.layers.iter().all(|l| l.device != p.device_index("sim0")));
}

#[test]
fn when_attention_does_not_fit_head_layers_stay_on_cpu() {
    // Room for the output layer and about three blocks' attention.
    let p = fit(vec![], &[GPU_HEADROOM_BYTES + 400 * MIB], &[]);
    assert!(p.fits, "{:?}", p.messages);
    let on_gpu: Vec<usize> = p
        .layers
        .iter()
        .filter(|l| l.device == Some(1))
        .map(|l| l.layer)
        .collect();
    assert!(!on_gpu.is_empty() && on_gpu.len() < 6, "{on_gpu:?}");
    // The offloaded blocks are the last ones, like a lower -ngl.
    assert_eq!(*on_gpu.last().unwrap(), 5);
    assert!(on_gpu.windows(2).all(|w| w[1] == w[0] + 1));
    assert_eq!(device_of(&p, "output.weight"), "CUDA0");
    assert_eq!(p.n_gpu_layers, 7 - on_gpu[0]);
    let msg = p
        .messages
        .iter()
        .find(|m| m.contains("like -ngl"))
        .expect("a message");
    assert!(
        msg.contains(&format!("like -ngl {}", p.n_gpu_layers)),
        "{msg}"
    );
    assert!(expert_blocks(&p, "CUDA0").is_empty());
    // KV follows the layer.
    let gpu = &p.devices[1];
    assert_eq!(gpu.kv_bytes, on_gpu.len() as u64 * MIB);
}

#[test]
fn unequal_gpus_fill_by_free_room_and_none_overflows() {
    let p = fit(vec![], &[3 << 30, 6 << 30], &[]);
    assert!(p.fits, "{:?}", p.messages);
    for d in &p.devices {
        assert!(d.total_bytes() <= d.spec.budget_bytes, "{}", d.spec.name);
    }
    let small = expert_blocks(&p, "CUDA0").len();
    let big = expert_blocks(&p, "CUDA1").len();
    assert!(big > small, "CUDA0 {small}, CUDA1 {big}");
    assert!(small >= 1);
}

#[test]
fn ngl_caps_what_the_fit_may_offload() {
    let opts = PlacementOptions {
        fit: true,
        n_gpu_layers: Some(3),
        ..Default::default()
    };
    // Slots 4, 5 and the output layer (6).
    let p = fit_with(opts, &[64 << 30], &[]);
    let on_gpu: Vec<usize> = p
        .layers
        .iter()
        .filter(|l| l.device == Some(1))
        .map(|l| l.layer)
        .collect();
    assert_eq!(on_gpu, [4, 5]);
    assert_eq!(expert_blocks(&p, "CUDA0"), [4, 5]);
    assert_eq!(p.n_gpu_layers, 3);
}

#[test]
fn without_gpus_everything_stays_on_cpu() {
    let p = fit(vec![], &[], &[]);
    assert!(p.fits);
    assert_eq!(p.devices.len(), 1);
    assert!(p.tensors.iter().all(|t| t.device == Some(0)));
    assert_eq!(p.n_gpu_layers, 0);
}

/// Settings a GPU's kernels do not handle are found at plan time, before any weight is read,
/// on CUDA devices and on the simulated ones standing for them (`MOXIE_SIM_CUDA`), not on
/// plain sims (which compute on the CPU): weight types without GPU kernels (one line per
/// type), a KV cache pair the attention kernel cannot read (f32 keys with f16 values).
#[test]
fn gpu_settings_are_checked_at_plan_time() {
    let (shape, mut tensors) = model();
    // Block 2's experts in a type the GPU kernels lack (a matrix, so it counts).
    for t in tensors
        .iter_mut()
        .filter(|t| t.name.starts_with("blk.2.ffn_"))
    {
        t.ty = GgmlType::IQ2_KT;
        t.dims = vec![256, 256];
    }
    let opts = PlacementOptions::default();
    let types = |k, v| RunShape {
        kv_types: KvTypes { k, v },
        ..run()
    };
    let cuda = device_list(64 << 30, &[64 << 30], &[]);
    let stand_in = vec![
        DeviceSpec::cpu(64 << 30),
        DeviceSpec::simulated_cuda(0, 64 << 30),
    ];
    let sim = device_list(64 << 30, &[], &[64 << 30]);
    for devices in [&cuda, &stand_in] {
        let p = plan(
            &shape,
            &tensors,
            &opts,
            devices,
            &types(GgmlType::F16, GgmlType::F16),
        )
        .unwrap();
        assert!(p.fits && !p.can_run());
        assert_eq!(p.unsupported.len(), 1, "{:?}", p.unsupported);
        let u = &p.unsupported[0];
        assert!(
            u.starts_with("CUDA0: 4 tensor(s) of type IQ2_KT") && u.contains("-ot"),
            "{u}"
        );
        let p = plan(
            &shape,
            &tensors,
            &opts,
            devices,
            &types(GgmlType::F32, GgmlType::F16),
        )
        .unwrap();
        assert_eq!(p.unsupported.len(), 2, "{:?}", p.unsupported);
        assert!(
            p.unsupported[1].contains("f32 / f16 KV cache (layers 0-5)"),
            "{:?}",
            p.unsupported
        );
        assert!(p
            .report()
            .contains("cannot run: CUDA0: a f32 / f16 KV cache"));
    }
    let p = plan(
        &shape,
        &tensors,
        &opts,
        &sim,
        &types(GgmlType::F32, GgmlType::F16),
    )
    .unwrap();
    assert!(
        p.unsupported.is_empty() && p.can_run(),
        "{:?}",
        p.unsupported
    );
}
