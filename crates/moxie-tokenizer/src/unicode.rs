//! Code point classification and the GPT-2 byte <-> unicode mapping, as llama.cpp does them.
//!
//! The category table is llama.cpp's own (see `tools/gen_unicode_data.py`), so splits match
//! llama.cpp even where Rust's Unicode version would classify a code point differently.

use crate::unicode_data::{CATEGORY_RANGES, LOWER_TO_ASCII, WHITESPACE};

/// Category and whitespace flags of one code point (llama.cpp's `unicode_cpt_flags`,
/// reduced to what the pre-tokenizers look at).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Flags(u16);

impl Flags {
    pub const UNDEFINED: u16 = 0x0001;
    pub const NUMBER: u16 = 0x0002;
    pub const LETTER: u16 = 0x0004;
    pub const ACCENT_MARK: u16 = 0x0010;
    pub const PUNCTUATION: u16 = 0x0020;
    pub const SYMBOL: u16 = 0x0040;
    pub const WHITESPACE: u16 = 0x0100;

    /// Flags of a position outside the fragment (llama.cpp: all bits clear).
    pub const NONE: Flags = Flags(0);

    #[inline]
    pub fn is_number(self) -> bool {
        self.0 & Self::NUMBER != 0
    }
    #[inline]
    pub fn is_letter(self) -> bool {
        self.0 & Self::LETTER != 0
    }
    #[inline]
    pub fn is_accent_mark(self) -> bool {
        self.0 & Self::ACCENT_MARK != 0
    }
    #[inline]
    pub fn is_whitespace(self) -> bool {
        self.0 & Self::WHITESPACE != 0
    }
    /// llama.cpp's `as_uint() != 0`: any flag set (true for every code point inside the
    /// fragment, false outside it).
    #[inline]
    pub fn any(self) -> bool {
        self.0 != 0
    }
    /// The category bit alone (llama.cpp's `category_flag()`).
    #[inline]
    pub fn category(self) -> u16 {
        self.0 & 0x00FF
    }
}

/// Flags of code point `cpt` (`UNDEFINED` beyond U+10FFFF).
pub(crate) fn flags(cpt: u32) -> Flags {
    if cpt >= 0x110000 {
        return Flags(Flags::UNDEFINED);
    }
    let idx = CATEGORY_RANGES.partition_point(|&(start, _)| start <= cpt);
    // idx >= 1 because the table starts at 0.
    let cat = CATEGORY_RANGES
        .get(idx.wrapping_sub(1))
        .map(|&(_, c)| c as u16)
        .unwrap_or(Flags::UNDEFINED);
    let ws = if is_whitespace(cpt) {
        Flags::WHITESPACE
    } else {
        0
    };
    Flags(cat | ws)
}

#[inline]
fn is_whitespace(cpt: u32) -> bool {
    match cpt {
        0x09..=0x0D | 0x20 => true,
        0..=0x84 => false,
        _ => WHITESPACE.binary_search(&cpt).is_ok(),
    }
}

/// Simple lowercase mapping, exact for every result the pre-tokenizers compare against
/// (ASCII letters).
pub(crate) fn to_lower_ascii_target(cpt: u32) -> u32 {
    if (b'A' as u32..=b'Z' as u32).contains(&cpt) {
        return cpt + 32;
    }
    if cpt >= 0x80 {
        if let Some(&(_, l)) = LOWER_TO_ASCII.iter().find(|&&(c, _)| c == cpt) {
            return l;
        }
    }
    cpt
}

/// llama.cpp's `unicode_cpt_is_han`.
pub(crate) fn is_han(cpt: u32) -> bool {
    matches!(cpt,
        0x4E00..=0x9FFF
        | 0x3400..=0x4DBF
        | 0x20000..=0x2A6DF
        | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F
        | 0x2B820..=0x2CEAF
        | 0x2CEB0..=0x2EBEF
        | 0xF900..=0xFAFF
        | 0x2F800..=0x2FA1F)
}

/// The GPT-2 byte -> code point table: printable Latin-1 bytes map to themselves, the
/// other 68 bytes to U+0100.. in byte order.
pub(crate) const fn byte_to_cpt_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut n = 0u32;
    let mut b = 0usize;
    while b < 256 {
        let cpt = if is_printable_byte(b as u32) {
            b as u32
        } else {
            let c = 256 + n;
            n += 1;
            c
        };
        table[b] = match char::from_u32(cpt) {
            Some(c) => c,
            None => '\0',
        };
        b += 1;
    }
    table
}

pub(crate) static BYTE_TO_CHAR: [char; 256] = byte_to_cpt_table();

const fn is_printable_byte(b: u32) -> bool {
    (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
}

/// The bytes that map to U+0100 + k, in order.
const fn high_table() -> [u8; 68] {
    let mut t = [0u8; 68];
    let mut n = 0usize;
    let mut b = 0u32;
    while b < 256 {
        if !is_printable_byte(b) {
            t[n] = b as u8;
            n += 1;
        }
        b += 1;
    }
    t
}

static HIGH_TO_BYTE: [u8; 68] = high_table();

/// Inverse of [`BYTE_TO_CHAR`]: the byte a byte-level code point stands for.
#[inline]
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    let cpt = c as u32;
    if is_printable_byte(cpt) {
        return Some(cpt as u8);
    }
    cpt.checked_sub(256)
        .and_then(|k| HIGH_TO_BYTE.get(k as usize))
        .copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_mapping_roundtrips() {
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(BYTE_TO_CHAR[b as usize]), Some(b));
        }
        assert_eq!(BYTE_TO_CHAR[b' ' as usize], 'Ġ');
        assert_eq!(BYTE_TO_CHAR[b'\n' as usize], 'Ċ');
        assert_eq!(char_to_byte('x'), Some(b'x'));
        assert_eq!(char_to_byte('中'), None);
    }

    #[test]
    fn categories() {
        assert!(flags('a' as u32).is_letter());
        assert!(flags('7' as u32).is_number());
        assert!(flags(' ' as u32).is_whitespace());
        assert!(flags(0x3000).is_whitespace());
        assert!(flags(0xA0).is_whitespace());
        assert!(!flags(0x200B).is_whitespace());
        assert!(flags('日' as u32).is_letter());
        assert!(flags(0x301).is_accent_mark());
        assert_eq!(flags('!' as u32).category(), Flags::PUNCTUATION);
        assert_eq!(flags('$' as u32).category(), Flags::SYMBOL);
        assert!(flags(0x10FFFF).any());
        assert_eq!(to_lower_ascii_target('S' as u32), 's' as u32);
        assert_eq!(to_lower_ascii_target(0x212A), 'k' as u32);
    }
}
