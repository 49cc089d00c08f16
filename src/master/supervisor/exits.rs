//! Reaping: a worker (or a template) exited. One `worker_exited` event per worker, at the
//! level its end deserves; a failed boot backs its slot off, counts towards giving up, and
//! during a reload rolls back to the last configuration that served.

use std::time::Instant;

use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use super::control::read_lines;
use super::Supervisor;
use crate::master::events::phase_name;
use crate::master::metrics::exit_reason;
use crate::master::slot::{KillReason, Phase, WorkerState};
use crate::protocol::worker_exit;

impl Supervisor {
    pub(super) fn reap(&mut self) {
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

    /// A child exited: a template stopped on purpose, the current template, or a worker.
    pub(super) fn on_exit(&mut self, pid: u32, code: Option<i32>, sig: Option<Signal>) {
        crate::master::host::unpack::child_exited(pid);
        if self.templates.reaped_old(pid) {
            return;
        }
        // A SIGKILL nobody here sent, while the kernel's count of OOM kills rose: the OOM
        // killer's (a template's kill is accounted for too, so it is not a worker's).
        let unexplained = sig == Some(Signal::SIGKILL) && self.stopping.is_none();
        if let Some(t) = self.templates.take_if(pid) {
            if unexplained {
                self.host.oom_took_one();
            }
            self.template_exited(t, code, sig);
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
        if unexplained && w.state.killed.is_none() {
            w.state.oom_killed = self.host.oom_took_one();
        }
        if let Some(m) = &self.metrics {
            m.exited(pid, exit_reason(&w.state, code, sig));
        }
        self.worker_exited(&w.state, code, sig, now);
    }

    /// What a worker's exit means: one `worker_exited` event whatever the outcome, at the
    /// level its end deserves; a failed boot backs its slot off and counts towards giving
    /// up; a worker without CUDA before any served stops the master.
    fn worker_exited(
        &mut self,
        st: &WorkerState,
        code: Option<i32>,
        sig: Option<Signal>,
        now: Instant,
    ) {
        let pid = st.pid;
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
                self.boot_failed(st, None, now);
            }
            return;
        }
        if st.oom_killed {
            self.oom_killed(st, now);
            exited!(warn, "{name} was killed by the kernel's OOM killer after {} requests; replacing it after a back-off", st.served);
            return;
        }
        // Before any worker served, a GPU worker without CUDA means the machine cannot
        // serve as planned; later (a GPU lost while serving) it is one more failed boot.
        self.mps_exit(st, code, now);
        if let Some(gpu) = st.gpu.filter(|_| code == Some(worker_exit::NO_CUDA)) {
            let why = format!(
                "{name} was placed on {} but libtorch sees no CUDA device there (its reason is logged above): {}",
                self.plan.gpu_label(gpu),
                self.no_cuda_reason()
            );
            if self.boots.ever_ready {
                tracing::error!(event = "no_cuda", "{why}");
            } else {
                self.boots.no_cuda = Some(why);
            }
        }
        match st.phase {
            Phase::Booting => {
                let what = boot_failure(code);
                self.boot_failed(st, code, now);
                let slot = self.slots.iter().find(|s| s.id == st.slot);
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

    /// Worker `st` was taken by the kernel's OOM killer: said with its last own-memory
    /// figure, and its slot backs off as after a crash (a failed boot, if it was booting).
    fn oom_killed(&mut self, st: &WorkerState, now: Instant) {
        let own_mb = st.own_memory.map(|b| b.div_ceil(1 << 20));
        let counted_in = self.host.oom_source();
        tracing::error!(
            event = "worker_oom_killed",
            slot = st.slot,
            pid = st.pid,
            generation = st.generation,
            phase = phase_name(st.phase),
            own_mb,
            served = st.served,
            counted_in,
            "worker {} (pid {}) was killed by the kernel's OOM killer (counted in {counted_in}); its own host memory was {} MB at its last report",
            st.slot,
            st.pid,
            own_mb.map_or("unknown".into(), |m| m.to_string())
        );
        if st.phase == Phase::Booting {
            self.boot_failed(st, None, now);
        } else if let Some(s) = self.slots.iter_mut().find(|s| s.id == st.slot) {
            s.failed(now);
        }
    }

    /// The boot of worker `w` failed, exiting with `code`: its slot backs off, the boot
    /// history counts it, and a failure of the reloaded configuration rolls back.
    pub(super) fn boot_failed(&mut self, w: &WorkerState, code: Option<i32>, now: Instant) {
        if let Some(s) = self.slots.iter_mut().find(|s| s.id == w.slot) {
            s.failed(now);
        }
        self.boots.failed(code);
        if let Some((good, good_gen)) = self.reload.boot_failed(w.cfg_gen) {
            tracing::error!(
                event = "reload_failed",
                "reload failed: a worker with the new configuration did not boot; going back to the last configuration that served"
            );
            // The last good configuration becomes the current one: its workers stay, and
            // workers of any other (superseded) configuration are replaced by it.
            self.cfg = good;
            for l in &mut self.workers {
                if l.state.cfg_gen == good_gen {
                    l.state.cfg_gen = self.reload.gen;
                }
            }
            if let Some(s) = self.slots.iter_mut().find(|s| s.id == w.slot) {
                s.succeeded();
            }
        }
    }
}

/// What a worker that exited with `code` while booting did, in words.
fn boot_failure(code: Option<i32>) -> &'static str {
    match code {
        Some(worker_exit::NO_CUDA) => "could not use its GPU",
        Some(worker_exit::MODEL_LOAD) => "could not load the model",
        Some(worker_exit::CONFIG) => "rejected its configuration",
        Some(crate::master::decide::EXIT_LOADER) => {
            "could not start: the dynamic loader did not find a shared library (named on stderr above)"
        }
        Some(crate::master::decide::EXIT_NOT_EXECUTABLE) => "could not be executed",
        _ => "died while booting",
    }
}
