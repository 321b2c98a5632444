//! Where weights, KV cache and activations live, and what crossing between places costs.
//!
//! Device 0 is always the CPU (host RAM, mmap'd weights). Others are accelerators with their
//! own memory budget. A `sim` device behaves like one — weights placed on it are copied into its
//! memory, which is checked against its budget, and activations reach it only by explicit,
//! counted copies — but computes with the CPU kernels, so placement, transfers and budgets run
//! in CI without a GPU and must give the all-CPU logits bit for bit.
//!
//! The forward pass runs each stage of a layer (attention; the FFN's norm, router and shared
//! expert; the routed experts) on the device holding that stage's weights, and moves only the
//! hidden state (and the routing) between them, as llama.cpp's scheduler splits a graph.
//!
//! A GPU device (a CUDA GPU, or the CPU emulator of one that tests use) holds its weights,
//! KV cache and activations in device memory and runs its stages with the kernels of
//! `moxie-gpu`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use moxie_gpu::{Buffer, DevPtr, Gpu};

use crate::placement::human_bytes;
use crate::{Error, Result};

/// Index of a device in a model's [`Devices`]; [`CPU`] is the host.
pub type DeviceId = usize;

/// The host: RAM and the CPU kernels.
pub const CPU: DeviceId = 0;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    Cpu,
    /// A simulated accelerator (own memory, counted transfers, CPU compute).
    Sim,
    /// A GPU: device memory and GPU kernels.
    Gpu,
}

/// What one device has seen: bytes resident now and at most, the copies that crossed its
/// boundary (host to device and back), in calls and bytes, and the routed-expert weights it
/// read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceStats {
    pub resident_bytes: u64,
    pub peak_bytes: u64,
    pub copies_in: u64,
    pub bytes_in: u64,
    pub copies_out: u64,
    pub bytes_out: u64,
    /// Bytes of routed-expert weights its MoE layers read, by [`crate::telemetry::Phase`]
    /// (prompt batches, one-token decode): each selected expert's gate, up and down once per
    /// pass. Counted where the routes are on the host (the CPU and simulated devices, and
    /// GPU-resident experts of a layer routed elsewhere); a GPU that routes its own experts
    /// counts nothing here (its routes stay on it: see the routing telemetry).
    pub expert_bytes: [u64; 2],
}

/// One place memory lives.
#[derive(Debug)]
pub struct Device {
    pub name: String,
    pub kind: DeviceKind,
    /// Bytes it may hold (`None`: the host, whose limit is the machine's).
    pub budget: Option<u64>,
    /// The GPU, for [`DeviceKind::Gpu`].
    pub gpu: Option<Gpu>,
    resident: AtomicU64,
    peak: AtomicU64,
    copies_in: AtomicU64,
    bytes_in: AtomicU64,
    copies_out: AtomicU64,
    bytes_out: AtomicU64,
    expert_bytes: [AtomicU64; 2],
}

impl Device {
    fn new(name: &str, kind: DeviceKind, budget: Option<u64>) -> Device {
        Device {
            name: name.to_string(),
            kind,
            budget,
            gpu: None,
            resident: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            copies_in: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            copies_out: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
            expert_bytes: [AtomicU64::new(0), AtomicU64::new(0)],
        }
    }

    pub fn stats(&self) -> DeviceStats {
        DeviceStats {
            resident_bytes: self.resident.load(Ordering::Relaxed),
            peak_bytes: self.peak.load(Ordering::Relaxed),
            copies_in: self.copies_in.load(Ordering::Relaxed),
            bytes_in: self.bytes_in.load(Ordering::Relaxed),
            copies_out: self.copies_out.load(Ordering::Relaxed),
            bytes_out: self.bytes_out.load(Ordering::Relaxed),
            expert_bytes: [0, 1].map(|i| self.expert_bytes[i].load(Ordering::Relaxed)),
        }
    }

    fn count_in(&self, bytes: usize) {
        self.copies_in.fetch_add(1, Ordering::Relaxed);
        self.bytes_in.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    fn count_out(&self, bytes: usize) {
        self.copies_out.fetch_add(1, Ordering::Relaxed);
        self.bytes_out.fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

/// `bytes` of a device's memory, given back when dropped.
#[derive(Debug)]
pub struct Reservation {
    device: Arc<Device>,
    bytes: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.device
            .resident
            .fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// The devices a model is placed on: the CPU first, then accelerators in the order their
/// names were given.
#[derive(Clone, Debug)]
pub struct Devices(Vec<Arc<Device>>);

impl Default for Devices {
    fn default() -> Self {
        Devices::cpu_only()
    }
}

impl Devices {
    pub fn cpu_only() -> Devices {
        Devices(vec![Arc::new(Device::new("CPU", DeviceKind::Cpu, None))])
    }

    /// The CPU plus simulated devices `sim0`, `sim1`, ... with these budgets in bytes.
    pub fn with_sims(budgets: &[u64]) -> Devices {
        let mut d = Devices::cpu_only();
        d.push_sims(budgets);
        d
    }

    /// Add simulated devices `sim0`, `sim1`, ... with these budgets in bytes.
    pub fn push_sims(&mut self, budgets: &[u64]) {
        for (i, &b) in budgets.iter().enumerate() {
            self.push_sim(&format!("sim{i}"), b);
        }
    }

    /// Add a simulated device called `name` (`sim0`, or `CUDA0` under `MOXIE_SIM_CUDA`) with
    /// a budget in bytes.
    pub fn push_sim(&mut self, name: &str, budget: u64) {
        self.0
            .push(Arc::new(Device::new(name, DeviceKind::Sim, Some(budget))));
    }

    /// Add a GPU with a memory budget (its name is the GPU's: `CUDA0`, ...).
    pub fn push_gpu(&mut self, gpu: Gpu, budget: u64) -> DeviceId {
        let mut d = Device::new(gpu.name(), DeviceKind::Gpu, Some(budget));
        d.gpu = Some(gpu);
        self.0.push(Arc::new(d));
        self.0.len() - 1
    }

    /// The GPU of device `id`, if it is one.
    pub fn gpu(&self, id: DeviceId) -> Option<&Gpu> {
        self.0[id].gpu.as_ref()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn get(&self, id: DeviceId) -> &Device {
        &self.0[id]
    }

    pub fn iter(&self) -> impl Iterator<Item = &Device> {
        self.0.iter().map(|d| &**d)
    }

    /// The device called `name` (as placement rules spell it).
    pub fn by_name(&self, name: &str) -> Result<DeviceId> {
        self.0.iter().position(|d| d.name == name).ok_or_else(|| {
            let names: Vec<&str> = self.0.iter().map(|d| d.name.as_str()).collect();
            Error::Model(format!(
                "unknown device '{name}'; devices: {}",
                names.join(", ")
            ))
        })
    }

    /// Take `bytes` of device `id`'s memory for `what`, or fail naming the device, the
    /// request and what is left. The host is not limited here (its weights are mmap'd).
    pub fn reserve(&self, id: DeviceId, bytes: u64, what: &str) -> Result<Reservation> {
        let device = &self.0[id];
        let now = device.resident.fetch_add(bytes, Ordering::Relaxed) + bytes;
        if let Some(budget) = device.budget {
            if now > budget {
                device.resident.fetch_sub(bytes, Ordering::Relaxed);
                return Err(Error::Model(format!(
                    "{}: out of memory placing {what}: {} needed, {} of its {} budget already \
                     in use (plan with `moxie plan` or place less on it)",
                    device.name,
                    human_bytes(bytes),
                    human_bytes(now - bytes),
                    human_bytes(budget)
                )));
            }
        }
        device.peak.fetch_max(now, Ordering::Relaxed);
        Ok(Reservation {
            device: Arc::clone(device),
            bytes,
        })
    }

    /// Copy `src` (on device `from`) into `dst` (on device `to`), counting the crossing: out of
    /// `from` and into `to` (a copy between two accelerators goes through the host, so it
    /// counts on both).
    pub fn copy(&self, from: DeviceId, src: &[f32], to: DeviceId, dst: &mut Vec<f32>) {
        dst.clear();
        dst.extend_from_slice(src);
        self.count_copy(from, to, std::mem::size_of_val(src));
    }

    /// Count `bytes` moved from device `from` to device `to` (nothing when they are the same).
    pub fn count_copy(&self, from: DeviceId, to: DeviceId, bytes: usize) {
        if from == to {
            return;
        }
        if from != CPU {
            self.0[from].count_out(bytes);
        }
        if to != CPU {
            self.0[to].count_in(bytes);
        }
    }

    /// `bytes` of routed-expert weights read on device `id` by a pass of `phase`.
    pub fn count_expert_reads(&self, id: DeviceId, phase: crate::telemetry::Phase, bytes: u64) {
        self.0[id].expert_bytes[phase as usize].fetch_add(bytes, Ordering::Relaxed);
    }

    /// Every device's counters.
    pub fn stats(&self) -> Vec<(String, DeviceStats)> {
        self.0.iter().map(|d| (d.name.clone(), d.stats())).collect()
    }
}

/// A row buffer (the hidden state) that lives on one device at a time: reading it on another
/// device copies it there first, counted, and the copy on the old device is stale from then on.
/// Every device keeps its own buffer (host vectors for the CPU and sims, device memory for
/// GPUs), so a stage that read a stale copy would compute with old values and the logits
/// would show it.
pub struct Resident<'d> {
    devices: &'d Devices,
    bufs: Vec<Vec<f32>>,
    gpu_bufs: Vec<Option<Buffer>>,
    /// Values held (on whichever device).
    len: usize,
    on: DeviceId,
}

impl<'d> Resident<'d> {
    /// `rows` on device `on` (a host-side device).
    pub fn new(devices: &'d Devices, on: DeviceId, rows: Vec<f32>) -> Resident<'d> {
        let mut bufs = vec![Vec::new(); devices.len()];
        let len = rows.len();
        bufs[on] = rows;
        Resident {
            devices,
            bufs,
            gpu_bufs: (0..devices.len()).map(|_| None).collect(),
            len,
            on,
        }
    }

    /// Replace the rows with `rows`, written on host-side device `on` (no crossing), reusing
    /// that device's buffer.
    pub fn load(&mut self, on: DeviceId, rows: &[f32]) {
        let buf = &mut self.bufs[on];
        buf.clear();
        buf.extend_from_slice(rows);
        self.len = rows.len();
        self.on = on;
    }

    /// Replace the rows with what `write` puts into host-side device `on`'s buffer (no
    /// crossing; the buffer's allocation is reused).
    pub fn fill(
        &mut self,
        on: DeviceId,
        write: impl FnOnce(&mut Vec<f32>) -> Result<()>,
    ) -> Result<()> {
        let buf = &mut self.bufs[on];
        write(buf)?;
        self.len = buf.len();
        self.on = on;
        Ok(())
    }

    /// Mark the rows as now written in GPU `on`'s buffer (by kernels), `len` values.
    pub fn loaded_on_gpu(&mut self, on: DeviceId, len: usize) -> Result<DevPtr> {
        self.len = len;
        self.on = on;
        self.gpu_buffer(on)
    }

    /// GPU `id`'s buffer, grown to hold the rows.
    fn gpu_buffer(&mut self, id: DeviceId) -> Result<DevPtr> {
        let bytes = self.len * 4;
        let slot = &mut self.gpu_bufs[id];
        if slot.as_ref().is_none_or(|b| b.len() < bytes) {
            let gpu = self.devices.gpu(id).expect("a GPU device");
            *slot = Some(Buffer::new(gpu.backend(), bytes)?);
        }
        Ok(slot.as_ref().expect("allocated above").ptr())
    }

    fn is_gpu(&self, id: DeviceId) -> bool {
        self.devices.get(id).kind == DeviceKind::Gpu
    }

    /// Bring the rows to device `to` (a copy, counted, if they were elsewhere; between two
    /// GPUs through the host).
    fn move_to(&mut self, to: DeviceId) -> Result<()> {
        let from = self.on;
        if to == from {
            return Ok(());
        }
        let bytes = self.len * 4;
        // To the host side first (the source itself if it is one).
        let host = if self.is_gpu(from) {
            let mut staged = std::mem::take(&mut self.bufs[CPU]);
            staged.resize(self.len, 0.0);
            let buf = self.gpu_bufs[from]
                .as_ref()
                .expect("rows on a GPU have its buffer");
            buf.read_f32(0, &mut staged)?;
            self.bufs[CPU] = staged;
            CPU
        } else {
            from
        };
        if self.is_gpu(to) {
            self.gpu_buffer(to)?;
            let buf = self.gpu_bufs[to].as_ref().expect("allocated above");
            buf.write_f32(0, &self.bufs[host][..self.len])?;
        } else if host != to {
            let (src, dst) = pair_mut(&mut self.bufs, host, to);
            dst.clear();
            dst.extend_from_slice(&src[..self.len]);
        }
        self.devices.count_copy(from, to, bytes);
        self.on = to;
        Ok(())
    }

    /// The rows on host-side device `to` (copied there if they were elsewhere).
    pub fn on(&mut self, to: DeviceId) -> Result<&mut Vec<f32>> {
        debug_assert!(!self.is_gpu(to), "host rows asked of a GPU");
        self.move_to(to)?;
        Ok(&mut self.bufs[to])
    }

    /// The rows' address on GPU `to` (copied there if they were elsewhere).
    pub fn on_gpu(&mut self, to: DeviceId) -> Result<DevPtr> {
        debug_assert!(self.is_gpu(to), "device rows asked of a host-side device");
        self.move_to(to)?;
        self.gpu_buffer(to)
    }

    /// Where the rows are now.
    pub fn device(&self) -> DeviceId {
        self.on
    }
}

/// Two distinct elements of `v`, the first shared.
fn pair_mut<T>(v: &mut [T], a: usize, b: usize) -> (&T, &mut T) {
    assert_ne!(a, b, "pair_mut: same index");
    if a < b {
        let (lo, hi) = v.split_at_mut(b);
        (&lo[a], &mut hi[0])
    } else {
        let (lo, hi) = v.split_at_mut(a);
        (&hi[0], &mut lo[b])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_are_checked_against_the_budget_and_given_back() {
        let d = Devices::with_sims(&[1000]);
        let a = d.reserve(1, 600, "a").unwrap();
        let err = d
            .reserve(1, 500, "blk.0.attn_q.weight")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("sim0") && err.contains("blk.0.attn_q.weight"),
            "{err}"
        );
        assert_eq!(d.get(1).stats().resident_bytes, 600);
        drop(a);
        let _b = d.reserve(1, 1000, "b").unwrap();
        assert_eq!(d.get(1).stats().peak_bytes, 1000);
        // The host is not budgeted here.
        let _c = d.reserve(CPU, u64::MAX / 2, "c").unwrap();
    }

    #[test]
    fn resident_rows_move_by_counted_copies() {
        let d = Devices::with_sims(&[1 << 20, 1 << 20]);
        let mut x = Resident::new(&d, CPU, vec![1.0, 2.0]);
        x.on(CPU).unwrap()[0] = 5.0;
        assert_eq!(d.get(1).stats().copies_in, 0);
        x.on(1).unwrap()[1] = 7.0;
        assert_eq!(x.on(2).unwrap(), &vec![5.0, 7.0]);
        assert_eq!(x.on(CPU).unwrap(), &vec![5.0, 7.0]);
        let (s1, s2) = (d.get(1).stats(), d.get(2).stats());
        assert_eq!((s1.copies_in, s1.bytes_in, s1.copies_out), (1, 8, 1));
        assert_eq!((s2.copies_in, s2.copies_out, s2.bytes_out), (1, 1, 8));
        assert!(d.by_name("sim7").unwrap_err().to_string().contains("sim0"));
    }
}
