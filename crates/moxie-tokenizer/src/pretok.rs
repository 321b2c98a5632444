//! Pre-tokenization: splitting a text fragment into words before BPE, as llama.cpp's
//! `unicode_regex_split` does.
//!
//! llama.cpp applies a list of regular expressions in order; each one splits every current
//! piece further (the unmatched gaps stay pieces of their own). For some expressions it uses
//! hand-written splitters instead of a regex engine (GPT-2, LLaMA-3/GLM-4, Qwen2, Qwen3.5,
//! Kimi-K2, newline runs); those are ported here line by line, quirks included. Every other
//! expression runs through llama.cpp's "collapsed" scheme: if the expression uses a Unicode
//! category (`\p{L}`, `\p{N}`, `\p{P}`, `\p{S}`, `\p{M}`, `\p{Lu}`...), each non-ASCII code
//! point of the text is replaced by one byte naming its category (0xD1 number, 0xD2 letter,
//! 0xD3 punctuation, 0xD4 mark, 0xD5 symbol, 0xD0 other, 0x0B whitespace) and the expression
//! is rewritten to match those bytes; it then runs as an ASCII byte regex, exactly like
//! llama.cpp's `std::regex`. Expressions without categories run on the code points, with
//! non-ASCII whitespace replaced by 0x0B (llama.cpp's `std::wregex` path).

use crate::unicode::{self, Flags};
use fancy_regex::{BytesMode, Regex, RegexBuilder};

/// Position outside the current fragment (llama.cpp's `OUT_OF_RANGE`).
const OOR: u32 = 0xFFFF_FFFF;

const GPT2_RE: &str =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
const LLAMA3_RE_ORIG: &str = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const LLAMA3_RE: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const QWEN2_RE: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const QWEN35_RE: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const KIMI_K2_RE: &str = "\\p{Han}+";
const NEWLINES_RE: &str = "[^\\n]+|[\\n]+";

/// Unicode categories llama.cpp collapses (all `\p{L?}` variants count as letters).
const UCAT: &[(&str, u8)] = &[
    ("\\p{N}", CAT_NUMBER),
    ("\\p{L}", CAT_LETTER),
    ("\\p{P}", CAT_PUNCT),
    ("\\p{M}", CAT_MARK),
    ("\\p{S}", CAT_SYMBOL),
    ("\\p{Lu}", CAT_LETTER),
    ("\\p{Ll}", CAT_LETTER),
    ("\\p{Lt}", CAT_LETTER),
    ("\\p{Lm}", CAT_LETTER),
    ("\\p{Lo}", CAT_LETTER),
];
const CAT_NUMBER: u8 = 0xD1;
const CAT_LETTER: u8 = 0xD2;
const CAT_PUNCT: u8 = 0xD3;
const CAT_MARK: u8 = 0xD4;
const CAT_SYMBOL: u8 = 0xD5;
const CAT_OTHER: u8 = 0xD0;

#[derive(Debug)]
enum Splitter {
    Gpt2,
    Llama3,
    Qwen2,
    Qwen35,
    KimiK2,
    Newlines,
    /// Runs on the collapsed byte text.
    Collapsed(Regex),
    /// Runs on the code points (non-ASCII whitespace -> U+000B).
    Wide(Regex),
}

/// A compiled list of pre-tokenizer expressions.
#[derive(Debug)]
pub(crate) struct PreTokenizer {
    splitters: Vec<Splitter>,
}

/// Per-call view of the text: code points, their flags and byte offsets.
struct Text<'a> {
    text: &'a str,
    cpts: Vec<u32>,
    flags: Vec<Flags>,
    /// byte offset of each code point, plus `text.len()` at the end
    byte_pos: Vec<usize>,
}

impl PreTokenizer {
    /// Compiles llama.cpp regex expressions. Errors name the expression that failed.
    pub fn new(exprs: &[&str]) -> Result<Self, String> {
        let mut splitters = Vec::with_capacity(exprs.len());
        for &expr in exprs {
            let s = match expr {
                GPT2_RE => Splitter::Gpt2,
                LLAMA3_RE | LLAMA3_RE_ORIG => Splitter::Llama3,
                QWEN2_RE => Splitter::Qwen2,
                QWEN35_RE => Splitter::Qwen35,
                KIMI_K2_RE => Splitter::KimiK2,
                NEWLINES_RE => Splitter::Newlines,
                _ => compile(expr)?,
            };
            splitters.push(s);
        }
        Ok(Self { splitters })
    }

    /// Splits `text` into words; returns their byte ranges in order (they tile the text).
    pub fn split(&self, text: &str) -> Vec<(usize, usize)> {
        let n = text.chars().count();
        let mut t = Text {
            text,
            cpts: Vec::with_capacity(n),
            flags: Vec::with_capacity(n),
            byte_pos: Vec::with_capacity(n + 1),
        };
        for (i, c) in text.char_indices() {
            t.cpts.push(c as u32);
            t.flags.push(unicode::flags(c as u32));
            t.byte_pos.push(i);
        }
        t.byte_pos.push(text.len());

        let mut collapsed: Option<Vec<u8>> = None;
        let mut wide: Option<(String, Vec<usize>)> = None;
        let mut offsets = vec![n];
        for s in &self.splitters {
            let new = match s {
                Splitter::Gpt2 => split_gpt2(&t, &offsets),
                Splitter::Llama3 => split_llama3(&t, &offsets, true, false),
                Splitter::Qwen2 => split_llama3(&t, &offsets, false, false),
                Splitter::Qwen35 => split_llama3(&t, &offsets, false, true),
                Splitter::KimiK2 => split_kimi_k2(&t, &offsets),
                Splitter::Newlines => split_newlines(&t, &offsets),
                Splitter::Collapsed(re) => {
                    let c = collapsed.get_or_insert_with(|| collapse(&t));
                    split_regex_bytes(re, c, &offsets)
                }
                Splitter::Wide(re) => {
                    let (w, pos) = wide.get_or_insert_with(|| widen(&t));
                    split_regex_wide(re, w, pos, &offsets)
                }
            };
            // llama.cpp keeps the previous offsets when a custom splitter yields nothing
            // (only possible for empty text).
            if !new.is_empty() {
                offsets = new;
            }
        }

        let mut out = Vec::with_capacity(offsets.len());
        let mut start = 0usize;
        for len in offsets {
            let end = (start + len).min(n);
            if end > start {
                out.push((t.byte_pos[start], t.byte_pos[end]));
            }
            start = end;
        }
        let _ = t.text;
        out
    }
}

fn uses_categories(expr: &str) -> bool {
    UCAT.iter().any(|(pat, _)| expr.contains(pat))
}

fn compile(expr: &str) -> Result<Splitter, String> {
    if uses_categories(expr) {
        if !expr.is_ascii() {
            return Err(format!(
                "regex includes both unicode categories and non-ASCII characters: {expr:?}"
            ));
        }
        let pattern = collapse_regex(expr);
        let re = RegexBuilder::new(&pattern)
            .bytes_mode(BytesMode::Ascii)
            .backtrack_limit(100_000_000)
            .build()
            .map_err(|e| format!("cannot compile pre-tokenizer regex {expr:?}: {e}"))?;
        Ok(Splitter::Collapsed(re))
    } else {
        let pattern = ascii_perl_classes(expr);
        let re = RegexBuilder::new(&pattern)
            .backtrack_limit(100_000_000)
            .build()
            .map_err(|e| format!("cannot compile pre-tokenizer regex {expr:?}: {e}"))?;
        Ok(Splitter::Wide(re))
    }
}

/// ASCII members of a collapsed category as `\xHH` class items.
fn ascii_members(cat: u8) -> String {
    let want = match cat {
        CAT_NUMBER => Flags::NUMBER,
        CAT_LETTER => Flags::LETTER,
        CAT_PUNCT => Flags::PUNCTUATION,
        CAT_MARK => Flags::ACCENT_MARK,
        _ => Flags::SYMBOL,
    };
    let mut s = String::new();
    for b in 0u32..128 {
        if unicode::flags(b).category() == want {
            s.push_str(&format!("\\x{b:02X}"));
        }
    }
    s
}

/// llama.cpp's regex rewrite for the collapsed text: each `\p{..}` becomes a class of its
/// marker byte plus the ASCII members of the category.
fn collapse_regex(expr: &str) -> String {
    let b = expr.as_bytes();
    let mut out = String::with_capacity(expr.len() * 2);
    let mut inside = false;
    let mut i = 0usize;
    while i < b.len() {
        let c = b[i];
        if c == b'[' && (i == 0 || b[i - 1] != b'\\') {
            out.push('[');
            inside = true;
            i += 1;
            continue;
        }
        if inside && c == b']' && i > 0 && b[i - 1] != b'\\' {
            out.push(']');
            inside = false;
            i += 1;
            continue;
        }
        if c == b'\\' && i + 3 < b.len() && b[i + 1] == b'p' && b[i + 2] == b'{' {
            if let Some(rel) = expr[i + 3..].find('}') {
                let close = i + 3 + rel;
                if close <= i + 10 {
                    let pat = &expr[i..=close];
                    if let Some(&(_, cat)) = UCAT.iter().find(|(p, _)| *p == pat) {
                        if !inside {
                            out.push('[');
                        }
                        out.push_str(&format!("\\x{cat:02X}"));
                        out.push_str(&ascii_members(cat));
                        if !inside {
                            out.push(']');
                        }
                        i = close + 1;
                        continue;
                    }
                }
            }
        }
        out.push(c as char);
        i += 1;
    }
    out
}

/// For the code point path: ECMAScript's `\d` and `\w` are ASCII-only, Rust's are not.
fn ascii_perl_classes(expr: &str) -> String {
    let mut out = String::with_capacity(expr.len());
    let mut inside = false;
    let mut chars = expr.chars().peekable();
    let mut prev_backslash = false;
    while let Some(c) = chars.next() {
        if c == '\\' {
            let Some(&n) = chars.peek() else {
                out.push(c);
                break;
            };
            let rep = match (n, inside) {
                ('d', false) => Some("[0-9]"),
                ('D', false) => Some("[^0-9]"),
                ('w', false) => Some("[0-9A-Za-z_]"),
                ('W', false) => Some("[^0-9A-Za-z_]"),
                ('d', true) => Some("0-9"),
                ('w', true) => Some("0-9A-Za-z_"),
                _ => None,
            };
            chars.next();
            match rep {
                Some(r) => out.push_str(r),
                None => {
                    out.push('\\');
                    out.push(n);
                }
            }
            prev_backslash = false;
            continue;
        }
        if c == '[' && !prev_backslash {
            inside = true;
        } else if c == ']' && inside {
            inside = false;
        }
        prev_backslash = false;
        out.push(c);
    }
    out
}

/// One byte per code point: ASCII as is, others by category (llama.cpp `text_collapsed`).
fn collapse(t: &Text) -> Vec<u8> {
    t.cpts
        .iter()
        .zip(&t.flags)
        .map(|(&c, &f)| {
            if c < 128 {
                c as u8
            } else if f.is_whitespace() {
                0x0B
            } else {
                match f.category() {
                    Flags::NUMBER => CAT_NUMBER,
                    Flags::LETTER => CAT_LETTER,
                    Flags::PUNCTUATION => CAT_PUNCT,
                    Flags::ACCENT_MARK => CAT_MARK,
                    Flags::SYMBOL => CAT_SYMBOL,
                    _ => CAT_OTHER,
                }
            }
        })
        .collect()
}

/// The code points with non-ASCII whitespace replaced by U+000B, and char byte offsets.
fn widen(t: &Text) -> (String, Vec<usize>) {
    let mut s = String::with_capacity(t.text.len());
    let mut pos = Vec::with_capacity(t.cpts.len() + 1);
    for (&c, &f) in t.cpts.iter().zip(&t.flags) {
        pos.push(s.len());
        let ch = if c > 0x7F && f.is_whitespace() {
            '\u{0B}'
        } else {
            char::from_u32(c).unwrap_or('\u{FFFD}')
        };
        s.push(ch);
    }
    pos.push(s.len());
    (s, pos)
}

/// llama.cpp `unicode_regex_split_stl` over the collapsed bytes (1 byte = 1 code point).
fn split_regex_bytes(re: &Regex, text: &[u8], offsets: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0usize;
    for &len in offsets {
        let end = (start + len).min(text.len());
        let frag = &text[start..end];
        let mut last = 0usize;
        for m in re.find_iter(frag) {
            let Ok(m) = m else { break };
            if m.start() > last {
                out.push(m.start() - last);
            }
            out.push(m.end() - m.start());
            last = m.end();
        }
        if last < frag.len() {
            out.push(frag.len() - last);
        }
        start = end;
    }
    out
}

/// llama.cpp `unicode_regex_split_stl` over the code points.
fn split_regex_wide(re: &Regex, text: &str, pos: &[usize], offsets: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0usize;
    let n = pos.len().saturating_sub(1);
    for &len in offsets {
        let end = (start + len).min(n);
        let frag = &text[pos[start]..pos[end]];
        let mut last_byte = 0usize;
        for m in re.find_iter(frag) {
            let Ok(m) = m else { break };
            if m.start() > last_byte {
                out.push(frag[last_byte..m.start()].chars().count());
            }
            out.push(frag[m.start()..m.end()].chars().count());
            last_byte = m.end();
        }
        if last_byte < frag.len() {
            out.push(frag[last_byte..].chars().count());
        }
        start = end;
    }
    out
}

/// Accessors for one fragment `[ini, end)` of the code points.
struct Frag<'t> {
    cpts: &'t [u32],
    flags: &'t [Flags],
    ini: usize,
    end: usize,
}

impl Frag<'_> {
    #[inline]
    fn cpt(&self, pos: usize) -> u32 {
        if self.ini <= pos && pos < self.end {
            self.cpts[pos]
        } else {
            OOR
        }
    }
    #[inline]
    fn flags(&self, pos: usize) -> Flags {
        if self.ini <= pos && pos < self.end {
            self.flags[pos]
        } else {
            Flags::NONE
        }
    }
}

/// llama.cpp's `_add_token` helper.
struct Emit<'o> {
    out: &'o mut Vec<usize>,
    prev_end: usize,
}

impl Emit<'_> {
    #[inline]
    fn add(&mut self, end: usize) -> usize {
        let len = end.saturating_sub(self.prev_end);
        if len > 0 {
            self.out.push(len);
        }
        self.prev_end = end;
        len
    }
}

fn for_each_fragment(
    t: &Text,
    offsets: &[usize],
    mut f: impl FnMut(&Frag, &mut Emit),
) -> Vec<usize> {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0usize;
    for &len in offsets {
        let ini = start;
        let end = (start + len).min(t.cpts.len());
        start = end;
        let frag = Frag {
            cpts: &t.cpts,
            flags: &t.flags,
            ini,
            end,
        };
        let mut emit = Emit {
            out: &mut out,
            prev_end: ini,
        };
        f(&frag, &mut emit);
    }
    out
}

const fn ch(c: char) -> u32 {
    c as u32
}

/// `'s|'t|'re|'ve|'m|'ll|'d` (case-insensitive when `fold`); returns the match length.
#[inline]
fn contraction(fr: &Frag, pos: usize, fold: bool) -> usize {
    if fr.cpt(pos) != ch('\'') || pos + 1 >= fr.end {
        return 0;
    }
    let low = |c: u32| {
        if fold {
            unicode::to_lower_ascii_target(c)
        } else {
            c
        }
    };
    let n = low(fr.cpt(pos + 1));
    if n == ch('s') || n == ch('t') || n == ch('m') || n == ch('d') {
        return 2;
    }
    if pos + 2 < fr.end {
        let nn = low(fr.cpt(pos + 2));
        if (n == ch('r') && nn == ch('e'))
            || (n == ch('v') && nn == ch('e'))
            || (n == ch('l') && nn == ch('l'))
        {
            return 3;
        }
    }
    0
}

/// Whitespace run handling shared by the LLaMA-3 family: `\s*[\r\n]+|\s+(?!\S)|\s+`.
/// Returns the new position.
#[inline]
fn whitespace_tail(fr: &Frag, pos: usize, crlf: bool) -> Option<usize> {
    let mut num = 0usize;
    let mut last_rn = 0usize;
    while fr.flags(pos + num).is_whitespace() {
        let c = fr.cpt(pos + num);
        if crlf && (c == ch('\r') || c == ch('\n')) {
            last_rn = pos + num + 1;
        }
        num += 1;
    }
    if last_rn > 0 {
        return Some(last_rn);
    }
    if num > 1 && fr.cpt(pos + num) != OOR {
        return Some(pos + num - 1);
    }
    if num > 0 {
        return Some(pos + num);
    }
    None
}

/// `\p{N}{1,3}`: emits the digit run at `pos` in pieces of at most three code points and
/// returns its end.
#[inline]
fn digits_up_to_3(fr: &Frag, mut pos: usize, em: &mut Emit) -> usize {
    let mut ini = pos;
    while fr.flags(pos).is_number() {
        pos += 1;
        if pos - ini >= 3 {
            em.add(pos);
            ini = pos;
        }
    }
    em.add(pos);
    pos
}

/// `pos` past the optional space of a ` ?...` alternative.
#[inline]
fn skip_space(fr: &Frag, pos: usize) -> usize {
    pos + (fr.cpt(pos) == ch(' ')) as usize
}

/// ` ?X+` with `X` given by `class`: the end of the run after one optional space, or `None`
/// when the run is empty.
#[inline]
fn space_run(fr: &Frag, pos: usize, class: impl Fn(Flags) -> bool) -> Option<usize> {
    let start = skip_space(fr, pos);
    let mut end = start;
    while class(fr.flags(end)) {
        end += 1;
    }
    (end > start).then_some(end)
}

/// Which flags' `any()` gates [`punctuation_run`]: llama.cpp's GPT-2 and Kimi-K2 splitters test
/// the code point after the optional space (`f2.any()`), its LLaMA-3 and Qwen splitters the one
/// at `pos` (`flags.any()`). Kept as in llama.cpp; the only case where they differ (a space
/// ending the fragment) splits the same either way, there as punctuation, else as whitespace.
#[derive(Clone, Copy)]
enum AnyGate {
    AfterSpace,
    AtPos,
}

/// `[^\s\p{L}\p{N}]`
#[inline]
fn not_space_letter_number(f: Flags) -> bool {
    !(f.is_whitespace() || f.is_letter() || f.is_number())
}

/// ` ?[^\s\p{L}\p{N}]+`, plus `[\r\n]*` when `crlf`: one optional space, then a run of code
/// points for which `other` holds. Returns the end of the match, or `None` when there is none.
#[inline]
fn punctuation_run(
    fr: &Frag,
    pos: usize,
    other: impl Fn(Flags) -> bool,
    gate: AnyGate,
    crlf: bool,
) -> Option<usize> {
    let start = skip_space(fr, pos);
    let f2 = fr.flags(start);
    let gate = match gate {
        AnyGate::AfterSpace => f2,
        AnyGate::AtPos => fr.flags(pos),
    };
    if !(other(f2) && gate.any()) {
        return None;
    }
    let mut end = start;
    while other(fr.flags(end)) && fr.flags(end).any() {
        end += 1;
    }
    if crlf {
        while fr.cpt(end) == ch('\r') || fr.cpt(end) == ch('\n') {
            end += 1;
        }
    }
    Some(end)
}

/// GPT-2: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
fn split_gpt2(t: &Text, offsets: &[usize]) -> Vec<usize> {
    for_each_fragment(t, offsets, |fr, em| {
        let mut pos = fr.ini;
        while pos < fr.end {
            let n = contraction(fr, pos, false);
            if n > 0 {
                pos += em.add(pos + n);
                continue;
            }

            if let Some(p) = space_run(fr, pos, Flags::is_letter)
                .or_else(|| space_run(fr, pos, Flags::is_number))
                .or_else(|| {
                    punctuation_run(fr, pos, not_space_letter_number, AnyGate::AfterSpace, false)
                })
            {
                pos = p;
                em.add(pos);
                continue;
            }

            pos = whitespace_tail(fr, pos, false).unwrap_or(pos + 1);
            em.add(pos);
        }
    })
}

/// LLaMA-3 (`digits3`), Qwen2 (single digits) and Qwen3.5 (single digits, `marks`):
/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`;
/// with `marks`, letter runs also take combining marks (`[\p{L}\p{M}]+`) and the punctuation
/// run excludes them (`[^\s\p{L}\p{M}\p{N}]`).
fn split_llama3(t: &Text, offsets: &[usize], digits3: bool, marks: bool) -> Vec<usize> {
    let word = |f: Flags| f.is_letter() || (marks && f.is_accent_mark());
    let other = |f: Flags| !(f.is_whitespace() || word(f) || f.is_number());
    for_each_fragment(t, offsets, |fr, em| {
        let mut pos = fr.ini;
        while pos < fr.end {
            let cpt = fr.cpt(pos);
            let flags = fr.flags(pos);

            let n = contraction(fr, pos, true);
            if n > 0 {
                pos += em.add(pos + n);
                continue;
            }

            // [^\r\n\p{L}\p{N}]?\p{L}+
            if !(cpt == ch('\r') || cpt == ch('\n') || flags.is_number())
                && (word(flags) || word(fr.flags(pos + 1)))
            {
                pos += 1;
                while word(fr.flags(pos)) {
                    pos += 1;
                }
                em.add(pos);
                continue;
            }

            if flags.is_number() {
                if digits3 {
                    pos = digits_up_to_3(fr, pos, em);
                } else {
                    // \p{N}
                    pos += 1;
                    em.add(pos);
                }
                continue;
            }

            // <space>?[^\s\p{L}\p{N}]+[\r\n]*
            if let Some(p) = punctuation_run(fr, pos, other, AnyGate::AtPos, true) {
                pos = p;
                em.add(pos);
                continue;
            }

            pos = whitespace_tail(fr, pos, true).unwrap_or(pos + 1);
            em.add(pos);
        }
    })
}

/// Kimi-K2 (llama.cpp's custom handler for its `\p{Han}+`-led pattern list).
fn split_kimi_k2(t: &Text, offsets: &[usize]) -> Vec<usize> {
    for_each_fragment(t, offsets, |fr, em| {
        let han = |c: u32| unicode::is_han(c);
        let mut pos = fr.ini;
        while pos < fr.end {
            let cpt = fr.cpt(pos);
            let flags = fr.flags(pos);

            // [\p{Han}]+
            if han(cpt) {
                while han(fr.cpt(pos)) {
                    pos += 1;
                }
                em.add(pos);
                continue;
            }

            let lead_ok =
                !(cpt == ch('\r') || cpt == ch('\n') || flags.is_letter() || flags.is_number());
            let is_letter_pattern = (flags.is_letter() && !han(cpt))
                || (lead_ok && fr.flags(pos + 1).is_letter() && !han(fr.cpt(pos + 1)));
            if is_letter_pattern {
                let mut has_leading = false;
                if lead_ok {
                    has_leading = true;
                    pos += 1;
                }
                let mut has_letters = false;
                while fr.flags(pos).is_letter() && !han(fr.cpt(pos)) {
                    has_letters = true;
                    pos += 1;
                }
                if has_letters || (!has_leading && fr.flags(pos).is_letter() && !han(fr.cpt(pos))) {
                    if !has_letters {
                        pos += 1;
                    }
                    while fr.flags(pos).is_letter() && !han(fr.cpt(pos)) {
                        pos += 1;
                    }
                    // optional contraction
                    pos += contraction(fr, pos, true);
                    em.add(pos);
                    continue;
                } else if has_leading {
                    pos -= 1;
                }
            }

            // \p{N}{1,3}
            if flags.is_number() {
                pos = digits_up_to_3(fr, pos, em);
                continue;
            }

            //  ?[^\s\p{L}\p{N}]+[\r\n]*
            if let Some(p) =
                punctuation_run(fr, pos, not_space_letter_number, AnyGate::AfterSpace, true)
            {
                pos = p;
                em.add(pos);
                continue;
            }

            pos = whitespace_tail(fr, pos, true).unwrap_or(pos + 1);
            em.add(pos);
        }
    })
}

/// `[^\n]+|[\n]+`
fn split_newlines(t: &Text, offsets: &[usize]) -> Vec<usize> {
    for_each_fragment(t, offsets, |fr, em| {
        let mut pos = fr.ini;
        while pos < fr.end {
            let nl = fr.cpt(pos) == ch('\n');
            while pos < fr.end && (fr.cpt(pos) == ch('\n')) == nl {
                pos += 1;
            }
            em.add(pos);
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pre_regex::*;

    fn words(exprs: &[&str], text: &str) -> Vec<String> {
        let p = PreTokenizer::new(exprs).unwrap();
        p.split(text)
            .into_iter()
            .map(|(a, b)| text[a..b].to_string())
            .collect()
    }

    #[test]
    fn all_expressions_compile() {
        for list in [
            RE_LLAMA3,
            RE_JAIS2,
            RE_DEEPSEEK_LLM,
            RE_DEEPSEEK3_LLM,
            RE_SPARK2_5,
            RE_YOUTU,
            RE_DEEPSEEK_CODER,
            RE_FALCON,
            RE_STARCODER,
            RE_GPT2,
            RE_STABLELM2,
            RE_QWEN35,
            RE_PORO,
            RE_VIKING,
            RE_TEKKEN,
            RE_CHAMELEON,
            RE_GPT4O,
            RE_GRANITE_EMB_MULTI,
            RE_KIMI_K2,
            RE_BAILINGMOE,
            RE_SEED_CODER,
            RE_UFAKZEKA,
            RE_LAGUNA,
            RE_EXAONE_MOE,
            RE_MINICPM5,
            RE_DEFAULT,
        ] {
            let p = PreTokenizer::new(list).unwrap();
            let text = "Hello, wörld! 123456 日本語 x\r\n\n  y  \u{3000}z 'tis i'M";
            let ws = p.split(text);
            // the words tile the text
            let mut at = 0;
            for (a, b) in ws {
                assert_eq!(a, at);
                assert!(b > a);
                at = b;
            }
            assert_eq!(at, text.len());
        }
    }

    #[test]
    fn custom_dispatch() {
        assert!(matches!(
            PreTokenizer::new(RE_LLAMA3).unwrap().splitters[0],
            Splitter::Llama3
        ));
        assert!(matches!(
            PreTokenizer::new(RE_STABLELM2).unwrap().splitters[0],
            Splitter::Qwen2
        ));
        assert!(matches!(
            PreTokenizer::new(RE_GPT2).unwrap().splitters[0],
            Splitter::Gpt2
        ));
        assert!(matches!(
            PreTokenizer::new(RE_QWEN35).unwrap().splitters[0],
            Splitter::Qwen35
        ));
        assert!(matches!(
            PreTokenizer::new(RE_KIMI_K2).unwrap().splitters[0],
            Splitter::KimiK2
        ));
        assert!(matches!(
            PreTokenizer::new(RE_DEEPSEEK3_LLM).unwrap().splitters[0],
            Splitter::Collapsed(_)
        ));
        assert!(matches!(
            PreTokenizer::new(RE_DEEPSEEK3_LLM).unwrap().splitters[1],
            Splitter::Wide(_)
        ));
    }

    #[test]
    fn llama3_split() {
        assert_eq!(
            words(RE_LLAMA3, "Hello world 12345 I'M  ok\n\n x"),
            ["Hello", " world", " ", "123", "45", " I", "'M", " ", " ok", "\n\n", " x"]
        );
    }

    #[test]
    fn qwen2_digits() {
        assert_eq!(words(RE_STABLELM2, "a 123"), ["a", " ", "1", "2", "3"]);
    }

    #[test]
    fn deepseek3_split() {
        assert_eq!(
            words(RE_DEEPSEEK3_LLM, "Hello, 日本語のテキスト 12345!!\n\nok"),
            [
                "Hello",
                ",",
                " ",
                "日本語のテキスト",
                " ",
                "123",
                "45",
                "!!\n\n",
                "ok"
            ]
        );
    }

    #[test]
    fn gpt2_split() {
        assert_eq!(
            words(RE_GPT2, "I'm  here!  "),
            ["I", "'m", " ", " here", "!", "  "]
        );
    }

    #[test]
    fn collapsed_regex_rewrite() {
        let r = collapse_regex("[^\\r\\n\\p{L}]?\\p{N}+");
        assert!(r.starts_with("[^\\r\\n\\xD2\\x41"), "{r}");
        assert!(
            r.ends_with("[\\xD1\\x30\\x31\\x32\\x33\\x34\\x35\\x36\\x37\\x38\\x39]+"),
            "{r}"
        );
    }
}
