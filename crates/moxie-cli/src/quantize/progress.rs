//! A one-line progress display on stderr: tensor i/N, bytes read of the total, read rate and
//! the tensor in hand. Drawn only when stderr is a terminal (and not `--quiet`), at most ten
//! times a second.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

pub struct Progress {
    enabled: bool,
    n_tensors: usize,
    total_bytes: u64,
    done_bytes: u64,
    start: Instant,
    last_draw: Option<Instant>,
    width: usize,
}

/// `n` bytes with a binary unit (`12.3 MiB`).
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

impl Progress {
    /// `total_bytes`: the input bytes that will be read (the measure of progress).
    pub fn new(quiet: bool, n_tensors: usize, total_bytes: u64) -> Progress {
        Progress {
            enabled: !quiet && std::io::stderr().is_terminal(),
            n_tensors,
            total_bytes,
            done_bytes: 0,
            start: Instant::now(),
            last_draw: None,
            width: 0,
        }
    }

    /// `bytes` more input processed while on tensor `index` (0-based) called `name`.
    pub fn advance(&mut self, index: usize, name: &str, bytes: u64) {
        self.done_bytes += bytes;
        if !self.enabled {
            return;
        }
        let now = Instant::now();
        let last = index + 1 == self.n_tensors && self.done_bytes >= self.total_bytes;
        if !last
            && self
                .last_draw
                .is_some_and(|t| now.duration_since(t) < Duration::from_millis(100))
        {
            return;
        }
        self.last_draw = Some(now);
        let secs = now.duration_since(self.start).as_secs_f64().max(1e-9);
        let rate = self.done_bytes as f64 / secs;
        let w = self.n_tensors.to_string().len();
        let line = format!(
            "[{:>w$}/{}] {} / {} ({}/s) {}",
            index + 1,
            self.n_tensors,
            human_bytes(self.done_bytes),
            human_bytes(self.total_bytes),
            human_bytes(rate as u64),
            name,
        );
        let pad = self.width.saturating_sub(line.chars().count());
        self.width = line.chars().count();
        let mut e = std::io::stderr().lock();
        let _ = write!(e, "\r{line}{:pad$}", "");
        let _ = e.flush();
    }

    /// Ends the progress line (if one was drawn).
    pub fn finish(&mut self) {
        if self.enabled && self.last_draw.is_some() {
            let _ = writeln!(std::io::stderr());
            self.last_draw = None;
        }
    }

    /// Seconds since the start.
    pub fn elapsed(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_bytes_units() {
        assert_eq!(human_bytes(999), "999 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(3 << 30), "3.0 GiB");
    }
}
