//! `moxie gen --header-only`: writes a real model's header-only GGUF that opens header-only,
//! with the block types llama-quantize gives each tensor for any of its file types (checked
//! against llama-quantize's own choices for low-bit types, tests/data/header_type_goldens.json
//! from scripts/header_type_goldens.py) and bytes `moxie plan` accounts for exactly; and
//! refuses what does not apply with a message that says why.

use std::collections::BTreeMap;

use moxie_gguf::GgufFile;
use serde_json::Value;

mod common;
use common::{moxie, tmp_dir};

#[test]
fn header_only_presets_write_openable_headers() {
    let dir = tmp_dir("gen-header", "presets");
    for (preset, arch, n_tensors) in [
        ("glm-5.1-744b", "glm-dsa", 1809),
        ("deepseek-v3-671b", "deepseek2", 1086),
    ] {
        let path = dir.join(format!("{preset}.gguf"));
        let p = path.to_str().unwrap();
        let o = moxie(&["gen", "--header-only", "--preset", preset, "-o", p]);
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert!(
            out.contains("header only") && out.contains("Q4_K_M"),
            "{out}"
        );
        let f = GgufFile::open_header_only(&path).unwrap();
        assert_eq!(f.metadata().get_str("general.architecture"), Some(arch));
        assert_eq!(f.metadata().get_bool("moxie.header_only"), Some(true));
        assert_eq!(f.tensors().len(), n_tensors);
        assert_eq!(
            f.data_offset(0),
            Some(std::fs::metadata(&path).unwrap().len())
        );
        assert!(out.contains(&format!("{} bytes of tensor data", f.total_tensor_bytes())));
    }

    // Another type: the same index with other block types.
    let path = dir.join("ds-q8.gguf");
    let o = moxie(&[
        "gen",
        "--header-only",
        "--preset",
        "deepseek-v3-671b",
        "--type",
        "Q8_0",
        "-o",
        path.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let f = GgufFile::open_header_only(&path).unwrap();
    assert_eq!(f.metadata().get_u32("general.file_type"), Some(7));
    assert_eq!(f.tensors().len(), 1086);
}

#[test]
fn bad_header_only_requests_fail_clearly() {
    let dir = tmp_dir("gen-header", "bad");
    let out = dir.join("x.gguf");
    let o_path = out.to_str().unwrap();
    let fails = |args: &[&str], wanted: &str| {
        let o = moxie(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(err.contains(wanted), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    };
    fails(
        &["gen", "--header-only", "--preset", "glm-6", "-o", o_path],
        "unknown header-only preset 'glm-6'",
    );
    fails(
        &["gen", "--header-only", "--preset", "tiny", "-o", o_path],
        "glm-5.1-744b",
    );
    fails(
        &[
            "gen",
            "--header-only",
            "--preset",
            "bench-deepseek2",
            "-o",
            o_path,
        ],
        "without --header-only",
    );
    fails(
        &["gen", "--preset", "glm-4.7-355b", "-o", o_path],
        "--header-only",
    );
    let set = [
        "gen",
        "--header-only",
        "--preset",
        "glm-4.7-355b",
        "--set",
        "n_layer=4",
        "-o",
        o_path,
    ];
    fails(&set, "--set does not apply");
    let arch = [
        "gen",
        "--header-only",
        "--preset",
        "glm-4.7-355b",
        "--arch",
        "deepseek2",
        "-o",
        o_path,
    ];
    fails(&arch, "is a glm4moe model");
    fails(
        &[
            "gen",
            "--header-only",
            "--preset",
            "glm-4.7-355b",
            "--type",
            "IQ2_Q",
            "-o",
            o_path,
        ],
        "unknown file type 'IQ2_Q'",
    );
    fails(
        &[
            "gen",
            "--header-only",
            "--preset",
            "glm-4.7-355b",
            "--pure",
            "-o",
            o_path,
        ],
        "--pure needs --type",
    );
    assert!(!out.exists());
}

/// `moxie plan --json` of `path` with `flags`.
fn plan_json(path: &str, flags: &[&str]) -> Value {
    let mut args = vec!["plan", "--json", "-m", path];
    args.extend_from_slice(flags);
    let o = moxie(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("JSON on stdout")
}

/// Issue 16: headers of IQ2_M-sized (and IQ1_M, Q2_K) models have exactly llama-quantize's
/// block types, tensor by tensor, and its tensor data size; `moxie plan` places every byte of
/// them (the unused MTP block aside, which it lists with no bytes).
#[test]
fn low_bit_headers_have_llama_quantizes_types_and_plan_counts_every_byte() {
    let golden: Value = serde_json::from_str(include_str!("data/header_type_goldens.json"))
        .expect("header_type_goldens.json");
    let dir = tmp_dir("gen-header", "low-bit");
    let mut n_cases = 0;
    for model in golden["models"].as_array().unwrap() {
        let preset = model["preset"].as_str().unwrap();
        let names: Vec<&str> = model["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_str().unwrap())
            .collect();
        for case in model["ftypes"].as_array().unwrap() {
            let ftype = case["ftype"].as_str().unwrap();
            let what = format!("{preset} {ftype}");
            let path = dir.join(format!("{preset}-{ftype}.gguf"));
            let p = path.to_str().unwrap();
            let o = moxie(&[
                "gen",
                "--header-only",
                "--preset",
                preset,
                "--type",
                ftype,
                "-o",
                p,
            ]);
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            let f = GgufFile::open_header_only(&path).unwrap();

            // Names in llama-quantize's order, each with llama-quantize's type.
            let want: Vec<&str> = case["types"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_str().unwrap())
                .collect();
            assert_eq!(f.tensors().len(), names.len(), "{what}");
            for (i, t) in f.tensors().iter().enumerate() {
                assert_eq!(
                    (t.name.as_str(), t.ty.name()),
                    (names[i], want[i]),
                    "{what}: tensor {i}"
                );
            }
            let mut by_type = BTreeMap::<String, u64>::new();
            for t in f.tensors() {
                *by_type.entry(t.ty.name().to_owned()).or_default() += 1;
            }
            let want_by_type: BTreeMap<String, u64> = case["tensors_by_type"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
                .collect();
            assert_eq!(by_type, want_by_type, "{what}");
            let total = case["tensor_data_bytes"].as_u64().unwrap();
            assert_eq!(f.total_tensor_bytes(), total, "{what}");
            let out = String::from_utf8_lossy(&o.stdout);
            assert!(
                out.contains(&format!("{total} bytes of tensor data")),
                "{what}: {out}"
            );
            let ft = f.metadata().get_u32("general.file_type").unwrap();
            let id = match ftype {
                "IQ2_M" => 29,
                "IQ1_M" => 31,
                "Q2_K" => 10,
                _ => panic!("{ftype}: add its llama_ftype id"),
            };
            assert_eq!(ft, id, "{what}");

            // The plan: each tensor's bytes are its bytes in the file (0 for the MTP block
            // llama.cpp does not load), the devices hold their sum, and with the unloaded
            // tensors that is the whole tensor data.
            let plan = plan_json(p, &["--gpu", "24GiB", "--ram", "1TiB", "--fit"]);
            assert_eq!(plan["fits"], true, "{what}: {}", plan["messages"]);
            let file_bytes: BTreeMap<&str, u64> = f
                .tensors()
                .iter()
                .map(|t| (t.name.as_str(), t.n_bytes))
                .collect();
            let tensors = plan["tensors"].as_array().unwrap();
            assert_eq!(tensors.len(), names.len(), "{what}");
            let (mut placed, mut unloaded) = (0u64, 0u64);
            for t in tensors {
                let name = t["name"].as_str().unwrap();
                let bytes = t["bytes"].as_u64().unwrap();
                let in_file = file_bytes[name];
                if t["device"].is_null() {
                    assert_eq!(
                        (bytes, t["group"].as_str()),
                        (0, Some("unused_nextn")),
                        "{what}: {t}"
                    );
                    unloaded += in_file;
                } else {
                    assert_eq!(bytes, in_file, "{what}: {t}");
                    placed += bytes;
                }
            }
            let on_devices: u64 = plan["devices"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d["weights_bytes"].as_u64().unwrap())
                .sum();
            assert_eq!(on_devices, placed, "{what}");
            assert_eq!(placed + unloaded, total, "{what}");
            if preset == "deepseek-v3-671b" {
                // No MTP block in llama.cpp's DeepSeek-V3 conversion: every byte is placed.
                assert_eq!(placed, total, "{what}");
            }
            n_cases += 1;
        }
    }
    assert_eq!(n_cases, 6);
}
