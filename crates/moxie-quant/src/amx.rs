//! Intel AMX (Advanced Matrix Extensions): detection, tile configuration and the tile
//! instructions, for the kernels that use them (`bf16gemm.rs`, and `gemm.rs` for Q8_0).
//!
//! AMX needs the CPU's AMX-TILE (and, for `tdpbf16ps`, AMX-BF16), the OS to enable the tile
//! state (XCR0 bits 17 and 18) and, on Linux, one `arch_prctl(ARCH_REQ_XCOMP_PERM,
//! XFEATURE_XTILEDATA)` per process before the first tile instruction (without it that
//! instruction raises SIGILL); [`bf16_available`] checks all of it once. Rust has no stable AMX
//! intrinsics, so the instructions are `asm!` with their mnemonics.
//!
//! The tile registers are not renamed and the tile unit runs its instructions in order: a
//! kernel issues all of a step's loads and products before it stores a result, and reuses a
//! tile register only a few products after it last read it.

/// Whether the AMX-BF16 kernels run here: the CPU has AMX-TILE and AMX-BF16, the OS enabled
/// the tile state and granted this process its use, and `MOXIE_QUANT_SIMD` does not lower the
/// level below its default (`amx` or unset allows them; `avx512` keeps the AVX-512 kernels,
/// for comparisons). The kernels' edges use AVX-512 (`bf16_products_fast` holds too).
pub fn bf16_available() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        crate::dispatch::requested_simd().1
            && crate::bf16gemm::bf16_products_fast()
            && hardware::bf16()
    })
}

/// Whether the AMX-INT8 kernels run here: as [`bf16_available`], with AMX-INT8 instead of
/// AMX-BF16 (`MOXIE_QUANT_SIMD=avx512` keeps the `vpdpbusd` kernels).
pub fn int8_available() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        crate::dispatch::requested_simd().1 && crate::gemm::gemm_avx512() && hardware::int8()
    })
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod hardware {
    use std::arch::x86_64::{__cpuid, __cpuid_count, _xgetbv};

    /// AMX-TILE and AMX-BF16 present, the tile state enabled and granted to this process.
    pub(super) fn bf16() -> bool {
        // CPUID.(EAX=7,ECX=0):EDX bit 22 AMX-BF16, bit 24 AMX-TILE.
        tiles_with((1 << 22) | (1 << 24))
    }

    /// AMX-TILE and AMX-INT8 present, the tile state enabled and granted to this process.
    pub(super) fn int8() -> bool {
        // CPUID.(EAX=7,ECX=0):EDX bit 25 AMX-INT8, bit 24 AMX-TILE.
        tiles_with((1 << 25) | (1 << 24))
    }

    /// The CPUID.(EAX=7,ECX=0):EDX bits `amx` set, and the tile state enabled and granted.
    fn tiles_with(amx: u32) -> bool {
        // CPUID.1:ECX bit 27 OSXSAVE.
        let (leaf7, leaf1) = (__cpuid_count(7, 0), __cpuid(1));
        if leaf7.edx & amx != amx || leaf1.ecx & (1 << 27) == 0 {
            return false;
        }
        // SAFETY: OSXSAVE (checked above) means XGETBV is enabled.
        let xcr0 = unsafe { xgetbv0() };
        if xcr0 & (3 << 17) != 3 << 17 {
            return false;
        }
        const ARCH_GET_XCOMP_PERM: libc::c_long = 0x1022;
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        let mut perm: u64 = 0;
        // SAFETY: arch_prctl with these codes reads its integer arguments and writes only the
        // u64 it is given a pointer to.
        let granted = unsafe {
            libc::syscall(
                libc::SYS_arch_prctl,
                ARCH_REQ_XCOMP_PERM,
                XFEATURE_XTILEDATA,
            ) == 0
                && libc::syscall(
                    libc::SYS_arch_prctl,
                    ARCH_GET_XCOMP_PERM,
                    &mut perm as *mut u64,
                ) == 0
        };
        granted && perm & (1 << XFEATURE_XTILEDATA) != 0
    }

    #[target_feature(enable = "xsave")]
    unsafe fn xgetbv0() -> u64 {
        _xgetbv(0)
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
mod hardware {
    pub(super) fn bf16() -> bool {
        false
    }

    pub(super) fn int8() -> bool {
        false
    }
}

/// A palette-1 tile configuration (the 64-byte operand of `ldtilecfg`).
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(C, align(64))]
pub(crate) struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

impl TileConfig {
    /// All eight tiles 16 rows of 64 bytes (16 x 16 f32 sums, 16 x 32 bf16 operands).
    pub(crate) const FULL: TileConfig = TileConfig::eight([(16, 64); 8]);

    /// Int8 products of 32-value blocks: tiles 0-3 16 x 16 i32 sums, 4-5 16 rows of 32 bytes
    /// (the A operands: 16 tokens' values of one block), 6-7 8 rows of 64 bytes (the B
    /// operands: one block of 16 weight rows, four values of each row a 4-byte word).
    pub(crate) const INT8_BLOCKS: TileConfig = TileConfig::eight([
        (16, 64),
        (16, 64),
        (16, 64),
        (16, 64),
        (16, 32),
        (16, 32),
        (8, 64),
        (8, 64),
    ]);

    /// Tiles 0-7 as (rows, bytes a row); the others unused.
    const fn eight(shapes: [(u8, u16); 8]) -> TileConfig {
        let (mut rows, mut colsb) = ([0u8; 16], [0u16; 16]);
        let mut t = 0;
        while t < 8 {
            (rows[t], colsb[t]) = shapes[t];
            t += 1;
        }
        TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb,
            rows,
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use tiles::*;

#[cfg(target_arch = "x86_64")]
mod tiles {
    use std::arch::asm;

    use super::TileConfig;

    thread_local! {
        /// The configuration this thread's tiles have (`None`: never configured here).
        static LOADED: std::cell::Cell<Option<TileConfig>> = const { std::cell::Cell::new(None) };
    }

    /// Configure this thread's tiles as `cfg` (a no-op when they already are; loading a
    /// configuration zeroes every tile).
    ///
    /// # Safety
    /// [`super::bf16_available`] returned true.
    pub(crate) unsafe fn configure(cfg: &TileConfig) {
        if LOADED.get() == Some(*cfg) {
            return;
        }
        // SAFETY: the tile state is enabled and granted (the caller's contract) and `cfg` is a
        // valid palette-1 layout (every tile within 16 rows of 64 bytes), 64-byte aligned.
        unsafe {
            asm!("ldtilecfg [{}]", in(reg) cfg as *const TileConfig, options(nostack, readonly))
        };
        LOADED.set(Some(*cfg));
    }

    /// Load tile `T` from `p`, rows `stride` bytes apart.
    ///
    /// # Safety
    /// Tiles configured ([`configure`]); every row of tile `T` readable at `p + r * stride`.
    #[inline(always)]
    pub(crate) unsafe fn load<const T: u8>(p: *const u8, stride: usize) {
        // SAFETY: the caller's contract.
        unsafe {
            asm!("tileloadd tmm{t}, [{p} + {s}*1]", t = const T, p = in(reg) p, s = in(reg) stride,
                 options(nostack, readonly))
        }
    }

    /// Store tile `T` at `p`, rows `stride` bytes apart.
    ///
    /// # Safety
    /// Tiles configured ([`configure`]); every row of tile `T` writable at `p + r * stride`.
    #[inline(always)]
    pub(crate) unsafe fn store<const T: u8>(p: *mut u8, stride: usize) {
        // SAFETY: the caller's contract.
        unsafe {
            asm!("tilestored [{p} + {s}*1], tmm{t}", t = const T, p = in(reg) p, s = in(reg) stride,
                 options(nostack))
        }
    }

    /// Zero tile `T`.
    ///
    /// # Safety
    /// Tiles configured ([`configure`]).
    #[inline(always)]
    pub(crate) unsafe fn zero<const T: u8>() {
        // SAFETY: the caller's contract.
        unsafe { asm!("tilezero tmm{t}", t = const T, options(nomem, nostack)) }
    }

    /// `C += A · B` in int8 with i32 sums (both operands signed): A's rows are 4-byte words
    /// along the sum, B's rows 16 such words (one per column of C).
    ///
    /// # Safety
    /// Tiles configured ([`configure`]) with C 16 x 64 bytes and matching A and B shapes.
    #[inline(always)]
    pub(crate) unsafe fn dp_s8<const C: u8, const A: u8, const B: u8>() {
        // SAFETY: the caller's contract.
        unsafe {
            asm!("tdpbssd tmm{c}, tmm{a}, tmm{b}", c = const C, a = const A, b = const B,
                 options(nomem, nostack))
        }
    }

    /// `C += A · B` in bf16 with f32 sums: A's rows are 32 bf16 along the sum, B's rows are
    /// 16 pairs (one per column of C) of consecutive elements along it.
    ///
    /// # Safety
    /// Tiles configured ([`configure`]) with C 16 x 64 bytes and matching A and B shapes.
    #[inline(always)]
    pub(crate) unsafe fn dp_bf16<const C: u8, const A: u8, const B: u8>() {
        // SAFETY: the caller's contract.
        unsafe {
            asm!("tdpbf16ps tmm{c}, tmm{a}, tmm{b}", c = const C, a = const A, b = const B,
                 options(nomem, nostack))
        }
    }
}
