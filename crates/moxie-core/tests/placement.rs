//! Placement on the header-only DeepSeek-V3 (deepseek2, 61 blocks) and GLM-4.7 (glm4moe, 92
//! blocks + 1 MTP block) files: llama.cpp's assignment for the common flag combinations,
//! checked tensor by tensor and against the byte totals in the files' `.header.json`.

mod common;

use moxie_core::placement::{
    device_list, plan_for_file, DeviceSpec, PlacementArg, PlacementOptions, Plan, RunShape,
    SplitMode, TensorGroup,
};
use moxie_core::state::KvTypes;
use moxie_gguf::GgufFile;
use moxie_quant::GgmlType;
use serde_json::Value;

const DS: &str = "DeepSeek-V3-671B-Q4_K_M";
const GLM: &str = "GLM-4.7-355B-Q4_K_M";
const GIB: u64 = 1 << 30;

struct Model {
    file: GgufFile,
    json: Value,
}

impl Model {
    fn open(stem: &str) -> Model {
        let dir = common::fixtures().join("headers");
        let file = GgufFile::open_header_only(&dir.join(format!("{stem}.header.gguf"))).unwrap();
        let text = std::fs::read_to_string(dir.join(format!("{stem}.header.json"))).unwrap();
        Model {
            file,
            json: serde_json::from_str(&text).unwrap(),
        }
    }

    fn json_u64(&self, key: &str) -> u64 {
        self.json[key]
            .as_u64()
            .unwrap_or_else(|| panic!("{key} in header json"))
    }

    /// Routed-expert bytes of blocks `blocks` according to the header json.
    fn expert_bytes(&self, blocks: impl IntoIterator<Item = usize>) -> u64 {
        blocks
            .into_iter()
            .map(|il| self.json["layers"][il]["routed_experts"].as_u64().unwrap())
            .sum()
    }

    fn plan(&self, opts: &PlacementOptions, devices: &[DeviceSpec]) -> Plan {
        self.plan_run(opts, devices, &run(KvTypes::default()))
    }

    fn plan_run(&self, opts: &PlacementOptions, devices: &[DeviceSpec], run: &RunShape) -> Plan {
        plan_for_file(&self.file, opts, devices, run).unwrap()
    }

    fn try_plan(&self, opts: &PlacementOptions, devices: &[DeviceSpec]) -> String {
        plan_for_file(&self.file, opts, devices, &run(KvTypes::default()))
            .unwrap_err()
            .to_string()
    }
}

fn run(kv_types: KvTypes) -> RunShape {
    RunShape {
        n_ctx: Some(4096),
        n_batch: 2048,
        n_ubatch: 512,
        kv_types,
        n_seq: 1,
        n_threads: 2,
    }
}

fn ot(v: &str) -> PlacementArg {
    PlacementArg::OverrideTensor(v.to_owned())
}

fn opts(args: Vec<PlacementArg>, ngl: Option<usize>) -> PlacementOptions {
    PlacementOptions {
        args,
        n_gpu_layers: ngl,
        ..Default::default()
    }
}

fn gpus(budgets: &[u64]) -> Vec<DeviceSpec> {
    device_list(1024 * GIB, budgets, &[])
}

fn dev<'a>(p: &'a Plan, tensor: &str) -> &'a str {
    let t = p
        .tensor(tensor)
        .unwrap_or_else(|| panic!("no tensor {tensor}"));
    t.device
        .map_or("unused", |d| p.devices[d].spec.name.as_str())
}

/// Bytes of `group` placed on `device`.
fn group_bytes(p: &Plan, group: TensorGroup, device: &str) -> u64 {
    let d = p.device_index(device).unwrap();
    p.tensors
        .iter()
        .filter(|t| t.group == group && t.device == Some(d))
        .map(|t| t.bytes)
        .sum()
}

fn placed_bytes(p: &Plan) -> u64 {
    p.devices.iter().map(|d| d.weights_bytes).sum()
}

/// A tensor every block has: DeepSeek's MLA down-projection, GLM's query projection.
fn attn(stem: &str, il: usize) -> String {
    if stem == DS {
        format!("blk.{il}.attn_kv_a_mqa.weight")
    } else {
        format!("blk.{il}.attn_q.weight")
    }
}

#[test]
fn ot_rules_pin_experts_per_gpu_and_send_the_rest_to_cpu() {
    for stem in [DS, GLM] {
        let m = Model::open(stem);
        let o = opts(
            vec![
                ot(r"blk\.(3|4|5|6|7)\.ffn_(gate|up|down)_exps\.=CUDA0"),
                ot(r"blk\.(8|9|10|11|12)\.ffn_(gate|up|down)_exps\.=CUDA1"),
                ot(r"ffn_(gate|up|down)_exps\.=CPU"),
            ],
            Some(999),
        );
        let p = m.plan(&o, &gpus(&[80 * GIB, 80 * GIB]));
        assert_eq!(dev(&p, "blk.4.ffn_up_exps.weight"), "CUDA0", "{stem}");
        assert_eq!(dev(&p, "blk.9.ffn_down_exps.weight"), "CUDA1", "{stem}");
        assert_eq!(dev(&p, "blk.20.ffn_gate_exps.weight"), "CPU", "{stem}");
        // Equal budgets: slots below (n_block + 1) / 2 go to CUDA0.
        assert_eq!(dev(&p, &attn(stem, 20)), "CUDA0", "{stem}");
        assert_eq!(dev(&p, &attn(stem, 50)), "CUDA1", "{stem}");
        assert_eq!(dev(&p, "blk.20.ffn_gate_inp.weight"), "CUDA0", "{stem}");
        assert_eq!(dev(&p, "token_embd.weight"), "CPU", "{stem}");
        assert_eq!(dev(&p, "output.weight"), "CUDA1", "{stem}");
        assert_eq!(
            p.describe(p.tensor("blk.4.ffn_up_exps.weight").unwrap().reason),
            "user rule 1"
        );
        assert_eq!(
            p.describe(p.tensor("blk.20.ffn_up_exps.weight").unwrap().reason),
            "user rule 3"
        );
        assert_eq!(
            p.describe(p.tensor(&attn(stem, 20)).unwrap().reason),
            "-ngl layer split"
        );

        let main = m.json_u64("routed_expert_bytes_main_graph");
        let cuda0 = m.expert_bytes(3..8);
        let cuda1 = m.expert_bytes(8..13);
        assert_eq!(
            group_bytes(&p, TensorGroup::RoutedExperts, "CUDA0"),
            cuda0,
            "{stem}"
        );
        assert_eq!(
            group_bytes(&p, TensorGroup::RoutedExperts, "CUDA1"),
            cuda1,
            "{stem}"
        );
        assert_eq!(
            group_bytes(&p, TensorGroup::RoutedExperts, "CPU"),
            main - cuda0 - cuda1
        );
        // Everything llama.cpp loads is somewhere, the MTP block nowhere.
        assert_eq!(placed_bytes(&p), m.json_u64("main_graph_bytes"), "{stem}");
        assert_eq!(p.rules.iter().map(|r| r.tensors).collect::<Vec<_>>(), {
            let n_moe = p.layers.iter().filter(|l| !l.experts.is_empty()).count();
            vec![15, 15, 3 * n_moe - 30]
        });
    }
}

#[test]
fn one_ot_value_holds_several_rules() {
    for stem in [DS, GLM] {
        let m = Model::open(stem);
        let o = opts(
            vec![ot(
                r"blk\.(3|4|5)\.ffn_(gate|up|down)_exps\.=CUDA0,exps=CPU",
            )],
            Some(999),
        );
        let p = m.plan(&o, &gpus(&[24 * GIB]));
        assert_eq!(dev(&p, "blk.4.ffn_gate_exps.weight"), "CUDA0");
        assert_eq!(dev(&p, "blk.6.ffn_gate_exps.weight"), "CPU");
        assert_eq!(dev(&p, "blk.6.ffn_gate_inp.weight"), "CUDA0");
        assert_eq!(dev(&p, "blk.6.ffn_up_shexp.weight"), "CUDA0");
        assert_eq!(dev(&p, "output.weight"), "CUDA0");
        let on_gpu = m.expert_bytes(3..6);
        assert_eq!(group_bytes(&p, TensorGroup::RoutedExperts, "CUDA0"), on_gpu);
        assert_eq!(
            group_bytes(&p, TensorGroup::RoutedExperts, "CPU"),
            m.json_u64("routed_expert_bytes_main_graph") - on_gpu
        );
    }
}

#[test]
fn cpu_moe_keeps_every_routed_expert_on_the_cpu() {
    for stem in [DS, GLM] {
        let m = Model::open(stem);
        let p = m.plan(&opts(vec![PlacementArg::CpuMoe], None), &gpus(&[24 * GIB]));
        assert_eq!(
            group_bytes(&p, TensorGroup::RoutedExperts, "CPU"),
            m.json_u64("routed_expert_bytes_main_graph"),
            "{stem}"
        );
        assert_eq!(group_bytes(&p, TensorGroup::RoutedExperts, "CUDA0"), 0);
        assert_eq!(
            p.describe(p.tensor("blk.30.ffn_down_exps.weight").unwrap().reason),
            "--cpu-moe"
        );
        // Everything else of the main graph is on the GPU, except the input layer.
        let cuda0 = &p.devices[1];
        let input = p.tensor("token_embd.weight").unwrap().bytes;
        assert_eq!(
            cuda0.weights_bytes,
            m.json_u64("main_graph_bytes") - m.json_u64("routed_expert_bytes_main_graph") - input,
            "{stem}"
        );
        assert_eq!(placed_bytes(&p), m.json_u64("main_graph_bytes"));
    }
    // DeepSeek-V3 has no MTP block in the file: all routed experts count.
    let ds = Model::open(DS);
    assert_eq!(
        ds.json["bytes_by_role"]["routed_experts"].as_u64(),
        Some(ds.json_u64("routed_expert_bytes_main_graph"))
    );
}

#[test]
fn the_mtp_block_is_never_loaded() {
    let m = Model::open(GLM);
    // Not even when a rule names it.
    let p = m.plan(
        &opts(vec![ot(r"blk\.92\.=CUDA0"), PlacementArg::CpuMoe], None),
        &gpus(&[24 * GIB]),
    );
    let block_92: Vec<_> = p.tensors.iter().filter(|t| t.layer == Some(92)).collect();
    assert!(block_92.len() > 10);
    assert!(block_92.iter().all(|t| t.device.is_none() && t.bytes == 0));
    assert_eq!(p.describe(block_92[0].reason), "unused nextn");
    assert_eq!(p.rules[0].tensors, 0);
    assert!(p
        .messages
        .iter()
        .any(|m| m.contains("user rule 1") && m.contains("placed no tensor")));
    assert_eq!(p.layers[92].device, None);
    assert_eq!(p.layers[92].kv_bytes, 0);
    let unused: u64 = m.json_u64("tensor_data_bytes") - m.json_u64("main_graph_bytes");
    assert_eq!(unused, m.json_u64("nextn_block_bytes"));
    assert_eq!(placed_bytes(&p), m.json_u64("main_graph_bytes"));
}

#[test]
fn n_cpu_moe_on_a_layer_split_piles_the_kept_experts_on_the_last_gpu() {
    let budgets = [24 * GIB, 24 * GIB];
    let o = PlacementOptions {
        args: vec![PlacementArg::NCpuMoe(64)],
        split_mode: SplitMode::Layer,
        ..Default::default()
    };
    // DeepSeek-V3 has 61 blocks: every expert stays on the CPU and the cards hold the rest.
    let ds = Model::open(DS);
    let p = ds.plan(&o, &gpus(&budgets));
    assert_eq!(
        group_bytes(&p, TensorGroup::RoutedExperts, "CPU"),
        ds.json_u64("routed_expert_bytes_main_graph")
    );
    assert_eq!(
        p.describe(p.tensor("blk.60.ffn_up_exps.weight").unwrap().reason),
        "--n-cpu-moe 64"
    );
    assert!(p.fits, "{:?}", p.messages);

    // GLM-4.7: blocks 64-91 keep their experts on the card their layer splits to; with equal
    // budgets that is CUDA1 for blocks 47 and up (94 slots), so CUDA1 overflows.
    let glm = Model::open(GLM);
    let p = glm.plan(&o, &gpus(&budgets));
    assert_eq!(dev(&p, "blk.63.ffn_up_exps.weight"), "CPU");
    assert_eq!(dev(&p, "blk.64.ffn_up_exps.weight"), "CUDA1");
    assert_eq!(dev(&p, &attn(GLM, 46)), "CUDA0");
    assert_eq!(dev(&p, &attn(GLM, 47)), "CUDA1");
    assert_eq!(
        group_bytes(&p, TensorGroup::RoutedExperts, "CUDA1"),
        glm.expert_bytes(64..92)
    );
    assert_eq!(group_bytes(&p, TensorGroup::RoutedExperts, "CUDA0"), 0);
    assert!(!p.fits);
    let cuda1 = &p.devices[2];
    assert!(!cuda1.fits() && p.devices[1].fits());
    let msg = p
        .messages
        .iter()
        .find(|m| m.starts_with("CUDA1 is over its budget by"))
        .unwrap();
    assert!(msg.contains("-ot \"blk\\.(64|65|"), "{msg}");
}

#[test]
fn rules_apply_in_command_line_order() {
    let m = Model::open(DS);
    let pin = ot(r"blk\.3\.ffn_up_exps=CUDA0");
    let devices = gpus(&[24 * GIB]);
    let p = m.plan(
        &opts(vec![PlacementArg::CpuMoe, pin.clone()], None),
        &devices,
    );
    assert_eq!(dev(&p, "blk.3.ffn_up_exps.weight"), "CPU");
    assert_eq!(p.rules[1].tensors, 0);
    let p = m.plan(
        &opts(vec![pin.clone(), PlacementArg::CpuMoe], None),
        &devices,
    );
    assert_eq!(dev(&p, "blk.3.ffn_up_exps.weight"), "CUDA0");
    assert_eq!(dev(&p, "blk.3.ffn_down_exps.weight"), "CPU");
    let p = m.plan(
        &opts(vec![PlacementArg::NCpuMoe(5), pin.clone()], None),
        &devices,
    );
    assert_eq!(dev(&p, "blk.3.ffn_up_exps.weight"), "CPU");
    let p = m.plan(&opts(vec![pin, PlacementArg::NCpuMoe(5)], None), &devices);
    assert_eq!(dev(&p, "blk.3.ffn_up_exps.weight"), "CUDA0");
    assert_eq!(dev(&p, "blk.4.ffn_up_exps.weight"), "CPU");
    assert_eq!(dev(&p, "blk.5.ffn_up_exps.weight"), "CUDA0");
}

#[test]
fn ngl_counts_layer_slots_back_from_the_output_layer() {
    // llama.cpp 0c1e57098: slots are the blocks then the output layer; -ngl N puts slots
    // >= n_block + 1 - N on the GPU.
    let ds = Model::open(DS);
    let p = ds.plan(&opts(vec![], Some(10)), &gpus(&[80 * GIB]));
    assert_eq!(dev(&p, &attn(DS, 51)), "CPU");
    assert_eq!(dev(&p, "blk.51.ffn_up_exps.weight"), "CPU");
    assert_eq!(dev(&p, &attn(DS, 52)), "CUDA0");
    assert_eq!(dev(&p, "blk.60.ffn_up_exps.weight"), "CUDA0");
    assert_eq!(dev(&p, "output.weight"), "CUDA0");
    assert_eq!(dev(&p, "token_embd.weight"), "CPU");
    assert_eq!(p.layers[51].device, Some(0));
    assert_eq!(p.layers[52].device, Some(1));
    // KV follows the layer: 9 blocks of MLA cache on the GPU.
    assert_eq!(p.devices[1].kv_bytes, 9 * 4096 * 576 * 2);
    assert_eq!(p.devices[0].kv_bytes, 52 * 4096 * 576 * 2);

    // GLM-4.7: the MTP block 92 takes a slot, so -ngl 10 offloads blocks 84-91.
    let glm = Model::open(GLM);
    let p = glm.plan(&opts(vec![], Some(10)), &gpus(&[80 * GIB]));
    assert_eq!(dev(&p, &attn(GLM, 83)), "CPU");
    assert_eq!(dev(&p, &attn(GLM, 84)), "CUDA0");
    assert_eq!(dev(&p, "output.weight"), "CUDA0");
    assert_eq!(p.devices[1].kv_bytes, 8 * 4096 * 8 * 128 * 2 * 2);
    let p = glm.plan(&opts(vec![], Some(1)), &gpus(&[80 * GIB]));
    assert_eq!(dev(&p, "output.weight"), "CUDA0");
    assert_eq!(dev(&p, &attn(GLM, 91)), "CPU");
    let p = glm.plan(&opts(vec![], Some(0)), &gpus(&[80 * GIB]));
    assert!(p.devices[1].total_bytes() == 0 && p.devices[0].weights_bytes == placed_bytes(&p));
    // No GPU given: everything on the CPU, whatever -ngl says.
    let p = glm.plan(&opts(vec![], Some(999)), &gpus(&[]));
    assert_eq!(p.devices.len(), 1);
    assert_eq!(p.n_gpu_layers, 0);
    assert_eq!(p.devices[0].weights_bytes, glm.json_u64("main_graph_bytes"));
}

#[test]
fn tensor_split_3_1() {
    let o = PlacementOptions {
        tensor_split: vec![3.0, 1.0],
        ..Default::default()
    };
    // Slot il goes to CUDA0 while il / (n_block + 1) < 0.75.
    for (stem, last_on_0) in [(DS, 46), (GLM, 70)] {
        let m = Model::open(stem);
        let p = m.plan(&o, &gpus(&[24 * GIB, 24 * GIB]));
        assert_eq!(dev(&p, &attn(stem, last_on_0)), "CUDA0", "{stem}");
        assert_eq!(
            dev(&p, &format!("blk.{last_on_0}.ffn_up_exps.weight")),
            "CUDA0"
        );
        assert_eq!(dev(&p, &attn(stem, last_on_0 + 1)), "CUDA1", "{stem}");
        assert_eq!(dev(&p, "output.weight"), "CUDA1");
    }
    // Without -ts the budgets decide: 3:1 budgets give the same split.
    let p = Model::open(DS).plan(&PlacementOptions::default(), &gpus(&[72 * GIB, 24 * GIB]));
    assert_eq!(dev(&p, &attn(DS, 46)), "CUDA0");
    assert_eq!(dev(&p, &attn(DS, 47)), "CUDA1");
}

#[test]
fn split_mode_none_uses_the_main_gpu_only() {
    let m = Model::open(DS);
    let o = PlacementOptions {
        split_mode: SplitMode::None,
        main_gpu: 1,
        args: vec![PlacementArg::CpuMoe],
        ..Default::default()
    };
    let p = m.plan(&o, &gpus(&[24 * GIB, 24 * GIB]));
    assert!(p.layers.iter().all(|l| l.device == Some(2)));
    assert_eq!(dev(&p, "output.weight"), "CUDA1");
    assert_eq!(p.devices[1].total_bytes(), 0);
    let bad = PlacementOptions { main_gpu: 2, ..o };
    let e = m.try_plan(&bad, &gpus(&[24 * GIB, 24 * GIB]));
    assert!(e.contains("-mg 2: there are only 2 GPU(s)"), "{e}");
}

#[test]
fn kv_cache_bytes_follow_the_cache_types() {
    let ds = Model::open(DS);
    let glm = Model::open(GLM);
    let devices = gpus(&[]);
    let f16 = ds.plan_run(
        &PlacementOptions::default(),
        &devices,
        &run(KvTypes::default()),
    );
    // MLA caches kv_lora_rank + rope = 576 values per position, keys only.
    assert_eq!(f16.devices[0].kv_bytes, 61 * 4096 * 576 * 2);
    let q8 = KvTypes {
        k: GgmlType::Q8_0,
        v: GgmlType::Q8_0,
    };
    let p = ds.plan_run(&PlacementOptions::default(), &devices, &run(q8));
    assert_eq!(p.devices[0].kv_bytes, 61 * 4096 * (576 / 32 * 34));
    // GQA: 8 kv heads x 128 for keys and values, 92 main blocks.
    let p = glm.plan_run(
        &PlacementOptions::default(),
        &devices,
        &run(KvTypes::default()),
    );
    assert_eq!(p.devices[0].kv_bytes, 92 * 4096 * 2 * 8 * 128 * 2);
    let mixed = KvTypes {
        k: GgmlType::Q8_0,
        v: GgmlType::F32,
    };
    let p = glm.plan_run(&PlacementOptions::default(), &devices, &run(mixed));
    assert_eq!(
        p.devices[0].kv_bytes,
        92 * 4096 * (8 * 4 * 34 + 8 * 128 * 4)
    );
    // The context is padded to 256 positions, as llama.cpp does.
    let odd = RunShape {
        n_ctx: Some(1000),
        ..run(KvTypes::default())
    };
    let p = ds.plan_run(&PlacementOptions::default(), &devices, &odd);
    assert_eq!((p.n_ctx, p.kv_positions), (1000, 1024));
    assert_eq!(p.devices[0].kv_bytes, 61 * 1024 * 576 * 2);
}

#[test]
fn bad_rules_are_clear_errors() {
    let m = Model::open(DS);
    let devices = gpus(&[24 * GIB]);
    let e = m.try_plan(&opts(vec![ot("exps=CUDA1")], None), &devices);
    assert!(
        e.contains("unknown buffer 'CUDA1'") && e.contains("devices: CPU, CUDA0"),
        "{e}"
    );
    let e = m.try_plan(&opts(vec![ot(r"blk\.(3=CPU")], None), &devices);
    assert!(e.contains(r"bad regular expression 'blk\.(3'"), "{e}");
    let bad_ts = PlacementOptions {
        tensor_split: vec![1.0, 1.0],
        ..Default::default()
    };
    let e = m.try_plan(&bad_ts, &devices);
    assert!(e.contains("-ts gives 2 proportions for 1 GPU"), "{e}");
}

/// GLM-5.1 (744B, `glm-dsa`, which moxie cannot run) from the header-only generator: its tensor
/// index plans like the others — `--cpu-moe` keeps every routed expert in RAM and the MTP block
/// unloaded, and `--fit` on two unequal GPUs fills both within their budgets.
#[test]
fn glm_5_1_plans_from_its_generated_header() {
    let dir = std::env::var_os("CARGO_TARGET_TMPDIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let path = dir.join(format!("glm-5.1-plan-{}.gguf", std::process::id()));
    moxie_core::synth::write_header_only("glm-5.1-744b", &path).unwrap();
    let file = GgufFile::open_header_only(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let routed: u64 = file
        .tensors()
        .iter()
        .filter(|t| t.name.contains("_exps") && !t.name.starts_with("blk.78."))
        .map(|t| t.file_range().end - t.file_range().start)
        .sum();

    let cpu_moe = plan_for_file(
        &file,
        &opts(vec![PlacementArg::CpuMoe], Some(999)),
        &gpus(&[96 * GIB]),
        &run(KvTypes::default()),
    )
    .unwrap();
    assert_eq!(
        group_bytes(&cpu_moe, TensorGroup::RoutedExperts, "CPU"),
        routed
    );
    assert_eq!(dev(&cpu_moe, "blk.78.ffn_up_exps.weight"), "unused");
    assert_eq!(dev(&cpu_moe, "blk.40.attn_kv_a_mqa.weight"), "CUDA0");
    assert!(cpu_moe.fits, "{:?}", cpu_moe.messages);
    // At 131072 positions the GPU's compute holds the indexer's scores of one ubatch over the
    // cache (what its dsa_scores kernel fills), and nothing else grows with the context.
    let compute = |n_ctx: usize| {
        let long = RunShape {
            n_ctx: Some(n_ctx),
            ..run(KvTypes::default())
        };
        let opts = opts(vec![PlacementArg::CpuMoe], Some(999));
        let p = plan_for_file(&file, &opts, &gpus(&[96 * GIB]), &long).unwrap();
        p.devices[1].compute_bytes
    };
    assert_eq!(compute(131072) - compute(4096), 512 * 4 * (131072 - 4096));

    let fit = PlacementOptions {
        fit: true,
        ..Default::default()
    };
    let p = plan_for_file(
        &file,
        &fit,
        &gpus(&[24 * GIB, 48 * GIB]),
        &run(KvTypes::default()),
    )
    .unwrap();
    assert!(p.fits, "{:?}", p.messages);
    for d in &p.devices {
        assert!(
            d.total_bytes() <= d.spec.budget_bytes,
            "{} over budget",
            d.spec.name
        );
    }
    let on = |name: &str| group_bytes(&p, TensorGroup::RoutedExperts, name);
    assert!(on("CUDA1") > on("CUDA0") && on("CUDA0") > 0);
}

/// `file`'s header with metadata `changes` applied (a key set to `Some` value, or removed
/// with `None`), opened header-only.
fn with_metadata(file: &GgufFile, changes: &[(&str, Option<moxie_gguf::Value>)]) -> GgufFile {
    let mut w = moxie_gguf::GgufWriter::new();
    for (k, v) in file.metadata().iter() {
        match changes.iter().find(|(key, _)| *key == k) {
            Some((_, Some(new))) => w.add(k, new.clone()).unwrap(),
            Some((_, None)) => {}
            None => w.add(k, v.clone()).unwrap(),
        }
    }
    for (k, v) in changes {
        if let (Some(v), false) = (v, file.metadata().contains_key(k)) {
            w.add(k, v.clone()).unwrap();
        }
    }
    for t in file.tensors() {
        w.add_tensor_info(&t.name, &t.dims, t.ty).unwrap();
    }
    GgufFile::from_bytes_with("changed.gguf", w.header_bytes(), true).unwrap()
}

fn glm_5_1_header() -> GgufFile {
    let dir = std::env::var_os("CARGO_TARGET_TMPDIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let path = dir.join(format!(
        "glm-5.1-state-{}-{:?}.gguf",
        std::process::id(),
        std::thread::current().id()
    ));
    moxie_core::synth::write_header_only("glm-5.1-744b", &path).unwrap();
    let file = GgufFile::open_header_only(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    file
}

/// GLM-5.1 (`glm-dsa`): llama.cpp's DSA cache holds, per position and per layer with a full
/// indexer, one f16 key head of `indexer.key_length` = 128 values next to MLA's 512 + 64
/// latent; the MTP block (78) keeps nothing. `-ngl 999 --cpu-moe` puts the indexer's weights on
/// the GPUs with their layer's attention.
#[test]
fn glm_5_1_counts_the_indexer_key_cache_of_its_full_indexer_layers() {
    let file = glm_5_1_header();
    let p = plan_for_file(
        &file,
        &opts(vec![PlacementArg::CpuMoe], Some(999)),
        &gpus(&[24 * GIB, 24 * GIB]),
        &run(KvTypes::default()),
    )
    .unwrap();
    let (kv, state) = (4096 * (512 + 64) * 2, 4096 * 128 * 2);
    for l in &p.layers[..78] {
        assert_eq!(
            (l.kv_bytes, l.state_bytes),
            (kv, state),
            "block {}",
            l.layer
        );
    }
    let mtp = &p.layers[78];
    assert_eq!((mtp.device, mtp.kv_bytes, mtp.state_bytes), (None, 0, 0));
    assert!(mtp.always_used.is_empty() && mtp.experts.is_empty());
    let mut n_indexer = 0;
    for t in &p.tensors {
        if t.layer == Some(78) {
            assert_eq!((t.device, t.bytes), (None, 0), "{}", t.name);
        } else if t.name.contains(".indexer.") {
            n_indexer += 1;
            assert_eq!(t.role, moxie_core::inventory::Role::Indexer);
            let il = t.layer.unwrap();
            assert_eq!(t.device, p.layers[il].device, "{}", t.name);
            assert_eq!(
                dev(&p, &t.name),
                dev(&p, &format!("blk.{il}.attn_kv_a_mqa.weight"))
            );
            assert!(dev(&p, &t.name).starts_with("CUDA"), "{}", t.name);
        }
    }
    assert_eq!(n_indexer, 78 * 5);
    // Per device: the layers it runs.
    for (d, use_) in p.devices.iter().enumerate() {
        let n = p.layers.iter().filter(|l| l.device == Some(d)).count() as u64;
        assert_eq!((use_.kv_bytes, use_.state_bytes), (n * kv, n * state));
    }
    assert_eq!(p.devices[0].state_bytes, 0);
    assert!(p.devices[1].state_bytes > 0 && p.devices[2].state_bytes > 0);

    // Two server slots with q8_0 keys: each slot has its own cache.
    let q8 = KvTypes {
        k: GgmlType::Q8_0,
        v: GgmlType::F16,
    };
    let slots = RunShape {
        n_seq: 2,
        ..run(q8)
    };
    let p = plan_for_file(&file, &PlacementOptions::default(), &gpus(&[]), &slots).unwrap();
    assert_eq!(p.layers[5].kv_bytes, 2 * 4096 * (576 / 32 * 34));
    assert_eq!(p.layers[5].state_bytes, 2 * 4096 * (128 / 32 * 34));
}

/// `glm-dsa.attention.indexer.types` marks the layers whose indexer is full (1) or shares
/// another layer's selection (0): only full ones have an indexer key cache. Without the key a
/// context of 2^20 or more means GLM-5.2's pattern (blocks 0, 1 and every fourth from 2).
#[test]
fn glm_dsa_caches_indexer_keys_only_on_full_indexer_layers() {
    let file = glm_5_1_header();
    let devices = gpus(&[]);
    let state_layers = |f: &GgufFile| -> Vec<usize> {
        let p = plan_for_file(
            f,
            &PlacementOptions::default(),
            &devices,
            &run(KvTypes::default()),
        )
        .unwrap();
        p.layers
            .iter()
            .filter(|l| l.state_bytes > 0)
            .map(|l| l.layer)
            .collect()
    };
    assert_eq!(state_layers(&file), (0..78).collect::<Vec<_>>());

    let types: Vec<u32> = (0..78).map(|il| u32::from(il % 3 == 0)).collect();
    let marked = with_metadata(
        &file,
        &[("glm-dsa.attention.indexer.types", Some(types.into()))],
    );
    assert_eq!(
        state_layers(&marked),
        (0..78).filter(|il| il % 3 == 0).collect::<Vec<_>>()
    );

    let glm_5_2 = with_metadata(
        &file,
        &[("glm-dsa.context_length", Some(1_048_576u32.into()))],
    );
    let expected: Vec<usize> = [0, 1].into_iter().chain((2..78).step_by(4)).collect();
    assert_eq!(state_layers(&glm_5_2), expected);

    let short = with_metadata(
        &file,
        &[(
            "glm-dsa.attention.indexer.types",
            Some(vec![1u32; 3].into()),
        )],
    );
    let e = plan_for_file(
        &short,
        &PlacementOptions::default(),
        &devices,
        &run(KvTypes::default()),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("glm-dsa.attention.indexer.types") && e.contains("3 entries, expected 78"),
        "{e}"
    );
}

/// qwen3next-tiny: blocks 0-2 are gated DeltaNet (recurrent), block 3 has full attention
/// (`full_attention_interval` 4). Only block 3 has a KV cache; the others keep llama.cpp's
/// recurrent state per sequence, f32: (conv_kernel - 1) * (inner + 2 * groups * state) =
/// 3 * (256 + 2 * 2 * 64) = 1536 convolution values and state * inner = 64 * 256 = 16384
/// (4 value heads x 64 x 64) SSM values. With `-ngl 999 --cpu-moe` the DeltaNet weights go to
/// the GPU like attention.
#[test]
fn qwen3next_keeps_kv_on_full_attention_layers_and_recurrent_state_on_the_others() {
    let path = common::fixtures().join("models/qwen3next-tiny-F32.gguf");
    let file = GgufFile::open_header_only(&path).unwrap();
    let slots = RunShape {
        n_seq: 3,
        ..run(KvTypes::default())
    };
    let devices = device_list(64 * GIB, &[], &[GIB]);
    let p = plan_for_file(
        &file,
        &opts(vec![PlacementArg::CpuMoe], Some(999)),
        &devices,
        &slots,
    )
    .unwrap();
    let recurrent: u64 = 3 * 4 * (3 * (256 + 2 * 2 * 64) + 64 * 256);
    assert_eq!(recurrent, 3 * 71_680);
    // 2 kv heads x 64 keys and as many values, f16, 4096 positions, 3 slots.
    let kv: u64 = 3 * 4096 * (2 * 64 + 2 * 64) * 2;
    let per_layer: Vec<(u64, u64)> = p
        .layers
        .iter()
        .map(|l| (l.kv_bytes, l.state_bytes))
        .collect();
    assert_eq!(
        per_layer,
        [(0, recurrent), (0, recurrent), (0, recurrent), (kv, 0)]
    );
    let sim = p.device_index("sim0").unwrap();
    assert_eq!(p.devices[sim].kv_bytes, kv);
    assert_eq!(p.devices[sim].state_bytes, 3 * recurrent);
    for t in &p.tensors {
        if t.name.contains(".ssm_") {
            assert_eq!(t.role, moxie_core::inventory::Role::Recurrent, "{}", t.name);
            assert_eq!(dev(&p, &t.name), "sim0", "{}", t.name);
        }
        if t.name.contains("ffn_gate_inp_shexp") {
            assert_eq!(t.group, TensorGroup::AlwaysUsed, "{}", t.name);
            assert_eq!(dev(&p, &t.name), "sim0", "{}", t.name);
        }
    }

    // `attention.recurrent_layers` (llama.cpp's saver writes it instead of the interval)
    // takes precedence: here blocks 1 and 3 are recurrent.
    let flags = vec![false, true, false, true];
    let marked = with_metadata(
        &file,
        &[("qwen3next.attention.recurrent_layers", Some(flags.into()))],
    );
    let p = plan_for_file(&marked, &PlacementOptions::default(), &devices, &slots).unwrap();
    let per_layer: Vec<(u64, u64)> = p
        .layers
        .iter()
        .map(|l| (l.kv_bytes, l.state_bytes))
        .collect();
    assert_eq!(
        per_layer,
        [(kv, 0), (0, recurrent), (kv, 0), (0, recurrent)]
    );
}

/// Long contexts plan (issue 18): DeepSeek-V3 at 131072 positions with one 24 GiB card
/// (`-ngl 999 --cpu-moe -ctk q8_0`) fits, and the compute buffers are what the kernels hold,
/// whatever the context: per ubatch the activations, the logits where the output layer runs,
/// and on the CPU one tile of batched attention per thread (`batch_scratch_bytes`, which a
/// unit test of the kernel checks against the buffers it used). No score matrix over the
/// cache (ubatch x 4 B x 128 heads x 131072 = 32 GiB per device before).
#[test]
fn long_context_plans_hold_no_score_matrix() {
    let ds = Model::open(DS);
    let q8 = KvTypes {
        k: GgmlType::Q8_0,
        v: GgmlType::F16,
    };
    let devices = device_list(512 * GIB, &[24 * GIB], &[]);
    let opts = opts(vec![PlacementArg::CpuMoe], Some(999));
    // DeepSeek-V3: hidden 7168, 128 heads over MLA's one latent kv head (keys 512 + 64 rope
    // wide, values the 512 latent), 8 of 256 experts of 2048 plus one shared, 129280 tokens.
    let ub = 512u64;
    let activations = ub * 4 * (4 * 7168 + 128 * 576 + 128 * 512 + 3 * (8 * 2048 + 2048));
    let logits = ub * 4 * 129280;
    let cpu_attention = 32 * moxie_core::batch_scratch_bytes(128, 1, 576, 512);
    for n_ctx in [4096, 131072] {
        let long = RunShape {
            n_ctx: Some(n_ctx),
            n_threads: 32,
            ..run(q8)
        };
        let p = ds.plan_run(&opts, &devices, &long);
        assert!(p.fits, "{n_ctx}: {:?}", p.messages);
        let (cpu, gpu) = (&p.devices[0], &p.devices[1]);
        assert_eq!(cpu.compute_bytes, activations + cpu_attention, "{n_ctx}");
        assert_eq!(gpu.compute_bytes, activations + logits, "{n_ctx}");
        // The cache itself: 61 layers of (512 + 64) q8_0 keys per position.
        assert_eq!(gpu.kv_bytes, 61 * n_ctx as u64 * (576 / 32 * 34));
        assert!(
            gpu.total_bytes() < 16 * GIB,
            "{n_ctx}: {}",
            gpu.total_bytes()
        );
    }
}

/// `-oe LAYERS:EXPERTS=DEVICE`: the listed experts' bytes go to the device (they stay in RAM
/// too), earlier flags keep the experts they placed, and what cannot run or does not exist is
/// said plainly.
#[test]
fn experts_placed_one_by_one() {
    use moxie_core::placement::ExpertOverride;
    let m = Model::open(DS);
    let devices = device_list(1024 * GIB, &[24 * GIB], &[64 * GIB]);
    let with = |oe: &[&str]| PlacementOptions {
        args: vec![PlacementArg::CpuMoe],
        expert_overrides: oe
            .iter()
            .map(|v| ExpertOverride::parse(v).unwrap())
            .collect(),
        ..Default::default()
    };
    let base = m.plan(&with(&[]), &devices);
    let p = m.plan(&with(&["3-5:0-31=sim0", "*:24-39=sim0"]), &devices);
    // Blocks 3-5 get 0-31 from the first flag and 32-39 from the second; the other 55 MoE
    // blocks 24-39 (16 experts).
    let splits: Vec<(usize, &str, usize)> = p
        .expert_splits
        .iter()
        .map(|s| {
            (
                s.layer,
                p.devices[s.device].spec.name.as_str(),
                s.experts.len(),
            )
        })
        .collect();
    assert_eq!(splits.len(), 3 * 2 + 55, "{splits:?}");
    assert!(splits.contains(&(3, "sim0", 32)) && splits.contains(&(3, "sim0", 8)));
    assert!(splits.contains(&(60, "sim0", 16)));
    let share = |il: usize, n: u64| m.expert_bytes([il]) / 256 * n;
    let to_sim: u64 = (3..61)
        .map(|il| share(il, if il <= 5 { 40 } else { 16 }))
        .sum();
    let sim = p.device_index("sim0").unwrap();
    assert_eq!(
        p.devices[sim].weights_bytes - base.devices[sim].weights_bytes,
        to_sim
    );
    assert_eq!(p.devices[0].weights_bytes, base.devices[0].weights_bytes);
    assert!(p.can_run(), "{:?}", p.unsupported);
    // On a GPU: they run with their layer's router there, and are refused for a layer
    // that runs elsewhere (planned all the same).
    let gpu = base.device_index("CUDA0").unwrap();
    let moe_on = |on_gpu: bool| {
        (3..61)
            .find(|&il| (base.layers[il].device == Some(gpu)) == on_gpu)
            .unwrap()
    };
    let (here, elsewhere) = (moe_on(true), moe_on(false));
    let p = m.plan(&with(&[&format!("{here}:100=CUDA0")]), &devices);
    assert_eq!(
        p.devices[gpu].weights_bytes - base.devices[gpu].weights_bytes,
        share(here, 1)
    );
    assert!(p.can_run(), "{:?}", p.unsupported);
    let p = m.plan(&with(&[&format!("{elsewhere}:100=CUDA0")]), &devices);
    assert!(
        p.unsupported.len() == 1 && p.unsupported[0].contains("with their layer's router"),
        "{:?}",
        p.unsupported
    );
    // Two devices for one layer's experts, and experts split off a GPU's layer.
    let p = m.plan(&with(&["4:0=sim0", "4:1=CUDA0"]), &devices);
    assert!(p.unsupported.iter().any(|u| u.contains("two devices")));
    let on_gpu = PlacementOptions {
        expert_overrides: vec![ExpertOverride::parse("10:0=sim0").unwrap()],
        ..Default::default()
    };
    let p = m.plan(&on_gpu, &devices);
    assert!(
        p.unsupported
            .iter()
            .any(|u| u.contains("other experts are on CUDA0")),
        "{:?}",
        p.unsupported
    );
    // Bad values name the problem.
    let err = |oe: &str| {
        plan_for_file(&m.file, &with(&[oe]), &devices, &run(KvTypes::default()))
            .unwrap_err()
            .to_string()
    };
    assert!(err("2:0=sim0").contains("layer 2 has no routed experts"));
    assert!(err("3:256=sim0").contains("experts 0-255, not 256"));
    assert!(err("3:0=sim9").contains("no device 'sim9'"));
}

/// `--fit --profile`: with skewed routing the fit places each layer's hot experts on the GPU
/// one by one (the most chosen first) and says what it expects to take off the CPU; where
/// whole layers do as well (room for all of them) it keeps them; on a CUDA GPU, hot experts
/// only of the layers it runs; a profile of another model is refused.
#[test]
fn fit_with_a_profile_places_hot_experts() {
    use moxie_core::placement::ExpertFrequencies;
    use moxie_core::telemetry::{LayerProfile, RoutingProfile};
    let m = Model::open(DS);
    // 8 of 256 experts per token; experts 0-31 of each layer take 7 of those 8 selections.
    let profile = |n_expert: usize, hot: usize| {
        let layers = (3..61)
            .map(|il| {
                let counts: Vec<u64> = (0..n_expert)
                    .map(|e| {
                        if e < hot {
                            7000 / hot as u64
                        } else {
                            1000 / (n_expert - hot) as u64
                        }
                    })
                    .collect();
                LayerProfile {
                    layer: il,
                    tokens: [0, 1000],
                    mass: [vec![0.0; n_expert], vec![0.0; n_expert]],
                    counts: [vec![0; n_expert], counts],
                }
            })
            .collect();
        ExpertFrequencies::from_profile(&RoutingProfile {
            arch: "deepseek2".into(),
            n_expert,
            layers,
        })
    };
    let fit = |freq: ExpertFrequencies, devices: &[DeviceSpec]| {
        let o = PlacementOptions {
            fit: true,
            expert_profile: Some(freq),
            ..Default::default()
        };
        plan_for_file(&m.file, &o, devices, &run(KvTypes::default()))
    };
    let sims = device_list(1024 * GIB, &[], &[48 * GIB]);
    let p = fit(profile(256, 32), &sims).unwrap();
    assert!(p.can_run(), "{:?}", p.unsupported);
    let said = p
        .messages
        .iter()
        .find(|m| m.contains("--fit --profile"))
        .unwrap();
    assert!(said.contains("placing hot experts"), "{said}");
    // Hot experts of many layers rather than whole layers: no routed-expert tensor on sim0.
    assert!(p.expert_splits.len() > 20, "{}", p.expert_splits.len());
    assert!(p
        .expert_splits
        .iter()
        .all(|s| s.experts.iter().all(|&e| e < 32) || s.experts.len() == 256));
    let sim = p.device_index("sim0").unwrap();
    assert!(p
        .tensors
        .iter()
        .all(|t| t.group != TensorGroup::RoutedExperts || t.device != Some(sim)));
    // Room for every expert layer: whole layers are as good; they stay.
    let p = fit(
        profile(256, 32),
        &device_list(1024 * GIB, &[], &[1024 * GIB]),
    )
    .unwrap();
    let said = p
        .messages
        .iter()
        .find(|m| m.contains("--fit --profile"))
        .unwrap();
    assert!(said.contains("keeping whole layers"), "{said}");
    assert!(p.expert_splits.is_empty());
    // A CUDA GPU: hot experts only of the layers it runs, and the plan can run.
    let p = fit(profile(256, 32), &gpus(&[48 * GIB])).unwrap();
    let said = p
        .messages
        .iter()
        .find(|m| m.contains("--fit --profile"))
        .unwrap();
    assert!(said.contains("placing hot experts"), "{said}");
    assert!(
        !p.expert_splits.is_empty() && p.unsupported.is_empty(),
        "{:?}",
        p.unsupported
    );
    assert!(p
        .expert_splits
        .iter()
        .all(|s| p.layers[s.layer].device == Some(s.device)));
    // Another model's profile.
    let e = fit(profile(64, 8), &sims).unwrap_err().to_string();
    assert!(
        e.contains("64 experts in the profile and 256 in the model"),
        "{e}"
    );
}

/// `--expert-cache`: every MoE layer whose experts are in RAM gets an equal share, as many
/// whole experts as fit; `auto` takes what the device has left; layers with `-oe` experts are
/// left out; a cache on a CUDA device is planned but cannot run yet; without an accelerator,
/// or with nothing to cache, it is an error.
#[test]
fn the_expert_cache_is_planned() {
    use moxie_core::placement::{CacheSize, ExpertCacheRequest, ExpertOverride};
    use moxie_core::telemetry::CachePolicy;
    let m = Model::open(DS);
    let devices = device_list(1024 * GIB, &[24 * GIB], &[64 * GIB]);
    let req = |size: CacheSize, device: &str| ExpertCacheRequest {
        size,
        policy: CachePolicy::Lru,
        device: Some(device.to_string()),
    };
    let with = |cache: Option<ExpertCacheRequest>, oe: &[&str]| PlacementOptions {
        args: vec![PlacementArg::CpuMoe],
        expert_cache: cache,
        expert_overrides: oe
            .iter()
            .map(|v| ExpertOverride::parse(v).unwrap())
            .collect(),
        ..Default::default()
    };
    let base = m.plan(&with(None, &[]), &devices);
    let sim = base.device_index("sim0").unwrap();
    let p = m.plan(
        &with(Some(req(CacheSize::Bytes(8 * GIB), "sim0")), &[]),
        &devices,
    );
    let c = p.expert_cache.as_ref().unwrap();
    assert_eq!(c.device, sim);
    // DeepSeek-V3: blocks 3-60 have routed experts.
    assert_eq!(c.layers.len(), 58);
    let share = 8 * GIB / 58;
    for &(il, slots, one) in &c.layers {
        assert_eq!(one, m.expert_bytes([il]) / 256, "layer {il}");
        assert_eq!(slots as u64, share / one, "layer {il}");
    }
    assert_eq!(
        c.bytes,
        c.layers.iter().map(|l| l.1 as u64 * l.2).sum::<u64>()
    );
    assert!(c.bytes <= 8 * GIB && c.bytes > 7 * GIB, "{}", c.bytes);
    assert_eq!(
        p.devices[sim].weights_bytes - base.devices[sim].weights_bytes,
        c.bytes
    );
    assert!(p.can_run(), "{:?}", p.unsupported);
    assert!(p.messages.iter().any(|l| l.starts_with("expert cache: ")));

    // auto: what sim0 has left.
    let p = m.plan(&with(Some(req(CacheSize::Auto, "sim0")), &[]), &devices);
    let c = p.expert_cache.as_ref().unwrap();
    let free = p.devices[sim].free_bytes();
    assert!(free >= 0 && (free as u64) < 58 * c.layers[0].2, "{free}");

    // -oe's layers keep their split, the others are cached.
    let p = m.plan(
        &with(
            Some(req(CacheSize::Bytes(8 * GIB), "sim0")),
            &["3-5:0-7=sim0"],
        ),
        &devices,
    );
    let layers: Vec<usize> = p
        .expert_cache
        .as_ref()
        .unwrap()
        .layers
        .iter()
        .map(|l| l.0)
        .collect();
    assert_eq!(layers, (6..61).collect::<Vec<_>>());

    // On CUDA: the layers whose router runs there.
    let gpu = base.device_index("CUDA0").unwrap();
    let p = m.plan(
        &with(Some(req(CacheSize::Bytes(4 * GIB), "CUDA0")), &[]),
        &devices,
    );
    assert!(p.can_run(), "{:?}", p.unsupported);
    let c = p.expert_cache.as_ref().unwrap();
    assert!(
        !c.layers.is_empty() && c.layers.len() < 58,
        "{:?}",
        c.layers
    );
    assert!(c
        .layers
        .iter()
        .all(|l| base.layers[l.0].device == Some(gpu)));

    // Errors.
    let plan_err = |opts: &PlacementOptions, devices: &[DeviceSpec]| m.try_plan(opts, devices);
    let cpu_only = device_list(1024 * GIB, &[], &[]);
    let no_dev = ExpertCacheRequest {
        device: None,
        ..req(CacheSize::Auto, "x")
    };
    let e = plan_err(&with(Some(no_dev), &[]), &cpu_only);
    assert!(e.contains("needs an accelerator"), "{e}");
    let e = plan_err(&with(Some(req(CacheSize::Auto, "sim7")), &[]), &devices);
    assert!(e.contains("sim7"), "{e}");
    let tiny = with(Some(req(CacheSize::Bytes(1 << 20), "sim0")), &[]);
    let e = plan_err(&tiny, &devices);
    assert!(e.contains("holds no expert"), "{e}");
    let all_on_gpu = PlacementOptions {
        expert_cache: Some(req(CacheSize::Bytes(GIB), "sim0")),
        ..Default::default()
    };
    let big = device_list(1024 * GIB, &[], &[1024 * GIB]);
    let e = plan_err(&all_on_gpu, &big);
    assert!(e.contains("no MoE layer"), "{e}");
    assert!(ExpertCacheRequest::parse("4GiB", "lru", None).is_ok());
    let e = ExpertCacheRequest::parse("4 bananas", "lru", None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("--expert-cache"), "{e}");
    let e = ExpertCacheRequest::parse("auto", "fifo", None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("--expert-cache-policy 'fifo'"), "{e}");
}
