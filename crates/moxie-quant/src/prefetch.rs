//! Software prefetch for one-token products. A one-token product reads each weight once, from
//! DRAM, in one sequential stream per thread; the hardware prefetchers stop at every 4 KiB page
//! and run only a little ahead, so without these hints the loads wait on memory between the
//! products (measured on an AMX Xeon: the interleaved Q4_K kernel read 6.6 GB/s from DRAM on
//! one thread, 24 GB/s from L2; docs/performance.md, session 8). Hints never change results.

/// How far ahead of the bytes being read a one-token product asks for its weights.
pub const PREFETCH_AHEAD: usize = 8192;

/// Asks for the 64-byte line at `p` into L2. The address may lie anywhere: a prefetch reads
/// nothing architecturally and never faults.
#[inline]
fn line_to_l2(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of x86-64's baseline; a prefetch never dereferences `p`.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T1 }>(p.cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Asks for every 64-byte line of `bytes` into L2.
#[inline]
pub fn prefetch_l2(bytes: &[u8]) {
    for line in bytes.chunks(64) {
        line_to_l2(line.as_ptr());
    }
}

/// Asks for as many lines as `block` has, [`PREFETCH_AHEAD`] bytes past it, into L2: for a
/// kernel walking a matrix block by block. The lines may lie past the slice, past the matrix
/// even (the next matrix a thread reads usually follows); `wrapping_add` keeps the address
/// arithmetic defined.
#[inline]
pub fn prefetch_ahead(block: &[u8]) {
    let p = block.as_ptr().wrapping_add(PREFETCH_AHEAD);
    for off in (0..block.len()).step_by(64) {
        line_to_l2(p.wrapping_add(off));
    }
}
