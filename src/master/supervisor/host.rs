//! Host memory in the supervisor ([`HostWatch`]): the host-memory bound applied the first
//! time a template is ready (its warm-up's peak is the measurement, taken before any CPU
//! worker starts: they wait for the template), the workers' own memory learned while they
//! serve (TTIN is refused past what fits at the highest figure seen), recycling on
//! `--max-worker-memory-mb` said in the log, and a worker's death by the kernel's OOM
//! killer told apart from other SIGKILLs (`master::oom`).

use super::Supervisor;
use crate::master::oom::OomCounter;
use crate::master::plan::{host, WorkerCost};
use crate::master::resources::host_memory::{Budget, Cgroup};
use crate::master::slot::WorkerState;
use crate::protocol::{ReadyMemory, RetireReason};

const MB: u64 = 1 << 20;

/// What a worker forked from the template holds of its own besides its passes' memory (its
/// threads' stacks, the pages of the template it writes): measured on the build machine
/// (`smaps_rollup`'s `Private_Dirty`, 2 cores) 1.1 MB when ready and 1.4 MB after 200
/// requests for the small MLP, 3.7 MB after 50 requests for a model writing 100 MB of
/// scratch per pass; doubled for machines with more cores (more threads). The figures
/// workers report while serving take over from it when higher (TTIN).
pub const FORKED_WORKER_MB: u64 = 8;

/// What the supervisor knows of host memory.
pub(super) struct HostWatch {
    cgroup: Option<Cgroup>,
    oom: OomCounter,
    /// The bound was tried (the first template ready).
    tried: bool,
    /// Once applied: the room then and the MB per worker assumed.
    applied: Option<(u64, u64)>,
    /// The highest own memory a worker reported, bytes.
    high_water: Option<u64>,
    exceeded: bool,
    /// Not even one worker fits: the master exits 2 (`act`).
    pub refused: Option<String>,
}

impl HostWatch {
    pub fn new(cgroup: Option<Cgroup>) -> HostWatch {
        HostWatch {
            oom: OomCounter::new(cgroup.clone()),
            cgroup,
            tried: false,
            applied: None,
            high_water: None,
            exceeded: false,
            refused: None,
        }
    }

    /// Workers that fit at the cost assumed or, when one was seen above it, at the highest
    /// own memory seen; `None` when the bound was not applied.
    pub fn capacity(&self) -> Option<u32> {
        let (room, per) = self.applied?;
        let seen = self.high_water.map_or(0, |b| b.div_ceil(MB));
        Some(u32::try_from(room / per.max(seen).max(1)).unwrap_or(u32::MAX))
    }

    /// A SIGKILL nobody here sent: whether the OOM killer took the process.
    pub fn oom_took_one(&mut self) -> bool {
        self.oom.took_one()
    }

    /// Where OOM kills are counted, for messages.
    pub fn oom_source(&self) -> String {
        self.oom.source()
    }

    /// A worker reported its own memory (ready, heartbeat, retiring): kept as its last
    /// figure; the high-water mark, and once past the cost assumed, a warning.
    pub fn own_memory(&mut self, st: &mut WorkerState, own: Option<u64>) {
        let Some(own) = own else {
            return;
        };
        st.own_memory = Some(own);
        if self.high_water.is_some_and(|h| h >= own) {
            return;
        }
        self.high_water = Some(own);
        let Some((room, per)) = self.applied else {
            return;
        };
        let mb = own.div_ceil(MB);
        if mb > per && !self.exceeded {
            self.exceeded = true;
            let cap = self.capacity().unwrap_or(0);
            tracing::warn!(
                event = "host_memory_exceeded",
                slot = st.slot,
                pid = st.pid,
                own_mb = mb,
                planned_mb = per,
                capacity = cap,
                "worker {} (pid {}) holds {mb} MB of its own host memory, more than the {per} MB the plan assumed per worker: {room} MB hold {cap} at that figure; TTIN is refused past that",
                st.slot,
                st.pid
            );
        }
    }

    /// A worker retires: when for `--max-worker-memory-mb`, said with its figure.
    pub fn retiring(&self, st: &WorkerState, reason: RetireReason, limit_mb: Option<u64>) {
        if reason != RetireReason::HostMemory {
            return;
        }
        let own_mb = st.own_memory.map(|b| b.div_ceil(MB));
        tracing::info!(
            event = "worker_memory_recycled",
            slot = st.slot,
            pid = st.pid,
            generation = st.generation,
            own_mb,
            limit_mb,
            served = st.served,
            "worker {} (pid {}) holds {} MB of its own host memory, past --max-worker-memory-mb {}: it is recycled once its requests in flight are answered",
            st.slot,
            st.pid,
            own_mb.map_or("?".into(), |m| m.to_string()),
            limit_mb.unwrap_or(0)
        );
    }
}

impl Supervisor {
    /// The template is ready with its warm-up's figures: the first time, the plan takes
    /// the host-memory bound (before any CPU worker starts).
    pub(super) fn template_measured(&mut self, memory: Option<ReadyMemory>) {
        if self.host.tried || self.stopping.is_some() {
            return;
        }
        self.host.tried = true;
        let Some(peak) = memory.and_then(|m| m.pass_peak) else {
            tracing::info!(
                event = "host_memory_unmeasured",
                "the template ran no warm-up pass (no declared input shape, or --warmup-passes 0): the host-memory bound is not applied"
            );
            return;
        };
        let Some(budget) = Budget::now(self.host.cgroup.as_ref()) else {
            return;
        };
        let peak_mb = peak.div_ceil(MB);
        let cost = WorkerCost {
            measured_mb: peak_mb + FORKED_WORKER_MB,
            headroom: self.cfg.memory_headroom,
            recycle_mb: self.cfg.max_worker_memory_mb,
            from: format!(
                "the template's warm-up peak {peak_mb} MB + {FORKED_WORKER_MB} MB a forked worker holds of its own"
            ),
        };
        let mut plan = self.plan.clone();
        let (room, source) = (budget.room_mb, budget.source.clone());
        match host::apply(&mut plan, budget, &cost, &self.cfg.policy()) {
            Err(e) => self.host.refused = Some(e.to_string()),
            Ok(lowered) => {
                let per = cost.planned_mb();
                let bound = plan.host.as_ref().and_then(|h| h.bound).unwrap_or(0);
                tracing::info!(
                    event = "host_memory_planned",
                    room_mb = room,
                    per_worker_mb = per,
                    bound,
                    workers = plan.workers,
                    bounded = lowered,
                    source,
                    "host-memory bound = {room} MB ({source}) / {per} MB per worker = {bound}: {}",
                    if lowered {
                        format!("host memory bounds the plan, {} workers", plan.workers)
                    } else {
                        format!("{} workers as planned", plan.workers)
                    }
                );
                for w in plan
                    .warnings
                    .iter()
                    .filter(|w| !self.plan.warnings.contains(w))
                {
                    tracing::warn!(event = "plan_warning", "{w}");
                }
                if lowered {
                    self.target = self.target.min(plan.workers);
                }
                if let Some(m) = &self.metrics {
                    m.host_plan(bound, plan.workers);
                }
                self.plan = plan;
                self.host.applied = Some((room, per));
            }
        }
    }
}
