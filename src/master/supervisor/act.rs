//! Carrying out [`decide`]'s actions (start, wait, retire, quit, kill, exit), with the
//! inputs it needs from the world (GPU capacity, admission) and the placement of slots
//! beyond the plan ([`rules::place_unplaced`]).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::{Live, Supervisor};
use crate::board::Board;
use crate::master::decide::{decide, Action, Limits, View, WaitReason};
use crate::master::plan::Placement;
use crate::master::rules;
use crate::master::slot::{Phase, RetireAsk, WorkerState};
use crate::master::spawn::worker_config;

/// How often the same "slot waits" message may be logged.
const WAIT_LOG_EVERY: Duration = Duration::from_secs(10);

/// When each slot's wait was last logged, and why: a reason once per [`WAIT_LOG_EVERY`],
/// a new reason at once.
#[derive(Debug, Default)]
pub(super) struct WaitLog(HashMap<u32, (Instant, WaitReason)>);

impl WaitLog {
    /// Whether slot `slot` waiting for `why` at `now` is worth a line (then it is noted).
    pub fn fresh(&mut self, slot: u32, why: WaitReason, now: Instant) -> bool {
        let fresh = self
            .0
            .get(&slot)
            .is_none_or(|(t, w)| *w != why || now.duration_since(*t) > WAIT_LOG_EVERY);
        if fresh {
            self.0.insert(slot, (now, why));
        }
        fresh
    }
}

/// `--max-requests-jitter`'s random draws (xorshift, seeded from the pid and the clock).
#[derive(Debug)]
pub(super) struct Jitter(u64);

impl Jitter {
    pub fn seeded() -> Jitter {
        let seed = std::process::id() as u64
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1);
        Jitter(seed | 1)
    }

    /// 0..=`max` at random (0 when `max` is 0, drawing nothing).
    pub fn next(&mut self, max: u64) -> u64 {
        if max == 0 {
            return 0;
        }
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % (max + 1)
    }
}

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
        // Free memory as NVML shows it, and no more than the other servers' reservations in
        // the ledger leave (a neighbour still loading has not taken its memory yet).
        let room = self
            .reservation
            .as_ref()
            .and_then(|r| r.room(&self.plan, self.target, &self.live_reserved()));
        let best = rules::place_unplaced(
            &self.plan.gpus,
            self.admission(),
            self.plan.planned_typ_mb,
            |g| {
                let free = probe.free_bytes(g).ok().map(|b| b >> 20)?;
                let left = room.as_ref().and_then(|r| r.get(&g).copied());
                Some(left.map_or(free, |l| free.min(l)))
            },
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
        if let Some(why) = self.boots.no_cuda.take() {
            tracing::error!(event = "no_cuda", "giving up: {why}");
            crate::logging::say(&format!("app: {why}"));
            self.kill_all();
            return Some(crate::master::exit::NO_CUDA);
        }
        if let Some(why) = self.host.refused.take() {
            tracing::error!(event = "host_memory_refused", "giving up: {why}");
            crate::logging::say(&format!("app: {why}"));
            self.kill_all();
            return Some(crate::master::exit::CONFIG);
        }
        self.place_unplaced();
        let now = Instant::now();
        let states: Vec<WorkerState> = self.workers.iter().map(|w| w.state.clone()).collect();
        let live: Vec<u32> = states.iter().map(|w| w.pid).collect();
        self.mps_faults.settle(&live);
        self.check_mps_daemon(now);
        let (plan, slots, faults) = (&self.plan, &self.slots, &self.mps_faults);
        let daemon = self.mps_daemon.as_ref();
        let capacity = |gpu: u32| {
            let gone = |g: &crate::master::plan::GpuPlan| daemon.is_some_and(|d| d.blocks(g));
            if faults.blocks(gpu) || plan.gpus.iter().any(|g| g.index == gpu && gone(g)) {
                return 0;
            }
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
            target: self.host.hold(self.target),
            cfg_gen: self.reload.gen,
            stopping: self.stopping,
            ever_ready: self.boots.ever_ready,
            first_boot_failures: self.boots.first_failures,
            last_boot_code: self.boots.last_code,
            last_ready_at: self.boots.last_ready_at,
            gpu_capacity: &capacity,
            gpu_admits: &admits,
            limits: Limits {
                timeout: self.cfg.limits.timeout,
                boot_timeout: self.cfg.limits.boot_timeout,
                graceful_timeout: self.cfg.limits.graceful_timeout,
            },
        });
        for action in actions {
            match action {
                Action::Spawn { slot } if self.template_loading(slot) => {}
                Action::Spawn { slot } => self.spawn(slot, now),
                Action::Wait { slot, why } => {
                    if self.wait_log.fresh(slot, why, now) {
                        tracing::warn!(
                            event = "worker_waits",
                            slot,
                            why = why.code(),
                            gpu = why.gpu(),
                            "worker {slot} waits: {why}"
                        );
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
    pub(super) fn ask(&mut self, pid: u32, why: RetireAsk, sig: Signal, now: Instant) {
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
        let jitter = self.jitter.next(self.cfg.limits.max_requests_jitter);
        let max_requests = if self.cfg.limits.max_requests == 0 {
            0
        } else {
            self.cfg.limits.max_requests + jitter
        };
        if self.listener.is_none() {
            return;
        }
        let mut config = worker_config(&self.cfg, &self.plan, slot, generation, max_requests);
        // What the ledger holds for it: the plan's figure per worker, which its cap and MPS
        // limit are made from (never below the limit, should a plan have set one above).
        let per = crate::master::plan::per_worker_mb(self.plan.planned_typ_mb);
        let reserved = config.gpu.as_ref().map(|g| {
            let mb = per.max(g.mps_limit_mb.unwrap_or(0));
            (g.uuid.clone(), mb)
        });
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
                let state = WorkerState::new(l.pid, slot, generation, self.reload.gen, gpu, now);
                if let Some(m) = &self.metrics {
                    m.started(&state, method);
                }
                self.workers.push(Live {
                    state,
                    control: l.control,
                    buf: Vec::new(),
                    seat,
                    reserved,
                });
            }
            Err(e) => {
                let st = WorkerState::new(0, slot, generation, self.reload.gen, gpu, now);
                // exec refused it: not executable by this user (126), or missing.
                let code = (e.kind() == std::io::ErrorKind::PermissionDenied)
                    .then_some(crate::master::decide::EXIT_NOT_EXECUTABLE);
                self.boot_failed(&st, code, now);
                tracing::error!(
                    "cannot start worker {slot} from {}: {e}",
                    self.cfg.workers.binary.display()
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_is_logged_once_per_interval_and_a_new_reason_at_once() {
        let t0 = Instant::now();
        let mut log = WaitLog::default();
        assert!(log.fresh(1, WaitReason::Unplaced, t0));
        assert!(!log.fresh(1, WaitReason::Unplaced, t0 + Duration::from_secs(5)));
        assert!(log.fresh(2, WaitReason::Unplaced, t0), "another slot");
        assert!(log.fresh(1, WaitReason::GpuRoom(0), t0 + Duration::from_secs(6)));
        assert!(log.fresh(1, WaitReason::GpuRoom(0), t0 + Duration::from_secs(17)));
    }

    #[test]
    fn jitter_stays_within_its_bound() {
        let mut j = Jitter(1);
        assert_eq!(j.next(0), 0);
        let draws: Vec<u64> = (0..1000).map(|_| j.next(3)).collect();
        assert!(draws.iter().all(|d| *d <= 3));
        assert!((0..=3).all(|v| draws.contains(&v)), "{draws:?}");
    }
}
