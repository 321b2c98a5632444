//! `moxie bench` end to end on a tiny `moxie gen` model: llama-bench's table on stdout, and
//! with `--bandwidth` one line per generation test on stderr whose parts add up.

use std::path::Path;
use std::process::{Command, Output};

fn moxie(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_moxie"))
        .args(args)
        .output()
        .expect("running moxie")
}

#[test]
fn bandwidth_line_accounts_bytes_per_token() {
    let dir =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("moxie-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ds.gguf");
    let p = path.to_str().unwrap();
    let o = moxie(&["gen", "--arch", "deepseek2", "--preset", "tiny", "-o", p]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = moxie(&[
        "bench",
        "-m",
        p,
        "-p",
        "8",
        "-n",
        "4",
        "-r",
        "1",
        "-t",
        "1",
        "--bandwidth",
        "--bandwidth-mib",
        "64",
    ]);
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(o.status.success(), "{err}");
    assert_eq!(
        out.lines().filter(|l| l.starts_with("| deepseek2")).count(),
        2,
        "{out}"
    );
    // Only the tg test gets a line.
    let lines: Vec<&str> = err.lines().filter(|l| l.contains("MB/token")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    let line = lines[0];
    assert!(line.contains(" tg4 t=1: "), "{line}");
    let num_after = |key: &str| -> f64 {
        let at = line
            .find(key)
            .unwrap_or_else(|| panic!("'{key}' in {line}"))
            + key.len();
        line[at..]
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let total: f64 = line
        .split_once(": ")
        .unwrap()
        .1
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let parts = num_after("(dense ")
        + num_after("experts ")
        + num_after("embedding row ")
        + num_after("KV ");
    assert!((total - parts).abs() <= 0.2, "{line}");
    assert!(line.contains("at 2 positions"), "{line}");
    assert!(num_after("of ") > 0.1, "measured bandwidth in {line}");
}
