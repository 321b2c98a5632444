//! NVIDIA GPUs through the CUDA driver API (cudarc with dynamic loading: `libcuda.so.1` is
//! opened at run time, and NVRTC by [`nvrtc`] in the CUDA major the driver runs, 12 or 13, so
//! a binary built with this feature starts, and says why, on a machine without them).
//!
//! - [`CudaGpu`]: one device (`CUDA0`, `CUDA1`, ...) with one stream that every copy, memset
//!   and launch is queued on. Device memory comes from the device's stream-ordered pool when it
//!   has one (so a free is ordered after the kernels queued before it and costs no
//!   synchronisation). Host<->device copies go through pinned staging buffers, kept and
//!   grown up to [`STAGING_CHUNK`], two per direction; bigger copies are cut into chunks that
//!   alternate between the two, so copying into one overlaps the DMA of the other. Uploads of
//!   up to [`SMALL_UPLOAD`] bytes have a ring of eight buffers of their own, so the few small
//!   uploads of a forward pass queue without waiting for the GPU. A buffer is refilled only
//!   after the event recorded behind its last copy has completed.
//! - The kernels ([`crate::kernel_source`]) are compiled by NVRTC to a cubin for the device's
//!   compute capability, once per process per (source, options), and cached on disk (see
//!   [`kernel_cache_dir`]) keyed by a hash of the source, the options and the NVRTC version.
//!   Cubins (not PTX) because a cubin from NVRTC M.x loads on any CUDA M driver, whereas PTX
//!   from a newer NVRTC than the driver is refused by the driver's JIT.
//! - [`compile`] / [`compile_ptx`] / [`compile_cubin`] need only NVRTC, no device.

use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};

use cudarc::driver::result::{self as cu, DriverError};
use cudarc::driver::sys;
use cudarc::driver::CudaContext;

use crate::{Arg, DevPtr, Error, GpuBackend, LaunchConfig, Result};

mod nvrtc;

/// Largest pinned staging buffer (per buffer; two per direction). Copies bigger than this
/// are done in chunks of this size.
pub const STAGING_CHUNK: usize = 16 << 20;

/// Smallest pinned staging buffer allocated (they grow by powers of two up to the chunk).
const STAGING_MIN: usize = 64 << 10;

/// Uploads up to this size go through their own ring of eight staging buffers of this size,
/// so a forward pass that queues a few small uploads between its kernels waits for none of
/// them (a buffer is reused only once the copy eight uploads back is done).
pub const SMALL_UPLOAD: usize = 64 << 10;

/// Number of small-upload staging buffers.
const SMALL_SLOTS: usize = 8;

/// Dynamic shared memory a kernel may use without opting in.
const DEFAULT_DYN_SHARED: u32 = 48 << 10;

/// Kernel arguments passed without a heap allocation.
const INLINE_ARGS: usize = 32;

/// The NVRTC options besides the architecture.
const NVRTC_OPTIONS: &[&str] = &["--std=c++17", "--generate-line-info"];

/// Name of the program in NVRTC's messages.
const PROGRAM_NAME: &str = "moxie_kernels.cu";

// ---------------------------------------------------------------------------------------------
// Libraries
// ---------------------------------------------------------------------------------------------

/// Whether the CUDA driver library (`libcuda.so.1`) can be loaded.
pub fn driver_available() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    *PRESENT.get_or_init(|| {
        // SAFETY: `is_culib_present` only tries `dlopen` on the candidate names and closes
        // what it opened; loading libcuda runs no code of ours. A panic (there should be none)
        // is caught.
        catch_unwind(|| unsafe { sys::is_culib_present() }).unwrap_or(false)
    })
}

/// The NVRTC library in use (path or soname) and its version, loading it if needed: one of a
/// version this machine's driver runs the output of (see [`nvrtc`]); a failure is not
/// remembered, so a test can tell the state it runs in.
pub fn nvrtc_library() -> Result<(String, (u32, u32))> {
    loaded_nvrtc().map(|n| (n.library.clone(), n.version))
}

/// The NVRTC of the driver's CUDA major ([`nvrtc::get`]); without a driver, the newest found.
fn loaded_nvrtc() -> Result<&'static nvrtc::Nvrtc> {
    let driver_major = driver_available()
        .then(|| catch_unwind(driver_version).ok()?.ok())
        .flatten()
        .map(|(major, _)| major);
    nvrtc::get(driver_major).map_err(Error::Unsupported)
}

fn no_driver(device: &str) -> Error {
    Error::Device {
        device: device.to_string(),
        msg: "no CUDA driver could be loaded (libcuda.so.1); this needs an NVIDIA GPU with its \
              driver installed (CUDA 12 or 13: driver 525 or newer), with libcuda.so.1 on the \
              loader path"
            .to_string(),
    }
}

/// `f`, with a panic turned into an error: cudarc panics where a library, or a function in
/// it, is missing. `device`: the device the error is about (None: NVRTC).
fn guarded<T>(device: Option<&str>, what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => {
            let why = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".to_string());
            let msg = format!(
                "{what}: {why} (a CUDA library without a function moxie needs: too old a driver \
                 or NVRTC?)"
            );
            Err(match device {
                Some(d) => Error::Device {
                    device: d.to_string(),
                    msg,
                },
                None => Error::Unsupported(msg),
            })
        }
    }
}

/// `CUDA_ERROR_X (text)` for a driver error.
fn describe(e: DriverError) -> String {
    let name = e
        .error_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", e.0));
    match e.error_string() {
        Ok(s) => format!("{name} ({})", s.to_string_lossy()),
        Err(_) => name,
    }
}

fn device_err(device: &str, call: &str, e: DriverError) -> Error {
    Error::Device {
        device: device.to_string(),
        msg: format!("{call}: {}", describe(e)),
    }
}

/// The driver's CUDA version as (major, minor).
fn driver_version() -> std::result::Result<(u32, u32), DriverError> {
    let mut v = 0i32;
    // SAFETY: `cuDriverGetVersion` writes one int through the pointer, which points to a live
    // local; it needs no initialisation or context.
    unsafe { sys::cuDriverGetVersion(&mut v) }.result()?;
    Ok(((v / 1000) as u32, ((v % 1000) / 10) as u32))
}

/// Number of CUDA devices. Without a loadable driver: an error saying so (never a panic).
pub fn device_count() -> Result<usize> {
    if !driver_available() {
        return Err(no_driver("CUDA"));
    }
    guarded(Some("CUDA"), "counting devices", || {
        match cu::init() {
            Ok(()) => {}
            // A driver without a device (a machine without a GPU, or none visible).
            Err(DriverError(sys::CUresult::CUDA_ERROR_NO_DEVICE)) => return Ok(0),
            Err(e) => return Err(device_err("CUDA", "cuInit", e)),
        }
        let n = cu::device::get_count().map_err(|e| device_err("CUDA", "cuDeviceGetCount", e))?;
        Ok(n.max(0) as usize)
    })
}

// ---------------------------------------------------------------------------------------------
// Compilation
// ---------------------------------------------------------------------------------------------

/// What NVRTC is asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// PTX for `compute_XY`, or NVRTC's default virtual architecture.
    Ptx(Option<(u32, u32)>),
    /// A cubin for `sm_XY`.
    Cubin((u32, u32)),
}

impl Target {
    fn options(self) -> Vec<String> {
        let mut o = Vec::new();
        match self {
            Target::Ptx(Some((ma, mi))) => o.push(format!("--gpu-architecture=compute_{ma}{mi}")),
            Target::Ptx(None) => {}
            Target::Cubin((ma, mi)) => o.push(format!("--gpu-architecture=sm_{ma}{mi}")),
        }
        o.extend(NVRTC_OPTIONS.iter().map(|s| s.to_string()));
        o
    }
}

/// A compiled program.
#[derive(Clone, Debug)]
pub struct Compiled {
    /// PTX text (without the trailing NUL) or cubin bytes.
    pub code: Vec<u8>,
    /// NVRTC's log: warnings (empty when there were none).
    pub log: String,
    /// The options it was compiled with.
    pub options: Vec<String>,
    /// NVRTC's version (major, minor).
    pub nvrtc_version: (u32, u32),
}

/// NVRTC's version (major, minor).
pub fn nvrtc_version() -> Result<(u32, u32)> {
    Ok(loaded_nvrtc()?.version)
}

/// Compile `source` with NVRTC. Errors carry NVRTC's log.
pub fn compile(source: &str, target: Target) -> Result<Compiled> {
    let nvrtc = loaded_nvrtc()?;
    let nvrtc_version = nvrtc.version;
    let options = target.options();
    let fail = |msg: String| Error::Kernel {
        kernel: PROGRAM_NAME.to_string(),
        msg: format!(
            "NVRTC {}.{} ({}): {msg}",
            nvrtc_version.0,
            nvrtc_version.1,
            options.join(" ")
        ),
    };
    let src =
        CString::new(source).map_err(|_| fail("the kernel source contains a NUL byte".into()))?;
    let name = CString::new(PROGRAM_NAME).expect("no NUL in the program name");
    let output = match target {
        Target::Ptx(_) => nvrtc::Output::Ptx,
        Target::Cubin(_) => nvrtc::Output::Cubin,
    };
    match nvrtc.compile(&src, &name, &options, output) {
        Ok((code, log)) => Ok(Compiled {
            code,
            log,
            options: options.clone(),
            nvrtc_version,
        }),
        Err((e, log)) => {
            let mut msg = format!("{e}\n{log}");
            if e.code == nvrtc::NVRTC_ERROR_INVALID_OPTION {
                msg.push_str(&format!(
                    "\n(architectures this NVRTC supports: {:?})",
                    nvrtc.supported_archs()
                ));
            }
            Err(fail(msg))
        }
    }
}

/// PTX for `compute_XY` (`None`: NVRTC's default architecture). Needs NVRTC, no device.
pub fn compile_ptx(source: &str, arch: Option<(u32, u32)>) -> Result<String> {
    let c = compile(source, Target::Ptx(arch))?;
    String::from_utf8(c.code).map_err(|_| Error::Kernel {
        kernel: PROGRAM_NAME.to_string(),
        msg: "NVRTC returned PTX that is not UTF-8".to_string(),
    })
}

/// A cubin for `sm_XY`. Needs NVRTC, no device.
pub fn compile_cubin(source: &str, arch: (u32, u32)) -> Result<Vec<u8>> {
    Ok(compile(source, Target::Cubin(arch))?.code)
}

/// The on-disk kernel cache: `$MOXIE_KERNEL_CACHE`, else `$XDG_CACHE_HOME/moxie/kernels`,
/// else `$HOME/.cache/moxie/kernels` (empty variables count as unset); `None` if none is set.
pub fn kernel_cache_dir() -> Option<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("MOXIE_KERNEL_CACHE")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("moxie").join("kernels")))
        .or_else(|| var("HOME").map(|d| d.join(".cache").join("moxie").join("kernels")))
}

/// FNV-1a, 128 bits: the cache key and the cache files' checksum (not cryptographic; it only
/// has to tell different inputs and damaged files apart).
fn fnv128(parts: &[&[u8]]) -> u128 {
    const OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
    const PRIME: u128 = 0x0000000001000000000000000000013B;
    let mut h = OFFSET;
    for p in parts {
        // Length first, so the split between parts is part of the key.
        for b in (p.len() as u64).to_le_bytes().iter().chain(p.iter()) {
            h ^= *b as u128;
            h = h.wrapping_mul(PRIME);
        }
    }
    h
}

fn cache_key(source: &str, target: Target, nvrtc: (u32, u32)) -> u128 {
    let options = target.options().join("\n");
    let version = format!("nvrtc {}.{}", nvrtc.0, nvrtc.1);
    fnv128(&[
        b"moxie kernel cache 1",
        source.as_bytes(),
        options.as_bytes(),
        version.as_bytes(),
    ])
}

const CACHE_MAGIC: &[u8; 8] = b"MXKCUBIN";
const CACHE_HEADER: usize = 8 + 8 + 16;

fn cache_file(dir: &Path, key: u128, arch: (u32, u32)) -> PathBuf {
    dir.join(format!("{key:032x}-sm_{}{}.cubin", arch.0, arch.1))
}

/// The cached cubin at `path`, if it is there and intact.
fn read_cache(path: &Path) -> Option<Vec<u8>> {
    let data = std::fs::read(path).ok()?;
    if data.len() < CACHE_HEADER || &data[..8] != CACHE_MAGIC {
        return None;
    }
    let len = u64::from_le_bytes(data[8..16].try_into().ok()?) as usize;
    let sum = u128::from_le_bytes(data[16..32].try_into().ok()?);
    let payload = &data[CACHE_HEADER..];
    (payload.len() == len && len > 0 && fnv128(&[payload]) == sum).then(|| payload.to_vec())
}

/// Store `cubin` at `path` (through a temporary file and a rename, so a reader never sees half
/// a file). Failures are ignored: the cache is an optimisation.
fn write_cache(path: &Path, cubin: &[u8]) {
    let Some(dir) = path.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let tmp = path.with_extension(format!("tmp{}.{nanos}", std::process::id()));
    let written = (|| -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(CACHE_MAGIC)?;
        f.write_all(&(cubin.len() as u64).to_le_bytes())?;
        f.write_all(&fnv128(&[cubin]).to_le_bytes())?;
        f.write_all(cubin)?;
        f.sync_all()
    })();
    if written.is_err() || std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// Where a cubin from [`cached_cubin`] came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CubinOrigin {
    /// Read from the disk cache.
    Disk,
    /// Compiled now (and, when possible, written to the disk cache).
    Compiled,
}

/// A cubin of `source` for `sm_XY`, from the disk cache in `cache_dir` when it holds an intact
/// one for the same source, options and NVRTC version, else compiled (and stored there; a
/// failed store is not an error, a damaged file is recompiled). `cache_dir: None` compiles.
/// Needs NVRTC (its version is part of the key), no device.
pub fn cached_cubin(
    source: &str,
    arch: (u32, u32),
    cache_dir: Option<&Path>,
) -> Result<(Vec<u8>, CubinOrigin)> {
    let target = Target::Cubin(arch);
    let key = cache_key(source, target, nvrtc_version()?);
    let path = cache_dir.map(|d| cache_file(d, key, arch));
    if let Some(cubin) = path.as_deref().and_then(read_cache) {
        return Ok((cubin, CubinOrigin::Disk));
    }
    let compiled = compile(source, target)?;
    if let Some(path) = &path {
        write_cache(path, &compiled.code);
    }
    Ok((compiled.code, CubinOrigin::Compiled))
}

/// The process's compiled kernels: (cache key) -> cubin, so each (source, architecture) is
/// compiled (or read from disk) once per process.
fn process_cubin(source: &str, arch: (u32, u32), fresh: bool) -> Result<Arc<Vec<u8>>> {
    static CUBINS: OnceLock<Mutex<HashMap<u128, Arc<Vec<u8>>>>> = OnceLock::new();
    let key = cache_key(source, Target::Cubin(arch), nvrtc_version()?);
    // Held while compiling, so two threads opening devices of one architecture compile once.
    let mut cubins = CUBINS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if !fresh {
        if let Some(c) = cubins.get(&key) {
            return Ok(Arc::clone(c));
        }
    }
    let dir = kernel_cache_dir();
    let cubin = if fresh {
        let c = compile(source, Target::Cubin(arch))?.code;
        if let Some(dir) = &dir {
            write_cache(&cache_file(dir, key, arch), &c);
        }
        c
    } else {
        cached_cubin(source, arch, dir.as_deref())?.0
    };
    let cubin = Arc::new(cubin);
    cubins.insert(key, Arc::clone(&cubin));
    Ok(cubin)
}

// ---------------------------------------------------------------------------------------------
// The device
// ---------------------------------------------------------------------------------------------

/// Page-locked host memory (`cuMemHostAlloc` with flags 0: cached, so CPU reads of downloads
/// are fast, unlike write-combined memory).
struct Pinned {
    ptr: *mut u8,
    cap: usize,
}

/// A staging buffer and the event recorded after the last copy that used it.
struct Slot {
    buf: Option<Pinned>,
    event: sys::CUevent,
    /// A copy using `buf` was queued and may not have completed (wait on `event`).
    pending: bool,
}

/// Staging buffers used in turn.
struct Staging {
    slots: Vec<Slot>,
    next: usize,
    /// The most one buffer holds (copies are cut into chunks of this).
    chunk: usize,
}

/// A kernel function and what is known about its parameters.
struct Kernel {
    func: sys::CUfunction,
    /// Size in bytes of each parameter, when the driver can tell (cuFuncGetParamInfo).
    params: Option<Vec<usize>>,
    /// Dynamic shared memory the function has been opted in to (read on every launch).
    max_dyn_shared: AtomicU32,
    /// Held while raising the opt-in, so it only ever grows.
    opt_in: Mutex<()>,
}

/// One NVIDIA GPU. See the module documentation.
pub struct CudaGpu {
    name: String,
    ordinal: usize,
    /// Compute capability (major, minor).
    arch: (u32, u32),
    device_name: String,
    driver: (u32, u32),
    ctx: Arc<CudaContext>,
    stream: sys::CUstream,
    module: sys::CUmodule,
    /// The stream-ordered pool allocations come from (None: plain cuMemAlloc).
    pool: Option<sys::CUmemoryPool>,
    kernels: RwLock<HashMap<String, Kernel>>,
    /// Uploads of up to [`SMALL_UPLOAD`] bytes.
    up_small: Mutex<Staging>,
    /// Bigger uploads, in chunks of up to [`STAGING_CHUNK`], double-buffered.
    up_large: Mutex<Staging>,
    /// Downloads, in chunks of up to [`STAGING_CHUNK`], double-buffered.
    down: Mutex<Staging>,
    /// Host memory page-locked by `register_host`: uploads from it skip the staging buffers.
    pinned: crate::HostRanges,
}

// SAFETY: the raw handles (stream, module, pool, functions, events, pinned pointers) are CUDA
// driver objects, which the driver API allows any thread to use once the owning context is
// current, and every method makes it current first (`bind`). The mutable state is behind a
// RwLock (kernels) or Mutexes (staging buffers and their events), so no two threads touch a
// staging buffer at once. The context itself is Send + Sync (cudarc).
unsafe impl Send for CudaGpu {}
// SAFETY: see Send.
unsafe impl Sync for CudaGpu {}

impl std::fmt::Debug for CudaGpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaGpu")
            .field("name", &self.name)
            .field("device", &self.device_name)
            .field("compute_capability", &self.arch)
            .field("driver", &self.driver)
            .field("stream_ordered_alloc", &self.pool.is_some())
            .finish()
    }
}

impl CudaGpu {
    /// Number of CUDA devices (see [`device_count`]).
    pub fn device_count() -> Result<usize> {
        device_count()
    }

    /// Device `ordinal` (`CUDA{ordinal}`) with the kernels of [`crate::kernel_source`].
    /// Opening an ordinal that is already open in this process returns the same device (one
    /// stream per device, so buffers are never shared between unordered streams).
    pub fn open(ordinal: usize) -> Result<Arc<CudaGpu>> {
        static OPEN: OnceLock<Mutex<HashMap<usize, Weak<CudaGpu>>>> = OnceLock::new();
        let mut open = OPEN
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(gpu) = open.get(&ordinal).and_then(Weak::upgrade) {
            return Ok(gpu);
        }
        let gpu = CudaGpu::open_with_source(ordinal, &crate::kernel_source())?;
        open.insert(ordinal, Arc::downgrade(&gpu));
        Ok(gpu)
    }

    /// Device `ordinal` with the kernels of `source` instead (tests: the kernel source plus
    /// kernels of their own). Always a new context user with its own stream.
    pub fn open_with_source(ordinal: usize, source: &str) -> Result<Arc<CudaGpu>> {
        let name = format!("CUDA{ordinal}");
        if !driver_available() {
            return Err(no_driver(&name));
        }
        guarded(Some(&name), "opening the device", || {
            CudaGpu::open_inner(ordinal, name.clone(), source)
        })
    }

    fn open_inner(ordinal: usize, name: String, source: &str) -> Result<Arc<CudaGpu>> {
        let err = |call: &str, e: DriverError| device_err(&name, call, e);
        cu::init().map_err(|e| err("cuInit", e))?;
        let count = cu::device::get_count().map_err(|e| err("cuDeviceGetCount", e))?;
        if ordinal >= count.max(0) as usize {
            let msg = match count {
                ..=0 => "no such device: this machine has no CUDA devices".to_string(),
                1 => "no such device: this machine has 1 CUDA device (CUDA0)".to_string(),
                n => format!(
                    "no such device: this machine has {n} CUDA devices (CUDA0..CUDA{})",
                    n - 1
                ),
            };
            return Err(Error::Device { device: name, msg });
        }
        let driver = driver_version().map_err(|e| err("cuDriverGetVersion", e))?;
        let ctx = CudaContext::new(ordinal).map_err(|e| err("retaining the primary context", e))?;
        // SAFETY: moxie never uses cudarc's CudaSlice, whose stream synchronisation is what
        // event tracking provides; everything here is ordered on the one stream.
        unsafe { ctx.disable_event_tracking() };
        let (ma, mi) = ctx
            .compute_capability()
            .map_err(|e| err("compute capability", e))?;
        let arch = (ma as u32, mi as u32);
        let device_name = ctx.name().unwrap_or_else(|_| "unknown".to_string());
        let stream = cu::stream::create(cu::stream::StreamKind::NonBlocking)
            .map_err(|e| err("cuStreamCreate", e))?;
        // From here on the handles are owned by `gpu`, whose Drop releases what exists.
        let mut gpu = CudaGpu {
            name: name.clone(),
            ordinal,
            arch,
            device_name,
            driver,
            ctx,
            stream,
            module: std::ptr::null_mut(),
            pool: None,
            kernels: RwLock::new(HashMap::new()),
            up_small: Mutex::new(Staging::new(SMALL_SLOTS, SMALL_UPLOAD)),
            up_large: Mutex::new(Staging::new(2, STAGING_CHUNK)),
            down: Mutex::new(Staging::new(2, STAGING_CHUNK)),
            pinned: Default::default(),
        };
        for staging in [&gpu.up_small, &gpu.up_large, &gpu.down] {
            let mut s = staging.lock().unwrap_or_else(|p| p.into_inner());
            for slot in &mut s.slots {
                slot.event = cu::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                    .map_err(|e| err("cuEventCreate", e))?;
            }
        }
        if gpu.ctx.has_async_alloc() {
            // The pool cuMemAllocAsync takes from (the default one unless changed).
            // SAFETY: the device handle comes from the live context; the driver writes the
            // pool handle.
            let pool = unsafe { cu::device::get_mem_pool(gpu.ctx.cu_device()) }
                .map_err(|e| err("cuDeviceGetMemPool", e))?;
            // Keep freed memory in the pool instead of giving it back at every
            // synchronisation (the default threshold, 0, would return and re-map it each
            // forward pass). `memory()` counts it as free, and an allocation that fails
            // trims the pool and retries.
            let mut threshold = u64::MAX;
            // SAFETY: a live pool of the device; the attribute takes a u64,
            // which `threshold` is.
            unsafe {
                cu::mem_pool::set_attribute(
                    pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                    (&mut threshold as *mut u64).cast(),
                )
            }
            .map_err(|e| err("cuMemPoolSetAttribute", e))?;
            gpu.pool = Some(pool);
        }
        // Compiling the kernels can fail without the device's part (no usable NVRTC): the
        // error still names the device that could not be opened.
        gpu.module = gpu.load_kernels(source).map_err(|e| match e {
            Error::Device { .. } => e,
            other => Error::Device {
                device: name.clone(),
                msg: format!("cannot load moxie's kernels: {other}"),
            },
        })?;
        Ok(Arc::new(gpu))
    }

    /// Compile (or fetch) the kernels for this device and load them.
    fn load_kernels(&self, source: &str) -> Result<sys::CUmodule> {
        let mut cubin = process_cubin(source, self.arch, false)?;
        let mut fresh = false;
        loop {
            // The cubin is an ELF image; give the driver 8-byte-aligned bytes.
            let mut image = vec![0u64; cubin.len().div_ceil(8)];
            bytemuck::cast_slice_mut::<u64, u8>(&mut image)[..cubin.len()].copy_from_slice(&cubin);
            self.bind()?;
            // SAFETY: `image` holds a complete cubin (from NVRTC, or a cache file whose
            // checksum matched) and lives until the call returns; the driver copies what it
            // needs. The context is current (bind).
            match unsafe { cu::module::load_data(image.as_ptr().cast()) } {
                Ok(module) => return Ok(module),
                Err(_) if !fresh => {
                    // A cached cubin the driver refuses: compile afresh once.
                    fresh = true;
                    cubin = process_cubin(source, self.arch, true)?;
                }
                Err(e) => {
                    let nvrtc = nvrtc_version().unwrap_or((0, 0));
                    return Err(Error::Device {
                        device: self.name.clone(),
                        msg: format!(
                            "cuModuleLoadData: {} (kernels compiled by NVRTC {}.{} for sm_{}{}; \
                             the driver supports CUDA {}.{}: NVRTC must not be of a newer major \
                             version than the driver)",
                            describe(e),
                            nvrtc.0,
                            nvrtc.1,
                            self.arch.0,
                            self.arch.1,
                            self.driver.0,
                            self.driver.1
                        ),
                    });
                }
            }
        }
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// Compute capability (major, minor), e.g. (9, 0) for an H100.
    pub fn compute_capability(&self) -> (u32, u32) {
        self.arch
    }

    /// The device's product name (e.g. `NVIDIA H100 80GB HBM3`).
    pub fn device_name(&self) -> &str {
        &self.device_name
    }

    /// The CUDA version the driver supports (major, minor).
    pub fn driver_version(&self) -> (u32, u32) {
        self.driver
    }

    /// Make the device's context current on the calling thread.
    fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| self.err("cuCtxSetCurrent", e))
    }

    fn err(&self, call: &str, e: DriverError) -> Error {
        device_err(&self.name, call, e)
    }

    /// An error from waiting on the stream: it may come from any work queued earlier.
    fn sync_err(&self, call: &str, e: DriverError) -> Error {
        Error::Device {
            device: self.name.clone(),
            msg: format!(
                "{call}: {} (errors of earlier queued work, such as a kernel launch, surface \
                 here)",
                describe(e)
            ),
        }
    }

    /// Look up kernel `name`, memoised.
    fn with_kernel<T>(&self, name: &str, f: impl FnOnce(&Kernel) -> Result<T>) -> Result<T> {
        {
            let kernels = self.kernels.read().unwrap_or_else(|p| p.into_inner());
            if let Some(k) = kernels.get(name) {
                return f(k);
            }
        }
        let kernel_err = |msg: String| Error::Kernel {
            kernel: name.to_string(),
            msg: format!("{}: {msg}", self.name),
        };
        let cname =
            CString::new(name).map_err(|_| kernel_err("name contains a NUL byte".to_string()))?;
        self.bind()?;
        // SAFETY: the module is loaded (it is unloaded only in Drop) and the context is
        // current; the driver writes the function handle.
        let func = unsafe { cu::module::get_function(self.module, cname) }.map_err(|e| {
            kernel_err(format!(
                "cuModuleGetFunction: {} (no `extern \"C\" __global__` kernel of that name in \
                 the kernel source?)",
                describe(e)
            ))
        })?;
        let kernel = Kernel {
            func,
            params: param_sizes(func),
            max_dyn_shared: AtomicU32::new(DEFAULT_DYN_SHARED),
            opt_in: Mutex::new(()),
        };
        let mut kernels = self.kernels.write().unwrap_or_else(|p| p.into_inner());
        let k = kernels.entry(name.to_string()).or_insert(kernel);
        f(k)
    }

    /// Queue a copy of `src` into device memory at `dst` through the staging buffers.
    fn upload_inner(&self, staging: &mut Staging, dst: DevPtr, src: &[u8]) -> Result<()> {
        let mut offset = 0usize;
        for chunk in src.chunks(staging.chunk) {
            let chunk_cap = staging.chunk;
            let slot = staging.take_slot();
            // The buffer's previous copy must have finished reading it before it is refilled.
            slot.wait()
                .map_err(|e| self.sync_err("cuEventSynchronize", e))?;
            let buf = slot
                .reserve(chunk.len(), chunk_cap)
                .map_err(|e| self.err("cuMemHostAlloc", e))?;
            // SAFETY: `buf` has room for `chunk.len()` bytes (reserve) and no copy is reading
            // it (waited above); pinned host memory and `chunk` do not overlap.
            unsafe { std::ptr::copy_nonoverlapping(chunk.as_ptr(), buf, chunk.len()) };
            // SAFETY: `buf` holds `chunk.len()` bytes that stay untouched until the event
            // recorded next has completed (every reuse waits on it, as does Drop); the caller
            // guarantees `dst` is device memory of this device with room for the copy.
            unsafe {
                sys::cuMemcpyHtoDAsync_v2(
                    dst.byte_add(offset).raw(),
                    buf.cast::<c_void>(),
                    chunk.len(),
                    self.stream,
                )
            }
            .result()
            .map_err(|e| self.err("cuMemcpyHtoDAsync", e))?;
            slot.pending = true;
            // SAFETY: the event and stream are live handles of the current context.
            unsafe { cu::event::record(slot.event, self.stream) }
                .map_err(|e| self.err("cuEventRecord", e))?;
            offset += chunk.len();
        }
        Ok(())
    }

    /// Copy device memory at `src` into `dst`, double-buffered: chunk i+1 is in flight while
    /// chunk i is copied out.
    fn download_inner(&self, staging: &mut Staging, src: DevPtr, dst: &mut [u8]) -> Result<()> {
        let total = dst.len();
        let n = total.div_ceil(STAGING_CHUNK);
        // Queue the copy of chunk `i` into slot `i % 2`.
        let queue = |staging: &mut Staging, i: usize| -> Result<()> {
            let start = i * STAGING_CHUNK;
            let len = (total - start).min(STAGING_CHUNK);
            let slot = &mut staging.slots[i % 2];
            slot.wait()
                .map_err(|e| self.sync_err("cuEventSynchronize", e))?;
            let buf = slot
                .reserve(len, STAGING_CHUNK)
                .map_err(|e| self.err("cuMemHostAlloc", e))?;
            // SAFETY: `buf` has room for `len` bytes and no other copy uses it (its last one
            // completed: waited above; the Mutex keeps other threads out); the caller
            // guarantees `src` is device memory of this device with `dst.len()` bytes.
            unsafe {
                sys::cuMemcpyDtoHAsync_v2(
                    buf.cast::<c_void>(),
                    src.byte_add(start).raw(),
                    len,
                    self.stream,
                )
            }
            .result()
            .map_err(|e| self.err("cuMemcpyDtoHAsync", e))?;
            slot.pending = true;
            // SAFETY: live event and stream of the current context.
            unsafe { cu::event::record(slot.event, self.stream) }
                .map_err(|e| self.err("cuEventRecord", e))
        };
        for i in 0..n.min(2) {
            queue(staging, i)?;
        }
        for i in 0..n {
            let start = i * STAGING_CHUNK;
            let len = (dst.len() - start).min(STAGING_CHUNK);
            let slot = &mut staging.slots[i % 2];
            // The event follows the copy, which follows all earlier work on the stream.
            slot.wait()
                .map_err(|e| self.sync_err("download: cuEventSynchronize", e))?;
            let buf = slot.buf.as_ref().expect("a queued slot has a buffer").ptr;
            // SAFETY: the copy into `buf` has completed (waited), `buf` holds at least `len`
            // bytes, and `dst[start..start + len]` is in bounds; they do not overlap.
            unsafe { std::ptr::copy_nonoverlapping(buf, dst[start..].as_mut_ptr(), len) };
            if i + 2 < n {
                queue(staging, i + 2)?;
            }
        }
        Ok(())
    }

    fn alloc_inner(&self, bytes: usize) -> std::result::Result<DevPtr, DriverError> {
        match self.pool {
            // SAFETY: the stream is live and of the current context; the memory is only
            // used in stream order (everything is queued on this one stream).
            Some(_) => unsafe { cu::malloc_async(self.stream, bytes) }.map(DevPtr::from_raw),
            // SAFETY: plain allocation in the current context.
            None => unsafe { cu::malloc_sync(bytes) }.map(DevPtr::from_raw),
        }
    }
}

/// Parameter sizes of `func`, if the driver can tell (cuFuncGetParamInfo, driver 12.4+).
fn param_sizes(func: sys::CUfunction) -> Option<Vec<usize>> {
    // cudarc panics on a missing symbol, so look for it first.
    // SAFETY: the driver library is loaded (a device is open); looking a symbol up runs no
    // code and the symbol is not called through this type.
    let present = unsafe {
        sys::culib()
            .get::<unsafe extern "C" fn()>(b"cuFuncGetParamInfo\0")
            .is_ok()
    };
    if !present {
        return None;
    }
    let mut sizes = Vec::new();
    loop {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: `func` is a live function handle; the driver writes two usizes through
        // pointers to live locals, or returns CUDA_ERROR_INVALID_VALUE past the last one.
        let r = unsafe { sys::cuFuncGetParamInfo(func, sizes.len(), &mut offset, &mut size) };
        match r {
            sys::CUresult::CUDA_SUCCESS => sizes.push(size),
            sys::CUresult::CUDA_ERROR_INVALID_VALUE => return Some(sizes),
            _ => return None,
        }
        if sizes.len() > 4096 {
            return None;
        }
    }
}

impl Kernel {
    /// Let the kernel use `bytes` of dynamic shared memory (past the 48 KiB it may use
    /// without asking).
    fn opt_in(&self, bytes: u32) -> std::result::Result<(), DriverError> {
        let _held = self.opt_in.lock().unwrap_or_else(|p| p.into_inner());
        if bytes <= self.max_dyn_shared.load(Ordering::Acquire) {
            return Ok(());
        }
        // SAFETY: live function of the loaded module; the caller made the context current.
        unsafe {
            cu::function::set_function_attribute(
                self.func,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )
        }?;
        self.max_dyn_shared.store(bytes, Ordering::Release);
        Ok(())
    }
}

impl Staging {
    /// `n` buffers (allocated when first used) of up to `chunk` bytes; their events are
    /// created by the caller.
    fn new(n: usize, chunk: usize) -> Staging {
        let slot = || Slot {
            buf: None,
            event: std::ptr::null_mut(),
            pending: false,
        };
        Staging {
            slots: (0..n).map(|_| slot()).collect(),
            next: 0,
            chunk,
        }
    }

    fn take_slot(&mut self) -> &mut Slot {
        let i = self.next;
        self.next = (i + 1) % self.slots.len();
        &mut self.slots[i]
    }
}

impl Slot {
    /// Wait until the last copy that used the buffer has completed.
    fn wait(&mut self) -> std::result::Result<(), DriverError> {
        if self.pending {
            // SAFETY: the event is live (created at open, destroyed in Drop) and was recorded.
            unsafe { cu::event::synchronize(self.event) }?;
            self.pending = false;
        }
        Ok(())
    }

    /// The buffer, grown to at least `len` bytes (no copy may be pending).
    fn reserve(&mut self, len: usize, max: usize) -> std::result::Result<*mut u8, DriverError> {
        debug_assert!(!self.pending && len <= max);
        if let Some(b) = &self.buf {
            if b.cap >= len {
                return Ok(b.ptr);
            }
        }
        if let Some(old) = self.buf.take() {
            // SAFETY: allocated by cuMemHostAlloc below, no copy pending (caller waited).
            let _ = unsafe { cu::free_host(old.ptr.cast()) };
        }
        let cap = len.next_power_of_two().clamp(STAGING_MIN.min(max), max);
        // SAFETY: plain page-locked allocation (flags 0: cacheable, not write-combined) in
        // the current context; the bytes are written before they are read.
        let ptr = unsafe { cu::malloc_host(cap, 0) }?.cast::<u8>();
        self.buf = Some(Pinned { ptr, cap });
        Ok(ptr)
    }
}

impl GpuBackend for CudaGpu {
    fn name(&self) -> &str {
        &self.name
    }

    fn memory(&self) -> Result<(u64, u64)> {
        self.bind()?;
        let (mut free, total) = cu::mem_get_info().map_err(|e| self.err("cuMemGetInfo", e))?;
        if let Some(pool) = self.pool {
            // Memory the pool holds but no allocation uses is free for moxie.
            let attr = |a: sys::CUmemPool_attribute| -> Result<u64> {
                let mut v = 0u64;
                // SAFETY: live pool; these attributes are u64 values written to a live local.
                unsafe { cu::mem_pool::get_attribute(pool, a, (&mut v as *mut u64).cast()) }
                    .map_err(|e| self.err("cuMemPoolGetAttribute", e))?;
                Ok(v)
            };
            let reserved = attr(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?;
            let used = attr(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?;
            free += reserved.saturating_sub(used) as usize;
        }
        Ok((total as u64, (free as u64).min(total as u64)))
    }

    fn alloc(&self, bytes: usize) -> Result<DevPtr> {
        self.bind()?;
        match self.alloc_inner(bytes) {
            Ok(p) => Ok(p),
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY && self.pool.is_some() => {
                // Give the pool's unused memory back and try once more.
                // SAFETY: live stream of the current context.
                unsafe { cu::stream::synchronize(self.stream) }
                    .map_err(|e| self.sync_err("cuStreamSynchronize", e))?;
                if let Some(pool) = self.pool {
                    // SAFETY: live pool; trimming only releases memory no allocation uses.
                    let _ = unsafe { cu::mem_pool::trim_to(pool, 0) };
                }
                self.alloc_inner(bytes).map_err(|e| {
                    let free = self
                        .memory()
                        .map(|(_, f)| format!("{f} bytes free"))
                        .unwrap_or_else(|_| "free memory unknown".to_string());
                    self.err(&format!("allocating {bytes} bytes ({free})"), e)
                })
            }
            Err(e) => Err(self.err(&format!("allocating {bytes} bytes"), e)),
        }
    }

    fn free(&self, ptr: DevPtr) {
        if self.bind().is_err() {
            return;
        }
        // Errors are dropped: free cannot report them, and the ones it could see are those
        // of earlier work, which the next synchronising call reports.
        match self.pool {
            // SAFETY: `ptr` came from `alloc` (cuMemAllocAsync on this stream) and is freed
            // once (Buffer::drop); the free is ordered after all queued work using it.
            Some(_) => {
                let _ = unsafe { cu::free_async(ptr.raw(), self.stream) };
            }
            // SAFETY: `ptr` came from `alloc` (cuMemAlloc) and is freed once. cuMemFree
            // waits for work using the memory to complete.
            None => {
                let _ = unsafe { cu::free_sync(ptr.raw()) };
            }
        }
    }

    fn upload(&self, dst: DevPtr, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        // (Small uploads are activations and routes, never pinned weights.)
        if src.len() > SMALL_UPLOAD && self.pinned.covers(src) {
            self.bind()?;
            // SAFETY: `src` lies in page-locked memory that its registration keeps allocated
            // and unchanged until unregister_host, which waits for the stream first; the
            // caller guarantees `dst` is device memory of this device with room for the copy.
            return unsafe {
                sys::cuMemcpyHtoDAsync_v2(
                    dst.raw(),
                    src.as_ptr().cast::<c_void>(),
                    src.len(),
                    self.stream,
                )
            }
            .result()
            .map_err(|e| self.err("cuMemcpyHtoDAsync", e));
        }
        let ring = if src.len() <= SMALL_UPLOAD {
            &self.up_small
        } else {
            &self.up_large
        };
        let mut staging = ring.lock().unwrap_or_else(|p| p.into_inner());
        self.bind()?;
        let r = self.upload_inner(&mut staging, dst, src);
        if r.is_err() {
            // A copy may have been queued without its event: make sure nothing reads a
            // staging buffer before it is reused.
            // SAFETY: live stream of the current context.
            let _ = unsafe { cu::stream::synchronize(self.stream) };
            staging.slots.iter_mut().for_each(|s| s.pending = false);
        }
        r
    }

    fn download(&self, src: DevPtr, dst: &mut [u8]) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        let mut staging = self.down.lock().unwrap_or_else(|p| p.into_inner());
        self.bind()?;
        let r = self.download_inner(&mut staging, src, dst);
        if r.is_err() {
            // SAFETY: live stream of the current context.
            let _ = unsafe { cu::stream::synchronize(self.stream) };
            staging.slots.iter_mut().for_each(|s| s.pending = false);
        }
        r
    }

    fn zero(&self, dst: DevPtr, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: live stream of the current context; the caller guarantees `dst` is device
        // memory of this device with `bytes` bytes.
        unsafe { cu::memset_d8_async(dst.raw(), 0, bytes, self.stream) }
            .map_err(|e| self.err("cuMemsetD8Async", e))
    }

    fn launch(&self, name: &str, cfg: LaunchConfig, args: &[Arg]) -> Result<()> {
        self.with_kernel(name, |k| {
            let kernel_err = |msg: String| Error::Kernel {
                kernel: name.to_string(),
                msg: format!("{}: {msg}", self.name),
            };
            if let Some(sizes) = &k.params {
                let same = sizes.len() == args.len()
                    && sizes.iter().zip(args).all(|(&s, a)| s == a.size());
                if !same {
                    let given: Vec<usize> = args.iter().map(Arg::size).collect();
                    return Err(kernel_err(format!(
                        "takes {} parameters of sizes {sizes:?} bytes, given {} arguments of \
                         sizes {given:?}",
                        sizes.len(),
                        args.len()
                    )));
                }
            }
            self.bind()?;
            if cfg.shared_bytes > k.max_dyn_shared.load(Ordering::Acquire) {
                k.opt_in(cfg.shared_bytes).map_err(|e| {
                    kernel_err(format!(
                        "opting in to {} bytes of dynamic shared memory: {}",
                        cfg.shared_bytes,
                        describe(e)
                    ))
                })?;
            }
            // Each argument's bytes in an 8-byte-aligned word; the driver reads each
            // parameter's size from the start of its word (the value's native bytes).
            let mut inline_words = [0u64; INLINE_ARGS];
            let mut inline_ptrs = [std::ptr::null_mut::<c_void>(); INLINE_ARGS];
            let mut heap_words;
            let mut heap_ptrs;
            let (words, ptrs): (&mut [u64], &mut [*mut c_void]) = if args.len() <= INLINE_ARGS {
                (
                    &mut inline_words[..args.len()],
                    &mut inline_ptrs[..args.len()],
                )
            } else {
                heap_words = vec![0u64; args.len()];
                heap_ptrs = vec![std::ptr::null_mut::<c_void>(); args.len()];
                (&mut heap_words[..], &mut heap_ptrs[..])
            };
            for ((w, p), a) in words.iter_mut().zip(ptrs.iter_mut()).zip(args) {
                *w = u64::from_ne_bytes(a.bytes());
                *p = (w as *mut u64).cast();
            }
            // SAFETY: `k.func` is a live function of the loaded module and the context is
            // current; `ptrs` holds one pointer per kernel parameter (count and sizes checked
            // against the function's parameter info where the driver gives it), each to 8
            // readable bytes that live until the call returns (cuLaunchKernel copies them).
            // The device pointers in the arguments are the caller's responsibility, as with
            // any kernel launch: a bad one faults on the device, reported by a later sync.
            unsafe {
                cu::launch_kernel(
                    k.func,
                    (cfg.grid[0], cfg.grid[1], cfg.grid[2]),
                    (cfg.block[0], cfg.block[1], cfg.block[2]),
                    cfg.shared_bytes,
                    self.stream,
                    ptrs,
                )
            }
            .map_err(|e| {
                kernel_err(format!(
                    "cuLaunchKernel (grid {:?}, block {:?}, {} bytes dynamic shared memory): {}",
                    cfg.grid,
                    cfg.block,
                    cfg.shared_bytes,
                    describe(e)
                ))
            })
        })
    }

    fn synchronize(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: live stream of the current context.
        unsafe { cu::stream::synchronize(self.stream) }
            .map_err(|e| self.sync_err("cuStreamSynchronize", e))
    }

    unsafe fn register_host(&self, ptr: *const u8, len: usize) -> Result<bool> {
        self.bind()?;
        // The device only reads the memory: read-only registration also takes memory the
        // process may not write (a read-only file mapping). Devices without read-only
        // registration refuse the flag: writable memory registers without it.
        let register = |flags| {
            // SAFETY: the caller keeps [ptr, ptr + len) allocated and unchanged until
            // unregister_host; the context is current (bind above).
            unsafe { sys::cuMemHostRegister_v2(ptr.cast_mut().cast::<c_void>(), len, flags) }
                .result()
        };
        register(sys::CU_MEMHOSTREGISTER_READ_ONLY)
            .or_else(|_| register(0))
            .map_err(|e| self.err("cuMemHostRegister", e))?;
        self.pinned.add(ptr, len);
        Ok(true)
    }

    fn unregister_host(&self, ptr: *const u8) {
        if !self.pinned.remove(ptr) || self.bind().is_err() {
            return;
        }
        // Copies queued from the memory finish first. Errors are dropped: unregistering cannot
        // report them, and the ones the wait sees belong to earlier work.
        // SAFETY: live stream of the current context; `ptr` was registered (above).
        unsafe {
            let _ = cu::stream::synchronize(self.stream);
            let _ = sys::cuMemHostUnregister(ptr.cast_mut().cast::<c_void>());
        }
    }

    fn tensor_cores(&self) -> bool {
        // mma.sync.m16n8k16 on int8: Ampere (8.0) and later.
        self.arch.0 >= 8
    }
}

impl Drop for CudaGpu {
    fn drop(&mut self) {
        // Errors are ignored: nothing can be done about them here. The context (an Arc
        // field) is released after this, when the fields drop.
        if self.ctx.bind_to_thread().is_err() {
            return;
        }
        // SAFETY: live stream; waits until no queued copy still reads or writes a staging
        // buffer, so they can be freed.
        let _ = unsafe { cu::stream::synchronize(self.stream) };
        for staging in [&mut self.up_small, &mut self.up_large, &mut self.down] {
            let staging = staging.get_mut().unwrap_or_else(|p| p.into_inner());
            for slot in &mut staging.slots {
                if let Some(b) = slot.buf.take() {
                    // SAFETY: allocated by cuMemHostAlloc; the stream is idle (synchronised).
                    let _ = unsafe { cu::free_host(b.ptr.cast()) };
                }
                if !slot.event.is_null() {
                    // SAFETY: created at open, destroyed only here.
                    let _ = unsafe { cu::event::destroy(slot.event) };
                }
            }
        }
        if !self.module.is_null() {
            // SAFETY: loaded at open, unloaded only here; no launch can be queued any more
            // (&mut self) and the stream is idle.
            let _ = unsafe { cu::module::unload(self.module) };
        }
        // SAFETY: created at open, destroyed only here, idle.
        let _ = unsafe { cu::stream::destroy(self.stream) };
    }
}
