//! Writer -> reader round trips.

mod common;

use common::{pattern, small_writer, TempDir};
use moxie_gguf::{
    Array, ArrayData, GgmlType, GgufError, GgufFile, GgufWriter, Strings, Value, ValueType,
    MAX_ARRAY_DEPTH,
};

fn nested(depth: usize) -> Array {
    let mut a = Array::from(vec![7u8]);
    for _ in 1..depth {
        a = Array::from(vec![a]);
    }
    a
}

fn all_values() -> Vec<(&'static str, Value)> {
    vec![
        ("v.u8", Value::U8(255)),
        ("v.i8", Value::I8(-128)),
        ("v.u16", Value::U16(65535)),
        ("v.i16", Value::I16(-32768)),
        ("v.u32", Value::U32(u32::MAX)),
        ("v.i32", Value::I32(i32::MIN)),
        ("v.u64", Value::U64(u64::MAX)),
        ("v.i64", Value::I64(i64::MIN)),
        ("v.f32", Value::F32(-1.5e-38)),
        ("v.f32.inf", Value::F32(f32::INFINITY)),
        ("v.f32.neg0", Value::F32(-0.0)),
        ("v.f64", Value::F64(std::f64::consts::PI)),
        ("v.bool.t", Value::Bool(true)),
        ("v.bool.f", Value::Bool(false)),
        (
            "v.str",
            Value::from("héllo wörld ✓ <｜begin▁of▁sentence｜>"),
        ),
        ("v.str.empty", Value::from("")),
        ("a.u8", Value::from(vec![0u8, 1, 255])),
        ("a.i8", Value::from(vec![-1i8, 0, 127])),
        ("a.u16", Value::from(vec![1u16, 65535])),
        ("a.i16", Value::from(vec![-2i16, 2])),
        ("a.u32", Value::from(vec![1u32, 2, 3])),
        ("a.i32", Value::from(vec![-1i32, 1 << 30])),
        ("a.u64", Value::from(vec![u64::MAX, 0])),
        ("a.i64", Value::from(vec![i64::MIN, i64::MAX])),
        ("a.f32", Value::from(vec![0.5f32, -2.25, 1e30])),
        ("a.f64", Value::from(vec![1e-300f64, -0.0])),
        ("a.bool", Value::from(vec![true, false, true])),
        ("a.str", Value::from(vec!["x", "", "ü", "Ġthe"])),
        ("a.empty.f32", Value::Array(Array::empty(ValueType::F32))),
        ("a.empty.str", Value::Array(Array::empty(ValueType::String))),
        ("a.empty.arr", Value::Array(Array::empty(ValueType::Array))),
        (
            "a.nested",
            Value::from(vec![
                Array::from(vec![1i32, 2, 3]),
                Array::from_strs(["p", "q"]),
                Array::from(vec![
                    Array::from(vec![1.5f64]),
                    Array::empty(ValueType::Bool),
                ]),
                Array::empty(ValueType::U64),
            ]),
        ),
        ("a.deep", Value::Array(nested(MAX_ARRAY_DEPTH))),
    ]
}

#[test]
fn every_value_type_round_trips() {
    let mut w = GgufWriter::new();
    let vals = all_values();
    for (k, v) in &vals {
        w.add(k, v.clone()).unwrap();
    }
    let bytes = w.write_to_bytes(|_| unreachable!()).unwrap();
    let f = GgufFile::from_bytes("values.gguf", bytes).unwrap();
    let md = f.metadata();
    assert_eq!(md.len(), vals.len());
    // File order is insertion order.
    let keys: Vec<&str> = md.keys().collect();
    let want: Vec<&str> = vals.iter().map(|(k, _)| *k).collect();
    assert_eq!(keys, want);
    for (k, v) in &vals {
        let got = md.get(k).unwrap();
        assert_eq!(got.value_type(), v.value_type(), "{k}");
        match (got, v) {
            (Value::F32(a), Value::F32(b)) => assert_eq!(a.to_bits(), b.to_bits(), "{k}"),
            (Value::F64(a), Value::F64(b)) => assert_eq!(a.to_bits(), b.to_bits(), "{k}"),
            _ => assert_eq!(got, v, "{k}"),
        }
    }
    // Accessors.
    assert_eq!(md.get_u64("v.u8"), Some(255));
    assert_eq!(md.get_u64("v.i8"), None);
    assert_eq!(md.get_i64("v.i64"), Some(i64::MIN));
    assert_eq!(md.get_u64("v.u64"), Some(u64::MAX));
    assert_eq!(md.get_i64("v.u64"), None);
    assert_eq!(md.get_f64("v.f64"), Some(std::f64::consts::PI));
    assert_eq!(md.get_f64("v.u16"), Some(65535.0));
    assert_eq!(md.get_bool("v.bool.t"), Some(true));
    assert_eq!(md.get_bool("v.u8"), None);
    assert_eq!(md.get_str("v.str.empty"), Some(""));
    assert_eq!(
        md.get_array("a.str").unwrap().as_strs().unwrap(),
        vec!["x", "", "ü", "Ġthe"]
    );
    assert_eq!(
        md.get_array("a.f32").unwrap().as_f32s().unwrap(),
        &[0.5, -2.25, 1e30]
    );
    assert_eq!(
        md.get_array("a.i32").unwrap().as_i32s().unwrap(),
        &[-1, 1 << 30]
    );
    assert_eq!(
        md.get_array("a.u32").unwrap().as_u32s().unwrap(),
        &[1, 2, 3]
    );
    assert_eq!(
        md.get_array("a.u32").unwrap().to_u64_vec().unwrap(),
        vec![1, 2, 3]
    );
    let n = md.get_array("a.nested").unwrap();
    assert_eq!(n.elem_type(), ValueType::Array);
    assert_eq!(n.len(), 4);
    assert_eq!(n.as_arrays().unwrap()[1].str_at(1), Some("q"));
    assert_eq!(n.depth(), 3);
    assert_eq!(md.get_array("a.deep").unwrap().depth(), MAX_ARRAY_DEPTH);
    assert!(md.require_u64("v.str").is_err());
    assert!(md.require_u64("missing").is_err());
    assert_eq!(md.require_u32("v.u16").unwrap(), 65535);
}

#[test]
fn nan_round_trips_bitwise() {
    let mut w = GgufWriter::new();
    let nan = f32::from_bits(0x7fc0_1234);
    w.add("nan", Value::F32(nan)).unwrap();
    w.add("nans", vec![nan, f32::NAN]).unwrap();
    let f = GgufFile::from_bytes("nan", w.write_to_bytes(|_| vec![]).unwrap()).unwrap();
    match f.metadata().get("nan") {
        Some(Value::F32(x)) => assert_eq!(x.to_bits(), 0x7fc0_1234),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        f.metadata().get_array("nans").unwrap().as_f32s().unwrap()[0].to_bits(),
        0x7fc0_1234
    );
}

#[test]
fn large_string_array_is_compact() {
    let toks: Strings = (0..150_000).map(|i| format!("tok{i}")).collect();
    let mut w = GgufWriter::new();
    w.add("tokenizer.ggml.tokens", Array::from(toks)).unwrap();
    let f = GgufFile::from_bytes("vocab", w.write_to_bytes(|_| vec![]).unwrap()).unwrap();
    let a = f.metadata().get_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(a.len(), 150_000);
    assert_eq!(a.str_at(149_999), Some("tok149999"));
    assert!(matches!(a.data(), ArrayData::String(s) if s.total_bytes() > 0));
    assert_eq!(a.strs().unwrap().nth(12345), Some("tok12345"));
}

#[test]
fn every_ggml_type_row_sizes() {
    let mut w = GgufWriter::new();
    for ty in GgmlType::ALL {
        let bs = ty.block_size() as u64;
        w.add_tensor_info(&format!("{ty}.2d"), &[bs * 3, 2], ty)
            .unwrap();
        w.add_tensor_info(&format!("{ty}.1d"), &[bs], ty).unwrap();
        w.add_tensor_info(&format!("{ty}.4d"), &[bs * 2, 3, 2, 1], ty)
            .unwrap();
        if bs > 1 {
            let e = w
                .add_tensor_info(&format!("{ty}.bad"), &[bs + 1, 2], ty)
                .unwrap_err();
            assert!(e.to_string().contains("not a multiple"), "{e}");
        }
    }
    let bytes = w.write_to_bytes(pattern).unwrap();
    let f = GgufFile::from_bytes("types.gguf", bytes).unwrap();
    assert_eq!(f.tensors().len(), GgmlType::ALL.len() * 3);
    let mut total = 0;
    for ty in GgmlType::ALL {
        let bs = ty.block_size() as u64;
        let ts = ty.type_size() as u64;
        // ik_llama.cpp's `_KS`-style types store a scale before each row's blocks.
        let meta = ty.row_meta_bytes() as u64;
        let t = f.tensor(&format!("{ty}.2d")).unwrap();
        assert_eq!(t.ty, ty);
        assert_eq!(t.dims, vec![bs * 3, 2]);
        assert_eq!(t.row_bytes(), meta + 3 * ts, "{ty}");
        assert_eq!(t.n_rows(), 2);
        assert_eq!(t.n_elements(), bs * 6);
        assert_eq!(t.n_bytes, 2 * (meta + 3 * ts), "{ty}");
        assert_eq!(t.offset % 32, 0);
        assert_eq!(t.file_offset, f.data_offset(0).unwrap() + t.offset);
        assert_eq!(f.tensor_data(t).unwrap(), pattern(t).as_slice());
        let t1 = f.tensor(&format!("{ty}.1d")).unwrap();
        assert_eq!(t1.n_bytes, meta + ts);
        assert_eq!(t1.n_rows(), 1);
        let t4 = f.tensor(&format!("{ty}.4d")).unwrap();
        assert_eq!(t4.n_bytes, (meta + 2 * ts) * 6);
        assert_eq!(t4.n_rows(), 6);
        assert_eq!(f.tensor_data(t4).unwrap(), pattern(t4).as_slice());
        total += t.n_bytes + t1.n_bytes + t4.n_bytes;
    }
    assert_eq!(f.total_tensor_bytes(), total);
}

#[test]
fn alignment_version_and_empty_files() {
    for align in [1u64, 8, 64, 4096] {
        let mut w = small_writer();
        w.set_alignment(align).unwrap();
        w.set_version(2).unwrap();
        let bytes = w.write_to_bytes(pattern).unwrap();
        let f = GgufFile::from_bytes("aligned", bytes).unwrap();
        assert_eq!(f.alignment(), align);
        assert_eq!(f.version(), 2);
        assert_eq!(
            f.metadata().get("general.alignment"),
            Some(&Value::U32(align as u32))
        );
        for t in f.tensors() {
            assert_eq!(t.offset % align, 0);
            assert_eq!(t.file_offset % align, 0);
            assert_eq!(f.tensor_data(t).unwrap(), pattern(t).as_slice());
        }
    }
    let mut w = GgufWriter::new();
    for bad in [0u64, 3, 48, 1 << 32] {
        assert!(w.set_alignment(bad).is_err(), "{bad}");
    }
    assert!(w.add("general.alignment", Value::U64(64)).is_err());
    assert!(w.add("general.alignment", Value::U32(24)).is_err());
    w.add("general.alignment", Value::U32(16)).unwrap();
    assert_eq!(w.alignment(), 16);

    // No metadata, no tensors.
    let f = GgufFile::from_bytes(
        "empty",
        GgufWriter::new().write_to_bytes(|_| vec![]).unwrap(),
    )
    .unwrap();
    assert_eq!(f.metadata().len(), 0);
    assert!(f.tensors().is_empty());
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 32);
    assert_eq!(f.total_tensor_bytes(), 0);

    // A zero-element tensor between two others.
    let mut w = GgufWriter::new();
    w.add_tensor_info("x", &[4], GgmlType::F32).unwrap();
    w.add_tensor_info("empty", &[0, 4], GgmlType::F32).unwrap();
    w.add_tensor_info("y", &[4], GgmlType::F32).unwrap();
    let f = GgufFile::from_bytes("zero", w.write_to_bytes(pattern).unwrap()).unwrap();
    let e = f.tensor("empty").unwrap();
    assert_eq!(e.n_bytes, 0);
    assert_eq!(f.tensor_data(e).unwrap(), &[] as &[u8]);
    assert_eq!(
        f.tensor_data(f.tensor("y").unwrap()).unwrap(),
        pattern(f.tensor("y").unwrap()).as_slice()
    );
}

#[test]
fn writer_rejects_bad_input() {
    let mut w = GgufWriter::new();
    w.add("k", Value::U8(1)).unwrap();
    assert!(w.add("k", Value::U8(2)).is_err());
    assert!(w.add("", Value::U8(2)).is_err());
    assert!(w
        .add("deep", Value::Array(nested(MAX_ARRAY_DEPTH + 1)))
        .is_err());
    w.add_tensor_info("t", &[32], GgmlType::F32).unwrap();
    assert!(w.add_tensor_info("t", &[32], GgmlType::F32).is_err());
    assert!(w.add_tensor_info("", &[32], GgmlType::F32).is_err());
    assert!(w.add_tensor_info("d0", &[], GgmlType::F32).is_err());
    assert!(w
        .add_tensor_info("d5", &[1, 1, 1, 1, 1], GgmlType::F32)
        .is_err());
    assert!(w.add_tensor_info("blk", &[100], GgmlType::Q4_K).is_err());
    assert!(w
        .add_tensor_info("ovf", &[1 << 40, 1 << 40], GgmlType::F32)
        .is_err());
    assert!(w
        .add_tensor_info("ovf2", &[1 << 62], GgmlType::F64)
        .is_err());
    assert!(w.add_tensor_info("big", &[u64::MAX], GgmlType::I8).is_err());
    assert_eq!(w.tensor_count(), 1);
    // Wrong data size from the callback.
    let e = w.write_to_bytes(|_| vec![0u8; 3]).unwrap_err();
    assert!(matches!(e, GgufError::Writer { .. }), "{e}");
}

#[test]
fn set_moves_the_key_to_the_end_and_remove_drops_it() {
    let mut w = GgufWriter::new();
    w.add("a", Value::U8(1)).unwrap();
    w.add("b", Value::U8(2)).unwrap();
    w.add("c", Value::U8(3)).unwrap();
    w.set("a", Value::U32(4)).unwrap();
    w.set("d", Value::U8(5)).unwrap();
    let keys: Vec<&str> = w.metadata().map(|(k, _)| k).collect();
    assert_eq!(keys, ["b", "c", "a", "d"]);
    assert_eq!(w.get("a"), Some(&Value::U32(4)));
    assert_eq!(w.remove("c"), Some(Value::U8(3)));
    assert_eq!(w.remove("c"), None);
    let keys: Vec<&str> = w.metadata().map(|(k, _)| k).collect();
    assert_eq!(keys, ["b", "a", "d"]);
    assert_eq!(w.get("d"), Some(&Value::U8(5)));
    // A rejected value leaves the key set.
    assert!(w.set("general.alignment", Value::U32(3)).is_err());
    w.set("general.alignment", Value::U32(64)).unwrap();
    assert!(w.set("general.alignment", Value::U8(64)).is_err());
    assert_eq!(w.get("general.alignment"), Some(&Value::U32(64)));
    assert_eq!(w.alignment(), 64);
    w.remove("general.alignment");
    assert_eq!(w.alignment(), 32);
    let f = GgufFile::from_bytes("set", w.write_to_bytes(|_| vec![]).unwrap()).unwrap();
    let keys: Vec<&str> = f.metadata().keys().collect();
    assert_eq!(keys, ["b", "a", "d"]);
}

#[test]
fn streaming_writer_matches_in_memory_and_checks_order() {
    let w = small_writer();
    let want = w.write_to_bytes(pattern).unwrap();
    let dir = TempDir::new("stream");
    let path = dir.path().join("s.gguf");
    let mut s = w.begin(&path).unwrap();
    let infos = s.tensors().to_vec();
    // Wrong order.
    assert!(s.write_tensor(&infos[1].name, &pattern(&infos[1])).is_err());
    // Wrong size.
    assert!(s.write_tensor(&infos[0].name, &[1, 2, 3]).is_err());
    // Chunked write of the first tensor.
    let d0 = pattern(&infos[0]);
    s.write_tensor_chunk(&infos[0].name, &d0[..5]).unwrap();
    assert!(s.write_tensor(&infos[1].name, &pattern(&infos[1])).is_err());
    s.write_tensor_chunk(&infos[0].name, &d0[5..]).unwrap();
    assert!(s.write_tensor_chunk(&infos[0].name, &[0]).is_err());
    s.write_tensor(&infos[1].name, &pattern(&infos[1])).unwrap();
    let d2 = pattern(&infos[2]);
    assert!(s
        .write_tensor_chunk(&infos[2].name, &[d2.clone(), vec![0]].concat())
        .is_err());
    for c in d2.chunks(7) {
        s.write_tensor_chunk(&infos[2].name, c).unwrap();
    }
    assert!(s.write_tensor("extra", &[]).is_err());
    s.finish().unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), want);

    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.paths(), std::slice::from_ref(&path));
    assert_eq!(f.tensors(), infos.as_slice());
    assert_eq!(f.tensors(), w.tensor_infos().as_slice());
    for t in f.tensors() {
        assert_eq!(f.tensor_data(t).unwrap(), pattern(t).as_slice());
    }

    // Finish with a tensor missing.
    let mut s = w.begin_with(Vec::new()).unwrap();
    s.write_tensor(&infos[0].name, &pattern(&infos[0])).unwrap();
    let e = s.finish().unwrap_err();
    assert!(e.to_string().contains("b.weight"), "{e}");

    // write_file == write_to_bytes
    let p2 = dir.path().join("w.gguf");
    w.write_file(&p2, pattern).unwrap();
    assert_eq!(std::fs::read(&p2).unwrap(), want);
}

#[test]
fn header_only_file_is_the_full_files_header() {
    let mut w = small_writer();
    w.add("moxie.header_only", true).unwrap();
    let full = w.write_to_bytes(pattern).unwrap();
    let dir = TempDir::new("header-only");
    let path = dir.path().join("h.gguf");
    let n = w.write_header_only(&path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(n, bytes.len() as u64);
    assert_eq!(n, w.data_offset());
    assert_eq!(n % w.alignment(), 0);
    // Byte for byte the full file up to where its data section starts.
    assert_eq!(bytes.as_slice(), &full[..n as usize]);

    let f = GgufFile::open_header_only(&path).unwrap();
    assert!(f.is_header_only());
    assert_eq!(f.tensors(), w.tensor_infos().as_slice());
    assert_eq!(f.metadata().get_bool("moxie.header_only"), Some(true));
    // The data the offsets point at is not there.
    assert!(f.tensor_data(&f.tensors()[0]).is_err());
    assert!(GgufFile::open(&path).is_err());

    let missing = dir.path().join("no/such/dir/h.gguf");
    let e = w.write_header_only(&missing).unwrap_err().to_string();
    assert!(e.contains("no/such/dir"), "{e}");
}

#[test]
fn tensor_data_rejects_foreign_infos() {
    let f = GgufFile::from_bytes("a", small_writer().write_to_bytes(pattern).unwrap()).unwrap();
    let mut t = f.tensors()[0].clone();
    t.file_offset += 32;
    assert!(matches!(
        f.tensor_data(&t),
        Err(GgufError::ForeignTensor { .. })
    ));
    t = f.tensors()[0].clone();
    t.name = "nope".into();
    assert!(f.tensor_data(&t).is_err());
    t = f.tensors()[0].clone();
    t.split = 3;
    assert!(f.tensor_data(&t).is_err());
    assert!(f.tensor_data_by_name("nope").unwrap().is_none());
    assert!(f.tensor_data_by_name("a.weight").unwrap().is_some());

    let h = GgufFile::from_bytes_with("h", small_writer().write_to_bytes(pattern).unwrap(), true)
        .unwrap();
    assert!(h.is_header_only());
    let e = h.tensor_data(&h.tensors()[0]).unwrap_err();
    assert!(matches!(e, GgufError::HeaderOnly { .. }), "{e}");
}

#[test]
fn interleaved_tensors_keep_their_own_type_id() {
    let mut w = GgufWriter::new();
    w.add_tensor_info("blk.0.ffn_up_exps.weight", &[256, 16, 2], GgmlType::Q8_0)
        .unwrap();
    w.add_tensor_info("blk.0.ffn_down.weight", &[256, 8], GgmlType::Q8_0)
        .unwrap();
    w.set_interleaved("blk.0.ffn_up_exps.weight").unwrap();
    // 8 rows per matrix: no whole group of 16.
    let e = w.set_interleaved("blk.0.ffn_down.weight").unwrap_err();
    assert!(e.to_string().contains("no interleaved layout"), "{e}");
    assert!(w.set_interleaved("missing.weight").is_err());

    let bytes = w
        .write_to_bytes(|t| vec![0x11; t.n_bytes as usize])
        .unwrap();
    let id = 1000 + GgmlType::Q8_0.id();
    let name = b"blk.0.ffn_up_exps.weight";
    let at = bytes.windows(name.len()).position(|x| x == name).unwrap() + name.len();
    // n_dims (u32), 3 dims (u64), then the type id.
    assert_eq!(&bytes[at + 4 + 24..at + 4 + 24 + 4], &id.to_le_bytes());

    let f = GgufFile::from_bytes("interleaved.gguf", bytes.clone()).unwrap();
    let t = &f.tensors()[0];
    assert_eq!(
        (t.ty, t.interleaved, t.type_id()),
        (GgmlType::Q8_0, true, id)
    );
    assert!(!f.tensors()[1].interleaved);

    // The same id on a shape without whole groups is refused, naming the tensor and field.
    let mut bad = bytes;
    let name = b"blk.0.ffn_down.weight";
    let at = bad.windows(name.len()).position(|x| x == name).unwrap() + name.len() + 4 + 16;
    bad[at..at + 4].copy_from_slice(&id.to_le_bytes());
    let e = GgufFile::from_bytes("bad.gguf", bad)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("blk.0.ffn_down.weight") && e.contains("interleaved by 16"),
        "{e}"
    );
}
