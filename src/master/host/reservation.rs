//! This server's reservation in the host's GPU-memory ledger ([`crate::master::host::ledger`]):
//! the ledger is read, under its lock, before the plan is made (the other servers' live
//! reservations become each GPU's `ledger_mb`, which the plan counts as used); the plan's
//! reservation is written provisionally and the lock let go before any profiling
//! ([`Reservation::provisional`]: a thread renews it meanwhile); the lock is taken again to
//! write the final plan's, fewer workers if the others took the room in between
//! ([`Reservation::commit`]); while serving, the reservation follows the workers wanted on
//! GPUs and is renewed before its lease runs out, without the lock ([`Reservation::follow`]);
//! it is released when the master exits. `app plan` and development mode only read.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

use crate::master::config::{Config, Mode};
use crate::master::host::ledger::{
    Domains, Held, Ledger, NotTaken, Others, Unusable, LEASE, LOOP_WAIT, RENEW_EVERY, START_WAIT,
};
use crate::master::plan::{per_worker_mb, share_mb, Plan};
use crate::master::resources::{NvmlProbe, Resources};
use crate::protocol::Device;

mod borrow;
mod renew;
mod start;
pub use borrow::Need;
use renew::Renewer;
pub use start::domains;
use start::{busy, by_domain, mark, say_unavailable, say_wait, seat};

/// What this server holds in the ledger.
pub struct Reservation {
    ledger: Ledger,
    /// Each device's memory domain and size, by UUID.
    domains: Domains,
    /// Held from the first read until the provisional reservation is written.
    held: Option<Held>,
    /// What was last written (by domain), and when; and when a write last succeeded.
    written: Option<(BTreeMap<String, u64>, Instant)>,
    last_ok: Option<Instant>,
    /// The others as last read, and when: used for one lease when a read fails.
    last_good: Mutex<Option<(BTreeMap<String, Others>, Instant)>>,
    /// While profiling: the thread renewing the provisional reservation.
    renewer: Option<Renewer>,
    released: bool,
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
    /// Reads the ledger when this server may plan workers on GPUs, and marks each GPU of
    /// `res` with what the other servers reserved there; serving (`--production`), under
    /// the ledger's lock, kept until [`Reservation::provisional`]. `Ok(None)`: no GPU,
    /// `--device cpu`, `--ledger off`, not serving, or no ledger directory and none can be
    /// made (said: nobody can be reserving there). `Err`: a ledger that is there but cannot
    /// be used, or whose lock stays busy: the server refuses to start (exit 2).
    pub fn begin(
        cfg: &Config,
        res: &mut Resources,
        probe: Option<&NvmlProbe>,
    ) -> Result<Option<Reservation>, String> {
        let Some(dir) = cfg.gpu.ledger.as_ref() else {
            return Ok(None);
        };
        if res.gpus.is_empty() || cfg.gpu.device == Device::Cpu {
            return Ok(None);
        }
        let serving = cfg.mode == Mode::Production;
        let domains = domains(&res.gpus, |i| probe.and_then(|p| p.parent_uuid(i)));
        let ledger = match Ledger::open(dir, &cfg.app.metadata.name, seat(cfg), serving) {
            Ok(Some(l)) => l,
            Ok(None) => return Ok(None),
            Err(Unusable::Refused(why)) => return Err(why),
            Err(e) => {
                say_unavailable(dir, &e);
                return Ok(None);
            }
        };
        let held = match serving {
            false => None,
            true => {
                let path = ledger.lock_path();
                let l = ledger.lock(START_WAIT, |h| say_wait(&path, h));
                Some(l.map_err(|n| busy(&path, &n, START_WAIT))?)
            }
        };
        let others = ledger.others(&domains).map_err(|e| {
            format!(
                "the GPU-memory ledger in {} cannot be read: {e}; --ledger off plans alone",
                dir.display()
            )
        })?;
        // No room for one worker: idle neighbours are asked to give theirs.
        let (held, others) = borrow::at_start(cfg, &ledger, &domains, res, held, others)?;
        mark(res, &domains, &others, dir);
        if !serving {
            return Ok(None);
        }
        Ok(Some(Reservation {
            ledger,
            domains,
            held,
            written: None,
            last_ok: None,
            last_good: Mutex::new(Some((others, Instant::now()))),
            renewer: None,
            released: false,
        }))
    }

    /// Writes the reservation of `plan` (made from the estimate) and lets the lock go, so
    /// that profiling — minutes, for a large model — holds no other server's start; a thread
    /// renews it until [`Reservation::commit`]. `Err`: it cannot be written (exit 2).
    pub fn provisional(&mut self, plan: &Plan) -> Result<(), String> {
        let want = by_domain(&self.domains, reserved_by(plan, plan.workers));
        self.ledger.reserve(&want).map_err(|e| {
            format!(
                "cannot write this server's reservation in the GPU-memory ledger ({}): {e}; --ledger off plans alone",
                self.ledger.dir().display()
            )
        })?;
        self.held = None;
        self.said(Ok(()), want.clone(), Instant::now());
        self.renewer = Some(Renewer::start(self.ledger.clone(), want));
        Ok(())
    }

    /// Takes the lock again, reads what the others reserved meanwhile and writes the final
    /// plan's reservation: the plan, with fewer workers (said, `ledger_shrunk`) if the others
    /// took part of the room while this server profiled. `Err`: no worker fits any more, or
    /// the lock stayed busy (exit 2).
    pub fn commit(&mut self, mut plan: Plan, reserve_mb: u64) -> Result<Plan, String> {
        if let Some(r) = self.renewer.take() {
            r.stop();
        }
        let path = self.ledger.lock_path();
        let held = match self.held.take() {
            Some(h) => h,
            None => self
                .ledger
                .lock(START_WAIT, |h| say_wait(&path, h))
                .map_err(|n| busy(&path, &n, START_WAIT))?,
        };
        let others = self.ledger.others(&self.domains).map_err(|e| {
            format!(
                "the GPU-memory ledger in {} cannot be read: {e}",
                self.ledger.dir().display()
            )
        })?;
        let n = fitting(&plan, plan.workers, reserve_mb, |g| {
            let taken = others.get(&self.key(&g.uuid)).map_or(0, |o| o.mb);
            Some(share_mb(g.total_mb, g.fraction).saturating_sub(taken))
        });
        // Slots the plan could not place (an override beyond what fits) are not counted.
        let placed = plan
            .placement
            .iter()
            .filter(|p| p.slot < plan.workers)
            .count() as u32;
        if n < placed {
            if n == 0 {
                return Err(format!(
                    "no worker fits any more: other servers reserved the GPUs' room in the GPU-memory ledger ({}) while this one measured its model ({others:?})",
                    self.ledger.dir().display()
                ));
            }
            tracing::warn!(
                target: "app",
                event = "ledger_shrunk",
                workers = n,
                planned = plan.workers,
                "other servers reserved GPU memory in the ledger while this one measured its model: {n} of the {} workers planned fit now",
                plan.workers
            );
            plan.workers = n;
        }
        let want = by_domain(&self.domains, reserved_by(&plan, plan.workers));
        let written = self.ledger.reserve(&want);
        drop(held);
        self.said(written, want, Instant::now());
        Ok(plan)
    }

    /// A device's memory domain key.
    fn key(&self, uuid: &str) -> String {
        self.domains
            .get(uuid)
            .map_or_else(|| uuid.to_string(), |d| d.key.clone())
    }

    /// While serving: the reservation for the first `workers` slots of `plan` and the
    /// workers `live` now ([`reserved_with`]), written when it changed or its lease is due
    /// for renewal. It replaces this server's own file and takes no lock: nothing can hold
    /// it.
    /// `news`: what the server says of itself changed (`ledger::Status`), so it is written
    /// now too.
    pub fn follow(
        &mut self,
        plan: &Plan,
        workers: u32,
        live: &[LiveWorker],
        news: bool,
        now: Instant,
    ) {
        let want = by_domain(&self.domains, reserved_with(plan, workers, live));
        let due = match &self.written {
            None => true,
            Some((w, at)) => news || *w != want || now.duration_since(*at) >= RENEW_EVERY,
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
                    let total: u64 = want.values().fold(0, |a, b| a.saturating_add(*b));
                    tracing::info!(
                        target: "app",
                        event = "ledger_reserved",
                        reserved_mb = total,
                        dir = %self.ledger.dir().display(),
                        "reserved {total} MB of GPU memory in the ledger ({}): {want:?}",
                        self.ledger.dir().display()
                    );
                }
                self.last_ok = Some(now);
            }
            Err(e) => {
                let left = self.last_ok.map_or(0, |at| {
                    LEASE.saturating_sub(now.duration_since(at)).as_secs()
                });
                tracing::warn!(
                    target: "app",
                    event = "ledger_write_failed",
                    lease_left_s = left,
                    "cannot write this server's reservation in the GPU-memory ledger ({}): {e}; tried again in {} s; its lease lapses in {left} s, then other servers may plan on its workers' memory",
                    self.ledger.dir().display(),
                    RENEW_EVERY.as_secs()
                );
            }
        }
        self.written = Some((want, now));
    }

    /// The others' reservations now; when they cannot be read (said), the last read, for
    /// one lease.
    fn others(&self) -> Option<BTreeMap<String, Others>> {
        let mut last = self.last_good.lock().unwrap_or_else(|p| p.into_inner());
        match self.ledger.others(&self.domains) {
            Ok(o) => {
                *last = Some((o.clone(), Instant::now()));
                Some(o)
            }
            Err(e) => {
                let kept = last.as_ref().filter(|(_, at)| at.elapsed() < LEASE);
                tracing::warn!(
                    target: "app",
                    event = "ledger_unreadable",
                    "the GPU-memory ledger ({}) cannot be read: {e}; {}",
                    self.ledger.dir().display(),
                    if kept.is_some() { "the last reading stands in for it (for one lease)" } else { "no reading younger than a lease is left" }
                );
                kept.map(|(o, _)| o.clone())
            }
        }
    }

    /// What the ledger leaves now for one more worker of this server on each GPU of `plan`
    /// (by index): `total × fraction` less the others' live reservations and this server's
    /// own for its first `workers` slots and its `live` workers, on the GPU's memory domain.
    /// `None` when the ledger cannot be read and no reading younger than a lease is left
    /// (then NVML's free memory alone decides, as without a ledger). Takes no lock.
    pub fn room(
        &self,
        plan: &Plan,
        workers: u32,
        live: &[LiveWorker],
    ) -> Option<BTreeMap<u32, u64>> {
        let others = self.others()?;
        let own = by_domain(&self.domains, reserved_with(plan, workers, live));
        let room = plan.gpus.iter().map(|g| {
            let shared = share_mb(g.total_mb, g.fraction);
            let key = self.key(&g.uuid);
            let taken = others
                .get(&key)
                .map_or(0, |o| o.mb)
                .saturating_add(own.get(&key).copied().unwrap_or(0));
            (g.index, shared.saturating_sub(taken))
        });
        Some(room.collect())
    }

    /// Re-admission after `--idle-release`, under one hold of the ledger's lock: how many
    /// of the first `want` slots of `plan` fit in what the other servers' live reservations
    /// leave on their GPUs (each GPU also no more than `free(index)` MB, NVML's free memory,
    /// when known), less `reserve_mb` per GPU; that many are reserved before the lock goes.
    /// Slots are taken in order and the count stops at the first that does not fit (slots
    /// `0..n` are what a target of `n` starts). On the supervisor's loop: the lock is tried
    /// for [`LOOP_WAIT`] at most; busy (said, `ledger_busy`, naming the holder), or a ledger
    /// that cannot be read, admits none this time.
    pub fn admit(
        &mut self,
        plan: &Plan,
        want: u32,
        reserve_mb: u64,
        free: impl Fn(u32) -> Option<u64>,
    ) -> u32 {
        let held = match self.ledger.lock(LOOP_WAIT, |_| {}) {
            Ok(h) => h,
            Err(n) => {
                tracing::warn!(
                    target: "app",
                    event = "ledger_busy",
                    holder = match n { NotTaken::Busy(Some(p)) => p, _ => 0 },
                    "the GPU-memory ledger's lock ({}) could not be taken within {} ms ({n}): no worker re-admitted this time",
                    self.ledger.lock_path().display(),
                    LOOP_WAIT.as_millis()
                );
                return 0;
            }
        };
        let Some(others) = self.others() else {
            return 0;
        };
        let n = fitting(plan, want, reserve_mb, |g| {
            let shared = share_mb(g.total_mb, g.fraction);
            let room = shared.saturating_sub(others.get(&self.key(&g.uuid)).map_or(0, |o| o.mb));
            Some(free(g.index).map_or(room, |f| f.min(room)))
        });
        if n > 0 {
            let want = by_domain(&self.domains, reserved_by(plan, n));
            let written = self.ledger.reserve(&want);
            drop(held);
            self.said(written, want, Instant::now());
        }
        n
    }

    /// The master exits: its reservation goes.
    pub fn release(&mut self) {
        self.held = None;
        if let Some(r) = self.renewer.take() {
            r.stop();
        }
        self.released = true;
        if let Err(e) = self.ledger.release() {
            tracing::warn!(
                target: "app",
                "cannot remove this server's reservation from the GPU-memory ledger ({e}); it expires within {} s",
                LEASE.as_secs()
            );
        }
    }
}

impl Drop for Reservation {
    /// A server that stops before it serves (a refusal after the provisional reservation)
    /// takes its reservation with it too.
    fn drop(&mut self) {
        if !self.released {
            self.release();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::master::host::ledger::Domain;
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

    /// What the ledger reserves for a worker covers what the worker may
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

    /// The reservation never falls below what the live workers were
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

    /// This server's reservation in `dir` for the GPUs of `p` (each its own domain).
    fn reservation(dir: &Path, app: &str, p: &Plan) -> Reservation {
        let domains = p.gpus.iter().map(|g| {
            let d = Domain {
                key: g.uuid.clone(),
                total_mb: g.total_mb,
            };
            (g.uuid.clone(), d)
        });
        Reservation {
            ledger: Ledger::open(dir, app, None, true).unwrap().unwrap(),
            domains: domains.collect(),
            held: None,
            written: None,
            last_ok: None,
            last_good: Mutex::new(None),
            renewer: None,
            released: false,
        }
    }

    #[test]
    fn admission_counts_the_others_reservations_and_reserves_under_the_lock() {
        let p = two_a100s();
        let dir = tempfile::tempdir().unwrap();
        let other = reservation(dir.path(), "other", &p);
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
        other.ledger.reserve(&held).unwrap();
        let mut mine = reservation(dir.path(), "mine", &p);
        assert_eq!(mine.admit(&p, p.workers, 500, |_| None), 1);
        let seen = other.others().unwrap();
        let uuid = &p.gpus[first].uuid;
        assert_eq!(seen[uuid].mb, 4000, "{seen:?}");
        // NVML's free memory bounds it too: nothing fits where NVML shows 4000 MB free.
        let _ = mine.ledger.release();
        assert_eq!(mine.admit(&p, p.workers, 500, |_| Some(4000)), 0);
        assert!(!other.others().unwrap().contains_key(uuid));
        // The lock held elsewhere: none admitted, within a fraction of a second.
        let _held = other.ledger.lock(START_WAIT, |_| {}).unwrap();
        let _ = other.ledger.release();
        let t = Instant::now();
        assert_eq!(mine.admit(&p, p.workers, 500, |_| None), 0);
        assert!(
            t.elapsed() < std::time::Duration::from_millis(500),
            "{:?}",
            t.elapsed()
        );
    }

    /// The measured plan's reservation is written under the lock taken again, with fewer
    /// workers when another server reserved room while this one profiled (without the
    /// lock); none fitting is a refusal.
    #[test]
    fn commit_fits_the_final_plan_in_what_the_others_left_meanwhile() {
        let p = two_a100s();
        let dir = tempfile::tempdir().unwrap();
        let mut mine = reservation(dir.path(), "mine", &p);
        mine.provisional(&p).unwrap();
        assert!(mine.renewer.is_some(), "renewed while profiling");
        let other = reservation(dir.path(), "other", &p);
        // The other took all but three workers' room on each GPU (and the reserve).
        let per = per_worker_mb(p.planned_typ_mb);
        let held = p.gpus.iter().map(|g| {
            let share = share_mb(g.total_mb, g.fraction);
            (g.uuid.clone(), share - 500 - 3 * per)
        });
        other.ledger.reserve(&held.collect()).unwrap();
        let fin = mine.commit(p.clone(), 500).unwrap();
        assert_eq!(fin.workers, 6.min(p.workers), "{} planned", p.workers);
        assert_eq!(
            other.others().unwrap().values().map(|o| o.mb).sum::<u64>(),
            u64::from(fin.workers) * per
        );
        // Nothing left: refused.
        let full = p
            .gpus
            .iter()
            .map(|g| (g.uuid.clone(), share_mb(g.total_mb, g.fraction)));
        other.ledger.reserve(&full.collect()).unwrap();
        let e = mine.commit(p.clone(), 500).unwrap_err();
        assert!(e.contains("other servers reserved"), "{e}");
    }

    /// Compute instances of one MIG GPU instance are one memory domain: what servers
    /// reserve on either adds up, and this server's room on each counts both.
    #[test]
    fn compute_instances_of_one_gpu_instance_share_one_domain() {
        use crate::protocol::MigInstance;
        let ci = |index: u32, slot: u32, uuid: &str| GpuInfo {
            index,
            uuid: uuid.into(),
            total_bytes: 19_968 * MB,
            mig: Some(MigInstance { parent: 0, slot }),
            gpu_instance: Some(1),
            ..GpuInfo::default()
        };
        let whole = GpuInfo {
            index: 1,
            uuid: "GPU-b".into(),
            total_bytes: 40_960 * MB,
            ..GpuInfo::default()
        };
        let gpus = [ci(2, 0, "MIG-a"), ci(3, 1, "MIG-b"), whole];
        let d = domains(&gpus, |parent| (parent == 0).then(|| "GPU-a".to_string()));
        assert_eq!(d["MIG-a"].key, "GPU-a/gi1");
        assert_eq!(d["MIG-b"].key, "GPU-a/gi1");
        assert_eq!(d["GPU-b"].key, "GPU-b");
        let mb = |pairs: &[(&str, u64)]| pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        assert_eq!(
            by_domain(&d, mb(&[("MIG-a", 3000), ("MIG-b", 2000), ("GPU-b", 1)])),
            mb(&[("GPU-a/gi1", 5000), ("GPU-b", 1)])
        );
    }
}
