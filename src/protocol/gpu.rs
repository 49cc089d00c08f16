//! The GPU side of the master↔worker contract: the CUDA version the build needs, the device
//! a worker is placed on ([`GpuAssignment`]), and the variables it starts CUDA with.

use serde::{Deserialize, Serialize};

/// The CUDA version of the libtorch the worker is built against (torch 2.11.0 from PyPI is
/// built with CUDA 13.0; `worker/build.rs` checks the installed one says the same), in
/// CUDA's encoding: 1000 × major + 10 × minor. A driver whose CUDA version
/// (`nvmlSystemGetCudaDriverVersion_v2`) is older cannot run it: libtorch then sees no GPU.
pub const CUDA_BUILD_VERSION: u32 = 13_000;

/// The oldest NVIDIA driver branch whose CUDA version is [`CUDA_BUILD_VERSION`] (CUDA 13.0's
/// release notes: driver 580 or newer on Linux), for messages.
pub const CUDA_BUILD_MIN_DRIVER: &str = "580";

/// CUDA's version encoding as people write it: 12040 → "12.4".
pub fn cuda_version_text(v: u32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// The device a worker was placed on, a whole GPU or a MIG instance (it sees only this one
/// through `CUDA_VISIBLE_DEVICES` = its UUID).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuAssignment {
    /// The device's index in the master's NVML probe (`master::resources`): a whole GPU's NVML
    /// index; for a MIG instance see `mig`.
    pub index: u32,
    /// `GPU-…` or `MIG-…`.
    pub uuid: String,
    /// Share of the device's memory (as NVML counts it) this worker's caching allocator may
    /// take (0..1], as the plan shows it.
    pub memory_fraction: Option<f64>,
    /// The same cap in MB: what the worker enforces, as a fraction of the total CUDA itself
    /// reports (which is less than NVML's on most drivers).
    #[serde(default)]
    pub cap_mb: Option<u64>,
    /// Set for a MIG instance: its GPU's NVML index and its MIG slot (hwFetch needs both).
    #[serde(default)]
    pub mig: Option<MigInstance>,
    /// Under NVIDIA MPS: the worker's driver-enforced memory limit, MB, set as
    /// `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=<n>MB` (its device is 0 to itself) before CUDA
    /// starts; never above the limit the server inherited ([`gpu_env`]).
    #[serde(default)]
    pub mps_limit_mb: Option<u64>,
    /// The GPU's CUDA compute capability, `major.minor`, as the master's NVML reads it
    /// (`None`: not told): an AOTInductor package compiled for another is refused at boot.
    #[serde(default)]
    pub compute_capability: Option<String>,
}

/// `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`: an MPS client's limit on the device memory it may
/// allocate, per device as the client numbers them (NVIDIA's MPS documentation: e.g.
/// `0=1G,1=512MB`).
pub const ENV_MPS_MEM_LIMIT: &str = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT";

/// The value of [`ENV_MPS_MEM_LIMIT`] for a worker limited to `mb` on its one device.
pub fn mps_limit_value(mb: u64) -> String {
    format!("0={mb}MB")
}

/// The GPU variables a worker placed on `gpu` starts CUDA with: `CUDA_VISIBLE_DEVICES` (its
/// device alone, or none), and under MPS its own per-client limit. That limit replaces one
/// the server inherited: the plan bounded it by the inherited one for that GPU (never
/// above it), while the inherited value, numbered by the master's devices, would give the
/// worker (whose one device is 0 to itself) another device's limit. Both the master
/// (exec) and the template (fork) apply them.
pub fn gpu_env(gpu: Option<&GpuAssignment>) -> Vec<(&'static str, String)> {
    let mut env = vec![(
        "CUDA_VISIBLE_DEVICES",
        gpu.map_or(String::new(), |g| g.uuid.clone()),
    )];
    if let Some(mb) = gpu.and_then(|g| g.mps_limit_mb) {
        env.push((ENV_MPS_MEM_LIMIT, mps_limit_value(mb)));
    }
    env
}

/// Where a MIG instance sits: its GPU and its place among that GPU's MIG devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct MigInstance {
    /// NVML index of the GPU it is part of.
    pub parent: u32,
    /// Its index for `nvmlDeviceGetMigDeviceHandleByIndex` on that GPU.
    pub slot: u32,
}
