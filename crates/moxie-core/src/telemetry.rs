//! Routing telemetry (issue 19): per MoE layer and expert, how many tokens selected it and the
//! routing weight they gave it, split by prompt batches (prefill) and single tokens (decode).
//! Always on: one relaxed atomic add per selection and per weight, from the thread that routed
//! the layer. A [`RoutingProfile`] is a snapshot of the counters as plain numbers: written as
//! JSON (atomically: a temporary file renamed over the old one), read back and merged, so a
//! server's profile accumulates across restarts.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{json, Value};

use crate::{Error, Result};

/// Routing weights are summed as fixed point with this many fraction bits (an `AtomicU64`
/// holds 2^44 weights of 1.0; a weight's rounding error is below 1e-6).
const MASS_FRACTION_BITS: u32 = 20;

/// Which kind of pass a selection came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// A batch of several tokens (a prompt).
    Prefill = 0,
    /// One token (generation).
    Decode = 1,
}

impl Phase {
    /// The phase of a pass over `n` tokens.
    pub fn of_batch(n: usize) -> Phase {
        if n > 1 {
            Phase::Prefill
        } else {
            Phase::Decode
        }
    }

    const ALL: [Phase; 2] = [Phase::Prefill, Phase::Decode];

    fn name(self) -> &'static str {
        match self {
            Phase::Prefill => "prefill",
            Phase::Decode => "decode",
        }
    }
}

/// One MoE layer's counters, per phase.
struct LayerCounters {
    tokens: [AtomicU64; 2],
    /// Selections per expert.
    counts: [Vec<AtomicU64>; 2],
    /// Routing weight per expert, fixed point.
    mass: [Vec<AtomicU64>; 2],
}

impl LayerCounters {
    fn new(n_expert: usize) -> LayerCounters {
        let zeros = || (0..n_expert).map(|_| AtomicU64::new(0)).collect::<Vec<_>>();
        LayerCounters {
            tokens: [AtomicU64::new(0), AtomicU64::new(0)],
            counts: [zeros(), zeros()],
            mass: [zeros(), zeros()],
        }
    }
}

/// The live counters of a model: one entry per layer (`None` for layers without routed
/// experts).
pub struct RoutingStats {
    arch: String,
    n_expert: usize,
    layers: Vec<Option<LayerCounters>>,
}

impl RoutingStats {
    /// Counters for the layers `moe` marks as MoE layers, `n_expert` experts each.
    pub fn new(arch: &str, n_expert: usize, moe: impl IntoIterator<Item = bool>) -> RoutingStats {
        RoutingStats {
            arch: arch.to_owned(),
            n_expert,
            layers: moe
                .into_iter()
                .map(|is_moe| is_moe.then(|| LayerCounters::new(n_expert)))
                .collect(),
        }
    }

    /// Count `n_tok` tokens' routes of layer `il` (top-k `(expert, weight)` per token, token
    /// after token). Routes naming an expert out of range are not counted.
    pub fn record(&self, il: usize, phase: Phase, n_tok: usize, routes: &[(usize, f32)]) {
        let Some(Some(l)) = self.layers.get(il) else {
            return;
        };
        let p = phase as usize;
        l.tokens[p].fetch_add(n_tok as u64, Ordering::Relaxed);
        for &(e, w) in routes {
            if e < self.n_expert {
                l.counts[p][e].fetch_add(1, Ordering::Relaxed);
                let fixed = (w.max(0.0) as f64 * (1u64 << MASS_FRACTION_BITS) as f64).round();
                l.mass[p][e].fetch_add(fixed as u64, Ordering::Relaxed);
            }
        }
    }

    /// The counters now, as plain numbers.
    pub fn snapshot(&self) -> RoutingProfile {
        let scale = 1.0 / (1u64 << MASS_FRACTION_BITS) as f64;
        let layers = self
            .layers
            .iter()
            .enumerate()
            .filter_map(|(il, l)| {
                let l = l.as_ref()?;
                let load = |v: &[AtomicU64]| v.iter().map(|a| a.load(Ordering::Relaxed)).collect();
                Some(LayerProfile {
                    layer: il,
                    tokens: [0, 1].map(|p| l.tokens[p].load(Ordering::Relaxed)),
                    counts: [0, 1].map(|p| load(&l.counts[p])),
                    mass: [0, 1].map(|p| {
                        l.mass[p]
                            .iter()
                            .map(|a| a.load(Ordering::Relaxed) as f64 * scale)
                            .collect()
                    }),
                })
            })
            .collect();
        RoutingProfile {
            arch: self.arch.clone(),
            n_expert: self.n_expert,
            layers,
        }
    }
}

/// One layer of a [`RoutingProfile`]: per phase (prefill, decode) the tokens routed, and per
/// expert the selections and the routing weight.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerProfile {
    pub layer: usize,
    pub tokens: [u64; 2],
    pub counts: [Vec<u64>; 2],
    pub mass: [Vec<f64>; 2],
}

impl LayerProfile {
    /// Selections of `phase` per expert.
    pub fn counts(&self, phase: Phase) -> &[u64] {
        &self.counts[phase as usize]
    }

    /// The fewest experts that took `share` (0..=1) of the layer's selections in `phase`
    /// (both phases when `None`): how concentrated its routing is.
    pub fn experts_for_share(&self, phase: Option<Phase>, share: f64) -> usize {
        let mut c: Vec<u64> = match phase {
            Some(p) => self.counts[p as usize].clone(),
            None => self.counts[0]
                .iter()
                .zip(&self.counts[1])
                .map(|(a, b)| a + b)
                .collect(),
        };
        let total: u64 = c.iter().sum();
        if total == 0 {
            return 0;
        }
        c.sort_unstable_by(|a, b| b.cmp(a));
        let want = share * total as f64;
        let mut acc = 0u64;
        for (i, &x) in c.iter().enumerate() {
            acc += x;
            if acc as f64 >= want {
                return i + 1;
            }
        }
        c.len()
    }
}

/// Routing counters as numbers: what `moxie serve --profile-out` writes.
#[derive(Clone, Debug, PartialEq)]
pub struct RoutingProfile {
    pub arch: String,
    pub n_expert: usize,
    pub layers: Vec<LayerProfile>,
}

impl RoutingProfile {
    pub fn to_json(&self) -> Value {
        let layers: Vec<Value> = self
            .layers
            .iter()
            .map(|l| {
                let mut v = json!({ "layer": l.layer });
                for p in Phase::ALL {
                    let i = p as usize;
                    v[p.name()] = json!({
                        "tokens": l.tokens[i],
                        "counts": l.counts[i],
                        "mass": l.mass[i],
                    });
                }
                v
            })
            .collect();
        json!({
            "format": "moxie-routing-profile",
            "version": 1,
            "arch": self.arch,
            "n_expert": self.n_expert,
            "layers": layers,
        })
    }

    /// A profile written by [`RoutingProfile::to_json`]; `what` names it in errors.
    pub fn from_json(v: &Value, what: &str) -> Result<RoutingProfile> {
        let bad = |why: String| Error::Model(format!("{what}: not a moxie routing profile: {why}"));
        if v["format"] != "moxie-routing-profile" || v["version"] != 1 {
            return Err(bad("format/version".into()));
        }
        let n_expert = v["n_expert"]
            .as_u64()
            .ok_or_else(|| bad("n_expert".into()))? as usize;
        let arch = v["arch"].as_str().ok_or_else(|| bad("arch".into()))?;
        let layers = v["layers"]
            .as_array()
            .ok_or_else(|| bad("layers".into()))?
            .iter()
            .map(|l| {
                let layer = l["layer"].as_u64().ok_or_else(|| bad("layer".into()))? as usize;
                let phase = |p: Phase| -> Result<(u64, Vec<u64>, Vec<f64>)> {
                    let o = &l[p.name()];
                    let tokens = o["tokens"].as_u64().ok_or_else(|| bad("tokens".into()))?;
                    let nums = |key: &str| {
                        o[key]
                            .as_array()
                            .filter(|a| a.len() == n_expert)
                            .ok_or_else(|| bad(format!("layer {layer} {}.{key}", p.name())))
                    };
                    let counts = nums("counts")?
                        .iter()
                        .map(|x| x.as_u64().ok_or_else(|| bad("a count".into())))
                        .collect::<Result<_>>()?;
                    let mass = nums("mass")?
                        .iter()
                        .map(|x| x.as_f64().ok_or_else(|| bad("a mass".into())))
                        .collect::<Result<_>>()?;
                    Ok((tokens, counts, mass))
                };
                let (t0, c0, m0) = phase(Phase::Prefill)?;
                let (t1, c1, m1) = phase(Phase::Decode)?;
                Ok(LayerProfile {
                    layer,
                    tokens: [t0, t1],
                    counts: [c0, c1],
                    mass: [m0, m1],
                })
            })
            .collect::<Result<_>>()?;
        Ok(RoutingProfile {
            arch: arch.to_owned(),
            n_expert,
            layers,
        })
    }

    /// Add `other`'s counters (the same model's: arch, experts and layers must agree).
    pub fn merge(&mut self, other: &RoutingProfile) -> Result<()> {
        let same_layers = self.layers.len() == other.layers.len()
            && self
                .layers
                .iter()
                .zip(&other.layers)
                .all(|(a, b)| a.layer == b.layer);
        if self.arch != other.arch || self.n_expert != other.n_expert || !same_layers {
            return Err(Error::Model(format!(
                "routing profiles of different models ({} with {} experts and {} MoE layers, \
                 {} with {} and {})",
                self.arch,
                self.n_expert,
                self.layers.len(),
                other.arch,
                other.n_expert,
                other.layers.len()
            )));
        }
        for (a, b) in self.layers.iter_mut().zip(&other.layers) {
            for p in 0..2 {
                a.tokens[p] += b.tokens[p];
                a.counts[p]
                    .iter_mut()
                    .zip(&b.counts[p])
                    .for_each(|(x, y)| *x += y);
                a.mass[p]
                    .iter_mut()
                    .zip(&b.mass[p])
                    .for_each(|(x, y)| *x += y);
            }
        }
        Ok(())
    }

    /// Write to `path` atomically: a temporary file beside it, then renamed over it, so a
    /// reader (or a crash) never sees half a profile.
    pub fn write_atomic(&self, path: &Path) -> Result<()> {
        let io = |e: std::io::Error| Error::Model(format!("writing {}: {e}", path.display()));
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let text = serde_json::to_string(&self.to_json()).expect("a JSON value serialises");
        std::fs::write(&tmp, text).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            io(e)
        })
    }

    /// The profile at `path`, or `None` where there is no file.
    pub fn read(path: &Path) -> Result<Option<RoutingProfile>> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::Model(format!("reading {}: {e}", path.display()))),
        };
        let what = path.display().to_string();
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| Error::Model(format!("{what}: not JSON: {e}")))?;
        RoutingProfile::from_json(&v, &what).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats() -> RoutingStats {
        // Layer 0 dense, layers 1 and 2 with 4 experts.
        RoutingStats::new("test", 4, [false, true, true])
    }

    #[test]
    fn selections_and_mass_are_counted_per_layer_and_phase() {
        let s = stats();
        s.record(
            1,
            Phase::Prefill,
            2,
            &[(0, 0.75), (3, 0.25), (0, 0.5), (1, 0.5)],
        );
        s.record(1, Phase::Decode, 1, &[(3, 1.0), (2, 0.0)]);
        s.record(0, Phase::Decode, 1, &[(3, 1.0)]); // a dense layer: nothing
        s.record(2, Phase::Decode, 1, &[(9, 1.0)]); // out of range: not counted
        let p = s.snapshot();
        assert_eq!(p.layers.len(), 2);
        let l1 = &p.layers[0];
        assert_eq!((l1.layer, l1.tokens), (1, [2, 1]));
        assert_eq!(l1.counts(Phase::Prefill), [2, 1, 0, 1]);
        assert_eq!(l1.counts(Phase::Decode), [0, 0, 1, 1]);
        assert_eq!(l1.mass[0], [1.25, 0.5, 0.0, 0.25]);
        assert_eq!(l1.experts_for_share(None, 0.5), 2);
        assert_eq!(l1.experts_for_share(Some(Phase::Prefill), 0.5), 1);
        assert_eq!(p.layers[1].counts(Phase::Decode), [0, 0, 0, 0]);
    }

    #[test]
    fn profiles_round_trip_merge_and_refuse_other_models() {
        let s = stats();
        s.record(2, Phase::Prefill, 1, &[(1, 0.5), (2, 0.5)]);
        let a = s.snapshot();
        let dir = std::env::temp_dir().join(format!("moxie-profile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("p.json");
        assert_eq!(RoutingProfile::read(&path).unwrap(), None);
        a.write_atomic(&path).unwrap();
        let back = RoutingProfile::read(&path).unwrap().unwrap();
        assert_eq!(back, a);
        let mut twice = back.clone();
        twice.merge(&a).unwrap();
        assert_eq!(twice.layers[1].counts(Phase::Prefill), [0, 2, 2, 0]);
        assert_eq!(twice.layers[1].tokens, [2, 0]);
        let other = RoutingStats::new("test", 8, [true]).snapshot();
        assert!(twice
            .merge(&other)
            .unwrap_err()
            .to_string()
            .contains("different models"));
        std::fs::write(&path, "{\"format\": 3}").unwrap();
        let err = RoutingProfile::read(&path).unwrap_err().to_string();
        assert!(
            err.contains("p.json") && err.contains("not a moxie routing profile"),
            "{err}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
