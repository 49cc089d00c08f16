//! The master's one loop: wait for a signal, a control message or a deadline; drain the
//! recorded intents; read control messages; reap exited workers; learn the footprint; ask
//! `decide` what to do and do it. Everything that changes a worker's state happens here, on
//! one thread. Split by concern (as watchexec's supervisor is):
//!
//! | file | owns |
//! |---|---|
//! | `mod.rs` | the state ([`Supervisor`]) and the loop |
//! | `intents.rs` | what each recorded signal's intent does (stop, reload, TTIN, TTOU) |
//! | `control.rs` | the workers' control messages (ready, heartbeat, retiring, metrics) |
//! | `exits.rs` | reaping: `worker_exited`, failed boots, reload rollback |
//! | `act.rs` | carrying out `decide`'s actions (`worker_retire_asked`, `worker_killed`, …) |
//! | `adapt.rs` | the footprint learned while serving, and `--adapt-workers` |
//! | `template.rs` | the template process's life, and launching workers (fork or exec) |
//!
//! The rules these files apply are pure, in [`super::decide`] and [`super::rules`].

mod act;
mod adapt;
mod control;
mod exits;
mod intents;
mod template;

use std::collections::HashMap;
use std::net::TcpListener;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::waitpid;
use nix::unistd::Pid;

use super::decide::{Stopping, WaitReason};
use super::events::Pool;
use super::footprint::Learner;
use super::metrics::MasterMetrics;
use super::notify::Notifier;
use super::signals::Signals;
use super::slot::{Slot, WorkerState};
use super::template::Template;
use crate::board::Board;
use crate::master::config::Config;
use crate::master::plan::Plan;
use crate::master::resources::NvmlProbe;

/// Longest sleep of the loop when nothing happens (deadline resolution).
const TICK: Duration = Duration::from_millis(100);
/// How often the same "slot waits" message may be logged.
const WAIT_LOG_EVERY: Duration = Duration::from_secs(10);

struct Live {
    state: WorkerState,
    control: UnixStream,
    buf: Vec<u8>,
    /// Its seat on the idle board, cleared when it is reaped.
    seat: Option<u32>,
}

pub struct Supervisor {
    cfg: Config,
    plan: Plan,
    cfg_gen: u64,
    /// A reload is under way: workers of older configurations are being replaced.
    reloading: bool,
    /// The configuration (and its generation) to go back to if a worker of the reloaded
    /// one fails to boot: the last one a worker has been ready with.
    fallback: Option<(Config, u64)>,
    /// A worker of the current configuration generation has been ready.
    gen_proven: bool,
    /// The reload under way went back to the last configuration that served.
    rolled_back: bool,
    listener: Option<TcpListener>,
    signals: Signals,
    workers: Vec<Live>,
    slots: Vec<Slot>,
    target: u32,
    stopping: Option<Stopping>,
    ever_ready: bool,
    first_boot_failures: u32,
    /// How the last failed boot exited (`decide::gave_up_booting`).
    last_boot_code: Option<i32>,
    /// Why the master must stop with `exit::NO_CUDA`: a worker placed on a GPU came up
    /// without CUDA (`no_cuda`).
    no_cuda: Option<String>,
    last_ready_at: Instant,
    gpus: Option<NvmlProbe>,
    rng: u64,
    wait_logged: HashMap<u32, (Instant, WaitReason)>,
    /// The pool as last reported (`pool` event).
    reported: Pool,
    /// Readiness, status and reloads for systemd (`Type=notify`).
    notify: Notifier,
    /// The template process that forks workers, when in use.
    template: Option<Template>,
    /// Templates stopped on purpose (after a reload), not yet reaped.
    old_templates: Vec<u32>,
    /// Templates that died before they were ready, for the current configuration.
    template_failures: u32,
    /// No template for this configuration generation (it failed twice or cannot fork).
    template_off_gen: Option<u64>,
    /// What `/metrics` shows, when `--metrics-port` is given.
    metrics: Option<MasterMetrics>,
    /// What is learned of the workers' GPU memory while they serve (workers on GPUs).
    learner: Option<Learner>,
    /// Where workers show that they are free ([`crate::board`]); `None` if it could not be
    /// made (then workers accept as they would without siblings).
    board: Option<Board>,
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
        let seed = std::process::id() as u64
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1);
        Supervisor {
            cfg,
            plan,
            cfg_gen: 0,
            reloading: false,
            fallback: None,
            gen_proven: false,
            rolled_back: false,
            listener: Some(listener),
            signals,
            workers: Vec::new(),
            slots,
            target,
            stopping: None,
            ever_ready: false,
            first_boot_failures: 0,
            last_boot_code: None,
            no_cuda: None,
            last_ready_at: Instant::now(),
            gpus,
            rng: seed | 1,
            wait_logged: HashMap::new(),
            reported: Pool::default(),
            notify: Notifier::from_env(),
            template: None,
            old_templates: Vec::new(),
            template_failures: 0,
            template_off_gen: None,
            metrics,
            learner: None,
            board: Board::create()
                .map_err(|e| {
                    tracing::warn!(
                        "cannot create the idle board ({e}): a worker with a request in hand may take the next connection while another is idle"
                    )
                })
                .ok(),
        }
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
            self.template_off_gen = Some(u64::MAX);
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
            if let Some(code) = self.act() {
                if let Some(l) = &mut self.learner {
                    l.save(Instant::now(), true);
                }
                return code;
            }
            self.report_pool();
            self.notify.tick(Instant::now());
        }
    }

    /// Reports the pool (`pool` event) when it changed since the last report.
    fn report_pool(&mut self) {
        let now = Pool::of(self.target, self.workers.iter().map(|w| &w.state));
        if now != self.reported {
            now.report();
            self.reported = now;
        }
        self.notify.pool(&now);
        if let Some(m) = &self.metrics {
            let stopping = self.stopping.is_some();
            m.pool(now, stopping, self.workers.iter().map(|w| &w.state));
        }
    }

    fn wait(&mut self) {
        let mut fds = Vec::with_capacity(self.workers.len() + 1);
        fds.push(PollFd::new(self.signals.fd(), PollFlags::POLLIN));
        for w in &self.workers {
            fds.push(PollFd::new(w.control.as_fd(), PollFlags::POLLIN));
        }
        if let Some(t) = self.template.as_ref().filter(|t| !t.ready) {
            fds.push(PollFd::new(t.fd(), PollFlags::POLLIN));
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
        self.retire_template();
        for pid in std::mem::take(&mut self.old_templates) {
            self.signal(pid, Signal::SIGKILL);
            let _ = waitpid(Pid::from_raw(pid as i32), None);
        }
        for w in &self.workers {
            self.signal(w.state.pid, Signal::SIGKILL);
        }
        for w in std::mem::take(&mut self.workers) {
            let _ = waitpid(Pid::from_raw(w.state.pid as i32), None);
        }
    }
}
