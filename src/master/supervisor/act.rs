//! Carrying out [`decide`]'s actions (start, wait, retire, quit, kill, exit), with the
//! inputs it needs from the world (GPU capacity, admission) and the placement of slots
//! beyond the plan ([`rules::place_unplaced`]).

use std::time::Instant;

use nix::sys::signal::Signal;

use super::{Live, Supervisor, WAIT_LOG_EVERY};
use crate::board::Board;
use crate::master::decide::{decide, Action, Limits, View};
use crate::master::plan::Placement;
use crate::master::rules;
use crate::master::slot::{Phase, RetireAsk, WorkerState};
use crate::master::spawn::worker_config;

impl Supervisor {
    /// Gives the first unplaced slot below the target (an override beyond what the plan
    /// fitted) a GPU once one has the memory for a typical worker
    /// ([`rules::place_unplaced`]).
    pub(super) fn place_unplaced(&mut self) {
        let Some(probe) = self.gpus.as_ref() else {
            return;
        };
        let Some(i) = self
            .slots
            .iter()
            .position(|s| s.unplaced && s.id < self.target)
        else {
            return;
        };
        let best = rules::place_unplaced(
            &self.plan.gpus,
            self.admission(),
            self.plan.planned_typ_mb,
            |g| probe.free_bytes(g).ok().map(|b| b >> 20),
            |g| {
                self.workers
                    .iter()
                    .any(|w| w.state.gpu == Some(g) && w.state.phase == Phase::Booting)
            },
            |g| self.slots.iter().any(|s| s.gpu == Some(g)),
        );
        let Some((g, free)) = best else {
            return;
        };
        let gpu = g.assignment();
        let id = self.slots[i].id;
        tracing::warn!(
            event = "worker_placed",
            slot = id,
            gpu = g.index,
            free_mb = free,
            "worker {id} placed on GPU {} beyond the plan: it has {free} MB free now",
            g.index
        );
        // One per round: the next waits until this one's memory shows in NVML.
        self.slots[i].gpu = Some(gpu.index);
        self.slots[i].unplaced = false;
        self.plan.placement.push(Placement {
            slot: id,
            gpu: Some(gpu),
        });
    }

    /// What the driver says of CUDA, for the `no_cuda` message.
    pub(super) fn no_cuda_reason(&self) -> String {
        use crate::protocol::{cuda_version_text, CUDA_BUILD_MIN_DRIVER, CUDA_BUILD_VERSION};
        let driver = self
            .gpus
            .as_ref()
            .and_then(|g| g.cuda_driver_version())
            .map_or_else(|| "unknown".to_string(), cuda_version_text);
        format!(
            "the driver supports CUDA {driver}, the worker's libtorch needs CUDA {} (driver \
             {CUDA_BUILD_MIN_DRIVER} or newer), and in a container the GPU's device files must \
             be mounted; vramfork does not fall back to the CPU silently: fix the GPU setup or \
             use --device cpu",
            cuda_version_text(CUDA_BUILD_VERSION)
        )
    }

    /// Applies `decide`'s actions; returns the exit status when the master should exit.
    pub(super) fn act(&mut self) -> Option<i32> {
        if let Some(why) = self.no_cuda.take() {
            tracing::error!(event = "no_cuda", "giving up: {why}");
            crate::logging::say(&format!("app: {why}"));
            self.kill_all();
            return Some(crate::master::exit::NO_CUDA);
        }
        self.place_unplaced();
        let now = Instant::now();
        let states: Vec<WorkerState> = self.workers.iter().map(|w| w.state.clone()).collect();
        let (plan, slots) = (&self.plan, &self.slots);
        let capacity = |gpu: u32| {
            let on_it = slots.iter().filter(|s| s.gpu == Some(gpu)).count() as u32;
            rules::gpu_capacity(&plan.gpus, gpu, on_it)
        };
        let admission = self.admission();
        let probe = self.gpus.as_ref();
        let admits = |gpu: u32| admission.admits(probe.and_then(|p| p.free_bytes(gpu).ok()));
        let actions = decide(&View {
            now,
            workers: &states,
            slots: &self.slots,
            target: self.target,
            cfg_gen: self.cfg_gen,
            stopping: self.stopping,
            ever_ready: self.ever_ready,
            first_boot_failures: self.first_boot_failures,
            last_boot_code: self.last_boot_code,
            last_ready_at: self.last_ready_at,
            gpu_capacity: &capacity,
            gpu_admits: &admits,
            limits: Limits {
                timeout: self.cfg.timeout,
                boot_timeout: self.cfg.boot_timeout,
                graceful_timeout: self.cfg.graceful_timeout,
            },
        });
        for action in actions {
            match action {
                Action::Spawn { slot } if self.template_loading(slot) => {}
                Action::Spawn { slot } => self.spawn(slot, now),
                Action::Wait { slot, why } => {
                    // Each reason once per WAIT_LOG_EVERY; a new reason at once.
                    let last = self.wait_logged.get(&slot);
                    let fresh = last
                        .is_none_or(|(t, w)| *w != why || now.duration_since(*t) > WAIT_LOG_EVERY);
                    if fresh {
                        tracing::warn!(
                            event = "worker_waits",
                            slot,
                            why = why.code(),
                            gpu = why.gpu(),
                            "worker {slot} waits: {why}"
                        );
                        self.wait_logged.insert(slot, (now, why));
                    }
                }
                Action::Retire { pid, why } => {
                    self.ask(pid, why, Signal::SIGTERM, now);
                }
                Action::Quit { pid } => {
                    self.ask(pid, RetireAsk::QuickStop, Signal::SIGQUIT, now);
                }
                Action::Kill { pid, why } => {
                    let st = self.workers.iter().find(|w| w.state.pid == pid);
                    let slot = st.map(|w| w.state.slot);
                    let generation = st.map(|w| w.state.generation);
                    tracing::warn!(
                        event = "worker_killed",
                        slot,
                        pid,
                        generation,
                        why = why.code(),
                        "killing worker {} (pid {pid}): it {why}",
                        slot.map_or_else(|| "?".into(), |s| s.to_string())
                    );
                    self.signal(pid, Signal::SIGKILL);
                    self.with(pid, |w| w.killed = Some(why));
                }
                Action::Exit { code, why } => {
                    if code != 0 {
                        tracing::error!("giving up: {why}");
                        crate::logging::say(&format!("app: {why}"));
                    }
                    self.kill_all();
                    return Some(code);
                }
            }
        }
        None
    }

    /// Asks a worker to go (`worker_retire_asked`): TERM to retire gracefully, QUIT to exit
    /// at once; once asked, it no longer occupies its slot.
    fn ask(&mut self, pid: u32, why: RetireAsk, sig: Signal, now: Instant) {
        if let Some(w) = self.workers.iter().find(|w| w.state.pid == pid) {
            let st = &w.state;
            tracing::info!(
                event = "worker_retire_asked",
                slot = st.slot,
                pid,
                generation = st.generation,
                why = why.code(),
                signal = sig.as_str(),
                "asking worker {} (pid {pid}, generation {}) to {}: {why}",
                st.slot,
                st.generation,
                if sig == Signal::SIGQUIT {
                    "exit now"
                } else {
                    "retire"
                }
            );
        }
        self.signal(pid, sig);
        self.with(pid, |w| w.asked_to_stop = Some(now));
    }

    /// Admission for the workers started now ([`rules::Admission::of`] the current
    /// configuration: after a reload, the new metadata).
    pub(super) fn admission(&self) -> rules::Admission {
        rules::Admission::of(&self.cfg)
    }

    pub(super) fn spawn(&mut self, slot: u32, now: Instant) {
        let Some(s) = self.slots.iter_mut().find(|s| s.id == slot) else {
            return;
        };
        let generation = s.next_generation;
        s.next_generation += 1;
        let gpu = s.gpu;
        let jitter = if self.cfg.max_requests_jitter > 0 {
            self.rng ^= self.rng << 13;
            self.rng ^= self.rng >> 7;
            self.rng ^= self.rng << 17;
            self.rng % (self.cfg.max_requests_jitter + 1)
        } else {
            0
        };
        let max_requests = if self.cfg.max_requests == 0 {
            0
        } else {
            self.cfg.max_requests + jitter
        };
        if self.listener.is_none() {
            return;
        }
        let mut config = worker_config(&self.cfg, &self.plan, slot, generation, max_requests);
        let seat = self
            .board
            .as_ref()
            .and_then(|_| Board::free_seat(self.workers.iter().filter_map(|w| w.seat)));
        config.board_seat = seat;
        match self.launch(config) {
            Ok((l, method)) => {
                tracing::debug!(
                    event = "worker_started",
                    slot,
                    pid = l.pid,
                    generation,
                    method,
                    "worker {slot} (pid {}, generation {generation}) started by {method}",
                    l.pid
                );
                let state = WorkerState::new(l.pid, slot, generation, self.cfg_gen, gpu, now);
                if let Some(m) = &self.metrics {
                    m.started(&state, method);
                }
                self.workers.push(Live {
                    state,
                    control: l.control,
                    buf: Vec::new(),
                    seat,
                });
            }
            Err(e) => {
                let st = WorkerState::new(0, slot, generation, self.cfg_gen, gpu, now);
                // exec refused it: not executable by this user (126), or missing.
                self.last_boot_code = (e.kind() == std::io::ErrorKind::PermissionDenied)
                    .then_some(crate::master::decide::EXIT_NOT_EXECUTABLE);
                self.boot_failed(&st, now);
                tracing::error!(
                    "cannot start worker {slot} from {}: {e}",
                    self.cfg.worker_binary.display()
                );
            }
        }
    }
}
