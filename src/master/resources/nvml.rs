//! [`NvmlProbe`]: the [`GpuProbe`] over NVML through `nvml-wrapper`. NVML is loaded and
//! initialised once, by [`NvmlProbe::open`], and shut down when the probe is dropped.
//!
//! `nvml-wrapper` resolves every symbol when the library is loaded but keeps a missing one
//! as an error that only surfaces when that function is called, so an older driver (or the
//! test library `tests/nvml-mock`) only needs the functions used here: `nvmlInit_v2`,
//! `nvmlShutdown`, `nvmlSystemGetDriverVersion`, `nvmlSystemGetCudaDriverVersion_v2`,
//! `nvmlDeviceGetCount_v2`, `nvmlDeviceGetHandleByIndex_v2`, `nvmlDeviceGetName`,
//! `nvmlDeviceGetUUID`, `nvmlDeviceGetMemoryInfo_v2`, `nvmlDeviceGetComputeMode`,
//! `nvmlDeviceGetComputeRunningProcesses_v3`, `nvmlDeviceGetMPSComputeRunningProcesses_v3`
//! (the MPS clients, which the compute list leaves out: it shows their MPS server) and, for
//! MIG, `nvmlDeviceGetMigMode`, `nvmlDeviceGetMaxMigDeviceCount`,
//! `nvmlDeviceGetMigDeviceHandleByIndex` and `nvmlDeviceGetGpuInstanceId` (called through
//! the library's symbol: `nvml-wrapper` 0.12 has no method for it). A query a GPU does not
//! support (`NOT_SUPPORTED`, a function the library lacks) reads as "not there": no MIG,
//! compute mode default, no per-process figure, no GPU instance.
//!
//! The devices are listed once, at [`NvmlProbe::open`]: every GPU not in MIG mode under its
//! NVML index, then every MIG instance of the GPUs in MIG mode under the indices after the
//! last GPU's (a GPU in MIG mode cannot run CUDA work itself: only its instances can).

use std::ffi::OsStr;
use std::path::Path;

use nvml_wrapper::enum_wrappers::device::ComputeMode as NvmlComputeMode;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};

use super::{ComputeMode, GpuInfo, GpuProbe, MigInstance, ProbeError};

/// The system library `nvml-wrapper` loads when no path is given.
const SYSTEM_LIB: &str = "libnvidia-ml.so.1";

/// NVML, initialised once, and the devices it listed then.
pub struct NvmlProbe {
    nvml: Nvml,
    lib: String,
    /// Device index → where it is: `(NVML index, MIG slot)`.
    devices: Vec<(u32, (u32, Option<u32>))>,
    /// What listing left out, and why.
    notes: Vec<String>,
    /// Whether the pids NVML lists are this process's namespace's
    /// (`crate::pid_namespace`): if not, no per-process figure is read as ours.
    pids_are_ours: bool,
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
        let mut probe = NvmlProbe {
            nvml,
            lib: name,
            devices: Vec::new(),
            notes: Vec::new(),
            pids_are_ours: crate::pid_namespace::nvml_pids_are_ours(),
        };
        probe.list_devices();
        Ok(probe)
    }

    /// Lists whole GPUs, then the MIG instances of GPUs in MIG mode (module docs).
    fn list_devices(&mut self) {
        let n = match self.nvml.device_count() {
            Ok(n) => n,
            // Reported by `indices()` when it is asked.
            Err(_) => return,
        };
        let mut migs = Vec::new();
        for i in 0..n {
            let Ok(dev) = self.nvml.device_by_index(i) else {
                // Left for `gpu(i)` to report why.
                self.devices.push((i, (i, None)));
                continue;
            };
            let mig_on = matches!(dev.mig_mode(), Ok(m) if m.current == 1);
            if !mig_on {
                self.devices.push((i, (i, None)));
                continue;
            }
            let slots = dev.mig_device_count().unwrap_or(0);
            let found: Vec<u32> = (0..slots)
                .filter(|s| dev.mig_device_by_index(*s).is_ok())
                .collect();
            if found.is_empty() {
                self.notes.push(format!(
                    "GPU {i} is in MIG mode but has no MIG instance (create GPU and compute instances with nvidia-smi mig, or turn MIG off): left out"
                ));
            }
            migs.extend(found.into_iter().map(|s| (i, Some(s))));
        }
        for (k, m) in migs.into_iter().enumerate() {
            self.devices.push((n + k as u32, m));
        }
    }

    /// The library NVML was loaded from, for messages.
    pub fn library(&self) -> &str {
        &self.lib
    }

    /// The driver version NVML reports, when it does.
    pub fn driver_version(&self) -> Option<String> {
        self.nvml.sys_driver_version().ok()
    }

    /// Where device `index` is: its GPU's NVML index and, for a MIG instance, its slot.
    fn place(&self, index: u32) -> Result<(u32, Option<u32>), ProbeError> {
        self.devices
            .iter()
            .find(|(i, _)| *i == index)
            .map(|(_, p)| *p)
            .ok_or(ProbeError::NoSuchGpu(index))
    }

    fn device(&self, index: u32) -> Result<Device<'_>, ProbeError> {
        let (nvml_index, mig) = self.place(index)?;
        let gpu = self.nvml.device_by_index(nvml_index).map_err(|e| match e {
            NvmlError::InvalidArg | NvmlError::NotFound => ProbeError::NoSuchGpu(index),
            source => ProbeError::Nvml {
                call: "nvmlDeviceGetHandleByIndex_v2",
                index: Some(index),
                source,
            },
        })?;
        match mig {
            None => Ok(gpu),
            Some(slot) => gpu
                .mig_device_by_index(slot)
                .map_err(nvml_err("nvmlDeviceGetMigDeviceHandleByIndex", index)),
        }
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
    /// The devices' indices (module docs).
    pub fn indices(&self) -> Result<Vec<u32>, ProbeError> {
        self.nvml
            .device_count()
            .map_err(|source| ProbeError::Nvml {
                call: "nvmlDeviceGetCount_v2",
                index: None,
                source,
            })?;
        Ok(self.devices.iter().map(|(i, _)| *i).collect())
    }

    /// How many devices there are (whole GPUs and MIG instances).
    pub fn count(&self) -> Result<u32, ProbeError> {
        Ok(self.indices()?.len() as u32)
    }

    /// One device's identity, memory and compute mode, now.
    pub fn gpu(&self, index: u32) -> Result<GpuInfo, ProbeError> {
        let (nvml_index, mig) = self.place(index)?;
        let dev = self.device(index)?;
        let name = dev.name().map_err(nvml_err("nvmlDeviceGetName", index))?;
        let uuid = dev.uuid().map_err(nvml_err("nvmlDeviceGetUUID", index))?;
        let mem = dev
            .memory_info()
            .map_err(nvml_err("nvmlDeviceGetMemoryInfo_v2", index))?;
        // A MIG instance runs under its GPU's compute mode; NVML documents the query for
        // GPUs (on an instance handle it may answer INVALID_ARGUMENT or NOT_SUPPORTED).
        let mode_of = match mig {
            Some(_) => self
                .nvml
                .device_by_index(nvml_index)
                .and_then(|g| g.compute_mode()),
            None => dev.compute_mode(),
        };
        let compute_mode = match mode_of {
            Ok(NvmlComputeMode::Default) => ComputeMode::Default,
            Ok(NvmlComputeMode::ExclusiveThread) => ComputeMode::ExclusiveThread,
            Ok(NvmlComputeMode::Prohibited) => ComputeMode::Prohibited,
            Ok(NvmlComputeMode::ExclusiveProcess) => ComputeMode::ExclusiveProcess,
            Err(e) if not_there(&e) || mig.is_some() => ComputeMode::Default,
            Err(e) => return Err(nvml_err("nvmlDeviceGetComputeMode", index)(e)),
        };
        let gpu_instance = mig.and_then(|_| gpu_instance_id(&self.nvml, &dev));
        // The GPU's own figure for a MIG instance too (its instances share its SMs' kind).
        let capability_of = match mig {
            Some(_) => self
                .nvml
                .device_by_index(nvml_index)
                .and_then(|g| g.cuda_compute_capability()),
            None => dev.cuda_compute_capability(),
        };
        Ok(GpuInfo {
            index,
            uuid,
            name,
            total_bytes: mem.total,
            free_bytes: mem.free,
            used_bytes: mem.used,
            reserved_bytes: mem.reserved,
            compute_mode,
            mig: mig.map(|slot| MigInstance {
                parent: nvml_index,
                slot,
            }),
            gpu_instance,
            ledger_mb: 0,
            // Unknown where NVML does not say (an old driver, an error): the checks that
            // need it leave the question to the load.
            compute_capability: capability_of
                .ok()
                .map(|c| format!("{}.{}", c.major, c.minor)),
        })
    }

    /// The UUID of the GPU a MIG device `index` belongs to (`None`: a whole GPU, or NVML
    /// did not say): what the GPU-memory ledger names a GPU instance by.
    pub fn parent_uuid(&self, index: u32) -> Option<String> {
        let (nvml_index, mig) = self.place(index).ok()?;
        mig?;
        self.nvml.device_by_index(nvml_index).ok()?.uuid().ok()
    }

    /// Free memory on one GPU now.
    pub fn free_bytes(&self, index: u32) -> Result<u64, ProbeError> {
        let mem = self
            .device(index)?
            .memory_info()
            .map_err(nvml_err("nvmlDeviceGetMemoryInfo_v2", index))?;
        Ok(mem.free)
    }

    /// GPU memory `pid` holds on this device; `None` if it has no context there, or NVML
    /// lists it under another pid (a container without the host's PID namespace), or the
    /// list is not plausible.
    ///
    /// Plausible: every figure at most the device's total. Drivers 535.43–535.86 filled the
    /// process list with a struct layout other than their header's (an added
    /// `usedGpuCcProtectedMemory`), which reads as pids and sizes shifted into each other;
    /// a figure larger than the device is the sign, and then no figure is trusted.
    ///
    /// Both lists are read: the compute processes, and the MPS clients (under MPS the
    /// compute list shows the MPS server, its clients only the MPS list).
    ///
    /// Outside the host's pid namespace none is read: NVML lists host pids, and `pid` may
    /// be a foreign process's there (`crate::pid_namespace`); callers then take the
    /// device's free memory, as for a pid NVML does not list.
    pub fn process_used_bytes(&self, index: u32, pid: u32) -> Result<Option<u64>, ProbeError> {
        let dev = self.device(index)?;
        if !self.pids_are_ours {
            return Ok(None);
        }
        let mut procs = match listed(|| dev.running_compute_processes()) {
            Ok(p) => p,
            Err(e) if not_there(&e) => Vec::new(),
            Err(e) => {
                return Err(nvml_err("nvmlDeviceGetComputeRunningProcesses_v3", index)(
                    e,
                ))
            }
        };
        match listed(|| dev.mps_running_compute_processes()) {
            Ok(p) => procs.extend(p),
            Err(e) if not_there(&e) => {}
            Err(e) => {
                return Err(nvml_err(
                    "nvmlDeviceGetMPSComputeRunningProcesses_v3",
                    index,
                )(e))
            }
        }
        let total = dev.memory_info().map(|m| m.total).unwrap_or(u64::MAX);
        let used = |p: &nvml_wrapper::struct_wrappers::device::ProcessInfo| match p.used_gpu_memory
        {
            UsedGpuMemory::Used(bytes) => Some(bytes),
            UsedGpuMemory::Unavailable => None,
        };
        if procs.iter().any(|p| used(p).is_some_and(|b| b > total)) {
            return Ok(None);
        }
        Ok(procs.iter().find(|p| p.pid == pid).and_then(used))
    }

    /// The probe as in a pid namespace whose ids NVML's are (`true`) or are not: what
    /// [`NvmlProbe::open`] decides from `/proc/self/ns/pid`, for tests to set either way.
    pub fn with_pids_ours(mut self, ours: bool) -> NvmlProbe {
        self.pids_are_ours = ours;
        self
    }

    /// The driver's CUDA version (12040 = 12.4), when NVML says.
    pub fn cuda_driver_version(&self) -> Option<u32> {
        self.nvml
            .sys_cuda_driver_version()
            .ok()
            .and_then(|v| u32::try_from(v).ok())
    }
}

/// A MIG device's GPU instance (`nvmlDeviceGetGpuInstanceId`), when NVML says.
fn gpu_instance_id(nvml: &Nvml, dev: &Device<'_>) -> Option<u32> {
    let f = nvml.lib().nvmlDeviceGetGpuInstanceId.as_ref().ok()?;
    let mut id: std::ffi::c_uint = 0;
    // SAFETY: `f` is the library's own nvmlDeviceGetGpuInstanceId; the handle is a live
    // device of this NVML and `id` a writable unsigned int, as nvml.h declares it.
    let rc = unsafe { f(dev.handle(), &mut id) };
    (rc == 0).then_some(id)
}

/// How often a process list is read before its `INSUFFICIENT_SIZE` is taken as an error.
const LIST_TRIES: u32 = 5;

/// A process list, read again while it grows between nvml-wrapper's two calls: it asks for
/// the count, then fills a list of exactly that size, so a process (an MPS client) starting
/// in between makes the second call `INSUFFICIENT_SIZE` (`nvml.h`: "`count` is set to the
/// number of entries needed"). Real drivers list processes as they come and go.
fn listed<T>(mut read: impl FnMut() -> Result<Vec<T>, NvmlError>) -> Result<Vec<T>, NvmlError> {
    let mut tries = 1;
    loop {
        match read() {
            Err(NvmlError::InsufficientSize(_)) if tries < LIST_TRIES => tries += 1,
            r => return r,
        }
    }
}

/// An error that means "this GPU or driver does not have that", not a failure.
fn not_there(e: &NvmlError) -> bool {
    matches!(
        e,
        NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_) | NvmlError::NoPermission
    )
}

impl GpuProbe for NvmlProbe {
    fn indices(&self) -> Result<Vec<u32>, ProbeError> {
        NvmlProbe::indices(self)
    }
    fn notes(&self) -> Vec<String> {
        self.notes.clone()
    }
    fn driver_version(&self) -> Option<String> {
        NvmlProbe::driver_version(self)
    }
    fn cuda_driver_version(&self) -> Option<u32> {
        NvmlProbe::cuda_driver_version(self)
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
