//! A bounded load test of `moxie serve`: 64 concurrent streaming requests on 4 slots with a
//! queue of 16. Every request is answered in full or refused with 503, none hangs, the server
//! ends idle, and its resident memory stays flat over repeated waves. Prints the figures
//! (`cargo test -p moxie-cli --test serve_load -- --nocapture`).

mod serve_support;

use std::time::{Duration, Instant};

use serde_json::json;
use serve_support::*;

const MODEL: &str = "qwen3moe-tiny-Q8_0.gguf";

#[derive(Default, Debug)]
struct Wave {
    answered: usize,
    rejected: usize,
    tokens: u64,
    /// Slowest request, seconds.
    slowest: f64,
    seconds: f64,
}

fn wave(s: &Server, n: usize, max_tokens: usize) -> Wave {
    let t0 = Instant::now();
    let results: Vec<(u16, u64, f64)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                scope.spawn(move || {
                    let t = Instant::now();
                    let body = json!({
                        "messages": [{"role": "user", "content": format!("Request {i}: tell me a story.")}],
                        "max_tokens": max_tokens, "ignore_eos": true, "stream": true,
                        "stream_options": {"include_usage": true}, "seed": i,
                    });
                    let r = s.post("/v1/chat/completions", &body);
                    let tokens = match r.status {
                        200 => {
                            let (_, _, finish, chunks) = collect_chat_stream(&r);
                            assert_eq!(finish.as_deref(), Some("length"));
                            chunks.last().unwrap()["usage"]["completion_tokens"].as_u64().unwrap()
                        }
                        503 => {
                            let v = r.json();
                            assert_eq!(v["error"]["type"], "unavailable_error", "{v}");
                            0
                        }
                        other => panic!("request {i}: status {other}: {}", r.text()),
                    };
                    (r.status, tokens, t.elapsed().as_secs_f64())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut w = Wave {
        seconds: t0.elapsed().as_secs_f64(),
        ..Default::default()
    };
    for (status, tokens, secs) in results {
        match status {
            200 => {
                w.answered += 1;
                assert_eq!(tokens, max_tokens as u64);
            }
            _ => w.rejected += 1,
        }
        w.tokens += tokens;
        w.slowest = w.slowest.max(secs);
    }
    w
}

#[test]
fn sixty_four_streams_on_four_slots() {
    let s = Server::start(
        MODEL,
        &[
            "-t",
            "1",
            "--parallel",
            "4",
            "--max-queue",
            "16",
            // 256 tokens per slot (-c is split across the slots).
            "-c",
            "1024",
        ],
    );
    let rss_start = s.rss_kib();
    let mut rss = Vec::new();
    let mut waves = Vec::new();
    for _ in 0..3 {
        let w = wave(&s, 64, 24);
        // 4 running + 16 waiting fit; the others may be refused, and nothing else happens.
        assert_eq!(w.answered + w.rejected, 64);
        assert!(w.answered >= 20, "{w:?}");
        wait_idle(&s, Duration::from_secs(30));
        rss.push(s.rss_kib());
        waves.push(w);
    }
    // Within capacity, nobody is refused.
    let small = wave(&s, 20, 24);
    assert_eq!(small.answered, 20, "{small:?}");
    wait_idle(&s, Duration::from_secs(30));
    rss.push(s.rss_kib());

    let metrics = s.get("/metrics").text();
    let value = |name: &str| metric_value(&metrics, name);
    let answered: usize = waves.iter().map(|w| w.answered).sum::<usize>() + small.answered;
    let rejected: usize = waves.iter().map(|w| w.rejected).sum();
    assert_eq!(value("requests_success_total") as usize, answered);
    assert_eq!(value("requests_rejected_total") as usize, rejected);
    assert_eq!(value("requests_processing"), 0.0);
    assert_eq!(value("requests_queued"), 0.0);

    println!("wave | sent | answered | 503 | tokens | wall s | slowest s | tok/s");
    for (i, w) in waves.iter().chain([&small]).enumerate() {
        println!(
            "{} | {} | {} | {} | {} | {:.2} | {:.2} | {:.1}",
            i + 1,
            w.answered + w.rejected,
            w.answered,
            w.rejected,
            w.tokens,
            w.seconds,
            w.slowest,
            w.tokens as f64 / w.seconds
        );
    }
    println!(
        "RSS KiB: start {rss_start}, after each wave {:?}; generation {:.1} tok/s overall",
        rss,
        value("predicted_tokens_per_second")
    );
    // Flat: after the first wave has touched every slot's cache, later waves add little.
    let growth = rss.last().unwrap().saturating_sub(rss[0]);
    assert!(
        growth < 16 * 1024,
        "RSS grew by {growth} KiB over waves: {rss:?}"
    );
}
