//! The device and GPU memory: `--device`, `--gpu-memory-utilization`,
//! `--gpu-reserve-mb`, `--max-worker-gpu-mb`, NVML (`--nvml-library`,
//! `--simulated-gpus`), and measuring a worker's footprint (`--profile-memory`,
//! `--memory-headroom`).

use std::path::{Path, PathBuf};

use super::checker::{absolute, Checker};
use super::ConfigError;
use crate::master::cli::Cli;
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
        Ok(GpuMemory {
            gpu_memory_utilization,
            gpu_reserve_mb,
            max_worker_gpu_mb,
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
