//! `moxie plan` end to end on the header-only DeepSeek-V3 file: `--fit` within budgets on one
//! and on two unequal GPUs, a plan that cannot fit, llama.cpp's flag order recovered from the
//! command line, and bad input; on a generated GLM-5.1 header: the DSA indexer's weights and
//! key cache with the usual hybrid flags; `-ngl` on a machine without a GPU.

use serde_json::Value;

mod common;
use common::{fixture, moxie};

/// The header-only fixture `stem`.
fn header(stem: &str) -> String {
    fixture(&format!("headers/{stem}.header.gguf"))
}

fn ds() -> String {
    header("DeepSeek-V3-671B-Q4_K_M")
}

fn plan_json(args: &[&str]) -> Value {
    let mut all = vec!["plan", "--json"];
    all.extend_from_slice(args);
    let o = moxie(&all);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("JSON on stdout")
}

fn device<'a>(plan: &'a Value, name: &str) -> &'a Value {
    plan["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == name)
        .unwrap_or_else(|| panic!("no device {name}"))
}

fn assert_within_budgets(plan: &Value) {
    assert_eq!(plan["fits"], true, "{}", plan["messages"]);
    for d in plan["devices"].as_array().unwrap() {
        let total = d["total_bytes"].as_u64().unwrap();
        let parts: u64 = [
            "weights_bytes",
            "kv_bytes",
            "state_bytes",
            "compute_bytes",
            "headroom_bytes",
        ]
        .iter()
        .map(|k| d[k].as_u64().unwrap())
        .sum();
        assert_eq!(total, parts);
        assert!(total <= d["budget_bytes"].as_u64().unwrap(), "{d}");
    }
}

/// Blocks whose routed experts are (partly) on `device`.
fn expert_layers_on(plan: &Value, device: &str) -> usize {
    plan["layers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| {
            l["experts"]
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e["device"] == device)
        })
        .count()
}

fn tensor_device(plan: &Value, name: &str) -> String {
    let t = plan["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == name)
        .unwrap_or_else(|| panic!("no tensor {name}"));
    t["device"].as_str().unwrap().to_owned()
}

#[test]
fn fit_stays_within_one_gpu_and_the_ram() {
    let m = ds();
    let plan = plan_json(&["-m", &m, "--gpu", "24GiB", "--ram", "512GiB", "--fit"]);
    assert_within_budgets(&plan);
    assert_eq!(device(&plan, "CUDA0")["budget_bytes"], 24u64 << 30);
    assert!(expert_layers_on(&plan, "CUDA0") >= 1);
    // Every tensor is listed with its device and bytes.
    let tensors = plan["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), 1086);
    let by_tensors: u64 = tensors.iter().map(|t| t["bytes"].as_u64().unwrap()).sum();
    let by_devices: u64 = plan["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["weights_bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(by_tensors, by_devices);
    assert_eq!(tensor_device(&plan, "token_embd.weight"), "CPU");
}

#[test]
fn fit_gives_the_bigger_gpu_more_expert_layers() {
    let m = ds();
    let plan = plan_json(&["-m", &m, "--gpu", "24GiB,48GiB", "--ram", "512GiB", "--fit"]);
    assert_within_budgets(&plan);
    let small = expert_layers_on(&plan, "CUDA0");
    let big = expert_layers_on(&plan, "CUDA1");
    assert!(big > small && small >= 1, "CUDA0 {small}, CUDA1 {big}");
}

#[test]
fn a_plan_that_cannot_fit_says_by_how_much() {
    let m = ds();
    let plan = plan_json(&["-m", &m, "--gpu", "24GiB", "--ram", "64GiB", "--fit"]);
    assert_eq!(plan["fits"], false);
    assert_eq!(device(&plan, "CPU")["fits"], false);
    assert!(device(&plan, "CPU")["free_bytes"].as_i64().unwrap() < 0);
    let messages = plan["messages"].as_array().unwrap();
    assert!(
        messages
            .iter()
            .any(|m| m.as_str().unwrap().starts_with("CPU is over its budget by")),
        "{messages:?}"
    );
}

#[test]
fn placement_flags_apply_in_command_line_order() {
    let m = ds();
    let pin = r"blk\.3\.ffn_up_exps=CUDA0";
    let common = ["-m", m.as_str(), "--gpu", "24GiB", "--ram", "1TiB"];
    let mut args = common.to_vec();
    args.extend(["-cmoe", "-ot", pin]);
    let plan = plan_json(&args);
    assert_eq!(tensor_device(&plan, "blk.3.ffn_up_exps.weight"), "CPU");
    let mut args = common.to_vec();
    args.extend(["-ot", pin, "--cpu-moe"]);
    let plan = plan_json(&args);
    assert_eq!(tensor_device(&plan, "blk.3.ffn_up_exps.weight"), "CUDA0");
    assert_eq!(tensor_device(&plan, "blk.3.ffn_down_exps.weight"), "CPU");
    let mut args = common.to_vec();
    args.extend(["-ncmoe", "4", "-ot", pin, "-ot", "exps=CUDA0"]);
    let plan = plan_json(&args);
    assert_eq!(tensor_device(&plan, "blk.3.ffn_up_exps.weight"), "CPU");
    assert_eq!(tensor_device(&plan, "blk.4.ffn_up_exps.weight"), "CUDA0");
    assert_eq!(plan["rules"].as_array().unwrap().len(), 6);
}

#[test]
fn the_table_names_devices_layers_and_rules() {
    let m = ds();
    let o = moxie(&[
        "plan", "-m", &m, "--gpu", "24GiB", "--sim", "8GiB", "--ram", "512GiB", "-ngl", "10",
        "-ot", "exps=CPU", "-ts", "3,1",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("-ngl 10, -sm layer"), "{out}");
    // -ngl 10: slots 52-61 on the GPUs, split 3:1 (slot 52 + 7.5 is the boundary).
    for line_start in [
        "CPU ", "CUDA0 ", "sim0 ", "0-2 ", "3-51 ", "52-59 ", "60 ", "output ",
    ] {
        assert!(
            out.lines().any(|l| l.starts_with(line_start)),
            "no line starting '{line_start}' in\n{out}"
        );
    }
    assert!(out.contains("-ot \"exps=CPU\""), "{out}");
}

#[test]
fn bad_input_fails_with_a_clear_error() {
    let m = ds();
    for (args, expected) in [
        (
            vec!["--gpu", "24GiB", "-ot", "exps=CUDA1"],
            "unknown buffer 'CUDA1'",
        ),
        (
            vec!["--gpu", "24GiB", "-ot", "blk\\.(3=CPU"],
            "bad regular expression",
        ),
        (vec!["--gpu", "24XB"], "bad size '24XB'"),
        (vec!["--gpu", "24GiB", "--ram", "lots"], "bad size 'lots'"),
        (
            vec!["--gpu", "24GiB", "-sm", "row"],
            "-sm row splits single weights",
        ),
        (vec!["--gpu", "24GiB", "-ngl", "many"], "-ngl 'many'"),
        (vec!["--gpu", "24GiB", "-ts", "3,x"], "'x' is not a number"),
        (
            vec!["--gpu", "24GiB", "-ctk", "q4_0"],
            "unsupported KV cache type",
        ),
    ] {
        let mut all = vec!["plan", "-m", m.as_str()];
        if !args.contains(&"--ram") {
            all.extend(["--ram", "1TiB"]);
        }
        all.extend(args);
        let o = moxie(&all);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{all:?} succeeded");
        assert!(err.contains(expected), "{all:?}: {err}");
    }
    let o = moxie(&["plan", "-m", "/nonexistent.gguf", "--ram", "1TiB"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("nonexistent.gguf"));
}

/// Issue 15's acceptance line: `moxie plan` on a GLM-5.1 header written by `moxie gen
/// --header-only` with `-ngl 999 --cpu-moe --gpu 24GiB,24GiB`: the indexer tensors are on the
/// GPUs (with their layer), the MTP block `blk.78` is not loaded (no bytes, no device, no
/// cache), and the indexer key cache is counted: per layer 4096 positions x 128 f16 values
/// beside MLA's 4096 x (512 + 64) f16 latent.
#[test]
fn glm_5_1_hybrid_plan_has_the_indexer_on_the_gpus_and_counts_its_cache() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let path = dir.join(format!("glm-5.1-plan-cli-{}.gguf", std::process::id()));
    let p = path.to_str().unwrap();
    let o = moxie(&["gen", "--header-only", "--preset", "glm-5.1-744b", "-o", p]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let flags = [
        "-m",
        p,
        "-ngl",
        "999",
        "--cpu-moe",
        "--gpu",
        "24GiB,24GiB",
        "--ram",
        "1TiB",
    ];
    let plan = plan_json(&flags);
    let text = moxie(&[&["plan"][..], &flags[..]].concat());
    let _ = std::fs::remove_file(&path);
    assert_within_budgets(&plan);

    let (kv, state) = (4096 * (512 + 64) * 2, 4096 * 128 * 2);
    let layers = plan["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 79);
    let mut on_gpu = std::collections::BTreeMap::<String, u64>::new();
    for l in &layers[..78] {
        assert_eq!(l["kv_bytes"], kv, "{l}");
        assert_eq!(l["state_bytes"], state, "{l}");
        *on_gpu
            .entry(l["device"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    assert_eq!(on_gpu.keys().collect::<Vec<_>>(), ["CUDA0", "CUDA1"]);
    let mtp = &layers[78];
    assert_eq!(mtp["device"], Value::Null);
    assert_eq!(
        (mtp["kv_bytes"].as_u64(), mtp["state_bytes"].as_u64()),
        (Some(0), Some(0))
    );
    for (name, n) in &on_gpu {
        let d = device(&plan, name);
        assert_eq!(d["kv_bytes"], n * kv);
        assert_eq!(d["state_bytes"], n * state);
    }
    assert_eq!(device(&plan, "CPU")["state_bytes"], 0);

    let mut n_indexer = 0;
    for t in plan["tensors"].as_array().unwrap() {
        let name = t["name"].as_str().unwrap();
        if name.starts_with("blk.78.") {
            assert_eq!(
                (&t["device"], &t["bytes"]),
                (&Value::Null, &Value::from(0)),
                "{t}"
            );
        } else if name.contains(".indexer.") {
            n_indexer += 1;
            assert_eq!(t["role"], "indexer", "{t}");
            let layer = &layers[t["layer"].as_u64().unwrap() as usize];
            assert_eq!(t["device"], layer["device"], "{t}");
            assert!(t["device"].as_str().unwrap().starts_with("CUDA"), "{t}");
        }
    }
    assert_eq!(n_indexer, 78 * 5);

    // The table shows the state apart from the KV cache, and the MTP block unused.
    assert!(text.status.success());
    let out = String::from_utf8_lossy(&text.stdout);
    assert!(out.contains("state (indexer keys, recurrent)"), "{out}");
    assert!(out.contains("indexer"), "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("78 ") && l.contains("nextn") && l.contains("unused")),
        "{out}"
    );
}

/// `moxie inspect` gives the DSA indexer (`indexer.*`, in all 79 GLM-5.1 blocks) and
/// qwen3next's gated DeltaNet (`ssm_*`, 6 tensors in each of blocks 0-2) roles of their own.
#[test]
fn inspect_shows_indexer_and_recurrent_roles() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let glm = dir.join(format!("glm-5.1-inspect-{}.gguf", std::process::id()));
    let glm = glm.to_str().unwrap();
    let o = moxie(&[
        "gen",
        "--header-only",
        "--preset",
        "glm-5.1-744b",
        "-o",
        glm,
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let qwen = fixture("models/qwen3next-tiny-F32.gguf");
    for (file, role, n_tensors) in [(glm, "indexer", 79 * 5), (qwen.as_str(), "recurrent", 18)] {
        let o = moxie(&["inspect", "--header-only", "--json", file]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["by_role"][role]["tensors"], n_tensors, "{file}");
        assert!(
            v["by_role"].get("other").is_none(),
            "{file}: {}",
            v["by_role"]
        );
        let o = moxie(&["inspect", "--header-only", file]);
        let out = String::from_utf8_lossy(&o.stdout);
        let per_layer = out.split("per layer:").nth(1).unwrap();
        assert!(per_layer.lines().nth(1).unwrap().contains(role), "{out}");
    }
    let _ = std::fs::remove_file(glm);
}

/// `MOXIE_SIM_CUDA` makes CUDA0, CUDA1, ... simulated devices with its budgets: a 4x3090 line
/// plans (and runs) on a machine without them, and its out-of-memory shows; a bad size names
/// the variable.
#[test]
fn simulated_cuda_devices_stand_for_gpus() {
    let run = |env: &str, args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_moxie"))
            .env("MOXIE_SIM_CUDA", env)
            .arg("plan")
            .args(args)
            .output()
            .unwrap()
    };
    let m = ds();
    let line = ["--json", "-m", &m, "--ram", "512GiB", "-ngl", "999"];
    let o = run(
        "24GiB,24GiB,24GiB,24GiB",
        &[&line[..], &["--cpu-moe"]].concat(),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let plan: Value = serde_json::from_slice(&o.stdout).unwrap();
    for i in 0..4 {
        let d = device(&plan, &format!("CUDA{i}"));
        assert_eq!(d["budget_bytes"], 24u64 << 30, "{d}");
    }
    assert_eq!(plan["fits"], true, "{}", plan["messages"]);
    // All 61 layers' experts on four 24 GiB GPUs do not fit.
    let o = run("24GiB,24GiB,24GiB,24GiB", &line);
    let plan: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(plan["fits"], false);
    let o = run("24XB", &["-m", &m]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("MOXIE_SIM_CUDA=24XB"),
        "{err}"
    );
}

/// `-ngl` with no GPU to take the layers warns, as llama.cpp does, naming why none was found,
/// and plans every layer for the CPU; `-ngl 0` and simulated GPUs do not warn.
#[test]
fn gpu_layers_without_a_gpu_warn_and_stay_on_the_cpu() {
    let m = ds();
    let warned = |o: &std::process::Output| {
        String::from_utf8_lossy(&o.stderr).contains("but no GPU was found")
    };
    let o = moxie(&["plan", "--json", "-m", &m, "--ram", "1TiB", "-ngl", "10"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let plan: Value = serde_json::from_slice(&o.stdout).unwrap();
    let gpus = plan["devices"].as_array().unwrap().len() - 1;
    // (A machine that has a GPU and a CUDA build plans for it, without the warning.)
    assert_eq!(
        warned(&o),
        gpus == 0,
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    if gpus == 0 {
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(
            stderr.contains("-ngl 10") && stderr.contains("CPU"),
            "{stderr}"
        );
        assert_eq!(expert_layers_on(&plan, "CPU"), 58, "{}", plan["layers"]);
    }
    let o = moxie(&["plan", "--json", "-m", &m, "--ram", "1TiB", "-ngl", "0"]);
    assert!(o.status.success() && !warned(&o));
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_moxie"))
        .env("MOXIE_SIM_CUDA", "24GiB")
        .args(["plan", "--json", "-m", &m, "--ram", "1TiB", "-ngl", "10"])
        .output()
        .unwrap();
    assert!(o.status.success() && !warned(&o));
}
