//! Launch lines from users' reports (`tests/data/launch_lines.txt`, issue 18) run with
//! `moxie` in place of llama-server / llama-bench, on a fixture model: serve lines answer a
//! chat request, bench lines print their table. Lines that name CUDA devices run on simulated
//! ones (`MOXIE_SIM_CUDA`, four 24 GiB GPUs as in the 4x3090 report). The bench line with
//! 16K-token prompts takes minutes: `cargo test -p moxie-cli --test launch_lines -- --ignored`.

mod serve_support;

use serde_json::json;
use serve_support::{fixture_model, Server};

const MODEL: &str = "qwen3moe-tiny-Q8_0.gguf";

/// The lines of `launch_lines.txt` that start with `command`, split into arguments, with the
/// subcommand and the flags the tests set themselves (model, host, port) taken out.
fn lines(command: &str) -> Vec<Vec<String>> {
    include_str!("data/launch_lines.txt")
        .lines()
        .filter(|l| l.starts_with(&format!("{command} ")))
        .map(|l| {
            let mut args: Vec<String> = l.split_whitespace().skip(1).map(String::from).collect();
            for flag in ["-m", "--model", "--host", "--port"] {
                if let Some(at) = args.iter().position(|a| a == flag) {
                    args.drain(at..at + 2);
                }
            }
            args
        })
        .collect()
}

/// Four 24 GiB GPUs, simulated.
const SIM_CUDA: (&str, &str) = ("MOXIE_SIM_CUDA", "24GiB,24GiB,24GiB,24GiB");

#[test]
fn serve_lines_answer_a_chat_request() {
    let lines = lines("serve");
    assert_eq!(lines.len(), 8);
    for args in lines {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        // Lines that name CUDA devices or put layers on GPUs were run on GPUs.
        let gpus = args
            .iter()
            .any(|&a| a.contains("CUDA") || a == "-ngl" || a == "--n-gpu-layers");
        let s = Server::start_with_env(MODEL, &args, if gpus { &[SIM_CUDA] } else { &[] });
        // `ignore_eos`: a random-weight model may sample an end token within 4 (the seed is
        // fresh per request), which would make the count below flaky.
        let body = json!({
            "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 4,
            "ignore_eos": true
        });
        let r = s.post("/v1/chat/completions", &body);
        assert_eq!(r.status, 200, "{args:?}: {}", r.text());
        assert_eq!(r.json()["usage"]["completion_tokens"], 4, "{args:?}");
        let log = s.log.lock().unwrap().clone();
        // Other engines' tuning flags are named, each with what moxie does instead; ik's
        // `-mla 3` is serve's own (expanded MLA prompt batches), so it is not among them.
        assert!(!log.contains("-mla 3: ignored"), "{log}");
        for flag in ["--jinja", "-muge", "-ger"] {
            if args.contains(&flag.split(' ').next().unwrap()) {
                assert!(
                    log.contains(&format!("moxie: {flag}: ignored, ")),
                    "{flag}: {log}"
                );
            }
        }
        if let Some(at) = args.iter().position(|&a| a == "--threads-batch") {
            let tb = format!("({} for prompt batches)", args[at + 1]);
            assert!(log.contains(&tb), "{tb}: {log}");
        }
        if args.contains(&"--numa") {
            assert!(log.contains("--numa distribute: "), "{log}");
        }
        if args.contains(&"--no-mmap") {
            assert!(log.contains("--no-mmap: read "), "{log}");
        }
        // The layers -ngl puts on the GPUs go to the simulated CUDA devices.
        if gpus {
            assert!(log.contains("CUDA3   24.00 GiB"), "{log}");
            assert!(log.contains("moe   CUDA0"), "{log}");
        }
    }
}

fn run_bench(args: &[String]) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_moxie"))
        .args(["bench", "-m", &fixture_model(MODEL)])
        .args(args)
        .output()
        .expect("running moxie bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{args:?}: {stderr}");
    // llama-bench's table: a header and a row per test.
    assert!(stdout.contains("| model "), "{stdout}");
    let rows = stdout
        .lines()
        .filter(|l| l.contains(" t/s") || l.contains("qwen3moe"));
    assert!(rows.count() >= 3, "{stdout}");
    assert!(stderr.contains("moxie: -fmoe 1: ignored, "), "{stderr}");
    assert!(stderr.contains("--numa distribute: "), "{stderr}");
}

#[test]
fn bench_lines_print_their_table() {
    let lines = lines("bench");
    assert_eq!(lines.len(), 3);
    for args in lines
        .iter()
        .filter(|a| !a.iter().any(|a| a.contains("16384")))
    {
        run_bench(args);
    }
}

#[test]
#[ignore = "16K-token prompts: minutes on 2 cores"]
fn bench_line_with_long_prompts_prints_its_table() {
    for args in lines("bench")
        .iter()
        .filter(|a| a.iter().any(|a| a.contains("16384")))
    {
        run_bench(args);
    }
}

/// llama-server's sampling flags and -n are the defaults of requests that leave them out;
/// -c is split between the slots.
#[test]
fn server_flags_set_request_defaults() {
    let s = Server::start(
        MODEL,
        &[
            "-t", "1", "-n", "3", "--temp", "1.5", "--seed", "7", "-np", "2", "-c", "512",
        ],
    );
    let body = json!({"messages": [{"role": "user", "content": "Hello"}]});
    let answer = |body: &serde_json::Value| {
        let r = s.post("/v1/chat/completions", body);
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        assert_eq!(
            v["usage"]["completion_tokens"], 3,
            "-n 3 is the default max_tokens"
        );
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string()
    };
    // The server's seed makes a sampled answer (temperature 1.5) repeatable.
    let first = answer(&body);
    assert_eq!(answer(&body), first);
    let mut other = body.clone();
    other["max_tokens"] = json!(5);
    let r = s.post("/v1/chat/completions", &other).json();
    assert_eq!(r["usage"]["completion_tokens"], 5);
    let log = s.log.lock().unwrap().clone();
    assert!(log.contains("2 slots x 256 tokens of context"), "{log}");
}
