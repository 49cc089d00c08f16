//! [`GpuPlan`]: one GPU as the plan sees it, and the plan's rules per GPU: usable memory,
//! fits and allocator caps (rules 3 and 7, numbers from [`super::fit`]), compute modes
//! (rule 9), MIG instances as devices (rule 10), the driver's CUDA version (rule 11) and
//! the GPU bound (Σ fits; 0 is [`PlanError::DoesNotFit`]).

use serde::Serialize;

use super::fit::{
    admits, default_utilization, per_worker_mb, share_mb, usable_mb, workers_fitting,
    MIN_ALLOCATOR_MB,
};
use super::{Demand, Notes, PlacementMode, PlanError, Policy};
use crate::master::resources::{ComputeMode, GpuInfo, MigInstance, Resources};
use crate::protocol::{
    cuda_version_text, Device, GpuAssignment, CUDA_BUILD_MIN_DRIVER, CUDA_BUILD_VERSION,
};

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
    /// Allocator cap of each worker here, `per worker − context` (the plan's
    /// `cuda_context_mb`), when bounded; never above the operator's own
    /// `per_process_memory_fraction` of the total.
    pub cap_mb: Option<u64>,
    /// The cap as a share of `total_mb`.
    pub memory_fraction: Option<f64>,
    /// Why this GPU takes no worker, when it takes none.
    pub excluded: Option<String>,
    /// NVIDIA MPS serves this GPU (detected, `--mps`): its compute mode's exclusivity
    /// applies to the MPS server, and the workers are its clients.
    #[serde(default)]
    pub mps: bool,
    /// Under MPS, each worker's driver-enforced limit (`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`):
    /// its whole share, the per-worker figure the ledger reserves for it (cap and context).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps_limit_mb: Option<u64>,
    /// Under MPS, the per-client limit this server inherited for this GPU
    /// (`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`): its share, which bounds `usable_mb`
    /// ([`super::mps`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps_client_limit_mb: Option<u64>,
    /// A MIG device's GPU instance; MIG devices of one GPU with the same one share its
    /// memory, planned once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_instance: Option<u32>,
    /// MB the other servers of this host reserved here in the ledger (`master::host::ledger`):
    /// `free_mb` is at most `total × fraction` less them.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ledger_mb: u64,
    /// CUDA compute capability, `major.minor`, as NVML tells it (told to its workers: an
    /// AOTInductor package runs only on the GPU kind it was compiled for).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_capability: Option<String>,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
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
            mps_limit_mb: g.mps_limit_mb,
            compute_capability: g.compute_capability.clone(),
        }
    }

    /// The compute mode workers meet here: under MPS an exclusive mode holds the MPS server
    /// alone, and its clients share the GPU as in the default mode (NVIDIA's MPS
    /// documentation: "exclusive-mode restrictions are applied to the MPS server, not MPS
    /// clients").
    pub fn effective_mode(&self) -> ComputeMode {
        effective_mode(self.compute_mode, self.mps)
    }

    /// The workers its compute mode lets run here when `fits` fit by memory.
    pub fn limit(&self, fits: u32) -> u32 {
        self.effective_mode().limit(fits)
    }

    /// The memory pool it draws from: a MIG device shares its GPU instance's.
    fn pool(&self) -> (u32, Option<u32>) {
        match (self.mig, self.gpu_instance) {
            (Some(m), Some(gi)) => (m.parent, Some(gi)),
            _ => (self.index, None),
        }
    }
}

/// [`GpuPlan::effective_mode`].
pub(super) fn effective_mode(mode: ComputeMode, mps: bool) -> ComputeMode {
    match mode {
        ComputeMode::ExclusiveProcess | ComputeMode::ExclusiveThread if mps => ComputeMode::Default,
        mode => mode,
    }
}

/// How many workers of `per_worker_mb` the GPUs hold (those not excluded), each memory pool
/// counted once: the compute instances of one GPU instance share its usable memory, divided
/// among them as the plan does. Asked by the footprint learner with the footprint observed.
pub fn capacity(gpus: &[GpuPlan], per_worker_mb: u64) -> u32 {
    let mut seen: Vec<(u32, Option<u32>)> = Vec::new();
    let mut total = 0;
    for g in gpus.iter().filter(|g| g.excluded.is_none()) {
        let pool = g.pool();
        if seen.contains(&pool) {
            continue;
        }
        seen.push(pool);
        let members: Vec<&GpuPlan> = gpus
            .iter()
            .filter(|m| m.excluded.is_none() && m.pool() == pool)
            .collect();
        let fits = workers_fitting(g.usable_mb, per_worker_mb);
        total += members
            .iter()
            .enumerate()
            .map(|(k, m)| m.limit(share(fits, members.len(), k)))
            .sum::<u32>();
    }
    total
}

/// Member `k`'s part of `pool` workers divided among `n`: the first ones one more.
fn share(pool: u32, n: usize, k: usize) -> u32 {
    let n = n.max(1) as u32;
    pool / n + u32::from((k as u32) < pool % n)
}

/// The GPUs the plan may use, each with its figures, in NVML index order. On the CPU the
/// plan lists no GPU (none is used); the ones seen are named in `why`.
pub(super) fn plan_gpus(
    res: &Resources,
    demand: &Demand,
    policy: &Policy,
    mode: PlacementMode,
    notes: &mut Notes,
) -> Vec<GpuPlan> {
    match mode {
        PlacementMode::Cpu => {
            if !res.gpus.is_empty() {
                let seen: Vec<String> = res
                    .gpus
                    .iter()
                    .map(|g| format!("GPU {} ({}, {} MB free)", g.index, g.name, g.free_mb()))
                    .collect();
                notes.why(format!("GPUs seen but not used: {}", seen.join(", ")));
            }
            Vec::new()
        }
        _ => {
            let mut gpus: Vec<GpuPlan> = res
                .gpus
                .iter()
                .enumerate()
                .map(|(ordinal, g)| gpu_plan(g, ordinal as u32, policy, demand, mode))
                .collect();
            if mode == PlacementMode::GpuMemory {
                share_gpu_instances(&mut gpus, demand, policy, notes);
            }
            gpus
        }
    }
}

/// Rule 10: the MIG devices of one GPU instance (its compute instances) share its memory.
/// Each reports all of it, so planned one by one they would get it once each; instead the
/// workers its usable memory holds are divided among them (the first ones one more), and
/// each worker's cap is its share of that memory.
fn share_gpu_instances(gpus: &mut [GpuPlan], demand: &Demand, policy: &Policy, notes: &mut Notes) {
    let mut pools: Vec<(u32, Option<u32>)> = Vec::new();
    for g in gpus.iter() {
        if g.pool().1.is_some() && !pools.contains(&g.pool()) {
            pools.push(g.pool());
        }
    }
    for pool in pools {
        let members: Vec<usize> = (0..gpus.len())
            .filter(|&i| gpus[i].pool() == pool)
            .collect();
        if members.len() < 2 {
            continue;
        }
        let lead = &gpus[members[0]];
        let labels: Vec<String> = members.iter().map(|&i| gpus[i].label.clone()).collect();
        let (usable, admitted) = (lead.usable_mb, lead.excluded.is_none() || lead.fits > 0);
        let all = workers_fitting(usable, per_worker_mb(demand.typ_mb));
        notes.why(format!(
            "{} are compute instances of GPU {} GPU instance {}: they share its memory, planned once ({usable} MB usable hold {all} workers in all)",
            labels.join(" and "),
            pool.0,
            pool.1.unwrap_or_default()
        ));
        if !admitted {
            continue;
        }
        for (k, &i) in members.iter().enumerate() {
            let g = &mut gpus[i];
            g.fits = g.limit(share(all, members.len(), k));
            (g.cap_mb, g.memory_fraction, g.mps_limit_mb) = caps(g, usable, all, demand, policy);
            g.excluded = (g.fits == 0).then(|| {
                format!(
                    "it shares GPU instance {} with {}: its {usable} MB usable hold {all} workers, placed on the others",
                    pool.1.unwrap_or_default(),
                    labels.iter().filter(|l| **l != g.label).cloned().collect::<Vec<_>>().join(", ")
                )
            });
        }
    }
}

/// Each worker's allocator cap (rule 7), that cap as a share of the total, and under MPS
/// its whole share (the per-client limit), for `fits` workers in `usable_mb`: the share is
/// the figure one worker is planned as ([`per_worker_mb`]) — what the GPU-memory ledger
/// reserves for it, so that the caps and limits of the workers never sum to more than the
/// reservation (`usable / fits` would hand out the remainder no worker was planned for) —
/// and the cap is the share less the context, as measured or [`super::CUDA_CONTEXT_MB`],
/// never above the operator's own `per_process_memory_fraction` of the total.
fn caps(
    g: &GpuPlan,
    usable_mb: u64,
    fits: u32,
    demand: &Demand,
    policy: &Policy,
) -> (Option<u64>, Option<f64>, Option<u64>) {
    if fits == 0 {
        return (None, None, None);
    }
    // `fits ≤ usable / per worker`, so this is the figure per worker.
    let share = per_worker_mb(demand.typ_mb).min(usable_mb / u64::from(fits));
    let mut cap = share.saturating_sub(demand.context_mb());
    if let Some(f) = policy.allocator_fraction {
        cap = cap.min((g.total_mb as f64 * f).floor() as u64);
    }
    let fraction = (g.total_mb > 0).then(|| floor4(cap as f64 / g.total_mb as f64));
    (Some(cap), fraction, g.mps.then_some(share))
}

/// One GPU's figures (rules 3, 7, 9): usable memory (under MPS at most the per-client
/// limit inherited for CUDA device `ordinal`, [`super::mps`]), how many workers fit (0 when
/// it does not admit one, or its compute mode forbids), each one's allocator cap.
fn gpu_plan(
    g: &GpuInfo,
    ordinal: u32,
    policy: &Policy,
    demand: &Demand,
    mode: PlacementMode,
) -> GpuPlan {
    let (min, typ, reserve) = (demand.min_mb, demand.typ_mb, policy.gpu_reserve_mb);
    let total_mb = g.total_mb();
    let fraction = policy
        .gpu_memory_utilization
        .unwrap_or_else(|| default_utilization(total_mb));
    // The other servers' reservations are used memory, whether they show in NVML yet or not.
    let shared = share_mb(total_mb, fraction);
    let free_mb = match g.ledger_mb {
        0 => g.free_mb(),
        others => g.free_mb().min(shared.saturating_sub(others)),
    };
    let ledger = match g.ledger_mb {
        0 => String::new(),
        others => format!(" (after {others} MB other servers reserved in the ledger)"),
    };
    let client_limit = super::mps::client_limit(policy, ordinal);
    let usable_mb =
        usable_mb(total_mb, fraction, free_mb, reserve).min(client_limit.unwrap_or(u64::MAX));
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
                "{free_mb} MB free{ledger} < est_gpu_mem_min {min} MB + reserve {reserve} MB"
            )),
        ),
        PlacementMode::GpuMemory => {
            let fits = effective_mode(g.compute_mode, policy.mps)
                .limit(workers_fitting(usable_mb, per_worker));
            let excluded = (fits == 0).then(|| {
                super::mps::too_big(client_limit, per_worker).unwrap_or_else(|| {
                    format!(
                    "{usable_mb} MB usable (min({total_mb} MB × {fraction}, {free_mb} MB free{ledger}) \
                     − reserve {reserve} MB) < {per_worker} MB per worker"
                )
                })
            });
            (fits, excluded)
        }
    };
    let mut plan = GpuPlan {
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
        cap_mb: None,
        memory_fraction: None,
        excluded,
        mps: policy.mps,
        mps_limit_mb: None,
        mps_client_limit_mb: client_limit,
        gpu_instance: g.gpu_instance,
        ledger_mb: g.ledger_mb,
        compute_capability: g.compute_capability.clone(),
    };
    if mode == PlacementMode::GpuMemory {
        (plan.cap_mb, plan.memory_fraction, plan.mps_limit_mb) =
            caps(&plan, usable_mb, fits, demand, policy);
    }
    plan
}

/// Rounds down to 4 decimals (a cap a little low is safe, a little high is not).
fn floor4(x: f64) -> f64 {
    (x * 10_000.0).floor() / 10_000.0
}

/// Rule 11: why the driver cannot run the worker on a GPU, when its CUDA version is older
/// than the build's (warned). `--device cuda` insists: warned, and `None`.
pub(super) fn driver_too_old(
    res: &Resources,
    policy: &Policy,
    notes: &mut Notes,
) -> Option<String> {
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
            notes.warn(format!(
                "{why}; --device cuda: starting anyway (a worker that finds no CUDA stops the server, exit 5)"
            ));
        } else {
            notes.warn(why.clone());
            return Some(why);
        }
    }
    None
}

/// What the plan says of the GPUs it uses before it counts: their compute modes (rule 9),
/// and an estimate below one CUDA context plus [`MIN_ALLOCATOR_MB`] (rule 7).
pub(super) fn gpu_notes(gpus: &[GpuPlan], demand: &Demand, mode: PlacementMode, notes: &mut Notes) {
    let typ = demand.typ_mb;
    for g in gpus
        .iter()
        .filter(|g| g.compute_mode != ComputeMode::Default)
    {
        notes.why(format!(
            "{} is in {} compute mode: {}",
            g.label,
            g.compute_mode.name(),
            match g.effective_mode() {
                ComputeMode::Prohibited => "no worker (no process may use it)",
                ComputeMode::Default =>
                    "MPS serves it, so that holds the MPS server alone and the workers, its clients, share the GPU (--mps off: one worker)",
                _ => "at most one worker (one process at a time may use it)",
            }
        ));
    }
    if mode == PlacementMode::GpuMemory && per_worker_mb(typ) > typ {
        notes.warn(format!(
            "est_gpu_mem_typ {typ} MB is less than one worker's CUDA context ({} \
             MB) plus {MIN_ALLOCATOR_MB} MB for its tensors: each worker is planned as {} MB",
            demand.context_mb(),
            per_worker_mb(typ)
        ));
    }
}

/// The GPU bound (rule 3) when memory bounds the count: Σ fits, with why, each GPU that
/// takes none warned; `None` on the CPU and in spread placement.
pub(super) fn gpu_bound(
    gpus: &[GpuPlan],
    demand: &Demand,
    policy: &Policy,
    mode: PlacementMode,
    notes: &mut Notes,
) -> Result<Option<u32>, PlanError> {
    let (typ, reserve) = (demand.typ_mb, policy.gpu_reserve_mb);
    Ok(match mode {
        PlacementMode::GpuMemory => {
            let bound: u32 = gpus.iter().map(|g| g.fits).sum();
            if bound == 0 {
                return Err(does_not_fit(gpus.to_vec(), demand, reserve));
            }
            let terms: Vec<String> = gpus.iter().map(|g| g.fits.to_string()).collect();
            let per_worker = per_worker_mb(typ);
            let divisor = if per_worker == typ {
                format!("est_gpu_mem_typ {typ} MB")
            } else {
                format!("{per_worker} MB per worker")
            };
            notes.why(format!(
                "GPU bound = Σ floor(usable / {divisor}) = {} = {bound}",
                terms.join(" + ")
            ));
            for g in gpus.iter().filter(|g| g.excluded.is_some()) {
                notes.warn(format!(
                    "{} ({}) takes no worker: {}",
                    g.label,
                    g.name,
                    g.excluded.as_deref().unwrap_or_default()
                ));
            }
            Some(bound)
        }
        PlacementMode::Cpu | PlacementMode::GpuSpread => None,
    })
}

/// [`PlanError::DoesNotFit`], naming each GPU, the estimate and the way out.
pub(super) fn does_not_fit(gpus: Vec<GpuPlan>, demand: &Demand, reserve: u64) -> PlanError {
    let (min, typ) = (demand.min_mb, demand.typ_mb);
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
