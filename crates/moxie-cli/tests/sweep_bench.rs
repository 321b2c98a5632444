//! `moxie sweep-bench` end to end: the binary on tiny `moxie gen` models. Checks the table
//! shape (sweep-bench's columns), that N_KV grows by PP per row until the context is full, the
//! JSON outputs, and that bad flags are errors with a message, not panics.

use std::path::Path;
use std::process::Output;

mod common;
use common::{moxie, tmp_dir};

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `moxie gen --arch ARCH --preset tiny` into `dir`.
fn tiny_model(dir: &Path, arch: &str) -> String {
    let path = dir.join(format!("{arch}-tiny.gguf"));
    let p = path.to_str().unwrap();
    let o = moxie(&["gen", "--arch", arch, "--preset", "tiny", "-o", p]);
    assert!(o.status.success(), "moxie gen: {}", stderr(&o));
    p.to_owned()
}

/// The md table's data rows as numbers: PP, TG, N_KV, T_PP s, S_PP t/s, T_TG s, S_TG t/s.
fn table_rows(out: &str) -> Vec<[f64; 7]> {
    let lines: Vec<&str> = out.lines().filter(|l| l.starts_with('|')).collect();
    assert!(lines.len() >= 2, "no table in:\n{out}");
    assert_eq!(
        lines[0],
        "|    PP |     TG |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |"
    );
    assert_eq!(
        lines[1],
        "|-------|--------|--------|----------|----------|----------|----------|"
    );
    lines[2..]
        .iter()
        .map(|l| {
            let cells: Vec<f64> = l
                .trim_matches('|')
                .split('|')
                .map(|c| c.trim().parse().unwrap_or_else(|_| panic!("cell in {l}")))
                .collect();
            cells
                .try_into()
                .unwrap_or_else(|_| panic!("7 cells in {l}"))
        })
        .collect()
}

#[test]
fn table_steps_through_the_context() {
    let dir = tmp_dir("sweep", "table");
    for arch in ["deepseek2", "qwen3moe"] {
        let model = tiny_model(&dir, arch);
        let o = moxie(&[
            "sweep-bench",
            "-m",
            &model,
            "-c",
            "200",
            "-ub",
            "64",
            "-n",
            "4",
            "-t",
            "2",
        ]);
        assert!(o.status.success(), "{arch}: {}", stderr(&o));
        let out = stdout(&o);
        assert!(
            out.contains("main: n_kv_max = 200, n_batch = 2048, n_ubatch = 64,"),
            "{out}"
        );
        let rows = table_rows(&out);
        // 0, 64, 128 fit; a step at 192 would need 256 positions.
        let n_kv: Vec<f64> = rows.iter().map(|r| r[2]).collect();
        assert_eq!(n_kv, [0.0, 64.0, 128.0], "{arch}:\n{out}");
        for r in &rows {
            assert_eq!((r[0], r[1]), (64.0, 4.0), "{arch}: PP, TG");
            // Times print with 3 decimals: a tiny model's TG step can show 0.000 s.
            assert!(
                r[3] >= 0.0 && r[4] > 0.0 && r[5] >= 0.0 && r[6] > 0.0,
                "{r:?}"
            );
        }
    }
}

#[test]
fn tg_defaults_to_a_quarter_ubatch_and_json_outputs_have_the_rows() {
    let dir = tmp_dir("sweep", "json");
    let model = tiny_model(&dir, "qwen3moe");
    let args = |fmt: &'static str| {
        vec![
            "sweep-bench",
            "-m",
            model.as_str(),
            "-c",
            "96",
            "-ub",
            "32",
            "-b",
            "16",
            "-wb",
            "-o",
            fmt,
        ]
    };
    let o = moxie(&args("jsonl"));
    assert!(o.status.success(), "{}", stderr(&o));
    let recs: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(recs.len(), 3);
    for (i, r) in recs.iter().enumerate() {
        assert_eq!(r["n_kv"], 32 * i);
        assert_eq!(r["pp"], 32);
        assert_eq!(r["tg"], 8, "tg = ub/4");
        assert_eq!(r["n_kv_max"], 96);
        assert_eq!(r["n_batch"], 16);
        assert_eq!(r["n_ubatch"], 32);
        for k in ["t_pp", "speed_pp", "t_tg", "speed_tg"] {
            assert!(r[k].as_f64().unwrap() > 0.0, "{k} in {r}");
        }
    }
    let o = moxie(&args("json"));
    assert!(o.status.success(), "{}", stderr(&o));
    let all: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let all = all.as_array().unwrap();
    assert_eq!(all.len(), 3);
    assert_eq!(all[2]["n_kv"], 64);
}

#[test]
fn bad_flags_are_clear_errors() {
    let dir = tmp_dir("sweep", "errors");
    let model = tiny_model(&dir, "deepseek2");
    for (args, want) in [
        (vec!["-ub", "0"], "-ub must be at least 1"),
        (
            vec!["-c", "32", "-ub", "64"],
            "-c 32 is smaller than one step",
        ),
        (
            vec!["-c", "64", "-ub", "32", "-n", "100"],
            "100 generated tokens",
        ),
        (vec!["-b", "0"], "-b must be at least 1"),
        (vec!["-t", "0"], "-t must be at least 1"),
        (vec!["-o", "csv"], "-o must be md, json or jsonl"),
    ] {
        let mut full = vec!["sweep-bench", "-m", model.as_str()];
        full.extend(&args);
        let o = moxie(&full);
        let err = stderr(&o);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    // A model that does not exist: an error naming the file.
    let o = moxie(&["sweep-bench", "-m", "/nonexistent/m.gguf"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("/nonexistent/m.gguf"), "{}", stderr(&o));
}
