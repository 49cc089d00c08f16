//! Resource probing: how many CPU cores the machine has and which NVIDIA GPUs NVML sees,
//! with their memory. Owns [`Resources`], [`GpuInfo`] and the small [`GpuProbe`] trait the
//! master uses later for admission (free memory now) and hwFetch's per-process fallback.
//!
//! NVML is the only GPU interface here: it talks to the driver and never creates a CUDA
//! context, which is why the master (which must never initialise CUDA) may use it. Absence
//! of NVML or of GPUs is not an error: it yields no GPUs and a [`Resources::gpu_note`]
//! saying why. Only an NVML library the user named explicitly (`--nvml-library`) that
//! cannot be loaded is an error, so the caller can exit 2.
//!
//! A device here is what one worker can be pinned to: a whole GPU, or one MIG instance of
//! a GPU in MIG mode (NVML lists MIG instances only under their GPU; [`NvmlProbe`] lists
//! them as devices of their own, after the whole GPUs). Each device has an `index` that
//! stays the same for the life of the probe: a whole GPU's NVML index, or for a MIG
//! instance a number after the last NVML index ([`GpuInfo::label`] names both ways).
//!
//! Sizes are in bytes here; the plan works in MB, where 1 MB = 2^20 bytes (MiB), as
//! `nvidia-smi` reports them.

mod fixed;
pub mod host_memory;
pub mod mps;
mod nvml;
pub mod visible;

use std::path::Path;

use serde::Serialize;

pub use fixed::FixedProbe;
pub use nvml::NvmlProbe;

/// Bytes in one MB as the whole project counts them (MiB).
pub const MB: u64 = 1 << 20;

/// A GPU's compute mode (`nvidia-smi -q -d COMPUTE`; NVML `nvmlComputeMode_t`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ComputeMode {
    /// Any number of processes may hold a CUDA context.
    #[default]
    Default,
    /// One context at a time (withdrawn by NVIDIA; treated as exclusive-process).
    ExclusiveThread,
    /// No process may create a CUDA context.
    Prohibited,
    /// One process at a time may hold a CUDA context.
    ExclusiveProcess,
}

impl ComputeMode {
    /// The workers a GPU in this mode may run when `fits` would fit by memory: any number,
    /// at most one (one process at a time may hold a CUDA context), or none.
    pub fn limit(self, fits: u32) -> u32 {
        match self {
            ComputeMode::Default => fits,
            ComputeMode::ExclusiveProcess | ComputeMode::ExclusiveThread => fits.min(1),
            ComputeMode::Prohibited => 0,
        }
    }

    /// One process at a time may hold a CUDA context (exclusive-process or -thread).
    pub fn is_exclusive(self) -> bool {
        matches!(
            self,
            ComputeMode::ExclusiveProcess | ComputeMode::ExclusiveThread
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            ComputeMode::Default => "default",
            ComputeMode::ExclusiveThread => "exclusive_thread",
            ComputeMode::Prohibited => "prohibited",
            ComputeMode::ExclusiveProcess => "exclusive_process",
        }
    }
}

/// Where a MIG instance sits (part of the protocol: a worker placed on one is told).
pub use crate::protocol::MigInstance;

/// One device (a whole GPU or a MIG instance) as NVML reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct GpuInfo {
    /// The device's index in this probe: a whole GPU's NVML index, or a number after the
    /// last NVML index for a MIG instance. NVML ignores `CUDA_VISIBLE_DEVICES` and CUDA's
    /// own order may differ, so workers are pointed at their device by `uuid`.
    pub index: u32,
    /// `GPU-…` for a whole GPU, `MIG-…` for a MIG instance.
    pub uuid: String,
    pub name: String,
    pub total_bytes: u64,
    pub free_bytes: u64,
    pub used_bytes: u64,
    /// Memory the driver keeps for itself (NVML's memory info v2; 0 where not reported).
    /// Recent drivers report `total = free + used + reserved`.
    pub reserved_bytes: u64,
    pub compute_mode: ComputeMode,
    /// Set when this device is a MIG instance.
    pub mig: Option<MigInstance>,
    /// A MIG device's GPU instance (`nvmlDeviceGetGpuInstanceId`): MIG devices of one GPU
    /// with the same GPU instance are its compute instances and share its memory (each
    /// reports all of it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_instance: Option<u32>,
    /// MB the other servers of this host reserved on it in the GPU-memory ledger
    /// (`master::host::ledger`): the plan counts them as used.
    #[serde(skip_serializing_if = "is_zero")]
    pub ledger_mb: u64,
    /// CUDA compute capability, `major.minor` (`nvmlDeviceGetCudaComputeCapability`; a MIG
    /// instance's GPU's): what an AOTInductor package compiled for another GPU is checked
    /// against. `None` where NVML does not tell it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compute_capability: Option<String>,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl GpuInfo {
    /// The NVML index of the physical GPU (a MIG instance's parent).
    pub fn nvml_index(&self) -> u32 {
        self.mig.map_or(self.index, |m| m.parent)
    }
    /// How messages name it: `GPU 1`, or `GPU 0 MIG 2` (`nvidia-smi -L`'s words).
    pub fn label(&self) -> String {
        match self.mig {
            None => format!("GPU {}", self.index),
            Some(m) => format!("GPU {} MIG {}", m.parent, m.slot),
        }
    }
    pub fn total_mb(&self) -> u64 {
        self.total_bytes / MB
    }
    pub fn free_mb(&self) -> u64 {
        self.free_bytes / MB
    }
}

/// What the machine offers, as measured once at start-up.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Resources {
    /// Logical cores as `num_cpus::get()` counts them (honours affinity and cgroup quotas).
    pub cpus: usize,
    /// GPUs seen through NVML, in NVML index order.
    pub gpus: Vec<GpuInfo>,
    /// Why no (or fewer) GPUs were seen, e.g. NVML not found; `None` when all went well.
    pub gpu_note: Option<String>,
    /// The NVIDIA driver's version, when NVML says.
    #[serde(default)]
    pub driver_version: Option<String>,
    /// The newest CUDA version the driver supports (CUDA's encoding, 1000 × major + 10 ×
    /// minor: 12040 = 12.4), when NVML says.
    #[serde(default)]
    pub cuda_driver_version: Option<u32>,
}

impl Resources {
    /// A machine with `cpus` cores and no GPU, with the reason.
    pub fn cpu_only(cpus: usize, note: impl Into<String>) -> Resources {
        Resources {
            cpus,
            gpus: Vec::new(),
            gpu_note: Some(note.into()),
            driver_version: None,
            cuda_driver_version: None,
        }
    }

    /// Reads all devices through `probe`. A device that fails (fallen off the bus, no
    /// permission) is left out and named in the note; the others are kept.
    pub fn from_probe(cpus: usize, probe: &dyn GpuProbe) -> Resources {
        let mut notes = probe.notes();
        let mut gpus = Vec::new();
        match probe.indices() {
            Err(e) => notes.push(format!("cannot count GPUs: {e}")),
            Ok(v) if v.is_empty() && notes.is_empty() => notes.push("NVML sees no GPU".to_string()),
            Ok(v) => {
                for index in v {
                    match probe.gpu(index) {
                        Ok(g) => gpus.push(g),
                        Err(e) => notes.push(format!("GPU {index} left out: {e}")),
                    }
                }
            }
        }
        Resources {
            cpus: cpus.max(1),
            gpus,
            gpu_note: (!notes.is_empty()).then(|| notes.join("; ")),
            driver_version: probe.driver_version(),
            cuda_driver_version: probe.cuda_driver_version(),
        }
    }
}

/// Why a GPU query failed.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The NVML library could not be loaded or initialised.
    #[error("cannot use NVML from {lib}: {reason}")]
    Load { lib: String, reason: String },
    /// An NVML call failed.
    #[error("NVML {call} failed{}: {source}", gpu_suffix(*.index))]
    Nvml {
        call: &'static str,
        index: Option<u32>,
        #[source]
        source: nvml_wrapper::error::NvmlError,
    },
    /// No GPU has this index (any more).
    #[error("no GPU with NVML index {0}")]
    NoSuchGpu(u32),
}

fn gpu_suffix(index: Option<u32>) -> String {
    index.map(|i| format!(" for GPU {i}")).unwrap_or_default()
}

/// The questions the master asks about GPUs. NVML implements it ([`NvmlProbe`]); tests use
/// [`FixedProbe`].
pub trait GpuProbe: Send + Sync {
    /// The devices' indices, whole GPUs first (NVML order), then MIG instances.
    fn indices(&self) -> Result<Vec<u32>, ProbeError>;
    /// One device's identity and memory, now.
    fn gpu(&self, index: u32) -> Result<GpuInfo, ProbeError>;
    /// Every device, strictly: the first failure is returned.
    fn gpus(&self) -> Result<Vec<GpuInfo>, ProbeError> {
        self.indices()?.into_iter().map(|i| self.gpu(i)).collect()
    }
    /// What listing the devices left out and why (a MIG GPU without instances, …).
    fn notes(&self) -> Vec<String> {
        Vec::new()
    }
    /// The driver's version, when known.
    fn driver_version(&self) -> Option<String> {
        None
    }
    /// The newest CUDA version the driver supports (12040 = 12.4), when known.
    fn cuda_driver_version(&self) -> Option<u32> {
        None
    }
    /// Free memory on one GPU now (admission before starting a worker there).
    fn free_bytes(&self, index: u32) -> Result<u64, ProbeError> {
        Ok(self.gpu(index)?.free_bytes)
    }
    /// GPU memory `pid` holds on this GPU (its compute context and allocations), or `None`
    /// when the process has no context there or the driver does not say (hwFetch's
    /// fallback when the allocator's own peak is not available).
    fn process_used_bytes(&self, index: u32, pid: u32) -> Result<Option<u64>, ProbeError>;
}

/// Probes CPU cores and NVML GPUs.
///
/// - `nvml_library: None`: the system NVML (`libnvidia-ml.so.1`). Missing NVML, a driver
///   that is not loaded or no GPU give `Ok` with no GPUs and [`Resources::gpu_note`] set.
/// - `nvml_library: Some(path)`: the user named it, so failing to load or initialise it is
///   an `Err` (the caller exits 2). GPUs that fail one by one are still only noted.
///
/// The [`NvmlProbe`] is returned for later queries (admission, hwFetch); keep it, NVML is
/// initialised once.
pub fn probe(nvml_library: Option<&Path>) -> Result<(Resources, Option<NvmlProbe>), ProbeError> {
    let cpus = num_cpus::get().max(1);
    let nvml = match NvmlProbe::open(nvml_library) {
        Ok(p) => p,
        Err(e) if nvml_library.is_none() => {
            return Ok((Resources::cpu_only(cpus, e.to_string()), None))
        }
        Err(e) => return Err(e),
    };
    let res = Resources::from_probe(cpus, &nvml);
    Ok((res, Some(nvml)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32, total_mb: u64, free_mb: u64) -> GpuInfo {
        GpuInfo {
            index,
            uuid: format!("GPU-{index}"),
            name: "Test GPU".into(),
            total_bytes: total_mb * MB,
            free_bytes: free_mb * MB,
            used_bytes: (total_mb - free_mb) * MB,
            ..GpuInfo::default()
        }
    }

    #[test]
    fn from_probe_reads_every_gpu() {
        let p = FixedProbe::new(vec![gpu(0, 1000, 900), gpu(1, 2000, 100)]);
        let r = Resources::from_probe(4, &p);
        assert_eq!(r.cpus, 4);
        assert_eq!(r.gpus.len(), 2);
        assert_eq!(r.gpus[1].free_mb(), 100);
        assert_eq!(r.gpu_note, None);
    }

    #[test]
    fn no_gpu_is_a_note_not_an_error() {
        let r = Resources::from_probe(2, &FixedProbe::new(vec![]));
        assert!(r.gpus.is_empty());
        assert_eq!(r.gpu_note.as_deref(), Some("NVML sees no GPU"));
    }

    #[test]
    fn missing_system_nvml_is_a_note() {
        // No NVML on the build machine; where there is one this still must not fail.
        let (r, p) = probe(None).expect("implicit NVML never fails");
        assert!(r.cpus >= 1);
        if p.is_none() {
            assert!(r.gpus.is_empty());
            assert!(r.gpu_note.as_deref().unwrap().contains("NVML"), "{r:?}");
        }
    }

    #[test]
    fn explicit_nvml_that_does_not_load_is_an_error() {
        let e = probe(Some(Path::new("/nonexistent/libnvidia-ml.so.1"))).expect_err("must fail");
        let msg = e.to_string();
        assert!(msg.contains("/nonexistent/libnvidia-ml.so.1"), "{msg}");
    }

    #[test]
    fn fixed_probe_answers_free_memory_and_processes() {
        let p = FixedProbe::new(vec![gpu(0, 1000, 900)]);
        p.set_free_bytes(0, 10 * MB);
        p.set_process(0, 77, 5 * MB);
        assert_eq!(p.free_bytes(0).unwrap(), 10 * MB);
        assert_eq!(p.process_used_bytes(0, 77).unwrap(), Some(5 * MB));
        assert_eq!(p.process_used_bytes(0, 78).unwrap(), None);
        assert!(matches!(p.gpu(3), Err(ProbeError::NoSuchGpu(3))));
    }
}
