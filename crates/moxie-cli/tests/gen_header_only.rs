//! `moxie gen --header-only`: writes a real model's header-only GGUF that opens header-only,
//! and refuses what does not apply with a message that says why.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use moxie_gguf::GgufFile;

fn moxie(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_moxie"))
        .args(args)
        .output()
        .expect("running moxie")
}

/// A fresh directory of test `test`'s own (tests run in parallel threads of one process).
fn tmp_dir(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("moxie-gen-header-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn header_only_presets_write_openable_headers() {
    let dir = tmp_dir("presets");
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
    let dir = tmp_dir("bad");
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

