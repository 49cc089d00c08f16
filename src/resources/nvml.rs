//! [`NvmlProbe`]: the [`GpuProbe`] over NVML through `nvml-wrapper`. NVML is loaded and
//! initialised once, by [`NvmlProbe::open`], and shut down when the probe is dropped.
//!
//! `nvml-wrapper` resolves every symbol when the library is loaded but keeps a missing one
//! as an error that only surfaces when that function is called, so an older driver (or the
//! test library `tests/nvml-mock`) only needs the functions used here: `nvmlInit_v2`,
//! `nvmlShutdown`, `nvmlDeviceGetCount_v2`, `nvmlDeviceGetHandleByIndex_v2`,
//! `nvmlDeviceGetName`, `nvmlDeviceGetUUID`, `nvmlDeviceGetMemoryInfo_v2` and
//! `nvmlDeviceGetComputeRunningProcesses_v3`.

use std::ffi::OsStr;
use std::path::Path;

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};

use super::{GpuInfo, GpuProbe, ProbeError};

/// The system library `nvml-wrapper` loads when no path is given.
const SYSTEM_LIB: &str = "libnvidia-ml.so.1";

/// NVML, initialised once.
pub struct NvmlProbe {
    nvml: Nvml,
    lib: String,
}

impl std::fmt::Debug for NvmlProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlProbe").field("lib", &self.lib).finish()
    }
}

impl NvmlProbe {
    /// Loads NVML from `lib` (or the system's `libnvidia-ml.so.1`) and initialises it.
    pub fn open(lib: Option<&Path>) -> Result<NvmlProbe, ProbeError> {
        let name = lib.map_or_else(|| SYSTEM_LIB.to_string(), |p| p.display().to_string());
        let mut builder = Nvml::builder();
        if let Some(path) = lib {
            builder.lib_path(path.as_os_str());
        } else {
            builder.lib_path(OsStr::new(SYSTEM_LIB));
        }
        let nvml = builder.init().map_err(|e| ProbeError::Load {
            lib: name.clone(),
            reason: load_reason(&e),
        })?;
        Ok(NvmlProbe { nvml, lib: name })
    }

    /// The library NVML was loaded from, for messages.
    pub fn library(&self) -> &str {
        &self.lib
    }

    /// The driver version NVML reports, when it does.
    pub fn driver_version(&self) -> Option<String> {
        self.nvml.sys_driver_version().ok()
    }

    fn device(&self, index: u32) -> Result<Device<'_>, ProbeError> {
        self.nvml.device_by_index(index).map_err(|e| match e {
            NvmlError::InvalidArg | NvmlError::NotFound => ProbeError::NoSuchGpu(index),
            source => ProbeError::Nvml {
                call: "nvmlDeviceGetHandleByIndex_v2",
                index: Some(index),
                source,
            },
        })
    }
}

/// A sentence an operator can act on, for a library that did not load or initialise.
fn load_reason(e: &NvmlError) -> String {
    match e {
        NvmlError::LibloadingError(inner) => {
            format!("the library cannot be loaded ({inner})")
        }
        NvmlError::FailedToLoadSymbol(s) => {
            format!("the library lacks nvmlInit_v2 ({s}); is it NVML?")
        }
        NvmlError::DriverNotLoaded => "the NVIDIA driver is not loaded".into(),
        NvmlError::NoPermission => "no permission to talk to the NVIDIA driver".into(),
        NvmlError::LibRmVersionMismatch => {
            "NVML and the NVIDIA kernel driver have different versions (reboot or reload the driver)"
                .into()
        }
        other => format!("nvmlInit_v2 failed: {other}"),
    }
}

fn nvml_err(call: &'static str, index: u32) -> impl FnOnce(NvmlError) -> ProbeError {
    move |source| ProbeError::Nvml {
        call,
        index: Some(index),
        source,
    }
}

/// The [`GpuProbe`] questions as inherent methods, so callers need not import the trait.
impl NvmlProbe {
    /// How many GPUs NVML sees.
    pub fn count(&self) -> Result<u32, ProbeError> {
        self.nvml.device_count().map_err(|source| ProbeError::Nvml {
            call: "nvmlDeviceGetCount_v2",
            index: None,
            source,
        })
    }

    /// One GPU's identity and memory, now.
    pub fn gpu(&self, index: u32) -> Result<GpuInfo, ProbeError> {
        let dev = self.device(index)?;
        let name = dev.name().map_err(nvml_err("nvmlDeviceGetName", index))?;
        let uuid = dev.uuid().map_err(nvml_err("nvmlDeviceGetUUID", index))?;
        let mem = dev
            .memory_info()
            .map_err(nvml_err("nvmlDeviceGetMemoryInfo_v2", index))?;
        Ok(GpuInfo {
            index,
            uuid,
            name,
            total_bytes: mem.total,
            free_bytes: mem.free,
            used_bytes: mem.used,
        })
    }

    /// Free memory on one GPU now.
    pub fn free_bytes(&self, index: u32) -> Result<u64, ProbeError> {
        let mem = self
            .device(index)?
            .memory_info()
            .map_err(nvml_err("nvmlDeviceGetMemoryInfo_v2", index))?;
        Ok(mem.free)
    }

    /// GPU memory `pid` holds on this GPU; `None` if it has no context there.
    pub fn process_used_bytes(&self, index: u32, pid: u32) -> Result<Option<u64>, ProbeError> {
        let procs = self
            .device(index)?
            .running_compute_processes()
            .map_err(nvml_err("nvmlDeviceGetComputeRunningProcesses_v3", index))?;
        Ok(procs
            .into_iter()
            .find(|p| p.pid == pid)
            .and_then(|p| match p.used_gpu_memory {
                UsedGpuMemory::Used(bytes) => Some(bytes),
                UsedGpuMemory::Unavailable => None,
            }))
    }
}

impl GpuProbe for NvmlProbe {
    fn count(&self) -> Result<u32, ProbeError> {
        NvmlProbe::count(self)
    }
    fn gpu(&self, index: u32) -> Result<GpuInfo, ProbeError> {
        NvmlProbe::gpu(self, index)
    }
    fn free_bytes(&self, index: u32) -> Result<u64, ProbeError> {
        NvmlProbe::free_bytes(self, index)
    }
    fn process_used_bytes(&self, index: u32, pid: u32) -> Result<Option<u64>, ProbeError> {
        NvmlProbe::process_used_bytes(self, index, pid)
    }
}
