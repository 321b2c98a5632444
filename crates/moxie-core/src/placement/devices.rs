//! The devices a plan places tensors on, their memory budgets, and byte sizes as users write
//! them (`24GiB`, `512MiB`, `24GB`).

use crate::{Error, Result};

/// What kind of memory a device is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    /// Host RAM (llama.cpp's `CPU` buffer type). Weights there stay memory-mapped.
    Cpu,
    /// A CUDA GPU (`CUDA0`, `CUDA1`, ...).
    Cuda,
    /// A simulated GPU (`sim0`, `sim1`, ...): its own budget, computes on the CPU.
    Sim,
}

impl DeviceKind {
    pub fn name(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Cuda => "cuda",
            DeviceKind::Sim => "sim",
        }
    }

    /// GPUs and simulated GPUs: what `-ngl`, `-sm` and `-ts` distribute layers over.
    pub fn is_gpu(self) -> bool {
        self != DeviceKind::Cpu
    }
}

/// One device and how many bytes the plan may put on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceSpec {
    /// The name `-ot` rules use (`CPU`, `CUDA0`, `sim1`).
    pub name: String,
    pub kind: DeviceKind,
    pub budget_bytes: u64,
}

impl DeviceSpec {
    pub fn cpu(budget_bytes: u64) -> DeviceSpec {
        DeviceSpec {
            name: "CPU".to_owned(),
            kind: DeviceKind::Cpu,
            budget_bytes,
        }
    }

    pub fn cuda(index: usize, budget_bytes: u64) -> DeviceSpec {
        DeviceSpec {
            name: format!("CUDA{index}"),
            kind: DeviceKind::Cuda,
            budget_bytes,
        }
    }

    /// A simulated device standing for `CUDA{index}` (`MOXIE_SIM_CUDA`): placed and counted
    /// as that GPU would be, computing on the CPU.
    pub fn simulated_cuda(index: usize, budget_bytes: u64) -> DeviceSpec {
        DeviceSpec {
            name: format!("CUDA{index}"),
            kind: DeviceKind::Sim,
            budget_bytes,
        }
    }

    /// Whether the plan is for CUDA kernels on this device: a CUDA GPU, or a simulated one
    /// standing for it (`MOXIE_SIM_CUDA`'s `CUDA{i}`; other simulated devices are `sim{i}`),
    /// so that a rehearsal meets what the real GPU would refuse.
    pub fn runs_cuda_kernels(&self) -> bool {
        self.kind == DeviceKind::Cuda
            || (self.kind == DeviceKind::Sim && self.name.starts_with("CUDA"))
    }

    pub fn sim(index: usize, budget_bytes: u64) -> DeviceSpec {
        DeviceSpec {
            name: format!("sim{index}"),
            kind: DeviceKind::Sim,
            budget_bytes,
        }
    }
}

/// The CPU first, then CUDA devices, then simulated ones, in the order given. The GPU order is
/// llama.cpp's device order: `-ts` proportions and `-mg` indices refer to it.
pub fn device_list(ram_bytes: u64, cuda_budgets: &[u64], sim_budgets: &[u64]) -> Vec<DeviceSpec> {
    let mut devices = vec![DeviceSpec::cpu(ram_bytes)];
    devices.extend(
        cuda_budgets
            .iter()
            .enumerate()
            .map(|(i, &b)| DeviceSpec::cuda(i, b)),
    );
    devices.extend(
        sim_budgets
            .iter()
            .enumerate()
            .map(|(i, &b)| DeviceSpec::sim(i, b)),
    );
    devices
}

/// A byte size: plain bytes (`1073741824`), binary units (`24GiB`, `24G`, `512MiB`, `512M`,
/// `64KiB`, `2TiB`) or decimal ones (`24GB`, `512MB`, `64KB`, `2TB`), case-insensitive, with
/// an optional fraction (`1.5GiB`) and an optional `B` after a bare number.
pub fn parse_size(text: &str) -> Result<u64> {
    let s = text.trim();
    let bad = |why: &str| {
        Error::Placement(format!(
            "bad size '{text}': {why} (examples: 24GiB, 24G, 512MiB, 24GB, 1073741824)"
        ))
    };
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    if number.is_empty() {
        return Err(bad("no number"));
    }
    let unit = unit.trim().to_ascii_lowercase();
    let scale: u64 = match unit.as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return Err(bad(&format!("unknown unit '{unit}'"))),
    };
    let bytes = match number.split_once('.') {
        None => number
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(scale))
            .ok_or_else(|| bad("too large"))?,
        Some((whole, frac)) => {
            if frac.contains('.') || (whole.is_empty() && frac.is_empty()) {
                return Err(bad("not a number"));
            }
            let x: f64 = number.parse().map_err(|_| bad("not a number"))?;
            let bytes = (x * scale as f64).round();
            if !(0.0..1.8e19).contains(&bytes) {
                return Err(bad("too large"));
            }
            bytes as u64
        }
    };
    Ok(bytes)
}

/// A comma-separated list of sizes (`--gpu 24GiB,48GiB`).
pub fn parse_size_list(text: &str) -> Result<Vec<u64>> {
    text.split(',').map(parse_size).collect()
}

/// The machine's RAM (`MemTotal` of `/proc/meminfo`), or `None` where it cannot be read.
pub fn system_memory_bytes() -> Option<u64> {
    meminfo_bytes("MemTotal")
}

/// The memory the system can give without swapping (`MemAvailable` of `/proc/meminfo`: free
/// plus what the page cache can drop), or `None` where it cannot be read.
pub fn available_memory_bytes() -> Option<u64> {
    meminfo_bytes("MemAvailable")
}

/// Field `key` of `/proc/meminfo` (in kB there) in bytes.
fn meminfo_bytes(key: &str) -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

/// Bytes as GiB (MiB below one GiB, KiB below one MiB, bytes below one KiB) for messages and
/// tables.
pub fn human_bytes(bytes: u64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    const MIB: f64 = (1u64 << 20) as f64;
    if bytes >= 1 << 30 {
        format!("{:.2} GiB", bytes as f64 / GIB)
    } else if bytes >= 1 << 20 || bytes == 0 {
        format!("{:.1} MiB", bytes as f64 / MIB)
    } else if bytes >= 1 << 10 {
        format!("{:.1} KiB", bytes as f64 / 1024.0)
    } else {
        format!("{bytes} B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_in_binary_and_decimal_units() {
        assert_eq!(parse_size("24GiB").unwrap(), 24 << 30);
        assert_eq!(parse_size("24G").unwrap(), 24 << 30);
        assert_eq!(parse_size("24gib").unwrap(), 24 << 30);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("24GB").unwrap(), 24_000_000_000);
        assert_eq!(parse_size("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_size("1073741824").unwrap(), 1 << 30);
        assert_eq!(parse_size("100B").unwrap(), 100);
        assert_eq!(parse_size(" 2TiB ").unwrap(), 2 << 40);
        assert_eq!(
            parse_size_list("24GiB,48GiB").unwrap(),
            [24 << 30, 48 << 30]
        );
    }

    #[test]
    fn bad_sizes_are_errors_naming_the_text() {
        for bad in [
            "",
            "GiB",
            "24XB",
            "1.2.3G",
            "-5G",
            ".G",
            "99999999999999999999",
        ] {
            let e = parse_size(bad).unwrap_err().to_string();
            assert!(e.contains(&format!("'{bad}'")), "{e}");
        }
        assert!(parse_size("20000000TiB").is_err());
        assert!(parse_size_list("24GiB,,8GiB").is_err());
    }

    #[test]
    fn device_names_follow_llama_cpp() {
        let d = device_list(1 << 30, &[2, 3], &[4]);
        let names: Vec<&str> = d.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["CPU", "CUDA0", "CUDA1", "sim0"]);
        assert_eq!(d[3].budget_bytes, 4);
        assert!(d[3].kind.is_gpu() && !d[0].kind.is_gpu());
    }
}
