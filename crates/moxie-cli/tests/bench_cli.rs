//! `moxie bench` end to end on a tiny `moxie gen` model: llama-bench's table on stdout, and
//! with `--bandwidth` one line per generation test on stderr whose parts add up.

use std::path::Path;

mod common;
use common::{fixture_model, moxie};

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

/// `-ctk` / `-ctv` take llama.cpp's cache type names, several at once: every pair is a row
/// with its types in the table and the csv; an unsupported type is refused by name.
#[test]
fn cache_types_are_benchmarked_and_reported() {
    let dir =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("moxie-ctk-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("qwen.gguf");
    let p = path.to_str().unwrap();
    let o = moxie(&["gen", "--arch", "qwen3moe", "--preset", "tiny", "-o", p]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let common = ["bench", "-m", p, "-p", "8", "-n", "2", "-r", "1", "-t", "1"];
    let run = |extra: &[&str]| moxie(&[&common[..], extra].concat());
    let o = run(&["-ctk", "f16,q8_0", "-ctv", "q8_0"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.contains("| type_k | type_v |"), "{out}");
    assert_eq!(out.matches("| f16 | q8_0 |").count(), 2, "{out}");
    assert_eq!(out.matches("| q8_0 | q8_0 |").count(), 2, "{out}");
    let o = run(&["-ctk", "q8_0", "-o", "csv"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        out.lines().next().unwrap().contains(",type_k,type_v,"),
        "{out}"
    );
    assert_eq!(out.matches(",q8_0,f16,").count(), 2, "{out}");
    // The backend column names the devices holding weights.
    let o = run(&["--sim", "1GiB", "-ngl", "2"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(out.matches("| CPU+sim0 |").count(), 2, "{out}");
    let o = run(&["-ctv", "q4_0"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("'q4_0'") && err.contains("f32, f16, q8_0"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--ab` (issue 19): two configurations loaded and alternated on the same tests, each arm's
/// t/s with its spread and its ratio to the first with a confidence interval; an arm that
/// repeats a list flag of the common line, or a single arm, is refused by name.
#[test]
fn ab_arms_alternate_and_report_ratios() {
    let model = fixture_model("qwen3moe-tiny-Q8_0.gguf");
    let common = ["bench", "-m", &model, "-p", "16", "-n", "4", "-r", "3"];
    let run = |extra: &[&str]| moxie(&[&common[..], extra].concat());
    let o = run(&["--ab", "-t 1", "--ab", "-t 1 --no-repack"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        out.contains("| test | arm | flags | t/s | ratio to arm 1 (95% CI) |"),
        "{out}"
    );
    for row in [
        "| pp16 | 1 | `-t 1` |",
        "| pp16 | 2 | `-t 1 --no-repack` |",
        "| tg4 | 2 |",
    ] {
        assert!(out.contains(row), "{row} missing:\n{out}");
    }
    // Arm 2's ratio with its interval: "r (lo-hi)".
    let ratio = out
        .lines()
        .find(|l| l.starts_with("| tg4 | 2 |"))
        .and_then(|l| l.trim_end_matches(" |").rsplit("| ").next())
        .unwrap()
        .to_owned();
    let nums: Vec<f64> = ratio
        .split([' ', '(', ')', '-'])
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect();
    assert!(
        nums.len() == 3 && nums[1] <= nums[0] && nums[0] <= nums[2],
        "{ratio}"
    );
    let o = moxie(&[&common[..], &["-t", "1", "--ab", "-t 2", "--ab", "-t 1"]].concat());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("--ab '-t 2': -t takes one value"),
        "{err}"
    );
    let o = run(&["--ab", "-t 1"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("at least two arms"),
        "{err}"
    );
}
