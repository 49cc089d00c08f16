//! hwFetch data for this worker. On CUDA: NVML (initialised lazily, once,
//! from `nvml_library` when given) for the GPU's name, total and free memory at its NVML
//! index, and this worker's peak from the CUDA caching allocator, falling back to NVML's
//! per-process figure. On CPU: `/proc/meminfo` and the worker's VmHWM; NVML is never
//! touched. Formatting lives in `vramfork::hwline`.

use std::sync::OnceLock;

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::Nvml;
use vramfork::hwline::{parse_meminfo, parse_vm_hwm, HwInfo};
use vramfork::metrics::exposition::GpuRow;

use crate::cuda;

/// Where this worker's device is for NVML: the row index the master uses, the GPU's NVML
/// index and, for a MIG instance, its MIG slot on that GPU.
#[derive(Debug, Clone, Copy)]
struct Place {
    index: u32,
    nvml_index: u32,
    mig_slot: Option<u32>,
}

pub struct Hw {
    /// (CUDA index as this process sees it, its device for NVML) when the model runs on a GPU.
    gpu: Option<(usize, Place)>,
    nvml_library: Option<String>,
    nvml: OnceLock<Result<Nvml, String>>,
}

impl Hw {
    pub fn new(
        cuda_index: Option<usize>,
        gpu: Option<&vramfork::protocol::GpuAssignment>,
        nvml_library: Option<String>,
    ) -> Hw {
        let place = gpu.map_or(
            Place {
                index: 0,
                nvml_index: 0,
                mig_slot: None,
            },
            |g| Place {
                index: g.index,
                nvml_index: g.mig.map_or(g.index, |m| m.parent),
                mig_slot: g.mig.map(|m| m.slot),
            },
        );
        Hw {
            gpu: cuda_index.map(|c| (c, place)),
            nvml_library,
            nvml: OnceLock::new(),
        }
    }

    /// Whether the model runs on a GPU.
    pub fn on_gpu(&self) -> bool {
        self.gpu.is_some()
    }

    /// The hwFetch line, or a message saying what could not be read.
    pub fn line(&self) -> Result<String, String> {
        self.info().map(|i| i.line())
    }

    fn info(&self) -> Result<HwInfo, String> {
        match self.gpu {
            None => cpu_info(),
            Some((cuda_index, place)) => self.gpu_info(cuda_index, place),
        }
    }

    fn nvml(&self) -> Result<&Nvml, String> {
        self.nvml
            .get_or_init(|| {
                let mut b = Nvml::builder();
                if let Some(lib) = &self.nvml_library {
                    b.lib_path(std::ffi::OsStr::new(lib));
                }
                b.init().map_err(|e| format!("cannot initialise NVML: {e}"))
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// The CUDA caching allocator's figures, on CUDA.
    /// This worker's device through NVML: its GPU, or the MIG instance on it.
    fn device(&self, place: Place) -> Result<nvml_wrapper::Device<'_>, String> {
        let err =
            |e: nvml_wrapper::error::NvmlError| format!("NVML device {}: {e}", place.nvml_index);
        let gpu = self
            .nvml()?
            .device_by_index(place.nvml_index)
            .map_err(err)?;
        match place.mig_slot {
            None => Ok(gpu),
            Some(slot) => gpu.mig_device_by_index(slot).map_err(err),
        }
    }

    pub fn allocator(&self) -> Option<cuda::MemoryStats> {
        let (cuda_index, _) = self.gpu?;
        cuda::memory_stats(cuda_index).ok()
    }

    /// The CUDA caching allocator's peak reserved bytes, on CUDA.
    pub fn allocator_peak(&self) -> Option<u64> {
        let (cuda_index, _) = self.gpu?;
        cuda::memory_stats(cuda_index).ok().map(|s| s.peak_reserved)
    }

    /// This worker's GPU as NVML reports it now (`/metrics` in development mode).
    pub fn gpu_row(&self) -> Option<GpuRow> {
        let (_, place) = self.gpu?;
        let dev = self.device(place).ok()?;
        let mem = dev.memory_info().ok()?;
        Some(GpuRow {
            index: place.index,
            uuid: dev.uuid().ok()?,
            name: dev.name().ok()?,
            total: mem.total,
            free: mem.free,
            used: mem.used,
        })
    }

    /// What NVML says this process uses on its GPU.
    pub fn process_gpu_used(&self) -> Option<u64> {
        let (_, place) = self.gpu?;
        let dev = self.device(place).ok()?;
        nvml_process_used(&dev)
    }

    fn gpu_info(&self, cuda_index: usize, place: Place) -> Result<HwInfo, String> {
        let err =
            |e: nvml_wrapper::error::NvmlError| format!("NVML device {}: {e}", place.nvml_index);
        let dev = self.device(place)?;
        let name = dev.name().map_err(err)?;
        let mem = dev.memory_info().map_err(err)?;
        let peak_used = match cuda::memory_stats(cuda_index) {
            Ok(s) => s.peak_allocated,
            Err(_) => nvml_process_used(&dev).unwrap_or(0),
        };
        Ok(HwInfo::Gpu {
            name,
            total: mem.total,
            available: mem.free,
            peak_used,
        })
    }
}

/// What NVML says this process uses on the device: among the compute processes, or (an MPS
/// client, which the compute list leaves out) the MPS clients.
fn nvml_process_used(dev: &nvml_wrapper::Device) -> Option<u64> {
    // In a container's pid namespace NVML's pids are the host's: ours may name another
    // process (`vramfork::pid_namespace`).
    if !vramfork::pid_namespace::nvml_pids_are_ours() {
        return None;
    }
    let pid = std::process::id();
    let mut procs = dev.running_compute_processes().unwrap_or_default();
    procs.extend(dev.mps_running_compute_processes().unwrap_or_default());
    procs
        .into_iter()
        .find(|p| p.pid == pid)
        .and_then(|p| match p.used_gpu_memory {
            UsedGpuMemory::Used(b) => Some(b),
            UsedGpuMemory::Unavailable => None,
        })
}

fn cpu_info() -> Result<HwInfo, String> {
    let meminfo = std::fs::read_to_string("/proc/meminfo")
        .map_err(|e| format!("cannot read /proc/meminfo: {e}"))?;
    let (total, available) =
        parse_meminfo(&meminfo).ok_or("cannot parse MemTotal/MemAvailable in /proc/meminfo")?;
    let status = std::fs::read_to_string("/proc/self/status")
        .map_err(|e| format!("cannot read /proc/self/status: {e}"))?;
    let peak_used = parse_vm_hwm(&status).ok_or("cannot parse VmHWM in /proc/self/status")?;
    Ok(HwInfo::Cpu {
        total,
        available,
        peak_used,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_line_reads_this_machine() {
        let line = Hw::new(None, None, None).line().unwrap();
        assert!(line.starts_with("CPU only (no NVIDIA GPU), "), "{line}");
        assert!(line.ends_with(" GiB peak used"), "{line}");
    }
}
