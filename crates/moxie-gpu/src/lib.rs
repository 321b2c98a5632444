//! GPU execution for moxie: the kernels (CUDA C in `kernels/`, compiled at run time by NVRTC)
//! and the backends that run them.
//!
//! - [`emu::EmuGpu`]: the same kernel source compiled for the host and run by a CPU emulator
//!   of CUDA's execution model (blocks of threads as fibers, `__syncthreads`, warp shuffles,
//!   shared memory). Always built; the tests use it to check every kernel, and a whole model
//!   placed on an emulated GPU, against the CPU backend on machines without a GPU.
//! - `cuda::CudaGpu` (feature `cuda`): an NVIDIA GPU through cudarc with dynamic loading, so
//!   the binary starts (and says why) on a machine without a driver.
//!
//! Both implement [`GpuBackend`]: device memory, host<->device copies, and kernel launches by
//! name with an argument list. [`Gpu`] wraps a backend with typed launches of the kernels.

use std::sync::Arc;

pub mod emu;
mod matmul;
pub mod ops;

#[cfg(feature = "cuda")]
pub mod cuda;

pub use matmul::Weight;
pub use ops::{Gpu, ATTENTION_HEADS_ENV, INT8_ACTIVATIONS_ENV, TENSOR_CORES_ENV};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{device}: {msg}")]
    Device { device: String, msg: String },
    #[error("kernel {kernel}: {msg}")]
    Kernel { kernel: String, msg: String },
    #[error("{0}")]
    Unsupported(String),
}

pub type Result<T> = std::result::Result<T, Error>;

/// A device address: what a kernel's pointer argument holds. Offsets are taken in values of a
/// type ([`DevPtr::offset`]) or in bytes ([`DevPtr::byte_add`]), never by adding bare numbers, so
/// an element count cannot pass for a byte count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DevPtr(u64);

impl DevPtr {
    /// No memory: an optional pointer argument left out.
    pub const NULL: DevPtr = DevPtr(0);

    /// The address a backend allocated.
    pub fn from_raw(addr: u64) -> DevPtr {
        DevPtr(addr)
    }

    /// The address as a backend passes it on.
    pub fn raw(self) -> u64 {
        self.0
    }

    /// The address `n` values of `T` further on.
    pub fn offset<T>(self, n: usize) -> DevPtr {
        self.byte_add(n * std::mem::size_of::<T>())
    }

    /// The address `n` bytes further on.
    pub fn byte_add(self, n: usize) -> DevPtr {
        DevPtr(self.0 + n as u64)
    }
}

impl std::fmt::LowerHex for DevPtr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::LowerHex::fmt(&self.0, f)
    }
}

/// One kernel argument, passed by value; it must have the exact type of the kernel's
/// parameter in that position (pointers are 64-bit device addresses).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arg {
    Ptr(DevPtr),
    I32(i32),
    U32(u32),
    I64(i64),
    U64(u64),
    F32(f32),
}

impl Arg {
    /// The argument's bytes, as the kernel reads its parameter.
    pub fn bytes(&self) -> [u8; 8] {
        let mut b = [0u8; 8];
        match *self {
            Arg::Ptr(p) => b.copy_from_slice(&p.raw().to_ne_bytes()),
            Arg::U64(v) => b.copy_from_slice(&v.to_ne_bytes()),
            Arg::I64(v) => b.copy_from_slice(&v.to_ne_bytes()),
            Arg::I32(v) => b[..4].copy_from_slice(&v.to_ne_bytes()),
            Arg::U32(v) => b[..4].copy_from_slice(&v.to_ne_bytes()),
            Arg::F32(v) => b[..4].copy_from_slice(&v.to_ne_bytes()),
        }
        b
    }

    /// Size of the parameter in bytes.
    pub fn size(&self) -> usize {
        match self {
            Arg::Ptr(_) | Arg::I64(_) | Arg::U64(_) => 8,
            Arg::I32(_) | Arg::U32(_) | Arg::F32(_) => 4,
        }
    }
}

/// Grid and block shape of a launch, and its dynamic shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_bytes: u32,
}

impl LaunchConfig {
    /// `grid` blocks of `block` threads along x.
    pub fn linear(grid: u32, block: u32) -> LaunchConfig {
        LaunchConfig {
            grid: [grid, 1, 1],
            block: [block, 1, 1],
            shared_bytes: 0,
        }
    }
}

/// What a GPU does for moxie. Launches are queued in order on one stream; copies to the host
/// wait for everything queued before them, so results are read after the kernels that made
/// them. Implementations are shared between threads.
pub trait GpuBackend: Send + Sync + std::fmt::Debug {
    /// The device's name in placement rules and messages (`CUDA0`, ...).
    fn name(&self) -> &str;
    /// Total and free device memory in bytes.
    fn memory(&self) -> Result<(u64, u64)>;
    /// `bytes` of device memory (contents undefined).
    fn alloc(&self, bytes: usize) -> Result<DevPtr>;
    /// Give back memory from [`GpuBackend::alloc`].
    fn free(&self, ptr: DevPtr);
    /// Copy `src` to device memory at `dst` (queued after earlier work; `src` may be reused
    /// when this returns).
    fn upload(&self, dst: DevPtr, src: &[u8]) -> Result<()>;
    /// Copy device memory at `src` into `dst`, after all queued work.
    fn download(&self, src: DevPtr, dst: &mut [u8]) -> Result<()>;
    /// Set `bytes` of device memory at `dst` to zero.
    fn zero(&self, dst: DevPtr, bytes: usize) -> Result<()>;
    /// Queue kernel `name` with `args`.
    fn launch(&self, name: &str, cfg: LaunchConfig, args: &[Arg]) -> Result<()>;
    /// Wait for all queued work.
    fn synchronize(&self) -> Result<()>;
    /// Page-lock the `len` bytes of host memory at `ptr` so that uploads from inside them copy
    /// straight from them instead of through staging buffers (CUDA: `cuMemHostRegister`).
    /// `Ok(false)` where the backend has no such copies (the default).
    ///
    /// # Safety
    /// The memory must stay allocated and unchanged until [`GpuBackend::unregister_host`]
    /// with the same `ptr` has returned: copies from it may run after `upload` returns.
    unsafe fn register_host(&self, ptr: *const u8, len: usize) -> Result<bool> {
        let _ = (ptr, len);
        Ok(false)
    }
    /// Undo [`GpuBackend::register_host`] of `ptr`, once the copies queued from it are done.
    fn unregister_host(&self, ptr: *const u8) {
        let _ = ptr;
    }
    /// Whether the int8 products of prompt batches take the tensor-core kernels
    /// (`mul_mat_q8_mma_*`, `mul_mat_id_grouped_q8_mma_*`: `mma.sync` on int8, CUDA compute
    /// capability 8.0 and later).
    fn tensor_cores(&self) -> bool {
        false
    }
}

/// Host memory registered with a backend ([`GpuBackend::register_host`]) while this lives.
#[derive(Debug)]
pub struct HostPin {
    backend: Arc<dyn GpuBackend>,
    ptr: *const u8,
}

// SAFETY: `ptr` is only handed back to the backend (which is Send + Sync) to unregister it.
unsafe impl Send for HostPin {}
// SAFETY: as above; `&HostPin` gives no access to the memory.
unsafe impl Sync for HostPin {}

impl HostPin {
    /// `bytes` registered with `backend`, or `None` where it does not register memory.
    ///
    /// # Safety
    /// `bytes` must stay allocated and unchanged while the pin lives.
    pub unsafe fn new(backend: &Arc<dyn GpuBackend>, bytes: &[u8]) -> Result<Option<HostPin>> {
        // SAFETY: the caller keeps `bytes` as the backend needs until the pin drops.
        if bytes.is_empty() || !unsafe { backend.register_host(bytes.as_ptr(), bytes.len()) }? {
            return Ok(None);
        }
        Ok(Some(HostPin {
            backend: Arc::clone(backend),
            ptr: bytes.as_ptr(),
        }))
    }
}

impl HostPin {
    /// The start of the pinned memory.
    pub fn ptr(&self) -> *const u8 {
        self.ptr
    }
}

impl Drop for HostPin {
    fn drop(&mut self) {
        self.backend.unregister_host(self.ptr);
    }
}

/// Host ranges registered for direct copies, as backends keep them.
#[derive(Debug, Default)]
pub(crate) struct HostRanges(std::sync::Mutex<Vec<(usize, usize)>>);

impl HostRanges {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(usize, usize)>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn add(&self, ptr: *const u8, len: usize) {
        self.lock().push((ptr as usize, len));
    }

    /// Forget the range starting at `ptr`; whether there was one.
    pub(crate) fn remove(&self, ptr: *const u8) -> bool {
        let mut r = self.lock();
        let before = r.len();
        r.retain(|&(p, _)| p != ptr as usize);
        r.len() != before
    }

    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether `src` lies inside one registered range.
    pub(crate) fn covers(&self, src: &[u8]) -> bool {
        let (a, n) = (src.as_ptr() as usize, src.len());
        self.lock()
            .iter()
            .any(|&(p, len)| a >= p && a + n <= p + len)
    }
}

/// Device memory, freed when dropped.
#[derive(Debug)]
pub struct Buffer {
    ptr: DevPtr,
    bytes: usize,
    backend: Arc<dyn GpuBackend>,
}

impl Buffer {
    pub fn new(backend: &Arc<dyn GpuBackend>, bytes: usize) -> Result<Buffer> {
        // A zero-byte allocation still gets an address, so kernels never see a null pointer.
        let ptr = backend.alloc(bytes.max(4))?;
        Ok(Buffer {
            ptr,
            bytes,
            backend: Arc::clone(backend),
        })
    }

    /// A buffer holding a copy of `data`.
    pub fn from_bytes(backend: &Arc<dyn GpuBackend>, data: &[u8]) -> Result<Buffer> {
        let b = Buffer::new(backend, data.len())?;
        backend.upload(b.ptr, data)?;
        Ok(b)
    }

    pub fn from_f32(backend: &Arc<dyn GpuBackend>, data: &[f32]) -> Result<Buffer> {
        Buffer::from_bytes(backend, f32_bytes(data))
    }

    pub fn ptr(&self) -> DevPtr {
        self.ptr
    }

    /// The address `offset` bytes in.
    pub fn at(&self, offset: usize) -> DevPtr {
        debug_assert!(offset <= self.bytes);
        self.ptr.byte_add(offset)
    }

    pub fn len(&self) -> usize {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    pub fn backend(&self) -> &Arc<dyn GpuBackend> {
        &self.backend
    }

    /// Copy `src` in at byte `offset`.
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.check(offset, src.len())?;
        self.backend.upload(self.at(offset), src)
    }

    pub fn write_f32(&self, offset_elems: usize, src: &[f32]) -> Result<()> {
        self.write(offset_elems * 4, f32_bytes(src))
    }

    /// Copy out `dst.len()` bytes from byte `offset`.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check(offset, dst.len())?;
        self.backend.download(self.at(offset), dst)
    }

    pub fn read_f32(&self, offset_elems: usize, dst: &mut [f32]) -> Result<()> {
        let raw: &mut [u8] = bytemuck::cast_slice_mut(dst);
        self.check(offset_elems * 4, raw.len())?;
        self.backend.download(self.at(offset_elems * 4), raw)
    }

    fn check(&self, offset: usize, len: usize) -> Result<()> {
        if offset.checked_add(len).is_none_or(|end| end > self.bytes) {
            return Err(Error::Device {
                device: self.backend.name().to_string(),
                msg: format!(
                    "copy of {len} bytes at offset {offset} outside a buffer of {} bytes",
                    self.bytes
                ),
            });
        }
        Ok(())
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        self.backend.free(self.ptr);
    }
}

/// `data` as bytes (native endianness, what the device reads).
pub fn f32_bytes(data: &[f32]) -> &[u8] {
    bytemuck::cast_slice(data)
}

/// The kernel source NVRTC compiles: the kernel files in the order the emulator includes
/// them (see `emu/emu.cpp`).
pub fn kernel_source() -> String {
    [
        include_str!("../kernels/common.cuh"),
        include_str!("../kernels/iq_grids.cuh"),
        include_str!("../kernels/iqk_values.cuh"),
        include_str!("../kernels/quant.cuh"),
        include_str!("../kernels/matmul.cu"),
        include_str!("../kernels/matmul_q8.cu"),
        include_str!("../kernels/ops.cu"),
    ]
    .iter()
    .map(|s| s.replace("#pragma once", ""))
    .collect::<Vec<_>>()
    .join("\n")
}

#[cfg(test)]
mod tests {
    use super::DevPtr;

    #[test]
    fn offsets_are_in_values_of_a_type_or_in_bytes() {
        let p = DevPtr::from_raw(0x1000);
        assert_eq!(p.offset::<f32>(3).raw(), 0x100c);
        assert_eq!(p.offset::<u16>(3).raw(), 0x1006);
        assert_eq!(p.byte_add(3).raw(), 0x1003);
        assert_eq!(format!("{p:#x}"), "0x1000");
        assert_eq!(DevPtr::NULL.raw(), 0);
    }
}
