//! Tensor placement rules with llama.cpp's syntax and semantics: `-ot/--override-tensor`,
//! `--cpu-moe` and `--n-cpu-moe`.
//!
//! Verified against the llama.cpp that moxie's goldens come from (commit `0c1e57098`, vendored
//! by llama-cpp-python 0.3.36), `common/arg.cpp`, `common/common.h` and
//! `src/llama-model-loader.cpp`:
//! - `-ot VALUE` (`parse_tensor_buffer_overrides`) splits VALUE on `,`, each part at its first
//!   `=` into a pattern and a buffer type name; a part without `=` is an error, and so is a
//!   buffer type that no device has (llama.cpp prints the available ones).
//! - `--cpu-moe` pushes `LLM_FFN_EXPS_REGEX` = `\.ffn_(up|down|gate|gate_up)_(ch|)exps` -> CPU
//!   (`llm_ffn_exps_cpu_override`); `--n-cpu-moe N` pushes `blk\.{i}` + that pattern -> CPU
//!   for i in 0..N (`llm_add_n_cpu_ffn_overrides`). The `gate_up` alternative (fused expert
//!   tensors) arrived in llama.cpp b8301; older builds had `(up|down|gate)`, which selects the
//!   same tensors in every model without `ffn_gate_up_exps`.
//! - All three push onto one list, `params.tensor_buft_overrides`, as their flags are parsed,
//!   so the list is in command-line order. The loader tries the list in order with
//!   `std::regex_search` (ECMAScript; the pattern may match anywhere in the name) and the
//!   first match wins; tensors a model does not load (MTP blocks) never reach the list.

use fancy_regex::Regex;

use super::devices::DeviceSpec;
use crate::{Error, Result};

/// The routed-expert pattern of `--cpu-moe` (llama.cpp's `LLM_FFN_EXPS_REGEX`).
pub const EXPERTS_PATTERN: &str = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps";

/// `--n-cpu-moe`'s pattern for block `il` (llama.cpp's `llm_ffn_block_regex`).
pub fn block_experts_pattern(il: usize) -> String {
    format!(r"blk\.{il}{EXPERTS_PATTERN}")
}

/// One placement flag as given on the command line. The order of a list of these is the
/// order of the flags: earlier rules win.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlacementArg {
    /// `-ot "REGEX=BUF[,REGEX=BUF...]"`, the value as given.
    OverrideTensor(String),
    /// `--cpu-moe`
    CpuMoe,
    /// `--n-cpu-moe N`
    NCpuMoe(usize),
}

/// Which flag a rule came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RuleOrigin {
    /// Part `part` (0-based) of the `-ot` value `value`.
    OverrideTensor {
        value: String,
        part: usize,
    },
    CpuMoe,
    /// `--n-cpu-moe N`'s rule for `layer`.
    NCpuMoe {
        n: usize,
        layer: usize,
    },
}

impl RuleOrigin {
    /// How the flag is written (`-ot "..."`, `--cpu-moe`, `--n-cpu-moe 4`).
    pub fn flag(&self) -> String {
        match self {
            RuleOrigin::OverrideTensor { value, .. } => format!("-ot \"{value}\""),
            RuleOrigin::CpuMoe => "--cpu-moe".to_owned(),
            RuleOrigin::NCpuMoe { n, .. } => format!("--n-cpu-moe {n}"),
        }
    }
}

/// A compiled rule: tensors whose name the pattern matches go to `device`.
#[derive(Clone, Debug)]
pub struct Rule {
    pub pattern: String,
    regex: Regex,
    /// Index into the plan's device list.
    pub device: usize,
    pub origin: RuleOrigin,
}

impl Rule {
    fn new(pattern: &str, device: usize, origin: RuleOrigin) -> Result<Rule> {
        let regex = Regex::new(pattern).map_err(|e| {
            Error::Placement(format!(
                "{}: bad regular expression '{pattern}': {e}",
                origin.flag()
            ))
        })?;
        Ok(Rule {
            pattern: pattern.to_owned(),
            regex,
            device,
            origin,
        })
    }

    /// Whether the pattern occurs anywhere in `name` (`std::regex_search`). A pattern whose
    /// matching gives up (fancy-regex's backtrack limit) is an error, not a silent miss.
    pub fn matches(&self, name: &str) -> Result<bool> {
        self.regex.is_match(name).map_err(|e| {
            Error::Placement(format!(
                "{}: matching '{}' against {name}: {e}",
                self.origin.flag(),
                self.pattern
            ))
        })
    }
}

/// The rules of `args`, in order, with buffer names resolved against `devices`.
pub fn compile_rules(args: &[PlacementArg], devices: &[DeviceSpec]) -> Result<Vec<Rule>> {
    let cpu = devices
        .iter()
        .position(|d| d.name == "CPU")
        .ok_or_else(|| Error::Placement("the device list has no CPU".into()))?;
    let mut rules = Vec::new();
    for arg in args {
        match arg {
            PlacementArg::OverrideTensor(value) => {
                for (part, text) in value.split(',').enumerate() {
                    let origin = RuleOrigin::OverrideTensor {
                        value: value.clone(),
                        part,
                    };
                    let Some((pattern, buf)) = text.split_once('=') else {
                        return Err(Error::Placement(format!(
                            "{}: '{text}' is not REGEX=BUF",
                            origin.flag()
                        )));
                    };
                    let device = devices.iter().position(|d| d.name == buf).ok_or_else(|| {
                        let names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
                        Error::Placement(format!(
                            "{}: unknown buffer '{buf}' (devices: {})",
                            origin.flag(),
                            names.join(", ")
                        ))
                    })?;
                    rules.push(Rule::new(pattern, device, origin)?);
                }
            }
            PlacementArg::CpuMoe => {
                rules.push(Rule::new(EXPERTS_PATTERN, cpu, RuleOrigin::CpuMoe)?)
            }
            &PlacementArg::NCpuMoe(n) => {
                for layer in 0..n {
                    let origin = RuleOrigin::NCpuMoe { n, layer };
                    rules.push(Rule::new(&block_experts_pattern(layer), cpu, origin)?);
                }
            }
        }
    }
    Ok(rules)
}

/// The first rule matching `name`, as an index into `rules`.
pub fn first_match(rules: &[Rule], name: &str) -> Result<Option<usize>> {
    for (i, rule) in rules.iter().enumerate() {
        if rule.matches(name)? {
            return Ok(Some(i));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::devices::device_list;

    fn devices() -> Vec<DeviceSpec> {
        device_list(100, &[10, 10], &[5])
    }

    fn ot(v: &str) -> PlacementArg {
        PlacementArg::OverrideTensor(v.to_owned())
    }

    #[test]
    fn override_values_split_on_commas_then_the_first_equals() {
        let rules = compile_rules(
            &[ot(r"blk\.3\.=CUDA1,exps=CPU"), ot("a=b=sim0")],
            &devices(),
        );
        // 'a=b=sim0' splits at the first '=': buffer 'b=sim0' is unknown.
        let e = rules.unwrap_err().to_string();
        assert!(e.contains("unknown buffer 'b=sim0'"), "{e}");
        assert!(e.contains("CPU, CUDA0, CUDA1, sim0"), "{e}");

        let rules = compile_rules(&[ot(r"blk\.3\.=CUDA1,exps=CPU")], &devices()).unwrap();
        assert_eq!(rules.len(), 2);
        assert_eq!(
            (rules[0].pattern.as_str(), rules[0].device),
            (r"blk\.3\.", 2)
        );
        assert_eq!((rules[1].pattern.as_str(), rules[1].device), ("exps", 0));
    }

    #[test]
    fn patterns_match_anywhere_and_the_first_rule_wins() {
        let rules = compile_rules(
            &[
                ot(r"blk\.(3|4)\.ffn_(gate|up|down)_exps\.=CUDA0"),
                PlacementArg::CpuMoe,
                ot("ffn_up=sim0"),
                ot(r"blk\.1=CUDA1"),
            ],
            &devices(),
        )
        .unwrap();
        let m = |n: &str| first_match(&rules, n).unwrap();
        assert_eq!(m("blk.4.ffn_up_exps.weight"), Some(0));
        assert_eq!(m("blk.14.ffn_up_exps.weight"), Some(1));
        assert_eq!(m("blk.5.ffn_up_exps.weight"), Some(1));
        assert_eq!(m("blk.5.ffn_gate_up_exps.weight"), Some(1));
        assert_eq!(m("blk.5.ffn_up_chexps.weight"), Some(1));
        assert_eq!(m("blk.5.ffn_up_shexp.weight"), Some(2));
        assert_eq!(m("blk.5.ffn_gate_inp.weight"), None);
        // Searched, not anchored: 'blk\.1' occurs in 'blk.12.attn_q.weight'.
        assert_eq!(m("blk.12.attn_q.weight"), Some(3));
    }

    #[test]
    fn n_cpu_moe_makes_one_rule_per_block() {
        let rules = compile_rules(&[PlacementArg::NCpuMoe(3)], &devices()).unwrap();
        assert_eq!(rules.len(), 3);
        assert_eq!(
            rules[2].pattern,
            r"blk\.2\.ffn_(up|down|gate|gate_up)_(ch|)exps"
        );
        assert!(rules.iter().all(|r| r.device == 0));
        assert_eq!(
            first_match(&rules, "blk.2.ffn_down_exps.weight").unwrap(),
            Some(2)
        );
        assert_eq!(
            first_match(&rules, "blk.3.ffn_down_exps.weight").unwrap(),
            None
        );
        // The '\.' after the block number keeps blk.12 out of blk.2's rule.
        assert_eq!(
            first_match(&rules, "blk.12.ffn_down_exps.weight").unwrap(),
            None
        );
    }

    #[test]
    fn bad_rules_are_errors_naming_the_flag() {
        let e = compile_rules(&[ot("exps")], &devices())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("-ot \"exps\"") && e.contains("not REGEX=BUF"),
            "{e}"
        );
        let e = compile_rules(&[ot("blk\\.(3=CPU")], &devices())
            .unwrap_err()
            .to_string();
        assert!(e.contains("bad regular expression 'blk\\.(3'"), "{e}");
        let e = compile_rules(&[ot("exps=CUDA7")], &devices())
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown buffer 'CUDA7'"), "{e}");
        let e = compile_rules(&[ot("exps=CPU,")], &devices())
            .unwrap_err()
            .to_string();
        assert!(e.contains("'' is not REGEX=BUF"), "{e}");
    }
}
