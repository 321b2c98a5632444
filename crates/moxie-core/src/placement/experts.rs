//! Per-expert placement: `-oe LAYERS:EXPERTS=DEVICE` puts the listed routed experts of those
//! layers on another device than the rest of their layer's experts (hot experts in VRAM, the
//! others in RAM). llama.cpp's `-ot` places whole tensors; a routed-expert tensor holds every
//! expert of its layer, so this is a flag of moxie's own, in `-ot`'s spirit:
//!
//! - `LAYERS`: block numbers and ranges (`3,5-7`), or `*` for every layer with routed experts;
//! - `EXPERTS`: expert numbers and ranges (`0-7,12`);
//! - `DEVICE`: a device name as `-ot` takes them (`sim0`, `CUDA1`).
//!
//! Several `-oe` flags apply in command-line order; an expert an earlier flag placed stays
//! where that flag put it. The experts stay in RAM as well (the file's mapping, or the
//! repacked copy), so the plan adds their bytes to the device without taking them off the CPU.

use moxie_gguf::TensorInfo;

use super::devices::{human_bytes, DeviceSpec};
use super::plan::{ranges, TensorGroup};
use crate::{Error, Result};

/// Largest expert or layer number a list may name (lists are expanded into memory).
const MAX_INDEX: usize = 1 << 20;

/// One `-oe` value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpertOverride {
    /// The value as given.
    pub text: String,
    /// Blocks it applies to, sorted; `None`: every block with routed experts (`*`).
    pub layers: Option<Vec<usize>>,
    /// Experts, sorted, without repeats.
    pub experts: Vec<usize>,
    /// Device name.
    pub device: String,
}

impl ExpertOverride {
    /// Parse `LAYERS:EXPERTS=DEVICE`.
    pub fn parse(text: &str) -> Result<ExpertOverride> {
        let bad = |why: &str| {
            Error::Placement(format!(
                "-oe '{text}': {why} (expected LAYERS:EXPERTS=DEVICE, e.g. '3-5,12:0-7,40=CUDA0' \
                 or '*:0-3=sim0')"
            ))
        };
        let (left, device) = text.rsplit_once('=').ok_or_else(|| bad("no '='"))?;
        let (layers, experts) = left.split_once(':').ok_or_else(|| bad("no ':'"))?;
        let device = device.trim();
        if device.is_empty() {
            return Err(bad("no device after '='"));
        }
        let layers = match layers.trim() {
            "*" => None,
            l => Some(parse_list(l).map_err(|e| bad(&format!("layers: {e}")))?),
        };
        let experts = parse_list(experts.trim()).map_err(|e| bad(&format!("experts: {e}")))?;
        Ok(ExpertOverride {
            text: text.to_string(),
            layers,
            experts,
            device: device.to_string(),
        })
    }

    fn applies_to(&self, layer: usize) -> bool {
        self.layers
            .as_ref()
            .is_none_or(|l| l.binary_search(&layer).is_ok())
    }
}

/// `3,5-7` as [3, 5, 6, 7]: sorted, without repeats.
fn parse_list(text: &str) -> std::result::Result<Vec<usize>, String> {
    if text.is_empty() {
        return Err("empty list".into());
    }
    let num = |s: &str| -> std::result::Result<usize, String> {
        let n: usize = s
            .trim()
            .parse()
            .map_err(|_| format!("'{}' is not a number", s.trim()))?;
        if n > MAX_INDEX {
            return Err(format!("{n} is out of range"));
        }
        Ok(n)
    };
    let mut out = Vec::new();
    for part in text.split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b {
                    return Err(format!("range {a}-{b} runs backwards"));
                }
                out.extend(a..=b);
            }
            None => out.push(num(part)?),
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// How often each expert is chosen per decoded token, per layer (what `--fit --profile`
/// places hot experts by): from a routing profile's decode counts over its decoded tokens (or
/// both phases' where it saw no decode). A layer's rates sum to its top-k.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ExpertFrequencies(std::collections::BTreeMap<usize, Vec<f64>>);

impl ExpertFrequencies {
    pub fn from_profile(p: &crate::telemetry::RoutingProfile) -> ExpertFrequencies {
        use crate::telemetry::Phase;
        let mut out = std::collections::BTreeMap::new();
        for l in &p.layers {
            let decode = l.tokens[Phase::Decode as usize];
            let (counts, tokens) = if decode > 0 {
                (l.counts(Phase::Decode).to_vec(), decode)
            } else {
                (l.total_counts(), l.tokens.iter().sum())
            };
            if tokens > 0 {
                let rates = counts.iter().map(|&c| c as f64 / tokens as f64).collect();
                out.insert(l.layer, rates);
            }
        }
        ExpertFrequencies(out)
    }

    /// Every layer with rates, in order.
    pub fn layers(&self) -> impl Iterator<Item = (usize, &[f64])> {
        self.0.iter().map(|(&il, r)| (il, r.as_slice()))
    }

    /// Layer `il`'s rates, one per expert.
    pub fn get(&self, il: usize) -> Option<&[f64]> {
        self.0.get(&il).map(Vec::as_slice)
    }
}

/// Experts of one layer on another device than the rest of the layer's experts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpertSplit {
    pub layer: usize,
    /// Device (index into the plan's devices) of the layer's routed-expert tensors.
    pub from: usize,
    /// Device the listed experts go to.
    pub device: usize,
    /// Experts, sorted.
    pub experts: Vec<usize>,
    /// Of how many in the layer.
    pub n_expert: usize,
    /// Their gate, up and down weights.
    pub bytes: u64,
    /// The `-oe` value that placed them, or `--fit --profile`.
    pub flag: String,
}

impl ExpertSplit {
    /// `blk.5: experts 0-7, 12 (9 of 64, 36.0 MiB) on sim0 (-oe '...')`.
    pub fn describe(&self, devices: &[DeviceSpec]) -> String {
        // An -oe value starts with a layer or `*`; the fit's flag with `--`.
        let flag = if self.flag.starts_with("--") {
            self.flag.clone()
        } else {
            format!("-oe '{}'", self.flag)
        };
        format!(
            "blk.{}: experts {} ({} of {}, {}) on {} ({flag})",
            self.layer,
            ranges(&self.experts),
            self.experts.len(),
            self.n_expert,
            human_bytes(self.bytes),
            devices[self.device].name,
        )
    }
}

/// Apply the `-oe` flags to the placed tensors: for each layer with routed experts, the experts
/// each flag moves (not placed by an earlier flag, and not already on that device).
pub(super) fn split_experts(
    overrides: &[ExpertOverride],
    tensors: &[TensorInfo],
    groups: &[(Option<usize>, TensorGroup)],
    placed: &[Option<usize>],
    devices: &[DeviceSpec],
) -> Result<Vec<ExpertSplit>> {
    if overrides.is_empty() {
        return Ok(Vec::new());
    }
    // Each layer's routed-expert tensors: (device, n_expert, bytes).
    let mut layers: std::collections::BTreeMap<usize, (Option<usize>, usize, u64)> =
        Default::default();
    for ((t, &(layer, group)), &device) in tensors.iter().zip(groups).zip(placed) {
        let (Some(layer), TensorGroup::RoutedExperts, Some(device)) = (layer, group, device) else {
            continue;
        };
        let n_expert = t.dims.get(2).copied().unwrap_or(1).max(1) as usize;
        let e = layers.entry(layer).or_insert((Some(device), n_expert, 0));
        if e.0 != Some(device) {
            e.0 = None;
        }
        e.1 = e.1.min(n_expert);
        e.2 += t.n_bytes;
    }
    let device_of = |o: &ExpertOverride| {
        devices
            .iter()
            .position(|d| d.name == o.device)
            .ok_or_else(|| {
                let names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
                Error::Placement(format!(
                    "-oe '{}': no device '{}' (devices: {})",
                    o.text,
                    o.device,
                    names.join(", ")
                ))
            })
    };
    let targets: Vec<usize> = overrides.iter().map(device_of).collect::<Result<_>>()?;
    for o in overrides {
        for &l in o.layers.iter().flatten() {
            if !layers.contains_key(&l) {
                return Err(Error::Placement(format!(
                    "-oe '{}': layer {l} has no routed experts",
                    o.text
                )));
            }
        }
    }
    let mut out = Vec::new();
    for (&layer, &(from, n_expert, bytes)) in &layers {
        let mut claimed = vec![false; n_expert];
        for (o, &device) in overrides.iter().zip(&targets) {
            if !o.applies_to(layer) {
                continue;
            }
            if let Some(&e) = o.experts.iter().find(|&&e| e >= n_expert) {
                return Err(Error::Placement(format!(
                    "-oe '{}': layer {layer} has experts 0-{}, not {e}",
                    o.text,
                    n_expert - 1
                )));
            }
            let Some(from) = from else {
                return Err(Error::Placement(format!(
                    "-oe '{}': layer {layer}'s routed-expert tensors are on several devices; \
                     place them on one (-ot) to split them by expert",
                    o.text
                )));
            };
            let experts: Vec<usize> = o
                .experts
                .iter()
                .copied()
                .filter(|&e| !std::mem::replace(&mut claimed[e], true))
                .collect();
            if experts.is_empty() || device == from {
                continue;
            }
            out.push(ExpertSplit {
                layer,
                from,
                device,
                // Per expert rounded down, as the profile fit counts them.
                bytes: bytes / n_expert as u64 * experts.len() as u64,
                experts,
                n_expert,
                flag: o.text.clone(),
            });
        }
    }
    Ok(out)
}

/// What a plan with these splits cannot run yet: experts of one layer on two devices, experts
/// split off a layer whose others are not on the CPU, and experts on a device that runs CUDA
/// kernels but not the layer's router.
pub(super) fn unsupported(
    splits: &[ExpertSplit],
    devices: &[DeviceSpec],
    cpu: usize,
    layer_devices: &[Option<usize>],
) -> Vec<String> {
    let mut out = Vec::new();
    for (i, s) in splits.iter().enumerate() {
        if splits[..i]
            .iter()
            .any(|o| o.layer == s.layer && o.device != s.device)
        {
            out.push(format!(
                "{}: experts of blk.{} on two devices; per-expert placement takes one device \
                 per layer so far",
                s.describe(devices),
                s.layer
            ));
        }
        if s.from != cpu {
            out.push(format!(
                "{}: the layer's other experts are on {}; per-expert placement splits experts \
                 off a layer whose routed experts are on the CPU (add -ot exps=CPU)",
                s.describe(devices),
                devices[s.from].name
            ));
        }
        let layer_device = layer_devices.get(s.layer).copied().flatten();
        if devices[s.device].runs_cuda_kernels() && layer_device != Some(s.device) {
            // The GPU computes its experts' share with the routes it made: the layer's router
            // must run there.
            out.push(format!(
                "{}: experts on a GPU run there with their layer's router, and blk.{} runs on {} \
                 (give the layer to {} with -ngl, or place its experts on a sim)",
                s.describe(devices),
                s.layer,
                layer_device.map_or("no device", |d| devices[d].name.as_str()),
                devices[s.device].name
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_parse_into_sorted_lists() {
        let o = ExpertOverride::parse("5-7,3:12,0-3,2=CUDA0").unwrap();
        assert_eq!(o.layers, Some(vec![3, 5, 6, 7]));
        assert_eq!(o.experts, vec![0, 1, 2, 3, 12]);
        assert_eq!(o.device, "CUDA0");
        let o = ExpertOverride::parse("*:0=sim1").unwrap();
        assert_eq!(o.layers, None);
        assert!(o.applies_to(40));
    }

    #[test]
    fn bad_values_say_what_is_wrong() {
        for (text, says) in [
            ("3:0-7", "no '='"),
            ("3=CUDA0", "no ':'"),
            ("3:0-7=", "no device"),
            ("3:7-0=sim0", "runs backwards"),
            ("x:0=sim0", "'x' is not a number"),
            (":0=sim0", "empty list"),
            ("3:0-99999999999=sim0", "out of range"),
        ] {
            let e = ExpertOverride::parse(text).unwrap_err().to_string();
            assert!(e.contains(text) && e.contains(says), "{text}: {e}");
        }
    }
}
