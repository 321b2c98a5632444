//! `moxie serve` under stress, on loopback, bounded in count and time (issue 21). The stress
//! tests take a minute or more together, so they are `#[ignore]`d (all but a small check of
//! the timeouts); each prints its figures:
//!
//! ```text
//! MOXIE_FIXTURES=../shared/fixtures cargo test --release -p moxie-cli --test serve_stress \
//!     -- --ignored --nocapture --test-threads 1
//! ```
//!
//! * 256 concurrent streaming clients on 4 slots, with a queue that holds them all and with
//!   one that refuses some (503);
//! * clients that read one byte a second, next to normal ones (the engine does not wait on
//!   them, memory stays bounded, the write timeout cuts them off and frees their slots);
//! * bodies trickled byte by byte and heads that never end, many at once (408 / close);
//! * 5,000 sequential requests with the resident memory sampled (flat after warm-up);
//! * clients that disconnect at random points of their streams.
//!
//! Only outcomes are asserted (every request answered, refused with 503 or cut as the test
//! meant; nothing failed; memory bounds); the times are printed, never asserted.

mod serve_support;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use serve_support::*;

const MODEL: &str = "qwen3moe-tiny-Q8_0.gguf";

/// What one streaming client saw.
#[derive(Debug, Default, Clone)]
struct Outcome {
    status: u16,
    /// From sending the request to the first chunk with generated text.
    first_token: Option<Duration>,
    total: Duration,
    /// The stream ended with `[DONE]`.
    done: bool,
    completion_tokens: u64,
    /// The connection failed (no answer, or a reset) where the test did not cut it.
    error: Option<String>,
}

fn chat_body(i: usize, max_tokens: usize) -> Value {
    json!({
        "messages": [{"role": "user", "content": format!("Client {i}: tell me a long story.")}],
        "max_tokens": max_tokens, "ignore_eos": true, "stream": true,
        "stream_options": {"include_usage": true}, "seed": i,
    })
}

/// A POST of `body` to `addr`'s `path`, as bytes.
fn request_bytes(addr: SocketAddr, path: &str, body: &Value) -> Vec<u8> {
    json_request(addr, "POST", path, &[], body.to_string().as_bytes())
}

/// Whether `line` (one line of the SSE stream) is a chunk carrying generated text.
fn has_text(line: &str) -> bool {
    let Some(data) = line.trim_end().strip_prefix("data: ") else {
        return false;
    };
    let Ok(v) = serde_json::from_str::<Value>(data) else {
        return false;
    };
    let c = &v["choices"][0];
    ["content", "reasoning_content"]
        .iter()
        .any(|k| c["delta"][k].as_str().is_some_and(|s| !s.is_empty()))
        || c["text"].as_str().is_some_and(|s| !s.is_empty())
}

/// Send a streaming request on `s` and read the whole answer, timing the first token; with
/// `cut_after` chunks of text read, close the connection instead.
fn stream_on(mut s: TcpStream, req: &[u8], cut_after: Option<usize>) -> Outcome {
    let t0 = Instant::now();
    let mut out = Outcome::default();
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    if let Err(e) = s.write_all(req) {
        out.error = Some(format!("send: {e}"));
        return out;
    }
    let mut raw = Vec::new();
    let mut scanned = 0;
    let mut texts = 0;
    let mut buf = [0u8; 16 << 10];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e) => {
                out.error = Some(format!("read: {e}"));
                break;
            }
        }
        while let Some(nl) = raw[scanned..].iter().position(|&b| b == b'\n') {
            let line = String::from_utf8_lossy(&raw[scanned..scanned + nl]).into_owned();
            scanned += nl + 1;
            if has_text(&line) {
                texts += 1;
                out.first_token.get_or_insert(t0.elapsed());
            }
        }
        if cut_after.is_some_and(|c| texts >= c) {
            out.total = t0.elapsed();
            return out;
        }
    }
    out.total = t0.elapsed();
    if raw.windows(4).any(|w| w == b"\r\n\r\n") {
        let r = Response::parse(&raw);
        out.status = r.status;
        if r.status == 200 {
            let data = r.sse_data();
            out.done = data.last().map(String::as_str) == Some("[DONE]");
            out.completion_tokens = data
                .iter()
                .filter_map(|d| serde_json::from_str::<Value>(d).ok())
                .find_map(|v| v["usage"]["completion_tokens"].as_u64())
                .unwrap_or(0);
        }
    } else if out.error.is_none() {
        out.error = Some(format!("no answer ({} bytes)", raw.len()));
    }
    out
}

fn stream(addr: SocketAddr, body: &Value) -> Outcome {
    match TcpStream::connect(addr) {
        Ok(s) => stream_on(s, &request_bytes(addr, "/v1/chat/completions", body), None),
        Err(e) => Outcome {
            error: Some(format!("connect: {e}")),
            ..Outcome::default()
        },
    }
}

/// Nearest-rank percentile `p` (0-100) of `v`, in milliseconds.
fn pct(v: &[Duration], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s: Vec<f64> = v.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    s.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * s.len() as f64).ceil().max(1.0) as usize;
    s[rank - 1]
}

/// `n` streaming clients released at once; their outcomes.
fn burst(addr: SocketAddr, n: usize, max_tokens: usize) -> (Vec<Outcome>, Duration) {
    let gate = Arc::new(Barrier::new(n));
    let t0 = Instant::now();
    let outs = std::thread::scope(|scope| {
        let hs: Vec<_> = (0..n)
            .map(|i| {
                let gate = gate.clone();
                scope.spawn(move || {
                    gate.wait();
                    stream(addr, &chat_body(i, max_tokens))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    (outs, t0.elapsed())
}

/// Counts of a burst: (answered in full, 503, failed), checking each answered stream.
fn tally(outs: &[Outcome], max_tokens: u64) -> (usize, usize, usize) {
    let (mut ok, mut busy, mut failed) = (0, 0, 0);
    for o in outs {
        match (o.status, &o.error) {
            (200, None) if o.done && o.completion_tokens == max_tokens => ok += 1,
            (503, None) => busy += 1,
            _ => {
                eprintln!("failed: {o:?}");
                failed += 1;
            }
        }
    }
    (ok, busy, failed)
}

#[test]
#[ignore = "stress: minutes; see the file's header for the command"]
fn many_streams_on_four_slots() {
    const N: usize = 256;
    const TOKENS: usize = 128;
    println!(
        "| --max-queue | sent | answered | 503 | failed | first token p50 ms | p99 ms | wall s | peak RSS MiB |"
    );
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for queue in [256, 64] {
        let q = queue.to_string();
        let s = Server::start(
            MODEL,
            &[
                "-t",
                "1",
                "--parallel",
                "4",
                "--max-queue",
                &q,
                "-c",
                "4096",
            ],
        );
        let (outs, wall) = burst(s.addr, N, TOKENS);
        let (ok, busy, failed) = tally(&outs, TOKENS as u64);
        let firsts: Vec<Duration> = outs.iter().filter_map(|o| o.first_token).collect();
        wait_idle(&s, Duration::from_secs(60));
        println!(
            "| {queue} | {N} | {ok} | {busy} | {failed} | {:.0} | {:.0} | {:.2} | {:.1} |",
            pct(&firsts, 50.0),
            pct(&firsts, 99.0),
            wall.as_secs_f64(),
            s.status_kib("VmHWM") as f64 / 1024.0
        );
        assert_eq!(failed, 0);
        assert_eq!(ok + busy, N);
        if queue >= N {
            assert_eq!(ok, N, "a queue of {queue} holds every client");
        } else {
            // 4 running and `queue` waiting at least; later ones as slots free up.
            assert!(ok >= 4 + queue && busy > 0, "{ok} answered, {busy} refused");
        }
        assert_eq!(s.metric("requests_success_total") as usize, ok);
        assert_eq!(s.metric("requests_rejected_total") as usize, busy);
    }
}

/// A connection whose receive buffer is `rcvbuf` bytes (set before connecting, so the window
/// the server sees is that small).
fn small_window_connect(addr: SocketAddr, rcvbuf: usize) -> TcpStream {
    let sock = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        None,
    )
    .unwrap();
    sock.set_recv_buffer_size(rcvbuf).unwrap();
    sock.connect(&addr.into()).unwrap();
    sock.into()
}

/// A client that sends `requests` (pipelined, one connection), reads one byte a second for
/// `secs`, then the rest as fast as it comes; how many answers it got whole (`[DONE]`).
fn slow_reader(addr: SocketAddr, requests: &[Value], secs: u64, gate: &Barrier) -> usize {
    let mut c = small_window_connect(addr, 4096);
    for (i, body) in requests.iter().enumerate() {
        let mut req = request_bytes(addr, "/v1/chat/completions", body);
        if i + 1 < requests.len() {
            // Keep the connection for the next one.
            let text = String::from_utf8(req).unwrap();
            req = text
                .replace("Connection: close\r\n", "Connection: keep-alive\r\n")
                .into_bytes();
        }
        c.write_all(&req).unwrap();
    }
    gate.wait();
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut got = Vec::new();
    let mut b = [0u8; 1];
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(secs) {
        if c.read(&mut b).unwrap_or(0) == 0 {
            break;
        }
        got.push(b[0]);
        std::thread::sleep(Duration::from_secs(1));
    }
    // The rest (or a reset, where the server cut the connection).
    let _ = c.read_to_end(&mut got);
    String::from_utf8_lossy(&got)
        .matches("data: [DONE]")
        .count()
}

#[test]
#[ignore = "stress: minutes; see the file's header for the command"]
fn slow_readers_do_not_stall_the_engine() {
    // Readers of one answer each: the answer fits in the socket buffers, so the server writes
    // it all and frees the slot; the reader gets it whole in the end.
    const SLOW: usize = 4;
    // A reader of 12 pipelined answers of 2000 tokens (~0.5 MB each; more in all than
    // loopback's socket buffers hold, ~4 MB): the server's writes stall and the write timeout
    // cuts the connection.
    const STALLED: usize = 1;
    const PIPELINED: usize = 12;
    const SLOW_SECS: u64 = 25;
    const TIMEOUT: u64 = 3;
    // The fixture's 4096 tokens of context: 2048 a slot.
    let s = Server::start(
        MODEL,
        &[
            "-t",
            "1",
            "--parallel",
            "2",
            "-c",
            "4096",
            "--timeout",
            &TIMEOUT.to_string(),
        ],
    );
    let addr = s.addr;
    let normal = |n: usize| -> Vec<Outcome> {
        (0..n)
            .map(|i| stream(addr, &chat_body(1000 + i, 16)))
            .collect()
    };
    let before = normal(8);
    assert!(before.iter().all(|o| o.done), "{before:?}");
    wait_idle(&s, Duration::from_secs(30));
    let rss0 = s.rss_kib();

    let gate = Barrier::new(SLOW + STALLED + 1);
    let (slow, stalled, during, rss_during) = std::thread::scope(|scope| {
        let gate = &gate;
        let slow: Vec<_> = (0..SLOW)
            .map(|i| scope.spawn(move || slow_reader(addr, &[chat_body(i, 1000)], SLOW_SECS, gate)))
            .collect();
        let stalled: Vec<_> = (0..STALLED)
            .map(|i| {
                let bodies: Vec<Value> = (0..PIPELINED)
                    .map(|k| chat_body(100 * i + k, 2000))
                    .collect();
                scope.spawn(move || slow_reader(addr, &bodies, SLOW_SECS, gate))
            })
            .collect();
        gate.wait();
        // Normal clients while the slow ones trickle.
        std::thread::sleep(Duration::from_secs(1));
        let mut rss = vec![s.rss_kib()];
        let during = normal(8);
        rss.push(s.rss_kib());
        let join = |v: Vec<std::thread::ScopedJoinHandle<'_, usize>>| {
            v.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
        };
        let (slow, stalled) = (join(slow), join(stalled));
        rss.push(s.rss_kib());
        (slow, stalled, during, rss)
    });
    wait_idle(&s, Duration::from_secs(120));
    let firsts = |v: &[Outcome]| v.iter().filter_map(|o| o.first_token).collect::<Vec<_>>();
    println!("| normal clients | count | answered | first token p50 ms | p99 ms |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    for (name, v) in [("alone", &before), ("next to the slow readers", &during)] {
        println!(
            "| {name} | {} | {} | {:.0} | {:.0} |",
            v.len(),
            v.iter().filter(|o| o.done).count(),
            pct(&firsts(v), 50.0),
            pct(&firsts(v), 99.0)
        );
    }
    println!(
        "{SLOW} readers of 1 byte/s for {SLOW_SECS} s, one answer each: answers whole {slow:?}; {STALLED} of {PIPELINED} pipelined answers: whole before the write timeout ({TIMEOUT} s) cut them {stalled:?}; requests cancelled {}",
        s.metric("requests_cancelled_total")
    );
    println!(
        "RSS KiB: before {rss0}, during {:?}, after {}; peak {}",
        rss_during,
        s.rss_kib(),
        s.status_kib("VmHWM")
    );
    assert!(
        during.iter().all(|o| o.done && o.error.is_none()),
        "{during:?}"
    );
    assert!(slow.iter().all(|&n| n == 1), "{slow:?}");
    assert!(stalled.iter().all(|&n| n < PIPELINED), "{stalled:?}");
    let grew = rss_during.iter().max().unwrap().saturating_sub(rss0);
    assert!(grew < 64 * 1024, "RSS grew by {grew} KiB with slow readers");
    // And the server serves as before.
    assert!(normal(2).iter().all(|o| o.done));
}

/// Send `head` (a request's first bytes), then `trickle` one byte each `every`, until the
/// server answers or closes; what it sent back and how long that took.
fn trickle(addr: SocketAddr, head: &[u8], trickle: &[u8], every: Duration) -> (Vec<u8>, Duration) {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
    let t0 = Instant::now();
    c.write_all(head).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let mut closed = false;
    // A bounded number of bytes (a minute's worth at 100 ms), not a clock, ends a server
    // that never cuts the client off.
    for &b in trickle.iter().cycle().take(600) {
        match c.read(&mut buf) {
            Ok(0) => {
                closed = true;
                break;
            }
            Ok(n) => {
                got.extend_from_slice(&buf[..n]);
                continue;
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => {
                closed = true;
                break;
            }
        }
        if c.write_all(&[b]).is_err() {
            closed = true;
            break;
        }
        std::thread::sleep(every);
    }
    assert!(
        closed,
        "600 bytes trickled and the server never cut the client off"
    );
    // Whatever else it sent before closing.
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = c.read_to_end(&mut got);
    (got, t0.elapsed())
}

#[test]
#[ignore = "stress: minutes; see the file's header for the command"]
fn trickled_bodies_and_endless_heads_are_cut_off() {
    const EACH: usize = 64;
    let s = Server::start(MODEL, &["-t", "1", "--parallel", "4", "--timeout", "2"]);
    let addr = s.addr;
    let body_head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{{\"messages\": "
    );
    let endless_head = format!("POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\n");
    let rss0 = s.rss_kib();
    let (bodies, heads, served) = std::thread::scope(|scope| {
        let bodies: Vec<_> = (0..EACH)
            .map(|_| {
                let h = body_head.as_bytes();
                scope.spawn(move || trickle(addr, h, b" ", Duration::from_millis(100)))
            })
            .collect();
        let heads: Vec<_> = (0..EACH)
            .map(|_| {
                let h = endless_head.as_bytes();
                scope
                    .spawn(move || trickle(addr, h, b"X-Slow: yes\r\n", Duration::from_millis(100)))
            })
            .collect();
        // Normal clients meanwhile.
        let served: Vec<Outcome> = (0..8).map(|i| stream(addr, &chat_body(i, 16))).collect();
        let j = |v: Vec<std::thread::ScopedJoinHandle<'_, (Vec<u8>, Duration)>>| {
            v.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
        };
        (j(bodies), j(heads), served)
    });
    let mut b408 = 0;
    for (got, _) in &bodies {
        let r = Response::parse(got);
        assert_eq!(r.status, 408, "{}", r.text());
        assert_eq!(r.json()["error"]["code"], "request_timeout");
        b408 += 1;
    }
    // A head that never ends gets no answer: the connection is closed.
    let heads_closed = heads.iter().filter(|(got, _)| got.is_empty()).count();
    let secs = |v: &[(Vec<u8>, Duration)]| v.iter().map(|x| x.1).collect::<Vec<_>>();
    println!("| client | sent | answered 408 | closed without answer | p50 s | max s |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    for (name, v, a, c) in [
        ("body, a byte per 100 ms", &bodies, b408, 0),
        ("head, a line per 100 ms", &heads, 0, heads_closed),
    ] {
        println!(
            "| {name} | {} | {a} | {c} | {:.2} | {:.2} |",
            v.len(),
            pct(&secs(v), 50.0) / 1e3,
            pct(&secs(v), 100.0) / 1e3
        );
    }
    println!(
        "normal clients meanwhile: {} of {} answered in full, first token p50 {:.0} ms; RSS KiB {rss0} -> {}",
        served.iter().filter(|o| o.done).count(),
        served.len(),
        pct(
            &served.iter().filter_map(|o| o.first_token).collect::<Vec<_>>(),
            50.0
        ),
        s.rss_kib()
    );
    assert_eq!(heads_closed, EACH);
    assert!(served.iter().all(|o| o.done && o.error.is_none()));
}

/// The small, always-run version of the test above: one trickled body (408, then the
/// connection closes), one head that never ends (closed), and a body sent in three parts
/// inside the limit (answered).
#[test]
fn request_timeouts_answer_408_or_close() {
    // Generous, so that the body sent in time is in time on a busy machine too; the three
    // clients run side by side.
    let s = Server::start(MODEL, &["-t", "1", "--timeout", "5"]);
    let addr = s.addr;
    let body_head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 1000\r\n\r\n{{"
    );
    let endless_head = format!("GET /health HTTP/1.1\r\nHost: {addr}\r\n");
    let (body, head, in_time) = std::thread::scope(|scope| {
        let body =
            scope.spawn(|| trickle(addr, body_head.as_bytes(), b" ", Duration::from_millis(100)));
        let head = scope.spawn(|| {
            trickle(
                addr,
                endless_head.as_bytes(),
                b"X-Slow: yes\r\n",
                Duration::from_millis(100),
            )
        });
        let in_time = scope.spawn(|| {
            let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
                .to_string();
            let head = format!(
                "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
                body.len()
            );
            let mut c = TcpStream::connect(addr).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
            c.write_all(head.as_bytes()).unwrap();
            for part in body.as_bytes().chunks(body.len().div_ceil(3)) {
                std::thread::sleep(Duration::from_millis(100));
                c.write_all(part).unwrap();
            }
            let mut got = Vec::new();
            c.read_to_end(&mut got).unwrap();
            Response::parse(&got)
        });
        (
            body.join().unwrap().0,
            head.join().unwrap().0,
            in_time.join().unwrap(),
        )
    });
    let r = Response::parse(&body);
    assert_eq!(r.status, 408, "{}", r.text());
    assert_eq!(r.header("connection"), Some("close"));
    assert_eq!(r.json()["error"]["code"], "request_timeout");
    assert!(head.is_empty(), "{}", String::from_utf8_lossy(&head));
    assert_eq!(in_time.status, 200, "{}", in_time.text());
    assert_eq!(in_time.json()["usage"]["completion_tokens"], 2);
}

/// `--timeout` outside 1 s to a year is refused at start, naming the flag (0 would cut every
/// client at once; a huge one would overflow the clock).
#[test]
fn out_of_range_timeouts_are_refused() {
    for bad in ["0", "99999999999"] {
        let o = serve_output(MODEL, &["--timeout", bad]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "--timeout {bad} was accepted");
        assert!(err.contains("--timeout takes 1 to"), "{err}");
    }
}

#[test]
#[ignore = "stress: minutes; see the file's header for the command"]
fn five_thousand_sequential_requests_keep_memory_flat() {
    const N: usize = 5000;
    const EVERY: usize = 250;
    let s = Server::start(MODEL, &["-t", "1", "--parallel", "2", "-c", "2048"]);
    let mut samples = vec![(0, s.rss_kib())];
    let mut lat = Vec::with_capacity(N);
    let t0 = Instant::now();
    for i in 0..N {
        let stream = i % 2 == 0;
        let body = json!({
            // Prompts that share a prefix now and then (the slots' prefix reuse).
            "messages": [{"role": "user", "content": format!("Question {}: what is {}?", i % 7, i)}],
            "max_tokens": 4, "ignore_eos": true, "stream": stream, "seed": i,
        });
        let t = Instant::now();
        let r = s.post("/v1/chat/completions", &body);
        lat.push(t.elapsed());
        assert_eq!(r.status, 200, "request {i}: {}", r.text());
        if stream {
            let (_, _, finish, _) = collect_chat_stream(&r);
            assert_eq!(finish.as_deref(), Some("length"));
        } else {
            assert_eq!(r.json()["usage"]["completion_tokens"], 4);
        }
        if (i + 1) % EVERY == 0 {
            samples.push((i + 1, s.rss_kib()));
        }
    }
    let wall = t0.elapsed();
    println!(
        "{N} sequential requests in {:.1} s; latency p50 {:.1} ms, p99 {:.1} ms; peak RSS {} KiB",
        wall.as_secs_f64(),
        pct(&lat, 50.0),
        pct(&lat, 99.0),
        s.status_kib("VmHWM")
    );
    println!("RSS KiB after each {EVERY}: {samples:?}");
    assert_eq!(s.metric("requests_success_total") as usize, N);
    // Flat after warm-up: from the 1000th request on, within 4 MiB.
    let warm: Vec<u64> = samples
        .iter()
        .filter(|(n, _)| *n >= 1000)
        .map(|x| x.1)
        .collect();
    let spread = warm.iter().max().unwrap() - warm.iter().min().unwrap();
    assert!(
        spread < 4 * 1024,
        "RSS moved by {spread} KiB after warm-up: {samples:?}"
    );
}

#[test]
#[ignore = "stress: minutes; see the file's header for the command"]
fn clients_disconnecting_mid_stream_free_their_slots() {
    const N: usize = 96;
    let s = Server::start(
        MODEL,
        &[
            "-t",
            "1",
            "--parallel",
            "4",
            "--max-queue",
            "128",
            "-c",
            "4096",
        ],
    );
    let addr = s.addr;
    let gate = Arc::new(Barrier::new(N));
    // A fixed pseudo-random cut per client: 0 (right after sending), or after 1 to 40 chunks
    // of text; every fourth client also drops a non-streamed request while it waits.
    let cut = |i: usize| (i.wrapping_mul(2_654_435_761) >> 7) % 41;
    let outs: Vec<Outcome> = std::thread::scope(|scope| {
        let hs: Vec<_> = (0..N)
            .map(|i| {
                let gate = gate.clone();
                scope.spawn(move || {
                    let mut body = chat_body(i, 400);
                    if i % 4 == 3 {
                        body["stream"] = json!(false);
                        body.as_object_mut().unwrap().remove("stream_options");
                    }
                    let c = TcpStream::connect(addr).unwrap();
                    gate.wait();
                    let req = request_bytes(addr, "/v1/chat/completions", &body);
                    if i % 4 == 3 || cut(i) == 0 {
                        let mut c = c;
                        c.write_all(&req).unwrap();
                        std::thread::sleep(Duration::from_millis(50 * (i % 5) as u64));
                        return Outcome::default();
                    }
                    stream_on(c, &req, Some(cut(i)))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // Every slot comes free again, without the abandoned requests running to their end.
    let t0 = Instant::now();
    wait_idle(&s, Duration::from_secs(120));
    let idle_after = t0.elapsed();
    let cancelled = s.metric("requests_cancelled_total");
    let success = s.metric("requests_success_total");
    let failed = outs.iter().filter(|o| o.error.is_some()).count();
    // Then normal service.
    let after: Vec<Outcome> = (0..4).map(|i| stream(addr, &chat_body(i, 8))).collect();
    println!(
        "{N} clients disconnected mid-request ({} streamed, cut after 1-40 chunks; {} right after sending): cancelled {cancelled}, ran to the end {success}, idle {:.2} s after the last disconnect; failures before the cut {failed}; peak RSS {} KiB",
        outs.iter().filter(|o| o.first_token.is_some()).count(),
        (0..N).filter(|&i| i % 4 == 3 || cut(i) == 0).count(),
        idle_after.as_secs_f64(),
        s.status_kib("VmHWM")
    );
    assert_eq!(failed, 0, "{outs:?}");
    assert!(cancelled >= (N / 2) as f64, "only {cancelled} cancelled");
    assert!(after.iter().all(|o| o.done), "{after:?}");
    let log = s.log.lock().unwrap().clone();
    assert!(!log.contains("panicked"), "{log}");
}
