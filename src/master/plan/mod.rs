//! The worker plan (docs/production.md, docs/gpu.md): how many workers to start and where
//! each one goes, from the measured [`Resources`], the app metadata's GPU estimates and the
//! [`Policy`] taken from the command line. **Pure**: no I/O, no clock, no environment, so
//! every rule is covered by the table-driven tests at the bottom.
//!
//! | file | owns |
//! |---|---|
//! | `mod.rs` | [`Plan`], [`PlanError`] and [`plan`]: the rules below, in order |
//! | `demand.rs` | [`Demand`]: the numbers of the app metadata the plan reads |
//! | `policy.rs` | [`Policy`]: the command line's choices; torch threads (rule 8) |
//! | `mode.rs` | [`PlacementMode`]: where workers go (rule 2) |
//! | `fit.rs` | the numbers of fitting: usable memory, one worker, [`workers_fitting`], [`admits`] (rules 3, 7) |
//! | `gpus.rs` | [`GpuPlan`]: each GPU's figures, compute modes, the driver, the GPU bound (rules 3, 7, 9–11) |
//! | `mps.rs` | under MPS, the per-client limit the server inherited as its share of a GPU |
//! | `placement.rs` | the worker count and each slot's place (rules 4–6); what the supervisor asks later ([`Target`]) |
//! | `host.rs` | [`HostPlan`]: the host-memory bound (rule 13), applied once a worker's cost is measured |
//! | `text.rs` | `app plan`'s text and JSON |
//!
//! The rules, in order:
//!
//! 1. CPU bound = `2 × cpus + 1` (gunicorn's rule of thumb).
//! 2. Where workers go ([`PlacementMode`]):
//!    - `--device cpu`, or `est_gpu_mem_typ` 0 with `--device auto`: every worker on the
//!      CPU, bounded by CPU only.
//!    - `est_gpu_mem_typ > 0` with `--device auto` and no GPU visible: CPU, with a loud
//!      warning (the app expected a GPU).
//!    - `--device cuda` and no GPU visible: [`PlanError::NoGpu`].
//!    - `--device cuda` and `est_gpu_mem_typ` 0: workers spread round-robin over the
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
//! 7. Each GPU worker's allocator cap ([`GpuPlan::cap_mb`]) is `per worker − context`,
//!    the per-worker figure being what fitting divided `usable` by (the estimate, at least
//!    a context plus [`MIN_ALLOCATOR_MB`]) and what the GPU-memory ledger reserves for the
//!    worker (`master::host::reservation`), so no worker may take the remainder `usable` leaves
//!    beyond `fits × per worker`, which no reservation covers; the context being what profiling measured one worker to hold besides its allocator
//!    ([`Demand::context_mb`]), else [`CUDA_CONTEXT_MB`]: every worker's CUDA context comes
//!    on top of what its caching allocator may take, so caps and contexts of as many
//!    workers as fit sum to at most `usable` even after TTIN fills the GPU. The operator's
//!    own `per_process_memory_fraction` ([`Policy::allocator_fraction`]) lowers a cap above
//!    it. Under MPS each worker also gets its whole share, the per-worker figure, as its
//!    driver-enforced limit ([`GpuPlan::mps_limit_mb`]). `est_gpu_mem_typ` is a whole worker
//!    as `nvidia-smi` shows it, context included; one below a context plus
//!    [`MIN_ALLOCATOR_MB`] is planned as that much, with a warning.
//! 8. Torch intra-op threads per worker: `--torch-threads` (or `MKL_NUM_THREADS`/
//!    `OMP_NUM_THREADS`, read by `config`), else `max(1, cpus / workers)`.
//! 9. Compute mode: a GPU in `prohibited` mode takes no worker; one in
//!    `exclusive_process` mode (or the withdrawn `exclusive_thread`) takes at most one,
//!    since only one process at a time may hold a CUDA context there — unless MPS serves
//!    it ([`Policy::mps`]): then the MPS server is that one process and the workers, its
//!    clients, share the GPU as in the default mode.
//! 10. MIG: a GPU in MIG mode is not a device; each of its MIG instances is one
//!     (`resources`), planned like a GPU and named `GPU <n> MIG <slot>`. The MIG devices
//!     of one GPU instance (its compute instances) share its memory: the workers it holds
//!     are counted once and divided among them.
//! 11. A driver whose CUDA version is older than the build's ([`CUDA_BUILD_VERSION`])
//!     cannot run the worker on a GPU: a plan that would place workers on GPUs records it
//!     in [`Plan::driver_too_old`] (and its warnings), and `app` refuses to start on it
//!     unless `--device cuda` insists (CUDA forward-compatibility libraries in a container
//!     can make it work; a worker that then finds no CUDA still stops the server).
//! 12. `PYTORCH_NO_CUDA_MEMORY_CACHING=1` ([`Policy::uncached_allocator`]) turns PyTorch's
//!     caching allocator off, and with it the cap of rule 7: a plan that would place
//!     workers on GPUs records why in [`Plan::uncached_allocator`], and `app` refuses to
//!     start on it (`app plan` shows it).
//! 13. Host memory ([`host`]): workers ≤ floor(what the server may still use / one more
//!     worker's measured peak); applied after [`plan`] once the cost is measured (the
//!     template's warm-up), so that rule 4 becomes min(CPU, GPU, host memory). Not even one
//!     fitting is [`PlanError::HostMemory`].
//!
//! MB means MiB (2^20 bytes) throughout, as `nvidia-smi` prints it.

mod demand;
mod fit;
mod gpus;
pub mod host;
mod mode;
mod mps;
mod placement;
mod policy;
mod text;

use serde::Serialize;

pub use demand::Demand;
pub use fit::{
    admits, default_utilization, per_worker_mb, share_mb, usable_mb, workers_fitting,
    CUDA_CONTEXT_FLOOR_MB, CUDA_CONTEXT_MB, MIN_ALLOCATOR_MB, UTILIZATION_BY_GPU_SIZE,
};
pub use gpus::{capacity, GpuPlan};
pub use host::{HostPlan, WorkerCost};
pub use mode::PlacementMode;
pub use placement::{Placement, Target};
pub use policy::{Policy, TorchThreads, WorkerOverride};

use crate::master::resources::Resources;
use crate::protocol::{Device, CUDA_BUILD_VERSION};

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
    /// The host-memory row (rule 13), when the memory the server may use could be read.
    pub host: Option<HostPlan>,
    /// The bound that set the worker count: `cpu`, `gpu`, `host memory`, or `override`.
    pub bounded_by: &'static str,
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
    /// MB each worker's context takes beside its allocator cap: measured by profiling
    /// ([`Demand::context_mb`]), else [`CUDA_CONTEXT_MB`].
    pub cuda_context_mb: u64,
    /// Why the driver cannot run the worker on the GPUs this plan uses (rule 11): `app`
    /// refuses to start; `app plan` shows the plan with this warning.
    pub driver_too_old: Option<String>,
    /// Why the workers this plan puts on GPUs could not be capped (rule 12: the operator
    /// turned PyTorch's caching allocator off): `app` refuses to start.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uncached_allocator: Option<String>,
    /// Why, under MPS, this server's share of its GPUs is unknown (no per-client limit and no
    /// `--gpu-memory-utilization`): `app` refuses to start rather than take every GPU whole.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mps_share_unknown: Option<String>,
}

impl Plan {
    /// Why `app` refuses to serve this plan (rules 11 and 12, and MPS with no share
    /// stated), if it does.
    pub fn refusal(&self) -> Option<&String> {
        self.driver_too_old
            .as_ref()
            .or(self.uncached_allocator.as_ref())
            .or(self.mps_share_unknown.as_ref())
    }
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
    /// Not even one worker fits in the memory the server may use (rule 13).
    #[error("{0}")]
    HostMemory(String),
}

/// How the plan was reached (`why`, one sentence each) and what it warns about, in the
/// order the rules ran.
#[derive(Debug, Default)]
struct Notes {
    why: Vec<String>,
    warnings: Vec<String>,
}

impl Notes {
    fn why(&mut self, s: String) {
        self.why.push(s);
    }
    fn warn(&mut self, s: String) {
        self.warnings.push(s);
    }
}

/// Makes the plan. See the module documentation for the rules.
pub fn plan(res: &Resources, demand: &Demand, policy: &Policy) -> Result<Plan, PlanError> {
    policy.check()?;
    let cpus = res.cpus.max(1);
    let cpu_bound = u32::try_from(2 * cpus + 1).unwrap_or(u32::MAX);
    let (min, typ, reserve) = (demand.min_mb, demand.typ_mb, policy.gpu_reserve_mb);
    let mut notes = Notes {
        why: vec![format!("CPU bound = 2 × {cpus} cores + 1 = {cpu_bound}")],
        // The metadata's likely mistakes first (`mean`/`std` in 0–255 units).
        warnings: demand.warnings.clone(),
    };
    let mode = PlacementMode::choose(res, demand, policy, &mut notes)?;
    let mut gpus = gpus::plan_gpus(res, demand, policy, mode, &mut notes);
    let (mut driver_too_old, mut mps_share_unknown) = (None, None);
    if mode != PlacementMode::Cpu {
        driver_too_old = gpus::driver_too_old(res, policy, &mut notes);
        gpus::gpu_notes(&gpus, demand, mode, &mut notes);
        mps_share_unknown = mps::mps_notes(&gpus, policy, &mut notes);
    }
    let gpu_bound = gpus::gpu_bound(&gpus, demand, policy, mode, &mut notes)?;
    let (workers, source) = placement::worker_count(policy, cpu_bound, gpu_bound, &mut notes);
    let (placement, unplaced) = placement::place(
        &mut gpus,
        demand,
        policy,
        mode,
        (workers, &source),
        (cpu_bound, gpu_bound),
        &mut notes,
    )?;
    if mode != PlacementMode::Cpu {
        mps::thread_share(&gpus, policy, &mut notes);
    }
    let torch_threads = policy.torch_threads(cpus, workers, &mut notes);
    let uncached_allocator = (mode != PlacementMode::Cpu && policy.uncached_allocator).then(|| {
        let why = "PYTORCH_NO_CUDA_MEMORY_CACHING=1 turns PyTorch's CUDA caching allocator \
                   off: the per-worker cap that keeps each worker within its share of the GPU \
                   (set_per_process_memory_fraction), the allocator figures footprints, \
                   --max-worker-gpu-mb and hwFetch read, and out of memory answered as 507 all \
                   need it, so the workers on GPUs would share them unbounded. Unset it (it is \
                   for debugging with compute-sanitizer), or serve on the CPU with --device cpu"
            .to_string();
        notes.warn(why.clone());
        why
    });
    let Notes { why, warnings } = notes;
    let bounded_by = match (policy.workers_override, gpu_bound) {
        (Some(_), _) => "override",
        (None, Some(g)) if g < cpu_bound => "gpu",
        (None, _) => "cpu",
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
        host: None,
        bounded_by,
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
        cuda_context_mb: demand.context_mb(),
        driver_too_old,
        uncached_allocator,
        mps_share_unknown,
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::master::resources::{ComputeMode, GpuInfo, MigInstance, MB};
    use crate::metadata::AppMetadata;

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
            gpu_instance: None,
            ledger_mb: 0,
            compute_capability: None,
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
                        // Caps and contexts of a full GPU within usable.
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
        // 5000 MB per worker (what the ledger reserves for it; not 36364 / 7 = 5194, which
        // would hand out the 1364 MB no worker was planned for), of which the CUDA context
        // takes 500 MB.
        assert_eq!(g.cap_mb, Some(4500));
        assert_eq!(g.memory_fraction, Some(0.1098)); // 4500 / 40960 = 0.10986…
        let a = p.placement[0].gpu.as_ref().unwrap();
        assert_eq!((a.index, a.uuid.as_str()), (0, "GPU-00000000"));
        assert_eq!((a.cap_mb, a.memory_fraction), (Some(4500), Some(0.1098)));
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
            "worker 0 -> GPU 0 (GPU-00000000), allocator cap 4500 MB (0.1098)",
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
        assert_eq!(p.gpus[0].cap_mb, Some(per - CUDA_CONTEXT_MB));
        assert!(p
            .warnings
            .iter()
            .any(|w| w.contains("est_gpu_mem_typ 300 MB is less than one worker's CUDA context")));
    }

    /// An app with GPUs visible but no estimate is warned about where the server
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

    /// Two compute instances of one GPU instance (two MIG devices
    /// reporting the same memory) hold its workers once, divided between them; another
    /// GPU instance of the same GPU is planned on its own.
    #[test]
    fn compute_instances_of_one_gpu_instance_share_its_memory_once() {
        let ci = |index: u32, slot: u32, gi: u32, mb: u64| GpuInfo {
            mig: Some(MigInstance { parent: 0, slot }),
            gpu_instance: Some(gi),
            uuid: format!("MIG-{slot}"),
            ..gpu(index, "NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb", mb, mb)
        };
        let r = res(
            16,
            vec![ci(1, 0, 2, 19968), ci(2, 1, 2, 19968), ci(3, 2, 1, 19968)],
        );
        let p = plan(&r, &meta(1000, 5000), &Policy::default()).unwrap();
        // usable floor(19968 × 0.84) − 500 = 16273: 3 workers of 5000 per GPU instance.
        assert_eq!(p.gpus[0].usable_mb, 16273);
        assert_eq!(
            per_gpu(&p),
            vec![2, 1, 3],
            "GPU instance 2's 3 workers, split"
        );
        assert_eq!(p.gpu_bound, Some(6), "not 9");
        // Each worker's cap is the figure per worker, never more than its share of the GPU
        // instance's memory.
        assert_eq!(p.gpus[0].cap_mb, Some(5000 - CUDA_CONTEXT_MB));
        assert!(5000 <= p.gpus[0].usable_mb / 3, "never above its share");
        assert_eq!(p.gpus[1].cap_mb, p.gpus[0].cap_mb);
        let t = p.to_text();
        assert!(
            t.contains("GPU 0 MIG 0 and GPU 0 MIG 1 are compute instances of GPU 0 GPU instance 2: they share its memory, planned once (16273 MB usable hold 3 workers in all)"),
            "{t}"
        );
        // What the GPUs hold at a footprint counts the pool once too.
        assert_eq!(capacity(&p.gpus, 5000), 6);
        assert_eq!(capacity(&p.gpus, 8000), 4);
        // Three compute instances sharing room for two: the third takes none, and says why.
        let r = res(
            16,
            vec![ci(1, 0, 2, 19968), ci(2, 1, 2, 19968), ci(3, 2, 2, 19968)],
        );
        let p = plan(&r, &meta(1000, 8000), &Policy::default()).unwrap();
        assert_eq!(per_gpu(&p), vec![1, 1, 0]);
        assert!(
            p.gpus[2]
                .excluded
                .as_deref()
                .unwrap()
                .contains("shares GPU instance 2 with GPU 0 MIG 0, GPU 0 MIG 1"),
            "{:?}",
            p.gpus[2].excluded
        );
    }

    /// Under MPS an exclusive-process GPU holds its MPS server alone,
    /// and the workers, its clients, are planned as on a shared GPU, each with its share as
    /// its MPS memory limit; `--mps off` plans one worker.
    #[test]
    fn under_mps_an_exclusive_gpu_is_planned_as_a_shared_one() {
        let shared = res(16, vec![a100_40(0)]);
        let exclusive = res(
            16,
            vec![with_mode(a100_40(0), ComputeMode::ExclusiveProcess)],
        );
        let mps = Policy {
            mps: true,
            ..Policy::default()
        };
        let base = plan(&shared, &meta(3000, 5000), &Policy::default()).unwrap();
        let p = plan(&exclusive, &meta(3000, 5000), &mps).unwrap();
        assert_eq!(p.workers, base.workers);
        assert_eq!(per_gpu(&p), per_gpu(&base));
        assert_eq!(p.gpus[0].cap_mb, base.gpus[0].cap_mb);
        // The figure per worker, what the ledger reserves for it (at most usable / fits).
        let share = 5000;
        assert!(share <= p.gpus[0].usable_mb / u64::from(p.gpus[0].fits));
        assert_eq!(p.gpus[0].mps_limit_mb, Some(share));
        assert_eq!(
            p.placement[0].gpu.as_ref().unwrap().mps_limit_mb,
            Some(share)
        );
        assert!(p.to_text().contains("MPS serves it"), "{}", p.to_text());
        let off = plan(&exclusive, &meta(3000, 5000), &Policy::default()).unwrap();
        assert_eq!(per_gpu(&off), vec![1]);
        assert_eq!(off.gpus[0].mps_limit_mb, None);
        // Prohibited stays prohibited.
        let none = res(4, vec![with_mode(a100_40(0), ComputeMode::Prohibited)]);
        assert!(plan(&none, &meta(3000, 5000), &mps).is_err());
    }

    /// Under MPS the per-client limit the server inherited
    /// (`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`) is its share of the GPU: it bounds the usable
    /// memory, each worker's own limit is never above it, a worker bigger than it fits
    /// nowhere (the refusal names both figures), and the plan says so; without one serving
    /// refuses the plan (`tests/mps_plan.rs`), which warns so.
    #[test]
    fn under_mps_the_inherited_client_limit_bounds_the_plan() {
        use crate::master::resources::mps::ClientLimit;
        let two = res(
            16,
            vec![
                with_mode(a100_40(0), ComputeMode::ExclusiveProcess),
                with_mode(a100_40(1), ComputeMode::ExclusiveProcess),
            ],
        );
        let limited = |v: &str| Policy {
            mps: true,
            mps_client_limit: Some(ClientLimit::parse(v).unwrap()),
            ..Policy::default()
        };
        let whole = plan(&two, &meta(3000, 5000), &limited("1=10G")).unwrap();
        // GPU 0 has no limit: 36,364 MB usable hold 7; GPU 1's share is 10,240 MB: 2.
        assert_eq!(whole.gpus[0].usable_mb, 36_364);
        assert_eq!(whole.gpus[0].mps_client_limit_mb, None);
        assert_eq!(whole.gpus[1].usable_mb, 10_240);
        assert_eq!(whole.gpus[1].mps_client_limit_mb, Some(10_240));
        assert_eq!(per_gpu(&whole), vec![7, 2]);
        assert_eq!(
            whole.gpus[1].mps_limit_mb,
            Some(5_000),
            "the figure per worker"
        );
        assert!(
            whole
                .warnings
                .iter()
                .any(|w| w
                    .contains("GPU 1 is shared through MPS with a per-client limit of 10240 MB")),
            "{:?}",
            whole.warnings
        );
        let p = plan(&two, &meta(3000, 5000), &limited("10G")).unwrap();
        assert_eq!(per_gpu(&p), vec![2, 2]);
        for g in &p.gpus {
            assert!(g.mps_limit_mb.unwrap() <= 10_240, "{g:?}");
        }
        // Not under MPS, the variable bounds nothing (CUDA ignores it without MPS).
        let off = Policy {
            mps: false,
            ..limited("10G")
        };
        assert_eq!(
            plan(&two, &meta(3000, 5000), &off).unwrap().gpus[0].usable_mb,
            36_364
        );
        // One worker is bigger than a client may be: refused, naming both figures.
        let e = plan(&two, &meta(3000, 5000), &limited("4G"))
            .unwrap_err()
            .to_string();
        for want in [
            "needs 5000 MB",
            "only 4096 MB",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
        ] {
            assert!(e.contains(want), "{want}: {e}");
        }
        // No limit known: said loudly, and serving refuses it.
        let mps = Policy {
            mps: true,
            ..Policy::default()
        };
        let p = plan(&two, &meta(3000, 5000), &mps).unwrap();
        assert!(
            p.warnings
                .iter()
                .any(|w| w.contains("no per-client memory limit is set")),
            "{:?}",
            p.warnings
        );
        assert_eq!(p.refusal(), p.mps_share_unknown.as_ref());
        assert!(p.refusal().is_some());
    }

    /// Spread placement asks the compute mode workers meet: under MPS an
    /// exclusive-process GPU takes more than its round-robin share, as a shared one does.
    #[test]
    fn under_mps_spread_placement_treats_an_exclusive_gpu_as_shared() {
        let one = res(
            4,
            vec![with_mode(a100_40(0), ComputeMode::ExclusiveProcess)],
        );
        let spread = Policy {
            device: Device::Cuda,
            mps: true,
            ..Policy::default()
        };
        let p = plan(&one, &meta(0, 0), &spread).unwrap();
        assert_eq!(p.mode, PlacementMode::GpuSpread);
        let share = p.gpus[0].fits;
        assert!(matches!(p.next_target(|_| share), Target::Gpu(g) if g.index == 0));
        let off = Policy {
            mps: false,
            ..spread
        };
        let p = plan(&one, &meta(0, 0), &off).unwrap();
        assert_eq!(p.next_target(|_| 1), Target::NoRoom);
    }

    /// The cap leaves room for the context profiling measured (not
    /// 500 MB), and never goes above the operator's per_process_memory_fraction.
    #[test]
    fn the_cap_takes_the_measured_context_and_the_operators_fraction() {
        let r = res(16, vec![a100_40(0)]);
        let declared = plan(&r, &meta(3000, 5000), &Policy::default()).unwrap();
        let usable = declared.gpus[0].usable_mb;
        assert_eq!(declared.gpus[0].fits, 7, "{usable} MB usable");
        assert_eq!(declared.gpus[0].cap_mb, Some(5000 - 500));
        let measured = meta(3000, 5000).measured(4000, 5000, Some(800));
        let p = plan(&r, &measured, &Policy::default()).unwrap();
        assert_eq!(p.cuda_context_mb, 800);
        assert_eq!(p.gpus[0].cap_mb, Some(5000 - 800));
        assert!(p.to_text().contains("+ CUDA context ~800 MB per worker"));
        let operator = Policy {
            allocator_fraction: Some(0.05),
            ..Policy::default()
        };
        let p = plan(&r, &meta(3000, 5000), &operator).unwrap();
        // floor(40960 × 0.05) = 2048 < 4500.
        assert_eq!(p.gpus[0].cap_mb, Some(2048));
        assert_eq!(p.gpus[0].memory_fraction, Some(0.05));
        let high = Policy {
            allocator_fraction: Some(0.9),
            ..Policy::default()
        };
        let p = plan(&r, &meta(3000, 5000), &high).unwrap();
        assert_eq!(p.gpus[0].cap_mb, declared.gpus[0].cap_mb);
    }

    /// PYTORCH_NO_CUDA_MEMORY_CACHING=1 leaves nothing to cap: a plan
    /// on GPUs says why `app` refuses it; on the CPU it does not matter.
    #[test]
    fn an_uncached_allocator_refuses_a_plan_on_gpus() {
        let uncached = Policy {
            uncached_allocator: true,
            ..Policy::default()
        };
        let p = plan(&res(16, vec![a100_40(0)]), &meta(3000, 5000), &uncached).unwrap();
        let why = p.refusal().expect("refused");
        assert!(
            why.starts_with(
                "PYTORCH_NO_CUDA_MEMORY_CACHING=1 turns PyTorch's CUDA caching allocator off"
            ),
            "{why}"
        );
        assert!(p.warnings.contains(why));
        let cpu = plan(&res(16, vec![]), &meta(0, 0), &uncached).unwrap();
        assert_eq!(cpu.refusal(), None);
    }
}
