//! Rule 13, the host-memory bound: workers ≤ floor(what the server may still use / what one
//! more worker costs at its peak). Two steps, both pure:
//!
//! - [`budget`]: what the server may use ([`Budget`]: the cgroup's limit less its working
//!   set, never above `MemAvailable`; else `MemAvailable`) is recorded, the cost of a worker
//!   not yet known: `app plan` shows the row, and the bound is not applied.
//! - [`apply`]: with the cost measured — the template's warm-up peak plus what a forked
//!   worker holds of its own when ready, or else the first worker's own memory when ready
//!   plus how far its resident set rose (`master::supervisor::host`), × `--memory-headroom`, and at least
//!   `--max-worker-memory-mb` (a worker may grow that far before it is recycled) — the
//!   bound is computed; below the worker count, it lowers it (rule 4 becomes min(CPU, GPU,
//!   host memory)); 0 is [`PlanError::HostMemory`] unless an override insists (then a
//!   warning). Pages a forked worker shares with the template (the weights) are not part of
//!   the cost: they are the template's, counted once in the working set the room is left
//!   from.

use serde::Serialize;

use super::{Notes, Plan, PlanError, Policy};
use crate::master::resources::host_memory::Budget;

/// The plan's host-memory row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HostPlan {
    /// What the server may use, read when the cost was measured (or at planning).
    pub budget: Budget,
    /// MB one more worker costs at its peak, as planned; `None`: not measured yet.
    pub per_worker_mb: Option<u64>,
    /// How [`HostPlan::per_worker_mb`] was reached, in words.
    pub per_worker_from: Option<String>,
    /// floor(room / per worker), once measured.
    pub bound: Option<u32>,
}

/// What one more worker was measured to cost.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerCost {
    /// Its peak: the warm-up's peak plus a forked worker's own memory when ready (MB).
    pub measured_mb: u64,
    /// `--memory-headroom`.
    pub headroom: f64,
    /// `--max-worker-memory-mb`, when given.
    pub recycle_mb: Option<u64>,
    /// Where [`WorkerCost::measured_mb`] comes from, in words.
    pub from: String,
}

impl WorkerCost {
    /// MB per worker to plan with: measured × headroom, at least the recycling limit.
    pub fn planned_mb(&self) -> u64 {
        let with_headroom = (self.measured_mb as f64 * self.headroom).ceil() as u64;
        with_headroom.max(self.recycle_mb.unwrap_or(0)).max(1)
    }

    fn words(&self) -> String {
        let mut s = format!(
            "{} MB measured ({}) × {}",
            self.measured_mb, self.from, self.headroom
        );
        if let Some(r) = self.recycle_mb.filter(|r| *r > self.measured_mb) {
            s.push_str(&format!(", at least --max-worker-memory-mb {r}"));
        }
        s
    }
}

/// Records what the server may use; the cost of a worker is measured later.
pub fn budget(plan: &mut Plan, budget: Budget) {
    plan.why.push(format!(
        "host-memory bound: {} MB may be used ({}); one worker's peak is measured from the template's warm-up pass when the server starts, else from the first worker's (one worker serves until then, unless the worker count is an override)",
        budget.room_mb, budget.source
    ));
    plan.host = Some(HostPlan {
        budget,
        per_worker_mb: None,
        per_worker_from: None,
        bound: None,
    });
}

/// Applies the host-memory bound with `budget` read now and the measured `cost`. Returns
/// whether the worker count fell; [`PlanError::HostMemory`] when not even one worker fits
/// (unless an override insists).
pub fn apply(
    plan: &mut Plan,
    budget: Budget,
    cost: &WorkerCost,
    policy: &Policy,
) -> Result<bool, PlanError> {
    let per = cost.planned_mb();
    let bound = u32::try_from(budget.room_mb / per).unwrap_or(u32::MAX);
    let mut notes = Notes {
        why: std::mem::take(&mut plan.why),
        warnings: std::mem::take(&mut plan.warnings),
    };
    notes.why.retain(|w| !w.starts_with("host-memory bound"));
    notes.why(format!(
        "host-memory bound = {} MB may be used ({}) / {per} MB per worker ({}) = {bound}",
        budget.room_mb,
        budget.source,
        cost.words()
    ));
    let result = lower(plan, bound, policy, &mut notes);
    if result.is_err() {
        notes.why.push(format!(
            "not even one worker fits in host memory: {} MB may be used ({}), one worker takes {per} MB at its peak ({}); give the server more memory (the cgroup's limit), or serve a smaller model or input shape",
            budget.room_mb,
            budget.source,
            cost.words()
        ));
    }
    plan.host = Some(HostPlan {
        budget,
        per_worker_mb: Some(per),
        per_worker_from: Some(cost.words()),
        bound: Some(bound),
    });
    plan.why = notes.why;
    plan.warnings = notes.warnings;
    match result {
        Err(()) => Err(PlanError::HostMemory(
            plan.why.last().cloned().unwrap_or_default(),
        )),
        Ok(lowered) => Ok(lowered),
    }
}

/// The worker count under `bound`: lowered (the last slots placed are dropped, which is
/// what placing fewer gives: each slot went where the most room was left), or an
/// override's warning; `Err` when `bound` is 0 and nothing insists.
fn lower(plan: &mut Plan, bound: u32, policy: &Policy, notes: &mut Notes) -> Result<bool, ()> {
    if let Some(o) = policy.workers_override {
        if o.count > bound {
            notes.warn(format!(
                "{} = {} is above the host-memory bound {bound}: under memory pressure the kernel's OOM killer will take workers (their oom_score_adj makes them its first choice)",
                o.source, o.count
            ));
        }
        return Ok(false);
    }
    if bound == 0 {
        return Err(());
    }
    if bound >= plan.workers {
        return Ok(false);
    }
    notes.why(format!(
        "workers = min({}, host-memory bound {bound}) = {bound}: host memory bounds the plan",
        plan.workers
    ));
    plan.workers = bound;
    plan.bounded_by = "host memory";
    for p in plan.placement.drain(bound as usize..) {
        if let Some(g) = p.gpu {
            if let Some(gp) = plan.gpus.iter_mut().find(|gp| gp.index == g.index) {
                gp.assigned = gp.assigned.saturating_sub(1);
            }
        }
    }
    notes.why.retain(|w| !w.starts_with("torch threads"));
    plan.torch_threads = policy.torch_threads(plan.cpus, bound, notes);
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::master::plan::{plan as make_plan, Demand, WorkerOverride};
    use crate::master::resources::Resources;
    use crate::metadata::AppMetadata;

    fn cpu_plan(cpus: usize) -> Plan {
        let meta = AppMetadata::parse(
            std::path::Path::new("/a/app-metadata.json"),
            r#"{"name": "t"}"#,
        )
        .unwrap();
        let res = Resources {
            cpus,
            ..Default::default()
        };
        make_plan(&res, &Demand::declared(&meta), &Policy::default()).unwrap()
    }

    fn room(mb: u64) -> Budget {
        Budget {
            room_mb: mb,
            limit_mb: Some(mb + 200),
            in_use_mb: Some(200),
            available_mb: Some(20_000),
            source: format!(
                "cgroup v1 limit {} MB (/x/memory.limit_in_bytes), 200 MB in use",
                mb + 200
            ),
        }
    }

    fn cost(mb: u64, recycle: Option<u64>) -> WorkerCost {
        WorkerCost {
            measured_mb: mb,
            headroom: 1.2,
            recycle_mb: recycle,
            from: "the template's warm-up peak + a forked worker's own memory".into(),
        }
    }

    /// (cpus, room MB, measured MB, --max-worker-memory-mb, override, workers, lowered, bound)
    type Row = (usize, u64, u64, Option<u64>, Option<u32>, u32, bool, u32);

    #[test]
    fn host_memory_bounds_the_worker_count_when_it_is_the_smallest() {
        // (cpus, room MB, measured MB, --max-worker-memory-mb, override, workers, lowered, bound)
        let rows: [Row; 6] = [
            // 486 MB limit, 200 MB in use: 286 / ceil(110 × 1.2 = 132) = 2 < CPU bound 5.
            (2, 286, 110, None, None, 2, true, 2),
            // Room for more than the CPU bound: the CPU bound stands.
            (2, 20_000, 110, None, None, 5, false, 151),
            // The recycling limit is what a worker may reach: 286 / 200 = 1.
            (2, 286, 110, Some(200), None, 1, true, 1),
            // A limit below the measured figure changes nothing.
            (2, 286, 110, Some(50), None, 2, true, 2),
            // An override insists (warned), even past the bound.
            (2, 286, 110, None, Some(4), 4, false, 2),
            // ceil(1 MB × 1.2) = 2 MB per worker.
            (8, 1000, 1, None, None, 17, false, 500),
        ];
        for (cpus, room_mb, measured, recycle, over, workers, lowered, bound) in rows {
            let policy = Policy {
                workers_override: over.map(|count| WorkerOverride {
                    count,
                    source: "--workers",
                }),
                ..Policy::default()
            };
            let mut p = cpu_plan(cpus);
            if let Some(o) = over {
                p.workers = o;
            }
            let got = apply(&mut p, room(room_mb), &cost(measured, recycle), &policy).unwrap();
            let row = format!("{cpus} {room_mb} {measured} {recycle:?} {over:?}");
            assert_eq!((p.workers, got), (workers, lowered), "{row}\n{:#?}", p.why);
            assert_eq!(p.host.as_ref().unwrap().bound, Some(bound), "{row}");
            assert_eq!(
                p.placement.len() as u32,
                if over.is_some() { 5 } else { workers },
                "{row}"
            );
            if lowered {
                assert_eq!(p.bounded_by, "host memory", "{row}");
                assert!(p
                    .why
                    .iter()
                    .any(|w| w.contains("host memory bounds the plan")));
                // Torch threads follow the new count: 2 cores / 1 or 2 workers.
                assert_eq!(p.torch_threads, (cpus / workers as usize).max(1), "{row}");
            }
            if over.is_some() {
                assert!(p
                    .warnings
                    .iter()
                    .any(|w| w.contains("above the host-memory bound")));
            }
        }
    }

    #[test]
    fn not_one_worker_fitting_is_refused_with_the_figures() {
        let mut p = cpu_plan(2);
        let e = apply(&mut p, room(100), &cost(110, None), &Policy::default()).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("not even one worker fits in host memory"),
            "{msg}"
        );
        assert!(
            msg.contains("100 MB may be used") && msg.contains("132 MB"),
            "{msg}"
        );
        assert!(msg.contains("cgroup v1 limit 300 MB"), "{msg}");
        // The unmeasured row says what is known.
        let mut p = cpu_plan(2);
        budget(&mut p, room(100));
        assert_eq!(p.host.as_ref().unwrap().bound, None);
        assert!(p.why.last().unwrap().contains("100 MB may be used"));
    }
}
