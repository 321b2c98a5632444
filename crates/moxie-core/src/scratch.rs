//! Large work buffers of the CPU blocks (f32 values, and the bytes of converted activations),
//! kept by each thread between calls and shared by the blocks that run one after the other.
//!
//! A prompt batch needs tens of MB of intermediates per layer (MLA's absorbed queries and
//! latent outputs, the routed experts' gate·up and down rows). Fresh vectors cost a page fault
//! and zeroing per 4 KiB in every layer; vectors kept per block add up in the peak RSS (each
//! block keeps its largest while the next one runs). One pool per thread does neither: a
//! block takes what it needs, gives each buffer back as soon as it is dead ([`Buf`] goes back
//! on drop), and the next block reuses the same memory. The pool holds at most
//! [`MAX_POOLED`] buffers of each type; the peak is about the largest set one block holds at
//! once.

use std::cell::RefCell;
use std::ops::{Deref, DerefMut};
use std::thread::LocalKey;

use moxie_quant::pool::{give_back, take_fitting};

/// Buffers a thread keeps at most per element type; a give-back beyond them frees the smallest.
const MAX_POOLED: usize = 8;

thread_local! {
    static FLOATS: RefCell<Vec<Vec<f32>>> = const { RefCell::new(Vec::new()) };
    static BYTES: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// An element type with a pool per thread: f32 work buffers, and the bytes of converted
/// activations (`QuantizedActs`). Separate pools, so that neither takes the other's buffers.
pub(crate) trait Pooled: Copy + Default + 'static {
    fn pool() -> &'static LocalKey<RefCell<Vec<Vec<Self>>>>;
}

impl Pooled for f32 {
    fn pool() -> &'static LocalKey<RefCell<Vec<Vec<f32>>>> {
        &FLOATS
    }
}

impl Pooled for u8 {
    fn pool() -> &'static LocalKey<RefCell<Vec<Vec<u8>>>> {
        &BYTES
    }
}

/// `len` f32 values from this thread's pool, back to it when dropped. The values are left
/// from earlier use (zero where the buffer grew): every caller writes all of them before
/// reading.
pub(crate) fn take(len: usize) -> Buf {
    take_from(len)
}

/// [`take`] for bytes.
pub(crate) fn take_bytes(len: usize) -> Buf<u8> {
    take_from(len)
}

fn take_from<T: Pooled>(len: usize) -> Buf<T> {
    // The smallest that holds `len`, else the largest (grown below).
    let v = T::pool()
        .try_with(|pool| take_fitting(&mut pool.borrow_mut(), len, Vec::len))
        .ok()
        .flatten()
        .unwrap_or_default();
    let mut b = Buf { v, len: 0 };
    b.resize(len);
    b
}

/// A buffer of [`take`]: derefs to its `len` values.
pub(crate) struct Buf<T: Pooled = f32> {
    v: Vec<T>,
    len: usize,
}

impl<T: Pooled> Buf<T> {
    /// `v` as a buffer that goes to the pool when dropped.
    pub(crate) fn from_vec(v: Vec<T>) -> Buf<T> {
        let len = v.len();
        Buf { v, len }
    }

    /// Expose `len` values: the same memory where it holds them (values left as they were),
    /// else grown with zeros.
    pub(crate) fn resize(&mut self, len: usize) {
        if self.v.len() < len {
            self.v.resize(len, T::default());
        }
        self.len = len;
    }
}

impl<T: Pooled> Deref for Buf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.v[..self.len]
    }
}

impl<T: Pooled> DerefMut for Buf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.v[..self.len]
    }
}

impl<T: Pooled> Drop for Buf<T> {
    fn drop(&mut self) {
        let v = std::mem::take(&mut self.v);
        if v.is_empty() {
            return;
        }
        // `try_with`: a buffer dropped while the thread's locals are torn down is just freed.
        let _ =
            T::pool().try_with(|pool| give_back(&mut pool.borrow_mut(), v, MAX_POOLED, Vec::len));
    }
}

/// Bytes this thread's pool holds now (tests).
#[cfg(test)]
fn pooled_bytes() -> usize {
    FLOATS.with_borrow(|pool| pool.iter().map(|v| v.len() * 4).sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_reused_and_sized() {
        let a = take(1000);
        assert_eq!(a.len(), 1000);
        let pa = a.as_ptr();
        drop(a);
        // A smaller take reuses the same memory, exposing only what it asked for.
        let mut b = take(10);
        assert_eq!(b.len(), 10);
        assert_eq!(b.as_ptr(), pa);
        b[9] = 1.0;
        // A second buffer at the same time is a different one.
        let c = take(10);
        assert_ne!(c.as_ptr(), pa);
        drop((b, c));
        assert_eq!(pooled_bytes(), 1010 * 4);
        // A larger take grows the largest pooled buffer instead of adding one.
        let d = take(5000);
        assert_eq!(d.len(), 5000);
        drop(d);
        assert_eq!(pooled_bytes(), (5000 + 10) * 4);
    }

    #[test]
    fn the_pool_is_bounded() {
        let bufs: Vec<Buf> = (1..=MAX_POOLED + 3).map(|i| take(i * 100)).collect();
        drop(bufs);
        // The smallest went: the largest MAX_POOLED stay.
        let kept: usize = (4..=MAX_POOLED + 3).map(|i| i * 100 * 4).sum();
        assert_eq!(pooled_bytes(), kept);
    }
}
