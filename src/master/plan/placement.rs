//! Where each worker goes: the worker count (rules 4 and 6: the bounds' minimum, or the
//! override as given), each slot's GPU (rule 5: the most room left; spread placement's
//! round-robin shares), the slots an override asks for beyond what fits
//! ([`super::Plan::unplaced`]), and what the supervisor asks of the plan later (where one
//! more worker goes, [`Target`]; what a GPU holds).

use serde::Serialize;

use super::gpus::{does_not_fit, GpuPlan};
use super::{Demand, Notes, PlacementMode, Plan, PlanError, Policy};
use crate::master::resources::ComputeMode;
use crate::protocol::GpuAssignment;

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

/// Rules 4 and 6: the worker count and where it came from (`"plan"`, or the override's
/// source).
pub(super) fn worker_count(
    policy: &Policy,
    cpu_bound: u32,
    gpu_bound: Option<u32>,
    notes: &mut Notes,
) -> (u32, String) {
    let planned = gpu_bound.map_or(cpu_bound, |g| g.min(cpu_bound));
    match policy.workers_override {
        Some(o) => {
            notes.why(format!(
                "workers = {} from {} (the plan would give {planned})",
                o.count, o.source
            ));
            if o.count > cpu_bound {
                notes.warn(format!(
                    "{} = {} is above the CPU bound {cpu_bound}: workers will compete for cores",
                    o.source, o.count
                ));
            }
            (o.count, o.source.to_string())
        }
        None => {
            match gpu_bound {
                Some(g) => notes.why(format!(
                    "workers = min(CPU bound {cpu_bound}, GPU bound {g}) = {planned}"
                )),
                None => notes.why(format!("workers = CPU bound = {planned}")),
            }
            (planned, "plan".to_string())
        }
    }
}

/// Rule 5: each slot's place, and the slots that fit nowhere now (rule 6), warned. In
/// spread placement each GPU's share (`fits`) is set here.
pub(super) fn place(
    gpus: &mut [GpuPlan],
    demand: &Demand,
    policy: &Policy,
    mode: PlacementMode,
    (workers, source): (u32, &str),
    (cpu_bound, gpu_bound): (u32, Option<u32>),
    notes: &mut Notes,
) -> Result<(Vec<Placement>, Vec<u32>), PlanError> {
    let (min, typ, reserve) = (demand.min_mb, demand.typ_mb, policy.gpu_reserve_mb);
    let mut placed = gpu_bound.map_or(workers, |g| workers.min(g));
    if mode == PlacementMode::GpuSpread {
        // Not a memory bound: the round-robin share, so TTIN spreads further evenly; but
        // never past what the compute mode allows.
        let exclusive = gpus
            .iter()
            .filter(|g| {
                let mode = g.effective_mode();
                mode != ComputeMode::Default && mode != ComputeMode::Prohibited
            })
            .count() as u32;
        let open = gpus
            .iter()
            .filter(|g| g.effective_mode() == ComputeMode::Default)
            .count() as u32;
        let share = workers
            .max(cpu_bound)
            .saturating_sub(exclusive)
            .div_ceil(open.max(1));
        for g in gpus.iter_mut() {
            g.fits = match g.effective_mode() {
                ComputeMode::Default => share,
                mode => mode.limit(1),
            };
        }
        let room: u32 = gpus.iter().map(|g| g.fits).sum();
        if room == 0 {
            return Err(does_not_fit(gpus.to_vec(), demand, reserve));
        }
        placed = placed.min(room);
    }
    let mut placement = Vec::with_capacity(placed as usize);
    for slot in 0..placed {
        let gpu = match mode {
            PlacementMode::Cpu => None,
            PlacementMode::GpuMemory => {
                let i = most_room(gpus).expect("placed ≤ Σ fits");
                gpus[i].assigned += 1;
                Some(gpus[i].assignment())
            }
            PlacementMode::GpuSpread => {
                let i = most_room(gpus).expect("placed ≤ Σ shares");
                gpus[i].assigned += 1;
                Some(gpus[i].assignment())
            }
        };
        placement.push(Placement { slot, gpu });
    }
    let unplaced: Vec<u32> = (placed..workers).collect();
    if !unplaced.is_empty() {
        notes.warn(format!(
            "{source} asks for {workers} workers but only {placed} fit in GPU memory now: \
             slot(s) {}..={} start only when a GPU has {} MB free (est_gpu_mem_min + reserve) \
             and room for est_gpu_mem_typ {typ} MB",
            placed,
            workers - 1,
            min + reserve
        ));
    }
    Ok((placement, unplaced))
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
    /// against the GPU's free memory now ([`super::admits`]).
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
            // Past the share on a GPU any process may use; never past a compute mode's limit
            // — the mode workers meet, so under MPS an exclusive-process GPU is a shared one.
            PlacementMode::GpuSpread => self
                .gpus
                .iter()
                .filter(|g| {
                    g.effective_mode() == ComputeMode::Default || g.fits > running_on(g.index)
                })
                .filter(|g| g.effective_mode() != ComputeMode::Prohibited)
                .min_by(|a, b| {
                    running_on(a.index)
                        .cmp(&running_on(b.index))
                        .then(a.index.cmp(&b.index))
                }),
        };
        pick.map_or(Target::NoRoom, |g| Target::Gpu(g.assignment()))
    }

    /// How messages name device `index` (`GPU 1`, `GPU 0 MIG 2`).
    pub fn gpu_label(&self, index: u32) -> String {
        self.gpus
            .iter()
            .find(|g| g.index == index)
            .map_or_else(|| format!("GPU {index}"), |g| g.label.clone())
    }
}
