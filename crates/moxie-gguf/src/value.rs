//! Metadata values: [`ValueType`], [`Value`], and the compact typed [`Array`].

use std::fmt;

/// Maximum nesting of arrays of arrays (an array of scalars has depth 1).
pub const MAX_ARRAY_DEPTH: usize = 16;

/// The type id of a metadata value, as stored in the file (`gguf_type` in ggml).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum ValueType {
    /// `uint8`
    U8 = 0,
    /// `int8`
    I8 = 1,
    /// `uint16`
    U16 = 2,
    /// `int16`
    I16 = 3,
    /// `uint32`
    U32 = 4,
    /// `int32`
    I32 = 5,
    /// `float32`
    F32 = 6,
    /// `bool` (one byte, 0 or 1)
    Bool = 7,
    /// UTF-8 string: `u64` length + bytes
    String = 8,
    /// array: `u32` element type + `u64` count + elements
    Array = 9,
    /// `uint64`
    U64 = 10,
    /// `int64`
    I64 = 11,
    /// `float64`
    F64 = 12,
}

impl ValueType {
    /// Every type, in id order.
    pub const ALL: [ValueType; 13] = [
        ValueType::U8,
        ValueType::I8,
        ValueType::U16,
        ValueType::I16,
        ValueType::U32,
        ValueType::I32,
        ValueType::F32,
        ValueType::Bool,
        ValueType::String,
        ValueType::Array,
        ValueType::U64,
        ValueType::I64,
        ValueType::F64,
    ];

    /// The type with this id, or `None` for ids outside 0..=12.
    pub fn from_id(id: u32) -> Option<ValueType> {
        Self::ALL.get(usize::try_from(id).ok()?).copied()
    }

    /// The id stored in the file.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// Short name (`u8`, `i32`, `f32`, `bool`, `string`, `array`, ...).
    pub fn name(self) -> &'static str {
        match self {
            ValueType::U8 => "u8",
            ValueType::I8 => "i8",
            ValueType::U16 => "u16",
            ValueType::I16 => "i16",
            ValueType::U32 => "u32",
            ValueType::I32 => "i32",
            ValueType::F32 => "f32",
            ValueType::Bool => "bool",
            ValueType::String => "string",
            ValueType::Array => "array",
            ValueType::U64 => "u64",
            ValueType::I64 => "i64",
            ValueType::F64 => "f64",
        }
    }

    /// Encoded size of a scalar of this type, `None` for strings and arrays.
    pub fn fixed_size(self) -> Option<usize> {
        match self {
            ValueType::U8 | ValueType::I8 | ValueType::Bool => Some(1),
            ValueType::U16 | ValueType::I16 => Some(2),
            ValueType::U32 | ValueType::I32 | ValueType::F32 => Some(4),
            ValueType::U64 | ValueType::I64 | ValueType::F64 => Some(8),
            ValueType::String | ValueType::Array => None,
        }
    }

    /// The fewest bytes one array element of this type occupies in a file (a string needs its
    /// 8-byte length, a nested array its 4-byte type and 8-byte count). Used to bound counts.
    pub fn min_encoded_size(self) -> u64 {
        match self {
            ValueType::String => 8,
            ValueType::Array => 12,
            other => other.fixed_size().unwrap_or(1) as u64,
        }
    }

    /// Whether this is one of the eight integer types.
    pub fn is_integer(self) -> bool {
        matches!(
            self,
            ValueType::U8
                | ValueType::I8
                | ValueType::U16
                | ValueType::I16
                | ValueType::U32
                | ValueType::I32
                | ValueType::U64
                | ValueType::I64
        )
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `uint8`
    U8(u8),
    /// `int8`
    I8(i8),
    /// `uint16`
    U16(u16),
    /// `int16`
    I16(i16),
    /// `uint32`
    U32(u32),
    /// `int32`
    I32(i32),
    /// `uint64`
    U64(u64),
    /// `int64`
    I64(i64),
    /// `float32`
    F32(f32),
    /// `float64`
    F64(f64),
    /// `bool`
    Bool(bool),
    /// UTF-8 string
    String(String),
    /// Array (homogeneous; elements may themselves be arrays)
    Array(Array),
}

impl Value {
    /// The value's type id.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F32(_) => ValueType::F32,
            Value::F64(_) => ValueType::F64,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
        }
    }

    /// Any integer type holding a non-negative value, as `u64`. Not bools, not floats.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer type whose value fits `i64`. Not bools, not floats.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => i64::try_from(v).ok(),
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::I64(v) => Some(v),
            _ => None,
        }
    }

    /// `f32`, `f64` or any integer type, as `f64` (64-bit integers may round).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            Value::U64(v) => Some(v as f64),
            Value::I64(v) => Some(v as f64),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    /// The string, for [`Value::String`].
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The bool, for [`Value::Bool`] only.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The array, for [`Value::Array`].
    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// Nesting depth: 0 for scalars and strings, 1 for an array of scalars, ...
    pub fn depth(&self) -> usize {
        match self {
            Value::Array(a) => a.depth(),
            _ => 0,
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::U8(v) => write!(f, "{v}"),
            Value::I8(v) => write!(f, "{v}"),
            Value::U16(v) => write!(f, "{v}"),
            Value::I16(v) => write!(f, "{v}"),
            Value::U32(v) => write!(f, "{v}"),
            Value::I32(v) => write!(f, "{v}"),
            Value::U64(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            Value::F32(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::String(v) => write!(f, "{v:?}"),
            Value::Array(a) => write!(f, "[{}; {}]", a.elem_type(), a.len()),
        }
    }
}

macro_rules! value_from {
    ($($t:ty => $v:ident),* $(,)?) => {
        $(impl From<$t> for Value {
            fn from(x: $t) -> Value { Value::$v(x) }
        })*
    };
}
value_from!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, u64 => U64,
    i64 => I64, f32 => F32, f64 => F64, bool => Bool, String => String, Array => Array);

impl From<&str> for Value {
    fn from(s: &str) -> Value {
        Value::String(s.to_owned())
    }
}

impl<T> From<Vec<T>> for Value
where
    Array: From<Vec<T>>,
{
    fn from(v: Vec<T>) -> Value {
        Value::Array(Array::from(v))
    }
}

/// A list of strings stored compactly: one byte buffer plus end offsets (no per-string
/// allocation; a 150k-entry vocabulary is two allocations).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Strings {
    buf: String,
    ends: Vec<usize>,
}

impl Strings {
    /// An empty list.
    pub fn new() -> Strings {
        Strings::default()
    }

    /// An empty list with room for `n` strings of `bytes` total bytes.
    pub fn with_capacity(n: usize, bytes: usize) -> Strings {
        Strings {
            buf: String::with_capacity(bytes),
            ends: Vec::with_capacity(n),
        }
    }

    /// Appends a string.
    pub fn push(&mut self, s: &str) {
        self.buf.push_str(s);
        self.ends.push(self.buf.len());
    }

    /// Number of strings.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Total bytes of all strings.
    pub fn total_bytes(&self) -> usize {
        self.buf.len()
    }

    /// String `i`.
    pub fn get(&self, i: usize) -> Option<&str> {
        let end = *self.ends.get(i)?;
        let start = if i == 0 { 0 } else { *self.ends.get(i - 1)? };
        self.buf.get(start..end)
    }

    /// Iterates over the strings in order.
    pub fn iter(&self) -> StringsIter<'_> {
        StringsIter {
            list: self,
            next: 0,
        }
    }
}

impl fmt::Debug for Strings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<S: AsRef<str>> FromIterator<S> for Strings {
    fn from_iter<I: IntoIterator<Item = S>>(iter: I) -> Strings {
        let mut s = Strings::new();
        for x in iter {
            s.push(x.as_ref());
        }
        s
    }
}

/// Iterator over a [`Strings`] list.
#[derive(Clone, Debug)]
pub struct StringsIter<'a> {
    list: &'a Strings,
    next: usize,
}

impl<'a> Iterator for StringsIter<'a> {
    type Item = &'a str;
    fn next(&mut self) -> Option<&'a str> {
        let s = self.list.get(self.next)?;
        self.next += 1;
        Some(s)
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.list.len().saturating_sub(self.next);
        (n, Some(n))
    }
}

impl ExactSizeIterator for StringsIter<'_> {}

impl<'a> IntoIterator for &'a Strings {
    type Item = &'a str;
    type IntoIter = StringsIter<'a>;
    fn into_iter(self) -> StringsIter<'a> {
        self.iter()
    }
}

/// The typed storage behind an [`Array`]: one vector per element type.
#[derive(Clone, Debug, PartialEq)]
pub enum ArrayData {
    /// `uint8` elements
    U8(Vec<u8>),
    /// `int8` elements
    I8(Vec<i8>),
    /// `uint16` elements
    U16(Vec<u16>),
    /// `int16` elements
    I16(Vec<i16>),
    /// `uint32` elements
    U32(Vec<u32>),
    /// `int32` elements
    I32(Vec<i32>),
    /// `float32` elements
    F32(Vec<f32>),
    /// `bool` elements
    Bool(Vec<bool>),
    /// string elements
    String(Strings),
    /// array elements (each with its own element type)
    Array(Vec<Array>),
    /// `uint64` elements
    U64(Vec<u64>),
    /// `int64` elements
    I64(Vec<i64>),
    /// `float64` elements
    F64(Vec<f64>),
}

/// A homogeneous metadata array, stored compactly by element type (see [`ArrayData`]).
///
/// Accessors: [`len`](Array::len), [`get`](Array::get) / [`iter`](Array::iter) (as [`Value`]s),
/// typed slices ([`as_f32s`](Array::as_f32s), [`as_i32s`](Array::as_i32s),
/// [`as_u32s`](Array::as_u32s), ...), strings ([`as_strs`](Array::as_strs),
/// [`strs`](Array::strs), [`str_at`](Array::str_at)), and widening conversions
/// ([`to_u64_vec`](Array::to_u64_vec), [`to_i64_vec`](Array::to_i64_vec),
/// [`to_f64_vec`](Array::to_f64_vec)).
#[derive(Clone, Debug, PartialEq)]
pub struct Array {
    /// The element type. Kept for code that reads it as a field; it always equals
    /// [`elem_type()`](Array::elem_type), which derives the type from the storage and is what
    /// the writer uses.
    pub elem_type: ValueType,
    data: ArrayData,
}

impl ArrayData {
    /// The element type of this storage.
    pub fn elem_type(&self) -> ValueType {
        match self {
            ArrayData::U8(_) => ValueType::U8,
            ArrayData::I8(_) => ValueType::I8,
            ArrayData::U16(_) => ValueType::U16,
            ArrayData::I16(_) => ValueType::I16,
            ArrayData::U32(_) => ValueType::U32,
            ArrayData::I32(_) => ValueType::I32,
            ArrayData::F32(_) => ValueType::F32,
            ArrayData::Bool(_) => ValueType::Bool,
            ArrayData::String(_) => ValueType::String,
            ArrayData::Array(_) => ValueType::Array,
            ArrayData::U64(_) => ValueType::U64,
            ArrayData::I64(_) => ValueType::I64,
            ArrayData::F64(_) => ValueType::F64,
        }
    }
}

macro_rules! slice_accessor {
    ($($(#[$m:meta])* $name:ident -> $t:ty = $v:ident;)*) => {
        $($(#[$m])* pub fn $name(&self) -> Option<&[$t]> {
            match &self.data {
                ArrayData::$v(v) => Some(v),
                _ => None,
            }
        })*
    };
}

impl Array {
    /// Wraps typed storage.
    pub fn new(data: ArrayData) -> Array {
        Array {
            elem_type: data.elem_type(),
            data,
        }
    }

    /// An empty array of the given element type.
    pub fn empty(elem_type: ValueType) -> Array {
        let data = match elem_type {
            ValueType::U8 => ArrayData::U8(Vec::new()),
            ValueType::I8 => ArrayData::I8(Vec::new()),
            ValueType::U16 => ArrayData::U16(Vec::new()),
            ValueType::I16 => ArrayData::I16(Vec::new()),
            ValueType::U32 => ArrayData::U32(Vec::new()),
            ValueType::I32 => ArrayData::I32(Vec::new()),
            ValueType::F32 => ArrayData::F32(Vec::new()),
            ValueType::Bool => ArrayData::Bool(Vec::new()),
            ValueType::String => ArrayData::String(Strings::new()),
            ValueType::Array => ArrayData::Array(Vec::new()),
            ValueType::U64 => ArrayData::U64(Vec::new()),
            ValueType::I64 => ArrayData::I64(Vec::new()),
            ValueType::F64 => ArrayData::F64(Vec::new()),
        };
        Array::new(data)
    }

    /// Builds an array from values that must all have type `elem_type`; `None` otherwise.
    pub fn from_values(elem_type: ValueType, values: Vec<Value>) -> Option<Array> {
        let mut a = Array::empty(elem_type);
        for v in values {
            match (&mut a.data, v) {
                (ArrayData::U8(d), Value::U8(x)) => d.push(x),
                (ArrayData::I8(d), Value::I8(x)) => d.push(x),
                (ArrayData::U16(d), Value::U16(x)) => d.push(x),
                (ArrayData::I16(d), Value::I16(x)) => d.push(x),
                (ArrayData::U32(d), Value::U32(x)) => d.push(x),
                (ArrayData::I32(d), Value::I32(x)) => d.push(x),
                (ArrayData::F32(d), Value::F32(x)) => d.push(x),
                (ArrayData::Bool(d), Value::Bool(x)) => d.push(x),
                (ArrayData::String(d), Value::String(x)) => d.push(&x),
                (ArrayData::Array(d), Value::Array(x)) => d.push(x),
                (ArrayData::U64(d), Value::U64(x)) => d.push(x),
                (ArrayData::I64(d), Value::I64(x)) => d.push(x),
                (ArrayData::F64(d), Value::F64(x)) => d.push(x),
                _ => return None,
            }
        }
        Some(a)
    }

    /// A string array.
    pub fn from_strs<I, S>(strs: I) -> Array
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Array::new(ArrayData::String(strs.into_iter().collect()))
    }

    /// The typed storage.
    pub fn data(&self) -> &ArrayData {
        &self.data
    }

    /// Consumes the array, returning its storage.
    pub fn into_data(self) -> ArrayData {
        self.data
    }

    /// The element type (derived from the storage).
    pub fn elem_type(&self) -> ValueType {
        self.data.elem_type()
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match &self.data {
            ArrayData::U8(v) => v.len(),
            ArrayData::I8(v) => v.len(),
            ArrayData::U16(v) => v.len(),
            ArrayData::I16(v) => v.len(),
            ArrayData::U32(v) => v.len(),
            ArrayData::I32(v) => v.len(),
            ArrayData::F32(v) => v.len(),
            ArrayData::Bool(v) => v.len(),
            ArrayData::String(v) => v.len(),
            ArrayData::Array(v) => v.len(),
            ArrayData::U64(v) => v.len(),
            ArrayData::I64(v) => v.len(),
            ArrayData::F64(v) => v.len(),
        }
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` as an owned [`Value`] (strings and nested arrays are cloned).
    pub fn get(&self, i: usize) -> Option<Value> {
        Some(match &self.data {
            ArrayData::U8(v) => Value::U8(*v.get(i)?),
            ArrayData::I8(v) => Value::I8(*v.get(i)?),
            ArrayData::U16(v) => Value::U16(*v.get(i)?),
            ArrayData::I16(v) => Value::I16(*v.get(i)?),
            ArrayData::U32(v) => Value::U32(*v.get(i)?),
            ArrayData::I32(v) => Value::I32(*v.get(i)?),
            ArrayData::F32(v) => Value::F32(*v.get(i)?),
            ArrayData::Bool(v) => Value::Bool(*v.get(i)?),
            ArrayData::String(v) => Value::String(v.get(i)?.to_owned()),
            ArrayData::Array(v) => Value::Array(v.get(i)?.clone()),
            ArrayData::U64(v) => Value::U64(*v.get(i)?),
            ArrayData::I64(v) => Value::I64(*v.get(i)?),
            ArrayData::F64(v) => Value::F64(*v.get(i)?),
        })
    }

    /// Iterates over the elements as owned [`Value`]s. Prefer the typed accessors for
    /// large arrays.
    pub fn iter(&self) -> impl Iterator<Item = Value> + '_ {
        (0..self.len()).filter_map(move |i| self.get(i))
    }

    /// The strings of a string array.
    pub fn as_strings(&self) -> Option<&Strings> {
        match &self.data {
            ArrayData::String(s) => Some(s),
            _ => None,
        }
    }

    /// Iterator over the strings of a string array.
    pub fn strs(&self) -> Option<StringsIter<'_>> {
        self.as_strings().map(Strings::iter)
    }

    /// The strings of a string array, collected.
    pub fn as_strs(&self) -> Option<Vec<&str>> {
        self.strs().map(Iterator::collect)
    }

    /// String `i` of a string array.
    pub fn str_at(&self, i: usize) -> Option<&str> {
        self.as_strings()?.get(i)
    }

    slice_accessor! {
        /// Elements of a `u8` array.
        as_u8s -> u8 = U8;
        /// Elements of an `i8` array.
        as_i8s -> i8 = I8;
        /// Elements of a `u16` array.
        as_u16s -> u16 = U16;
        /// Elements of an `i16` array.
        as_i16s -> i16 = I16;
        /// Elements of a `u32` array.
        as_u32s -> u32 = U32;
        /// Elements of an `i32` array.
        as_i32s -> i32 = I32;
        /// Elements of a `u64` array.
        as_u64s -> u64 = U64;
        /// Elements of an `i64` array.
        as_i64s -> i64 = I64;
        /// Elements of an `f32` array.
        as_f32s -> f32 = F32;
        /// Elements of an `f64` array.
        as_f64s -> f64 = F64;
        /// Elements of a `bool` array.
        as_bools -> bool = Bool;
        /// Elements of an array of arrays.
        as_arrays -> Array = Array;
    }

    /// All elements of an integer array as `u64`; `None` for other types or if any element is
    /// negative.
    pub fn to_u64_vec(&self) -> Option<Vec<u64>> {
        if !self.elem_type().is_integer() {
            return None;
        }
        self.iter().map(|v| v.as_u64()).collect()
    }

    /// All elements of an integer array as `i64`; `None` for other types or if a `u64` element
    /// exceeds `i64::MAX`.
    pub fn to_i64_vec(&self) -> Option<Vec<i64>> {
        if !self.elem_type().is_integer() {
            return None;
        }
        self.iter().map(|v| v.as_i64()).collect()
    }

    /// All elements of a numeric (integer or float) array as `f64`.
    pub fn to_f64_vec(&self) -> Option<Vec<f64>> {
        match &self.data {
            ArrayData::F32(v) => Some(v.iter().map(|&x| f64::from(x)).collect()),
            ArrayData::F64(v) => Some(v.clone()),
            _ if self.elem_type().is_integer() => self.iter().map(|v| v.as_f64()).collect(),
            _ => None,
        }
    }

    /// Nesting depth: 1 for an array of scalars or strings, 1 + the deepest element for an
    /// array of arrays.
    pub fn depth(&self) -> usize {
        match &self.data {
            ArrayData::Array(v) => 1 + v.iter().map(Array::depth).max().unwrap_or(0),
            _ => 1,
        }
    }
}

macro_rules! array_from_vec {
    ($($t:ty => $v:ident),* $(,)?) => {
        $(impl From<Vec<$t>> for Array {
            fn from(x: Vec<$t>) -> Array { Array::new(ArrayData::$v(x)) }
        })*
    };
}
array_from_vec!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32,
    f32 => F32, bool => Bool, Array => Array, u64 => U64, i64 => I64, f64 => F64);

impl From<Vec<String>> for Array {
    fn from(v: Vec<String>) -> Array {
        Array::from_strs(v)
    }
}

impl From<Vec<&str>> for Array {
    fn from(v: Vec<&str>) -> Array {
        Array::from_strs(v)
    }
}

impl From<Strings> for Array {
    fn from(s: Strings) -> Array {
        Array::new(ArrayData::String(s))
    }
}

impl From<ArrayData> for Array {
    fn from(data: ArrayData) -> Array {
        Array::new(data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_type_ids() {
        for (i, t) in ValueType::ALL.iter().enumerate() {
            assert_eq!(t.id() as usize, i);
            assert_eq!(ValueType::from_id(i as u32), Some(*t));
        }
        assert_eq!(ValueType::from_id(13), None);
        assert_eq!(ValueType::from_id(u32::MAX), None);
    }

    #[test]
    fn conversions() {
        assert_eq!(Value::I32(-1).as_u64(), None);
        assert_eq!(Value::I32(7).as_u64(), Some(7));
        assert_eq!(Value::U64(u64::MAX).as_i64(), None);
        assert_eq!(Value::Bool(true).as_u64(), None);
        assert_eq!(Value::F32(1.5).as_f64(), Some(1.5));
        assert_eq!(Value::U16(3).as_f64(), Some(3.0));
        assert_eq!(Value::from("x").as_str(), Some("x"));
        assert_eq!(Value::String("x".into()).as_u64(), None);
    }

    #[test]
    fn strings_and_arrays() {
        let a = Array::from_strs(["a", "", "héllo"]);
        assert_eq!(a.len(), 3);
        assert_eq!(a.as_strs(), Some(vec!["a", "", "héllo"]));
        assert_eq!(a.str_at(2), Some("héllo"));
        assert_eq!(a.str_at(3), None);
        assert_eq!(a.get(1), Some(Value::String(String::new())));
        assert_eq!(a.depth(), 1);
        let n = Array::from(vec![
            Array::from(vec![1i32, -2]),
            Array::from(vec![Array::from(vec![true])]),
        ]);
        assert_eq!(n.depth(), 3);
        assert_eq!(n.elem_type(), ValueType::Array);
        assert_eq!(n.elem_type, ValueType::Array);
        assert_eq!(Array::empty(ValueType::F64).elem_type, ValueType::F64);
        let ints = Array::from(vec![1u16, 2, 3]);
        assert_eq!(ints.to_u64_vec(), Some(vec![1, 2, 3]));
        assert_eq!(Array::from(vec![-1i8]).to_u64_vec(), None);
        assert_eq!(ints.to_f64_vec(), Some(vec![1.0, 2.0, 3.0]));
        assert_eq!(
            Array::from_values(ValueType::I32, vec![Value::I32(1), Value::U8(2)]),
            None
        );
        assert_eq!(
            Array::from_values(ValueType::I32, vec![Value::I32(1)])
                .unwrap()
                .as_i32s(),
            Some(&[1][..])
        );
    }
}
