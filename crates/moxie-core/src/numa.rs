//! `--numa distribute|isolate|numactl` (llama.cpp's modes): which CPUs the worker threads are
//! pinned to, in which order, and where memory is allocated, from the machine's NUMA
//! topology (`/sys/devices/system/node/node*/cpulist`).
//!
//! - `distribute`: threads spread evenly over the nodes (the CPUs taken one per node in turn)
//!   and memory interleaved over them, so every node's memory bandwidth serves the weights.
//! - `isolate`: threads only on the CPUs of the node the process started on, memory
//!   preferred there.
//! - `numactl`: the CPUs the process was given (e.g. by `numactl --physcpubind`), in order;
//!   memory as numactl set it.

use std::path::Path;

use crate::{Error, Result};

/// A `--numa` mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NumaMode {
    Distribute,
    Isolate,
    Numactl,
}

impl NumaMode {
    /// As the flag spells it.
    pub fn name(self) -> &'static str {
        match self {
            NumaMode::Distribute => "distribute",
            NumaMode::Isolate => "isolate",
            NumaMode::Numactl => "numactl",
        }
    }

    pub fn parse(s: &str) -> Result<NumaMode> {
        match s {
            "distribute" => Ok(NumaMode::Distribute),
            "isolate" => Ok(NumaMode::Isolate),
            "numactl" => Ok(NumaMode::Numactl),
            _ => Err(Error::Model(format!(
                "--numa takes distribute, isolate or numactl, not '{s}'"
            ))),
        }
    }
}

/// The CPUs of each NUMA node, by node number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    pub nodes: Vec<(usize, Vec<usize>)>,
}

impl Topology {
    /// The topology under `root` (normally `/sys/devices/system/node`): one `nodeN/cpulist`
    /// per node. A machine without that directory is one node holding every CPU in
    /// `fallback`.
    pub fn read(root: &Path, fallback: &[usize]) -> Result<Topology> {
        let entries = match std::fs::read_dir(root) {
            Ok(e) => e,
            Err(_) => {
                return Ok(Topology {
                    nodes: vec![(0, fallback.to_vec())],
                })
            }
        };
        let mut nodes = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(n) = name.to_str().and_then(|n| n.strip_prefix("node")) else {
                continue;
            };
            let Ok(node) = n.parse::<usize>() else {
                continue;
            };
            let path = entry.path().join("cpulist");
            let text = std::fs::read_to_string(&path)
                .map_err(|e| Error::Model(format!("{}: {e}", path.display())))?;
            let cpus = parse_cpulist(text.trim())
                .map_err(|why| Error::Model(format!("{}: {why}", path.display())))?;
            nodes.push((node, cpus));
        }
        nodes.sort();
        if nodes.is_empty() {
            nodes.push((0, fallback.to_vec()));
        }
        Ok(Topology { nodes })
    }

    /// The node holding `cpu`.
    pub fn node_of(&self, cpu: usize) -> Option<usize> {
        self.nodes
            .iter()
            .find(|(_, cpus)| cpus.contains(&cpu))
            .map(|(n, _)| *n)
    }

    /// The CPUs threads are pinned to under `mode`, in order (the caller takes the first):
    /// only CPUs in `allowed` (the process's affinity); `current`: the CPU the process runs
    /// on now (for `isolate`).
    pub fn cpu_order(&self, mode: NumaMode, allowed: &[usize], current: usize) -> Vec<usize> {
        let on = |cpus: &[usize]| -> Vec<usize> {
            cpus.iter()
                .copied()
                .filter(|c| allowed.contains(c))
                .collect()
        };
        match mode {
            NumaMode::Numactl => allowed.to_vec(),
            NumaMode::Isolate => {
                let node = self.node_of(current);
                let cpus = self.nodes.iter().find(|(n, _)| Some(*n) == node);
                cpus.map_or_else(|| allowed.to_vec(), |(_, c)| on(c))
            }
            NumaMode::Distribute => {
                let per_node: Vec<Vec<usize>> = self.nodes.iter().map(|(_, c)| on(c)).collect();
                let longest = per_node.iter().map(Vec::len).max().unwrap_or(0);
                (0..longest)
                    .flat_map(|i| per_node.iter().filter_map(move |c| c.get(i).copied()))
                    .collect()
            }
        }
    }

    /// The nodes that have CPUs in `cpus`.
    pub fn nodes_of(&self, cpus: &[usize]) -> Vec<usize> {
        self.nodes
            .iter()
            .filter(|(_, c)| c.iter().any(|x| cpus.contains(x)))
            .map(|(n, _)| *n)
            .collect()
    }
}

/// `0-3,8,10-11` as CPU numbers.
pub fn parse_cpulist(text: &str) -> std::result::Result<Vec<usize>, String> {
    let mut cpus = Vec::new();
    if text.is_empty() {
        return Ok(cpus);
    }
    for part in text.split(',') {
        let num = |s: &str| {
            s.trim()
                .parse::<usize>()
                .map_err(|_| format!("bad CPU list '{text}' (at '{part}')"))
        };
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if b < a || b - a > 1 << 16 {
                    return Err(format!("bad CPU range '{part}' in '{text}'"));
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(num(part)?),
        }
    }
    Ok(cpus)
}

/// Apply `mode` to this process: the order the worker threads are pinned in (for pools made
/// after this call), the calling thread pinned to the first CPU of it, and the memory policy
/// (interleaved over the nodes used for `distribute`, preferred on the node for `isolate`).
/// Returns a line saying what was done.
pub fn apply(mode: NumaMode) -> Result<String> {
    let allowed = crate::spin_pool::allowed_cpus();
    let topo = Topology::read(Path::new("/sys/devices/system/node"), &allowed)?;
    let current = current_cpu().unwrap_or(allowed.first().copied().unwrap_or(0));
    let order = topo.cpu_order(mode, &allowed, current);
    if order.is_empty() {
        return Err(Error::Model(format!(
            "--numa {}: no CPU left to run on (allowed {allowed:?})",
            mode.name()
        )));
    }
    let nodes = topo.nodes_of(&order);
    crate::spin_pool::set_cpu_order(order.clone());
    crate::spin_pool::pin_current_thread(order[0]);
    let memory = match mode {
        NumaMode::Distribute if nodes.len() > 1 => set_memory_policy(MPOL_INTERLEAVE, &nodes),
        NumaMode::Isolate => set_memory_policy(MPOL_PREFERRED, &nodes),
        _ => Ok(()),
    };
    let memory = match (mode, memory) {
        (_, Err(e)) => format!("memory policy not set ({e})"),
        (NumaMode::Distribute, Ok(())) if nodes.len() > 1 => {
            format!("memory interleaved over nodes {nodes:?}")
        }
        (NumaMode::Isolate, Ok(())) => format!("memory preferred on node {nodes:?}"),
        _ => "memory policy unchanged".to_string(),
    };
    Ok(format!(
        "--numa {}: {} node(s) in the machine; threads pinned to CPUs {order:?} (nodes \
         {nodes:?}); {memory}",
        mode.name(),
        topo.nodes.len()
    ))
}

const MPOL_PREFERRED: i32 = 1;
const MPOL_INTERLEAVE: i32 = 3;

/// `set_mempolicy(mode, nodes)` for this process's future allocations.
fn set_memory_policy(mode: i32, nodes: &[usize]) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        let mut mask = [0u64; 16];
        for &n in nodes {
            if n >= 64 * mask.len() {
                return Err(std::io::Error::other(format!("node {n} out of range")));
            }
            mask[n / 64] |= 1 << (n % 64);
        }
        let maxnode = (64 * mask.len()) as libc::c_ulong;
        // SAFETY: set_mempolicy reads `maxnode` bits of the mask we own and changes only the
        // calling process's allocation policy.
        let r = unsafe {
            libc::syscall(
                libc::SYS_set_mempolicy,
                mode as libc::c_long,
                mask.as_ptr(),
                maxnode,
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (mode, nodes);
        Err(std::io::Error::other("only on Linux"))
    }
}

/// The CPU the calling thread runs on now.
fn current_cpu() -> Option<usize> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: sched_getcpu takes no arguments.
        let c = unsafe { libc::sched_getcpu() };
        usize::try_from(c).ok()
    }
    #[cfg(not(target_os = "linux"))]
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake `/sys/devices/system/node` with these cpulists.
    fn fake(nodes: &[(usize, &str)]) -> std::path::PathBuf {
        let root =
            std::env::temp_dir().join(format!("moxie-numa-{}-{}", std::process::id(), nodes.len()));
        let _ = std::fs::remove_dir_all(&root);
        for (n, list) in nodes {
            let dir = root.join(format!("node{n}"));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("cpulist"), format!("{list}\n")).unwrap();
        }
        std::fs::write(root.join("online"), "0-1\n").unwrap();
        root
    }

    #[test]
    fn two_nodes_distribute_isolate_and_numactl() {
        let root = fake(&[(0, "0-3"), (1, "4-7")]);
        let topo = Topology::read(&root, &[]).unwrap();
        assert_eq!(
            topo.nodes,
            vec![(0, vec![0, 1, 2, 3]), (1, vec![4, 5, 6, 7])]
        );
        let all: Vec<usize> = (0..8).collect();
        let d = topo.cpu_order(NumaMode::Distribute, &all, 0);
        assert_eq!(d, [0, 4, 1, 5, 2, 6, 3, 7]);
        assert_eq!(topo.nodes_of(&d), [0, 1]);
        // Started on CPU 5: node 1 only.
        assert_eq!(topo.cpu_order(NumaMode::Isolate, &all, 5), [4, 5, 6, 7]);
        // numactl --physcpubind=2,3,6: exactly those, in order.
        let given = [2, 3, 6];
        assert_eq!(topo.cpu_order(NumaMode::Numactl, &given, 2), given);
        // An affinity mask narrows distribute too.
        assert_eq!(
            topo.cpu_order(NumaMode::Distribute, &[1, 2, 5], 1),
            [1, 5, 2]
        );
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn uneven_nodes_cpu_lists_and_bad_input() {
        let root = fake(&[(0, "0-1,8-9"), (1, "2"), (2, "")]);
        let topo = Topology::read(&root, &[]).unwrap();
        assert_eq!(topo.nodes[0], (0, vec![0, 1, 8, 9]));
        let all = [0, 1, 2, 8, 9];
        assert_eq!(
            topo.cpu_order(NumaMode::Distribute, &all, 0),
            [0, 2, 1, 8, 9]
        );
        std::fs::write(root.join("node1/cpulist"), "2-x\n").unwrap();
        let e = Topology::read(&root, &[]).unwrap_err().to_string();
        assert!(e.contains("node1/cpulist") && e.contains("2-x"), "{e}");
        std::fs::remove_dir_all(&root).unwrap();
        // No node directory: one node of the given CPUs.
        let topo = Topology::read(&root, &[0, 1]).unwrap();
        assert_eq!(topo.nodes, vec![(0, vec![0, 1])]);
        assert!(parse_cpulist("3-1").is_err());
        assert!(NumaMode::parse("mirror").is_err());
    }
}
