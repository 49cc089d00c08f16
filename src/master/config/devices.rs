//! The device and GPU memory: `--device`, `--gpu-memory-utilization`,
//! `--gpu-reserve-mb`, `--max-worker-gpu-mb`, the GPU-memory ledger (`--ledger`) and giving the
//! reservation back when idle (`--idle-release`), NVML
//! (`--nvml-library`, `--simulated-gpus`), the GPUs the operator made visible
//! (`CUDA_VISIBLE_DEVICES`) and the operator's settings of PyTorch's CUDA allocator that
//! bear on the cap ([`AllocatorEnv`]).

use std::path::{Path, PathBuf};

use super::checker::{absolute, Checker};
use super::ConfigError;
use crate::master::cli::Cli;
use crate::protocol::Device;

/// This group's defaults (rendered into `--help` by `config::command`).
pub(super) const DEFAULTS: &[(&str, &str)] = &[
    ("--device", "auto"),
    ("--gpu-reserve-mb", "500"),
    ("--ledger", crate::master::host::ledger::DEFAULT_DIR),
];

/// Where the model runs and how much of each GPU the plan may take.
#[derive(Debug, Clone)]
pub struct Gpu {
    pub device: Device,
    pub gpu_memory_utilization: Option<f64>,
    pub gpu_reserve_mb: u64,
    pub max_worker_gpu_mb: Option<u64>,
    /// `--ledger`: the GPU-memory ledger's directory; `None`: off.
    pub ledger: Option<PathBuf>,
    pub nvml_library: Option<PathBuf>,
    /// `--simulated-gpus`: GPU workers run on the CPU (tests with tests/nvml-mock).
    pub simulated_gpus: bool,
    /// The operator's `CUDA_VISIBLE_DEVICES`, when set: only those GPUs are planned
    /// (`resources::visible`).
    pub cuda_visible_devices: Option<String>,
    /// The operator's allocator settings that bear on the cap.
    pub allocator: AllocatorEnv,
    /// `--idle-release`: how long workers on GPUs may go without a request before they
    /// are retired and the reservation given back; `None`: never.
    pub idle_release: Option<std::time::Duration>,
}

impl Gpu {
    pub(super) fn check(cli: &Cli, c: &Checker<'_>) -> Result<Gpu, ConfigError> {
        let device = match c.value("--device", cli.device.as_deref()) {
            "auto" => Device::Auto,
            "cpu" => Device::Cpu,
            "cuda" => Device::Cuda,
            d => return Err(c.bad("--device", d, "expected auto, cpu or cuda")),
        };
        let gpu_memory_utilization = match cli.gpu_memory_utilization.as_deref() {
            None => None,
            Some(v) => match v.trim().parse::<f64>() {
                Ok(f) if f > 0.0 && f <= 1.0 => Some(f),
                _ => {
                    return Err(c.bad(
                        "--gpu-memory-utilization",
                        v,
                        "expected a fraction greater than 0 and at most 1 (e.g. 0.9)",
                    ))
                }
            },
        };
        let max_worker_gpu_mb = match cli.max_worker_gpu_mb.as_deref() {
            None => None,
            Some(v) => Some(c.uint_given("--max-worker-gpu-mb", v, 1)?),
        };
        let idle_release = match cli.idle_release.as_deref().map(str::trim) {
            None | Some("off") => None,
            v => c.seconds_or_off("--idle-release", v)?,
        };
        Ok(Gpu {
            device,
            gpu_memory_utilization,
            gpu_reserve_mb: c.uint("--gpu-reserve-mb", cli.gpu_reserve_mb.as_deref(), 0)?,
            max_worker_gpu_mb,
            ledger: ledger(cli, c)?,
            nvml_library: nvml_library(cli.nvml_library.clone(), cli.simulated_gpus, c)?,
            simulated_gpus: cli.simulated_gpus,
            cuda_visible_devices: (c.env)("CUDA_VISIBLE_DEVICES"),
            allocator: AllocatorEnv::read(c.env)?,
            idle_release,
        })
    }
}

/// `--ledger`: a directory, or `off` (`None`).
fn ledger(cli: &Cli, c: &Checker<'_>) -> Result<Option<PathBuf>, ConfigError> {
    let v = match &cli.ledger {
        Some(v) => v.to_string_lossy().into_owned(),
        None => c.value("--ledger", None).to_string(),
    };
    match v.trim() {
        "off" => Ok(None),
        "" => Err(c.bad("--ledger", &v, "expected a directory, or off")),
        d => Ok(Some(absolute(Path::new(d)))),
    }
}

/// `--nvml-library` (an existing file), and `--simulated-gpus` only with it.
fn nvml_library(
    v: Option<std::ffi::OsString>,
    simulated_gpus: bool,
    c: &Checker<'_>,
) -> Result<Option<PathBuf>, ConfigError> {
    let nvml_library = v.map(|p| absolute(Path::new(&p)));
    if let Some(p) = &nvml_library {
        if !p.is_file() {
            return Err(c.bad(
                "--nvml-library",
                &p.display().to_string(),
                "no such file (expected the path of libnvidia-ml.so.1 or a compatible library)",
            ));
        }
    }
    if simulated_gpus && nvml_library.is_none() {
        return Err(c.bad(
                "--simulated-gpus",
                "true",
                "it is for tests with a simulated NVML: give --nvml-library too (on real GPUs it would serve on the CPU)",
            ));
    }
    Ok(nvml_library)
}

/// The operator's settings of PyTorch's CUDA allocator that bear on the per-worker cap, as
/// torch 2.11 reads them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AllocatorEnv {
    /// `PYTORCH_NO_CUDA_MEMORY_CACHING=1`: the caching allocator is off (torch's
    /// `check_env`: only "1" turns it on), so there is no cap and no statistics.
    pub uncached: bool,
    /// `per_process_memory_fraction` (new in torch 2.11) in the variable torch's CUDA
    /// allocator reads (`PYTORCH_CUDA_ALLOC_CONF`, else `PYTORCH_ALLOC_CONF`:
    /// `c10/cuda/CUDAAllocatorConfig.h`), with that variable's name.
    pub fraction: Option<(f64, &'static str)>,
}

impl AllocatorEnv {
    pub(super) fn read(env: &dyn Fn(&str) -> Option<String>) -> Result<AllocatorEnv, ConfigError> {
        let uncached = env("PYTORCH_NO_CUDA_MEMORY_CACHING").as_deref() == Some("1");
        let var = ["PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"]
            .into_iter()
            .find_map(|name| env(name).map(|v| (name, v)));
        let mut fraction = None;
        if let Some((name, conf)) = var {
            for (key, value) in conf.split(',').filter_map(|kv| kv.split_once(':')) {
                if key.trim() != "per_process_memory_fraction" {
                    continue;
                }
                match value.trim().parse::<f64>() {
                    Ok(f) if f > 0.0 && f <= 1.0 => fraction = Some((f, name)),
                    Ok(0.0) => {
                        return Err(ConfigError(format!(
                            "{name}={conf}: per_process_memory_fraction 0 leaves a worker no GPU memory (every load would fail); give a fraction above 0 and at most 1, or leave it out"
                        )))
                    }
                    _ => {
                        return Err(ConfigError(format!(
                            "{name}={conf}: per_process_memory_fraction '{}' is not a fraction from 0 to 1 (torch refuses it too)",
                            value.trim()
                        )))
                    }
                }
            }
        }
        Ok(AllocatorEnv { uncached, fraction })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(conf: &str) -> Result<AllocatorEnv, ConfigError> {
        let conf = conf.to_string();
        AllocatorEnv::read(&|k: &str| (k == "PYTORCH_CUDA_ALLOC_CONF").then(|| conf.clone()))
    }

    /// A fraction of 0 is a configuration error naming why, not a
    /// server whose every load fails; the fractions torch takes are kept.
    #[test]
    fn the_operators_fraction_must_leave_memory() {
        let e = read("per_process_memory_fraction:0").unwrap_err().0;
        assert!(e.contains("leaves a worker no GPU memory"), "{e}");
        let e = read("per_process_memory_fraction:0.0").unwrap_err().0;
        assert!(e.contains("leaves a worker no GPU memory"), "{e}");
        assert!(read("per_process_memory_fraction:-0.5").is_err());
        let ok = read("expandable_segments:True,per_process_memory_fraction:0.4").unwrap();
        assert_eq!(ok.fraction, Some((0.4, "PYTORCH_CUDA_ALLOC_CONF")));
        assert_eq!(
            read("per_process_memory_fraction:1")
                .unwrap()
                .fraction
                .map(|f| f.0),
            Some(1.0)
        );
    }
}
