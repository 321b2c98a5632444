//! `moxie logits` with placement flags: the plan is printed, the model runs placed over
//! simulated devices with llama.cpp's hybrid rule (`-ot exps=CPU`) and gives the all-CPU logits
//! (bit for bit under `--exact`),
//! and placements this build cannot run are clear errors, not panics; `--ubatch-size` splits
//! the forward calls.

mod common;
use common::{fixture_model, moxie, tmp};

/// Under `--exact` the placed run gives the all-CPU logits bit for bit. The default (fast)
/// kernels may differ by float rounding: the all-CPU run interleaves the routed experts, the
/// placed one keeps them in GGUF order (their router runs on another device, which may stream
/// them), and one-token expert products take a kernel per layout.
#[test]
fn hybrid_placement_on_sim_devices_gives_the_cpu_logits() {
    for model in ["deepseek2-tiny-Q4_K_M.gguf", "glm4moe-tiny-Q4_K_M.gguf"] {
        for exact in [true, false] {
            let m = fixture_model(model);
            let (cpu, placed) = (tmp("placed", "cpu.npy"), tmp("placed", "placed.npy"));
            let tokens = "1,7,42,3,99,5,12,8";
            let numerics: &[&str] = if exact { &["--exact"] } else { &[] };
            let mut args = vec!["logits", "-m", &m, "--tokens", tokens];
            args.extend_from_slice(numerics);
            let mut cpu_args = args.clone();
            cpu_args.extend(["--out", cpu.to_str().unwrap()]);
            let o = moxie(&cpu_args);
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            args.extend([
                "--out",
                placed.to_str().unwrap(),
                "--sim",
                "1GiB,1GiB",
                "-ngl",
                "999",
                "-ot",
                "exps=CPU",
            ]);
            let o = moxie(&args);
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(o.status.success(), "{err}");
            assert!(err.contains("fits: yes") && err.contains("sim1"), "{err}");
            let (_, a) = moxie_core::npy::read_f32(&cpu).unwrap();
            let (_, b) = moxie_core::npy::read_f32(&placed).unwrap();
            assert_eq!(a.len(), b.len());
            if exact {
                assert!(
                    a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{model}: exact logits differ"
                );
            } else {
                let scale = a.iter().fold(1f32, |m, x| m.max(x.abs()));
                let worst = a
                    .iter()
                    .zip(&b)
                    .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
                assert!(
                    worst <= 1e-3 * scale,
                    "{model}: fast logits differ by {worst}"
                );
            }
            let _ = std::fs::remove_file(cpu);
            let _ = std::fs::remove_file(placed);
        }
    }
}

#[test]
fn placements_this_build_cannot_run_are_clear_errors() {
    let m = fixture_model("qwen3moe-tiny-Q4_K_M.gguf");
    let out = tmp("placed", "never.npy");
    let out = out.to_str().unwrap();
    let cases: [(&[&str], &str); 3] = [
        (&["--gpu", "24GiB"], "no CUDA backend"),
        (&["-ot", "exps=CUDA0"], "CUDA0"),
        (&["--sim", "1MiB"], "does not fit"),
    ];
    for (flags, want) in cases {
        let mut args = vec!["logits", "-m", &m, "--tokens", "1,2", "--out", out];
        args.extend_from_slice(flags);
        let o = moxie(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{flags:?} succeeded");
        assert!(
            err.contains("error:") && err.contains(want),
            "{flags:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{flags:?}: {err}");
    }
}

/// `--ubatch-size` splits the tokens into forward calls: with 4 per call, the first 4 rows are
/// the logits of those 4 tokens alone, bit for bit; 0 is refused by name.
#[test]
fn logits_ubatch_size_splits_the_forward_calls() {
    let m = fixture_model("deepseek2-tiny-Q4_K_M.gguf");
    let (first, split) = (tmp("ubatch", "first.npy"), tmp("ubatch", "split.npy"));
    let run = |tokens: &str, out: &std::path::Path, ub: &str| {
        let o = moxie(&[
            "logits",
            "-m",
            &m,
            "--exact",
            "--tokens",
            tokens,
            "--out",
            out.to_str().unwrap(),
            "-ub",
            ub,
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    };
    run("1,7,42,3", &first, "512");
    run("1,7,42,3,99,5,12,8", &split, "4");
    let (shape_a, a) = moxie_core::npy::read_f32(&first).unwrap();
    let (shape_b, b) = moxie_core::npy::read_f32(&split).unwrap();
    assert_eq!((shape_a[0], shape_b[0]), (4, 8));
    assert!(a == b[..a.len()], "the first micro-batch differs");
    let o = moxie(&[
        "logits", "-m", &m, "--tokens", "1", "--out", "x.npy", "-ub", "0",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("--ubatch-size"),
        "{err}"
    );
    let _ = std::fs::remove_file(first);
    let _ = std::fs::remove_file(split);
}

/// `--no-mmap` reads the weights into memory and `--mlock` locks them (or warns): the same
/// logits bit for bit, with the file's layout kept (`--no-repack`, every weight copied) and
/// with repacking.
#[test]
fn weights_read_into_memory_give_the_same_logits() {
    let m = fixture_model("deepseek2-tiny-Q4_K_M.gguf");
    let tokens = "1,7,42,3,99,5,12,8";
    for repack in [&["--no-repack"][..], &[]] {
        let logits = |extra: &[&str], tag: &str| {
            let out = tmp("in-memory", &format!("{tag}.npy"));
            let mut args = vec!["logits", "-m", &m, "--tokens", tokens, "--out"];
            args.push(out.to_str().unwrap());
            args.extend_from_slice(repack);
            args.extend_from_slice(extra);
            let o = moxie(&args);
            let err = String::from_utf8_lossy(&o.stderr).into_owned();
            assert!(o.status.success(), "{err}");
            (moxie_core::npy::read_f32(&out).unwrap().1, err)
        };
        let (mapped, _) = logits(&[], "mapped");
        let (owned, err) = logits(&["--no-mmap", "--mlock"], "owned");
        assert!(err.contains("--no-mmap: read "), "{err}");
        assert!(err.contains("--mlock: "), "{err}");
        assert!(
            mapped
                .iter()
                .zip(&owned)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{repack:?}: logits differ"
        );
    }
}

/// `moxie run -m MODEL -p "The quick brown fox" -n N --temp 0 EXTRA...`.
fn greedy_fox(model: &str, n: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "run",
        "-m",
        model,
        "-p",
        "The quick brown fox",
        "-n",
        n,
        "--temp",
        "0",
    ];
    args.extend_from_slice(extra);
    moxie(&args)
}

/// `-oe`: experts placed one by one on a simulated device. The text is the one without it
/// (the same kernels run), the plan lists the experts, and the routed-expert reads per
/// generated token are booked on both devices; a malformed value is refused by name.
#[test]
fn experts_placed_one_by_one_on_a_sim() {
    let m = fixture_model("deepseek2-tiny-Q4_K_M.gguf");
    let run = |extra: &[&str]| {
        let hybrid = ["--sim", "1GiB", "-ngl", "999", "-ot", "exps=CPU"];
        greedy_fox(&m, "6", &[&hybrid[..], extra].concat())
    };
    let plain = run(&[]);
    assert!(
        plain.status.success(),
        "{}",
        String::from_utf8_lossy(&plain.stderr)
    );
    let split = run(&["-oe", "*:0-7=sim0"]);
    let err = String::from_utf8_lossy(&split.stderr);
    assert!(split.status.success(), "{err}");
    assert_eq!(plain.stdout, split.stdout);
    assert!(
        err.contains("experts placed one by one") && err.contains("experts 0-7 (8 of 16"),
        "{err}"
    );
    let reads = err
        .lines()
        .find(|l| l.starts_with("routed-expert weights read per generated token"))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(reads.contains("CPU ") && reads.contains("sim0 "), "{reads}");
    let bad = run(&["-oe", "1:0-7"]);
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        !bad.status.success() && err.contains("-oe '1:0-7': no '='"),
        "{err}"
    );
    let bad = run(&["--profile", "p.json"]);
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        !bad.status.success() && err.contains("--fit or seeds --expert-cache"),
        "{err}"
    );
}

/// `--expert-cache` on a simulated device: the same text, the plan's line, the cache's hit
/// line, reads booked on both devices; on a machine without an accelerator, a clear error.
#[test]
fn the_expert_cache_on_a_sim() {
    let m = fixture_model("deepseek2-tiny-Q4_K_M.gguf");
    let run = |extra: &[&str]| greedy_fox(&m, "8", extra);
    let plain = run(&[]);
    assert!(plain.status.success());
    for policy in ["lru", "lfu"] {
        let cached = run(&[
            "--sim",
            "1GiB",
            "-ngl",
            "999",
            "-ot",
            "exps=CPU",
            "--expert-cache",
            "auto",
            "--expert-cache-policy",
            policy,
        ]);
        let err = String::from_utf8_lossy(&cached.stderr);
        assert!(cached.status.success(), "{err}");
        assert_eq!(plain.stdout, cached.stdout);
        assert!(
            err.contains(&format!("2 MoE layers x 16 experts, policy {policy}")),
            "{err}"
        );
        assert!(err.contains("% of decode selections hit ("), "{err}");
        let reads = err
            .lines()
            .find(|l| l.starts_with("routed-expert weights read per generated token"))
            .unwrap_or_else(|| panic!("{err}"));
        assert!(reads.contains("sim0 "), "{reads}");
    }
    // No accelerator (GPUs hidden, as on a machine without one).
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_moxie"))
        .args([
            "run",
            "-m",
            &m,
            "-p",
            "x",
            "-n",
            "1",
            "--expert-cache",
            "1GiB",
        ])
        .env("CUDA_VISIBLE_DEVICES", "")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        !bad.status.success() && err.contains("needs an accelerator"),
        "{err}"
    );
    let bad = run(&[
        "--sim",
        "1GiB",
        "--expert-cache",
        "1GiB",
        "--expert-cache-policy",
        "mru",
    ]);
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        !bad.status.success() && err.contains("lru, lfu or decay"),
        "{err}"
    );
}
