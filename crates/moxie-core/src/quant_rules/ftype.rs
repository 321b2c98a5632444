//! llama-quantize's file types (`llama_ftype`): the names its command line takes, the id
//! written as `general.file_type`, and the block type a file type quantizes to by default
//! (`llama_ftype_get_default_type`).

use moxie_quant::GgmlType;

/// A llama.cpp file type (the `llama_ftype` enum; the discriminant is the id).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum Ftype {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q8_0 = 7,
    Q5_0 = 8,
    Q5_1 = 9,
    Q2_K = 10,
    Q3_K_S = 11,
    Q3_K_M = 12,
    Q3_K_L = 13,
    Q4_K_S = 14,
    Q4_K_M = 15,
    Q5_K_S = 16,
    Q5_K_M = 17,
    Q6_K = 18,
    IQ2_XXS = 19,
    IQ2_XS = 20,
    Q2_K_S = 21,
    IQ3_XS = 22,
    IQ3_XXS = 23,
    IQ1_S = 24,
    IQ4_NL = 25,
    IQ3_S = 26,
    IQ3_M = 27,
    IQ2_S = 28,
    IQ2_M = 29,
    IQ4_XS = 30,
    IQ1_M = 31,
    BF16 = 32,
    TQ1_0 = 36,
    TQ2_0 = 37,
    MXFP4_MOE = 38,
    Q1_0 = 40,
    Q2_0 = 41,
}

/// llama-quantize's `QUANT_OPTIONS` in its order (aliases included; `COPY` is left out:
/// moxie does not offer the copy-only mode).
pub const NAMES: &[(&str, Ftype)] = &[
    ("Q1_0", Ftype::Q1_0),
    ("Q2_0", Ftype::Q2_0),
    ("Q4_0", Ftype::Q4_0),
    ("Q4_1", Ftype::Q4_1),
    ("MXFP4_MOE", Ftype::MXFP4_MOE),
    ("Q5_0", Ftype::Q5_0),
    ("Q5_1", Ftype::Q5_1),
    ("IQ2_XXS", Ftype::IQ2_XXS),
    ("IQ2_XS", Ftype::IQ2_XS),
    ("IQ2_S", Ftype::IQ2_S),
    ("IQ2_M", Ftype::IQ2_M),
    ("IQ1_S", Ftype::IQ1_S),
    ("IQ1_M", Ftype::IQ1_M),
    ("TQ1_0", Ftype::TQ1_0),
    ("TQ2_0", Ftype::TQ2_0),
    ("Q2_K", Ftype::Q2_K),
    ("Q2_K_S", Ftype::Q2_K_S),
    ("IQ3_XXS", Ftype::IQ3_XXS),
    ("IQ3_S", Ftype::IQ3_S),
    ("IQ3_M", Ftype::IQ3_M),
    ("Q3_K", Ftype::Q3_K_M),
    ("IQ3_XS", Ftype::IQ3_XS),
    ("Q3_K_S", Ftype::Q3_K_S),
    ("Q3_K_M", Ftype::Q3_K_M),
    ("Q3_K_L", Ftype::Q3_K_L),
    ("IQ4_NL", Ftype::IQ4_NL),
    ("IQ4_XS", Ftype::IQ4_XS),
    ("Q4_K", Ftype::Q4_K_M),
    ("Q4_K_S", Ftype::Q4_K_S),
    ("Q4_K_M", Ftype::Q4_K_M),
    ("Q5_K", Ftype::Q5_K_M),
    ("Q5_K_S", Ftype::Q5_K_S),
    ("Q5_K_M", Ftype::Q5_K_M),
    ("Q6_K", Ftype::Q6_K),
    ("Q8_0", Ftype::Q8_0),
    ("F16", Ftype::F16),
    ("BF16", Ftype::BF16),
    ("F32", Ftype::F32),
];

impl Ftype {
    /// The id written as `general.file_type`.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// The name llama-quantize prints for it (`Q4_K_M`, not its alias `Q4_K`).
    pub fn name(self) -> &'static str {
        NAMES
            .iter()
            .rev()
            .find(|(_, f)| *f == self)
            .map_or("?", |(n, _)| n)
    }

    /// Parses a file type as llama-quantize does: a name from [`NAMES`] in any case, or the
    /// numeric id (the whole argument must be the number; llama-quantize's `stoi` would also
    /// take `7.gguf` as 7). Returns the canonical name (`Q4_K` for the alias) too.
    pub fn parse(s: &str) -> Option<(Ftype, &'static str)> {
        if let Some(&(name, f)) = NAMES.iter().find(|(n, _)| n.eq_ignore_ascii_case(s)) {
            return Some((f, name));
        }
        let id: u32 = s.parse().ok()?;
        NAMES
            .iter()
            .find(|(_, f)| f.id() == id)
            .map(|&(n, f)| (f, n))
    }

    /// The block type of the bulk of the tensors (`llama_ftype_get_default_type`).
    pub fn default_type(self) -> GgmlType {
        use GgmlType as T;
        match self {
            Ftype::Q4_0 => T::Q4_0,
            Ftype::Q4_1 => T::Q4_1,
            Ftype::Q5_0 => T::Q5_0,
            Ftype::Q5_1 => T::Q5_1,
            Ftype::Q8_0 => T::Q8_0,
            Ftype::F16 => T::F16,
            Ftype::BF16 => T::BF16,
            Ftype::F32 => T::F32,
            Ftype::Q1_0 => T::Q1_0,
            Ftype::Q2_0 => T::Q2_0,
            Ftype::MXFP4_MOE => T::MXFP4,
            Ftype::Q2_K_S | Ftype::Q2_K => T::Q2_K,
            Ftype::IQ3_XS => T::IQ3_S,
            Ftype::Q3_K_S | Ftype::Q3_K_M | Ftype::Q3_K_L => T::Q3_K,
            Ftype::Q4_K_S | Ftype::Q4_K_M => T::Q4_K,
            Ftype::Q5_K_S | Ftype::Q5_K_M => T::Q5_K,
            Ftype::Q6_K => T::Q6_K,
            Ftype::TQ1_0 => T::TQ1_0,
            Ftype::TQ2_0 => T::TQ2_0,
            Ftype::IQ2_XXS => T::IQ2_XXS,
            Ftype::IQ2_XS | Ftype::IQ2_S => T::IQ2_XS,
            Ftype::IQ2_M => T::IQ2_S,
            Ftype::IQ3_XXS => T::IQ3_XXS,
            Ftype::IQ1_S => T::IQ1_S,
            Ftype::IQ1_M => T::IQ1_M,
            Ftype::IQ4_NL => T::IQ4_NL,
            Ftype::IQ4_XS => T::IQ4_XS,
            Ftype::IQ3_S | Ftype::IQ3_M => T::IQ3_S,
        }
    }
}

/// Whether moxie can write tensors of type `ty` as llama-quantize does (its weight
/// quantizer or conversion is ported). Q8_1 and Q8_K are activation formats llama-quantize
/// cannot write.
pub fn can_write(ty: GgmlType) -> bool {
    !matches!(ty, GgmlType::Q8_1 | GgmlType::Q8_K) && moxie_quant::quantize_weights_fn(ty).is_some()
}

/// The file types whose default block type moxie can write, for error messages.
pub fn supported_names() -> Vec<&'static str> {
    NAMES
        .iter()
        .filter(|(_, f)| can_write(f.default_type()))
        .map(|&(n, _)| n)
        .collect()
}

/// The block types moxie can write, for error messages.
pub fn writable_types() -> Vec<&'static str> {
    GgmlType::ALL
        .iter()
        .filter(|t| can_write(**t))
        .map(|t| t.name())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_in_any_case_aliases_and_ids() {
        assert_eq!(Ftype::parse("q4_k_m"), Some((Ftype::Q4_K_M, "Q4_K_M")));
        assert_eq!(Ftype::parse("Q4_K"), Some((Ftype::Q4_K_M, "Q4_K")));
        assert_eq!(Ftype::parse("15"), Some((Ftype::Q4_K_M, "Q4_K")));
        assert_eq!(Ftype::parse("0"), Some((Ftype::F32, "F32")));
        assert_eq!(Ftype::parse("7.gguf"), None);
        assert_eq!(Ftype::parse("q4_k_x"), None);
        assert_eq!(Ftype::parse("COPY"), None);
        assert_eq!(Ftype::parse("4"), None);
        assert_eq!(Ftype::Q4_K_M.name(), "Q4_K_M");
        assert_eq!(Ftype::Q3_K_M.name(), "Q3_K_M");
        for (_, f) in NAMES {
            assert_eq!(Ftype::parse(f.name()).map(|p| p.0), Some(*f));
        }
    }

    #[test]
    fn supported_file_types_are_the_ported_quantizers() {
        let s = supported_names();
        for n in [
            "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q2_K_S", "Q3_K_S", "Q3_K_M", "Q3_K_L",
            "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS", "F16", "BF16",
            "F32",
        ] {
            assert!(s.contains(&n), "{n}");
        }
        for n in [
            "IQ2_XXS",
            "IQ1_S",
            "IQ3_M",
            "IQ3_XS",
            "TQ1_0",
            "MXFP4_MOE",
            "Q1_0",
        ] {
            assert!(!s.contains(&n), "{n}");
        }
        assert!(!can_write(GgmlType::Q8_K));
    }
}
