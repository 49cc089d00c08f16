//! The supervisor's rules beside [`super::decide`], each a pure function: inputs in, a
//! decision out, no I/O (NVML's figures and the workers' states are passed in), so each is
//! a table in the tests below. The supervisor gathers the inputs, calls the rule and logs
//! what it decided.
//!
//! | rule | decides | asked |
//! |---|---|---|
//! | [`Admission`] | whether a GPU's free memory takes one more worker now | before every start on a GPU (`decide`'s `gpu_admits`) and by [`place_unplaced`] |
//! | [`gpu_capacity`] | how many workers a GPU holds, retiring ones included | each loop (`decide`'s `gpu_capacity`) |
//! | [`ttin`] | whether TTIN raises the target, and where a new slot goes | TTIN |
//! | [`adapt`] | whether `--adapt-workers` lowers the target by one now | each loop, once the footprint passed the plan's |
//! | [`place_unplaced`] | which GPU a slot beyond the plan gets | each loop, while such a slot waits (`worker_waits` `unplaced`) |

use super::slot::{Phase, WorkerState};
use crate::master::config::Config;
use crate::master::plan::{usable_mb, workers_fitting, GpuPlan, Target};
use crate::master::resources::ComputeMode;
use crate::protocol::GpuAssignment;

/// What a GPU must have free before a worker starts there: `est_gpu_mem_min` plus the
/// reserve ([`crate::master::plan::admits`], the same rule the plan applies at start).
///
/// **After a reload (HUP)** admission reads the metadata of the configuration the master
/// starts workers with now, [`Admission::of`] the supervisor's current `Config`: the new
/// metadata once a HUP was accepted (every worker started from then on is one of the new
/// configuration, so its declared minimum is the one that must fit), the restored one
/// after a rollback, and never the plan's figures from the start (`Plan::admission_mb`,
/// which only the plan's text shows). The reserve is a command-line setting: a reload keeps
/// it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    pub est_gpu_mem_min: u64,
    pub reserve_mb: u64,
}

impl Admission {
    /// Admission for workers started with `cfg` (see the type's doc for reloads).
    pub fn of(cfg: &Config) -> Admission {
        Admission {
            est_gpu_mem_min: cfg.app.metadata.est_gpu_mem_min,
            reserve_mb: cfg.gpu.gpu_reserve_mb,
        }
    }

    /// Whether a GPU with `free_mb` free takes one more worker.
    pub fn admits_mb(self, free_mb: u64) -> bool {
        crate::master::plan::admits(free_mb, self.est_gpu_mem_min, self.reserve_mb)
    }

    /// Whether a GPU admits one more worker, from NVML's free bytes; `None` (NVML
    /// unreadable now) admits: the service is not blocked on a probe that failed.
    pub fn admits(self, free_bytes: Option<u64>) -> bool {
        free_bytes.is_none_or(|b| self.admits_mb(b >> 20))
    }
}

/// How many workers GPU `gpu` holds (retiring ones included), for `decide`: what the plan
/// fitted there, or more where slots beyond the plan were placed there (`on_it`: slots on
/// it now). A GPU only one process at a time may use (compute mode) never holds more than
/// its mode allows, so a replacement waits for its predecessor to be gone. A GPU the plan
/// does not know holds the slots on it.
pub fn gpu_capacity(gpus: &[GpuPlan], gpu: u32, on_it: u32) -> u32 {
    match gpus.iter().find(|g| g.index == gpu) {
        Some(g) if g.effective_mode() != ComputeMode::Default => g.limit(g.fits),
        Some(g) => g.fits.max(on_it),
        None => on_it,
    }
}

/// What TTIN does.
#[derive(Debug, Clone, PartialEq)]
pub enum Ttin {
    /// Refused: the footprint observed while serving leaves room for `cap` workers, and at
    /// least that many are wanted.
    FootprintFull { cap: u32 },
    /// Refused: by the plan, the GPUs' usable memory holds no more.
    NoRoom,
    /// One more worker, in a slot that exists already (a TTOU left it empty).
    Reuse,
    /// One more worker, in a new slot on this GPU (`None`: the CPU).
    NewSlot(Option<GpuAssignment>),
}

/// TTIN's rule. `target`: the workers wanted now; `slots`: how many slots exist;
/// `footprint_cap`: what the GPUs hold at the footprint observed while serving, once it
/// passed what the plan assumed (`Learner::capacity`; `None` while it has not);
/// `next`: where the plan puts one more worker ([`crate::master::plan::Plan::next_target`]), asked
/// only when a new slot is needed.
pub fn ttin(
    target: u32,
    slots: usize,
    footprint_cap: Option<u32>,
    next: impl FnOnce() -> Target,
) -> Ttin {
    if let Some(cap) = footprint_cap.filter(|&cap| target >= cap) {
        return Ttin::FootprintFull { cap };
    }
    if (target as usize) < slots {
        return Ttin::Reuse;
    }
    match next() {
        Target::Cpu => Ttin::NewSlot(None),
        Target::Gpu(g) => Ttin::NewSlot(Some(g)),
        Target::NoRoom => Ttin::NoRoom,
    }
}

/// What `--adapt-workers` looks at.
#[derive(Debug, Clone, Copy)]
pub struct AdaptView {
    /// `--adapt-workers` is on.
    pub enabled: bool,
    /// The footprint observed while serving passed what the plan assumed.
    pub exceeded: bool,
    /// Stopping or reloading: the pool is changing for another reason.
    pub busy: bool,
    /// A worker is booting, retiring or asked to stop ([`settling`]).
    pub settling: bool,
    /// What the GPUs hold at the observed footprint (`Learner::capacity`).
    pub capacity: Option<u32>,
    pub target: u32,
}

/// `--adapt-workers`: once the observed footprint passed the plan's, lower the target by
/// one (a graceful retirement, as TTOU) while it is above what the GPUs hold at that
/// footprint, one worker at a time (only when the pool has settled), never below one.
/// Returns the new target and the capacity it is lowered towards.
pub fn adapt(v: AdaptView) -> Option<(u32, u32)> {
    if !v.enabled || !v.exceeded || v.busy {
        return None;
    }
    let cap = v.capacity.unwrap_or(v.target).max(1);
    (v.target > cap && !v.settling).then(|| (v.target - 1, cap))
}

/// Whether the pool is still settling: a worker is not ready, or was asked to stop.
pub fn settling<'a>(workers: impl IntoIterator<Item = &'a WorkerState>) -> bool {
    workers
        .into_iter()
        .any(|w| w.phase != Phase::Ready || w.asked_to_stop.is_some())
}

/// The GPU for a slot beyond the plan (an override larger than what fitted), once one has
/// the memory for a typical worker: it admits one ([`Admission`]) and one worker as planned
/// ([`crate::master::plan::per_worker_mb`] of the plan's `planned_typ_mb`) fits in
/// `min(total × fraction, free) − reserve` ([`crate::master::plan::workers_fitting`], the plan's
/// own rule). Skipped: GPUs the plan excluded,
/// GPUs where a worker of ours is still booting (NVML's free figure does not count it yet),
/// GPUs whose compute mode allows one process that already have a slot, and GPUs whose
/// free memory cannot be read. Among the rest, the most free memory wins (the last of
/// equals). Returns the GPU and its free MB.
pub fn place_unplaced(
    gpus: &[GpuPlan],
    admission: Admission,
    planned_typ_mb: u64,
    free_mb: impl Fn(u32) -> Option<u64>,
    booting_on: impl Fn(u32) -> bool,
    has_slot: impl Fn(u32) -> bool,
) -> Option<(&GpuPlan, u64)> {
    let per_worker = crate::master::plan::per_worker_mb(planned_typ_mb);
    let fits_now = |g: &GpuPlan| -> Option<u64> {
        let free = free_mb(g.index)?;
        let usable = usable_mb(g.total_mb, g.fraction, free, admission.reserve_mb);
        (admission.admits_mb(free) && workers_fitting(usable, per_worker) >= 1).then_some(free)
    };
    gpus.iter()
        .filter(|g| g.excluded.is_none() && !booting_on(g.index))
        // A GPU only one process at a time may use takes no second worker.
        .filter(|g| g.effective_mode() == ComputeMode::Default || !has_slot(g.index))
        .filter_map(|g| fits_now(g).map(|free| (g, free)))
        .max_by_key(|(_, free)| *free)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::master::plan::{per_worker_mb, CUDA_CONTEXT_MB};
    use std::time::Instant;

    #[test]
    fn admission_needs_min_plus_reserve_and_admits_when_nvml_is_unreadable() {
        let a = Admission {
            est_gpu_mem_min: 3000,
            reserve_mb: 500,
        };
        let mb = |m: u64| Some(m << 20);
        // (free bytes, admitted)
        let rows: &[(Option<u64>, bool)] = &[
            (mb(3500), true),
            (mb(3500).map(|b| b - 1), false), // one byte short: 3499 MB
            (mb(3499), false),
            (mb(80_000), true),
            (Some(0), false),
            (None, true), // NVML unreadable: do not block the service
        ];
        for &(free, want) in rows {
            assert_eq!(a.admits(free), want, "{free:?}");
        }
        let none = Admission {
            est_gpu_mem_min: 0,
            reserve_mb: 0,
        };
        assert!(none.admits(Some(0)));
    }

    #[test]
    fn ttin_refuses_past_the_footprint_and_past_the_plan() {
        let gpu1 = GpuAssignment {
            index: 1,
            uuid: "GPU-1".into(),
            memory_fraction: Some(0.25),
            cap_mb: Some(4000),
            mig: None,
            mps_limit_mb: None,
            compute_capability: None,
        };
        // (target, slots, footprint cap, where the plan puts one more, outcome)
        let rows: Vec<(u32, usize, Option<u32>, Target, Ttin)> = vec![
            (2, 2, None, Target::Cpu, Ttin::NewSlot(None)),
            (
                2,
                2,
                None,
                Target::Gpu(gpu1.clone()),
                Ttin::NewSlot(Some(gpu1.clone())),
            ),
            (2, 2, None, Target::NoRoom, Ttin::NoRoom),
            // A slot left by TTOU is used again, without asking the plan.
            (1, 2, None, Target::NoRoom, Ttin::Reuse),
            // The footprint passed the plan's: the GPUs hold 3 at it.
            (3, 3, Some(3), Target::Cpu, Ttin::FootprintFull { cap: 3 }),
            (4, 4, Some(3), Target::Cpu, Ttin::FootprintFull { cap: 3 }),
            (2, 3, Some(3), Target::NoRoom, Ttin::Reuse),
            (2, 2, Some(3), Target::Cpu, Ttin::NewSlot(None)),
            // Capacity unknown at the observed footprint counts as none.
            (1, 1, Some(0), Target::Cpu, Ttin::FootprintFull { cap: 0 }),
        ];
        for (target, slots, cap, next, want) in rows {
            let got = ttin(target, slots, cap, || next.clone());
            assert_eq!(got, want, "target {target}, slots {slots}, cap {cap:?}");
        }
    }

    #[test]
    fn ttin_asks_the_plan_only_for_a_new_slot() {
        let asked = std::cell::Cell::new(false);
        let next = || {
            asked.set(true);
            Target::Cpu
        };
        assert_eq!(ttin(1, 3, None, next), Ttin::Reuse);
        assert!(!asked.get());
    }

    #[test]
    fn adapt_lowers_one_at_a_time_down_to_capacity() {
        let base = AdaptView {
            enabled: true,
            exceeded: true,
            busy: false,
            settling: false,
            capacity: Some(2),
            target: 4,
        };
        // (view, new target and capacity)
        let rows: Vec<(AdaptView, Option<(u32, u32)>)> = vec![
            (base, Some((3, 2))),
            (AdaptView { target: 3, ..base }, Some((2, 2))),
            (AdaptView { target: 2, ..base }, None),
            (AdaptView { target: 1, ..base }, None),
            (
                AdaptView {
                    enabled: false,
                    ..base
                },
                None,
            ),
            (
                AdaptView {
                    exceeded: false,
                    ..base
                },
                None,
            ),
            (AdaptView { busy: true, ..base }, None),
            (
                AdaptView {
                    settling: true,
                    ..base
                },
                None,
            ),
            // Never below one, even when nothing fits at the observed footprint.
            (
                AdaptView {
                    capacity: Some(0),
                    target: 2,
                    ..base
                },
                Some((1, 1)),
            ),
            (
                AdaptView {
                    capacity: Some(0),
                    target: 1,
                    ..base
                },
                None,
            ),
            // Capacity unknown: the target stands.
            (
                AdaptView {
                    capacity: None,
                    ..base
                },
                None,
            ),
        ];
        for (v, want) in rows {
            assert_eq!(adapt(v), want, "{v:?}");
        }
    }

    #[test]
    fn settling_means_a_worker_not_ready_or_asked_to_stop() {
        let now = Instant::now();
        let ready = |pid| {
            let mut w = WorkerState::new(pid, 0, 0, 0, None, now);
            w.phase = Phase::Ready;
            w
        };
        let a = ready(1);
        let b = ready(2);
        assert!(!settling([&a, &b]));
        assert!(!settling([]));
        let booting = WorkerState::new(3, 1, 0, 0, None, now);
        assert!(settling([&a, &booting]));
        let mut retiring = ready(4);
        retiring.phase = Phase::Retiring;
        assert!(settling([&retiring]));
        let mut asked = ready(5);
        asked.asked_to_stop = Some(now);
        assert!(settling([&a, &asked]));
    }

    fn gpu(index: u32, total_mb: u64, fraction: f64) -> GpuPlan {
        GpuPlan {
            index,
            label: format!("GPU {index}"),
            name: "test".into(),
            uuid: format!("GPU-{index}"),
            compute_mode: ComputeMode::Default,
            mig: None,
            total_mb,
            free_mb: total_mb,
            fraction,
            usable_mb: 0,
            fits: 0,
            assigned: 0,
            cap_mb: None,
            memory_fraction: None,
            excluded: None,
            mps: false,
            mps_limit_mb: None,
            mps_client_limit_mb: None,
            gpu_instance: None,
            ledger_mb: 0,
            compute_capability: None,
        }
    }

    #[test]
    fn gpu_capacity_is_the_plans_fit_or_the_slots_placed_there() {
        let fits = |g: GpuPlan, n: u32| GpuPlan { fits: n, ..g };
        let gpus = vec![
            fits(gpu(0, 10_000, 0.9), 3),
            GpuPlan {
                compute_mode: ComputeMode::ExclusiveProcess,
                ..fits(gpu(1, 10_000, 0.9), 1)
            },
            GpuPlan {
                compute_mode: ComputeMode::Prohibited,
                ..gpu(2, 10_000, 0.9)
            },
        ];
        // (gpu, slots on it, capacity)
        let rows = [
            (0, 0, 3),
            (0, 3, 3),
            (0, 5, 5), // slots beyond the plan placed there
            (1, 1, 1),
            (1, 3, 1), // exclusive: one at a time, whatever the slots
            (2, 0, 0),
            (2, 2, 0), // prohibited: none
            (9, 2, 2), // unknown to the plan: the slots on it
            (9, 0, 0),
        ];
        for (g, on_it, want) in rows {
            assert_eq!(
                gpu_capacity(&gpus, g, on_it),
                want,
                "GPU {g}, {on_it} slots"
            );
        }
    }

    #[test]
    fn a_slot_beyond_the_plan_goes_where_a_typical_worker_fits_now() {
        let adm = Admission {
            est_gpu_mem_min: 1000,
            reserve_mb: 500,
        };
        // A typical worker is planned as at least a CUDA context plus a little.
        let typ = 2000;
        let per = per_worker_mb(typ);
        assert!(per >= typ.max(CUDA_CONTEXT_MB));
        let excluded = GpuPlan {
            excluded: Some("no".into()),
            ..gpu(2, 10_000, 0.9)
        };
        let exclusive = GpuPlan {
            compute_mode: ComputeMode::ExclusiveProcess,
            ..gpu(3, 10_000, 0.9)
        };
        let gpus = vec![
            gpu(0, 10_000, 0.9),
            gpu(1, 10_000, 0.9),
            excluded,
            exclusive,
        ];
        struct Row {
            name: &'static str,
            free: [Option<u64>; 4],
            booting: &'static [u32],
            slots: &'static [u32],
            want: Option<(u32, u64)>,
        }
        let enough = per + 500;
        let rows = [
            Row {
                name: "most free memory wins",
                free: [Some(5000), Some(8000), Some(9000), None],
                booting: &[],
                slots: &[0, 1],
                want: Some((1, 8000)),
            },
            Row {
                name: "equals: the last one",
                free: [Some(8000), Some(8000), None, None],
                booting: &[],
                slots: &[],
                want: Some((1, 8000)),
            },
            Row {
                name: "a worker booting there: skipped",
                free: [Some(5000), Some(8000), None, None],
                booting: &[1],
                slots: &[],
                want: Some((0, 5000)),
            },
            Row {
                name: "NVML unreadable: skipped",
                free: [None, Some(5000), None, None],
                booting: &[],
                slots: &[],
                want: Some((1, 5000)),
            },
            Row {
                name: "exactly one typical worker plus the reserve",
                free: [Some(enough), None, None, None],
                booting: &[],
                slots: &[],
                want: Some((0, enough)),
            },
            Row {
                name: "one MB short of a typical worker",
                free: [Some(enough - 1), None, None, None],
                booting: &[],
                slots: &[],
                want: None,
            },
            Row {
                name: "an exclusive GPU without a slot takes one",
                free: [None, None, None, Some(9000)],
                booting: &[],
                slots: &[],
                want: Some((3, 9000)),
            },
            Row {
                name: "an exclusive GPU with a slot takes no second",
                free: [None, None, None, Some(9000)],
                booting: &[],
                slots: &[3],
                want: None,
            },
            Row {
                name: "nothing free",
                free: [Some(0), Some(0), Some(0), Some(0)],
                booting: &[],
                slots: &[],
                want: None,
            },
        ];
        for r in rows {
            let got = place_unplaced(
                &gpus,
                adm,
                typ,
                |i| r.free[i as usize],
                |i| r.booting.contains(&i),
                |i| r.slots.contains(&i),
            )
            .map(|(g, free)| (g.index, free));
            assert_eq!(got, r.want, "{}", r.name);
        }
    }

    #[test]
    fn a_slot_beyond_the_plan_needs_admission_and_the_usable_share() {
        let typ = 2000;
        let per = per_worker_mb(typ);
        // Usable = min(total × fraction, free) − reserve: a small fraction bounds it.
        let small = [gpu(0, 10_000, (per + 500) as f64 / 10_000.0 - 0.001)];
        let adm = Admission {
            est_gpu_mem_min: 0,
            reserve_mb: 500,
        };
        assert_eq!(
            place_unplaced(&small, adm, typ, |_| Some(9000), |_| false, |_| false),
            None
        );
        // Admission: est_gpu_mem_min above what is free refuses even where a typical
        // worker would fit by est_gpu_mem_typ.
        let big = [gpu(0, 100_000, 0.9)];
        let strict = Admission {
            est_gpu_mem_min: 9000,
            reserve_mb: 500,
        };
        assert_eq!(
            place_unplaced(&big, strict, typ, |_| Some(9000), |_| false, |_| false),
            None
        );
        assert!(place_unplaced(&big, strict, typ, |_| Some(9500), |_| false, |_| false).is_some());
    }
}
