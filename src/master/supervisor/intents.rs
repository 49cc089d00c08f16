//! What the supervisor does with each intent the signals recorded ([`Intent`]: stop,
//! reload, one worker more or fewer, nothing). `on_intent` takes the intent as a value and
//! only changes the supervisor's state (the target, the slots, the configuration, the stop
//! under way); the loop's next `act` carries it out, so the tests below drive it without
//! signals or processes.

use std::time::Instant;

use super::Supervisor;
use crate::master::decide::Stopping;
use crate::master::plan::{workers_fitting, Placement, Target};
use crate::master::rules::{self, Ttin};
use crate::master::signals::Intent;
use crate::master::slot::Slot;

impl Supervisor {
    pub(super) fn on_intent(&mut self, intent: Intent) {
        let now = Instant::now();
        match intent {
            Intent::GracefulStop => {
                if self.stopping.is_none() {
                    tracing::info!(
                        event = "stopping",
                        how = "graceful",
                        "TERM: stopping gracefully (in-flight requests get {:?})",
                        self.cfg.limits.graceful_timeout
                    );
                    self.stopping = Some(Stopping::Graceful(now));
                    self.notify.stopping(&self.reported);
                    self.listener = None;
                    self.templates.retire();
                }
            }
            Intent::QuickStop => {
                if !matches!(self.stopping, Some(Stopping::Quick(_))) {
                    tracing::info!(event = "stopping", how = "quick", "INT/QUIT: stopping now");
                    self.stopping = Some(Stopping::Quick(now));
                    self.notify.stopping(&self.reported);
                    self.listener = None;
                    self.templates.retire();
                    for w in &mut self.workers {
                        w.state.asked_to_stop = None;
                    }
                }
            }
            Intent::MoreWorkers | Intent::FewerWorkers if self.idle_owns_target() => {
                self.idle_ignores_ttin_ttou()
            }
            Intent::Reload if self.stopping.is_none() => self.reload(),
            Intent::MoreWorkers if self.stopping.is_none() => self.more_workers(),
            Intent::FewerWorkers if self.stopping.is_none() => {
                if self.target > 1 {
                    self.target -= 1;
                    tracing::info!(
                        event = "ttou",
                        workers = self.target,
                        "TTOU: {} workers",
                        self.target
                    );
                } else {
                    tracing::warn!(
                        event = "ttou_refused",
                        workers = self.target,
                        "TTOU refused: one worker is the least"
                    );
                }
            }
            Intent::Ignored => tracing::warn!(
                event = "signal_ignored",
                "USR1/USR2 ignored: logs go to stderr, so there is nothing to reopen, and there is no binary upgrade (TERM and a new start replace the binary)"
            ),
            Intent::Reap | Intent::Reload | Intent::MoreWorkers | Intent::FewerWorkers => {}
        }
    }

    pub(super) fn reload(&mut self) {
        match self.cfg.reloaded() {
            Ok(new) => {
                // A reload does not plan again: the pool, its caps and the figure per worker
                // stay the plan's (`Plan::planned_typ_mb`); admission reads the new
                // metadata's `est_gpu_mem_min` (`rules::Admission`).
                if new.app.model_path != self.cfg.app.model_path {
                    if let Some(l) = &mut self.learner {
                        l.model_changed();
                    }
                }
                tracing::info!(
                    event = "reload_started",
                    "HUP: reloading {} (model {}), replacing workers one at a time",
                    new.app.metadata.path.display(),
                    new.model_display()
                );
                let old = std::mem::replace(&mut self.cfg, new);
                if self.reload.started(old) {
                    // A HUP during a reload supersedes it: the workers it started that are
                    // still booting are stopped (decide), and its configuration becomes the
                    // one to go back to only if a worker has been ready with it
                    // (`Reload::started`).
                    tracing::info!(
                        event = "reload_superseded",
                        "HUP during a reload: the new configuration supersedes the one being rolled out"
                    );
                }
                self.notify.reloading(&self.reported);
            }
            Err(e) => tracing::error!(
                event = "reload_refused",
                error = %e,
                "HUP: reload refused, the old workers keep serving: {e}"
            ),
        }
    }

    /// The plan's GPUs are full, but a GPU the other servers' reservations had made smaller
    /// may have room now (a neighbour stopped or shrank): the one with the most room left
    /// in the ledger, if one more worker fits there, takes one more (said); if none does,
    /// the idle neighbours holding that GPU's room are asked for it (`lend.rs`).
    fn grow_into_the_ledger(&mut self) {
        let Some(room) = self
            .reservation
            .as_ref()
            .and_then(|r| r.room(&self.plan, self.target, &self.live_reserved()))
        else {
            return;
        };
        let per = crate::master::plan::per_worker_mb(self.plan.planned_typ_mb);
        let reserve = self.cfg.gpu.gpu_reserve_mb;
        let best = self
            .plan
            .gpus
            .iter_mut()
            .filter(|g| g.excluded.is_none() && g.ledger_mb > 0)
            .filter_map(|g| room.get(&g.index).map(|r| (g, *r)))
            .max_by_key(|(_, r)| *r);
        let Some((g, left)) = best else {
            return;
        };
        if workers_fitting(left.saturating_sub(reserve), per) == 0 {
            // No room: idle neighbours there are asked for it (`lend.rs`).
            let gpu = g.index;
            self.ask_to_grow(gpu, left, per.saturating_add(reserve));
            return;
        }
        g.fits += 1;
        tracing::info!(
            event = "ledger_grown",
            gpu = g.index,
            room_mb = left,
            "{} has room for one more worker now: {left} MB left by the other servers' reservations in the ledger",
            g.label
        );
    }

    /// Whether the GPU-memory ledger has no room for one more worker on `gpu` now (said,
    /// `ttin_refused`): the plan counted what the other servers had reserved when it was
    /// made, and a neighbour that started or grew since may have taken what it left.
    fn ledger_refuses(&self, gpu: Option<u32>) -> bool {
        let Some(gpu) = gpu else { return false };
        let live = self.live_reserved();
        let room = self
            .reservation
            .as_ref()
            .and_then(|r| r.room(&self.plan, self.target, &live));
        let Some(left) = room.and_then(|r| r.get(&gpu).copied()) else {
            return false;
        };
        let per = crate::master::plan::per_worker_mb(self.plan.planned_typ_mb);
        let reserve = self.cfg.gpu.gpu_reserve_mb;
        if workers_fitting(left.saturating_sub(reserve), per) >= 1 {
            return false;
        }
        tracing::warn!(
            event = "ttin_refused",
            workers = self.target,
            gpu,
            room_mb = left,
            "TTIN refused: the GPU-memory ledger leaves {left} MB on {} for this server (its share less the other servers' reservations and its own), less than one worker of {per} MB and the reserve of {reserve} MB",
            self.plan.gpu_label(gpu)
        );
        self.ask_to_grow(gpu, left, per.saturating_add(reserve));
        true
    }

    pub(super) fn more_workers(&mut self) {
        if let Some(cap) = self.host.capacity().filter(|c| self.target >= *c) {
            tracing::warn!(
                event = "ttin_refused",
                workers = self.target,
                "TTIN refused: host memory holds {cap} workers at what one costs at its peak (app plan's host-memory row)"
            );
            return;
        }
        let footprint_cap = self
            .learner
            .as_ref()
            .filter(|l| l.exceeded())
            .map(|l| l.capacity(&self.plan).unwrap_or(0));
        let slots = &self.slots;
        let on_gpu = |i: u32| slots.iter().filter(|s| s.gpu == Some(i)).count() as u32;
        let full = matches!(self.plan.next_target(on_gpu), Target::NoRoom);
        if full && (self.target as usize) >= slots.len() {
            self.grow_into_the_ledger();
        }
        let slots = &self.slots;
        let on_gpu = |i: u32| slots.iter().filter(|s| s.gpu == Some(i)).count() as u32;
        let plan = &self.plan;
        let slot = self.target;
        match rules::ttin(self.target, slots.len(), footprint_cap, || {
            plan.next_target(on_gpu)
        }) {
            Ttin::FootprintFull { cap } => {
                tracing::warn!(
                    event = "ttin_refused",
                    workers = self.target,
                    "TTIN refused: workers were seen using {} MB of GPU memory, more than the plan assumed; at that footprint the GPUs hold {cap}",
                    self.learner.as_ref().and_then(|l| l.high_water_mb()).unwrap_or(0)
                );
                return;
            }
            Ttin::NoRoom => {
                tracing::warn!(
                    event = "ttin_refused",
                    workers = self.target,
                    "TTIN refused: {} workers already fill the GPUs' usable memory",
                    self.target
                );
                return;
            }
            Ttin::Reuse => {
                let gpu = slots.iter().find(|s| s.id == slot).and_then(|s| s.gpu);
                if self.ledger_refuses(gpu) {
                    return;
                }
            }
            Ttin::NewSlot(gpu) => {
                if self.ledger_refuses(gpu.as_ref().map(|g| g.index)) {
                    return;
                }
                self.slots
                    .push(Slot::new(slot, gpu.as_ref().map(|g| g.index)));
                self.plan.placement.push(Placement { slot, gpu });
            }
        }
        self.target += 1;
        tracing::info!(
            event = "ttin",
            workers = self.target,
            "TTIN: {} workers",
            self.target
        );
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use clap::Parser;

    use super::*;
    use crate::master::cli::Cli;
    use crate::master::config::Config;
    use crate::master::footprint::Learner;
    use crate::master::resources::{ComputeMode, GpuInfo, Resources, MB};
    use crate::master::signals::Signals;

    /// A supervisor with no process behind it: its configuration read from a metadata file
    /// in a temporary folder, planned for `cpus` CPUs and GPUs of `gpu_mb` MB each (free).
    struct Bench {
        dir: tempfile::TempDir,
        sup: Supervisor,
    }

    fn meta(min: u64, typ: u64) -> String {
        format!(
            r#"{{"name": "t", "model": "m.pt", "est_gpu_mem_min": {min}, "est_gpu_mem_typ": {typ}}}"#
        )
    }

    fn bench(args: &[&str], cpus: usize, gpus_mb: &[u64]) -> Bench {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("meta.json"), meta(1000, 2000)).unwrap();
        std::fs::write(dir.path().join("app-worker"), "").unwrap();
        let mut argv: Vec<String> = vec!["app".into(), "--metadata".into()];
        argv.push(dir.path().join("meta.json").display().to_string());
        argv.extend(args.iter().map(|a| a.to_string()));
        let cli = Cli::try_parse_from(&argv).unwrap();
        let cfg = Config::from_cli(cli, &|_| None, &argv, Some(dir.path())).unwrap();
        let gpus = gpus_mb
            .iter()
            .enumerate()
            .map(|(i, &mb)| GpuInfo {
                index: i as u32,
                uuid: format!("GPU-{i}"),
                name: "test".into(),
                total_bytes: mb * MB,
                free_bytes: mb * MB,
                used_bytes: 0,
                reserved_bytes: 0,
                compute_mode: ComputeMode::Default,
                mig: None,
                gpu_instance: None,
                ledger_mb: 0,
                compute_capability: None,
            })
            .collect();
        let res = Resources {
            cpus,
            gpus,
            gpu_note: None,
            driver_version: None,
            cuda_driver_version: None,
        };
        let demand = crate::master::plan::Demand::declared(&cfg.app.metadata);
        let plan = crate::master::plan::plan(&res, &demand, &cfg.policy()).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let signals = Signals::detached().unwrap();
        let sup = Supervisor::new(cfg, plan, listener, signals, None, None);
        Bench { dir, sup }
    }

    #[test]
    fn ttin_raises_the_target_with_a_new_slot_and_ttou_lowers_it() {
        let mut b = bench(&["--workers", "2"], 4, &[]);
        let s = &mut b.sup;
        assert_eq!((s.target, s.slots.len()), (2, 2));
        s.on_intent(Intent::MoreWorkers);
        assert_eq!((s.target, s.slots.len()), (3, 3));
        let placed = s.plan.placement.iter().find(|p| p.slot == 2).unwrap();
        assert_eq!(placed.gpu, None);
        s.on_intent(Intent::FewerWorkers);
        s.on_intent(Intent::FewerWorkers);
        assert_eq!((s.target, s.slots.len()), (1, 3));
        // The slots a TTOU left empty are used again: no new slot.
        s.on_intent(Intent::MoreWorkers);
        assert_eq!((s.target, s.slots.len()), (2, 3));
    }

    #[test]
    fn ttou_at_one_worker_is_refused() {
        let mut b = bench(&["--workers", "1"], 4, &[]);
        let s = &mut b.sup;
        s.on_intent(Intent::FewerWorkers);
        assert_eq!(s.target, 1);
        s.on_intent(Intent::MoreWorkers);
        s.on_intent(Intent::FewerWorkers);
        s.on_intent(Intent::FewerWorkers);
        assert_eq!(s.target, 1);
    }

    #[test]
    fn ttin_past_the_gpus_usable_memory_is_refused() {
        // Many CPUs: the GPU bounds the pool, so the plan fills the GPU.
        let mut b = bench(&[], 64, &[16_000]);
        let s = &mut b.sup;
        let fits = s.plan.gpus[0].fits;
        assert!(fits >= 2, "{:?}", s.plan.gpus[0]);
        assert_eq!(s.target, fits);
        s.on_intent(Intent::MoreWorkers);
        assert_eq!((s.target, s.slots.len()), (fits, fits as usize));
    }

    #[test]
    fn ttin_past_the_observed_footprint_is_refused_and_the_target_unchanged() {
        let mut b = bench(&["--workers", "2"], 64, &[16_000]);
        let s = &mut b.sup;
        let usable = s.plan.gpus[0].usable_mb;
        // Below the plan's assumption: TTIN works.
        let mut learner = Learner::new(&s.plan, None);
        learner.assumed_mb = 2000;
        learner.observed(1500);
        s.learner = Some(learner);
        s.on_intent(Intent::MoreWorkers);
        assert_eq!(s.target, 3);
        // Workers use so much that the GPU holds 3 of them: no fourth.
        s.learner.as_mut().unwrap().observed(usable / 3);
        assert!(s.learner.as_ref().unwrap().exceeded());
        s.on_intent(Intent::MoreWorkers);
        assert_eq!((s.target, s.slots.len()), (3, 3));
        // Fewer is still fine, and then one more fits again.
        s.on_intent(Intent::FewerWorkers);
        s.on_intent(Intent::MoreWorkers);
        assert_eq!(s.target, 3);
    }

    #[test]
    fn a_stop_ends_pool_changes_and_quick_overrides_graceful() {
        let mut b = bench(&["--workers", "2"], 4, &[]);
        let s = &mut b.sup;
        s.on_intent(Intent::GracefulStop);
        let Some(Stopping::Graceful(t)) = s.stopping else {
            panic!("{:?}", s.stopping);
        };
        assert!(s.listener.is_none());
        // A second TERM keeps the first one's clock; TTIN, TTOU and HUP do nothing now.
        s.on_intent(Intent::GracefulStop);
        assert_eq!(s.stopping, Some(Stopping::Graceful(t)));
        s.on_intent(Intent::MoreWorkers);
        s.on_intent(Intent::FewerWorkers);
        s.on_intent(Intent::Reload);
        assert_eq!((s.target, s.reload.gen, s.reload.under_way), (2, 0, false));
        s.on_intent(Intent::QuickStop);
        assert!(matches!(s.stopping, Some(Stopping::Quick(_))));
        s.on_intent(Intent::GracefulStop);
        assert!(matches!(s.stopping, Some(Stopping::Quick(_))));
    }

    #[test]
    fn ignored_and_reap_intents_change_nothing() {
        let mut b = bench(&["--workers", "2"], 4, &[]);
        let s = &mut b.sup;
        s.on_intent(Intent::Ignored);
        s.on_intent(Intent::Reap);
        assert_eq!((s.target, s.reload.gen, s.stopping), (2, 0, None));
    }

    /// Admission after a HUP reads the new metadata (`rules::Admission`); a refused reload
    /// keeps the old one.
    #[test]
    fn after_a_reload_admission_reads_the_new_metadata() {
        let mut b = bench(&["--workers", "2"], 4, &[16_000]);
        let path = b.dir.path().join("meta.json");
        let s = &mut b.sup;
        let old = s.admission();
        assert_eq!(old.est_gpu_mem_min, 1000);
        assert!(old.admits(Some(1500 * MB)));

        std::fs::write(&path, "{ not json").unwrap();
        s.on_intent(Intent::Reload);
        assert_eq!((s.reload.gen, s.reload.under_way), (0, false));
        assert_eq!(s.admission(), old);

        std::fs::write(&path, meta(3000, 4000)).unwrap();
        s.on_intent(Intent::Reload);
        assert_eq!((s.reload.gen, s.reload.under_way), (1, true));
        let new = s.admission();
        assert_eq!(new.est_gpu_mem_min, 3000);
        assert_eq!(new.reserve_mb, old.reserve_mb);
        // 1500 MB free admitted a worker of the old configuration, not one of the new.
        assert!(!new.admits(Some(1500 * MB)));
        assert!(new.admits(Some((3000 + new.reserve_mb) * MB)));
        // The plan's own figure stays what it was planned with.
        assert_eq!(s.plan.admission_mb(), 1000 + old.reserve_mb);
        // The old configuration is the one to go back to.
        let (fallback, gen) = s.reload.fallback().unwrap();
        assert_eq!((fallback.app.metadata.est_gpu_mem_min, *gen), (1000, 0));
    }
}
