//! The master's one loop: wait for a signal, a control message or a deadline; drain the
//! recorded intents; read control messages; reap exited workers; learn the footprint; ask
//! `decide` what to do and do it. Everything that changes a worker's state happens here, on
//! one thread. A façade over private modules (as watchexec's supervisor is): each file owns
//! one concern, and the state of a concern is a small type of that file, tested by value.
//!
//! | file | owns | its state |
//! |---|---|---|
//! | `mod.rs` | the loop, and [`Supervisor`]: the state the files share | |
//! | `intents.rs` | what each recorded signal's intent does (stop, reload, TTIN, TTOU) | |
//! | `reload.rs` | where a reload stands: generations, the configuration to go back to, rollback | `Reload` |
//! | `control.rs` | the workers' control messages (ready, heartbeat, retiring, metrics) | |
//! | `exits.rs` | reaping: `worker_exited`, failed boots, reload rollback | |
//! | `boots.rs` | the boot history `decide` gives up by | `Boots` |
//! | `act.rs` | carrying out `decide`'s actions (`worker_retire_asked`, `worker_killed`, …) | `WaitLog`, `Jitter` |
//! | `adapt.rs` | the footprint learned while serving, and `--adapt-workers` | |
//! | `host.rs` | host memory: the bound once the template measured a worker, own memory learned while serving, OOM kills | `HostWatch` |
//! | `template.rs` | the template process's life, and launching workers (fork or exec) | `Templates` |
//! | `idle.rs` | `--idle-release`: retiring idle workers, giving the reservation back, re-admitting on a request | `Idle` |
//! | `lend.rs` | lending room to a neighbour that asks, waiting for room, what the ledger entry says | `Lend` |
//! | `mps.rs` | under MPS: a fatal CUDA error retires that GPU's workers together; the daemon looked for again | `MpsFaults`, `DaemonWatch` |
//!
//! The rules these files apply are pure, in [`super::decide`] and [`super::rules`].

mod act;
mod adapt;
mod boots;
mod control;
mod exits;
mod host;
mod idle;
mod intents;
mod lend;
mod mps;
mod refuse;
mod reload;
mod template;

use crate::master::host::reservation::{LiveWorker, Reservation};
use std::net::TcpListener;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::waitpid;
use nix::unistd::Pid;

use super::decide::Stopping;
use super::events::Pool;
use super::footprint::Learner;
use super::metrics::MasterMetrics;
use super::notify::Notifier;
use super::signals::Signals;
use super::slot::{Slot, WorkerState};
use crate::board::Board;
use crate::master::config::Config;
use crate::master::plan::Plan;
use crate::master::resources::NvmlProbe;
use act::{Jitter, WaitLog};
use boots::Boots;
use host::HostWatch;
use idle::Idle;
use mps::{DaemonWatch, MpsFaults};
use reload::Reload;
use template::Templates;

/// Longest sleep of the loop when nothing happens (deadline resolution).
const TICK: Duration = Duration::from_millis(100);

struct Live {
    state: WorkerState,
    control: UnixStream,
    buf: Vec<u8>,
    /// Its seat on the idle board, cleared when it is reaped.
    seat: Option<u32>,
    /// On a GPU: that device's UUID and the MB reserved for it in the ledger, the figure
    /// its allocator cap and MPS limit were made with (`master::host::reservation`).
    reserved: Option<(String, u64)>,
}

/// The supervisor: the state the loop shares. What belongs to one concern is a type of
/// its own, in the file that uses it: `Reload` (`reload.rs`: the configuration
/// generations), `Boots` (`boots.rs`: the boot history `decide` gives up by), `Templates`
/// (`template.rs`), `WaitLog` and `Jitter` (`act.rs`).
pub struct Supervisor {
    /// The configuration workers are started with now.
    cfg: Config,
    plan: Plan,
    reload: Reload<Config>,
    listener: Option<TcpListener>,
    signals: Signals,
    workers: Vec<Live>,
    slots: Vec<Slot>,
    target: u32,
    stopping: Option<Stopping>,
    boots: Boots,
    gpus: Option<NvmlProbe>,
    jitter: Jitter,
    wait_log: WaitLog,
    /// The pool as last reported (`pool` event).
    reported: Pool,
    /// Readiness, status and reloads for systemd (`Type=notify`).
    notify: Notifier,
    templates: Templates,
    /// What `/metrics` shows, when `--metrics-port` is given.
    metrics: Option<MasterMetrics>,
    /// What is learned of the workers' GPU memory while they serve (workers on GPUs).
    learner: Option<Learner>,
    /// This server's reservation in the GPU-memory ledger.
    reservation: Option<Reservation>,
    /// Host memory: the bound, what workers hold of their own, OOM kills (`host.rs`).
    host: HostWatch,
    /// Where workers show that they are free ([`crate::board`]); `None` if it could not be
    /// made (then workers accept as they would without siblings).
    board: Option<Board>,
    /// GPUs that start no worker until those that shared a fatal MPS fault are gone.
    mps_faults: MpsFaults,
    /// The MPS control daemon `--mps auto` found, looked for again (`mps.rs`).
    mps_daemon: Option<DaemonWatch>,
    /// `--idle-release` and lending (`idle.rs`); `None`: neither.
    idle: Option<Idle>,
    /// Lending room and waiting for it (`lend.rs`).
    lend: lend::Lend,
}

impl Supervisor {
    pub fn new(
        cfg: Config,
        plan: Plan,
        listener: TcpListener,
        signals: Signals,
        gpus: Option<NvmlProbe>,
        metrics: Option<MasterMetrics>,
    ) -> Supervisor {
        let mut slots: Vec<Slot> = plan
            .placement
            .iter()
            .map(|p| Slot::new(p.slot, p.gpu.as_ref().map(|g| g.index)))
            .collect();
        for &id in &plan.unplaced {
            let mut s = Slot::new(id, None);
            s.unplaced = true;
            slots.push(s);
        }
        let target = plan.workers;
        let lend = lend::Lend::new(cfg.lending.evictable_after, cfg.lending.pin);
        let mps_faults = MpsFaults::serving(&plan);
        // Only a daemon found (`--mps auto`): `--mps on` assumes one the master cannot see.
        let mps_daemon = (cfg.mps.setting.is_none() && cfg.mps.on)
            .then(|| DaemonWatch::new(cfg.mps.pipe_directory.clone(), Instant::now()));
        let cgroup = crate::master::resources::host_memory::Cgroup::of(
            cfg.host_memory.memory_cgroup.as_deref(),
        );
        Supervisor {
            cfg,
            plan,
            reload: Reload::new(),
            listener: Some(listener),
            signals,
            workers: Vec::new(),
            slots,
            target,
            stopping: None,
            boots: Boots::new(Instant::now()),
            gpus,
            jitter: Jitter::seeded(),
            wait_log: WaitLog::default(),
            reported: Pool::default(),
            notify: Notifier::from_env(),
            templates: Templates::default(),
            metrics,
            learner: None,
            reservation: None,
            mps_faults,
            mps_daemon,
            idle: None,
            lend,
            host: HostWatch::new(cgroup),
            board: Board::create()
                .map_err(|e| {
                    tracing::warn!(
                        "cannot create the idle board ({e}): a worker with a request in hand may take the next connection while another is idle"
                    )
                })
                .ok(),
        }
    }

    /// Keep this server's reservation in the GPU-memory ledger (`master::host::reservation`).
    pub fn with_reservation(mut self, reservation: Option<Reservation>) -> Supervisor {
        self.reservation = reservation;
        self
    }

    /// Learn the workers' GPU footprint while serving (`footprint.rs`).
    pub fn with_learner(mut self, learner: Option<Learner>) -> Supervisor {
        self.learner = learner;
        self
    }

    /// Runs until the master should exit; returns its exit status.
    pub fn run(mut self) -> i32 {
        // Workers forked by the template are re-parented to the master.
        // SAFETY: prctl(PR_SET_CHILD_SUBREAPER) has no memory-safety preconditions.
        if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
            tracing::warn!("cannot become a child subreaper; workers will be started by exec");
            self.templates.disable();
        }
        self.idle_from_config();
        if let (Some(m), Some(_), Some(dir)) =
            (&self.metrics, &self.reservation, &self.cfg.gpu.ledger)
        {
            m.see_ledger(dir.clone());
        }
        loop {
            self.ensure_template();
            self.wait();
            for intent in self.signals.take() {
                self.on_intent(intent);
            }
            self.read_control();
            self.reap();
            self.learn();
            self.idle_turn(Instant::now());
            if let Some(code) = self.act() {
                if let Some(l) = &mut self.learner {
                    l.save(Instant::now(), true);
                }
                if let Some(r) = &mut self.reservation {
                    r.release();
                }
                return code;
            }
            let reserved = self.reserved_workers();
            let live = self.live_reserved();
            let (status, news) = self.ledger_status(Instant::now());
            if let Some(r) = &mut self.reservation {
                r.set_status(Some(status));
                r.follow(&self.plan, reserved, &live, news, Instant::now());
            }
            self.report_pool();
            self.notify.tick(Instant::now());
        }
    }

    /// The workers alive on GPUs, with what each was started with, for the ledger.
    fn live_reserved(&self) -> Vec<LiveWorker> {
        let alive = self.workers.iter().filter_map(|w| {
            let (uuid, mb) = w.reserved.clone()?;
            Some(LiveWorker {
                slot: w.state.slot,
                uuid,
                mb,
            })
        });
        alive.collect()
    }

    /// Reports the pool (`pool` event) when it changed since the last report.
    fn report_pool(&mut self) {
        // While one worker serves to be measured (`host.rs`), the pool wants one.
        let wanted = self.host.hold(self.target);
        let now = Pool::of(wanted, self.workers.iter().map(|w| &w.state));
        if now != self.reported {
            now.report();
            self.reported = now;
        }
        self.notify.pool(&now);
        if let Some(m) = &self.metrics {
            let stopping = self.stopping.is_some();
            m.pool(now, stopping, self.workers.iter().map(|w| &w.state));
            // One getsockopt: the kernel's count of connections waiting for a worker.
            let fd = self.listener.as_ref().map(|l| l.as_raw_fd());
            m.backlog(fd.and_then(crate::metrics::listen_queue::read));
        }
    }

    fn wait(&mut self) {
        let mut fds = Vec::with_capacity(self.workers.len() + 1);
        fds.push(PollFd::new(self.signals.fd(), PollFlags::POLLIN));
        for w in &self.workers {
            fds.push(PollFd::new(w.control.as_fd(), PollFlags::POLLIN));
        }
        if let Some(fd) = self.templates.loading_fd() {
            fds.push(PollFd::new(fd, PollFlags::POLLIN));
        }
        // Released for being idle: a connection waiting wakes the loop (`idle.rs`).
        let released = self.idle_released() && !self.lend.waiting();
        if let Some(l) = self.listener.as_ref().filter(|_| released) {
            fds.push(PollFd::new(l.as_fd(), PollFlags::POLLIN));
        }
        let _ = poll(&mut fds, PollTimeout::from(TICK.as_millis() as u16));
    }

    fn signal(&self, pid: u32, sig: Signal) {
        let _ = kill(Pid::from_raw(pid as i32), sig);
    }

    fn with(&mut self, pid: u32, f: impl FnOnce(&mut WorkerState)) {
        if let Some(w) = self.workers.iter_mut().find(|w| w.state.pid == pid) {
            f(&mut w.state);
        }
    }

    fn kill_all(&mut self) {
        self.templates.kill_all();
        for w in &self.workers {
            self.signal(w.state.pid, Signal::SIGKILL);
        }
        for w in std::mem::take(&mut self.workers) {
            let _ = waitpid(Pid::from_raw(w.state.pid as i32), None);
        }
    }
}
