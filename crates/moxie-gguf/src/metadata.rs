//! The ordered key/value metadata of a GGUF file.

use std::collections::HashMap;

use crate::{Array, GgufError, Value};

#[derive(Clone, Debug)]
struct Entry {
    key: String,
    value: Value,
    offset: u64,
}

/// The metadata key/value pairs of a GGUF file, in file order, with O(1) lookup by key.
///
/// `get_*` accessors return `None` for a missing key or a value of an unsuitable type;
/// `require_*` accessors return a [`GgufError`] that names the file and the key instead.
#[derive(Clone, Debug, Default)]
pub struct Metadata {
    source: String,
    entries: Vec<Entry>,
    index: HashMap<String, usize>,
}

impl Metadata {
    /// An empty set; `source` is the file name used in error messages.
    pub fn new(source: impl Into<String>) -> Metadata {
        Metadata {
            source: source.into(),
            entries: Vec::new(),
            index: HashMap::new(),
        }
    }

    pub(crate) fn with_capacity(source: &str, n: usize) -> Metadata {
        Metadata {
            source: source.to_owned(),
            entries: Vec::with_capacity(n),
            index: HashMap::with_capacity(n),
        }
    }

    /// Appends a pair; returns the index of the existing entry if the key is already present
    /// (and leaves the set unchanged).
    pub(crate) fn push(&mut self, key: String, value: Value, offset: u64) -> Result<(), usize> {
        if let Some(&i) = self.index.get(&key) {
            return Err(i);
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push(Entry { key, value, offset });
        Ok(())
    }

    pub(crate) fn index_of(&self, key: &str) -> Option<usize> {
        self.index.get(key).copied()
    }

    /// The file these pairs were read from (used in error messages).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Number of pairs.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no pairs.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether `key` is present.
    pub fn contains_key(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.entries[i].value)
    }

    /// Byte offset in the file of the key/value pair `key` (0 for pairs not read from a file).
    pub fn offset_of(&self, key: &str) -> Option<u64> {
        self.index.get(key).map(|&i| self.entries[i].offset)
    }

    /// All pairs in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.entries.iter().map(|e| (e.key.as_str(), &e.value))
    }

    /// All keys in file order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|e| e.key.as_str())
    }

    /// A string value.
    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key)?.as_str()
    }

    /// Any integer type holding a non-negative value (not bools, not floats).
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key)?.as_u64()
    }

    /// Any integer type holding a value that fits `u32`.
    pub fn get_u32(&self, key: &str) -> Option<u32> {
        u32::try_from(self.get_u64(key)?).ok()
    }

    /// Any integer type holding a value that fits `i64`.
    pub fn get_i64(&self, key: &str) -> Option<i64> {
        self.get(key)?.as_i64()
    }

    /// `f32`, `f64` or any integer type, as `f64`.
    pub fn get_f64(&self, key: &str) -> Option<f64> {
        self.get(key)?.as_f64()
    }

    /// A bool value.
    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.get(key)?.as_bool()
    }

    /// An array value.
    pub fn get_array(&self, key: &str) -> Option<&Array> {
        self.get(key)?.as_array()
    }

    /// The value of `key`, or [`GgufError::MissingKey`].
    pub fn require(&self, key: &str) -> Result<&Value, GgufError> {
        self.get(key).ok_or_else(|| GgufError::MissingKey {
            file: self.source.clone(),
            key: key.to_owned(),
        })
    }

    fn type_error(&self, key: &str, v: &Value, expected: &'static str) -> GgufError {
        GgufError::KeyType {
            file: self.source.clone(),
            key: key.to_owned(),
            offset: self.offset_of(key).unwrap_or(0),
            found: v.value_type().name().to_owned(),
            expected,
        }
    }

    fn value_error(&self, key: &str, reason: String) -> GgufError {
        GgufError::KeyValue {
            file: self.source.clone(),
            key: key.to_owned(),
            offset: self.offset_of(key).unwrap_or(0),
            reason,
        }
    }

    /// A non-negative integer of any integer type.
    pub fn require_u64(&self, key: &str) -> Result<u64, GgufError> {
        let v = self.require(key)?;
        if !v.value_type().is_integer() {
            return Err(self.type_error(key, v, "integer"));
        }
        v.as_u64().ok_or_else(|| {
            self.value_error(
                key,
                format!("value {v} is negative, expected a non-negative integer"),
            )
        })
    }

    /// A non-negative integer of any integer type that fits `u32`.
    pub fn require_u32(&self, key: &str) -> Result<u32, GgufError> {
        let v = self.require_u64(key)?;
        u32::try_from(v).map_err(|_| self.value_error(key, format!("value {v} does not fit u32")))
    }

    /// A non-negative integer of any integer type that fits `usize`.
    pub fn require_usize(&self, key: &str) -> Result<usize, GgufError> {
        let v = self.require_u64(key)?;
        usize::try_from(v)
            .map_err(|_| self.value_error(key, format!("value {v} does not fit usize")))
    }

    /// An integer of any integer type that fits `i64`.
    pub fn require_i64(&self, key: &str) -> Result<i64, GgufError> {
        let v = self.require(key)?;
        if !v.value_type().is_integer() {
            return Err(self.type_error(key, v, "integer"));
        }
        v.as_i64()
            .ok_or_else(|| self.value_error(key, format!("value {v} does not fit i64")))
    }

    /// A float or integer, as `f64`.
    pub fn require_f64(&self, key: &str) -> Result<f64, GgufError> {
        let v = self.require(key)?;
        v.as_f64().ok_or_else(|| self.type_error(key, v, "number"))
    }

    /// A string.
    pub fn require_str(&self, key: &str) -> Result<&str, GgufError> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| self.type_error(key, v, "string"))
    }

    /// A bool.
    pub fn require_bool(&self, key: &str) -> Result<bool, GgufError> {
        let v = self.require(key)?;
        v.as_bool().ok_or_else(|| self.type_error(key, v, "bool"))
    }

    /// An array.
    pub fn require_array(&self, key: &str) -> Result<&Array, GgufError> {
        let v = self.require(key)?;
        v.as_array().ok_or_else(|| self.type_error(key, v, "array"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_and_errors() {
        let mut m = Metadata::new("t.gguf");
        m.push("a".into(), Value::I32(-3), 24).unwrap();
        m.push("b".into(), Value::U8(200), 40).unwrap();
        m.push("s".into(), Value::from("x"), 50).unwrap();
        assert_eq!(m.push("a".into(), Value::U8(1), 60), Err(0));
        assert_eq!(m.len(), 3);
        assert_eq!(m.keys().collect::<Vec<_>>(), ["a", "b", "s"]);
        assert_eq!(m.get_i64("a"), Some(-3));
        assert_eq!(m.get_u64("a"), None);
        assert_eq!(m.get_u64("b"), Some(200));
        assert_eq!(m.get_f64("b"), Some(200.0));
        assert_eq!(m.require_u32("b").unwrap(), 200);
        let e = m.require_u64("a").unwrap_err().to_string();
        assert!(
            e.contains("t.gguf") && e.contains("'a'") && e.contains("negative"),
            "{e}"
        );
        let e = m.require_u64("s").unwrap_err().to_string();
        assert!(
            e.contains("has type string, expected integer") && e.contains("byte 50"),
            "{e}"
        );
        let e = m.require_str("zz").unwrap_err().to_string();
        assert!(e.contains("missing metadata key 'zz'"), "{e}");
    }
}
