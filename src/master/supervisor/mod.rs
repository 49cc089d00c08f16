//! The master's one loop: wait for a signal, a control message or a deadline; drain the
//! recorded intents; reap exited workers; read control messages; ask `decide` what to do and
//! do it. Everything that changes a worker's state happens here, on one thread.

use std::collections::HashMap;
use std::io::Read;
use std::net::TcpListener;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use super::decide::{decide, Action, Limits, Stopping, View, WaitReason};
use super::events::{phase_name, Pool};
use super::footprint::{Learner, Sample};
use super::metrics::{exit_reason, MasterMetrics};
use super::notify::Notifier;
use super::signals::{Intent, Signals};
use super::slot::{KillReason, Phase, Slot, WorkerState};
use super::spawn::{launch, worker_config, Launched, WorkerSpec};
use super::template::Template;
use crate::board::Board;
use crate::config::Config;
use crate::plan::{Placement, Plan, Target};
use crate::protocol::{take_line, worker_exit, ControlMsg, WorkerConfig};
use crate::resources::NvmlProbe;

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

/// Templates that die before they are ready, per configuration, before exec takes over.
const TEMPLATE_TRIES: u32 = 2;

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

    /// Samples the workers' GPU memory (once a second); when the plan's assumption is
    /// passed, says so once and, with `--adapt-workers`, lowers the worker count one
    /// worker at a time to what fits.
    fn learn(&mut self) {
        let now = Instant::now();
        let (Some(l), Some(nvml)) = (self.learner.as_mut(), self.gpus.as_ref()) else {
            return;
        };
        if !l.due(now) {
            return;
        }
        let samples: Vec<Sample> = self
            .workers
            .iter()
            .filter(|w| w.state.phase == Phase::Ready)
            .filter_map(|w| {
                Some(Sample {
                    pid: w.state.pid,
                    slot: w.state.slot,
                    gpu: w.state.gpu?,
                    allocator: w.state.allocator,
                    footprint: w.state.footprint,
                })
            })
            .collect();
        if let Some(hw) = l.sample(now, &samples, nvml) {
            if let Some(m) = &self.metrics {
                m.observed_footprint(hw);
            }
            tracing::debug!(
                event = "footprint_observed",
                observed_mb = hw,
                planned_mb = l.assumed_mb,
                "a worker reached {hw} MB of GPU memory (the plan assumes {} MB)",
                l.assumed_mb
            );
            if l.check() {
                let cap = l.capacity(&self.plan).unwrap_or(0);
                tracing::warn!(
                    event = "footprint_exceeded",
                    observed_mb = hw,
                    planned_mb = l.assumed_mb,
                    capacity = cap,
                    workers = self.target,
                    adapt = self.cfg.adapt_workers,
                    slots = ?l.slot_marks(),
                    "a worker reached {hw} MB of GPU memory, more than the {} MB the plan assumed per worker: at that footprint the GPUs hold {cap} workers, {} run; {}",
                    l.assumed_mb,
                    self.target,
                    if self.cfg.adapt_workers {
                        "retiring workers one at a time down to that (--adapt-workers)"
                    } else {
                        "no more are added (TTIN refused); --adapt-workers would retire the surplus"
                    }
                );
            }
        }
        if !self.cfg.adapt_workers || !l.exceeded() || self.stopping.is_some() || self.reloading {
            return;
        }
        let cap = l.capacity(&self.plan).unwrap_or(self.target).max(1);
        let settling = self
            .workers
            .iter()
            .any(|w| w.state.phase != Phase::Ready || w.state.asked_to_stop.is_some());
        if self.target > cap && !settling {
            self.target -= 1;
            tracing::warn!(
                event = "workers_adapted",
                workers = self.target,
                capacity = cap,
                observed_mb = l.high_water_mb().unwrap_or(0),
                planned_mb = l.assumed_mb,
                "retiring one worker: {} MB observed per worker leaves room for {cap}; {} workers now",
                l.high_water_mb().unwrap_or(0),
                self.target
            );
        }
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

    fn on_intent(&mut self, intent: Intent) {
        let now = Instant::now();
        match intent {
            Intent::GracefulStop => {
                if self.stopping.is_none() {
                    tracing::info!(
                        event = "stopping",
                        how = "graceful",
                        "TERM: stopping gracefully (in-flight requests get {:?})",
                        self.cfg.graceful_timeout
                    );
                    self.stopping = Some(Stopping::Graceful(now));
                    self.notify.stopping(&self.reported);
                    self.listener = None;
                    self.retire_template();
                }
            }
            Intent::QuickStop => {
                if !matches!(self.stopping, Some(Stopping::Quick(_))) {
                    tracing::info!(event = "stopping", how = "quick", "INT/QUIT: stopping now");
                    self.stopping = Some(Stopping::Quick(now));
                    self.notify.stopping(&self.reported);
                    self.listener = None;
                    self.retire_template();
                    for w in &mut self.workers {
                        w.state.asked_to_stop = None;
                    }
                }
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

    fn reload(&mut self) {
        match self.cfg.reloaded() {
            Ok(mut new) => {
                if self.plan.measured_mb.is_some() {
                    // The pool and its caps stay as planned from the measurement; so does
                    // the per-worker figure admission compares with.
                    new.metadata.est_gpu_mem_typ = self.plan.est_gpu_mem_typ;
                }
                if new.model_path != self.cfg.model_path {
                    if let Some(l) = &mut self.learner {
                        l.model_changed();
                    }
                }
                tracing::info!(
                    event = "reload_started",
                    "HUP: reloading {} (model {}), replacing workers one at a time",
                    new.metadata.path.display(),
                    new.model_display()
                );
                let old = std::mem::replace(&mut self.cfg, new);
                if self.reloading {
                    // A HUP during a reload supersedes it: the workers it started that are
                    // still booting are stopped (decide), and its configuration becomes the
                    // one to go back to only if a worker has been ready with it.
                    tracing::info!(
                        event = "reload_superseded",
                        "HUP during a reload: the new configuration supersedes the one being rolled out"
                    );
                }
                if !self.reloading || self.gen_proven {
                    self.fallback = Some((old, self.cfg_gen));
                }
                self.reloading = true;
                self.rolled_back = false;
                self.notify.reloading(&self.reported);
                self.cfg_gen += 1;
                self.gen_proven = false;
            }
            Err(e) => tracing::error!(
                event = "reload_refused",
                error = %e,
                "HUP: reload refused, the old workers keep serving: {e}"
            ),
        }
    }

    fn more_workers(&mut self) {
        if let Some(l) = self.learner.as_ref().filter(|l| l.exceeded()) {
            let cap = l.capacity(&self.plan).unwrap_or(0);
            if self.target >= cap {
                tracing::warn!(
                    event = "ttin_refused",
                    workers = self.target,
                    "TTIN refused: workers were seen using {} MB of GPU memory, more than the plan assumed; at that footprint the GPUs hold {cap}",
                    l.high_water_mb().unwrap_or(0)
                );
                return;
            }
        }
        let slot = self.target;
        if (slot as usize) >= self.slots.len() {
            let slots = &self.slots;
            let on_gpu = |i: u32| slots.iter().filter(|s| s.gpu == Some(i)).count() as u32;
            let gpu = match self.plan.next_target(on_gpu) {
                Target::Cpu => None,
                Target::Gpu(g) => Some(g),
                Target::NoRoom => {
                    tracing::warn!(
                        event = "ttin_refused",
                        workers = self.target,
                        "TTIN refused: {} workers already fill the GPUs' usable memory",
                        self.target
                    );
                    return;
                }
            };
            self.slots
                .push(Slot::new(slot, gpu.as_ref().map(|g| g.index)));
            self.plan.placement.push(Placement { slot, gpu });
        }
        self.target += 1;
        tracing::info!(
            event = "ttin",
            workers = self.target,
            "TTIN: {} workers",
            self.target
        );
    }

    fn reap(&mut self) {
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) => {
                    self.on_exit(pid.as_raw() as u32, Some(code), None)
                }
                Ok(WaitStatus::Signaled(pid, sig, _)) => {
                    self.on_exit(pid.as_raw() as u32, None, Some(sig))
                }
                Ok(WaitStatus::StillAlive) | Err(_) => return,
                Ok(_) => continue,
            }
        }
    }

    fn on_exit(&mut self, pid: u32, code: Option<i32>, sig: Option<Signal>) {
        if let Some(i) = self.old_templates.iter().position(|p| *p == pid) {
            self.old_templates.swap_remove(i);
            return;
        }
        if self.template.as_ref().is_some_and(|t| t.pid == pid) {
            self.template_exited(code, sig);
            return;
        }
        let Some(i) = self.workers.iter().position(|w| w.state.pid == pid) else {
            return;
        };
        let mut w = self.workers.swap_remove(i);
        // A worker that died showing "free" must not be waited for by its siblings.
        if let (Some(b), Some(seat)) = (&self.board, w.seat) {
            b.clear(seat);
        }
        let now = Instant::now();
        // Messages it sent just before exiting (a ready, a retiring) still count.
        let msgs = read_lines(&mut w);
        self.absorb(&mut w.state, msgs, now);
        let st = &w.state;
        if let Some(m) = &self.metrics {
            m.exited(pid, exit_reason(st, code, sig));
        }
        let status = match (code, sig) {
            (Some(c), _) => format!("exit status {c}"),
            (_, Some(s)) => format!("signal {s}"),
            _ => "unknown status".into(),
        };
        let name = format!(
            "worker {} (pid {pid}, generation {})",
            st.slot, st.generation
        );
        // One `worker_exited` event whatever the outcome; its level and message say how.
        macro_rules! exited {
            ($level:ident, $($msg:tt)+) => {
                tracing::$level!(
                    event = "worker_exited",
                    slot = st.slot,
                    pid,
                    generation = st.generation,
                    phase = phase_name(st.phase),
                    code,
                    signal = sig.map(|s| s.as_str()),
                    served = st.served,
                    reason = st.retire_reason.map(|r| r.code()),
                    killed = st.killed.map(|k| k.code()),
                    $($msg)+
                )
            };
        }
        if self.stopping.is_some() {
            exited!(debug, "{name} stopped: {status}");
            return;
        }
        if st.killed == Some(KillReason::Superseded) {
            exited!(info, "{name} stopped: {}", KillReason::Superseded);
            return;
        }
        if let Some(why) = st.killed {
            exited!(warn, "{name} killed: it {why}; replacing it");
            if st.phase == Phase::Booting {
                self.last_boot_code = None;
                self.boot_failed(&w.state, now);
            }
            return;
        }
        // Before any worker served, a GPU worker without CUDA means the machine cannot
        // serve as planned; later (a GPU lost while serving) it is one more failed boot.
        if let Some(gpu) = st.gpu.filter(|_| code == Some(worker_exit::NO_CUDA)) {
            let why = format!(
                "{name} was placed on {} but libtorch sees no CUDA device there (its reason is logged above): {}",
                self.plan.gpu_label(gpu),
                self.no_cuda_reason()
            );
            if self.ever_ready {
                tracing::error!(event = "no_cuda", "{why}");
            } else {
                self.no_cuda = Some(why);
            }
        }
        match st.phase {
            Phase::Booting => {
                let what = match code {
                    Some(worker_exit::NO_CUDA) => "could not use its GPU",
                    Some(worker_exit::MODEL_LOAD) => "could not load the model",
                    Some(worker_exit::CONFIG) => "rejected its configuration",
                    Some(super::decide::EXIT_LOADER) => {
                        "could not start: the dynamic loader did not find a shared library (named on stderr above)"
                    }
                    Some(super::decide::EXIT_NOT_EXECUTABLE) => "could not be executed",
                    _ => "died while booting",
                };
                self.last_boot_code = code;
                self.boot_failed(&w.state, now);
                let slot = self.slots.iter().find(|s| s.id == w.state.slot);
                let retry = slot
                    .and_then(|s| s.backoff_until)
                    .map(|t| t.saturating_duration_since(now))
                    .unwrap_or_default();
                exited!(error, "{name} {what} ({status}); next try in {retry:.1?}");
            }
            _ if code == Some(0) => exited!(
                info,
                "{name} exited after {} requests{}",
                st.served,
                st.retire_reason
                    .map(|r| format!(" ({r:?})"))
                    .unwrap_or_default()
            ),
            _ => exited!(
                warn,
                "{name} died ({status}) after {} requests; replacing it",
                st.served
            ),
        }
    }

    fn boot_failed(&mut self, w: &WorkerState, now: Instant) {
        if let Some(s) = self.slots.iter_mut().find(|s| s.id == w.slot) {
            s.failed(now);
        }
        if !self.ever_ready {
            self.first_boot_failures += 1;
        }
        if w.cfg_gen == self.cfg_gen {
            if let Some((good, good_gen)) = self.fallback.take() {
                tracing::error!(
                    event = "reload_failed",
                    "reload failed: a worker with the new configuration did not boot; going back to the last configuration that served"
                );
                // The last good configuration becomes the current one: its workers stay,
                // and workers of any other (superseded) configuration are replaced by it.
                self.cfg = good;
                self.cfg_gen += 1;
                self.gen_proven = true;
                self.rolled_back = true;
                for l in &mut self.workers {
                    if l.state.cfg_gen == good_gen {
                        l.state.cfg_gen = self.cfg_gen;
                    }
                }
                if let Some(s) = self.slots.iter_mut().find(|s| s.id == w.slot) {
                    s.succeeded();
                }
            }
        }
    }

    fn template_exited(&mut self, code: Option<i32>, sig: Option<Signal>) {
        let Some(t) = self.template.take() else {
            return;
        };
        if self.stopping.is_some() {
            return;
        }
        let status = code.map_or_else(|| format!("signal {sig:?}"), |c| format!("exit status {c}"));
        if t.ready {
            tracing::warn!(
                event = "template_failed",
                pid = t.pid,
                status,
                "the template process (pid {}) died ({status}); restarting it",
                t.pid
            );
            return;
        }
        self.template_failures += 1;
        if code == Some(worker_exit::TEMPLATE_UNFIT) || self.template_failures >= TEMPLATE_TRIES {
            tracing::warn!(
                event = "template_failed",
                pid = t.pid,
                status,
                "the template process failed ({status}); workers are started by exec (about 0.3 s each) for this configuration"
            );
            self.template_off_gen = Some(t.cfg_gen);
        } else {
            tracing::warn!(
                event = "template_failed",
                pid = t.pid,
                status,
                "the template process failed before it was ready ({status}); retrying"
            );
        }
    }

    /// Starts the template for the current configuration when there should be one.
    fn ensure_template(&mut self) {
        if self.stopping.is_some() || self.template_off_gen == Some(u64::MAX) {
            return;
        }
        if let Some(t) = &self.template {
            if t.cfg_gen == self.cfg_gen {
                if !t.ready && t.started.elapsed() > self.cfg.boot_timeout {
                    tracing::warn!(
                        "the template process did not load the model within --boot-timeout"
                    );
                    self.retire_template();
                    self.template_off_gen = Some(self.cfg_gen);
                }
                return;
            }
            self.retire_template();
            self.template_failures = 0;
        }
        if self.template_off_gen == Some(self.cfg_gen)
            || self.plan.placement.iter().all(|p| p.gpu.is_some())
        {
            return;
        }
        let Some(listener) = &self.listener else {
            return;
        };
        let config = worker_config(&self.cfg, &self.plan, 0, 0, 0);
        let board = self.board.as_ref().and_then(Board::fd);
        match Template::start(
            &self.cfg.worker_binary,
            &config,
            listener,
            board,
            self.cfg_gen,
        ) {
            Ok(t) => self.template = Some(t),
            Err(e) => {
                tracing::warn!(
                    "cannot start the template process: {e}; workers are started by exec"
                );
                self.template_off_gen = Some(self.cfg_gen);
            }
        }
    }

    fn retire_template(&mut self) {
        if let Some(t) = self.template.take() {
            self.signal(t.pid, Signal::SIGKILL);
            self.old_templates.push(t.pid);
        }
    }

    /// Whether spawns should wait: the template for this configuration is still loading.
    fn template_loading(&self, slot: u32) -> bool {
        let on_cpu = self
            .plan
            .placement
            .iter()
            .any(|p| p.slot == slot && p.gpu.is_none());
        on_cpu
            && self
                .template
                .as_ref()
                .is_some_and(|t| !t.ready && t.cfg_gen == self.cfg_gen)
    }

    fn read_control(&mut self) {
        let now = Instant::now();
        if let Some(t) = self.template.as_mut() {
            if let Some(boot) = t.poll_ready() {
                let ms = t.started.elapsed().as_secs_f64() * 1e3;
                let warmup_ms = boot.warmup_ms;
                tracing::info!(
                    event = "template_ready",
                    pid = t.pid,
                    ms,
                    warmup_ms,
                    "template process (pid {}) ready in {ms:.0} ms ({warmup_ms:.1} ms of it a warm-up pass): workers are forked from it",
                    t.pid
                );
            }
        }
        for i in 0..self.workers.len() {
            let msgs = read_lines(&mut self.workers[i]);
            let mut state = self.workers[i].state.clone();
            self.absorb(&mut state, msgs, now);
            self.workers[i].state = state;
        }
        if self.workers.iter().any(|w| w.state.phase == Phase::Ready) {
            self.last_ready_at = now;
        }
        if self.reloading
            && !self
                .workers
                .iter()
                .any(|w| w.state.occupies_slot() && w.state.cfg_gen < self.cfg_gen)
        {
            let metadata = self.cfg.metadata.path.display().to_string();
            let model = self.cfg.model_display();
            let (outcome, what) = if self.rolled_back {
                (
                    "rolled_back",
                    "reload rolled back: every worker runs the last configuration that served",
                )
            } else {
                (
                    "reloaded",
                    "reload complete: every worker runs the new configuration",
                )
            };
            tracing::info!(
                event = "reload_complete",
                outcome,
                metadata,
                model,
                "{what} ({metadata}, model {model})"
            );
            self.reloading = false;
            self.fallback = None;
            self.notify.reload_done();
        }
    }

    /// Applies a worker's control messages to what the master knows of it.
    fn absorb(&mut self, st: &mut WorkerState, msgs: Vec<ControlMsg>, now: Instant) {
        for msg in msgs {
            match msg {
                ControlMsg::Ready {
                    pid,
                    boot_ms,
                    device,
                } => {
                    let simulated = self.cfg.simulated_gpus && device.contains("simulated");
                    let off_gpu = !device.starts_with("cuda") && !simulated;
                    if let Some(gpu) = st.gpu.filter(|_| off_gpu && self.stopping.is_none()) {
                        self.no_cuda = Some(format!(
                            "worker {} (pid {pid}) was placed on {} but runs its model on '{device}': {}",
                            st.slot,
                            self.plan.gpu_label(gpu),
                            self.no_cuda_reason()
                        ));
                    }
                    st.set_phase(Phase::Ready, now);
                    if st.cfg_gen == self.cfg_gen {
                        self.gen_proven = true;
                    }
                    st.last_heartbeat = now;
                    self.ever_ready = true;
                    self.last_ready_at = now;
                    if let Some(s) = self.slots.iter_mut().find(|s| s.id == st.slot) {
                        s.succeeded();
                    }
                    let ms = now.duration_since(st.started).as_secs_f64() * 1e3;
                    if let Some(m) = &self.metrics {
                        m.worker_ready(st.pid, ms / 1e3);
                    }
                    tracing::info!(
                        event = "worker_ready",
                        slot = st.slot,
                        pid,
                        generation = st.generation,
                        device,
                        ms,
                        model_ms = boot_ms.model_ms,
                        warmup_ms = boot_ms.warmup_ms,
                        "worker {} (pid {pid}, generation {}) ready in {ms:.0} ms (model {:.1} ms, warm-up {:.1} ms)",
                        st.slot,
                        st.generation,
                        boot_ms.model_ms,
                        boot_ms.warmup_ms
                    );
                }
                ControlMsg::Metrics {
                    traffic,
                    allocator_peak,
                } => {
                    if let Some(m) = &self.metrics {
                        m.report(st.pid, traffic, allocator_peak);
                    }
                }
                // Only a profiling worker sends it, and those are the profiler's own.
                ControlMsg::Footprint { .. } => {}
                ControlMsg::Heartbeat {
                    served,
                    in_flight,
                    allocator_peak,
                    allocator_reserved,
                    footprint,
                } => {
                    st.allocator = allocator_peak.zip(allocator_reserved);
                    st.footprint = footprint;
                    st.last_heartbeat = now;
                    st.served = served;
                    st.in_flight = in_flight;
                }
                ControlMsg::Retiring {
                    reason,
                    served,
                    in_flight,
                } => {
                    st.set_phase(Phase::Retiring, now);
                    st.retire_reason = Some(reason);
                    st.served = served;
                    st.in_flight = in_flight;
                    tracing::debug!(
                        event = "worker_retiring",
                        slot = st.slot,
                        pid = st.pid,
                        reason = reason.code(),
                        served,
                        in_flight,
                        "worker {} (pid {}) retiring after {served} requests ({in_flight} in flight): {reason:?}",
                        st.slot,
                        st.pid
                    );
                }
            }
        }
    }

    /// Gives an unplaced slot (an override beyond what the plan fitted) a GPU once one has
    /// the memory for a typical worker: free ≥ est_gpu_mem_min + reserve and
    /// min(total × fraction, free) − reserve ≥ est_gpu_mem_typ, with no worker of ours
    /// still booting there (so that NVML's free figure already counts it).
    fn place_unplaced(&mut self) {
        let Some(probe) = self.gpus.as_ref() else {
            return;
        };
        let (min, typ, reserve) = (
            self.cfg.metadata.est_gpu_mem_min,
            self.cfg.metadata.est_gpu_mem_typ,
            self.cfg.gpu_reserve_mb,
        );
        let Some(i) = self
            .slots
            .iter()
            .position(|s| s.unplaced && s.id < self.target)
        else {
            return;
        };
        let booting = |g: u32| {
            self.workers
                .iter()
                .any(|w| w.state.gpu == Some(g) && w.state.phase == Phase::Booting)
        };
        let fits_now = |g: &crate::plan::GpuPlan| -> Option<u64> {
            let free = probe.free_bytes(g.index).ok()? >> 20;
            let usable = ((g.total_mb as f64 * g.fraction) as u64).min(free);
            let per_worker = crate::plan::per_worker_mb(typ);
            (free >= min + reserve && usable.saturating_sub(reserve) >= per_worker).then_some(free)
        };
        let best = self
            .plan
            .gpus
            .iter()
            .filter(|g| g.excluded.is_none() && !booting(g.index))
            // A GPU only one process at a time may use takes no second worker.
            .filter(|g| {
                g.compute_mode == crate::resources::ComputeMode::Default
                    || !self.slots.iter().any(|s| s.gpu == Some(g.index))
            })
            .filter_map(|g| fits_now(g).map(|free| (g, free)))
            .max_by_key(|(_, free)| *free);
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
    fn no_cuda_reason(&self) -> String {
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
    fn act(&mut self) -> Option<i32> {
        if let Some(why) = self.no_cuda.take() {
            tracing::error!(event = "no_cuda", "giving up: {why}");
            eprintln!("app: {why}");
            self.kill_all();
            return Some(crate::exit::NO_CUDA);
        }
        self.place_unplaced();
        let now = Instant::now();
        let states: Vec<WorkerState> = self.workers.iter().map(|w| w.state.clone()).collect();
        let plan = &self.plan;
        let slots = &self.slots;
        // What the plan fitted, or more where an override placed more slots there.
        // On a GPU only one process at a time may use (compute mode), never more than one
        // worker, so a replacement waits for its predecessor to be gone.
        let capacity = |gpu: u32| {
            let on_it = slots.iter().filter(|s| s.gpu == Some(gpu)).count() as u32;
            match plan.gpus.iter().find(|g| g.index == gpu) {
                Some(g) if g.compute_mode != crate::resources::ComputeMode::Default => {
                    g.compute_mode.limit(g.fits)
                }
                Some(g) => g.fits.max(on_it),
                None => on_it,
            }
        };
        let need_mb = self.cfg.metadata.est_gpu_mem_min + self.cfg.gpu_reserve_mb;
        let probe = self.gpus.as_ref();
        let admits = |gpu: u32| match probe.map(|p| p.free_bytes(gpu)) {
            Some(Ok(free)) => free >= need_mb << 20,
            // NVML unreadable now: do not block the service on it.
            _ => true,
        };
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
                    tracing::debug!("asking pid {pid} to retire: {why}");
                    self.signal(pid, Signal::SIGTERM);
                    self.with(pid, |w| w.asked_to_stop = Some(now));
                }
                Action::Quit { pid } => {
                    self.signal(pid, Signal::SIGQUIT);
                    self.with(pid, |w| w.asked_to_stop = Some(now));
                }
                Action::Kill { pid, why } => {
                    tracing::warn!(
                        event = "worker_killed",
                        pid,
                        why = why.code(),
                        "killing pid {pid}: it {why}"
                    );
                    self.signal(pid, Signal::SIGKILL);
                    self.with(pid, |w| w.killed = Some(why));
                }
                Action::Exit { code, why } => {
                    if code != 0 {
                        tracing::error!("giving up: {why}");
                        eprintln!("app: {why}");
                    }
                    self.kill_all();
                    return Some(code);
                }
            }
        }
        None
    }

    fn spawn(&mut self, slot: u32, now: Instant) {
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
                    .then_some(super::decide::EXIT_NOT_EXECUTABLE);
                self.boot_failed(&st, now);
                tracing::error!(
                    "cannot start worker {slot} from {}: {e}",
                    self.cfg.worker_binary.display()
                );
            }
        }
    }

    /// Starts a worker: forked from the template when it is ready, else by exec. Says which.
    fn launch(&mut self, config: WorkerConfig) -> std::io::Result<(Launched, &'static str)> {
        // GPU workers are exec'd: they load the model onto their GPU anyway, and their
        // environment (CUDA_VISIBLE_DEVICES) stays visible in /proc/<pid>/environ.
        let template = self
            .template
            .as_mut()
            .filter(|t| t.ready && t.cfg_gen == self.cfg_gen && config.gpu.is_none());
        if let Some(t) = template {
            match t.spawn(&config) {
                Ok(l) => return Ok((l, "fork")),
                Err(e) => {
                    tracing::warn!(
                        "the template could not fork a worker ({e}); restarting it, exec meanwhile"
                    );
                    self.retire_template();
                }
            }
        }
        let listener = self
            .listener
            .as_ref()
            .ok_or_else(|| std::io::Error::other("not listening any more"))?;
        let spec = WorkerSpec {
            config,
            board: self.board.as_ref().and_then(Board::fd),
        };
        launch(&self.cfg.worker_binary, &spec, listener).map(|l| (l, "exec"))
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

/// Reads what a worker's control channel holds and parses the complete lines.
fn read_lines(w: &mut Live) -> Vec<ControlMsg> {
    let mut chunk = [0u8; 4096];
    loop {
        match (&w.control).read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => w.buf.extend_from_slice(&chunk[..n]),
        }
    }
    let mut out = Vec::new();
    while let Some(text) = take_line(&mut w.buf) {
        match ControlMsg::from_line(&text) {
            Ok(m) => out.push(m),
            Err(e) => tracing::warn!(
                "worker pid {}: bad control message {text:?}: {e}",
                w.state.pid
            ),
        }
    }
    out
}
