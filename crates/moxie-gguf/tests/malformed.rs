//! Malformed files: every one must be rejected with an error (never a panic), and parsing must
//! not allocate more than a few MB whatever the counts in the file claim. Allocation is
//! measured per thread by a counting global allocator.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};

use common::{data_end, fixtures_dir, small_file, small_writer, Raw};
use moxie_gguf::{GgufError, GgufFile, MAX_ARRAY_DEPTH};

// ---------------------------------------------------------------------------------------------
// Counting allocator (per thread, so parallel tests do not disturb each other's numbers).

struct Counting;

thread_local! {
    static CUR: Cell<i64> = const { Cell::new(0) };
    static PEAK: Cell<i64> = const { Cell::new(0) };
}

fn note(delta: i64) {
    let _ = CUR.try_with(|c| {
        let v = c.get() + delta;
        c.set(v);
        let _ = PEAK.try_with(|p| {
            if v > p.get() {
                p.set(v)
            }
        });
    });
}

// SAFETY: every method forwards to the system allocator with the caller's arguments unchanged
// and only updates plain thread-local counters (const-initialised, no allocation, no
// destructor), so the GlobalAlloc contract is exactly that of `System`.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged; the caller upholds `alloc`'s contract.
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            note(l.size() as i64);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged; the caller upholds `alloc_zeroed`'s contract.
        let p = unsafe { System.alloc_zeroed(l) };
        if !p.is_null() {
            note(l.size() as i64);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: forwarded unchanged; `p` was allocated by `System` with layout `l`.
        unsafe { System.dealloc(p, l) };
        note(-(l.size() as i64));
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded unchanged; `p` was allocated by `System` with layout `l`.
        let q = unsafe { System.realloc(p, l, new_size) };
        if !q.is_null() {
            note(new_size as i64 - l.size() as i64);
        }
        q
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Peak extra bytes allocated on this thread while running `f`.
fn peak_alloc<R>(f: impl FnOnce() -> R) -> (R, i64) {
    let base = CUR.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let r = f();
    (r, PEAK.with(Cell::get) - base)
}

/// Peak allocation allowed for one parse of a malformed file.
const ALLOC_LIMIT: i64 = 4 << 20;

/// Parses `bytes` under `catch_unwind` and the allocation counter; returns the result.
fn parse(name: &str, bytes: Vec<u8>, header_only: bool) -> Result<GgufFile, GgufError> {
    let (r, peak) = peak_alloc(|| {
        catch_unwind(AssertUnwindSafe(|| {
            GgufFile::from_bytes_with(name, bytes, header_only)
        }))
    });
    let r = r.unwrap_or_else(|_| panic!("{name}: the parser panicked"));
    assert!(peak < ALLOC_LIMIT, "{name}: parse allocated {peak} bytes");
    r
}

/// Asserts that `bytes` is rejected; returns the error text.
fn reject(name: &str, bytes: Vec<u8>, header_only: bool) -> String {
    match parse(name, bytes, header_only) {
        Ok(f) => panic!("{name}: malformed file accepted: {f:?}"),
        Err(e) => e.to_string(),
    }
}

// ---------------------------------------------------------------------------------------------
// Hand-built files.

const F32: u32 = 0;
const Q4_0: u32 = 2;
const Q8_0: u32 = 8;
const F64: u32 = 28;

#[derive(Clone)]
struct Spec {
    magic: Vec<u8>,
    version: u32,
    n_tensors: Option<u64>,
    n_kv: Option<u64>,
    kvs: Vec<Vec<u8>>,
    /// name, dims, type id, offset
    tensors: Vec<(Vec<u8>, Vec<u64>, u32, u64)>,
    /// Replace tensor `.0`'s n_dims field by `.1` (dims written as given).
    n_dims_override: Option<(usize, u32)>,
    align: usize,
    data: usize,
}

fn kv(f: impl FnOnce(&mut Raw)) -> Vec<u8> {
    let mut r = Raw::default();
    f(&mut r);
    r.done()
}

fn base() -> Spec {
    Spec {
        magic: b"GGUF".to_vec(),
        version: 3,
        n_tensors: None,
        n_kv: None,
        kvs: vec![
            kv(|r| {
                r.kv_str("general.architecture", "test");
            }),
            kv(|r| {
                r.kv_u32("test.count", 3);
            }),
            kv(|r| {
                r.str("tokenizer.ggml.tokens")
                    .u32(9)
                    .u32(8)
                    .u64(3)
                    .str("a")
                    .str("bc")
                    .str("d");
            }),
        ],
        tensors: vec![
            (b"a".to_vec(), vec![8, 2], F32, 0),
            (b"b".to_vec(), vec![64], Q4_0, 64),
            (b"c".to_vec(), vec![32], Q8_0, 128),
        ],
        n_dims_override: None,
        align: 32,
        data: 128 + 34,
    }
}

fn build(s: &Spec) -> Vec<u8> {
    let mut r = Raw::header(
        &s.magic,
        s.version,
        s.n_tensors.unwrap_or(s.tensors.len() as u64),
        s.n_kv.unwrap_or(s.kvs.len() as u64),
    );
    for k in &s.kvs {
        r.bytes(k);
    }
    for (i, (name, dims, ty, off)) in s.tensors.iter().enumerate() {
        r.u64(name.len() as u64).bytes(name);
        match s.n_dims_override {
            Some((j, n)) if j == i => r.u32(n),
            _ => r.u32(dims.len() as u32),
        };
        for &d in dims {
            r.u64(d);
        }
        r.u32(*ty).u64(*off);
    }
    r.data(s.align, s.data);
    r.done()
}

fn with(f: impl FnOnce(&mut Spec)) -> Vec<u8> {
    let mut s = base();
    f(&mut s);
    build(&s)
}

fn set_kv(i: usize, f: impl FnOnce(&mut Raw)) -> Vec<u8> {
    with(|s| s.kvs[i] = kv(f))
}

fn nested_array(depth: usize) -> Vec<u8> {
    // key, type array, then depth-1 levels of "array of 1 array", then an array of one u8.
    kv(|r| {
        r.str("deep").u32(9);
        for _ in 1..depth {
            r.u32(9).u64(1);
        }
        r.u32(0).u64(1).u8(7);
    })
}

/// (label, bytes, header_only, expected text in the error)
fn cases() -> Vec<(String, Vec<u8>, bool, &'static str)> {
    let mut v: Vec<(String, Vec<u8>, bool, &'static str)> = Vec::new();
    let mut add = |label: &str, bytes: Vec<u8>, expect: &'static str| {
        v.push((label.to_owned(), bytes, false, expect));
    };
    let huge = [u64::MAX, 1 << 60, 1 << 40, 100_000];

    add(
        "bad magic",
        with(|s| s.magic = b"GGUG".to_vec()),
        "not a GGUF file",
    );
    add(
        "zero magic",
        with(|s| s.magic = vec![0; 4]),
        "not a GGUF file",
    );
    add(
        "lower-case magic",
        with(|s| s.magic = b"gguf".to_vec()),
        "not a GGUF file",
    );
    add("empty file", vec![], "truncated: magic at byte 0");
    add("2-byte file", b"GG".to_vec(), "truncated: magic");
    add("version 0", with(|s| s.version = 0), "version 0 is invalid");
    add("version 1", with(|s| s.version = 1), "GGUF v1");
    add(
        "version 4",
        with(|s| s.version = 4),
        "unsupported GGUF version 4",
    );
    add("big-endian v3", with(|s| s.version = 3 << 24), "big-endian");
    add(
        "version u32::MAX",
        with(|s| s.version = u32::MAX),
        "unsupported GGUF version",
    );
    for h in huge {
        add(
            &format!("tensor count {h}"),
            with(|s| s.n_tensors = Some(h)),
            "tensor count at byte 8 is",
        );
        add(
            &format!("kv count {h}"),
            with(|s| s.n_kv = Some(h)),
            "metadata key-value count at byte 16 is",
        );
    }
    add(
        "tensor count +1",
        with(|s| s.n_tensors = Some(4)),
        "tensor #3",
    );
    add("kv count +1", with(|s| s.n_kv = Some(4)), "");
    for h in huge {
        add(
            &format!("key length {h}"),
            set_kv(0, |r| {
                r.u64(h).bytes(b"general.architecture").u32(8).str("x");
            }),
            "metadata key #0 key length at byte 24",
        );
        add(
            &format!("string value length {h}"),
            set_kv(0, |r| {
                r.str("general.architecture").u32(8).u64(h).bytes(b"test");
            }),
            "metadata key #0 'general.architecture' value length",
        );
        add(
            &format!("string array length {h}"),
            set_kv(2, |r| {
                r.str("tokenizer.ggml.tokens").u32(9).u32(8).u64(h).str("a");
            }),
            "'tokenizer.ggml.tokens' array length",
        );
        add(
            &format!("f32 array length {h}"),
            set_kv(2, |r| {
                r.str("f").u32(9).u32(6).u64(h).u32(0);
            }),
            "'f' array length",
        );
        add(
            &format!("u64 array length {h}"),
            set_kv(2, |r| {
                r.str("f").u32(9).u32(10).u64(h).u64(0);
            }),
            "'f' array length",
        );
        add(
            &format!("nested array length {h}"),
            set_kv(2, |r| {
                r.str("n").u32(9).u32(9).u64(h).u32(0).u64(0);
            }),
            "'n' array length",
        );
        add(
            &format!("inner array length {h}"),
            set_kv(2, |r| {
                r.str("n").u32(9).u32(9).u64(1).u32(0).u64(h);
            }),
            "'n' element 0 array length",
        );
        add(
            &format!("string element length {h}"),
            set_kv(2, |r| {
                r.str("tokenizer.ggml.tokens")
                    .u32(9)
                    .u32(8)
                    .u64(3)
                    .str("a")
                    .u64(h)
                    .bytes(b"bc")
                    .str("d");
            }),
            "'tokenizer.ggml.tokens' element 1 length",
        );
    }
    let mut add = |label: &str, bytes: Vec<u8>, expect: &'static str| {
        v.push((label.to_owned(), bytes, false, expect));
    };
    for h in huge {
        let mut s = base();
        s.tensors.truncate(1);
        s.data = 64;
        let mut b = build(&s);
        // Append a hand-made second tensor record whose name length is huge.
        b.truncate(header_len(&s));
        let mut r = Raw(b);
        r.u64(h).bytes(b"b").u32(1).u64(32).u32(F32).u64(64);
        r.data(32, 160);
        let mut b = r.done();
        // Fix the tensor count.
        b[8..16].copy_from_slice(&2u64.to_le_bytes());
        add(
            &format!("tensor name length {h}"),
            b,
            "tensor #1 name length",
        );
    }
    add(
        "empty key",
        set_kv(1, |r| {
            r.str("").u32(4).u32(1);
        }),
        "empty key",
    );
    add(
        "key invalid UTF-8",
        set_kv(1, |r| {
            r.u64(3).bytes(&[b'k', 0xff, 0xfe]).u32(4).u32(1);
        }),
        "metadata key #1 key at byte",
    );
    add(
        "string invalid UTF-8",
        set_kv(0, |r| {
            r.str("general.architecture")
                .u32(8)
                .u64(2)
                .bytes(&[0xc3, 0x28]);
        }),
        "invalid UTF-8",
    );
    add(
        "string element invalid UTF-8",
        set_kv(2, |r| {
            r.str("tokenizer.ggml.tokens")
                .u32(9)
                .u32(8)
                .u64(3)
                .str("a")
                .str("b")
                .u64(1)
                .u8(0x80);
        }),
        "'tokenizer.ggml.tokens' element 2 at byte",
    );
    add(
        "value type 13",
        set_kv(1, |r| {
            r.str("test.count").u32(13).u32(3);
        }),
        "unknown metadata value type id 13",
    );
    add(
        "value type u32::MAX",
        set_kv(1, |r| {
            r.str("test.count").u32(u32::MAX).u32(3);
        }),
        "unknown metadata value type id 4294967295",
    );
    add(
        "array element type 99",
        set_kv(2, |r| {
            r.str("a").u32(9).u32(99).u64(1).u32(0);
        }),
        "'a' array element type",
    );
    add(
        "nested depth limit+1",
        with(|s| s.kvs[2] = nested_array(MAX_ARRAY_DEPTH + 1)),
        "nested more than 16 levels",
    );
    add(
        "nested depth 1000",
        with(|s| s.kvs[2] = nested_array(1000)),
        "nested more than",
    );
    add(
        "bool value 2",
        set_kv(1, |r| {
            r.str("b").u32(7).u8(2);
        }),
        "bool value 2 is neither 0 nor 1",
    );
    add(
        "bool array element 7",
        set_kv(1, |r| {
            r.str("b").u32(9).u32(7).u64(3).u8(1).u8(0).u8(7);
        }),
        "'b' element 2 at byte",
    );
    add(
        "duplicate key",
        with(|s| s.kvs[1] = s.kvs[0].clone()),
        "duplicate key 'general.architecture'",
    );
    for (a, label) in [
        (0u32, "alignment 0"),
        (3, "alignment 3"),
        (48, "alignment 48"),
        (u32::MAX, "alignment max"),
    ] {
        add(
            label,
            with(|s| {
                s.kvs.push(kv(|r| {
                    r.kv_u32("general.alignment", a);
                }))
            }),
            "general.alignment' at byte",
        );
    }
    add(
        "alignment as u64",
        with(|s| {
            s.kvs.push(kv(|r| {
                r.str("general.alignment").u32(10).u64(32);
            }))
        }),
        "has type u64, expected u32",
    );
    add(
        "alignment as string",
        with(|s| {
            s.kvs.push(kv(|r| {
                r.kv_str("general.alignment", "32");
            }))
        }),
        "has type string, expected u32",
    );
    add(
        "empty tensor name",
        with(|s| s.tensors[0].0 = vec![]),
        "empty tensor name",
    );
    add(
        "tensor name invalid UTF-8",
        with(|s| s.tensors[1].0 = vec![b'b', 0xff]),
        "tensor #1 name at byte",
    );
    add(
        "duplicate tensor name",
        with(|s| s.tensors[2].0 = b"a".to_vec()),
        "duplicate tensor name 'a'",
    );
    add(
        "n_dims 0",
        with(|s| s.n_dims_override = Some((1, 0))),
        "tensor 'b' n_dims at byte",
    );
    add(
        "n_dims 5",
        with(|s| s.n_dims_override = Some((1, 5))),
        "n_dims is 5, must be 1 to 4",
    );
    add(
        "n_dims u32::MAX",
        with(|s| s.n_dims_override = Some((1, u32::MAX))),
        "n_dims is 4294967295",
    );
    add(
        "5 dims",
        with(|s| s.tensors[0].1 = vec![8, 2, 1, 1, 1]),
        "n_dims is 5",
    );
    add(
        "dim u64::MAX",
        with(|s| s.tensors[0].1 = vec![u64::MAX, 2]),
        "tensor 'a' dimension 0 at byte",
    );
    add(
        "dim 2^63",
        with(|s| s.tensors[0].1 = vec![8, 1 << 63]),
        "tensor 'a' dimension 1 at byte",
    );
    add(
        "element count overflow",
        with(|s| s.tensors[0].1 = vec![1 << 32, 1 << 32]),
        "element count of shape 4294967296 x 4294967296",
    );
    add(
        "row count overflow",
        with(|s| s.tensors[0].1 = vec![8, 1 << 40, 1 << 40, 1]),
        "row count",
    );
    add(
        "4-d overflow",
        with(|s| s.tensors[0].1 = vec![1 << 31, 1 << 31, 1 << 31, 2]),
        "overflows",
    );
    add(
        "byte size overflow",
        with(|s| {
            s.tensors[0].1 = vec![1 << 62];
            s.tensors[0].2 = F64;
        }),
        "byte size of F64 shape",
    );
    add(
        "row not a block multiple",
        with(|s| s.tensors[1].1 = vec![33]),
        "row length 33 is not a multiple of the Q4_0 block size 32",
    );
    for id in [4u32, 5, 31, 100, u32::MAX] {
        add(
            &format!("tensor type {id}"),
            with(|s| s.tensors[1].2 = id),
            "tensor 'b' type at byte",
        );
    }
    add(
        "misaligned offset 1",
        with(|s| s.tensors[1].3 = 65),
        "data offset 65 is not a multiple of the alignment 32",
    );
    add(
        "misaligned offset 16",
        with(|s| s.tensors[2].3 = 112),
        "tensor 'c' offset at byte",
    );
    add("overlap b on a", with(|s| s.tensors[1].3 = 32), "overlap");
    add(
        "overlap c on b",
        with(|s| s.tensors[2].3 = 64),
        "tensor 'c' offset at byte",
    );
    add(
        "same offset",
        with(|s| s.tensors[2].3 = 0),
        "overlap tensor 'a'",
    );
    add(
        "offset past end",
        with(|s| s.tensors[2].3 = 1 << 40),
        "truncated: tensor 'c'",
    );
    add(
        "offset near u64::MAX",
        with(|s| s.tensors[2].3 = !31u64),
        "overflows",
    );
    add(
        "data one byte short",
        with(|s| s.data = 161),
        "truncated: tensor 'c'",
    );
    add(
        "no data (header only)",
        with(|s| s.data = 0),
        "open_header_only",
    );
    add(
        "alignment 128 makes data misaligned",
        with(|s| {
            s.kvs.push(kv(|r| {
                r.kv_u32("general.alignment", 128);
            }))
        }),
        "data offset 64 is not a multiple of the alignment 128",
    );
    let no_pad = {
        let s = base();
        let mut b = build(&s);
        b.truncate(header_len(&s));
        b
    };
    add("no padding, no data", no_pad.clone(), "truncated");

    // Header-only mode still validates the index.
    for (label, bytes, expect) in [
        (
            "header-only overlap",
            with(|s| s.tensors[1].3 = 32),
            "overlap",
        ),
        (
            "header-only misaligned",
            with(|s| s.tensors[1].3 = 8),
            "not a multiple of the alignment",
        ),
        (
            "header-only bad type",
            with(|s| s.tensors[1].2 = 100),
            "unknown ggml tensor type id 100",
        ),
        (
            "header-only truncated header",
            no_pad[..no_pad.len() - 1].to_vec(),
            "truncated",
        ),
        (
            "header-only offset overflow",
            with(|s| s.tensors[2].3 = !31u64),
            "overflows",
        ),
    ] {
        v.push((label.to_owned(), bytes, true, expect));
    }
    v
}

fn header_len(s: &Spec) -> usize {
    build(&Spec {
        data: 0,
        align: 1,
        ..s.clone()
    })
    .len()
}

#[test]
fn allocation_counter_works() {
    let (v, peak) = peak_alloc(|| vec![1u8; 8 << 20]);
    assert!(peak >= 8 << 20, "counter saw only {peak} bytes");
    drop(v);
    // A valid real model's header parses well within the limit (its tensor data is borrowed).
    let bytes = std::fs::read(fixtures_dir().join("models/qwen3moe-tiny-Q8_0.gguf")).unwrap();
    let (f, peak) = peak_alloc(|| GgufFile::from_bytes("q8", bytes).unwrap());
    assert!(f.tensors().len() > 10);
    assert!(peak < ALLOC_LIMIT / 2, "valid parse allocated {peak} bytes");
}

#[test]
fn claimed_counts_do_not_amplify_memory() {
    // 16 nested arrays of arrays, each claiming as many elements as the 1 MB rest of the file
    // could hold, then a depth violation: only bounded reservations may happen.
    let mut r = Raw::header(b"GGUF", 3, 0, 1);
    r.str("chain").u32(9);
    for _ in 0..MAX_ARRAY_DEPTH {
        r.u32(9).u64(80_000);
    }
    r.bytes(&vec![0u8; 1 << 20]);
    let msg = reject("chain", r.done(), false);
    assert!(msg.contains("nested more than"), "{msg}");

    // A string array claiming 131073 strings: 1 MB of empty strings, then a bad length.
    let mut r = Raw::header(b"GGUF", 3, 0, 1);
    r.str("strs").u32(9).u32(8).u64(131_073);
    r.bytes(&vec![0u8; 1 << 20]);
    r.u64(u64::MAX);
    reject("strs", r.done(), false);

    // Tensor and key counts at their bound in a 4 MB file of zeros.
    for (nt, nkv) in [((4u64 << 20) / 33, 0u64), (0, (4 << 20) / 14)] {
        let mut r = Raw::header(b"GGUF", 3, nt, nkv);
        r.bytes(&vec![0u8; 4 << 20]);
        reject("counts", r.done(), false);
    }
}

#[test]
fn hand_made_malformed_files_are_rejected() {
    // Sanity: the base file is valid.
    let ok = parse("base", build(&base()), false).unwrap();
    assert_eq!(ok.tensors().len(), 3);
    assert_eq!(ok.metadata().len(), 3);

    let cases = cases();
    assert!(cases.len() >= 50, "only {} cases", cases.len());
    for (label, bytes, header_only, expect) in cases {
        let msg = reject(&label, bytes, header_only);
        assert!(
            msg.contains(expect),
            "{label}: error {msg:?} does not contain {expect:?}"
        );
        assert!(
            msg.starts_with(&label),
            "{label}: error {msg:?} does not name the file"
        );
    }
}

#[test]
fn error_fields_and_offsets() {
    let e = parse("f", with(|s| s.n_kv = Some(u64::MAX)), false).unwrap_err();
    assert!(
        matches!(e, GgufError::LengthTooLarge { offset: 16, .. }),
        "{e:?}"
    );
    let e = parse("f", with(|s| s.tensors[1].3 = 65), false).unwrap_err();
    let GgufError::Misaligned {
        field,
        offset,
        value,
        alignment,
        ..
    } = e
    else {
        panic!()
    };
    assert_eq!(field, "tensor 'b' offset");
    assert_eq!((value, alignment), (65, 32));
    // The offset field of tensor b sits 8 bytes before the end of its record.
    let s = base();
    let b = build(&s);
    let hl = header_len(&s) as u64;
    let rec_c = hl - (8 + 1 + 4 + 8 + 4 + 8);
    assert_eq!(offset, rec_c - 8);
    assert_eq!(
        &b[offset as usize..offset as usize + 8],
        &64u64.to_le_bytes()
    );
    let e = parse("f", with(|s| s.kvs[1] = s.kvs[0].clone()), false).unwrap_err();
    assert!(
        matches!(
            e,
            GgufError::DuplicateKey {
                index: 1,
                first: 0,
                ..
            }
        ),
        "{e:?}"
    );
    let e = parse("f", with(|s| s.tensors[1].2 = 4), false).unwrap_err();
    assert!(
        matches!(e, GgufError::UnknownTensorType { id: 4, .. }),
        "{e:?}"
    );
    let e = parse("f", with(|s| s.version = 1), false).unwrap_err();
    assert!(
        matches!(e, GgufError::UnsupportedVersion { version: 1, .. }),
        "{e:?}"
    );
}

#[test]
fn every_truncation_of_a_small_file_is_rejected() {
    let w = small_writer();
    let full = small_file();
    let end = data_end(&w);
    let header = w.header_len() as usize;
    assert!(end <= full.len());
    // The full file and the file cut right after the last tensor's data are valid.
    parse("full", full.clone(), false).unwrap();
    parse("cut at data end", full[..end].to_vec(), false).unwrap();
    parse("header only", full[..header].to_vec(), true).unwrap();
    let mut n = 0;
    for cut in 0..end {
        let msg = reject(&format!("cut{cut}"), full[..cut].to_vec(), false);
        assert!(msg.contains("truncated") || cut < 4, "cut {cut}: {msg}");
        if cut < header {
            reject(&format!("hcut{cut}"), full[..cut].to_vec(), true);
        }
        n += 1;
    }
    assert!(n > 300);
}

fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len())
        .position(|w| w == needle)
        .expect("pattern not found")
}

#[test]
fn corrupted_real_fixture_is_rejected() {
    let path = fixtures_dir().join("models/qwen3moe-tiny-IQ1_S.gguf");
    let orig = std::fs::read(&path).unwrap();
    let f = GgufFile::open(&path).unwrap();
    let header = f.data_offset(0).unwrap() as usize;
    let len = orig.len();

    // Truncations: every byte of the first 64, 300 points in the header, 100 in the data.
    let mut cuts: Vec<usize> = (0..64).collect();
    cuts.extend((0..300).map(|i| 64 + i * (header - 64) / 300));
    cuts.extend((0..100).map(|i| header + i * (len - header) / 100));
    for cut in cuts {
        reject(&format!("fixture cut {cut}"), orig[..cut].to_vec(), false);
    }

    let patch = |at: usize, bytes: &[u8]| {
        let mut b = orig.clone();
        b[at..at + bytes.len()].copy_from_slice(bytes);
        b
    };
    let huge = [u64::MAX, 1 << 60, len as u64];
    for h in huge {
        reject("fixture tensor count", patch(8, &h.to_le_bytes()), false);
        reject("fixture kv count", patch(16, &h.to_le_bytes()), false);
    }
    // tokenizer.ggml.tokens: key, type 9, elem type 8, count, first string length.
    let key = b"tokenizer.ggml.tokens";
    let at = find(&orig, key) + key.len();
    assert_eq!(&orig[at..at + 8], &[9, 0, 0, 0, 8, 0, 0, 0]);
    for h in huge {
        reject(
            "fixture vocab count",
            patch(at + 8, &h.to_le_bytes()),
            false,
        );
        reject(
            "fixture first token length",
            patch(at + 16, &h.to_le_bytes()),
            false,
        );
    }
    reject(
        "fixture vocab elem type",
        patch(at + 4, &77u32.to_le_bytes()),
        false,
    );
    reject("fixture vocab type", patch(at, &13u32.to_le_bytes()), false);

    // The first tensor record: name length + name, n_dims, dims, type, offset.
    let t0 = &f.tensors()[0];
    let mut rec = (t0.name.len() as u64).to_le_bytes().to_vec();
    rec.extend_from_slice(t0.name.as_bytes());
    let r = find(&orig[header / 2..], &rec) + header / 2;
    let nd = r + rec.len();
    let ty = nd + 4 + 8 * t0.dims.len();
    let off = ty + 4;
    assert_eq!(&orig[ty..ty + 4], &t0.ty.id().to_le_bytes());
    for (label, b) in [
        ("fixture n_dims 0", patch(nd, &0u32.to_le_bytes())),
        ("fixture n_dims 9", patch(nd, &9u32.to_le_bytes())),
        ("fixture dim huge", patch(nd + 4, &u64::MAX.to_le_bytes())),
        (
            "fixture dim odd",
            patch(nd + 4, &(t0.dims[0] + 1).to_le_bytes()),
        ),
        ("fixture type 99", patch(ty, &99u32.to_le_bytes())),
        (
            "fixture offset +1",
            patch(off, &(t0.offset + 1).to_le_bytes()),
        ),
        (
            "fixture offset huge",
            patch(off, &(1u64 << 50).to_le_bytes()),
        ),
        ("fixture magic", patch(0, b"GGML")),
        ("fixture v1", patch(4, &1u32.to_le_bytes())),
    ] {
        reject(label, b, false);
    }
    // Overlap: give tensor 1 the offset of tensor 0.
    let t1 = &f.tensors()[1];
    let mut rec1 = (t1.name.len() as u64).to_le_bytes().to_vec();
    rec1.extend_from_slice(t1.name.as_bytes());
    let r1 = find(&orig[header / 2..], &rec1) + header / 2;
    let off1 = r1 + rec1.len() + 4 + 8 * t1.dims.len() + 4;
    assert_eq!(&orig[off1..off1 + 8], &t1.offset.to_le_bytes());
    let msg = reject(
        "fixture overlap",
        patch(off1, &t0.offset.to_le_bytes()),
        false,
    );
    assert!(msg.contains("overlap"), "{msg}");
}

#[test]
fn header_only_fixture_truncations_are_rejected() {
    let path = fixtures_dir().join("headers/DeepSeek-V3-671B-Q4_K_M.header.gguf");
    let orig = std::fs::read(&path).unwrap();
    parse("deepseek header", orig.clone(), true).unwrap();
    // The data section starts at the end of the file; the tensor infos end within the last
    // 32 bytes, so every cut before that is an incomplete header.
    let n = orig.len() - 32;
    for i in 0..200 {
        let cut = i * n / 200;
        reject(&format!("deepseek cut {cut}"), orig[..cut].to_vec(), true);
    }
}

/// xorshift64*: a fixed-seed generator for the fuzz loop.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn fuzz(
    label: &str,
    orig: &[u8],
    header: usize,
    iters: usize,
    header_only: bool,
    seed: u64,
) -> (usize, usize) {
    let mut rng = Rng(seed);
    let (mut ok, mut err) = (0, 0);
    for it in 0..iters {
        let mut b = orig.to_vec();
        let flips = 1 + rng.below(4);
        for _ in 0..flips {
            // Mostly in the header, where the structure is.
            let at = if rng.below(8) == 0 {
                rng.below(b.len())
            } else {
                rng.below(header)
            };
            match rng.below(4) {
                0 => b[at] ^= 1 << rng.below(8),
                1 => b[at] = rng.next() as u8,
                2 => b[at] = 0xff,
                _ => b[at] = 0,
            }
        }
        if rng.below(10) == 0 {
            b.truncate(rng.below(b.len() + 1));
        }
        match parse(&format!("{label} #{it}"), b, header_only) {
            Ok(f) => {
                ok += 1;
                for t in f.tensors() {
                    match f.tensor_data(t) {
                        Ok(d) => assert_eq!(d.len() as u64, t.n_bytes),
                        Err(e) => assert!(header_only, "{label} #{it}: {e}"),
                    }
                }
            }
            Err(_) => err += 1,
        }
    }
    (ok, err)
}

#[test]
fn random_byte_flips_never_panic() {
    let w = small_writer();
    let file = small_file();
    let (ok, err) = fuzz(
        "flip",
        &file,
        w.header_len() as usize,
        30_000,
        false,
        0x5eed_1234_abcd_0001,
    );
    assert_eq!(ok + err, 30_000);
    assert!(err > 10_000, "too few rejections: {err}");

    let path = fixtures_dir().join("headers/GLM-4.7-355B-Q4_K_M.header.gguf");
    let orig = std::fs::read(&path).unwrap();
    let n = orig.len();
    let (ok, err) = fuzz("glm flip", &orig, n, 1_000, true, 0x5eed_0000_0000_0002);
    assert_eq!(ok + err, 1_000);
}
