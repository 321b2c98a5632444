//! moxie's inference core: hyper-parameters, architectures built from blocks, the forward pass
//! on the CPU and GPUs, per-sequence state, placement, sampling and the generation loop.

pub mod arch;
pub mod bench;
pub mod blocks;
pub mod config;
pub mod device;
mod forward;
pub mod generate;
mod gpu_pass;
pub mod inventory;
pub mod loader;
pub mod model;
pub mod mtp;
pub mod npy;
pub mod numa;
pub mod ops;
pub mod parallel;
pub mod placement;
pub mod progress;
pub mod quant_rules;
pub mod sampling;
mod scratch;
mod spin_pool;
pub mod state;
pub mod synth;
pub mod telemetry;
pub mod tensor;

pub use blocks::attention::batch_scratch_bytes;
pub use config::{Arch, Config};
pub use model::{interleave_candidate, LayoutChange, Logits, Model};
pub use parallel::{MlaPrompts, Numerics, Parallel};
pub use sampling::{Sampler, SamplerConfig};
pub use state::{KvTypes, SeqState};

/// Errors of the core crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Gguf(#[from] moxie_gguf::GgufError),
    #[error("{0}")]
    Model(String),
    /// Bad placement input: a rule, device list, split setting or size.
    #[error("{0}")]
    Placement(String),
    #[error("token id {id} is outside the vocabulary (n_vocab = {n_vocab})")]
    BadToken { id: u32, n_vocab: usize },
    #[error("context is full: {needed} positions needed, the context holds {n_ctx} (raise -c)")]
    ContextFull { n_ctx: usize, needed: usize },
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Gpu(#[from] moxie_gpu::Error),
}

pub type Result<T> = std::result::Result<T, Error>;

/// Keep freed blocks in the process instead of handing them back to the kernel. The forward
/// pass allocates and frees buffers of megabytes per layer (activations, scores, expert
/// intermediates); with glibc's defaults those are mmapped or trimmed on free, and every reuse
/// faults in fresh zeroed pages, ~5% of a 512-token prefill's time. Called once by the CLI at
/// start; other allocators and platforms are left as they are.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // glibc's ceiling for the mmap threshold (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit):
        // blocks up to it come from the heap and are reused.
        const MMAP_THRESHOLD: libc::c_int = 32 << 20;
        const TRIM_THRESHOLD: libc::c_int = 1 << 30;
        // SAFETY: mallopt only changes allocator tunables; it is called before the worker
        // threads start allocating and takes plain integers.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
            libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
        }
    }
}

/// Exit status after a bus error: what a shell reports for a process killed by SIGBUS
/// (128 + 7).
pub const BUS_ERROR_EXIT: i32 = 135;

/// Say why, when a read of a mapped model file fails. The weights moxie does not copy are read
/// from the file's mapping on demand; if the file is truncated (or rewritten in place) while
/// moxie runs, the next read of a page past its new end raises SIGBUS, whose default action
/// ends the process without a word. This installs a handler that writes what happened and what
/// avoids it (`--no-mmap`: weights read into memory, immune) to stderr, then exits with
/// [`BUS_ERROR_EXIT`]. Called once by the CLI at start.
pub fn explain_bus_errors() {
    #[cfg(unix)]
    {
        extern "C" fn on_bus_error(_: libc::c_int) {
            const MSG: &[u8] =
                b"\nmoxie: bus error (SIGBUS) reading memory, most likely a mapped model \
file that was truncated or rewritten while moxie had it open: a mapping reads the file on \
demand. Restart moxie on an intact file; --no-mmap reads the weights into memory and is \
immune to later changes of the file.\n";
            // SAFETY: write(2) and _exit(2) are async-signal-safe; MSG is a static buffer.
            unsafe {
                libc::write(2, MSG.as_ptr().cast(), MSG.len());
                libc::_exit(BUS_ERROR_EXIT);
            }
        }
        // SAFETY: sigaction with a zero-initialised struct whose handler has the signature
        // sa_handler expects (no SA_SIGINFO) and an empty mask; no memory is shared with it.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_bus_error as extern "C" fn(libc::c_int) as libc::sighandler_t;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
        }
    }
}

/// `--mlock`: keep every page of this process in RAM, those mapped now (the model file's
/// included, which this reads in) and those to come, as llama.cpp's `--mlock` keeps the
/// model's. Fails when the system refuses (typically `ulimit -l`, RLIMIT_MEMLOCK, below the
/// model's size); the error says so.
pub fn lock_memory() -> std::io::Result<()> {
    #[cfg(unix)]
    {
        // SAFETY: mlockall takes flags only and changes no memory contents.
        let r = unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE) };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
    #[cfg(not(unix))]
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "memory locking is only implemented on Unix",
    ))
}
