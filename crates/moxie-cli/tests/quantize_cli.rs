//! `moxie quantize` against llama-quantize:
//! * every fixture file llama-quantize made from an F32 master with a plain file type
//!   (`llama-quantize IN OUT Q4_K_M`) is reproduced byte for byte;
//! * recipes (`--tensor-type` mixes, `--output-tensor-type`, `--pure`, importance matrices in
//!   both formats, split outputs as llama-gguf-split cuts them) match the goldens made with
//!   llama-quantize by `scripts/quantize_goldens.py` (per-tensor types and hashes, whole
//!   file size and hash);
//! * split output loads (same logits as the unsplit file);
//! * bad input gives a clear error.
//!
//! The fixture tests skip (with a message) when the shared fixtures are absent.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use moxie_gguf::{GgufFile, OpenOptions};
use serde_json::Value;

fn fixtures() -> Option<PathBuf> {
    let dir = match std::env::var_os("MOXIE_FIXTURES") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures"),
    };
    if dir.join("models").is_dir() {
        Some(dir)
    } else {
        eprintln!(
            "skipping: fixture directory {} not found (set MOXIE_FIXTURES)",
            dir.display()
        );
        None
    }
}

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

/// A directory under `tmp` holding the importance matrices of `tests/data` under the names
/// the goldens' llama-quantize runs used. The repo stores the GGUF ones as `*.imatrix-gguf`
/// (no `.gguf` files in git: those are models, which stay in the fixtures).
fn imatrix_workdir(tmp: &TempDir) -> PathBuf {
    let dir = tmp.0.join("imatrix");
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(data_dir()).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_str().unwrap().to_owned();
        if let Some(stem) = name.strip_suffix(".imatrix-gguf") {
            std::fs::copy(&p, dir.join(format!("{stem}.imatrix.gguf"))).unwrap();
        } else if name.ends_with(".imatrix.dat") {
            std::fs::copy(&p, dir.join(&name)).unwrap();
        }
    }
    dir
}

fn moxie_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_moxie"))
        .current_dir(dir)
        .args(args)
        .output()
        .expect("running moxie")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!("moxie-quantize-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }
    fn path(&self, name: &str) -> String {
        self.0.join(name).to_str().unwrap().to_owned()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `moxie logits` of tokens 1,20,300,2000 on `model` with `flags` (2 threads), written to
/// `out` in `tmp`: the .npy bytes and stderr.
fn logits(tmp: &TempDir, model: &str, flags: &[&str], out: &str) -> (Vec<u8>, String) {
    let mut args = vec![
        "logits",
        "-m",
        model,
        "-t",
        "2",
        "--tokens",
        "1,20,300,2000",
    ];
    args.extend(flags);
    args.extend(["--out", out]);
    let o = moxie_in(&tmp.0, &args);
    assert!(o.status.success(), "{}", stderr(&o));
    (std::fs::read(tmp.0.join(out)).unwrap(), stderr(&o))
}

/// SHA-256 (FIPS 180-4), for comparing with the goldens' hashes.
fn sha256(data: &[u8]) -> String {
    const K: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2,
    ];
    let mut h: [u32; 8] = [
        0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
        0x5be0cd19,
    ];
    let mut msg = data.to_vec();
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&((data.len() as u64) * 8).to_be_bytes());
    for block in msg.chunks_exact(64) {
        let mut w = [0u32; 64];
        for i in 0..16 {
            w[i] = u32::from_be_bytes(block[4 * i..4 * i + 4].try_into().unwrap());
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16]
                .wrapping_add(s0)
                .wrapping_add(w[i - 7])
                .wrapping_add(s1);
        }
        let mut v = h;
        for i in 0..64 {
            let s1 = v[4].rotate_right(6) ^ v[4].rotate_right(11) ^ v[4].rotate_right(25);
            let ch = (v[4] & v[5]) ^ (!v[4] & v[6]);
            let t1 = v[7]
                .wrapping_add(s1)
                .wrapping_add(ch)
                .wrapping_add(K[i])
                .wrapping_add(w[i]);
            let s0 = v[0].rotate_right(2) ^ v[0].rotate_right(13) ^ v[0].rotate_right(22);
            let maj = (v[0] & v[1]) ^ (v[0] & v[2]) ^ (v[1] & v[2]);
            let t2 = s0.wrapping_add(maj);
            v = [
                t1.wrapping_add(t2),
                v[0],
                v[1],
                v[2],
                v[3].wrapping_add(t1),
                v[4],
                v[5],
                v[6],
            ];
        }
        for (a, b) in h.iter_mut().zip(v) {
            *a = a.wrapping_add(b);
        }
    }
    h.iter().map(|x| format!("{x:08x}")).collect()
}

#[test]
fn sha256_known_answers() {
    assert_eq!(
        sha256(b"abc"),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    assert_eq!(
        sha256(&[b'a'; 1000]),
        "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3"
    );
}

/// `OUT` and a file type for every fixture `<arch>-tiny-<TYPE>.gguf` that llama-quantize
/// made from the F32 master with a plain file type moxie can write.
#[test]
fn fixture_quantizations_are_reproduced_byte_for_byte() {
    let Some(fx) = fixtures() else { return };
    let tmp = TempDir::new("fixtures");
    let mut names: Vec<String> = std::fs::read_dir(fx.join("models"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_str().unwrap().to_owned())
        .collect();
    names.sort();
    let mut compared = vec![];
    for name in names {
        let Some((stem, ty)) = name
            .strip_suffix(".gguf")
            .and_then(|s| s.rsplit_once("-tiny-"))
        else {
            continue;
        };
        let master = fx.join(format!("models/{stem}-tiny-F32.gguf"));
        if ty == "F32" || !master.is_file() {
            continue;
        }
        let out = tmp.path(&name);
        let o = moxie_in(
            &tmp.0,
            &["quantize", "-q", master.to_str().unwrap(), &out, ty, "2"],
        );
        if !o.status.success() {
            // The IQ1/IQ2/IQ3 and ik_llama.cpp types: a clear refusal.
            let e = stderr(&o);
            assert!(
                e.contains("needs a quantizer moxie does not have yet")
                    || e.contains("unknown file type"),
                "{name}: {e}"
            );
            continue;
        }
        let want = std::fs::read(fx.join("models").join(&name)).unwrap();
        let got = std::fs::read(&out).unwrap();
        assert_eq!(got.len(), want.len(), "{name}: size");
        if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
            panic!("{name}: first difference at byte {i}");
        }
        std::fs::remove_file(&out).unwrap();
        compared.push(name);
    }
    // deepseek2 x7, qwen3moe x7, qwen3next x2, glm4moe, glm-dsa
    assert!(compared.len() >= 18, "compared only {compared:?}");
}

/// The tensors of one written part: (name, type, first 16 hex digits of the data's SHA-256).
fn tensor_hashes(path: &Path) -> Vec<(String, String, String)> {
    let f = GgufFile::open_with(
        path,
        OpenOptions {
            header_only: false,
            follow_splits: false,
        },
    )
    .unwrap();
    f.tensors()
        .iter()
        .map(|t| {
            let d = f.tensor_data(t).unwrap();
            (
                t.name.clone(),
                t.ty.name().to_owned(),
                sha256(d)[..16].to_owned(),
            )
        })
        .collect()
}

#[test]
fn recipes_match_llama_quantize_goldens() {
    let Some(fx) = fixtures() else { return };
    let golden: Value = serde_json::from_str(
        &std::fs::read_to_string(data_dir().join("quantize_goldens.json")).unwrap(),
    )
    .unwrap();
    let tmp = TempDir::new("recipes");
    let imatrix_dir = imatrix_workdir(&tmp);
    let cases = golden["cases"].as_array().unwrap();
    assert!(cases.len() >= 60);
    let mut failures = vec![];
    for (ci, case) in cases.iter().enumerate() {
        let model = fx.join("models").join(case["model"].as_str().unwrap());
        let args: Vec<&str> = case["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        let (flags, ty) = args.split_at(args.len() - 1);
        let out = tmp.path(&format!("case{ci}.gguf"));
        let mut cmd = vec!["quantize", "-q"];
        cmd.extend_from_slice(flags);
        cmd.extend_from_slice(&[model.to_str().unwrap(), &out, ty[0], "2"]);
        // Run where the importance matrices have the names llama-quantize was given: the path
        // is recorded in the output as given.
        let o = moxie_in(&imatrix_dir, &cmd);
        let label = format!("case {ci}: {} {}", case["model"], args.join(" "));
        assert!(o.status.success(), "{label}: {}", stderr(&o));
        let parts = case["parts"].as_array().unwrap();
        for (pi, part) in parts.iter().enumerate() {
            let path = if parts.len() == 1 {
                PathBuf::from(&out)
            } else {
                moxie_gguf::split_path(&tmp.0.join(format!("case{ci}")), pi, parts.len())
            };
            let bytes = std::fs::read(&path)
                .unwrap_or_else(|e| panic!("{label}: part {pi} {}: {e}", path.display()));
            let want: Vec<(String, String, String)> = part["tensors"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| {
                    let s = |i: usize| t[i].as_str().unwrap().to_owned();
                    (s(0), s(1), s(2))
                })
                .collect();
            let got = tensor_hashes(&path);
            let types_eq = got.len() == want.len()
                && got.iter().zip(&want).all(|(g, w)| g.0 == w.0 && g.1 == w.1);
            let data_eq = got == want;
            let size_eq = bytes.len() as u64 == part["bytes"].as_u64().unwrap();
            let file_eq = sha256(&bytes) == part["sha256"].as_str().unwrap();
            if !(types_eq && data_eq && size_eq && file_eq) {
                let diff: Vec<_> = got
                    .iter()
                    .zip(&want)
                    .filter(|(g, w)| g != w)
                    .take(3)
                    .collect();
                failures.push(format!(
                    "{label} part {pi}: types {types_eq} data {data_eq} size {size_eq} file {file_eq}; first differences {diff:?}"
                ));
            }
            std::fs::remove_file(&path).unwrap();
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn split_output_loads_like_the_whole_file() {
    let Some(fx) = fixtures() else { return };
    let tmp = TempDir::new("split");
    let master = fx.join("models/qwen3moe-tiny-F32.gguf");
    let master = master.to_str().unwrap();
    let whole = tmp.path("whole.gguf");
    let o = moxie_in(&tmp.0, &["quantize", "-q", master, &whole, "Q4_K_M"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = moxie_in(
        &tmp.0,
        &[
            "quantize",
            "-q",
            "--split-max-size",
            "1M",
            master,
            &tmp.path("parts.gguf"),
            "Q4_K_M",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let mut parts: Vec<String> = std::fs::read_dir(&tmp.0)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_str().unwrap().to_owned())
        .filter(|n| n.starts_with("parts-"))
        .collect();
    parts.sort();
    // 2.9 MB of tensors in parts of at most 1 MB
    assert!(parts.len() >= 3, "{parts:?}");
    assert_eq!(parts[0], format!("parts-00001-of-{:05}.gguf", parts.len()));
    let first = tmp.path(&parts[0]);
    let split = GgufFile::open(Path::new(&first)).unwrap();
    assert_eq!(split.split_count(), parts.len());
    let one = GgufFile::open(Path::new(&whole)).unwrap();
    assert_eq!(split.tensors().len(), one.tensors().len());
    for t in one.tensors() {
        let s = split.tensor(&t.name).unwrap();
        assert_eq!((s.ty, &s.dims), (t.ty, &t.dims));
        assert_eq!(
            split.tensor_data(s).unwrap(),
            one.tensor_data(t).unwrap(),
            "{}",
            t.name
        );
    }
    // No part holds more than 1 MB of tensor data unless one tensor alone is larger.
    for p in split.paths() {
        let f = GgufFile::open_with(
            p,
            OpenOptions {
                header_only: false,
                follow_splits: false,
            },
        )
        .unwrap();
        assert!(f.tensors().len() == 1 || f.total_tensor_bytes() <= 1_000_000);
    }
    let a = logits(&tmp, &whole, &[], "a.npy").0;
    let b = logits(&tmp, &first, &[], "b.npy").0;
    assert!(a.len() > 4 * 2048);
    assert_eq!(a, b);
}

/// A split input (here an F32 master cut into 3 parts by `moxie quantize ... F32
/// --split-max-tensors 20`) quantizes to the same bytes as the whole master: the split keys
/// are dropped and the tensor order does not depend on the parts.
#[test]
fn split_input_quantizes_like_the_whole_file() {
    let Some(fx) = fixtures() else { return };
    let tmp = TempDir::new("split-input");
    let master = fx.join("models/deepseek2-tiny-F32.gguf");
    let o = moxie_in(
        &tmp.0,
        &[
            "quantize",
            "-q",
            "--split-max-tensors",
            "20",
            master.to_str().unwrap(),
            "f32.gguf",
            "F32",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let o = moxie_in(
        &tmp.0,
        &[
            "quantize",
            "-q",
            "f32-00002-of-00003.gguf",
            "q.gguf",
            "Q4_K_M",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let got = std::fs::read(tmp.0.join("q.gguf")).unwrap();
    let want = std::fs::read(fx.join("models/deepseek2-tiny-Q4_K_M.gguf")).unwrap();
    assert!(
        got == want,
        "differs from llama-quantize's deepseek2-tiny-Q4_K_M.gguf"
    );
}

/// `--dry-run` reads only the header, so it plans header-only files of real big models. The
/// fixture headers hold the types llama-quantize's Q4_K_M rules give DeepSeek-V3 and GLM-4.7
/// (61 and 92+1 blocks, 256 / 160 experts): planning Q4_K_M again must keep every type.
#[test]
fn dry_run_on_real_model_headers_keeps_their_q4_k_m_types() {
    let Some(fx) = fixtures() else { return };
    for (stem, n) in [("DeepSeek-V3-671B", 1086), ("GLM-4.7-355B", 1759)] {
        let h = fx.join(format!("headers/{stem}-Q4_K_M.header.gguf"));
        let o = moxie_in(
            &data_dir(),
            &[
                "quantize",
                "--dry-run",
                "--allow-requantize",
                h.to_str().unwrap(),
                "Q4_K_M",
            ],
        );
        assert!(o.status.success(), "{stem}: {}", stderr(&o));
        let out = String::from_utf8(o.stdout).unwrap();
        let mut rows = 0;
        for line in out.lines().filter(|l| l.starts_with('[')) {
            let w: Vec<&str> = line.split_whitespace().collect();
            let arrow = w.iter().position(|&x| x == "->").unwrap();
            assert_eq!(w[arrow - 1], w[arrow + 1], "{stem}: {line}");
            rows += 1;
        }
        assert_eq!(rows, n, "{stem}");
    }
}

#[test]
fn bad_input_gives_clear_errors() {
    let tmp = TempDir::new("errors");
    let missing = tmp.path("missing.gguf");
    let out = tmp.path("out.gguf");
    let check = |args: &[&str], want: &[&str]| {
        let mut full = vec!["quantize"];
        full.extend_from_slice(args);
        let o = moxie_in(&tmp.0, &full);
        assert!(!o.status.success(), "{args:?} succeeded");
        let e = stderr(&o);
        for w in want {
            assert!(e.contains(w), "{args:?}: {e:?} lacks {w:?}");
        }
        assert!(!e.contains("panicked"), "{args:?}: {e}");
    };
    check(&[&missing, &out, "Q4_K_M"], &["missing.gguf"]);
    check(
        &[&missing, &out, "Q9_K"],
        &["unknown file type 'Q9_K'", "Q4_K_M"],
    );
    check(
        &[&missing, &out, "IQ2_XXS"],
        &["IQ2_XXS", "moxie does not have yet", "Q4_K_M", "IQ4_XS"],
    );
    check(
        &["--tensor-type", "blk\\.(3|4=q6_k", &missing, &out, "Q4_K_M"],
        &["--tensor-type", "blk\\.(3|4", "regular expression"],
    );
    check(
        &["--tensor-type", "ffn_down=q7_k", &missing, &out, "Q4_K_M"],
        &["unknown type 'q7_k'"],
    );
    check(
        &["--tensor-type", "ffn_down", &missing, &out, "Q4_K_M"],
        &["expected REGEX=TYPE"],
    );
    check(
        &["--output-tensor-type", "q3", &missing, &out, "Q8_0"],
        &["--output-tensor-type", "unknown type 'q3'"],
    );
    check(
        &["--split-max-size", "10K", &missing, &out, "Q8_0"],
        &["--split-max-size"],
    );

    let Some(fx) = fixtures() else { return };
    let master = fx.join("models/qwen3moe-tiny-F32.gguf");
    let master = master.to_str().unwrap();
    // Output = input, also through another spelling of the path.
    let alias = format!(
        "{}/../models/qwen3moe-tiny-F32.gguf",
        fx.join("models").display()
    );
    check(&[master, &alias, "Q4_K_M"], &["same file"]);
    let q8 = fx.join("models/qwen3moe-tiny-Q8_0.gguf");
    check(
        &[q8.to_str().unwrap(), &out, "Q4_K_M"],
        &["already quantized", "--allow-requantize"],
    );
    check(
        &[master, &out, "Q2_K_S"],
        &["requires an importance matrix"],
    );
    let ds_imatrix = data_dir().join("deepseek2-tiny.imatrix-gguf");
    check(
        &[
            "--imatrix",
            ds_imatrix.to_str().unwrap(),
            master,
            &out,
            "Q4_K_M",
        ],
        &[
            "--imatrix",
            "importance weights for tensor",
            "another model",
        ],
    );
    check(
        &["--imatrix", &missing, master, &out, "Q4_K_M"],
        &["--imatrix", "missing.gguf"],
    );
    check(
        &["--imatrix", master, master, &out, "Q4_K_M"],
        &["missing imatrix metadata"],
    );
    // A type moxie cannot write yet, asked for by a tensor override.
    check(
        &["--tensor-type", "attn_v=iq2_xxs", master, &out, "Q4_K_M"],
        &["blk.0.attn_v.weight", "IQ2_XXS", "cannot quantize"],
    );
    assert!(!Path::new(&out).exists(), "a failed run left {out}");
}

/// `moxie quantize --repack IN OUT COPY` writes the matrices load-time repacking would
/// interleave, interleaved under their own type ids; loading that file gives the original's
/// logits bit for bit (default numerics use both interleaved; `--no-repack` and `--exact` put
/// the rows back), and COPY without `--repack` turns it back into the original tensors.
#[test]
fn repacked_copy_loads_like_load_time_repacking() {
    let Some(fx) = fixtures() else { return };
    let tmp = TempDir::new("repack");
    for stem in ["deepseek2-tiny-Q4_K_M", "qwen3moe-tiny-Q8_0"] {
        let src = fx.join(format!("models/{stem}.gguf"));
        let src = src.to_str().unwrap();
        let packed = tmp.path(&format!("{stem}-r16.gguf"));
        let o = moxie_in(&tmp.0, &["quantize", "--repack", src, &packed, "COPY"]);
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(stderr(&o).contains("written interleaved"), "{}", stderr(&o));

        let a = GgufFile::open(Path::new(src)).unwrap();
        let b = GgufFile::open(Path::new(&packed)).unwrap();
        assert_eq!(a.tensors().len(), b.tensors().len());
        assert_eq!(
            a.metadata().get("general.file_type"),
            b.metadata().get("general.file_type")
        );
        let mut interleaved = 0;
        for t in a.tensors() {
            let u = b.tensor(&t.name).unwrap();
            assert_eq!((u.ty, &u.dims, u.n_bytes), (t.ty, &t.dims, t.n_bytes));
            if u.interleaved {
                interleaved += 1;
                assert!(moxie_core::interleave_candidate(&t.name), "{}", t.name);
                assert_eq!(u.type_id(), 1000 + t.ty.id());
                assert_ne!(b.tensor_data(u).unwrap(), a.tensor_data(t).unwrap());
            } else {
                assert_eq!(b.tensor_data(u).unwrap(), a.tensor_data(t).unwrap());
            }
        }
        assert!(
            interleaved >= 6,
            "{stem}: {interleaved} tensors interleaved"
        );
        // `inspect --dump` reads interleaved rows back in GGUF order.
        let dump = |model: &str, out: &str| {
            let o = moxie_in(
                &tmp.0,
                &[
                    "inspect",
                    model,
                    "--dump",
                    "blk.1.ffn_up_exps.weight",
                    "--out",
                    out,
                ],
            );
            assert!(o.status.success(), "{}", stderr(&o));
            std::fs::read(tmp.0.join(out)).unwrap()
        };
        assert_eq!(dump(src, "a.npy"), dump(&packed, "b.npy"), "{stem}");

        for flags in [&[][..], &["--no-repack"], &["--exact"]] {
            let (want, _) = logits(&tmp, src, flags, "a.npy");
            let (got, log) = logits(&tmp, &packed, flags, "b.npy");
            assert!(want.len() > 4 * 1000);
            assert_eq!(want, got, "{stem} {flags:?}");
            let said = if flags.is_empty() {
                "stored interleaved in the file and used as they are"
            } else {
                "back in GGUF order"
            };
            assert!(log.contains(said), "{stem} {flags:?}: {log}");
        }

        // COPY without --repack restores every tensor's bytes.
        let back = tmp.path(&format!("{stem}-back.gguf"));
        let o = moxie_in(&tmp.0, &["quantize", "-q", &packed, &back, "COPY"]);
        assert!(o.status.success(), "{}", stderr(&o));
        let c = GgufFile::open(Path::new(&back)).unwrap();
        for t in a.tensors() {
            let u = c.tensor(&t.name).unwrap();
            assert!(!u.interleaved);
            assert_eq!(
                c.tensor_data(u).unwrap(),
                a.tensor_data(t).unwrap(),
                "{}",
                t.name
            );
        }
    }
    // COPY keeps types, so type-choosing flags are refused.
    let src = fx.join("models/qwen3moe-tiny-Q8_0.gguf");
    let o = moxie_in(
        &tmp.0,
        &[
            "quantize",
            "--pure",
            src.to_str().unwrap(),
            &tmp.path("x.gguf"),
            "COPY",
        ],
    );
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--pure"), "{}", stderr(&o));
}
