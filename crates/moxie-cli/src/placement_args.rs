//! The placement flags (llama.cpp's `-ot`, `--cpu-moe`, `--n-cpu-moe`, `-ngl`, `-sm`, `-ts`,
//! `-mg`, plus the devices and `--fit`), one group any command can flatten.

use anyhow::{bail, Context, Result};
use clap::parser::ValueSource;
use clap::ArgMatches;
use moxie_core::placement::{
    device_list, parse_size, parse_size_list, system_memory_bytes, DeviceSpec, ExpertCacheRequest,
    ExpertFrequencies, ExpertOverride, PlacementArg, PlacementOptions, SplitMode,
};

#[derive(clap::Args)]
pub struct PlacementArgs {
    /// Put tensors whose name matches REGEX on device BUF (also `-ot`): "REGEX=BUF[,...]";
    /// repeatable; the first matching rule wins, in command-line order with --cpu-moe and
    /// --n-cpu-moe. BUF: CPU, CUDA0, CUDA1, ..., sim0, sim1, ...
    #[arg(long = "override-tensor", value_name = "REGEX=BUF,...")]
    pub override_tensor: Vec<String>,
    /// Put routed experts on a device one by one (also `-oe`): "LAYERS:EXPERTS=DEVICE", e.g.
    /// "3-5,12:0-7,40=sim0" or "*:0-3=sim0" (every MoE layer); repeatable, earlier flags win
    /// an expert. The layers' other experts stay where -ot/-ngl put them (the CPU). On a GPU,
    /// the layer's router must run there (-ngl).
    #[arg(long = "override-experts", value_name = "LAYERS:EXPERTS=DEVICE")]
    pub override_experts: Vec<String>,
    /// With --fit: a routing profile (`moxie profile`, `serve --profile-out`) by which the fit
    /// places hot routed experts one by one where that takes more expected reads per decoded
    /// token off the CPU than whole expert layers do (on a GPU, of the layers it runs); with
    /// --expert-cache, the experts the cache starts with.
    #[arg(long = "profile", value_name = "FILE")]
    pub profile: Option<std::path::PathBuf>,
    /// Keep every routed expert on the CPU (also `-cmoe`).
    #[arg(long = "cpu-moe")]
    pub cpu_moe: bool,
    /// Keep the routed experts of blocks 0..N on the CPU (also `-ncmoe`).
    #[arg(long = "n-cpu-moe", value_name = "N")]
    pub n_cpu_moe: Option<usize>,
    /// Layer slots on GPUs, counted back from the output layer (also `-ngl`): a number or
    /// `all` (default: all when a GPU is given).
    #[arg(long = "n-gpu-layers", value_name = "N|all")]
    pub n_gpu_layers: Option<String>,
    /// How layers spread over GPUs (also `-sm`): layer (by -ts or by budget) or none (the
    /// -mg GPU only).
    #[arg(long = "split-mode", value_name = "none|layer", default_value = "layer",
          value_parser = split_mode)]
    pub split_mode: SplitMode,
    /// Layer proportions per GPU (also `-ts`), e.g. 3,1 (default: by budget).
    #[arg(long = "tensor-split", value_name = "A,B,...")]
    pub tensor_split: Option<String>,
    /// The GPU -sm none uses (also `-mg`), an index among the GPUs.
    #[arg(long = "main-gpu", value_name = "I", default_value_t = 0)]
    pub main_gpu: usize,
    /// CUDA devices by memory budget, named CUDA0, CUDA1, ... (e.g. 24GiB,24GiB).
    #[arg(long = "gpu", value_name = "SIZE,...")]
    pub gpu: Option<String>,
    /// Simulated GPUs by memory budget, named sim0, sim1, ... (e.g. 8GiB,4GiB).
    #[arg(long = "sim", value_name = "SIZE,...")]
    pub sim: Option<String>,
    /// RAM budget for CPU weights, KV cache and buffers (default: the machine's MemTotal).
    #[arg(long = "ram", value_name = "SIZE")]
    pub ram: Option<String>,
    /// Fill each device's budget around the rules (always-used weights and KV first, then
    /// whole routed-expert layers) instead of llama.cpp's fixed assignment.
    #[arg(long)]
    pub fit: bool,
    /// A dynamic VRAM expert cache: every MoE layer whose experts are in RAM (on a CUDA GPU:
    /// those whose router runs there, by -ngl) gets an equal share of SIZE (`auto`: what the
    /// device has left) on --expert-cache-device; decode steps compute resident experts there
    /// and bring in the ones they missed, evicting by --expert-cache-policy. With --profile,
    /// the cache starts with the profile's most chosen experts.
    #[arg(long = "expert-cache", value_name = "SIZE|auto")]
    pub expert_cache: Option<String>,
    /// What the expert cache evicts: lru (least recently selected), lfu (least often) or
    /// decay (the fewest selections, each halved every 8 tokens since).
    #[arg(
        long = "expert-cache-policy",
        value_name = "lru|lfu|decay",
        default_value = "lru"
    )]
    pub expert_cache_policy: String,
    /// The device holding the expert cache (default: the first GPU or sim).
    #[arg(long = "expert-cache-device", value_name = "DEVICE")]
    pub expert_cache_device: Option<String>,
    /// Stream RAM-resident routed experts to the GPU running their layer's router for prompt
    /// batches of at least N tokens (llama.cpp's op offload): `auto` measures the threshold
    /// after loading (copy rate vs the CPU's expert time), `off`, or a token count.
    #[arg(long = "op-offload", value_name = "auto|off|N", default_value = "auto")]
    pub op_offload: String,
    /// The most GPU memory op offload holds for the experts it streams at a time (default:
    /// what the GPU has free after the plan's headroom). Experts stream in chunks of as many
    /// as fit; with room for none the CPU computes them.
    #[arg(long = "op-offload-buffer", value_name = "SIZE")]
    pub op_offload_buffer: Option<String>,
    /// Keep the weights in GGUF row order. By default, weight matrices read only by the CPU
    /// (routed experts routed there, attention, dense and shared FFNs, the output head) have
    /// their rows interleaved at load time (Q4_K, Q5_K, Q6_K, Q8_0, Q4_0 and Q5_0 so far) for the
    /// fast one-token kernels, as ik_llama.cpp's -rtr does; a file written by `moxie quantize --repack` stores them so
    /// already. --exact never repacks (both put stored interleaved rows back in GGUF order).
    #[arg(long = "no-repack")]
    pub no_repack: bool,
}

/// A `-sm` value.
fn split_mode(s: &str) -> std::result::Result<SplitMode, String> {
    SplitMode::parse(s).map_err(|e| e.to_string())
}

impl PlacementArgs {
    /// The options, with `-ot` / `--cpu-moe` / `--n-cpu-moe` in command-line order, which
    /// `matches` (this command's) records.
    pub fn options(&self, matches: &ArgMatches) -> Result<PlacementOptions> {
        let on_command_line = |id: &str| matches.value_source(id) == Some(ValueSource::CommandLine);
        let mut args: Vec<(usize, PlacementArg)> = Vec::new();
        if let Some(indices) = matches.indices_of("override_tensor") {
            for (index, value) in indices.zip(&self.override_tensor) {
                args.push((index, PlacementArg::OverrideTensor(value.clone())));
            }
        }
        if self.cpu_moe && on_command_line("cpu_moe") {
            let index = matches
                .index_of("cpu_moe")
                .context("position of --cpu-moe")?;
            args.push((index, PlacementArg::CpuMoe));
        }
        if let Some(n) = self.n_cpu_moe {
            let index = matches
                .index_of("n_cpu_moe")
                .context("position of --n-cpu-moe")?;
            args.push((index, PlacementArg::NCpuMoe(n)));
        }
        args.sort_by_key(|(index, _)| *index);

        let n_gpu_layers = match self.n_gpu_layers.as_deref() {
            None | Some("all") => None,
            Some(n) => Some(
                n.parse::<usize>()
                    .with_context(|| format!("-ngl '{n}': expected a number of layers or 'all'"))?,
            ),
        };
        let tensor_split = match &self.tensor_split {
            None => Vec::new(),
            // llama.cpp splits on runs of ',' and '/'.
            Some(ts) => ts
                .split([',', '/'])
                .filter(|p| !p.is_empty())
                .map(|p| {
                    p.trim()
                        .parse::<f32>()
                        .with_context(|| format!("-ts '{ts}': '{p}' is not a number"))
                })
                .collect::<Result<_>>()?,
        };
        Ok(PlacementOptions {
            args: args.into_iter().map(|(_, a)| a).collect(),
            n_gpu_layers,
            split_mode: self.split_mode,
            tensor_split,
            main_gpu: self.main_gpu,
            fit: self.fit,
            expert_priority: None,
            expert_overrides: self
                .override_experts
                .iter()
                .map(|v| ExpertOverride::parse(v))
                .collect::<moxie_core::Result<_>>()?,
            expert_profile: self.expert_profile()?,
            expert_cache: self
                .expert_cache
                .as_deref()
                .map(|size| {
                    ExpertCacheRequest::parse(
                        size,
                        &self.expert_cache_policy,
                        self.expert_cache_device.as_deref(),
                    )
                })
                .transpose()?,
        })
    }

    /// CPU (RAM budget), then `--gpu` devices (without `--gpu`: the CUDA GPUs found, each
    /// with its free memory; under `MOXIE_SIM_CUDA`: simulated devices named `CUDA0`, ...
    /// with its budgets), then `--sim` devices.
    pub fn devices(&self) -> Result<Vec<DeviceSpec>> {
        let ram = match &self.ram {
            Some(s) => parse_size(s)?,
            None => match system_memory_bytes() {
                Some(b) => b,
                None => bail!("cannot read the machine's memory size (/proc/meminfo); pass --ram"),
            },
        };
        let simulated = moxie_core::placement::simulated_cuda_budgets()?;
        let gpus = match (&self.gpu, &simulated) {
            (Some(_), Some(_)) => bail!(
                "--gpu and {} both give the CUDA devices' budgets: use one",
                moxie_core::placement::SIM_CUDA_ENV
            ),
            (Some(s), None) => parse_size_list(s)?,
            (None, Some(_)) => Vec::new(),
            (None, None) => moxie_core::placement::detected_cuda_budgets()?,
        };
        let sims = match &self.sim {
            Some(s) => parse_size_list(s)?,
            None => Vec::new(),
        };
        // As llama.cpp: `-ngl` without a GPU to take the layers warns, and the CPU runs them.
        if gpus.is_empty() && sims.is_empty() && simulated.is_none() {
            if let Some(n) = self.n_gpu_layers.as_deref().filter(|n| *n != "0") {
                eprintln!(
                    "warning: -ngl {n}, but no GPU was found: {}; every layer runs on the CPU",
                    moxie_core::placement::no_cuda_reason()
                );
            }
        }
        let mut devices = device_list(ram, &gpus, &sims);
        // Simulated CUDA devices come where real ones would: first after the CPU.
        let simulated = simulated.unwrap_or_default().into_iter().enumerate();
        devices.splice(
            1..1,
            simulated.map(|(i, b)| DeviceSpec::simulated_cuda(i, b)),
        );
        Ok(devices)
    }

    /// `--profile`'s expert rates (it needs `--fit`).
    fn expert_profile(&self) -> Result<Option<ExpertFrequencies>> {
        let Some(path) = &self.profile else {
            return Ok(None);
        };
        if !self.fit && self.expert_cache.is_none() {
            bail!("--profile places experts with --fit or seeds --expert-cache; add one of them");
        }
        let p = moxie_core::telemetry::RoutingProfile::read(path)?
            .with_context(|| format!("--profile {}: no such file", path.display()))?;
        Ok(Some(ExpertFrequencies::from_profile(&p)))
    }
}
