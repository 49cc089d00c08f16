//! The worker plan (SPEC §4, §7): how many workers to start and where each one goes, from
//! the measured [`Resources`], the app metadata's GPU estimates and the [`Policy`] taken
//! from the command line. **Pure**: no I/O, no clock, no environment, so every rule is
//! covered by the table-driven tests at the bottom.
//!
//! The rules, in order:
//!
//! 1. CPU bound = `2 × cpus + 1` (gunicorn's rule of thumb).
//! 2. Where workers go ([`PlacementMode`]):
//!    - `--device cpu`, or `est_gpu_mem_typ == 0` with `--device auto`: every worker on the
//!      CPU, bounded by CPU only.
//!    - `est_gpu_mem_typ > 0` with `--device auto` and no GPU visible: CPU, with a loud
//!      warning (the app expected a GPU).
//!    - `--device cuda` and no GPU visible: [`PlanError::NoGpu`].
//!    - `--device cuda` and `est_gpu_mem_typ == 0`: workers spread round-robin over the
//!      GPUs with no memory bound and no allocator cap (the app gave no estimate), warned.
//!    - otherwise the GPU bound applies (next point).
//! 3. Per GPU: `fraction` from [`UTILIZATION_BY_GPU_SIZE`] (or `--gpu-memory-utilization`),
//!    `usable = min(total × fraction, free) − reserve` (saturating at 0), and
//!    `fits = floor(usable / est_gpu_mem_typ)`, but 0 when `free < est_gpu_mem_min +
//!    reserve` (admission). GPU bound = Σ fits; 0 is [`PlanError::DoesNotFit`].
//! 4. Workers = min(CPU bound, GPU bound), or the override (`--workers`, …) as given.
//! 5. Placement: each worker goes to the GPU with the most remaining capacity
//!    (`fits − assigned`), ties to the lower index. This keeps spare room balanced over
//!    GPUs, which is what start-then-stop recycling and TTIN need.
//! 6. An override larger than the GPU bound is accepted: the first `gpu_bound` slots are
//!    placed, the rest are listed in [`Plan::unplaced`] with a warning; the master starts
//!    them only when admission passes ([`Plan::next_target`], [`admits`]).
//! 7. Each GPU worker's allocator cap ([`GpuPlan::cap_mb`]) is `usable / fits −
//!    CUDA_CONTEXT_MB`: every worker's CUDA context comes on top of what its caching
//!    allocator may take, so caps and contexts of as many workers as fit sum to at most
//!    `usable` even after TTIN fills the GPU. `est_gpu_mem_typ` is a whole worker as
//!    `nvidia-smi` shows it, context included; one below a context plus
//!    [`MIN_ALLOCATOR_MB`] is planned as that much, with a warning.
//! 8. Torch intra-op threads per worker: `--torch-threads` (or `MKL_NUM_THREADS`/
//!    `OMP_NUM_THREADS`, read by `config`), else `max(1, cpus / workers)`.
//! 9. Compute mode: a GPU in `prohibited` mode takes no worker; one in
//!    `exclusive_process` mode (or the withdrawn `exclusive_thread`) takes at most one,
//!    since only one process at a time may hold a CUDA context there.
//! 10. MIG: a GPU in MIG mode is not a device; each of its MIG instances is one, with its
//!     own memory (`resources`), planned like a GPU and named `GPU <n> MIG <slot>`.
//! 11. A driver whose CUDA version is older than the build's ([`CUDA_BUILD_VERSION`])
//!     cannot run the worker on a GPU: a plan that would place workers on GPUs records it
//!     in [`Plan::driver_too_old`] (and its warnings), and `app` refuses to start on it
//!     unless `--device cuda` insists (CUDA forward-compatibility libraries in a container
//!     can make it work; a worker that then finds no CUDA still stops the server).
//!
//! MB means MiB (2^20 bytes) throughout, as `nvidia-smi` prints it.

use std::fmt::Write as _;

use serde::Serialize;

use std::path::PathBuf;

use crate::master::resources::{ComputeMode, GpuInfo, MigInstance, Resources};
use crate::metadata::AppMetadata;
use crate::protocol::{
    cuda_version_text, Device, GpuAssignment, CUDA_BUILD_MIN_DRIVER, CUDA_BUILD_VERSION,
};

/// GPU memory one worker's CUDA context takes beside what its caching allocator holds, in
/// MB: about 0.5 GB on an H100 with CUDA 12–13 and lazy module loading (PyTorch's
/// "CUDA semantics" notes give 300–800 MB by GPU and CUDA version). NVML counts it in the
/// process's figure; the allocator's cap does not.
pub const CUDA_CONTEXT_MB: u64 = 500;

/// The least allocator cap a worker is planned with, in MB.
pub const MIN_ALLOCATOR_MB: u64 = 64;

/// MB one worker is planned as: the estimate, but at least a CUDA context plus
/// [`MIN_ALLOCATOR_MB`] (rule 7).
pub fn per_worker_mb(typ: u64) -> u64 {
    typ.max(CUDA_CONTEXT_MB + MIN_ALLOCATOR_MB)
}

/// What a GPU of `total_mb` with `free_mb` free offers the server: `min(total × fraction,
/// free) − reserve`, saturating at 0 (rule 3). The plan and the placement of slots beyond
/// it ([`crate::master::rules::place_unplaced`]) both ask it.
pub fn usable_mb(total_mb: u64, fraction: f64, free_mb: u64, reserve_mb: u64) -> u64 {
    let share = (total_mb as f64 * fraction).floor() as u64;
    share.min(free_mb).saturating_sub(reserve_mb)
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

/// What the app asks of a GPU: the numbers [`plan`] reads, taken from the app metadata
/// ([`Demand::declared`]) and, when a worker's footprint was measured, from that
/// (`master::measured`). The declared metadata is never changed: the plan owns the
/// figure per worker ([`Plan::planned_typ_mb`]) and every reader takes it from there.
#[derive(Debug, Clone, PartialEq)]
pub struct Demand {
    /// `est_gpu_mem_min`: what a GPU must have free (plus the reserve) to take a worker.
    pub min_mb: u64,
    /// MB per worker to plan with: `est_gpu_mem_typ` as declared, or the measured
    /// footprint with headroom.
    pub typ_mb: u64,
    /// `est_gpu_mem_typ` as declared.
    pub declared_typ_mb: u64,
    /// The footprint `typ_mb` was made from, when it was measured.
    pub measured_mb: Option<u64>,
    /// The metadata file, named in warnings.
    pub metadata: PathBuf,
    /// The metadata's own warnings, first among the plan's.
    pub warnings: Vec<String>,
}

impl Demand {
    /// What the metadata declares.
    pub fn declared(meta: &AppMetadata) -> Demand {
        Demand {
            min_mb: meta.est_gpu_mem_min,
            typ_mb: meta.est_gpu_mem_typ,
            declared_typ_mb: meta.est_gpu_mem_typ,
            measured_mb: None,
            metadata: meta.path.clone(),
            warnings: meta.warnings(),
        }
    }

    /// Planned from a measured footprint: `planned_mb` per worker instead of the estimate.
    pub fn measured(self, footprint_mb: u64, planned_mb: u64) -> Demand {
        Demand {
            typ_mb: planned_mb,
            measured_mb: Some(footprint_mb),
            ..self
        }
    }
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

/// A fixed worker count that replaces the planned one, and where it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct WorkerOverride {
    pub count: u32,
    /// `"--workers"`, `"VRAMFORK_WORKERS"` or `"CLAMS_GUNICORN_WORKERS"`.
    pub source: &'static str,
}

/// The planning choices from the command line (validated by `config`).
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub workers_override: Option<WorkerOverride>,
    pub device: Device,
    /// `--gpu-memory-utilization`: replaces the size table for every GPU; (0, 1].
    pub gpu_memory_utilization: Option<f64>,
    /// `--gpu-reserve-mb`: kept free on every GPU.
    pub gpu_reserve_mb: u64,
    /// Torch intra-op threads per worker, when the operator set them.
    pub torch_threads: Option<TorchThreads>,
}

/// Torch intra-op threads per worker as the operator set them, and where
/// (`--torch-threads`, `VRAMFORK_TORCH_THREADS`, `MKL_NUM_THREADS` or `OMP_NUM_THREADS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TorchThreads {
    pub count: usize,
    pub source: &'static str,
}

impl Default for Policy {
    fn default() -> Policy {
        Policy {
            workers_override: None,
            device: Device::Auto,
            gpu_memory_utilization: None,
            gpu_reserve_mb: 500,
            torch_threads: None,
        }
    }
}

/// How workers are placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PlacementMode {
    /// Every worker on the CPU.
    Cpu,
    /// On GPUs, bounded by what fits in their memory.
    GpuMemory,
    /// On GPUs round-robin, not bounded by memory (`--device cuda`, no estimate).
    GpuSpread,
}

/// One GPU as the plan sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuPlan {
    pub index: u32,
    /// `GPU 1` or `GPU 0 MIG 2`.
    pub label: String,
    pub name: String,
    pub uuid: String,
    pub compute_mode: ComputeMode,
    /// Set when this device is a MIG instance.
    pub mig: Option<MigInstance>,
    pub total_mb: u64,
    pub free_mb: u64,
    /// Utilisation fraction applied (table or override).
    pub fraction: f64,
    /// `min(total × fraction, free) − reserve`.
    pub usable_mb: u64,
    /// Workers that fit by memory (0 when not admitted). In spread placement (no memory
    /// estimate) it is the round-robin share instead: `ceil(max(workers, CPU bound) / GPUs)`.
    pub fits: u32,
    /// Workers the plan puts here.
    pub assigned: u32,
    /// Allocator cap of each worker here, `usable / fits − CUDA_CONTEXT_MB`, when bounded.
    pub cap_mb: Option<u64>,
    /// The cap as a share of `total_mb`.
    pub memory_fraction: Option<f64>,
    /// Why this GPU takes no worker, when it takes none.
    pub excluded: Option<String>,
}

/// Where one worker slot goes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Placement {
    pub slot: u32,
    /// `None`: on the CPU.
    pub gpu: Option<GpuAssignment>,
}

/// Where the master should start one more worker ([`Plan::next_target`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Target {
    Cpu,
    Gpu(GpuAssignment),
    /// Every GPU is at capacity.
    NoRoom,
}

/// The plan: every input, each bound and why, the result and each worker's place.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    /// Worker slots to run (placed + unplaced).
    pub workers: u32,
    /// `"plan"`, or the override's source.
    pub source: String,
    /// What the user asked for.
    pub requested_device: Device,
    /// What the workers use: `cpu` or `cuda` (never `auto`).
    pub device: Device,
    pub mode: PlacementMode,
    pub cpus: usize,
    /// `2 × cpus + 1`.
    pub cpu_bound: u32,
    /// Σ fits over GPUs, when GPU memory bounds the count.
    pub gpu_bound: Option<u32>,
    pub est_gpu_mem_min: u64,
    /// MB per worker the plan assumes, **the one figure every reader takes**: the
    /// metadata's `est_gpu_mem_typ` as declared, or the measured footprint with headroom
    /// (`master::measured`). Named `est_gpu_mem_typ` in `app plan --json`.
    #[serde(rename = "est_gpu_mem_typ")]
    pub planned_typ_mb: u64,
    /// The metadata's `est_gpu_mem_typ` as declared.
    pub declared_typ_mb: u64,
    /// The footprint one worker was measured with (`--profile-memory`, `--footprint-file`),
    /// when the plan was made from it.
    pub measured_mb: Option<u64>,
    pub reserve_mb: u64,
    /// `--gpu-memory-utilization`, when given.
    pub utilization_override: Option<f64>,
    /// The GPUs workers may go to (empty on the CPU), in NVML index order.
    pub gpus: Vec<GpuPlan>,
    /// Placed slots, `0..placement.len()`.
    pub placement: Vec<Placement>,
    /// Slots the override asked for that fit nowhere now (started when memory frees).
    pub unplaced: Vec<u32>,
    pub torch_threads: usize,
    /// How the result was reached, one sentence each.
    pub why: Vec<String>,
    pub warnings: Vec<String>,
    /// From probing: why no (or fewer) GPUs were seen.
    pub gpu_note: Option<String>,
    /// The NVIDIA driver's version, when NVML says.
    pub driver_version: Option<String>,
    /// The newest CUDA version the driver supports (12040 = 12.4), when NVML says.
    pub cuda_driver_version: Option<u32>,
    /// The CUDA version the worker's libtorch is built with ([`CUDA_BUILD_VERSION`]).
    pub cuda_build_version: u32,
    /// [`CUDA_CONTEXT_MB`].
    pub cuda_context_mb: u64,
    /// Why the driver cannot run the worker on the GPUs this plan uses (rule 11): `app`
    /// refuses to start; `app plan` shows the plan with this warning.
    pub driver_too_old: Option<String>,
}

/// Why no plan could be made (exit 2).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    /// The model fits on no GPU; the message names each GPU and suggests `--device cpu`.
    #[error("{message}")]
    DoesNotFit { message: String, gpus: Vec<GpuPlan> },
    /// `--device cuda` but NVML shows no GPU.
    #[error("{0}")]
    NoGpu(String),
    /// A policy value the planner cannot use (config should have caught it).
    #[error("{0}")]
    InvalidPolicy(String),
}

/// Makes the plan. See the module documentation for the rules.
pub fn plan(res: &Resources, demand: &Demand, policy: &Policy) -> Result<Plan, PlanError> {
    if let Some(f) = policy.gpu_memory_utilization {
        if !(f > 0.0 && f <= 1.0) {
            return Err(PlanError::InvalidPolicy(format!(
                "--gpu-memory-utilization is {f}; allowed: a fraction greater than 0 and at most 1"
            )));
        }
    }
    if let Some(o) = policy.workers_override {
        if o.count == 0 {
            return Err(PlanError::InvalidPolicy(format!(
                "{} is 0; allowed: a whole number of workers ≥ 1",
                o.source
            )));
        }
    }
    if policy.torch_threads.is_some_and(|t| t.count == 0) {
        return Err(PlanError::InvalidPolicy(
            "torch threads is 0; allowed: ≥ 1".into(),
        ));
    }

    let cpus = res.cpus.max(1);
    let cpu_bound = u32::try_from(2 * cpus + 1).unwrap_or(u32::MAX);
    let (min, typ, reserve) = (demand.min_mb, demand.typ_mb, policy.gpu_reserve_mb);
    let mut why = vec![format!("CPU bound = 2 × {cpus} cores + 1 = {cpu_bound}")];
    // The metadata's likely mistakes first (issue 47: `mean`/`std` in 0–255 units).
    let mut warnings = demand.warnings.clone();
    let no_gpu_reason = || {
        res.gpu_note
            .clone()
            .unwrap_or_else(|| "NVML sees no GPU".into())
    };

    let mode = match policy.device {
        Device::Cpu => {
            why.push("--device cpu: every worker on the CPU".into());
            PlacementMode::Cpu
        }
        Device::Cuda if res.gpus.is_empty() => {
            return Err(PlanError::NoGpu(format!(
                "--device cuda, but no GPU is visible through NVML ({}); use --device auto or \
                 --device cpu, or point --nvml-library at the driver's libnvidia-ml.so.1",
                no_gpu_reason()
            )))
        }
        Device::Cuda if typ == 0 => {
            warnings.push(format!(
                "--device cuda but the app metadata's est_gpu_mem_typ is 0: workers are spread \
                 over {} GPU(s) with no memory bound and no allocator cap; set est_gpu_mem_min \
                 and est_gpu_mem_typ in {}",
                res.gpus.len(),
                demand.metadata.display()
            ));
            PlacementMode::GpuSpread
        }
        Device::Auto if typ == 0 => {
            why.push(
                "est_gpu_mem_typ is 0 (the app does not use a GPU): every worker on the CPU".into(),
            );
            if !res.gpus.is_empty() {
                // Often a forgotten or misspelt field: say so where the server starts.
                warnings.push(format!(
                    "{} GPU(s) visible, but {} declares no est_gpu_mem_typ, or 0 (= the app uses \
                     no GPU), so every worker runs on the CPU: set est_gpu_mem_typ (MB one worker \
                     uses, as nvidia-smi shows it) to serve on the GPUs, or pass --device cpu to \
                     say the CPU is meant",
                    res.gpus.len(),
                    demand.metadata.display()
                ));
            }
            PlacementMode::Cpu
        }
        Device::Auto if res.gpus.is_empty() => {
            warnings.push(format!(
                "the app expects a GPU (est_gpu_mem_typ {typ} MB) but none is visible ({}): \
                 serving on the CPU",
                no_gpu_reason()
            ));
            PlacementMode::Cpu
        }
        Device::Auto | Device::Cuda => PlacementMode::GpuMemory,
    };

    // On the CPU the plan lists no GPU (none is used); the ones seen are named in `why`.
    let mut gpus: Vec<GpuPlan> = match mode {
        PlacementMode::Cpu => {
            if !res.gpus.is_empty() {
                let seen: Vec<String> = res
                    .gpus
                    .iter()
                    .map(|g| format!("GPU {} ({}, {} MB free)", g.index, g.name, g.free_mb()))
                    .collect();
                why.push(format!("GPUs seen but not used: {}", seen.join(", ")));
            }
            Vec::new()
        }
        _ => res
            .gpus
            .iter()
            .map(|g| gpu_plan(g, policy, min, typ, reserve, mode))
            .collect(),
    };

    let mut driver_too_old = None;
    if mode != PlacementMode::Cpu {
        if let Some(v) = res.cuda_driver_version.filter(|v| *v < CUDA_BUILD_VERSION) {
            let why = format!(
                "the NVIDIA driver{} supports CUDA up to {}, but the worker's libtorch is built \
                 with CUDA {} and needs a driver that supports it ({CUDA_BUILD_MIN_DRIVER} or \
                 newer): libtorch would see no GPU. Update the NVIDIA driver, or serve on the \
                 CPU with --device cpu",
                res.driver_version
                    .as_deref()
                    .map(|d| format!(" ({d})"))
                    .unwrap_or_default(),
                cuda_version_text(v),
                cuda_version_text(CUDA_BUILD_VERSION),
            );
            if policy.device == Device::Cuda {
                warnings.push(format!(
                    "{why}; --device cuda: starting anyway (a worker that finds no CUDA stops the server, exit 5)"
                ));
            } else {
                warnings.push(why.clone());
                driver_too_old = Some(why);
            }
        }
        for g in gpus
            .iter()
            .filter(|g| g.compute_mode != ComputeMode::Default)
        {
            why.push(format!(
                "{} is in {} compute mode: {}",
                g.label,
                g.compute_mode.name(),
                if g.compute_mode == ComputeMode::Prohibited {
                    "no worker (no process may use it)"
                } else {
                    "at most one worker (one process at a time may use it)"
                }
            ));
        }
        if mode == PlacementMode::GpuMemory && per_worker_mb(typ) > typ {
            warnings.push(format!(
                "est_gpu_mem_typ {typ} MB is less than one worker's CUDA context ({CUDA_CONTEXT_MB} \
                 MB) plus {MIN_ALLOCATOR_MB} MB for its tensors: each worker is planned as {} MB",
                per_worker_mb(typ)
            ));
        }
    }

    let gpu_bound = match mode {
        PlacementMode::GpuMemory => {
            let bound: u32 = gpus.iter().map(|g| g.fits).sum();
            if bound == 0 {
                return Err(does_not_fit(gpus, min, typ, reserve));
            }
            let terms: Vec<String> = gpus.iter().map(|g| g.fits.to_string()).collect();
            let per_worker = per_worker_mb(typ);
            let divisor = if per_worker == typ {
                format!("est_gpu_mem_typ {typ} MB")
            } else {
                format!("{per_worker} MB per worker")
            };
            why.push(format!(
                "GPU bound = Σ floor(usable / {divisor}) = {} = {bound}",
                terms.join(" + ")
            ));
            for g in gpus.iter().filter(|g| g.excluded.is_some()) {
                warnings.push(format!(
                    "{} ({}) takes no worker: {}",
                    g.label,
                    g.name,
                    g.excluded.as_deref().unwrap_or_default()
                ));
            }
            Some(bound)
        }
        PlacementMode::Cpu | PlacementMode::GpuSpread => None,
    };

    let planned = gpu_bound.map_or(cpu_bound, |g| g.min(cpu_bound));
    let (workers, source) = match policy.workers_override {
        Some(o) => {
            why.push(format!(
                "workers = {} from {} (the plan would give {planned})",
                o.count, o.source
            ));
            if o.count > cpu_bound {
                warnings.push(format!(
                    "{} = {} is above the CPU bound {cpu_bound}: workers will compete for cores",
                    o.source, o.count
                ));
            }
            (o.count, o.source.to_string())
        }
        None => {
            match gpu_bound {
                Some(g) => why.push(format!(
                    "workers = min(CPU bound {cpu_bound}, GPU bound {g}) = {planned}"
                )),
                None => why.push(format!("workers = CPU bound = {planned}")),
            }
            (planned, "plan".to_string())
        }
    };

    let mut placed = gpu_bound.map_or(workers, |g| workers.min(g));
    if mode == PlacementMode::GpuSpread {
        // Not a memory bound: the round-robin share, so TTIN spreads further evenly; but
        // never past what the compute mode allows.
        let exclusive = gpus
            .iter()
            .filter(|g| {
                g.compute_mode != ComputeMode::Default && g.compute_mode != ComputeMode::Prohibited
            })
            .count() as u32;
        let open = gpus
            .iter()
            .filter(|g| g.compute_mode == ComputeMode::Default)
            .count() as u32;
        let share = workers
            .max(cpu_bound)
            .saturating_sub(exclusive)
            .div_ceil(open.max(1));
        for g in &mut gpus {
            g.fits = match g.compute_mode {
                ComputeMode::Default => share,
                mode => mode.limit(1),
            };
        }
        let room: u32 = gpus.iter().map(|g| g.fits).sum();
        if room == 0 {
            return Err(does_not_fit(gpus, min, typ, reserve));
        }
        placed = placed.min(room);
    }
    let mut placement = Vec::with_capacity(placed as usize);
    for slot in 0..placed {
        let gpu = match mode {
            PlacementMode::Cpu => None,
            PlacementMode::GpuMemory => {
                let i = most_room(&gpus).expect("placed ≤ Σ fits");
                gpus[i].assigned += 1;
                Some(assignment(&gpus[i]))
            }
            PlacementMode::GpuSpread => {
                let i = most_room(&gpus).expect("placed ≤ Σ shares");
                gpus[i].assigned += 1;
                Some(assignment(&gpus[i]))
            }
        };
        placement.push(Placement { slot, gpu });
    }
    let unplaced: Vec<u32> = (placed..workers).collect();
    if !unplaced.is_empty() {
        warnings.push(format!(
            "{source} asks for {workers} workers but only {placed} fit in GPU memory now: \
             slot(s) {}..={} start only when a GPU has {} MB free (est_gpu_mem_min + reserve) \
             and room for est_gpu_mem_typ {typ} MB",
            placed,
            workers - 1,
            min + reserve
        ));
    }

    let torch_threads = match policy.torch_threads {
        Some(TorchThreads { count, source }) => {
            why.push(format!(
                "torch threads = {count} per worker (set by {source})"
            ));
            count
        }
        None => {
            let t = (cpus / workers.max(1) as usize).max(1);
            why.push(format!(
                "torch threads = max(1, {cpus} cores / {workers} workers) = {t} per worker"
            ));
            t
        }
    };

    Ok(Plan {
        workers,
        source,
        requested_device: policy.device,
        device: if mode == PlacementMode::Cpu {
            Device::Cpu
        } else {
            Device::Cuda
        },
        mode,
        cpus,
        cpu_bound,
        gpu_bound,
        est_gpu_mem_min: min,
        planned_typ_mb: typ,
        declared_typ_mb: demand.declared_typ_mb,
        measured_mb: demand.measured_mb,
        reserve_mb: reserve,
        utilization_override: policy.gpu_memory_utilization,
        gpus,
        placement,
        unplaced,
        torch_threads,
        why,
        warnings,
        gpu_note: res.gpu_note.clone(),
        driver_version: res.driver_version.clone(),
        cuda_driver_version: res.cuda_driver_version,
        cuda_build_version: CUDA_BUILD_VERSION,
        cuda_context_mb: CUDA_CONTEXT_MB,
        driver_too_old,
    })
}

fn gpu_plan(
    g: &GpuInfo,
    policy: &Policy,
    min: u64,
    typ: u64,
    reserve: u64,
    mode: PlacementMode,
) -> GpuPlan {
    let (total_mb, free_mb) = (g.total_mb(), g.free_mb());
    let fraction = policy
        .gpu_memory_utilization
        .unwrap_or_else(|| default_utilization(total_mb));
    let usable_mb = usable_mb(total_mb, fraction, free_mb, reserve);
    let per_worker = per_worker_mb(typ);
    let (fits, excluded) = match mode {
        PlacementMode::Cpu => (0, None),
        PlacementMode::GpuSpread => (
            0,
            (g.compute_mode == ComputeMode::Prohibited)
                .then(|| "compute mode prohibited: no process may use it".to_string()),
        ),
        PlacementMode::GpuMemory if g.compute_mode == ComputeMode::Prohibited => (
            0,
            Some("compute mode prohibited: no process may use it".to_string()),
        ),
        PlacementMode::GpuMemory if !admits(free_mb, min, reserve) => (
            0,
            Some(format!(
                "{free_mb} MB free < est_gpu_mem_min {min} MB + reserve {reserve} MB"
            )),
        ),
        PlacementMode::GpuMemory => {
            let fits = g.compute_mode.limit(workers_fitting(usable_mb, per_worker));
            let excluded = (fits == 0).then(|| {
                format!(
                    "{usable_mb} MB usable (min({total_mb} MB × {fraction}, {free_mb} MB free) \
                     − reserve {reserve} MB) < {per_worker} MB per worker"
                )
            });
            (fits, excluded)
        }
    };
    let cap_mb = (mode == PlacementMode::GpuMemory && fits > 0)
        .then(|| (usable_mb / u64::from(fits)).saturating_sub(CUDA_CONTEXT_MB));
    let memory_fraction = cap_mb
        .filter(|_| total_mb > 0)
        .map(|c| floor4(c as f64 / total_mb as f64));
    GpuPlan {
        index: g.index,
        label: g.label(),
        name: g.name.clone(),
        uuid: g.uuid.clone(),
        compute_mode: g.compute_mode,
        mig: g.mig,
        total_mb,
        free_mb,
        fraction,
        usable_mb,
        fits,
        assigned: 0,
        cap_mb,
        memory_fraction,
        excluded,
    }
}

/// Rounds down to 4 decimals (a cap a little low is safe, a little high is not).
fn floor4(x: f64) -> f64 {
    (x * 10_000.0).floor() / 10_000.0
}

/// The GPU with the most remaining capacity, ties to the lower index.
fn most_room(gpus: &[GpuPlan]) -> Option<usize> {
    gpus.iter()
        .enumerate()
        .filter(|(_, g)| g.fits > g.assigned)
        .max_by(|(ia, a), (ib, b)| {
            (a.fits - a.assigned)
                .cmp(&(b.fits - b.assigned))
                .then(ib.cmp(ia))
        })
        .map(|(i, _)| i)
}

fn assignment(g: &GpuPlan) -> GpuAssignment {
    g.assignment()
}

impl GpuPlan {
    /// What a worker placed here is told.
    pub fn assignment(&self) -> GpuAssignment {
        let g = self;
        GpuAssignment {
            index: g.index,
            uuid: g.uuid.clone(),
            memory_fraction: g.memory_fraction,
            cap_mb: g.cap_mb,
            mig: g.mig,
        }
    }
}

/// Admission (SPEC, from djl-serving), the one rule for it: a GPU with `free_mb` free takes
/// one more worker only when that covers `est_gpu_mem_min` plus the reserve. The plan asks
/// it of each GPU's free memory at start (rule 3); the supervisor asks it before every
/// start on a GPU and before it places a slot beyond the plan
/// (`master::rules::Admission`, which settles whose metadata counts after a reload).
pub fn admits(free_mb: u64, est_gpu_mem_min: u64, reserve_mb: u64) -> bool {
    free_mb >= est_gpu_mem_min + reserve_mb
}

fn does_not_fit(gpus: Vec<GpuPlan>, min: u64, typ: u64, reserve: u64) -> PlanError {
    let per_gpu: Vec<String> = gpus
        .iter()
        .map(|g| {
            format!(
                "{} ({}, {} MB total, {} MB free): {}",
                g.label,
                g.name,
                g.total_mb,
                g.free_mb,
                g.excluded.as_deref().unwrap_or("no room")
            )
        })
        .collect();
    let message = format!(
        "the model does not fit on any GPU (est_gpu_mem_min {min} MB, est_gpu_mem_typ {typ} MB, \
         reserve {reserve} MB per GPU): {}; use --device cpu to serve on the CPU, or free GPU \
         memory, lower --gpu-reserve-mb or raise --gpu-memory-utilization",
        per_gpu.join("; ")
    );
    PlanError::DoesNotFit { message, gpus }
}

impl Plan {
    /// Workers that fit on GPU `index` by memory; `None` when memory does not bound it
    /// (CPU or spread placement) or the GPU is unknown.
    pub fn gpu_capacity(&self, index: u32) -> Option<u32> {
        if self.mode != PlacementMode::GpuMemory {
            return None;
        }
        self.gpus.iter().find(|g| g.index == index).map(|g| g.fits)
    }

    /// The most workers memory allows in all (TTIN beyond it is refused); `None`: unbounded.
    pub fn max_workers(&self) -> Option<u32> {
        self.gpu_bound
    }

    /// MB that must be free on a GPU before a worker starts there (admission).
    pub fn admission_mb(&self) -> u64 {
        self.est_gpu_mem_min + self.reserve_mb
    }

    /// Where one more worker should go, given how many run on each GPU now
    /// (`running_on(index)`): the GPU with the most capacity left (memory placement), the
    /// one with the fewest workers (spread), or the CPU. Admission is still to be checked
    /// against the GPU's free memory now ([`admits`]).
    pub fn next_target(&self, running_on: impl Fn(u32) -> u32) -> Target {
        let pick = match self.mode {
            PlacementMode::Cpu => return Target::Cpu,
            PlacementMode::GpuMemory => self
                .gpus
                .iter()
                .filter(|g| g.fits > running_on(g.index))
                .max_by(|a, b| {
                    (a.fits - running_on(a.index))
                        .cmp(&(b.fits - running_on(b.index)))
                        .then(b.index.cmp(&a.index))
                }),
            // Past the share on a GPU any process may use; never past a compute mode's limit.
            PlacementMode::GpuSpread => self
                .gpus
                .iter()
                .filter(|g| g.compute_mode == ComputeMode::Default || g.fits > running_on(g.index))
                .filter(|g| g.compute_mode != ComputeMode::Prohibited)
                .min_by(|a, b| {
                    running_on(a.index)
                        .cmp(&running_on(b.index))
                        .then(a.index.cmp(&b.index))
                }),
        };
        pick.map_or(Target::NoRoom, |g| Target::Gpu(assignment(g)))
    }

    /// How messages name device `index` (`GPU 1`, `GPU 0 MIG 2`).
    pub fn gpu_label(&self, index: u32) -> String {
        self.gpus
            .iter()
            .find(|g| g.index == index)
            .map_or_else(|| format!("GPU {index}"), |g| g.label.clone())
    }

    /// The plan as pretty JSON (`app plan --json`).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a plan always serializes")
    }

    /// The plan for people (`app plan`): inputs, each GPU, bounds and why, the result,
    /// where each worker goes, and warnings marked loudly.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        // Writing to a String cannot fail.
        let _ = self.write_text(&mut s);
        s
    }

    fn write_text(&self, s: &mut String) -> std::fmt::Result {
        writeln!(s, "inputs")?;
        writeln!(s, "  cpus                  {}", self.cpus)?;
        writeln!(
            s,
            "  device                {}",
            self.requested_device.name()
        )?;
        writeln!(s, "  est_gpu_mem_min       {} MB", self.est_gpu_mem_min)?;
        match self.measured_mb {
            None => writeln!(s, "  est_gpu_mem_typ       {} MB", self.planned_typ_mb)?,
            Some(m) => writeln!(
                s,
                "  per worker            {} MB, from a measured footprint of {m} MB (est_gpu_mem_typ declared {} MB)",
                self.planned_typ_mb, self.declared_typ_mb
            )?,
        }
        writeln!(s, "  gpu reserve           {} MB per GPU", self.reserve_mb)?;
        match self.utilization_override {
            Some(f) => writeln!(s, "  gpu utilisation       {f} (--gpu-memory-utilization)")?,
            None => {
                let table: Vec<String> = UTILIZATION_BY_GPU_SIZE
                    .iter()
                    .map(|(mb, f)| format!("≥ {} GiB: {f}", mb / 1024))
                    .collect();
                writeln!(
                    s,
                    "  gpu utilisation       by GPU size ({})",
                    table.join(", ")
                )?
            }
        }
        if self.source != "plan" {
            writeln!(
                s,
                "  workers override      {} ({})",
                self.workers, self.source
            )?;
        }
        let cuda = |v: Option<u32>| v.map_or_else(|| "unknown".to_string(), cuda_version_text);
        writeln!(
            s,
            "  driver                {} (CUDA {}); worker built for CUDA {} (driver {CUDA_BUILD_MIN_DRIVER}+)",
            self.driver_version.as_deref().unwrap_or("unknown"),
            cuda(self.cuda_driver_version),
            cuda_version_text(self.cuda_build_version)
        )?;
        writeln!(s, "gpus (NVML)")?;
        if self.gpus.is_empty() {
            match &self.gpu_note {
                Some(note) => writeln!(s, "  none: {note}")?,
                None => writeln!(s, "  none used: workers run on the CPU")?,
            }
        } else if let Some(note) = &self.gpu_note {
            writeln!(s, "  note: {note}")?;
        }
        for g in &self.gpus {
            write!(s, "  {}  {}  {}", g.label, g.name, g.uuid)?;
            if g.compute_mode != ComputeMode::Default {
                write!(s, "  compute mode {}", g.compute_mode.name())?;
            }
            write!(
                s,
                "\n    total {} MB, free {} MB, fraction {}, usable {} MB",
                g.total_mb, g.free_mb, g.fraction, g.usable_mb
            )?;
            if self.mode == PlacementMode::GpuMemory {
                write!(s, ", fits {}, assigned {}", g.fits, g.assigned)?;
            } else if self.mode == PlacementMode::GpuSpread {
                write!(s, ", assigned {}", g.assigned)?;
            }
            if let (Some(cap), Some(mf)) = (g.cap_mb, g.memory_fraction) {
                write!(
                    s,
                    ", allocator cap {cap} MB ({mf}) + CUDA context ~{} MB per worker",
                    self.cuda_context_mb
                )?;
            }
            writeln!(s)?;
            if let Some(x) = &g.excluded {
                if self.mode != PlacementMode::Cpu {
                    writeln!(s, "    no worker: {x}")?;
                }
            }
        }
        writeln!(s, "bounds and result")?;
        for w in &self.why {
            writeln!(s, "  {w}")?;
        }
        writeln!(
            s,
            "  => {} worker(s) on {} ({})",
            self.workers,
            self.device.name(),
            self.source
        )?;
        writeln!(s, "placement")?;
        for (first, last, gpu) in runs(&self.placement) {
            let slots = if first == last {
                format!("worker {first}")
            } else {
                format!("workers {first}-{last}")
            };
            match gpu {
                None => writeln!(s, "  {slots} -> CPU")?,
                Some(a) => {
                    let label = self.gpu_label(a.index);
                    write!(s, "  {slots} -> {label} ({})", a.uuid)?;
                    match (a.cap_mb, a.memory_fraction) {
                        (Some(c), Some(f)) => writeln!(s, ", allocator cap {c} MB ({f})")?,
                        _ => writeln!(s)?,
                    }
                }
            }
        }
        if let (Some(first), Some(last)) = (self.unplaced.first(), self.unplaced.last()) {
            writeln!(
                s,
                "  workers {first}-{last} -> not placed: wait for {} MB free on a GPU",
                self.admission_mb()
            )?;
        }
        for w in &self.warnings {
            writeln!(s, "WARNING: {w}")?;
        }
        Ok(())
    }
}

/// Consecutive slots with the same place, as (first, last, place).
fn runs(placement: &[Placement]) -> Vec<(u32, u32, Option<&GpuAssignment>)> {
    let mut out: Vec<(u32, u32, Option<&GpuAssignment>)> = Vec::new();
    for p in placement {
        match out.last_mut() {
            Some((_, last, gpu)) if *gpu == p.gpu.as_ref() && *last + 1 == p.slot => *last = p.slot,
            _ => out.push((p.slot, p.slot, p.gpu.as_ref())),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::master::resources::MB;

    const GIB: u64 = 1024; // in MB

    fn meta(min: u64, typ: u64) -> Demand {
        Demand::declared(
            &AppMetadata::parse(
                Path::new("/apps/demo/app-metadata.json"),
                &format!(
                    r#"{{"name": "demo", "est_gpu_mem_min": {min}, "est_gpu_mem_typ": {typ}}}"#
                ),
            )
            .unwrap(),
        )
    }

    fn gpu(index: u32, name: &str, total_mb: u64, free_mb: u64) -> GpuInfo {
        GpuInfo {
            reserved_bytes: 0,
            compute_mode: ComputeMode::Default,
            mig: None,
            index,
            uuid: format!("GPU-{index:08}"),
            name: name.into(),
            total_bytes: total_mb * MB,
            free_bytes: free_mb * MB,
            used_bytes: (total_mb - free_mb) * MB,
        }
    }

    fn res(cpus: usize, gpus: Vec<GpuInfo>) -> Resources {
        Resources {
            cpus,
            gpus,
            gpu_note: None,
            driver_version: None,
            cuda_driver_version: None,
        }
    }

    fn a100_40(index: u32) -> GpuInfo {
        gpu(index, "NVIDIA A100-SXM4-40GB", 40 * GIB, 40 * GIB - 400)
    }

    fn over(count: u32) -> Option<WorkerOverride> {
        Some(WorkerOverride {
            count,
            source: "--workers",
        })
    }

    /// Workers per GPU index, in GPU order.
    fn per_gpu(p: &Plan) -> Vec<u32> {
        p.gpus.iter().map(|g| g.assigned).collect()
    }

    struct Case {
        name: &'static str,
        res: Resources,
        meta: Demand,
        policy: Policy,
        workers: u32,
        gpu_bound: Option<u32>,
        per_gpu: Vec<u32>,
        unplaced: u32,
        device: Device,
    }

    #[test]
    fn table() {
        let auto = Policy::default();
        let cases = vec![
            Case {
                name: "CPU only, app without GPU",
                res: res(4, vec![]),
                meta: meta(0, 0),
                policy: auto.clone(),
                workers: 9,
                gpu_bound: None,
                per_gpu: vec![],
                unplaced: 0,
                device: Device::Cpu,
            },
            Case {
                // usable = min(40960 × 0.9 = 36864, 40560) − 500 = 36364 → 7 × 5000
                name: "one A100 40GB, GPU bound below CPU bound",
                res: res(16, vec![a100_40(0)]),
                meta: meta(3000, 5000),
                policy: auto.clone(),
                workers: 7,
                gpu_bound: Some(7),
                per_gpu: vec![7],
                unplaced: 0,
                device: Device::Cuda,
            },
            Case {
                name: "one GPU, CPU bound below GPU bound",
                res: res(2, vec![a100_40(0)]),
                meta: meta(500, 1000),
                policy: auto.clone(),
                workers: 5,
                gpu_bound: Some(36),
                per_gpu: vec![5],
                unplaced: 0,
                device: Device::Cuda,
            },
            Case {
                // T4 16 GB: 15360 × 0.84 = 12902 − 500 = 12402 → 6 × 2000; A100 80 GB:
                // 81920 × 0.95 = 77824 − 500 = 77324 → 38. Bound 44, CPU bound 17.
                name: "two GPUs of different sizes, balanced by remaining room",
                res: res(
                    8,
                    vec![
                        gpu(0, "Tesla T4", 15 * GIB, 15 * GIB - 300),
                        gpu(1, "NVIDIA A100-SXM4-80GB", 80 * GIB, 80 * GIB - 500),
                    ],
                ),
                meta: meta(1000, 2000),
                policy: auto.clone(),
                workers: 17,
                gpu_bound: Some(44),
                per_gpu: vec![0, 17],
                unplaced: 0,
                device: Device::Cuda,
            },
            Case {
                name: "eight GPUs, spread evenly",
                res: res(64, (0..8).map(a100_40).collect()),
                meta: meta(3000, 5000),
                policy: auto.clone(),
                workers: 56,
                gpu_bound: Some(56),
                per_gpu: vec![7; 8],
                unplaced: 0,
                device: Device::Cuda,
            },
            Case {
                name: "eight GPUs, CPU bound splits them round-robin",
                res: res(6, (0..8).map(a100_40).collect()),
                meta: meta(3000, 5000),
                policy: auto.clone(),
                workers: 13,
                gpu_bound: Some(56),
                per_gpu: vec![2, 2, 2, 2, 2, 1, 1, 1],
                unplaced: 0,
                device: Device::Cuda,
            },
            Case {
                // free 12000 < 40960 × 0.9: usable = 12000 − 500 = 11500 → 2
                name: "partially used GPU plans on free memory",
                res: res(16, vec![gpu(0, "NVIDIA A100-SXM4-40GB", 40 * GIB, 12000)]),
                meta: meta(3000, 5000),
                policy: auto.clone(),
                workers: 2,
                gpu_bound: Some(2),
                per_gpu: vec![2],
                unplaced: 0,
                device: Device::Cuda,
            },
            Case {
                // 8 GB: 8192 × 0.84 = 6881 − 500 = 6381 → 3 × 2000 (at 0.9 it would be 3; at
                // fraction 1.0 it would be 3 too; use 1500: 4 vs 4.58) → see next case.
                name: "small GPU keeps a bigger share back",
                res: res(
                    16,
                    vec![gpu(0, "NVIDIA GeForce RTX 3070", 8 * GIB, 8 * GIB)],
                ),
                meta: meta(0, 1500),
                policy: auto.clone(),
                workers: 4,
                gpu_bound: Some(4),
                per_gpu: vec![4],
                unplaced: 0,
                device: Device::Cuda,
            },
            Case {
                // 8192 × 1.0 = 8192 − 500 = 7692 → 5 × 1500
                name: "utilisation override",
                res: res(
                    16,
                    vec![gpu(0, "NVIDIA GeForce RTX 3070", 8 * GIB, 8 * GIB)],
                ),
                meta: meta(0, 1500),
                policy: Policy {
                    gpu_memory_utilization: Some(1.0),
                    ..auto.clone()
                },
                workers: 5,
                gpu_bound: Some(5),
                per_gpu: vec![5],
                unplaced: 0,
                device: Device::Cuda,
            },
            Case {
                // 36864 − 6000 = 30864 → 6
                name: "larger reserve",
                res: res(16, vec![a100_40(0)]),
                meta: meta(3000, 5000),
                policy: Policy {
                    gpu_reserve_mb: 6000,
                    ..auto.clone()
                },
                workers: 6,
                gpu_bound: Some(6),
                per_gpu: vec![6],
                unplaced: 0,
                device: Device::Cuda,
            },
            Case {
                name: "typ 0: app does not use the GPU even when there is one",
                res: res(3, vec![a100_40(0)]),
                meta: meta(0, 0),
                policy: auto.clone(),
                workers: 7,
                gpu_bound: None,
                per_gpu: vec![],
                unplaced: 0,
                device: Device::Cpu,
            },
            Case {
                // GPU 0 has 3400 MB free < 3000 + 500: excluded, though usable/typ would be 0
                // anyway; GPU 1 has 5200 free: admitted (≥ 3500), usable 4700 < 5000 → 0;
                // GPU 2 full size → 7.
                name: "admission excludes a GPU below est_gpu_mem_min + reserve",
                res: res(
                    16,
                    vec![
                        gpu(0, "NVIDIA A100-SXM4-40GB", 40 * GIB, 3400),
                        gpu(1, "NVIDIA A100-SXM4-40GB", 40 * GIB, 5200),
                        a100_40(2),
                    ],
                ),
                meta: meta(3000, 5000),
                policy: auto.clone(),
                workers: 7,
                gpu_bound: Some(7),
                per_gpu: vec![0, 0, 7],
                unplaced: 0,
                device: Device::Cuda,
            },
            Case {
                name: "device cpu ignores GPUs",
                res: res(4, vec![a100_40(0)]),
                meta: meta(3000, 5000),
                policy: Policy {
                    device: Device::Cpu,
                    ..auto.clone()
                },
                workers: 9,
                gpu_bound: None,
                per_gpu: vec![],
                unplaced: 0,
                device: Device::Cpu,
            },
            Case {
                name: "app wants a GPU, none visible: CPU",
                res: res(4, vec![]),
                meta: meta(3000, 5000),
                policy: auto.clone(),
                workers: 9,
                gpu_bound: None,
                per_gpu: vec![],
                unplaced: 0,
                device: Device::Cpu,
            },
            Case {
                name: "override smaller than the plan",
                res: res(16, vec![a100_40(0), a100_40(1)]),
                meta: meta(3000, 5000),
                policy: Policy {
                    workers_override: over(3),
                    ..auto.clone()
                },
                workers: 3,
                gpu_bound: Some(14),
                per_gpu: vec![2, 1],
                unplaced: 0,
                device: Device::Cuda,
            },
            Case {
                name: "override larger than what fits: the rest waits",
                res: res(16, vec![a100_40(0)]),
                meta: meta(3000, 5000),
                policy: Policy {
                    workers_override: over(10),
                    ..auto.clone()
                },
                workers: 10,
                gpu_bound: Some(7),
                per_gpu: vec![7],
                unplaced: 3,
                device: Device::Cuda,
            },
            Case {
                name: "override above the CPU bound on CPU",
                res: res(2, vec![]),
                meta: meta(0, 0),
                policy: Policy {
                    workers_override: over(12),
                    ..auto.clone()
                },
                workers: 12,
                gpu_bound: None,
                per_gpu: vec![],
                unplaced: 0,
                device: Device::Cpu,
            },
            Case {
                name: "device cuda without estimate: spread, unbounded",
                res: res(2, vec![a100_40(0), a100_40(1)]),
                meta: meta(0, 0),
                policy: Policy {
                    device: Device::Cuda,
                    ..auto.clone()
                },
                workers: 5,
                gpu_bound: None,
                per_gpu: vec![3, 2],
                unplaced: 0,
                device: Device::Cuda,
            },
        ];
        for c in cases {
            let p = plan(&c.res, &c.meta, &c.policy)
                .unwrap_or_else(|e| panic!("{}: unexpected error {e}", c.name));
            assert_eq!(p.workers, c.workers, "{}: workers\n{}", c.name, p.to_text());
            assert_eq!(
                p.gpu_bound,
                c.gpu_bound,
                "{}: gpu bound\n{}",
                c.name,
                p.to_text()
            );
            assert_eq!(
                per_gpu(&p),
                c.per_gpu,
                "{}: per GPU\n{}",
                c.name,
                p.to_text()
            );
            assert_eq!(p.unplaced.len() as u32, c.unplaced, "{}: unplaced", c.name);
            assert_eq!(p.device, c.device, "{}: device", c.name);
            // Invariants for every plan.
            assert_eq!(
                p.placement.len() as u32 + c.unplaced,
                p.workers,
                "{}",
                c.name
            );
            for (i, pl) in p.placement.iter().enumerate() {
                assert_eq!(pl.slot, i as u32, "{}: slots in order", c.name);
                assert_eq!(pl.gpu.is_some(), p.device == Device::Cuda, "{}", c.name);
            }
            for g in &p.gpus {
                if p.mode == PlacementMode::GpuMemory {
                    assert!(
                        g.assigned <= g.fits,
                        "{}: GPU {} over capacity",
                        c.name,
                        g.index
                    );
                    if let (Some(cap), Some(f)) = (g.cap_mb, g.memory_fraction) {
                        // Caps and contexts of a full GPU within usable (issue 24, item 4).
                        assert!(
                            (cap + CUDA_CONTEXT_MB) * u64::from(g.fits) <= g.usable_mb,
                            "{}: caps and contexts exceed usable",
                            c.name
                        );
                        assert!(
                            f * g.total_mb as f64 <= cap as f64,
                            "{}: fraction above the cap",
                            c.name
                        );
                        assert!(
                            cap + CUDA_CONTEXT_MB >= c.meta.typ_mb,
                            "{}: cap and context below est_gpu_mem_typ",
                            c.name
                        );
                    }
                }
            }
            assert!(p.torch_threads >= 1);
            let json: serde_json::Value = serde_json::from_str(&p.to_json()).unwrap();
            assert_eq!(json["workers"], p.workers, "{}", c.name);
        }
    }

    #[test]
    fn utilisation_table_by_size() {
        let cases = [
            (8 * GIB, 0.84),
            (15 * GIB, 0.84),
            (20 * GIB - 1, 0.84),
            (20 * GIB, 0.90),
            (24 * GIB, 0.90),
            (48 * GIB, 0.90),
            (60 * GIB, 0.95),
            (80 * GIB, 0.95),
            (141 * GIB, 0.95),
        ];
        for (mb, want) in cases {
            assert_eq!(default_utilization(mb), want, "{mb} MB");
        }
        assert!(UTILIZATION_BY_GPU_SIZE.iter().all(|(_, f)| *f <= 0.95));
    }

    #[test]
    fn memory_fraction_is_the_per_worker_share_of_usable() {
        let p = plan(
            &res(16, vec![a100_40(0)]),
            &meta(3000, 5000),
            &Policy::default(),
        )
        .unwrap();
        let g = &p.gpus[0];
        assert_eq!(
            (g.total_mb, g.free_mb, g.usable_mb, g.fits),
            (40960, 40560, 36364, 7)
        );
        // 36364 / 7 = 5194 MB per worker, of which the CUDA context takes 500 MB.
        assert_eq!(g.cap_mb, Some(4694));
        assert_eq!(g.memory_fraction, Some(0.1145)); // 4694 / 40960 = 0.11459…
        let a = p.placement[0].gpu.as_ref().unwrap();
        assert_eq!((a.index, a.uuid.as_str()), (0, "GPU-00000000"));
        assert_eq!((a.cap_mb, a.memory_fraction), (Some(4694), Some(0.1145)));
    }

    #[test]
    fn torch_threads() {
        let cases = [
            // (cpus, override workers, torch_threads policy, want)
            (16, Some(4), None, 4),
            (16, Some(5), None, 3),
            (2, None, None, 1), // 5 workers on 2 cores
            (16, Some(64), None, 1),
            (16, Some(4), Some(2), 2),
        ];
        for (cpus, workers, tt, want) in cases {
            let policy = Policy {
                workers_override: workers.and_then(over),
                torch_threads: tt.map(|count| TorchThreads {
                    count,
                    source: "--torch-threads",
                }),
                ..Policy::default()
            };
            let p = plan(&res(cpus, vec![]), &meta(0, 0), &policy).unwrap();
            assert_eq!(
                p.torch_threads, want,
                "cpus {cpus} workers {workers:?} tt {tt:?}"
            );
        }
    }

    #[test]
    fn does_not_fit_names_each_gpu_the_estimate_and_the_way_out() {
        let r = res(
            8,
            vec![
                gpu(0, "Tesla T4", 15 * GIB, 2000),
                gpu(1, "NVIDIA GeForce RTX 4090", 24 * GIB, 20000),
            ],
        );
        let e = plan(&r, &meta(3000, 30000), &Policy::default()).unwrap_err();
        let PlanError::DoesNotFit { message, gpus } = &e else {
            panic!("{e:?}")
        };
        assert_eq!(gpus.len(), 2);
        for want in [
            "does not fit on any GPU",
            "GPU 0 (Tesla T4",
            "2000 MB free",
            "GPU 1 (NVIDIA GeForce RTX 4090",
            "20000 MB free",
            "est_gpu_mem_min 3000 MB",
            "est_gpu_mem_typ 30000 MB",
            "reserve 500 MB",
            "--device cpu",
        ] {
            assert!(message.contains(want), "missing {want:?} in {message}");
        }
        assert!(!message.contains('\n'), "one line: {message}");
        // --device cpu is the way out.
        let cpu = Policy {
            device: Device::Cpu,
            ..Policy::default()
        };
        assert_eq!(
            plan(&r, &meta(3000, 30000), &cpu).unwrap().device,
            Device::Cpu
        );
    }

    #[test]
    fn device_cuda_without_gpu_is_an_error_with_the_reason() {
        let r = Resources::cpu_only(4, "cannot use NVML from libnvidia-ml.so.1: not found");
        let policy = Policy {
            device: Device::Cuda,
            ..Policy::default()
        };
        let e = plan(&r, &meta(1000, 2000), &policy)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--device cuda"), "{e}");
        assert!(e.contains("libnvidia-ml.so.1: not found"), "{e}");
        assert!(e.contains("--device cpu"), "{e}");
    }

    #[test]
    fn warnings_are_loud_and_specific() {
        let mut r = res(4, vec![]);
        r.gpu_note = Some("NVIDIA driver is not loaded".into());
        let p = plan(&r, &meta(3000, 5000), &Policy::default()).unwrap();
        assert_eq!(p.warnings.len(), 1, "{:?}", p.warnings);
        assert!(p.warnings[0].contains("none is visible (NVIDIA driver is not loaded)"));
        assert!(p.to_text().contains("WARNING: the app expects a GPU"));

        let policy = Policy {
            workers_override: over(10),
            ..Policy::default()
        };
        let p = plan(&res(16, vec![a100_40(0)]), &meta(3000, 5000), &policy).unwrap();
        assert_eq!(p.unplaced, vec![7, 8, 9]);
        let text = p.to_text();
        assert!(
            text.contains("WARNING: --workers asks for 10 workers but only 7 fit"),
            "{text}"
        );
        assert!(
            text.contains("workers 7-9 -> not placed: wait for 3500 MB free"),
            "{text}"
        );
    }

    #[test]
    fn invalid_policy_is_rejected() {
        let r = res(4, vec![]);
        for f in [0.0, -0.1, 1.01, f64::NAN] {
            let policy = Policy {
                gpu_memory_utilization: Some(f),
                ..Policy::default()
            };
            assert!(matches!(
                plan(&r, &meta(0, 0), &policy),
                Err(PlanError::InvalidPolicy(_))
            ));
        }
        let policy = Policy {
            workers_override: over(0),
            ..Policy::default()
        };
        assert!(matches!(
            plan(&r, &meta(0, 0), &policy),
            Err(PlanError::InvalidPolicy(_))
        ));
    }

    #[test]
    fn capacity_and_next_target_for_ttin() {
        let r = res(
            4,
            vec![
                gpu(0, "Tesla T4", 15 * GIB, 15 * GIB - 300),
                gpu(1, "NVIDIA A100-SXM4-40GB", 40 * GIB, 40 * GIB - 400),
            ],
        );
        let p = plan(&r, &meta(3000, 5000), &Policy::default()).unwrap();
        // T4: 12902 − 500 = 12402 → 2; A100: 36364 → 7.
        assert_eq!((p.gpu_capacity(0), p.gpu_capacity(1)), (Some(2), Some(7)));
        assert_eq!(p.gpu_capacity(9), None);
        assert_eq!(p.max_workers(), Some(9));
        assert_eq!(per_gpu(&p), vec![2, 7]); // CPU bound 9 = GPU bound 9
        let running = |i: u32| [2, 6][i as usize];
        match p.next_target(running) {
            Target::Gpu(a) => assert_eq!(a.index, 1),
            t => panic!("{t:?}"),
        }
        assert_eq!(p.next_target(|i| [2, 7][i as usize]), Target::NoRoom);
        assert_eq!(p.admission_mb(), 3500);
        assert!(admits(3500, 3000, 500) && !admits(3499, 3000, 500));

        let cpu = plan(&res(4, vec![]), &meta(0, 0), &Policy::default()).unwrap();
        assert_eq!(cpu.next_target(|_| 0), Target::Cpu);
        assert_eq!(cpu.max_workers(), None);
        assert_eq!(cpu.gpu_capacity(0), None);
    }

    #[test]
    fn text_shows_inputs_bounds_and_placement() {
        let p = plan(
            &res(4, vec![a100_40(0), a100_40(1)]),
            &meta(3000, 5000),
            &Policy::default(),
        )
        .unwrap();
        let t = p.to_text();
        for want in [
            "cpus                  4",
            "est_gpu_mem_typ       5000 MB",
            "gpu reserve           500 MB per GPU",
            "by GPU size (≥ 60 GiB: 0.95, ≥ 20 GiB: 0.9, ≥ 0 GiB: 0.84)",
            "GPU 1  NVIDIA A100-SXM4-40GB  GPU-00000001",
            "fits 7, assigned 5",
            "CPU bound = 2 × 4 cores + 1 = 9",
            "GPU bound = Σ floor(usable / est_gpu_mem_typ 5000 MB) = 7 + 7 = 14",
            "workers = min(CPU bound 9, GPU bound 14) = 9",
            "=> 9 worker(s) on cuda (plan)",
            "worker 0 -> GPU 0 (GPU-00000000), allocator cap 4694 MB (0.1145)",
            "worker 1 -> GPU 1 (GPU-00000001)",
            "torch threads = max(1, 4 cores / 9 workers) = 1 per worker",
        ] {
            assert!(t.contains(want), "missing {want:?} in\n{t}");
        }
        assert!(!t.contains("WARNING"), "{t}");
        let cpu = plan(&res(4, vec![]), &meta(0, 0), &Policy::default())
            .unwrap()
            .to_text();
        assert!(cpu.contains("workers 0-8 -> CPU"), "{cpu}");
    }

    fn with_mode(mut g: GpuInfo, mode: ComputeMode) -> GpuInfo {
        g.compute_mode = mode;
        g
    }

    #[test]
    fn compute_mode_limits_workers_per_gpu() {
        let r = res(
            16,
            vec![
                with_mode(a100_40(0), ComputeMode::ExclusiveProcess),
                with_mode(a100_40(1), ComputeMode::Prohibited),
                a100_40(2),
            ],
        );
        let p = plan(&r, &meta(3000, 5000), &Policy::default()).unwrap();
        assert_eq!(per_gpu(&p), vec![1, 0, 7]);
        assert_eq!(p.gpus[0].fits, 1);
        assert!(p.gpus[1]
            .excluded
            .as_deref()
            .unwrap()
            .contains("prohibited"));
        let t = p.to_text();
        assert!(
            t.contains("GPU 0 is in exclusive_process compute mode: at most one worker"),
            "{t}"
        );
        assert!(
            t.contains("GPU 1 is in prohibited compute mode: no worker"),
            "{t}"
        );
        // --device cuda without an estimate spreads, but the modes still hold.
        let cuda = Policy {
            device: Device::Cuda,
            ..Policy::default()
        };
        let p = plan(&r, &meta(0, 0), &cuda).unwrap();
        assert_eq!(p.mode, PlacementMode::GpuSpread);
        // CPU bound 33: one on the exclusive GPU, the other 32 on the open one.
        assert_eq!(per_gpu(&p), vec![1, 0, 32]);
        assert!(p.unplaced.is_empty(), "{:?}", p.unplaced);
        // TTIN: never the prohibited GPU, never a second on the exclusive one.
        let running = |i: u32| [1, 0, 32][i as usize];
        assert!(matches!(p.next_target(running), Target::Gpu(g) if g.index == 2));
        // Only prohibited GPUs: nothing fits.
        let none = res(4, vec![with_mode(a100_40(0), ComputeMode::Prohibited)]);
        let e = plan(&none, &meta(3000, 5000), &Policy::default()).unwrap_err();
        assert!(e.to_string().contains("compute mode prohibited"), "{e}");
    }

    #[test]
    fn mig_instances_are_planned_as_devices() {
        let inst = |index: u32, slot: u32, mb: u64| GpuInfo {
            mig: Some(MigInstance { parent: 0, slot }),
            uuid: format!("MIG-{slot}"),
            ..gpu(index, "NVIDIA A100-SXM4-40GB MIG 3g.20gb", mb, mb)
        };
        // GPU 0 in MIG mode (two 3g.20gb instances), GPU 1 whole.
        let r = res(16, vec![a100_40(1), inst(2, 0, 19968), inst(3, 1, 19968)]);
        let p = plan(&r, &meta(1000, 8000), &Policy::default()).unwrap();
        // 19968 MB < 20 GiB: fraction 0.84, usable floor(19968 × 0.84) − 500 = 16273: 2 fit.
        assert_eq!(p.gpus[1].usable_mb, 16273);
        assert_eq!(per_gpu(&p), vec![4, 2, 2]);
        let a = p
            .placement
            .iter()
            .find_map(|pl| pl.gpu.clone().filter(|g| g.index == 3))
            .unwrap();
        assert_eq!(a.uuid, "MIG-1");
        assert_eq!(a.mig, Some(MigInstance { parent: 0, slot: 1 }));
        let t = p.to_text();
        assert!(
            t.contains("GPU 0 MIG 1  NVIDIA A100-SXM4-40GB MIG 3g.20gb  MIG-1"),
            "{t}"
        );
        assert!(t.contains("-> GPU 0 MIG 0 (MIG-0)"), "{t}");
    }

    #[test]
    fn a_driver_older_than_the_build_refuses_gpu_plans_only() {
        let mut r = res(4, vec![a100_40(0)]);
        r.driver_version = Some("550.54.15".into());
        r.cuda_driver_version = Some(12040);
        let p = plan(&r, &meta(3000, 5000), &Policy::default()).unwrap();
        let msg = p.driver_too_old.clone().expect("refused");
        assert!(p.warnings.contains(&msg));
        assert!(
            msg.contains("the NVIDIA driver (550.54.15) supports CUDA up to 12.4")
                && msg.contains("built with CUDA 13.0")
                && msg.contains("580 or newer")
                && msg.contains("--device cpu"),
            "{msg}"
        );
        let cpu = Policy {
            device: Device::Cpu,
            ..Policy::default()
        };
        let on_cpu = plan(&r, &meta(3000, 5000), &cpu).unwrap();
        assert_eq!((on_cpu.device, on_cpu.driver_too_old), (Device::Cpu, None));
        // --device cuda insists: a warning only.
        let cuda = Policy {
            device: Device::Cuda,
            ..Policy::default()
        };
        let insist = plan(&r, &meta(3000, 5000), &cuda).unwrap();
        assert_eq!(insist.driver_too_old, None);
        assert!(insist
            .warnings
            .iter()
            .any(|w| w.contains("--device cuda: starting anyway")));
        r.cuda_driver_version = Some(13000);
        let p = plan(&r, &meta(3000, 5000), &Policy::default()).unwrap();
        assert!(p
            .to_text()
            .contains("driver                550.54.15 (CUDA 13.0); worker built for CUDA 13.0"));
    }

    #[test]
    fn an_estimate_below_a_cuda_context_is_planned_as_one() {
        let p = plan(
            &res(64, vec![a100_40(0)]),
            &meta(100, 300),
            &Policy::default(),
        )
        .unwrap();
        let per = CUDA_CONTEXT_MB + MIN_ALLOCATOR_MB;
        assert_eq!(p.gpus[0].fits, (36364 / per) as u32);
        assert_eq!(
            p.gpus[0].cap_mb,
            Some(36364 / (36364 / per) - CUDA_CONTEXT_MB)
        );
        assert!(p
            .warnings
            .iter()
            .any(|w| w.contains("est_gpu_mem_typ 300 MB is less than one worker's CUDA context")));
    }

    /// Issue 29: an app with GPUs visible but no estimate is warned about where the server
    /// starts, not only in `app plan`'s reasoning; `--device cpu` says the CPU is meant.
    #[test]
    fn gpus_visible_but_no_estimate_is_a_warning() {
        let r = res(4, vec![a100_40(0)]);
        let p = plan(&r, &meta(0, 0), &Policy::default()).unwrap();
        assert_eq!(p.device, Device::Cpu);
        assert!(
            p.warnings.iter().any(|w| w.contains(
                "1 GPU(s) visible, but /apps/demo/app-metadata.json declares no est_gpu_mem_typ"
            )),
            "{:?}",
            p.warnings
        );
        let cpu = Policy {
            device: Device::Cpu,
            ..Policy::default()
        };
        assert!(plan(&r, &meta(0, 0), &cpu).unwrap().warnings.is_empty());
        assert!(plan(&res(4, vec![]), &meta(0, 0), &Policy::default())
            .unwrap()
            .warnings
            .is_empty());
    }
}
