//! Real files: the tiny llama.cpp-quantized fixture models and the header-only GGUFs of
//! DeepSeek-V3 671B and GLM-4.7 355B. A missing fixture directory fails these tests.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::{fixtures_dir, TempDir};
use moxie_gguf::{GgmlType, GgufError, GgufFile, GgufWriter};
use serde_json::Value as Json;

fn read_json(p: &Path) -> Json {
    let s = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn model_files() -> Vec<PathBuf> {
    let dir = fixtures_dir().join("models");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no .gguf files in {}", dir.display());
    v
}

#[test]
fn every_fixture_model_matches_golden_index() {
    let fx = fixtures_dir();
    let index = read_json(&fx.join("golden/index.json"));
    let models = index["models"].as_object().expect("index.json: models");
    let files = model_files();
    assert_eq!(
        files.len(),
        models.len(),
        "every model file has an index entry and vice versa"
    );
    let mut read = 0;
    for path in files {
        let stem = path.file_stem().unwrap().to_str().unwrap();
        let entry = models
            .get(stem)
            .unwrap_or_else(|| panic!("{stem} missing from golden/index.json"));
        assert_eq!(
            entry["model_file"].as_str(),
            Some(format!("models/{stem}.gguf").as_str())
        );
        // Every type the files hold is known, ik_llama.cpp's own (ids 133+) included.
        for t in entry["tensor_types"].as_object().unwrap().keys() {
            assert!(GgmlType::from_name(t).is_some(), "{stem}: unknown type {t}");
        }
        read += 1;
        let f = GgufFile::open(&path).unwrap_or_else(|e| panic!("{e}"));
        let len = std::fs::metadata(&path).unwrap().len();
        assert_eq!(Some(len), entry["bytes"].as_u64(), "{stem}");
        assert_eq!(f.version(), 3, "{stem}");
        assert_eq!(f.alignment(), 32, "{stem}");
        assert_eq!(f.split_count(), 1);

        // Tensor types.
        let mut got: BTreeMap<String, u64> = BTreeMap::new();
        for t in f.tensors() {
            *got.entry(t.ty.name().to_owned()).or_default() += 1;
        }
        let want: BTreeMap<String, u64> = entry["tensor_types"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
            .collect();
        assert_eq!(got, want, "{stem}: tensor types");
        let n: u64 = want.values().sum();
        assert_eq!(f.tensors().len() as u64, n, "{stem}");

        // Metadata.
        let md = f.metadata();
        let arch = md.require_str("general.architecture").unwrap();
        assert_eq!(Some(arch), entry["arch"].as_str(), "{stem}");
        assert_eq!(
            md.get_u64("general.file_type"),
            entry["file_type"].as_u64(),
            "{stem}"
        );
        let toks = md.require_array("tokenizer.ggml.tokens").unwrap();
        assert_eq!(Some(toks.len() as u64), entry["n_vocab"].as_u64(), "{stem}");
        assert!(toks.as_strs().unwrap().contains(&"<|im_end|>"));
        md.require_u64(&format!("{arch}.block_count")).unwrap();

        // Data ranges: inside the file, aligned, readable, non-overlapping, and packed as
        // ggml writes them (each tensor where the previous one ends, padded to 32 bytes), so
        // that every byte count (per-row scales of ik_llama.cpp's types included) is exact.
        let mut end = 0;
        for t in f.tensors() {
            let d = f.tensor_data(t).unwrap();
            assert_eq!(d.len() as u64, t.n_bytes);
            assert_eq!(t.file_offset % 32, 0);
            assert!(t.file_offset >= end, "{stem}: {} overlaps", t.name);
            if end > 0 {
                assert_eq!(
                    t.file_offset,
                    end.next_multiple_of(32),
                    "{stem}: {}",
                    t.name
                );
            }
            end = t.file_offset + t.n_bytes;
            assert!(end <= len);
            assert_eq!(t.n_bytes, t.row_bytes() * t.n_rows());
        }
        assert_eq!(
            end.next_multiple_of(32),
            len.next_multiple_of(32),
            "{stem}: data end"
        );
        let embd = f.tensor("token_embd.weight").expect("token_embd.weight");
        assert_eq!(embd.dims[1], toks.len() as u64);
        // F32 norm weights are finite and near 1.
        let norm = f
            .tensor("blk.0.attn_norm.weight")
            .expect("blk.0.attn_norm.weight");
        let d = f.tensor_data(norm).unwrap();
        let mean = d
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64)
            .sum::<f64>()
            / (d.len() / 4) as f64;
        assert!((0.8..1.2).contains(&mean), "{stem}: attn_norm mean {mean}");
    }
    assert!(read >= 39, "expected the fixture models, read {read}");
}

#[test]
fn fixture_rewrites_byte_identically() {
    let path = fixtures_dir().join("models/qwen3moe-tiny-Q4_K_M.gguf");
    let f = GgufFile::open(&path).unwrap();
    let w = GgufWriter::from_gguf(&f).unwrap();
    let bytes = w
        .write_to_bytes(|t| f.tensor_data_by_name(&t.name).unwrap().unwrap().to_vec())
        .unwrap();
    let orig = std::fs::read(&path).unwrap();
    assert_eq!(bytes.len(), orig.len());
    assert!(
        bytes == orig,
        "rewritten file differs from the llama.cpp original"
    );

    // And as 3 split parts, read back as one model.
    let dir = TempDir::new("fxsplit");
    let paths = w
        .write_split_files(&dir.path().join("q"), 3, |t| {
            f.tensor_data_by_name(&t.name).unwrap().unwrap().to_vec()
        })
        .unwrap();
    let g = GgufFile::open(&paths[0]).unwrap();
    assert_eq!(g.tensors().len(), f.tensors().len());
    for t in f.tensors() {
        let u = g.tensor(&t.name).unwrap();
        assert_eq!((&u.dims, u.ty), (&t.dims, t.ty));
        assert_eq!(g.tensor_data(u).unwrap(), f.tensor_data(t).unwrap());
    }
    assert_eq!(g.total_tensor_bytes(), f.total_tensor_bytes());
}

#[test]
fn header_only_big_models() {
    let fx = fixtures_dir();
    for (stem, n_tensors) in [
        ("DeepSeek-V3-671B-Q4_K_M", 1086usize),
        ("GLM-4.7-355B-Q4_K_M", 1759),
    ] {
        let path = fx.join(format!("headers/{stem}.header.gguf"));
        let info = read_json(&fx.join(format!("headers/{stem}.header.json")));
        let f = GgufFile::open_header_only(&path).unwrap_or_else(|e| panic!("{e}"));
        assert!(f.is_header_only());
        assert_eq!(f.tensors().len(), n_tensors, "{stem}");
        assert_eq!(Some(n_tensors as u64), info["n_tensors"].as_u64());
        assert_eq!(
            Some(f.total_tensor_bytes()),
            info["tensor_data_bytes"].as_u64(),
            "{stem}"
        );
        let n_params: u64 = f.tensors().iter().map(|t| t.n_elements()).sum();
        assert_eq!(Some(n_params), info["n_params"].as_u64(), "{stem}");
        // The file ends where the data section starts.
        assert_eq!(f.data_offset(0), info["header_bytes"].as_u64(), "{stem}");
        let last = f
            .tensors()
            .iter()
            .map(|t| t.file_offset + t.n_bytes)
            .max()
            .unwrap();
        assert_eq!(Some(last), info["full_file_bytes"].as_u64(), "{stem}");
        // Per-type byte totals.
        for (ty, v) in info["bytes_by_type"].as_object().unwrap() {
            let (n, b) = f
                .tensors()
                .iter()
                .filter(|t| t.ty.name() == ty)
                .fold((0u64, 0u64), |(n, b), t| (n + 1, b + t.n_bytes));
            assert_eq!(Some(n), v["tensors"].as_u64(), "{stem} {ty}");
            assert_eq!(Some(b), v["bytes"].as_u64(), "{stem} {ty}");
        }
        assert_eq!(f.metadata().get_bool("moxie.header_only"), Some(true));
        assert_eq!(
            f.metadata().get_str("general.architecture"),
            info["arch"].as_str()
        );

        // No data: tensor_data fails; a normal open fails with a truncation error.
        let t = &f.tensors()[0];
        assert!(matches!(
            f.tensor_data(t),
            Err(GgufError::HeaderOnly { .. })
        ));
        let e = GgufFile::open(&path).unwrap_err();
        assert!(matches!(e, GgufError::DataPastEnd { .. }), "{e:?}");
        let msg = e.to_string();
        assert!(
            msg.contains("truncated") && msg.contains(&format!("{stem}.header.gguf")),
            "{msg}"
        );
        assert!(
            msg.contains(&format!("tensor '{}'", f.tensors()[0].name)),
            "{msg}"
        );
    }
}
