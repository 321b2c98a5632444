//! A growable buffer of `u16` (bf16 values) that starts on a 64-byte boundary.
//!
//! AMX loads a tile as 16 rows of 64 bytes. A row that starts inside a cache line spans two,
//! and tile loads from such rows ran about 3x slower here (a prompt's MLA attention products at
//! ~180 G multiply-adds a second a core instead of ~640), which is what a plain `Vec<u16>`
//! gives: the allocator aligns it to 16 bytes. Operands of the bf16 products live in these.

use std::ops::{Deref, DerefMut};

/// One cache line of values.
#[derive(Clone, Copy, Default)]
#[repr(C, align(64))]
struct Line([u16; 32]);

/// `len` values in whole cache lines, the first at a 64-byte boundary.
#[derive(Clone, Default)]
pub struct AlignedU16 {
    lines: Vec<Line>,
    len: usize,
}

impl AlignedU16 {
    pub fn new() -> AlignedU16 {
        AlignedU16::default()
    }

    /// `len` values: the first `min(len, self.len())` kept, the others `value`.
    pub fn resize(&mut self, len: usize, value: u16) {
        let old = self.len;
        self.lines.resize(len.div_ceil(32), Line::default());
        self.len = len;
        if len > old {
            self[old..].fill(value);
        }
    }

    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Values it holds without growing.
    pub fn capacity(&self) -> usize {
        self.lines.capacity() * 32
    }
}

impl Deref for AlignedU16 {
    type Target = [u16];

    fn deref(&self) -> &[u16] {
        // SAFETY: `Line` is 32 u16 with no padding (64 bytes, align 64), so `lines` holds
        // 32 * lines.len() >= len initialised u16 at its start, aligned for u16.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast::<u16>(), self.len) }
    }
}

impl DerefMut for AlignedU16 {
    fn deref_mut(&mut self) -> &mut [u16] {
        // SAFETY: as in `deref`, borrowed mutably through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast::<u16>(), self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_on_a_line_and_resizes_like_a_vec() {
        let mut b = AlignedU16::new();
        assert!(b.is_empty());
        b.resize(5, 7);
        assert_eq!(&b[..], &[7; 5]);
        assert_eq!(b.as_ptr() as usize % 64, 0);
        b[1] = 3;
        b.resize(70, 9);
        assert_eq!(b.len(), 70);
        assert_eq!(&b[..6], &[7, 3, 7, 7, 7, 9]);
        assert!(b[5..].iter().all(|&v| v == 9));
        assert_eq!(b.as_ptr() as usize % 64, 0);
        b.resize(2, 0);
        assert_eq!(&b[..], &[7, 3]);
        // Growing again fills the values past the old end, even within a kept line.
        b.resize(4, 1);
        assert_eq!(&b[..], &[7, 3, 1, 1]);
        b.clear();
        assert!(b.is_empty());
        assert!(b.capacity() >= 96);
    }
}
