//! [`EmuGpu`]: a GPU emulated on the CPU. Device memory is host memory (a device address is
//! the host address), copies are `memcpy`, and launches run the kernels compiled for the host
//! (`emu/emu.cpp`, built by `build.rs`) under an emulator of CUDA's execution model: blocks
//! one after another, each block's threads as fibers switching at barriers, warp shuffles
//! through per-warp slots (see `emu/emu.h`).
//!
//! Launches run on the calling thread, one at a time per device (one in-order stream), so
//! `synchronize` has nothing to wait for. Different `EmuGpu`s run launches in parallel.
//!
//! Like a real GPU, the emulator trusts the kernels: a kernel that writes outside its buffers
//! corrupts host memory. Copies, however, are checked against the live allocations.

use std::alloc::Layout;
use std::collections::BTreeMap;
use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::{Arg, DevPtr, Error, GpuBackend, LaunchConfig, Result};

/// Alignment of every allocation (what `cudaMalloc` guarantees and more).
const ALIGN: usize = 256;

/// What fresh device memory holds: all-ones bytes read as NaN floats and -1 integers, so a
/// kernel reading memory nothing wrote shows up in tests.
const FILL: u8 = 0xff;

extern "C" {
    fn mxemu_launch(
        name: *const c_char,
        grid: *const u32,
        block: *const u32,
        shared_bytes: u32,
        args: *const *const c_void,
        arg_sizes: *const usize,
        arg_kinds: *const u8,
        n_args: u32,
        err: *mut c_char,
        err_len: usize,
    ) -> i32;
    fn mxemu_switches() -> u64;
    fn mxemu_kernel_count() -> u32;
    fn mxemu_kernel_name(i: u32) -> *const c_char;
}

/// Fiber switches made by emulated launches on the calling OS thread so far.
pub fn switches() -> u64 {
    // SAFETY: reads a thread-local counter; no arguments.
    unsafe { mxemu_switches() }
}

/// The names of the kernels the emulator can launch: those of `kernels/list.h`, then its own
/// test kernels (`emutest_*`).
pub fn kernel_names() -> Vec<&'static str> {
    // SAFETY: no arguments; returns the size of a static table.
    let n = unsafe { mxemu_kernel_count() };
    (0..n)
        .map(|i| {
            // SAFETY: i < the table's size, so the result is a NUL-terminated string literal
            // from the static launch table, valid for the whole program.
            let name = unsafe { CStr::from_ptr(mxemu_kernel_name(i)) };
            name.to_str().expect("kernel names are ASCII")
        })
        .collect()
}

/// How `Arg` tells the emulator the kind of an argument (`arg_kinds` of `mxemu_launch`).
fn kind(arg: &Arg) -> u8 {
    match arg {
        Arg::Ptr(_) => 1,
        Arg::I32(_) | Arg::I64(_) => 2,
        Arg::U32(_) | Arg::U64(_) => 3,
        Arg::F32(_) => 4,
    }
}

#[derive(Debug)]
struct State {
    /// Live allocations: start address -> size in bytes (as asked for).
    allocs: BTreeMap<u64, usize>,
    /// Bytes in use, each allocation rounded up to `ALIGN`.
    used: u64,
}

/// A GPU emulated on the CPU.
#[derive(Debug)]
pub struct EmuGpu {
    name: String,
    budget: u64,
    /// Held by every operation, launches included: the device's one in-order stream.
    state: Mutex<State>,
    launches: AtomicU64,
    /// Host memory registered for direct copies, and the bytes uploaded from it.
    pinned: crate::HostRanges,
    pinned_upload_bytes: AtomicU64,
    /// Whether it reports tensor cores ([`EmuGpu::set_tensor_cores`]).
    tensor_cores: AtomicBool,
}

impl EmuGpu {
    /// A device called `name` with `memory_bytes` of memory.
    pub fn new(name: &str, memory_bytes: u64) -> Arc<EmuGpu> {
        Arc::new(EmuGpu {
            name: name.to_string(),
            budget: memory_bytes,
            state: Mutex::new(State {
                allocs: BTreeMap::new(),
                used: 0,
            }),
            launches: AtomicU64::new(0),
            pinned: Default::default(),
            pinned_upload_bytes: AtomicU64::new(0),
            tensor_cores: AtomicBool::new(false),
        })
    }

    /// Report tensor cores ([`GpuBackend::tensor_cores`]), so that prompt batches' int8
    /// products run the `mul_mat_q8_mma_*` kernels (their `mma.sync` emulated by warp
    /// shuffles). Off by default: the emulated products are slow.
    pub fn set_tensor_cores(&self, on: bool) {
        self.tensor_cores.store(on, Ordering::Relaxed);
    }

    /// Host ranges registered now ([`GpuBackend::register_host`]).
    pub fn pinned_ranges(&self) -> usize {
        self.pinned.len()
    }

    /// Bytes uploaded from registered host memory ([`GpuBackend::register_host`]).
    pub fn pinned_upload_bytes(&self) -> u64 {
        self.pinned_upload_bytes.load(Ordering::Relaxed)
    }

    /// Kernel launches completed on this device.
    pub fn launches(&self) -> u64 {
        self.launches.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves the map consistent (no operation panics
        // half-way through an update), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn error(&self, msg: String) -> Error {
        Error::Device {
            device: self.name.clone(),
            msg,
        }
    }

    /// Checks that `[addr, addr + len)` lies inside one live allocation.
    fn check_range(&self, state: &State, ptr: DevPtr, len: usize, what: &str) -> Result<()> {
        let addr = ptr.raw();
        let inside = state
            .allocs
            .range(..=addr)
            .next_back()
            .is_some_and(|(&start, &size)| {
                addr.checked_add(len as u64)
                    .is_some_and(|end| end <= start + size as u64)
            });
        if inside {
            Ok(())
        } else {
            Err(self.error(format!(
                "{what} of {len} bytes at {addr:#x} is not inside a live allocation"
            )))
        }
    }
}

fn rounded(bytes: usize) -> u64 {
    (bytes.max(1) as u64).div_ceil(ALIGN as u64) * ALIGN as u64
}

fn layout(bytes: usize) -> Layout {
    Layout::from_size_align(bytes.max(1), ALIGN).expect("allocation size overflows")
}

/// `bytes` for messages: "1536 bytes (1.5 KiB)".
fn show_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut unit = "";
    for u in UNITS {
        if v < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = u;
    }
    if unit.is_empty() {
        format!("{bytes} bytes")
    } else {
        format!("{bytes} bytes ({v:.1} {unit})")
    }
}

impl GpuBackend for EmuGpu {
    fn name(&self) -> &str {
        &self.name
    }

    fn memory(&self) -> Result<(u64, u64)> {
        let state = self.lock();
        Ok((self.budget, self.budget - state.used))
    }

    fn alloc(&self, bytes: usize) -> Result<DevPtr> {
        let mut state = self.lock();
        let need = rounded(bytes);
        let left = self.budget - state.used;
        if need > left {
            return Err(self.error(format!(
                "out of memory: allocating {} with {} left of {}",
                show_bytes(bytes as u64),
                show_bytes(left),
                show_bytes(self.budget)
            )));
        }
        let layout = layout(bytes);
        // SAFETY: the layout has a non-zero size (at least 1 byte).
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            return Err(self.error(format!(
                "host allocation of {} failed",
                show_bytes(bytes as u64)
            )));
        }
        // SAFETY: ptr is a fresh allocation of layout.size() >= bytes bytes.
        unsafe { std::ptr::write_bytes(ptr, FILL, layout.size()) };
        let addr = ptr as u64;
        state.allocs.insert(addr, bytes);
        state.used += need;
        Ok(DevPtr::from_raw(addr))
    }

    fn free(&self, ptr: DevPtr) {
        let mut state = self.lock();
        let Some(bytes) = state.allocs.remove(&ptr.raw()) else {
            panic!(
                "{}: free of {ptr:#x}, which is not a live allocation",
                self.name
            );
        };
        state.used -= rounded(bytes);
        // SAFETY: ptr came from std::alloc::alloc with layout(bytes) (alloc above) and was
        // live until removed from the map just now.
        unsafe { std::alloc::dealloc(ptr.raw() as *mut u8, layout(bytes)) };
    }

    fn upload(&self, dst: DevPtr, src: &[u8]) -> Result<()> {
        let state = self.lock();
        self.check_range(&state, dst, src.len(), "upload")?;
        if self.pinned.covers(src) {
            self.pinned_upload_bytes
                .fetch_add(src.len() as u64, Ordering::Relaxed);
        }
        // SAFETY: [dst, dst + len) lies inside a live allocation (checked, and it stays live
        // while the lock is held); `copy` allows src to overlap it.
        unsafe { std::ptr::copy(src.as_ptr(), dst.raw() as *mut u8, src.len()) };
        Ok(())
    }

    fn download(&self, src: DevPtr, dst: &mut [u8]) -> Result<()> {
        let state = self.lock();
        self.check_range(&state, src, dst.len(), "download")?;
        // SAFETY: [src, src + len) lies inside a live allocation (checked, and it stays live
        // while the lock is held); `copy` allows dst to overlap it.
        unsafe { std::ptr::copy(src.raw() as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    fn zero(&self, dst: DevPtr, bytes: usize) -> Result<()> {
        let state = self.lock();
        self.check_range(&state, dst, bytes, "zero")?;
        // SAFETY: [dst, dst + bytes) lies inside a live allocation (checked, and it stays live
        // while the lock is held).
        unsafe { std::ptr::write_bytes(dst.raw() as *mut u8, 0, bytes) };
        Ok(())
    }

    fn launch(&self, name: &str, cfg: LaunchConfig, args: &[Arg]) -> Result<()> {
        let kernel_error = |msg: String| Error::Kernel {
            kernel: name.to_string(),
            msg,
        };
        let c_name = CString::new(name).map_err(|_| kernel_error("name contains NUL".into()))?;
        let bytes: Vec<[u8; 8]> = args.iter().map(Arg::bytes).collect();
        let ptrs: Vec<*const c_void> = bytes.iter().map(|b| b.as_ptr().cast()).collect();
        let sizes: Vec<usize> = args.iter().map(Arg::size).collect();
        let kinds: Vec<u8> = args.iter().map(kind).collect();
        let n_args =
            u32::try_from(args.len()).map_err(|_| kernel_error("too many arguments".into()))?;
        let mut err = vec![0u8; 4096];

        // Kernels run with the device's memory locked: no copy, allocation or free can touch
        // it meanwhile, as on a stream.
        let _state = self.lock();
        // SAFETY: every pointer is valid for the call: c_name is NUL-terminated, grid and block
        // hold 3 u32 each, ptrs/sizes/kinds hold n_args entries and each ptrs[i] points at 8
        // readable bytes (at least sizes[i]), err is writable for err.len() bytes. The kernel
        // itself reads and writes the device addresses it is given, which like on a GPU must
        // lie inside live allocations of this device: that is the caller's contract, as for
        // any GPU launch.
        let rc = unsafe {
            mxemu_launch(
                c_name.as_ptr(),
                cfg.grid.as_ptr(),
                cfg.block.as_ptr(),
                cfg.shared_bytes,
                ptrs.as_ptr(),
                sizes.as_ptr(),
                kinds.as_ptr(),
                n_args,
                err.as_mut_ptr().cast(),
                err.len(),
            )
        };
        if rc != 0 {
            let msg = CStr::from_bytes_until_nul(&err)
                .map(|m| m.to_string_lossy().into_owned())
                .unwrap_or_else(|_| "launch failed".to_string());
            return Err(kernel_error(msg));
        }
        self.launches.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    unsafe fn register_host(&self, ptr: *const u8, len: usize) -> Result<bool> {
        // Copies here are synchronous: registering changes only the count.
        self.pinned.add(ptr, len);
        Ok(true)
    }

    fn unregister_host(&self, ptr: *const u8) {
        self.pinned.remove(ptr);
    }

    fn tensor_cores(&self) -> bool {
        self.tensor_cores.load(Ordering::Relaxed)
    }
}

impl Drop for EmuGpu {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        for (&ptr, &bytes) in &state.allocs {
            // SAFETY: each live allocation came from std::alloc::alloc with layout(bytes) and
            // is freed once: the map is dropped with the device.
            unsafe { std::alloc::dealloc(ptr as *mut u8, layout(bytes)) };
        }
    }
}
