//! Split (multi-part) files: writing, opening, and inconsistencies.

mod common;

use common::{pattern, TempDir};
use moxie_gguf::{split_path, GgmlType, GgufError, GgufFile, GgufWriter, OpenOptions, Value};

fn model_writer() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.add("general.architecture", "test").unwrap();
    w.add("test.block_count", Value::U32(3)).unwrap();
    w.add("tokenizer.ggml.tokens", vec!["a", "b"]).unwrap();
    w.add_tensor_info("token_embd.weight", &[64, 8], GgmlType::Q8_0)
        .unwrap();
    for b in 0..3 {
        w.add_tensor_info(&format!("blk.{b}.attn_norm.weight"), &[64], GgmlType::F32)
            .unwrap();
        w.add_tensor_info(
            &format!("blk.{b}.ffn_up_exps.weight"),
            &[256, 4, 2],
            GgmlType::Q4_K,
        )
        .unwrap();
    }
    w
}

#[test]
fn three_part_round_trip() {
    let dir = TempDir::new("split3");
    let w = model_writer();
    let prefix = dir.path().join("model");
    let paths = w.write_split_files(&prefix, 3, pattern).unwrap();
    assert_eq!(paths.len(), 3);
    assert_eq!(paths[0], dir.path().join("model-00001-of-00003.gguf"));
    assert_eq!(paths[2], dir.path().join("model-00003-of-00003.gguf"));

    // Opening any part opens all of them.
    for p in &paths {
        let f = GgufFile::open(p).unwrap();
        assert_eq!(f.paths(), paths.as_slice());
        assert_eq!(f.split_count(), 3);
        assert_eq!(f.tensors().len(), 7);
        let names: Vec<&str> = f.tensors().iter().map(|t| t.name.as_str()).collect();
        let want: Vec<String> = w.tensor_infos().iter().map(|t| t.name.clone()).collect();
        assert_eq!(names, want);
        let splits: Vec<usize> = f.tensors().iter().map(|t| t.split).collect();
        assert_eq!(splits, vec![0, 0, 1, 1, 2, 2, 2]);
        for t in f.tensors() {
            assert_eq!(
                f.tensor_data(t).unwrap(),
                pattern(t).as_slice(),
                "{}",
                t.name
            );
            assert!(t.file_offset + t.n_bytes <= std::fs::metadata(&paths[t.split]).unwrap().len());
        }
        // Metadata comes from the first part; split keys in every part.
        let md = f.metadata();
        assert_eq!(md.get_str("general.architecture"), Some("test"));
        assert_eq!(md.get("split.no"), Some(&Value::U16(0)));
        assert_eq!(md.get("split.count"), Some(&Value::U16(3)));
        assert_eq!(md.get("split.tensors.count"), Some(&Value::I32(7)));
        let md2 = f.part_metadata(2).unwrap();
        assert_eq!(md2.get("split.no"), Some(&Value::U16(2)));
        assert_eq!(md2.get_str("general.architecture"), None);
        assert_eq!(
            f.total_tensor_bytes(),
            w.tensor_infos().iter().map(|t| t.n_bytes).sum::<u64>()
        );
    }

    // Header-only mode also follows splits.
    let h = GgufFile::open_header_only(&paths[0]).unwrap();
    assert_eq!(h.tensors().len(), 7);
    assert!(matches!(
        h.tensor_data(&h.tensors()[6]),
        Err(GgufError::HeaderOnly { .. })
    ));

    // Not following splits gives only the given part.
    let one = GgufFile::open_with(
        &paths[1],
        OpenOptions {
            header_only: false,
            follow_splits: false,
        },
    )
    .unwrap();
    assert_eq!(one.tensors().len(), 2);
    assert_eq!(one.paths(), &paths[1..2]);

    // A reader-built writer re-splits into the same files.
    let f = GgufFile::open(&paths[0]).unwrap();
    let w2 = GgufWriter::from_gguf(&f).unwrap();
    let prefix2 = dir.path().join("again");
    let p2 = w2
        .write_split_files(&prefix2, 3, |t| {
            f.tensor_data_by_name(&t.name).unwrap().unwrap().to_vec()
        })
        .unwrap();
    for (a, b) in paths.iter().zip(&p2) {
        assert_eq!(std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
    }
}

#[test]
fn missing_part_is_named() {
    let dir = TempDir::new("splitmiss");
    let prefix = dir.path().join("m");
    let paths = model_writer()
        .write_split_files(&prefix, 3, pattern)
        .unwrap();
    std::fs::remove_file(&paths[1]).unwrap();
    let e = GgufFile::open(&paths[0]).unwrap_err();
    assert!(
        matches!(
            e,
            GgufError::MissingSplit {
                part: 2,
                count: 3,
                ..
            }
        ),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(msg.contains("m-00002-of-00003.gguf"), "{msg}");
    assert!(msg.contains("missing split part 2 of 3"), "{msg}");
    let e = GgufFile::open_header_only(&paths[2]).unwrap_err();
    assert!(e.to_string().contains("m-00002-of-00003.gguf"), "{e}");
}

#[test]
fn inconsistent_parts_are_rejected() {
    let dir = TempDir::new("splitbad");
    let w = model_writer();
    let p3 = w
        .write_split_files(&dir.path().join("a"), 3, pattern)
        .unwrap();
    let p4 = w
        .write_split_files(&dir.path().join("b"), 4, pattern)
        .unwrap();

    // Part 2 replaced by part 3 of the same split: wrong split.no.
    std::fs::copy(&p3[2], &p3[1]).unwrap();
    let e = GgufFile::open(&p3[0]).unwrap_err();
    assert!(matches!(e, GgufError::Split { .. }), "{e:?}");
    assert!(
        e.to_string().contains("part 3 of 3, expected part 2 of 3"),
        "{e}"
    );

    // Part 2 replaced by part 2 of a 4-way split: wrong split.count.
    std::fs::copy(&p4[1], &p3[1]).unwrap();
    let e = GgufFile::open(&p3[0]).unwrap_err();
    assert!(e.to_string().contains("of 4, expected part 2 of 3"), "{e}");

    // A split part renamed so that its name no longer matches its split.no.
    let renamed = dir.path().join("c.gguf");
    std::fs::copy(&p4[0], &renamed).unwrap();
    let e = GgufFile::open(&renamed).unwrap_err();
    assert!(e.to_string().contains("-00001-of-00004.gguf"), "{e}");

    // Hand-made parts: duplicate tensor across parts, and a wrong split.tensors.count.
    let mk = |no: u16, count: u16, total: i32, tensors: &[&str]| {
        let mut w = GgufWriter::new();
        w.add("split.no", Value::U16(no)).unwrap();
        w.add("split.count", Value::U16(count)).unwrap();
        w.add("split.tensors.count", Value::I32(total)).unwrap();
        for t in tensors {
            w.add_tensor_info(t, &[4], GgmlType::F32).unwrap();
        }
        w
    };
    let prefix = dir.path().join("d");
    mk(0, 2, 2, &["x"])
        .write_file(&split_path(&prefix, 0, 2), pattern)
        .unwrap();
    mk(1, 2, 2, &["x"])
        .write_file(&split_path(&prefix, 1, 2), pattern)
        .unwrap();
    let e = GgufFile::open(&split_path(&prefix, 0, 2)).unwrap_err();
    assert!(matches!(e, GgufError::DuplicateTensor { .. }), "{e:?}");
    assert!(
        e.to_string().contains("d-00001-of-00002.gguf")
            && e.to_string().contains("d-00002-of-00002.gguf"),
        "{e}"
    );

    mk(1, 2, 3, &["y"])
        .write_file(&split_path(&prefix, 1, 2), pattern)
        .unwrap();
    let e = GgufFile::open(&split_path(&prefix, 0, 2)).unwrap_err();
    assert!(e.to_string().contains("split.tensors.count"), "{e}");

    // split.no >= split.count, and split.count 0.
    let bad = dir.path().join("e-00001-of-00002.gguf");
    mk(2, 2, 1, &["z"]).write_file(&bad, pattern).unwrap();
    assert!(GgufFile::open(&bad)
        .unwrap_err()
        .to_string()
        .contains("not below split.count"));
    mk(0, 0, 1, &["z"]).write_file(&bad, pattern).unwrap();
    assert!(GgufFile::open(&bad)
        .unwrap_err()
        .to_string()
        .contains("split.count is 0"));

    // A writer that already has split keys cannot be split again.
    assert!(mk(0, 2, 1, &["z"]).split(2).is_err());
}

#[test]
fn split_plans_and_streamed_parts() {
    let w = model_writer(); // 7 tensors
    let counts = |parts: &[GgufWriter]| parts.iter().map(|p| p.tensor_count()).collect::<Vec<_>>();
    assert_eq!(counts(&w.split_max_tensors(3).unwrap()), vec![3, 3, 1]);
    assert_eq!(counts(&w.split(2).unwrap()), vec![3, 4]);
    assert_eq!(counts(&w.split_at(&[1, 1, 7]).unwrap()), vec![1, 0, 6, 0]);
    assert!(w.split_at(&[4, 2]).is_err());
    assert!(w.split_at(&[8]).is_err());
    assert!(w.split(0).is_err());
    assert!(w.split_max_tensors(0).is_err());

    // Streaming each part, as a generator of multi-GB models would.
    let dir = TempDir::new("splitstream");
    let prefix = dir.path().join("gen");
    let mut w = w;
    w.set_alignment(64).unwrap();
    let parts = w.split_max_tensors(2).unwrap();
    let n = parts.len();
    assert_eq!(n, 4);
    for (i, p) in parts.iter().enumerate() {
        assert_eq!(p.get("split.no"), Some(&Value::U16(i as u16)));
        assert_eq!(p.get("general.architecture").is_some(), i == 0);
        let mut s = p.begin(&split_path(&prefix, i, n)).unwrap();
        for t in s.tensors().to_vec() {
            let d = pattern(&t);
            for c in d.chunks(100) {
                s.write_tensor_chunk(&t.name, c).unwrap();
            }
        }
        s.finish().unwrap();
    }
    let f = GgufFile::open(&split_path(&prefix, 3, n)).unwrap();
    assert_eq!(f.split_count(), 4);
    assert_eq!(f.tensors().len(), 7);
    for s in 0..4 {
        assert_eq!(f.part_alignment(s), Some(64));
    }
    for t in f.tensors() {
        assert_eq!(t.offset % 64, 0);
        assert_eq!(f.tensor_data(t).unwrap(), pattern(t).as_slice());
    }
}
