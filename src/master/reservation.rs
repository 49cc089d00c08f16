//! This server's reservation in the host's GPU-memory ledger ([`crate::master::ledger`]):
//! the ledger is read, under its lock, before the plan is made (the other servers' live
//! reservations become each GPU's `ledger_mb`, which the plan counts as used); the lock is
//! held through profiling until the final plan is written ([`Reservation::commit`]); while
//! serving, the reservation follows the workers wanted on GPUs and is renewed before its
//! lease runs out ([`Reservation::follow`]); it is released when the master exits.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::master::config::Config;
use crate::master::ledger::{Ledger, Locked, DEFAULT_DIR, RENEW_EVERY};
use crate::master::plan::{per_worker_mb, share_mb, Plan};
use crate::master::resources::Resources;
use crate::protocol::Device;

/// What this server holds in the ledger.
pub struct Reservation {
    ledger: Ledger,
    /// Held from the first read until the plan is written.
    locked: Option<Locked>,
    /// What was last written, and when.
    written: Option<(BTreeMap<String, u64>, Instant)>,
}

/// MB per device UUID the first `workers` slots of `plan` hold on GPUs: each worker the
/// figure the plan fitted workers by — which is also its allocator cap plus context, and
/// under MPS its per-client limit (`plan::gpus`'s `caps`).
pub fn reserved_by(plan: &Plan, workers: u32) -> BTreeMap<String, u64> {
    reserved_with(plan, workers, &[])
}

/// A worker alive on a GPU: its slot, its device's UUID and the MB it was started with
/// (its plan's figure per worker; under MPS its per-client limit, which the driver fixes
/// when the worker's CUDA context is made and no later change reaches).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveWorker {
    pub slot: u32,
    pub uuid: String,
    pub mb: u64,
}

/// [`reserved_by`], and no less than what the workers alive now were started with: per
/// slot and device, the larger of the plan's figure (for a slot below `workers`) and the
/// sum of the live workers' own figures there. So a worker still retiring (TTOU, a
/// reload's old generation, an idle release) stays reserved until it has exited, and one
/// started under an earlier plan keeps the figure its limit was made with.
pub fn reserved_with(plan: &Plan, workers: u32, live: &[LiveWorker]) -> BTreeMap<String, u64> {
    let per = per_worker_mb(plan.planned_typ_mb);
    let mut by_slot: BTreeMap<(String, u32), (u64, u64)> = BTreeMap::new();
    for p in plan.placement.iter().filter(|p| p.slot < workers) {
        if let Some(g) = &p.gpu {
            by_slot.entry((g.uuid.clone(), p.slot)).or_default().0 += per;
        }
    }
    for w in live {
        by_slot.entry((w.uuid.clone(), w.slot)).or_default().1 += w.mb;
    }
    let mut out = BTreeMap::new();
    for ((uuid, _), (wanted, alive)) in by_slot {
        *out.entry(uuid).or_insert(0) += wanted.max(alive);
    }
    out
}

/// How many of the first `want` slots of `plan` fit, in order, where each GPU offers
/// `room(gpu)` MB (`None`: unknown, no limit) less `reserve_mb`.
pub fn fitting(
    plan: &Plan,
    want: u32,
    reserve_mb: u64,
    room: impl Fn(&crate::master::plan::GpuPlan) -> Option<u64>,
) -> u32 {
    let per = per_worker_mb(plan.planned_typ_mb);
    let mut left: BTreeMap<u32, Option<u64>> = plan
        .gpus
        .iter()
        .map(|g| (g.index, room(g).map(|r| r.saturating_sub(reserve_mb))))
        .collect();
    let mut slots: Vec<_> = plan.placement.iter().filter(|p| p.slot < want).collect();
    slots.sort_by_key(|p| p.slot);
    let mut n = 0;
    for p in slots {
        if let Some(g) = &p.gpu {
            match left.get_mut(&g.index) {
                Some(Some(l)) if *l >= per => *l -= per,
                Some(None) | None => {}
                Some(Some(_)) => break,
            }
        }
        n += 1;
    }
    n
}

impl Reservation {
    /// Reads the ledger (taking its lock) when this server may plan workers on GPUs, and
    /// marks each GPU of `res` with what the other servers reserved there. `None`: no
    /// GPU, `--device cpu`, `--ledger off`, or a ledger that cannot be used (said).
    pub fn begin(cfg: &Config, res: &mut Resources) -> Option<Reservation> {
        let dir = cfg.gpu.ledger.as_ref()?;
        if res.gpus.is_empty() || cfg.gpu.device == Device::Cpu {
            return None;
        }
        // One server serves at a fixed address of this host (a port of 0 names none).
        let seat = (cfg.address.port != 0).then(|| {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
            let meta = cfg.app.metadata.path.display();
            format!(
                "{} {}:{} {meta}",
                host.trim(),
                cfg.address.host,
                cfg.address.port
            )
        });
        let opened = Ledger::open(dir, &cfg.app.metadata.name, seat).and_then(|l| {
            let locked = l.lock()?;
            Ok((l, locked))
        });
        let (ledger, locked) = match opened {
            Ok(o) => o,
            Err(e) => {
                let default = if dir.as_os_str() == DEFAULT_DIR {
                    " (the default; --ledger DIR names another, --ledger off plans alone without this warning)"
                } else {
                    ""
                };
                tracing::warn!(
                    target: "app",
                    event = "ledger_unavailable",
                    "the GPU-memory ledger in {}{default} cannot be used ({e}): this server plans alone, as if no other server used these GPUs",
                    dir.display()
                );
                return None;
            }
        };
        let others = locked.others();
        for g in &mut res.gpus {
            if let Some(o) = others.get(&g.uuid) {
                g.ledger_mb = o.mb;
                tracing::info!(
                    target: "app",
                    event = "ledger_others",
                    gpu = g.index,
                    reserved_mb = o.mb,
                    servers = o.servers,
                    "{}: {} other server(s) reserved {} MB in the GPU-memory ledger ({}): planned as used",
                    g.label(),
                    o.servers,
                    o.mb,
                    dir.display()
                );
            }
        }
        Some(Reservation {
            ledger,
            locked: Some(locked),
            written: None,
        })
    }

    /// Writes the final plan's reservation and lets the lock go.
    pub fn commit(&mut self, plan: &Plan) {
        let want = reserved_by(plan, plan.workers);
        let written = match self.locked.take() {
            Some(mut l) => l.reserve(&want),
            None => self.ledger.reserve(&want),
        };
        self.said(written, want, Instant::now());
    }

    /// While serving: the reservation for the first `workers` slots of `plan` and the
    /// workers `live` now ([`reserved_with`]), written when it changed or its lease is due
    /// for renewal.
    pub fn follow(&mut self, plan: &Plan, workers: u32, live: &[LiveWorker], now: Instant) {
        let want = reserved_with(plan, workers, live);
        let due = match &self.written {
            None => true,
            Some((w, at)) => *w != want || now.duration_since(*at) >= RENEW_EVERY,
        };
        if due {
            let written = self.ledger.reserve(&want);
            self.said(written, want, now);
        }
    }

    fn said(&mut self, written: std::io::Result<()>, want: BTreeMap<String, u64>, now: Instant) {
        match written {
            Ok(()) => {
                if self.written.as_ref().is_none_or(|(w, _)| *w != want) {
                    let total: u64 = want.values().sum();
                    tracing::info!(
                        target: "app",
                        event = "ledger_reserved",
                        reserved_mb = total,
                        dir = %self.ledger.dir().display(),
                        "reserved {total} MB of GPU memory in the ledger ({}): {want:?}",
                        self.ledger.dir().display()
                    );
                }
                self.written = Some((want, now));
            }
            Err(e) => {
                tracing::warn!(
                    target: "app",
                    event = "ledger_write_failed",
                    "cannot write this server's reservation in the GPU-memory ledger ({}): {e}; tried again in {} s",
                    self.ledger.dir().display(),
                    RENEW_EVERY.as_secs()
                );
                self.written = Some((want, now));
            }
        }
    }

    /// What the ledger leaves now for one more worker of this server on each GPU of `plan`
    /// (by index): `total × fraction` less the others' live reservations and this server's
    /// own for its first `workers` slots and its `live` workers. `None` when the ledger
    /// cannot be read (then NVML's free memory alone decides, as without a ledger).
    pub fn room(
        &self,
        plan: &Plan,
        workers: u32,
        live: &[LiveWorker],
    ) -> Option<BTreeMap<u32, u64>> {
        let others = self.ledger.lock().ok()?.others();
        let own = reserved_with(plan, workers, live);
        let room = plan.gpus.iter().map(|g| {
            let shared = share_mb(g.total_mb, g.fraction);
            let taken =
                others.get(&g.uuid).map_or(0, |o| o.mb) + own.get(&g.uuid).copied().unwrap_or(0);
            (g.index, shared.saturating_sub(taken))
        });
        Some(room.collect())
    }

    /// Re-admission after `--idle-release`, under one hold of the ledger's lock: how many
    /// of the first `want` slots of `plan` fit in what the other servers' live reservations
    /// leave on their GPUs (each GPU also no more than `free(index)` MB, NVML's free memory,
    /// when known), less `reserve_mb` per GPU; that many are reserved before the lock goes.
    /// Slots are taken in order and the count stops at the first that does not fit (slots
    /// `0..n` are what a target of `n` starts). A ledger that cannot be read admits them all
    /// (NVML's free memory alone decides, as without a ledger).
    pub fn admit(
        &mut self,
        plan: &Plan,
        want: u32,
        reserve_mb: u64,
        free: impl Fn(u32) -> Option<u64>,
    ) -> u32 {
        let Ok(mut locked) = self.ledger.lock() else {
            return fitting(plan, want, reserve_mb, |g| free(g.index));
        };
        let others = locked.others();
        let n = fitting(plan, want, reserve_mb, |g| {
            let shared = share_mb(g.total_mb, g.fraction);
            let room = shared.saturating_sub(others.get(&g.uuid).map_or(0, |o| o.mb));
            Some(free(g.index).map_or(room, |f| f.min(room)))
        });
        if n > 0 {
            let want = reserved_by(plan, n);
            let written = locked.reserve(&want);
            drop(locked);
            self.said(written, want, Instant::now());
        }
        n
    }

    /// The master exits: its reservation goes.
    pub fn release(&mut self) {
        self.locked = None;
        if let Err(e) = self.ledger.release() {
            tracing::warn!(
                target: "app",
                "cannot remove this server's reservation from the GPU-memory ledger ({e}); it expires within {} s",
                crate::master::ledger::LEASE.as_secs()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::master::plan::{plan, Demand, Policy};
    use crate::master::resources::{GpuInfo, MB};
    use crate::metadata::AppMetadata;

    /// The plan of an app declaring 4000 MB per worker on two A100 40 GB (16 cores).
    fn two_a100s() -> Plan {
        two_a100s_with(false)
    }

    /// As [`two_a100s`], with NVIDIA MPS serving the GPUs or not.
    fn two_a100s_with(mps: bool) -> Plan {
        let gpu = |index: u32| GpuInfo {
            index,
            uuid: format!("GPU-{index}"),
            name: "NVIDIA A100-SXM4-40GB".into(),
            total_bytes: 40_960 * MB,
            free_bytes: 40_960 * MB,
            ..GpuInfo::default()
        };
        let res = Resources {
            cpus: 16,
            gpus: vec![gpu(0), gpu(1)],
            gpu_note: None,
            driver_version: None,
            cuda_driver_version: None,
        };
        let meta = AppMetadata::parse(
            Path::new("/apps/a/app-metadata.json"),
            r#"{"name": "a", "est_gpu_mem_min": 1000, "est_gpu_mem_typ": 4000}"#,
        )
        .unwrap();
        let policy = Policy {
            mps,
            ..Policy::default()
        };
        plan(&res, &Demand::declared(&meta), &policy).unwrap()
    }

    /// Issue 57, item 2: what the ledger reserves for a worker covers what the worker may
    /// take — its allocator cap plus its context, and under MPS its driver-enforced limit —
    /// for every count of workers, so the sum of the caps never exceeds the reservation.
    /// (The per-worker figure was 4000 MB while each cap and limit was the GPU's usable
    /// memory ÷ the workers that fit, 4040 MB here: the ledger undercounted.)
    #[test]
    fn the_reservation_covers_every_workers_cap_and_mps_limit() {
        for mps in [false, true] {
            let p = two_a100s_with(mps);
            let usable = p.gpus[0].usable_mb;
            assert!(
                usable / u64::from(p.gpus[0].fits) > per_worker_mb(p.planned_typ_mb),
                "the GPU's usable memory leaves more than one worker's figure per worker: {:?}",
                p.gpus[0]
            );
            for n in 1..=p.workers {
                let reserved = reserved_by(&p, n);
                let mut caps: BTreeMap<String, u64> = BTreeMap::new();
                let mut limits: BTreeMap<String, u64> = BTreeMap::new();
                for s in p.placement.iter().filter(|s| s.slot < n) {
                    let g = s.gpu.as_ref().unwrap();
                    *caps.entry(g.uuid.clone()).or_default() +=
                        g.cap_mb.unwrap() + p.cuda_context_mb;
                    *limits.entry(g.uuid.clone()).or_default() += g.mps_limit_mb.unwrap_or(0);
                }
                for (uuid, mb) in &reserved {
                    assert!(
                        caps[uuid] <= *mb,
                        "{n} workers, mps {mps}: caps {caps:?} > reserved {reserved:?}"
                    );
                    assert!(
                        limits[uuid] <= *mb,
                        "{n} workers: MPS limits {limits:?} > reserved {reserved:?}"
                    );
                    if mps {
                        assert_eq!(
                            limits[uuid], *mb,
                            "{n} workers: MPS limit is the figure reserved"
                        );
                    }
                }
            }
        }
    }

    /// Issue 57, item 1: the reservation never falls below what the live workers were
    /// started with — a worker retiring after TTOU stays reserved until it exits, and a
    /// worker started under an earlier plan with a larger figure keeps it (its MPS limit was
    /// fixed when its CUDA context was made).
    #[test]
    fn live_workers_stay_reserved_at_the_figure_they_were_started_with() {
        let p = two_a100s_with(true);
        let slot = |s: u32| p.placement.iter().find(|x| x.slot == s).unwrap();
        let uuid = |s: u32| slot(s).gpu.as_ref().unwrap().uuid.clone();
        let live = |s: u32, mb: u64| LiveWorker {
            slot: s,
            uuid: uuid(s),
            mb,
        };
        let per = per_worker_mb(p.planned_typ_mb);
        // Slots 0 and 1 wanted and alive at the plan's figure: the plan's figure.
        let both = [live(0, per), live(1, per)];
        assert_eq!(reserved_with(&p, 2, &both), reserved_by(&p, 2));
        // TTOU: one slot wanted, slot 1's worker still retiring: still reserved.
        assert_eq!(reserved_with(&p, 1, &both), reserved_by(&p, 2));
        // Once it exited: gone.
        assert_eq!(reserved_with(&p, 1, &both[..1]), reserved_by(&p, 1));
        // A reload's old generation and the new one in the same slot: both.
        let two_gens = [live(0, per), live(0, per)];
        assert_eq!(reserved_with(&p, 1, &two_gens)[&uuid(0)], 2 * per);
        // A worker started with a larger figure than the plan's now keeps its own.
        let bigger = [live(0, per + 700)];
        assert_eq!(reserved_with(&p, 1, &bigger)[&uuid(0)], per + 700);
        // A slot wanted but not started yet is reserved at the plan's figure.
        assert_eq!(reserved_with(&p, 1, &[]), reserved_by(&p, 1));
    }

    #[test]
    fn readmission_takes_the_first_slots_that_fit_in_order() {
        let p = two_a100s();
        let want = p.workers;
        let gpu_of = |slot: u32| {
            let s = p.placement.iter().find(|s| s.slot == slot).unwrap();
            s.gpu.as_ref().unwrap().index
        };
        assert_ne!(
            gpu_of(0),
            gpu_of(1),
            "slots alternate GPUs: {:?}",
            p.placement
        );
        // Room unknown (no NVML figure, no ledger) or plenty: every slot.
        assert_eq!(fitting(&p, want, 500, |_| None), want);
        assert_eq!(fitting(&p, want, 500, |_| Some(1 << 20)), want);
        // No room anywhere: none.
        assert_eq!(fitting(&p, want, 500, |_| Some(4000)), 0);
        // Room for one worker (plus the reserve) on each GPU: the first slot of each.
        assert_eq!(fitting(&p, want, 500, |_| Some(4500)), 2);
        // Room on the second slot's GPU only: the first slot does not fit, so none (a
        // target of n starts slots 0..n).
        let second = gpu_of(1);
        let only_second =
            |g: &crate::master::plan::GpuPlan| Some(if g.index == second { 40_000 } else { 0 });
        assert_eq!(fitting(&p, want, 500, only_second), 0);
        // Fewer wanted than fit: what is wanted.
        assert_eq!(fitting(&p, 1, 500, |_| None), 1);
    }

    #[test]
    fn admission_counts_the_others_reservations_and_reserves_under_the_lock() {
        let p = two_a100s();
        let dir = tempfile::tempdir().unwrap();
        let other = Ledger::open(dir.path(), "other", None).unwrap();
        let share = |i: usize| share_mb(p.gpus[i].total_mb, p.gpus[i].fraction);
        // The other server leaves room for one worker and the reserve on the first slot's
        // GPU, and none on the second's.
        let first = p.placement[0].gpu.as_ref().unwrap().index as usize;
        let held: BTreeMap<String, u64> = p
            .gpus
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let leave = if i == first { 4500 } else { 0 };
                (g.uuid.clone(), share(i) - leave)
            })
            .collect();
        other.reserve(&held).unwrap();
        let mut mine = Reservation {
            ledger: Ledger::open(dir.path(), "mine", None).unwrap(),
            locked: None,
            written: None,
        };
        assert_eq!(mine.admit(&p, p.workers, 500, |_| None), 1);
        let seen = other.lock().unwrap().others();
        let uuid = &p.gpus[first].uuid;
        assert_eq!(seen[uuid].mb, 4000, "{seen:?}");
        // NVML's free memory bounds it too: nothing fits where NVML shows 4000 MB free.
        let _ = mine.ledger.release();
        assert_eq!(mine.admit(&p, p.workers, 500, |_| Some(4000)), 0);
        assert!(!other.lock().unwrap().others().contains_key(uuid));
    }
}
