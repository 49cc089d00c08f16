//! The device and GPU memory: `--device`, `--gpu-memory-utilization`,
//! `--gpu-reserve-mb`, `--max-worker-gpu-mb`, the GPU-memory ledger (`--ledger`, `--idle-release`), NVML (`--nvml-library`,
//! `--simulated-gpus`), NVIDIA MPS (`--mps`, `CUDA_MPS_PIPE_DIRECTORY`), the operator's
//! settings of PyTorch's CUDA allocator that bear on the cap ([`AllocatorEnv`]), and
//! measuring a worker's footprint (`--profile-memory`, `--memory-headroom`).

use std::path::{Path, PathBuf};

use super::checker::{absolute, Checker};
use super::ConfigError;
use crate::master::cli::Cli;
use crate::master::resources::mps::ClientLimit;
use crate::protocol::Device;

/// `--profile-memory` (`None`: auto) and `--memory-headroom`.
pub(super) fn profiling(cli: &Cli, c: &Checker<'_>) -> Result<(Option<bool>, f64), ConfigError> {
    let profile_memory = match cli.profile_memory.as_deref().map(str::trim) {
        None | Some("auto") => None,
        Some("on") => Some(true),
        Some("off") => Some(false),
        Some(v) => return Err(c.bad("--profile-memory", v, "expected auto, on or off")),
    };
    let memory_headroom = match cli.memory_headroom.as_deref() {
        None => 1.2,
        Some(v) => match v.trim().parse::<f64>() {
            Ok(f) if (1.0..=10.0).contains(&f) => f,
            _ => {
                return Err(c.bad(
                    "--memory-headroom",
                    v,
                    "expected a factor from 1 to 10 (e.g. 1.2)",
                ))
            }
        },
    };
    Ok((profile_memory, memory_headroom))
}

/// `--device`.
pub(super) fn device(v: Option<&str>, c: &Checker<'_>) -> Result<Device, ConfigError> {
    let device = match v {
        None | Some("auto") => Device::Auto,
        Some("cpu") => Device::Cpu,
        Some("cuda") => Device::Cuda,
        Some(d) => return Err(c.bad("--device", d, "expected auto, cpu or cuda")),
    };
    Ok(device)
}

/// `--gpu-memory-utilization`, `--gpu-reserve-mb`, `--max-worker-gpu-mb`.
pub(super) struct GpuMemory {
    pub gpu_memory_utilization: Option<f64>,
    pub gpu_reserve_mb: u64,
    pub max_worker_gpu_mb: Option<u64>,
    /// `--ledger`: the GPU-memory ledger's directory; `None`: off.
    pub ledger: Option<PathBuf>,
    /// `--idle-release`: how long workers on GPUs may go without a request before they
    /// are retired and the reservation given back; `None`: never.
    pub idle_release: Option<std::time::Duration>,
}

impl GpuMemory {
    pub(super) fn check(cli: &Cli, c: &Checker<'_>) -> Result<GpuMemory, ConfigError> {
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
        let gpu_reserve_mb = c.uint("--gpu-reserve-mb", cli.gpu_reserve_mb.as_deref(), 500, 0)?;
        let max_worker_gpu_mb = match cli.max_worker_gpu_mb.as_deref() {
            None => None,
            Some(v) => Some(c.uint("--max-worker-gpu-mb", Some(v), 0, 1)?),
        };
        let ledger = match cli.ledger.as_deref().map(|v| v.to_string_lossy()) {
            None => Some(PathBuf::from(crate::master::ledger::DEFAULT_DIR)),
            Some(v) if v.trim() == "off" => None,
            Some(v) if v.trim().is_empty() => {
                return Err(c.bad("--ledger", &v, "expected a directory, or off"))
            }
            Some(v) => Some(absolute(Path::new(v.trim()))),
        };
        let idle_release = match cli.idle_release.as_deref().map(str::trim) {
            None | Some("off") => None,
            v => c.seconds_or_off("--idle-release", v, 0.0)?,
        };
        Ok(GpuMemory {
            gpu_memory_utilization,
            gpu_reserve_mb,
            max_worker_gpu_mb,
            ledger,
            idle_release,
        })
    }
}

/// `--nvml-library` (an existing file), and `--simulated-gpus` only with it.
pub(super) fn nvml_library(
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

/// `--mps`: `None` auto (detected), `Some(true)` on, `Some(false)` off.
pub(super) fn mps(v: Option<&str>, c: &Checker<'_>) -> Result<Option<bool>, ConfigError> {
    match v.map(str::trim) {
        None | Some("auto") => Ok(None),
        Some("on") => Ok(Some(true)),
        Some("off") => Ok(Some(false)),
        Some(v) => Err(c.bad("--mps", v, "expected auto, on or off")),
    }
}

/// `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` as the server inherits it: each MPS client's limit,
/// which bounds the plan under MPS (`resources::mps::ClientLimit`). A value MPS would not
/// read is refused, naming the variable and its forms.
pub(super) fn mps_client_limit(
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<ClientLimit>, ConfigError> {
    let var = crate::protocol::ENV_MPS_MEM_LIMIT;
    env(var)
        .map(|v| {
            ClientLimit::parse(&v).map_err(|e| {
                ConfigError(format!(
                    "invalid value '{v}' for {var} (each MPS client's device memory limit): {e}"
                ))
            })
        })
        .transpose()
}

/// Where the MPS control daemon's socket would be: `CUDA_MPS_PIPE_DIRECTORY`, else
/// `/tmp/nvidia-mps` (NVIDIA's MPS documentation), as the CUDA driver looks for it.
pub(super) fn mps_pipe_directory(env: &dyn Fn(&str) -> Option<String>) -> PathBuf {
    env("CUDA_MPS_PIPE_DIRECTORY").map_or_else(|| PathBuf::from("/tmp/nvidia-mps"), PathBuf::from)
}

/// The operator's settings of PyTorch's CUDA allocator that bear on the per-worker cap
/// (issue 44, item 7), as torch 2.11 reads them.
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

    /// Issue 52, item 9: a fraction of 0 is a configuration error naming why, not a
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
