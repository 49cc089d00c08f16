//! The numbers of fitting (rules 3 and 7 of the plan): what a GPU offers the server
//! ([`usable_mb`], by the size table [`UTILIZATION_BY_GPU_SIZE`]), what one worker is
//! planned as ([`per_worker_mb`]), how many fit ([`workers_fitting`], **the one rule**) and
//! whether a GPU admits one more ([`admits`]). The plan asks them at start; the
//! supervisor's rules (`master::rules`) and the footprint learner ask the same functions
//! later, so that no second copy of a rule can drift.

/// GPU memory one worker's CUDA context takes beside what its caching allocator holds, in
/// MB: about 0.5 GB on an H100 with CUDA 12–13 and lazy module loading (PyTorch's
/// "CUDA semantics" notes give 300–800 MB by GPU and CUDA version). NVML counts it in the
/// process's figure; the allocator's cap does not.
pub const CUDA_CONTEXT_MB: u64 = 500;

/// The least context a measurement is taken as, in MB. A figure below it
/// means the measurement missed part of the context — NVML read before libtorch's lazily
/// loaded kernels and library handles were in, or the allocator's reserved bytes read after
/// they grew — since a CUDA context with torch's libraries takes several hundred MB on
/// every GPU it supports ([`CUDA_CONTEXT_MB`]). Planning on less would cap workers above
/// what the GPU holds.
pub const CUDA_CONTEXT_FLOOR_MB: u64 = 256;

/// The least allocator cap a worker is planned with, in MB.
pub const MIN_ALLOCATOR_MB: u64 = 64;

/// MB one worker is planned as: the estimate, but at least a CUDA context plus
/// [`MIN_ALLOCATOR_MB`] (rule 7).
pub fn per_worker_mb(typ: u64) -> u64 {
    typ.max(CUDA_CONTEXT_MB + MIN_ALLOCATOR_MB)
}

/// Default share of a GPU's memory the server may plan for, by the GPU's total memory:
/// `(at least this many MB, fraction)`, first match wins.
///
/// From KAITO's OOM prevention (kaito-project/kaito, `docs/inference/oom-prevention` and
/// `presets/.../inference_api.py`): a fixed percentage suits no GPU size, because what
/// CUDA contexts, cuBLAS workspaces and allocator fragments take does not shrink with the
/// card, so smaller GPUs (under 20 GB) must keep a bigger share back, and even the largest
/// never plan past 0.95. The per-GPU `--gpu-reserve-mb` is taken off on top of this.
pub const UTILIZATION_BY_GPU_SIZE: &[(u64, f64)] = &[
    (60 * 1024, 0.95), // 80 GB A100/H100, 141 GB H200, 96 GB …
    (20 * 1024, 0.90), // 24 GB RTX 4090/L4/A10, 40–48 GB A100/L40S
    (0, 0.84),         // 16 GB T4/V100, 8–12 GB consumer cards
];

/// The default utilisation fraction for a GPU of `total_mb` ([`UTILIZATION_BY_GPU_SIZE`]).
pub fn default_utilization(total_mb: u64) -> f64 {
    UTILIZATION_BY_GPU_SIZE
        .iter()
        .find(|(min, _)| total_mb >= *min)
        .map_or(0.84, |(_, f)| *f)
}

/// What a GPU of `total_mb` with `free_mb` free offers the server: `min(total × fraction,
/// free) − reserve`, saturating at 0 (rule 3). The plan and the placement of slots beyond
/// it ([`crate::master::rules::place_unplaced`]) both ask it.
pub fn usable_mb(total_mb: u64, fraction: f64, free_mb: u64, reserve_mb: u64) -> u64 {
    share_mb(total_mb, fraction)
        .min(free_mb)
        .saturating_sub(reserve_mb)
}

/// The share of a GPU of `total_mb` the servers may plan for: `floor(total × fraction)`
/// (what [`usable_mb`] takes at most, and what the GPU-memory ledger's reservations of all
/// servers together stay within).
pub fn share_mb(total_mb: u64, fraction: f64) -> u64 {
    (total_mb as f64 * fraction).floor() as u64
}

/// **The one rule of fitting**: how many workers of `per_worker_mb` fit in `usable_mb`
/// (`floor(usable / per worker)`; a worker fits where `usable ≥ per worker`). Asked by the
/// plan for each GPU, by [`crate::master::rules::place_unplaced`] for a slot beyond the
/// plan, and by the footprint learner with the footprint observed while serving.
pub fn workers_fitting(usable_mb: u64, per_worker_mb: u64) -> u32 {
    match usable_mb.checked_div(per_worker_mb) {
        Some(n) => u32::try_from(n).unwrap_or(u32::MAX),
        None => u32::MAX,
    }
}

/// Admission (from djl-serving), the one rule for it: a GPU with `free_mb` free takes
/// one more worker only when that covers `est_gpu_mem_min` plus the reserve. The plan asks
/// it of each GPU's free memory at start (rule 3); the supervisor asks it before every
/// start on a GPU and before it places a slot beyond the plan
/// (`master::rules::Admission`, which settles whose metadata counts after a reload).
pub fn admits(free_mb: u64, est_gpu_mem_min: u64, reserve_mb: u64) -> bool {
    free_mb >= est_gpu_mem_min + reserve_mb
}
