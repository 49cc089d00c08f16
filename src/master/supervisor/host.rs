//! Host memory in the supervisor ([`HostWatch`]): the host-memory bound applied the first
//! time a template is ready (its warm-up's peak is the measurement, taken before any CPU
//! worker starts: they wait for the template) — or, when nothing was measured at start (no
//! warm-up pass, no template), from the first worker's own figures while the pool is held
//! at that one worker ([`HostWatch::hold`]) — the workers' own memory learned while they
//! serve (TTIN is refused past what fits at the highest figure seen), recycling on
//! `--max-worker-memory-mb` said in the log, and a worker's death by the kernel's OOM
//! killer told apart from other SIGKILLs (`master::oom`).

use super::Supervisor;
use crate::master::oom::OomCounter;
use crate::master::plan::{host, WorkerCost};
use crate::master::resources::host_memory::{Budget, Cgroup};
use crate::master::slot::WorkerState;
use crate::protocol::{PassesPeak, ReadyMemory, RetireReason};

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
    /// The bound was tried (the first template ready, or the first workers started
    /// without a template).
    tried: bool,
    /// Nothing measured a pass at start: the first worker's figures will be (its `Ready`
    /// after a warm-up of its own, else its heartbeat once a pass answered).
    awaiting: bool,
    /// Meanwhile one worker serves ([`HostWatch::hold`]): the plan's own count may fall to
    /// the bound (an override's never does: it is only warned of).
    holding: bool,
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
            awaiting: false,
            holding: false,
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

    /// The worker count to start now: one while the first worker's passes are measured.
    pub fn hold(&self, target: u32) -> u32 {
        if self.holding {
            target.min(1)
        } else {
            target
        }
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
    /// the host-memory bound (before any CPU worker starts) — or, when it ran no pass, the
    /// first worker's passes will be measured.
    pub(super) fn template_measured(&mut self, memory: Option<ReadyMemory>) {
        if let (Some(m), Some(peak)) = (&self.metrics, memory.and_then(|m| m.pass_peak)) {
            m.warmup_pass_peak(peak);
        }
        if self.host.tried || self.stopping.is_some() {
            return;
        }
        self.host.tried = true;
        let Some(peak) = memory.and_then(|m| m.pass_peak) else {
            self.measure_serving(
                "the template ran no warm-up pass (no declared input shape, or --warmup-passes 0)",
            );
            return;
        };
        let Some(budget) = Budget::now(self.host.cgroup.as_ref()) else {
            return;
        };
        let peak_mb = peak.div_ceil(MB);
        self.apply_host_bound(
            budget,
            WorkerCost {
                measured_mb: peak_mb + FORKED_WORKER_MB,
                headroom: self.cfg.footprint.memory_headroom,
                recycle_mb: self.cfg.host_memory.max_worker_memory_mb,
                from: format!(
                    "the template's warm-up peak {peak_mb} MB + {FORKED_WORKER_MB} MB a forked worker holds of its own"
                ),
            },
        );
    }

    /// Workers start without a template (all on GPUs, or the template failed): the first
    /// time, their passes will be measured.
    pub(super) fn no_template_measures(&mut self) {
        if self.host.tried || self.stopping.is_some() {
            return;
        }
        self.host.tried = true;
        self.measure_serving("workers start without a template (every worker on a GPU, or the template failed), so no warm-up pass was measured");
    }

    /// Nothing measured a pass at start: hold the pool at one worker until its heartbeat
    /// shows its passes' peak (when there is a budget to bound by).
    fn measure_serving(&mut self, why: &str) {
        if Budget::now(self.host.cgroup.as_ref()).is_none() {
            tracing::info!(
                event = "host_memory_unmeasured",
                "{why}, and no host-memory figure could be read: the host-memory bound is not applied"
            );
            return;
        }
        self.host.awaiting = true;
        self.host.holding = self.cfg.policy().workers_override.is_none();
        let meanwhile = if self.host.holding {
            "one worker serves until its own warm-up, or else its first answered request, shows how far a pass takes its memory; then the others start within the host-memory bound"
        } else {
            "the first worker's own warm-up, or else its first answered request, will show how far a pass takes its memory (the worker count is an override: it is warned of past the bound, and TTIN is refused past it)"
        };
        tracing::info!(event = "host_memory_unmeasured", "{why}: {meanwhile}");
    }

    /// A worker's heartbeat showed its passes' peak: while held at one worker, the plan
    /// takes the host-memory bound from it (the room read now, plus what that worker holds
    /// now: the bound counts it among the workers).
    pub(super) fn serving_measured(&mut self, st: &WorkerState, peak: Option<PassesPeak>) {
        let Some(p) = peak.filter(|_| self.host.awaiting && self.stopping.is_none()) else {
            return;
        };
        self.host.awaiting = false;
        self.host.holding = false;
        let Some(mut budget) = Budget::now(self.host.cgroup.as_ref()) else {
            return;
        };
        let holds_mb = st.own_memory.unwrap_or(0).div_ceil(MB);
        budget.room_mb += holds_mb;
        budget.source = format!(
            "{}, + {holds_mb} MB worker {} holds",
            budget.source, st.slot
        );
        let (own_mb, rise_mb) = (p.own_at_ready.div_ceil(MB), p.rise.div_ceil(MB));
        self.apply_host_bound(
            budget,
            WorkerCost {
                measured_mb: own_mb + rise_mb,
                headroom: self.cfg.footprint.memory_headroom,
                recycle_mb: self.cfg.host_memory.max_worker_memory_mb,
                from: format!(
                    "worker {} (pid {}): {own_mb} MB of its own when ready + {rise_mb} MB its resident set rose above that since it started (load, warm-up, passes)",
                    st.slot, st.pid
                ),
            },
        );
    }

    /// Applies the bound of `budget` at `cost` per worker: the target falls to it (unless an
    /// override insists), TTIN is refused past it; not even one worker: the master exits 2.
    fn apply_host_bound(&mut self, budget: Budget, cost: WorkerCost) {
        let mut plan = self.plan.clone();
        let (room, source) = (budget.room_mb, budget.source.clone());
        let lowered = match host::apply(&mut plan, budget, &cost, &self.cfg.policy()) {
            Err(e) => {
                self.host.refused = Some(e.to_string());
                return;
            }
            Ok(lowered) => lowered,
        };
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
