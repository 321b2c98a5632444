//! Splitting row-parallel work across threads.
//!
//! A deliberately small seam: every parallel kernel of the forward pass goes through
//! [`Parallel`]'s few ways of splitting work ([`Parallel::for_each_range`], and
//! [`Parallel::for_each_piece`] for one-token products), so the scheduling strategy (a
//! persistent, pinned spin pool: [`crate::spin_pool`]) lives in one place.

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::spin_pool::SpinPool;

/// The compute context every kernel of the forward pass receives: how many threads row-parallel
/// kernels may use, the persistent workers that run them (the calling thread works too, so the
/// pool holds `n_threads - 1`), and which [`Numerics`] batched products may use.
#[derive(Clone)]
pub struct Parallel {
    n_threads: usize,
    /// Threads for passes of several tokens (llama.cpp's `--threads-batch`); the pool holds
    /// enough workers for the larger of the two.
    n_threads_batch: usize,
    pool: Option<Arc<SpinPool>>,
    numerics: Numerics,
    mla_prompts: MlaPrompts,
}

/// Whether batched matrix products must sum exactly as llama.cpp does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Numerics {
    /// Faster kernels for batches (int8 GEMM on AVX-512 VNNI): every block's integer dot product
    /// is ggml's, only the float accumulation order differs, so logits agree with llama.cpp to
    /// float rounding. One-token decode is unaffected.
    #[default]
    Fast,
    /// llama.cpp's summation order everywhere (bit-identical logits; slower prompt processing).
    Exact,
}

/// How MLA attends over a prompt batch in fast numerics (`--mla-use`). Decode always attends
/// over the compressed latents.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MlaPrompts {
    /// Over the compressed latents, as llama.cpp does (its rounding: the fixtures' bounds).
    #[default]
    Absorbed,
    /// Each head's keys and values expanded from the latents first, as ik_llama.cpp's
    /// `-mla 3` does: fewer multiply-adds per (query, position) where a batch attends to
    /// enough positions, and ik's rounding rather than llama.cpp's.
    Expanded,
}

impl std::fmt::Debug for Parallel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Parallel({} threads, {:?})",
            self.n_threads, self.numerics
        )
    }
}

/// Threads that own a share of [`Parallel::for_each_piece`]'s items (more only help).
const MAX_SHARES: usize = 32;

/// A thread's share of [`Parallel::for_each_piece`]'s items not yet taken, with their outputs.
/// Its pieces start at multiples of the grain from the first item.
struct Share<'a, T> {
    items: Range<usize>,
    out: &'a mut [T],
}

impl<'a, T> Share<'a, T> {
    /// The first piece left, taken.
    fn front(&mut self, grain: usize, stride: usize) -> Option<(Range<usize>, &'a mut [T])> {
        if self.items.is_empty() {
            return None;
        }
        let len = grain.min(self.items.len());
        let (piece, rest) = std::mem::take(&mut self.out).split_at_mut(len * stride);
        self.out = rest;
        let items = self.items.start..self.items.start + len;
        self.items.start += len;
        Some((items, piece))
    }

    /// The last piece left, taken.
    fn back(&mut self, grain: usize, stride: usize) -> Option<(Range<usize>, &'a mut [T])> {
        if self.items.is_empty() {
            return None;
        }
        let start = ((self.items.end - 1) / grain * grain).max(self.items.start);
        let keep = (start - self.items.start) * stride;
        let (rest, piece) = std::mem::take(&mut self.out).split_at_mut(keep);
        self.out = rest;
        let items = start..self.items.end;
        self.items.end = start;
        Some((items, piece))
    }
}

/// A share, locked (a panic elsewhere leaves it consistent: it is only ever split).
fn lock<'m, 'a, T>(s: &'m Mutex<Share<'a, T>>) -> std::sync::MutexGuard<'m, Share<'a, T>> {
    s.lock().unwrap_or_else(|p| p.into_inner())
}

/// Below this many scalar multiply-adds per thread a kernel runs on fewer threads: handing work
/// to a spinning worker costs about a microsecond, ~10^4 multiply-adds.
const MIN_WORK_PER_THREAD: usize = 1 << 15;

impl Parallel {
    /// `n_threads` threads in all: the caller and `n_threads - 1` workers pinned one per CPU
    /// (when the process may use that many).
    pub fn new(n_threads: usize) -> Self {
        Self::with_batch_threads(n_threads, n_threads)
    }

    /// `n_threads` for one-token passes and `n_threads_batch` for passes of several tokens
    /// (`-t` / `-tb`), over one pool of workers for the larger.
    pub fn with_batch_threads(n_threads: usize, n_threads_batch: usize) -> Self {
        let (n_threads, n_threads_batch) = (n_threads.max(1), n_threads_batch.max(1));
        let most = n_threads.max(n_threads_batch);
        // A pool that cannot be built (no threads available) degrades to one thread.
        let pool = (most > 1)
            .then(|| SpinPool::new(most - 1, true).ok())
            .flatten()
            .map(Arc::new);
        let (n_threads, n_threads_batch) = match pool {
            Some(_) => (n_threads, n_threads_batch),
            None => (1, 1),
        };
        Parallel {
            n_threads,
            n_threads_batch,
            pool,
            numerics: Numerics::default(),
            mla_prompts: MlaPrompts::default(),
        }
    }

    /// The same workers, as wide as a pass of `n_tokens` may use: `-tb` threads for several
    /// tokens, `-t` for one.
    pub fn for_tokens(&self, n_tokens: usize) -> Parallel {
        let mut p = self.clone();
        if n_tokens > 1 {
            p.n_threads = p.n_threads_batch;
        }
        p
    }

    /// Threads for passes of several tokens.
    pub fn n_threads_batch(&self) -> usize {
        self.n_threads_batch
    }

    pub fn single() -> Self {
        Parallel {
            n_threads: 1,
            n_threads_batch: 1,
            pool: None,
            numerics: Numerics::default(),
            mla_prompts: MlaPrompts::default(),
        }
    }

    /// The same workers with other numerics.
    pub fn with_numerics(mut self, numerics: Numerics) -> Self {
        self.numerics = numerics;
        self
    }

    pub fn numerics(&self) -> Numerics {
        self.numerics
    }

    pub fn with_mla_prompts(mut self, mla_prompts: MlaPrompts) -> Self {
        self.mla_prompts = mla_prompts;
        self
    }

    pub fn mla_prompts(&self) -> MlaPrompts {
        self.mla_prompts
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
    /// and the mutable chunk of `out` for it (`out.len() == n * out_stride`). One range per
    /// thread.
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
        let n_threads = self.threads_for(n, n.saturating_mul(work_per_item));
        if n_threads < 2 || out_stride == 0 {
            f(0..n, out);
            return;
        }
        // One chunk per thread.
        let per = n.div_ceil(n_threads);
        let parts = out
            .chunks_mut(per * out_stride)
            .enumerate()
            .map(|(i, chunk)| (i * per..((i + 1) * per).min(n), chunk));
        self.run_parts(n_threads, parts, f);
    }

    /// [`Parallel::for_each_range`] for one-token products, which stream their weights from
    /// memory: `f` gets pieces of `grain` items (the last may be shorter). Each thread starts
    /// at the front of its own equal share and walks it piece by piece, so while the threads
    /// run at one speed each reads one sequential stream, as with one range per thread. A
    /// thread whose share is done takes pieces from the back of the share with the most left:
    /// a thread slowed by the host hands its last pieces to the others instead of keeping
    /// them waiting at the end of the region.
    pub fn for_each_piece<T: Send, F>(
        &self,
        n: usize,
        work_per_item: usize,
        grain: usize,
        out: &mut [T],
        out_stride: usize,
        f: F,
    ) where
        F: Fn(Range<usize>, &mut [T]) + Sync,
    {
        debug_assert_eq!(out.len(), n * out_stride);
        let grain = grain.max(1);
        let n_threads = self.threads_for(n, n.saturating_mul(work_per_item));
        let n_pieces = n.div_ceil(grain);
        if n_threads < 2 || out_stride == 0 || n_pieces < 2 {
            f(0..n, out);
            return;
        }
        let n_threads = n_threads.min(n_pieces);
        // Thread `i`'s items not yet taken and their part of `out`: its owner takes pieces
        // from the front, others from the back. In an array, not a vector: decode allocates
        // nothing per token. Threads past MAX_SHARES own no share and only help.
        let n_shares = n_threads.min(MAX_SHARES);
        let mut rest = out;
        let shares: [Mutex<Share<T>>; MAX_SHARES] = std::array::from_fn(|i| {
            let items = if i < n_shares {
                i * n_pieces / n_shares * grain..((i + 1) * n_pieces / n_shares * grain).min(n)
            } else {
                n..n
            };
            let (out, tail) = std::mem::take(&mut rest).split_at_mut(items.len() * out_stride);
            rest = tail;
            Mutex::new(Share { items, out })
        });
        let shares = &shares[..n_shares];
        let next_thread = AtomicUsize::new(0);
        let job = || {
            let me = next_thread.fetch_add(1, Ordering::Relaxed);
            if let Some(own) = shares.get(me) {
                loop {
                    let Some((items, o)) = lock(own).front(grain, out_stride) else {
                        break;
                    };
                    f(items, o);
                }
            }
            // Then the back of the share with the most left, until none is (shares only
            // shrink, so this ends).
            while let Some((_, s)) = shares
                .iter()
                .map(|s| (lock(s).items.len(), s))
                .filter(|&(n, _)| n > 0)
                .max_by_key(|&(n, _)| n)
            {
                let piece = lock(s).back(grain, out_stride);
                if let Some((items, o)) = piece {
                    f(items, o);
                }
            }
        };
        self.run_job(n_threads, &job);
    }

    /// Like [`Parallel::for_each_range`] for items of unequal cost and output size: item `i`
    /// owns `out[out_start(i)..out_start(i + 1)]` (`out_start(0) == 0`,
    /// `out_start(n) == out.len()`, non-decreasing). The items go out in contiguous runs,
    /// largest first (guided scheduling): each run costs about half a thread's share of what
    /// is left, down to a sixteenth of a thread's share of the total, and a thread that
    /// finishes takes the next. Costs are estimates and a thread can be slowed by the host, so
    /// the last runs being short keeps threads from waiting on one another at the end of
    /// the region. `f` receives a run and its part of `out`.
    pub fn for_each_run<T: Send, F>(
        &self,
        n: usize,
        cost: impl Fn(usize) -> usize,
        out: &mut [T],
        out_start: impl Fn(usize) -> usize,
        f: F,
    ) where
        F: Fn(Range<usize>, &mut [T]) + Sync,
    {
        debug_assert_eq!(out_start(0), 0);
        debug_assert_eq!(out_start(n), out.len());
        let total: usize = (0..n).map(&cost).fold(0, usize::saturating_add);
        let n_threads = self.threads_for(n, total);
        if n_threads < 2 {
            f(0..n, out);
            return;
        }
        let smallest = total / (16 * n_threads);
        let target = |left: usize| (left / (2 * n_threads)).max(smallest).max(1);
        let mut runs = Vec::with_capacity(4 * n_threads);
        let (mut rest, mut taken, mut start) = (out, 0, 0);
        let (mut left, mut acc) = (total, 0usize);
        for i in 0..n {
            acc = acc.saturating_add(cost(i));
            if acc >= target(left) || i + 1 == n {
                let end = out_start(i + 1);
                let (chunk, tail) = std::mem::take(&mut rest).split_at_mut(end - taken);
                rest = tail;
                taken = end;
                runs.push((start..i + 1, chunk));
                start = i + 1;
                left = left.saturating_sub(acc);
                acc = 0;
            }
        }
        self.run_parts(n_threads, runs.into_iter(), f);
    }

    /// `f(0), f(1), ..., f(n - 1)` computed over the threads, item `i` costing about
    /// `cost(i)` multiply-adds (runs of equal total cost, as [`Parallel::for_each_run`]).
    pub fn map<T: Send>(
        &self,
        n: usize,
        cost: impl Fn(usize) -> usize,
        f: impl Fn(usize) -> T + Sync,
    ) -> Vec<T> {
        let mut slots: Vec<Option<T>> = (0..n).map(|_| None).collect();
        self.for_each_run(
            n,
            cost,
            &mut slots,
            |i| i,
            |items, out| {
                for (i, slot) in items.zip(out) {
                    *slot = Some(f(i));
                }
            },
        );
        slots
            .into_iter()
            .map(|v| v.expect("every item was computed"))
            .collect()
    }

    /// Threads worth using for `n` items of `work` multiply-adds in all (1: run on the caller).
    fn threads_for(&self, n: usize, work: usize) -> usize {
        let by_work = (work / MIN_WORK_PER_THREAD).max(1);
        let n_threads = self.n_threads.min(by_work).min(n.max(1));
        if self.pool.is_some() {
            n_threads
        } else {
            1
        }
    }

    /// Run `f` on every part, the caller and `n_threads - 1` workers each taking the next part
    /// until none is left (a late-starting worker never holds the others up).
    fn run_parts<'a, T: Send + 'a, F>(
        &self,
        n_threads: usize,
        parts: impl Iterator<Item = (Range<usize>, &'a mut [T])> + Send,
        f: F,
    ) where
        F: Fn(Range<usize>, &mut [T]) + Sync,
    {
        let parts = Mutex::new(parts);
        let job = || loop {
            let next = parts.lock().unwrap_or_else(|p| p.into_inner()).next();
            let Some((range, chunk)) = next else { break };
            f(range, chunk);
        };
        self.run_job(n_threads, &job);
    }

    /// `job` on the caller and `n_threads - 1` workers, returning when all are done; each
    /// copy of `job` takes work until none is left, so one copy alone also does it all.
    fn run_job(&self, n_threads: usize, job: &(dyn Fn() + Sync)) {
        let ran = self
            .pool
            .as_ref()
            .is_some_and(|pool| pool.run(n_threads - 1, job));
        if !ran {
            // No pool, or it is busy (nested or concurrent use): do it all here.
            job();
        }
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

    /// `-t 1 -tb 3`: one-token passes on one thread, batches on three of the same pool, and
    /// every item covered either way.
    #[test]
    fn batches_take_their_own_thread_count() {
        let p = Parallel::with_batch_threads(1, 3);
        assert_eq!((p.n_threads(), p.n_threads_batch()), (1, 3));
        assert_eq!(p.for_tokens(1).n_threads(), 1);
        let batch = p.for_tokens(8);
        assert_eq!(batch.n_threads(), 3);
        // Regions split three ways for a batch, not at all for one token.
        assert_eq!(batch.threads_for(3000, 1 << 30), 3);
        assert_eq!(p.for_tokens(1).threads_for(3000, 1 << 30), 1);
        let mut out = vec![0u32; 3000];
        batch.for_each_range(3000, 1 << 20, &mut out, 1, |r, o| {
            for (i, y) in r.zip(o.iter_mut()) {
                *y = i as u32;
            }
        });
        assert!(out.iter().enumerate().all(|(i, &y)| y == i as u32));
        let p = Parallel::with_batch_threads(4, 2);
        assert_eq!(
            (p.for_tokens(1).n_threads(), p.for_tokens(2).n_threads()),
            (4, 2)
        );
    }

    #[test]
    fn nested_and_concurrent_use_runs_everything_once() {
        let p = Parallel::new(3);
        std::thread::scope(|sc| {
            for _ in 0..2 {
                let p = p.clone();
                sc.spawn(move || {
                    for _ in 0..200 {
                        let mut out = vec![0u64; 64];
                        p.for_each_range(64, 1 << 20, &mut out, 1, |r, o| {
                            for (i, y) in r.zip(o.iter_mut()) {
                                // A nested region runs on the caller when the pool is busy.
                                let mut inner = vec![0u64; 8];
                                p.for_each_range(8, 1 << 20, &mut inner, 1, |ri, oi| {
                                    for (j, z) in ri.zip(oi.iter_mut()) {
                                        *z = j as u64;
                                    }
                                });
                                *y = i as u64 + inner.iter().sum::<u64>();
                            }
                        });
                        for (i, &y) in out.iter().enumerate() {
                            assert_eq!(y, i as u64 + 28);
                        }
                    }
                });
            }
        });
    }

    #[test]
    fn a_panicking_worker_is_reported_and_the_pool_survives() {
        let p = Parallel::new(2);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut out = vec![0u8; 100];
            p.for_each_range(100, 1 << 20, &mut out, 1, |r, _| {
                assert!(r.start != 0, "boom");
            });
        }));
        assert!(caught.is_err());
        let mut out = vec![0u8; 100];
        p.for_each_range(100, 1 << 20, &mut out, 1, |_, o| o.fill(1));
        assert!(out.iter().all(|&v| v == 1));
    }

    #[test]
    fn pieces_cover_every_item_once() {
        // 40: more threads than shares (MAX_SHARES); the rest only help.
        for threads in [1, 2, 3, 5, 40] {
            let p = Parallel::new(threads);
            for (n, grain) in [(1000, 16), (1000, 7), (10, 16), (33, 1), (64, 64)] {
                let mut out = vec![0u32; n * 2];
                let calls = std::sync::Mutex::new(Vec::new());
                p.for_each_piece(n, 1 << 20, grain, &mut out, 2, |r, chunk| {
                    assert_eq!(chunk.len(), r.len() * 2);
                    calls.lock().unwrap().push(r.clone());
                    for (i, item) in r.zip(chunk.chunks_exact_mut(2)) {
                        item[0] += i as u32;
                        item[1] += 1;
                    }
                });
                for (i, item) in out.chunks_exact(2).enumerate() {
                    assert_eq!(
                        item,
                        &[i as u32, 1],
                        "n {n} grain {grain} threads {threads}"
                    );
                }
                // Whole pieces (or the whole range on one thread).
                for r in calls.into_inner().unwrap() {
                    assert!(r.start.is_multiple_of(grain));
                    assert!(r.len() <= grain || r == (0..n), "{r:?}");
                }
            }
        }
    }

    /// A thread held up in its share leaves the rest of it to the others: the pieces after its
    /// first wait until another thread has taken one of them from the back (a timeout only
    /// keeps a broken implementation from hanging the test).
    #[test]
    fn a_held_up_thread_has_its_pieces_taken() {
        let p = Parallel::new(2);
        let n = 64;
        let mut out = vec![0u8; n];
        let slow = std::sync::OnceLock::new();
        let taken_from_slow = AtomicUsize::new(0);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        p.for_each_piece(n, 1 << 20, 4, &mut out, 1, |r, o| {
            o.fill(1);
            let me = std::thread::current().id();
            // The thread that runs piece 0 owns the first half of the pieces.
            let first_half = r.start < n / 2;
            if r.start == 0 {
                let _ = slow.set(me);
            } else if first_half && slow.get() == Some(&me) {
                while taken_from_slow.load(Ordering::SeqCst) == 0
                    && std::time::Instant::now() < deadline
                {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            } else if first_half {
                taken_from_slow.fetch_add(1, Ordering::SeqCst);
            }
        });
        assert!(out.iter().all(|&v| v == 1));
        assert!(taken_from_slow.load(Ordering::SeqCst) > 0);
    }

    #[test]
    fn map_returns_every_item_in_order() {
        for threads in [1, 2, 3] {
            let p = Parallel::new(threads);
            let got = p.map(1000, |i| (i % 7 + 1) * 1000, |i| i * i);
            assert_eq!(got, (0..1000).map(|i| i * i).collect::<Vec<_>>());
        }
    }

    #[test]
    fn runs_go_out_largest_first() {
        let p = Parallel::new(2);
        let n = 1000;
        let mut out = vec![0u8; n];
        let runs = Mutex::new(Vec::new());
        p.for_each_run(
            n,
            |_| 1 << 20,
            &mut out,
            |i| i,
            |r, _| runs.lock().unwrap().push(r),
        );
        let mut runs = runs.into_inner().unwrap();
        runs.sort_by_key(|r| r.start);
        let sizes: Vec<usize> = runs.iter().map(|r| r.len()).collect();
        // Half a thread's share of what is left, down to a sixteenth of a thread's share.
        assert_eq!(sizes[0], n / 4, "{sizes:?}");
        assert!(sizes.windows(2).all(|w| w[0] >= w[1]), "{sizes:?}");
        assert!(*sizes.last().unwrap() <= n / 32, "{sizes:?}");
        assert_eq!(sizes.iter().sum::<usize>(), n);
    }

    #[test]
    fn runs_cover_items_of_unequal_size_once() {
        for threads in [1, 2, 3, 5] {
            let p = Parallel::new(threads);
            // Item i owns i % 4 outputs and costs (i % 7) * 2^16.
            let n = 300;
            let start = |i: usize| (0..i).map(|j| j % 4).sum::<usize>();
            let mut out = vec![0usize; start(n)];
            p.for_each_run(
                n,
                |i| (i % 7) << 16,
                &mut out,
                start,
                |r, chunk| {
                    let mut k = 0;
                    for i in r {
                        for _ in 0..i % 4 {
                            chunk[k] += i + 1;
                            k += 1;
                        }
                    }
                    assert_eq!(k, chunk.len());
                },
            );
            let want: Vec<usize> = (0..n)
                .flat_map(|i| std::iter::repeat_n(i + 1, i % 4))
                .collect();
            assert_eq!(out, want);
        }
    }
}
