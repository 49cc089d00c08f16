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
//! Sizes are in bytes here; the plan works in MB, where 1 MB = 2^20 bytes (MiB), as
//! `nvidia-smi` reports them.

mod fixed;
mod nvml;

use std::path::Path;

use serde::Serialize;

pub use fixed::FixedProbe;
pub use nvml::NvmlProbe;

/// Bytes in one MB as the whole project counts them (MiB).
pub const MB: u64 = 1 << 20;

/// One GPU as NVML reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuInfo {
    /// NVML index (NVML ignores `CUDA_VISIBLE_DEVICES`; CUDA's own order may differ, so
    /// workers are pointed at their GPU by `uuid`).
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub total_bytes: u64,
    pub free_bytes: u64,
    pub used_bytes: u64,
}

impl GpuInfo {
    pub fn total_mb(&self) -> u64 {
        self.total_bytes / MB
    }
    pub fn free_mb(&self) -> u64 {
        self.free_bytes / MB
    }
}

/// What the machine offers, as measured once at start-up.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Resources {
    /// Logical cores as `num_cpus::get()` counts them (honours affinity and cgroup quotas).
    pub cpus: usize,
    /// GPUs seen through NVML, in NVML index order.
    pub gpus: Vec<GpuInfo>,
    /// Why no (or fewer) GPUs were seen, e.g. NVML not found; `None` when all went well.
    pub gpu_note: Option<String>,
}

impl Resources {
    /// A machine with `cpus` cores and no GPU, with the reason.
    pub fn cpu_only(cpus: usize, note: impl Into<String>) -> Resources {
        Resources {
            cpus,
            gpus: Vec::new(),
            gpu_note: Some(note.into()),
        }
    }

    /// Reads all GPUs through `probe`. A GPU that fails (fallen off the bus, no permission)
    /// is left out and named in the note; the others are kept.
    pub fn from_probe(cpus: usize, probe: &dyn GpuProbe) -> Resources {
        let mut notes = Vec::new();
        let mut gpus = Vec::new();
        match probe.count() {
            Err(e) => notes.push(format!("cannot count GPUs: {e}")),
            Ok(0) => notes.push("NVML sees no GPU".to_string()),
            Ok(n) => {
                for index in 0..n {
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
    /// How many GPUs there are (indices `0..count`).
    fn count(&self) -> Result<u32, ProbeError>;
    /// One GPU's identity and memory, now.
    fn gpu(&self, index: u32) -> Result<GpuInfo, ProbeError>;
    /// Every GPU, strictly: the first failure is returned.
    fn gpus(&self) -> Result<Vec<GpuInfo>, ProbeError> {
        (0..self.count()?).map(|i| self.gpu(i)).collect()
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
