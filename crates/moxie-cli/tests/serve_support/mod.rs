//! For the `moxie serve` tests: start the real binary on a free port, and a small HTTP/1.1
//! client over `TcpStream` that can also send malformed requests byte for byte.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

pub fn fixtures_dir() -> PathBuf {
    match std::env::var_os("MOXIE_FIXTURES") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures"),
    }
}

pub fn fixture_model(name: &str) -> String {
    let path = fixtures_dir().join("models").join(name);
    assert!(
        path.is_file(),
        "{} not found (set MOXIE_FIXTURES)",
        path.display()
    );
    path.to_str().unwrap().to_owned()
}

pub fn test_data(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
        .to_str()
        .unwrap()
        .to_owned()
}

/// A running `moxie serve`; killed on drop.
pub struct Server {
    pub child: Child,
    pub addr: SocketAddr,
    /// Everything it wrote to stderr so far.
    pub log: Arc<Mutex<String>>,
}

impl Server {
    /// Start `moxie serve -m MODEL --port 0 ARGS...` and wait until it listens.
    pub fn start(model: &str, args: &[&str]) -> Server {
        Server::start_with_env(model, args, &[])
    }

    /// [`Server::start`] with these environment variables set.
    pub fn start_with_env(model: &str, args: &[&str], env: &[(&str, &str)]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_moxie"))
            .args(["serve", "-m", &fixture_model(model), "--port", "0"])
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting moxie serve");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let log2 = log.clone();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.strip_prefix("listening on http://") {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(rest.trim().to_string());
                    }
                }
                let mut l = log2.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(180)) {
            Ok(a) => a.parse().expect("listening address"),
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "moxie serve did not start listening:\n{}",
                    log.lock().unwrap()
                );
            }
        };
        Server { child, addr, log }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident memory of the server process, in KiB.
    pub fn rss_kib(&self) -> u64 {
        self.status_kib("VmRSS")
    }

    /// A field of the server's `/proc/PID/status` in KiB (`VmRSS`; `VmHWM`, the peak).
    pub fn status_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{field} in /proc/{}/status", self.pid()))
    }

    /// The value of `moxie_NAME` in `/metrics` now.
    pub fn metric(&self, name: &str) -> f64 {
        metric_value(&self.get("/metrics").text(), name)
    }

    pub fn post(&self, path: &str, body: &Value) -> Response {
        self.raw_json("POST", path, &[], body.to_string().as_bytes())
    }

    pub fn get(&self, path: &str) -> Response {
        self.raw_json("GET", path, &[], b"")
    }

    /// A request with `Content-Length`; `headers` as "Name: value".
    pub fn raw_json(&self, method: &str, path: &str, headers: &[&str], body: &[u8]) -> Response {
        self.raw(&self.json_request(method, path, headers, body))
    }

    /// [`Server::raw_json`] to a server that may die before it answers: `None` when the
    /// connection fails or closes before a whole header.
    pub fn try_json(&self, method: &str, path: &str, body: &Value) -> Option<Response> {
        let req = self.json_request(method, path, &[], body.to_string().as_bytes());
        let mut s = TcpStream::connect(self.addr).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        s.write_all(&req).ok()?;
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        out.windows(4)
            .any(|w| w == b"\r\n\r\n")
            .then(|| Response::parse(&out))
    }

    /// The bytes of a request to this server ([`json_request`]).
    fn json_request(&self, method: &str, path: &str, headers: &[&str], body: &[u8]) -> Vec<u8> {
        json_request(self.addr, method, path, headers, body)
    }

    /// Send `bytes` as they are and read the whole answer.
    pub fn raw(&self, bytes: &[u8]) -> Response {
        let mut s = TcpStream::connect(self.addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        s.write_all(bytes).expect("send");
        let mut out = Vec::new();
        if let Err(e) = s.read_to_end(&mut out) {
            panic!(
                "reading the answer failed ({e}); got so far: {}",
                String::from_utf8_lossy(&out)
            );
        }
        Response::parse(&out)
    }
}

/// The bytes of a request to `addr` with `Content-Length` and `Connection: close`; `headers`
/// as "Name: value".
pub fn json_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[&str],
    body: &[u8],
) -> Vec<u8> {
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    )
    .into_bytes();
    for h in headers {
        req.extend_from_slice(h.as_bytes());
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"\r\n");
    req.extend_from_slice(body);
    req
}

/// The value of `moxie_NAME` in a `/metrics` text (panics, showing the text, without it).
pub fn metric_value(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&format!("moxie_{name} ")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from:\n{metrics}"))
}

/// `moxie serve -m MODEL --port 0 ARGS...` run to its end: for launch lines it must refuse.
pub fn serve_output(model: &str, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_moxie"))
        .args(["serve", "-m", &fixture_model(model), "--port", "0"])
        .args(args)
        .output()
        .expect("running moxie serve")
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn parse(raw: &[u8]) -> Response {
        let end = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .unwrap_or_else(|| panic!("no header end in {:?}", String::from_utf8_lossy(raw)));
        let head = String::from_utf8_lossy(&raw[..end]).into_owned();
        let mut lines = head.split("\r\n");
        let status: u16 = lines
            .next()
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|s| s.parse().ok())
            .expect("status line");
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let mut body = raw[end + 4..].to_vec();
        if headers
            .iter()
            .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"))
        {
            body = dechunk(&body);
        }
        Response {
            status,
            headers,
            body,
        }
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    /// SSE `data:` payloads, in order.
    pub fn sse_data(&self) -> Vec<String> {
        let text = self.text();
        text.split("\n\n")
            .flat_map(|ev| ev.lines())
            .filter_map(|l| l.strip_prefix("data:"))
            .map(|d| d.trim_start().to_string())
            .collect()
    }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(nl) = b.windows(2).position(|w| w == b"\r\n") {
        let size_text = String::from_utf8_lossy(&b[..nl]);
        let size =
            usize::from_str_radix(size_text.split(';').next().unwrap().trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        let start = nl + 2;
        if b.len() < start + size {
            out.extend_from_slice(&b[start..]);
            break;
        }
        out.extend_from_slice(&b[start..start + size]);
        b = &b[(start + size + 2).min(b.len())..];
    }
    out
}

/// The content of a streamed chat answer: (reasoning, content, finish_reason, chunks as JSON).
pub fn collect_chat_stream(r: &Response) -> (String, String, Option<String>, Vec<Value>) {
    let data = r.sse_data();
    assert_eq!(
        data.last().map(String::as_str),
        Some("[DONE]"),
        "stream must end with [DONE]: {}",
        r.text()
    );
    let mut reasoning = String::new();
    let mut content = String::new();
    let mut finish = None;
    let mut chunks = Vec::new();
    for d in &data[..data.len() - 1] {
        let v: Value = serde_json::from_str(d).unwrap_or_else(|e| panic!("chunk {d}: {e}"));
        if let Some(c) = v["choices"].get(0) {
            if let Some(s) = c["delta"]["content"].as_str() {
                content.push_str(s);
            }
            if let Some(s) = c["delta"]["reasoning_content"].as_str() {
                reasoning.push_str(s);
            }
            if let Some(f) = c["finish_reason"].as_str() {
                finish = Some(f.to_string());
            }
        }
        chunks.push(v);
    }
    (reasoning, content, finish, chunks)
}

/// Poll `/health` until no slot is busy (or panic after `timeout`).
pub fn wait_idle(s: &Server, timeout: Duration) {
    let t0 = Instant::now();
    loop {
        let h = s.get("/health").json();
        if h["slots_processing"] == 0 && h["requests_queued"] == 0 {
            return;
        }
        assert!(t0.elapsed() < timeout, "server still busy: {h}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
