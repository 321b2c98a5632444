//! A model file truncated under a running `moxie serve` (issue 21): with the file mapped (the
//! default), the next read of a page past its new end is a bus error, and the server says so
//! on stderr before it exits, instead of vanishing; with `--no-mmap` it holds its own copy and
//! goes on answering.

#![cfg(unix)]

mod serve_support;

use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use serde_json::json;
use serve_support::*;

const MODEL: &str = "qwen3moe-tiny-Q8_0.gguf";

/// A private copy of the fixture model, to truncate.
fn copy_of_model(test: &str) -> std::path::PathBuf {
    let dir =
        std::env::temp_dir().join(format!("moxie-file-changes-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(MODEL);
    std::fs::copy(fixture_model(MODEL), &path).unwrap();
    path
}

/// Truncate `path` to its first 4 KiB (the header stays, every tensor is gone).
fn truncate(path: &std::path::Path) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.set_len(4096).unwrap();
}

/// A short chat's status, `None` when the server died before answering.
fn chat(s: &Server) -> Option<u16> {
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    s.try_json("POST", "/v1/chat/completions", &body)
        .map(|r| r.status)
}

#[test]
fn truncated_mapped_model_is_reported_not_silent() {
    let path = copy_of_model("mapped");
    let mut s = Server::start(path.to_str().unwrap(), &[]);
    assert_eq!(chat(&s), Some(200), "before the truncation");
    truncate(&path);
    let answer = chat(&s);
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(st) = s.child.try_wait().unwrap() {
            break st;
        }
        assert!(
            Instant::now() < deadline,
            "the server is still running after its model file was truncated (answer {answer:?}); \
             the test assumes it reads mapped pages for each request"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    // Let the stderr reader catch up with the last lines.
    std::thread::sleep(Duration::from_millis(300));
    let log = s.log.lock().unwrap().clone();
    assert_eq!(
        status.code(),
        Some(moxie_core::BUS_ERROR_EXIT),
        "exit status {status:?} (signal {:?}); stderr:\n{log}",
        status.signal()
    );
    assert!(
        log.contains("bus error (SIGBUS)") && log.contains("--no-mmap"),
        "no explanation on stderr:\n{log}"
    );
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

#[test]
fn no_mmap_server_survives_its_file_being_truncated() {
    let path = copy_of_model("no-mmap");
    let mut s = Server::start(path.to_str().unwrap(), &["--no-mmap"]);
    assert_eq!(chat(&s), Some(200), "before the truncation");
    truncate(&path);
    for i in 0..3 {
        assert_eq!(chat(&s), Some(200), "request {i} after the truncation");
    }
    assert!(s.child.try_wait().unwrap().is_none(), "the server exited");
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}
