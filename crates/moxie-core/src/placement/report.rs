//! A plan as JSON and as readable tables, the same for every command that prints one.

use serde_json::{json, Value};

use super::devices::human_bytes;
use super::plan::{ranges, LayerPlacement, Plan};
use super::rules::RuleOrigin;
use crate::inventory::Role;
use crate::state::kv_type_name;

impl Plan {
    fn device_name(&self, d: usize) -> &str {
        &self.devices[d].spec.name
    }

    fn spread_json(&self, list: &[(usize, u64)]) -> Value {
        list.iter()
            .map(|&(d, b)| json!({"device": self.device_name(d), "bytes": b}))
            .collect()
    }

    /// Everything in the plan as JSON: `devices[]`, `tensors[]`, `layers[]`, `rules[]`,
    /// `fits`, `unsupported[]`, `messages[]` and the settings it was made for.
    pub fn to_json(&self) -> Value {
        let devices: Vec<Value> = self
            .devices
            .iter()
            .map(|d| {
                json!({
                    "name": d.spec.name,
                    "kind": d.spec.kind.name(),
                    "budget_bytes": d.spec.budget_bytes,
                    "weights_bytes": d.weights_bytes,
                    "kv_bytes": d.kv_bytes,
                    "state_bytes": d.state_bytes,
                    "compute_bytes": d.compute_bytes,
                    "headroom_bytes": d.headroom_bytes,
                    "total_bytes": d.total_bytes(),
                    "free_bytes": d.free_bytes() as i64,
                    "fits": d.fits(),
                })
            })
            .collect();
        let layers: Vec<Value> = self
            .layers
            .iter()
            .map(|l| {
                json!({
                    "layer": l.layer,
                    "kind": l.kind.name(),
                    "device": l.device.map(|d| self.device_name(d)),
                    "kv_bytes": l.kv_bytes,
                    "state_bytes": l.state_bytes,
                    "always_used": self.spread_json(&l.always_used),
                    "experts": self.spread_json(&l.experts),
                })
            })
            .collect();
        let rules: Vec<Value> = self
            .rules
            .iter()
            .enumerate()
            .map(|(i, r)| {
                json!({
                    "rule": i + 1,
                    "flag": r.origin.flag(),
                    "pattern": r.pattern,
                    "device": self.device_name(r.device),
                    "tensors": r.tensors,
                    "bytes": r.bytes,
                })
            })
            .collect();
        let tensors: Vec<Value> = self
            .tensors
            .iter()
            .map(|t| {
                json!({
                    "name": t.name,
                    "layer": t.layer,
                    "group": t.group.name(),
                    "role": t.role.name(),
                    "device": t.device.map(|d| self.device_name(d)),
                    "bytes": t.bytes,
                    "reason": self.describe(t.reason),
                })
            })
            .collect();
        json!({
            "arch": self.arch,
            "n_block": self.n_block,
            "n_nextn": self.n_nextn,
            "fit": self.fit_mode,
            "split_mode": self.split_mode.name(),
            "n_gpu_layers": self.n_gpu_layers,
            "n_ctx": self.n_ctx,
            "kv_positions": self.kv_positions,
            "n_seq": self.n_seq,
            "n_ubatch": self.n_ubatch,
            "cache_type_k": kv_type_name(self.kv_types.k),
            "cache_type_v": kv_type_name(self.kv_types.v),
            "fits": self.fits,
            "unsupported": self.unsupported,
            "output_device": self.device_name(self.output_device),
            "devices": devices,
            "layers": layers,
            "rules": rules,
            "tensors": tensors,
            "messages": self.messages,
            "expert_splits": self.expert_splits.iter().map(|e| serde_json::json!({
                "layer": e.layer,
                "device": self.device_name(e.device),
                "from": self.device_name(e.from),
                "experts": e.experts,
                "n_expert": e.n_expert,
                "bytes": e.bytes,
                "flag": e.flag,
            })).collect::<Vec<_>>(),
            "expert_cache": self.expert_cache.as_ref().map(|c| serde_json::json!({
                "device": self.device_name(c.device),
                "policy": c.policy.name(),
                "bytes": c.bytes,
                "layers": c.layers.iter().map(|&(layer, experts, expert_bytes)| serde_json::json!({
                    "layer": layer, "experts": experts, "expert_bytes": expert_bytes,
                })).collect::<Vec<_>>(),
            })),
        })
    }

    /// Devices, rules, layers (consecutive blocks placed alike on one line) and messages as
    /// text tables.
    pub fn report(&self) -> String {
        let mut out = String::new();
        let mode = if self.fit_mode {
            format!("--fit (like -ngl {})", self.n_gpu_layers)
        } else {
            format!(
                "llama.cpp's assignment (-ngl {}, -sm {})",
                self.n_gpu_layers,
                self.split_mode.name()
            )
        };
        out.push_str(&format!(
            "{}: {} blocks{}; context {} (KV {} positions{}, {}/{}), ubatch {}; {mode}\n",
            self.arch,
            self.n_block,
            if self.n_nextn > 0 {
                format!(" ({} nextn, not loaded)", self.n_nextn)
            } else {
                String::new()
            },
            self.n_ctx,
            self.kv_positions,
            if self.n_seq > 1 {
                format!(" x {} sequences", self.n_seq)
            } else {
                String::new()
            },
            kv_type_name(self.kv_types.k),
            kv_type_name(self.kv_types.v),
            self.n_ubatch,
        ));
        out.push_str(if self.fits {
            "fits: yes\n"
        } else {
            "fits: NO\n"
        });
        for u in &self.unsupported {
            out.push_str(&format!("cannot run: {u}\n"));
        }
        out.push('\n');

        // The "state" column (indexer keys, recurrent state) only for models that keep any.
        let state = self.has_state();
        let mut header = vec!["device", "budget", "weights", "KV"];
        if state {
            header.push("state");
        }
        header.extend(["compute", "headroom", "total", "free"]);
        let mut rows = vec![row(&header)];
        for d in &self.devices {
            let free = d.free_bytes();
            let mut cells = vec![
                d.spec.name.clone(),
                human_bytes(d.spec.budget_bytes),
                human_bytes(d.weights_bytes),
                human_bytes(d.kv_bytes),
            ];
            if state {
                cells.push(human_bytes(d.state_bytes));
            }
            cells.extend([
                human_bytes(d.compute_bytes),
                human_bytes(d.headroom_bytes),
                human_bytes(d.total_bytes()),
                if free < 0 {
                    format!("-{} OVER", human_bytes(free.unsigned_abs() as u64))
                } else {
                    human_bytes(free as u64)
                },
            ]);
            rows.push(cells);
        }
        out.push_str(&table(&rows));

        if !self.rules.is_empty() {
            out.push_str("\nrules (first match wins):\n");
            out.push_str(&self.rules_table());
        }

        out.push_str("\nlayers:\n");
        out.push_str(&self.layers_table());

        if !self.expert_splits.is_empty() {
            out.push_str("\nexperts placed one by one (also kept in RAM):\n");
            let specs: Vec<_> = self.devices.iter().map(|d| d.spec.clone()).collect();
            for e in &self.expert_splits {
                out.push_str(&format!("- {}\n", e.describe(&specs)));
            }
        }

        if !self.messages.is_empty() {
            out.push_str("\nmessages:\n");
            for m in &self.messages {
                out.push_str(&format!("- {m}\n"));
            }
        }
        out
    }

    fn rules_table(&self) -> String {
        let mut rows = vec![row(&[
            "rule", "from", "pattern", "device", "tensors", "bytes",
        ])];
        let mut i = 0;
        while i < self.rules.len() {
            let r = &self.rules[i];
            // --n-cpu-moe N is N rules; one line for all of them.
            if let RuleOrigin::NCpuMoe { n, .. } = r.origin {
                let group = self.rules[i..]
                    .iter()
                    .take_while(|q| matches!(q.origin, RuleOrigin::NCpuMoe { n: m, .. } if m == n))
                    .count()
                    .min(n.max(1));
                let rs = &self.rules[i..i + group];
                rows.push(vec![
                    format!("{}-{}", i + 1, i + group),
                    r.origin.flag(),
                    format!(
                        "blk\\.{{0..{}}}{}",
                        n.saturating_sub(1),
                        super::EXPERTS_PATTERN
                    ),
                    self.device_name(r.device).to_owned(),
                    rs.iter().map(|q| q.tensors).sum::<usize>().to_string(),
                    human_bytes(rs.iter().map(|q| q.bytes).sum()),
                ]);
                i += group;
                continue;
            }
            rows.push(vec![
                (i + 1).to_string(),
                r.origin.flag(),
                r.pattern.clone(),
                self.device_name(r.device).to_owned(),
                r.tensors.to_string(),
                human_bytes(r.bytes),
            ]);
            i += 1;
        }
        table(&rows)
    }

    fn spread_text(&self, list: &[(usize, u64)]) -> String {
        if list.is_empty() {
            return "-".into();
        }
        list.iter()
            .map(|&(d, b)| format!("{} {}", self.device_name(d), human_bytes(b)))
            .collect::<Vec<_>>()
            .join(" + ")
    }

    /// Whether any layer keeps indexer keys or recurrent state.
    fn has_state(&self) -> bool {
        self.layers.iter().any(|l| l.state_bytes > 0)
    }

    fn layers_table(&self) -> String {
        // The roles the always-used column holds in this model, in role order.
        let mut roles: Vec<Role> = self
            .tensors
            .iter()
            .filter(|t| t.group == super::TensorGroup::AlwaysUsed)
            .map(|t| t.role)
            .collect();
        roles.sort_unstable();
        roles.dedup();
        let names: Vec<&str> = roles.iter().map(|r| r.name()).collect();
        let always_used = format!("always-used ({})", names.join(", "));
        let state = self.has_state();
        let mut header = vec![
            "blocks",
            "kind",
            "layer on",
            always_used.as_str(),
            "routed experts",
            "KV",
        ];
        if state {
            header.push("state (indexer keys, recurrent)");
        }
        let mut rows = vec![row(&header)];
        let key = |l: &LayerPlacement| {
            let devs = |v: &[(usize, u64)]| v.iter().map(|&(d, _)| d).collect::<Vec<_>>();
            // Layers with and without attention rows or state (qwen3next's recurrent and
            // full-attention layers) on lines of their own.
            let keeps = (l.kv_bytes > 0, l.state_bytes > 0);
            (
                l.kind,
                l.device,
                devs(&l.always_used),
                devs(&l.experts),
                keeps,
            )
        };
        let mut i = 0;
        while i < self.layers.len() {
            let k = key(&self.layers[i]);
            let mut j = i + 1;
            while j < self.layers.len() && key(&self.layers[j]) == k {
                j += 1;
            }
            let group = &self.layers[i..j];
            let sum = |pick: fn(&LayerPlacement) -> &Vec<(usize, u64)>| {
                let mut acc: Vec<(usize, u64)> = Vec::new();
                for l in group {
                    for &(d, b) in pick(l) {
                        match acc.iter_mut().find(|(e, _)| *e == d) {
                            Some((_, s)) => *s += b,
                            None => acc.push((d, b)),
                        }
                    }
                }
                acc
            };
            let blocks: Vec<usize> = group.iter().map(|l| l.layer).collect();
            let first = &group[0];
            let mut cells = vec![
                ranges(&blocks),
                first.kind.name().to_owned(),
                first
                    .device
                    .map_or("unused".to_owned(), |d| self.device_name(d).to_owned()),
                self.spread_text(&sum(|l| &l.always_used)),
                self.spread_text(&sum(|l| &l.experts)),
                human_bytes(group.iter().map(|l| l.kv_bytes).sum()),
            ];
            if state {
                cells.push(human_bytes(group.iter().map(|l| l.state_bytes).sum()));
            }
            rows.push(cells);
            i = j;
        }
        let mut output: Vec<(usize, u64)> = Vec::new();
        let mut input: Vec<(usize, u64)> = Vec::new();
        for t in &self.tensors {
            let list = match t.group {
                super::TensorGroup::Output => &mut output,
                super::TensorGroup::Input => &mut input,
                _ => continue,
            };
            if let Some(d) = t.device {
                match list.iter_mut().find(|(e, _)| *e == d) {
                    Some((_, s)) => *s += t.bytes,
                    None => list.push((d, t.bytes)),
                }
            }
        }
        for (name, list, device) in [
            ("input", &input, None),
            ("output", &output, Some(self.output_device)),
        ] {
            if list.is_empty() {
                continue;
            }
            let mut cells = vec![
                name.to_owned(),
                String::new(),
                device.map_or("CPU".to_owned(), |d| self.device_name(d).to_owned()),
                self.spread_text(list),
                "-".into(),
                "-".into(),
            ];
            if state {
                cells.push("-".into());
            }
            rows.push(cells);
        }
        table(&rows)
    }
}

fn row(cells: &[&str]) -> Vec<String> {
    cells.iter().map(|c| c.to_string()).collect()
}

/// Left-aligned columns separated by two spaces.
fn table(rows: &[Vec<String>]) -> String {
    let n = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..n)
        .map(|c| {
            rows.iter()
                .map(|r| r.get(c).map_or(0, |s| s.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (c, cell) in r.iter().enumerate() {
            line.push_str(cell);
            if c + 1 < r.len() {
                let pad = widths[c] - cell.chars().count() + 2;
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}
