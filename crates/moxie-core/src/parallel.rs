//! Splitting row-parallel work across threads.
//!
//! A deliberately small seam: every parallel kernel of the forward pass goes through
//! [`Parallel::for_each_range`], so the scheduling strategy (scoped threads today, a pinned spin
//! pool for the per-token hot path later) changes in one place.

use std::ops::Range;

/// How many threads row-parallel kernels may use.
#[derive(Clone, Copy, Debug)]
pub struct Parallel {
    n_threads: usize,
}

/// Below this many scalar multiply-adds per call a kernel runs on the calling thread: spawning
/// costs tens of microseconds.
const MIN_WORK_PER_THREAD: usize = 1 << 18;

impl Parallel {
    pub fn new(n_threads: usize) -> Self {
        Parallel {
            n_threads: n_threads.max(1),
        }
    }

    pub fn single() -> Self {
        Parallel { n_threads: 1 }
    }

    /// All cores the process may use.
    pub fn available() -> Self {
        Self::new(std::thread::available_parallelism().map_or(1, |n| n.get()))
    }

    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// Run `f` over disjoint sub-ranges of `0..n` that together cover it. `work_per_item` is a
    /// rough cost (multiply-adds) used to decide whether threads pay off. `f` receives the range
    /// and the mutable chunk of `out` for it (`out.len() == n * out_stride`).
    pub fn for_each_range<T: Send, F>(
        &self,
        n: usize,
        work_per_item: usize,
        out: &mut [T],
        out_stride: usize,
        f: F,
    ) where
        F: Fn(Range<usize>, &mut [T]) + Sync,
    {
        debug_assert_eq!(out.len(), n * out_stride);
        let by_work = (n.saturating_mul(work_per_item) / MIN_WORK_PER_THREAD).max(1);
        let n_threads = self.n_threads.min(by_work).min(n.max(1));
        if n_threads <= 1 {
            f(0..n, out);
            return;
        }
        let per = n.div_ceil(n_threads);
        std::thread::scope(|s| {
            let mut rest = out;
            let mut start = 0;
            let f = &f;
            while start < n {
                let end = (start + per).min(n);
                let (chunk, tail) = rest.split_at_mut((end - start) * out_stride);
                rest = tail;
                let range = start..end;
                if end == n {
                    f(range, chunk);
                } else {
                    s.spawn(move || f(range, chunk));
                }
                start = end;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn covers_every_item_once() {
        for threads in [1, 2, 3, 8] {
            let p = Parallel::new(threads);
            let mut out = vec![0u32; 1000 * 2];
            p.for_each_range(1000, 1 << 20, &mut out, 2, |r, chunk| {
                for (i, item) in r.zip(chunk.chunks_exact_mut(2)) {
                    item[0] += i as u32;
                    item[1] += 1;
                }
            });
            for (i, item) in out.chunks_exact(2).enumerate() {
                assert_eq!(item, &[i as u32, 1]);
            }
        }
    }
}
