//! A persistent, pinned worker pool for the per-token hot path.
//!
//! A decode step runs hundreds of small parallel regions (every projection, every expert,
//! attention). Waking rayon workers through futexes costs ~8-16 us per region here; these
//! workers instead spin on an epoch counter for a while after each job, so the next job starts
//! within a few hundred nanoseconds, and fall back to `yield` and then `park` when idle so an
//! idle or oversubscribed process does not burn the machine.
//!
//! One job runs at a time. A caller that finds the pool busy (another thread using the same
//! [`crate::Parallel`], or a job that itself asks for parallelism) runs its work alone instead
//! of waiting, so nesting never deadlocks.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, TryLockError};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

/// Spin with `pause` this long after a job before yielding the core.
const SPIN_PAUSE: Duration = Duration::from_micros(50);
/// Keep polling (yielding between polls) this long before parking.
const SPIN_YIELD: Duration = Duration::from_millis(2);

type Job = &'static (dyn Fn() + Sync);

/// What a worker reads when the epoch moves: the job of epoch `epoch`, for the workers with an
/// index below `active`. A worker acts on the newest slot and remembers its epoch, so a job is
/// never run twice even when the epoch moved again before the worker looked.
struct Slot {
    epoch: u64,
    active: usize,
    job: Option<Job>,
}

struct Shared {
    /// Bumped once per job; workers run a job when it changes.
    epoch: AtomicU64,
    /// The current job, written before `epoch` is bumped.
    slot: Mutex<Slot>,
    /// Workers that finished the current job.
    done: AtomicUsize,
    /// Set when a worker's part of the current job panicked.
    panicked: AtomicBool,
    stop: AtomicBool,
    /// Per worker: parked (or about to park), so the dispatcher must unpark it.
    sleeping: Vec<AtomicBool>,
}

pub(crate) struct SpinPool {
    shared: Arc<Shared>,
    threads: Vec<Thread>,
    handles: Vec<JoinHandle<()>>,
    /// Held for the duration of a job.
    dispatch: Mutex<()>,
}

impl SpinPool {
    /// `n_workers` threads besides the caller. With `pin`, worker `i` is bound to the `i + 1`-th
    /// CPU the process may use (the caller keeps the first), when there are enough CPUs.
    pub(crate) fn new(n_workers: usize, pin: bool) -> std::io::Result<SpinPool> {
        let shared = Arc::new(Shared {
            epoch: AtomicU64::new(0),
            slot: Mutex::new(Slot {
                epoch: 0,
                active: 0,
                job: None,
            }),
            done: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            sleeping: (0..n_workers).map(|_| AtomicBool::new(false)).collect(),
        });
        let cpus = if pin { cpu_order() } else { Vec::new() };
        let pin_to = |i: usize| (cpus.len() > n_workers).then(|| cpus[i + 1]);
        let mut handles = Vec::with_capacity(n_workers);
        for i in 0..n_workers {
            let s = Arc::clone(&shared);
            let cpu = pin_to(i);
            let spawned = std::thread::Builder::new()
                .name(format!("moxie-worker-{i}"))
                .spawn(move || {
                    if let Some(cpu) = cpu {
                        pin_current_thread(cpu);
                    }
                    worker_loop(&s, i)
                });
            match spawned {
                Ok(h) => handles.push(h),
                Err(e) => {
                    let pool = SpinPool {
                        threads: handles.iter().map(|h| h.thread().clone()).collect(),
                        handles,
                        shared,
                        dispatch: Mutex::new(()),
                    };
                    drop(pool);
                    return Err(e);
                }
            }
        }
        Ok(SpinPool {
            threads: handles.iter().map(|h| h.thread().clone()).collect(),
            handles,
            shared,
            dispatch: Mutex::new(()),
        })
    }

    /// Run `job` on the calling thread and on the first `n_workers` workers, returning when all
    /// have finished. Returns `false` without running anything when the pool is busy.
    pub(crate) fn run(&self, n_workers: usize, job: &(dyn Fn() + Sync)) -> bool {
        let _busy = match self.dispatch.try_lock() {
            Ok(g) => g,
            Err(TryLockError::WouldBlock) => return false,
            // A previous job panicked while holding the lock; the pool's state is reset
            // below by every job, so it stays usable.
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
        };
        let n_workers = n_workers.min(self.threads.len());
        let s = &*self.shared;
        // SAFETY: the job's lifetime is erased so workers can hold it; `Finish` below waits,
        // even while unwinding, until every worker that was handed the job has returned from
        // it and dropped its reference, so it is never used after this function returns.
        let job: Job = unsafe { std::mem::transmute::<&(dyn Fn() + Sync), Job>(job) };
        s.done.store(0, Ordering::Relaxed);
        s.panicked.store(false, Ordering::Relaxed);
        {
            let mut slot = s.slot.lock().unwrap_or_else(|p| p.into_inner());
            slot.epoch += 1;
            slot.active = n_workers;
            slot.job = Some(job);
            s.epoch.store(slot.epoch, Ordering::SeqCst);
        }
        for (t, sleeping) in self.threads[..n_workers].iter().zip(&s.sleeping) {
            if sleeping.swap(false, Ordering::SeqCst) {
                t.unpark();
            }
        }
        let finish = Finish { s, n_workers };
        job();
        drop(finish);
        if s.panicked.load(Ordering::Acquire) {
            panic!("a moxie worker thread panicked");
        }
        true
    }
}

/// Waits for the workers of the current job (also when the caller's own part panics).
struct Finish<'a> {
    s: &'a Shared,
    n_workers: usize,
}

impl Drop for Finish<'_> {
    fn drop(&mut self) {
        let mut backoff = Backoff::new();
        while self.s.done.load(Ordering::Acquire) < self.n_workers {
            backoff.wait(None);
        }
        self.s.slot.lock().unwrap_or_else(|p| p.into_inner()).job = None;
    }
}

impl Drop for SpinPool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        {
            let mut slot = self.shared.slot.lock().unwrap_or_else(|p| p.into_inner());
            slot.epoch += 1;
            slot.active = 0;
            self.shared.epoch.store(slot.epoch, Ordering::SeqCst);
        }
        for t in &self.threads {
            t.unpark();
        }
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

fn worker_loop(s: &Shared, index: usize) {
    let mut seen = 0;
    loop {
        wait_for_new_epoch(s, index, seen);
        if s.stop.load(Ordering::Acquire) {
            return;
        }
        let (epoch, job) = {
            let slot = s.slot.lock().unwrap_or_else(|p| p.into_inner());
            (slot.epoch, slot.job.filter(|_| index < slot.active))
        };
        seen = epoch;
        if let Some(job) = job {
            if catch_unwind(AssertUnwindSafe(job)).is_err() {
                s.panicked.store(true, Ordering::Release);
            }
            s.done.fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// Spin, then yield, then park until the epoch moves past `seen`.
fn wait_for_new_epoch(s: &Shared, index: usize, seen: u64) {
    let mut backoff = Backoff::new();
    while s.epoch.load(Ordering::Acquire) == seen {
        if backoff.wait(Some(SPIN_YIELD)) {
            // Announce the sleep, then look once more: a dispatcher that bumped the epoch
            // before seeing the flag is caught here, one that sees it will unpark us.
            s.sleeping[index].store(true, Ordering::SeqCst);
            if s.epoch.load(Ordering::SeqCst) == seen && !s.stop.load(Ordering::SeqCst) {
                std::thread::park_timeout(Duration::from_millis(100));
            }
            s.sleeping[index].store(false, Ordering::SeqCst);
        }
    }
}

/// How a thread waits for another: `pause` for [`SPIN_PAUSE`], then yield the core between
/// polls. The clock is read every 64 polls only.
struct Backoff {
    start: Instant,
    polls: u32,
}

impl Backoff {
    fn new() -> Backoff {
        Backoff {
            start: Instant::now(),
            polls: 0,
        }
    }

    /// One poll's wait. Returns `true` (without waiting) once the wait has lasted
    /// `sleep_after`: time for the caller to sleep instead.
    fn wait(&mut self, sleep_after: Option<Duration>) -> bool {
        self.polls = self.polls.wrapping_add(1);
        if !self.polls.is_multiple_of(64) {
            std::hint::spin_loop();
            return false;
        }
        let idle = self.start.elapsed();
        if idle < SPIN_PAUSE {
            std::hint::spin_loop();
        } else if sleep_after.is_none_or(|d| idle < d) {
            std::thread::yield_now();
        } else {
            return true;
        }
        false
    }
}

/// The order `--numa` chose for pinning ([`set_cpu_order`]); unset: [`allowed_cpus`].
static CPU_ORDER: std::sync::Mutex<Option<Vec<usize>>> = std::sync::Mutex::new(None);

/// Pin the workers of pools made from now on to `cpus`, in this order (`crate::numa`).
pub(crate) fn set_cpu_order(cpus: Vec<usize>) {
    *CPU_ORDER.lock().unwrap_or_else(|p| p.into_inner()) = Some(cpus);
}

/// The CPUs workers are pinned to, in order: `--numa`'s choice, else the allowed CPUs.
fn cpu_order() -> Vec<usize> {
    let set = CPU_ORDER.lock().unwrap_or_else(|p| p.into_inner()).clone();
    set.unwrap_or_else(allowed_cpus)
}

/// The CPUs this process may run on, in order (empty when unknown).
pub(crate) fn allowed_cpus() -> Vec<usize> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: FFI. `set` is a plain bit set that sched_getaffinity fills; the size passed
        // is its own.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        let rc =
            unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
        if rc != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            // SAFETY: FFI helper reading a bit of a set we own, index below CPU_SETSIZE.
            .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
            .collect()
    }
    #[cfg(not(target_os = "linux"))]
    {
        Vec::new()
    }
}

/// Bind the calling thread to one CPU; failure (e.g. a restricted container) is harmless.
pub(crate) fn pin_current_thread(cpu: usize) {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: FFI on a zeroed set we own; CPU_SET bounds-checks the index, and
        // sched_setaffinity(0, ..) only affects the calling thread.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = cpu;
}
