//! The supervisor's side of the template process ([`crate::master::template::Template`]):
//! one per configuration generation while CPU workers are planned, restarted when it dies,
//! given up for exec after it failed [`TEMPLATE_TRIES`] times; and how a worker is
//! launched: forked from a ready template, else by exec. [`Templates`] owns what the
//! supervisor keeps of templates and decides what a template's death means.

use std::os::fd::BorrowedFd;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::sys::wait::waitpid;
use nix::unistd::Pid;

use super::Supervisor;
use crate::board::Board;
use crate::master::spawn::{launch, worker_config, Launched, WorkerSpec};
use crate::master::template::Template;
use crate::master::worker_config::WorkerConfig;
use crate::protocol::{worker_exit, BootTimes, ReadyMemory};

/// Templates that die before they are ready, per configuration, before exec takes over.
const TEMPLATE_TRIES: u32 = 2;

/// The template of the current configuration, and what is remembered of templates.
#[derive(Default)]
pub(super) struct Templates {
    /// The template process that forks workers, when in use.
    current: Option<Template>,
    /// Templates stopped on purpose (after a reload), not yet reaped.
    old: Vec<u32>,
    /// Templates that died before they were ready, for the current configuration.
    failures: u32,
    /// No template for this configuration generation (it failed twice or cannot fork);
    /// `u64::MAX`: none ever.
    off_gen: Option<u64>,
}

/// What a template's death means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Death {
    /// It had been ready: start another.
    Restart,
    /// It died before it was ready: try once more.
    Retry,
    /// It failed for good: workers of its configuration are started by exec.
    Exec,
}

impl Templates {
    /// No template ever: workers are started by exec.
    pub fn disable(&mut self) {
        self.off_gen = Some(u64::MAX);
    }

    /// Whether no template is ever started (workers are started by exec).
    pub fn never(&self) -> bool {
        self.off_gen == Some(u64::MAX)
    }

    /// Whether a template may be started for configuration `gen` (none when every worker
    /// is planned on a GPU: those are exec'd).
    pub fn wanted(&self, gen: u64, all_on_gpus: bool) -> bool {
        self.off_gen != Some(gen) && !all_on_gpus
    }

    /// A template of configuration `gen`, ready or not, died with `code`.
    pub fn died(&mut self, ready: bool, gen: u64, code: Option<i32>) -> Death {
        if ready {
            return Death::Restart;
        }
        self.failures += 1;
        if code == Some(worker_exit::TEMPLATE_UNFIT) || self.failures >= TEMPLATE_TRIES {
            self.off_gen = Some(gen);
            Death::Exec
        } else {
            Death::Retry
        }
    }

    /// Whether the template of configuration `gen` is in place, or none is to be: then
    /// nothing is to start. A template of an older configuration is retired (and failures
    /// are counted anew); one of `gen` that has not loaded within `boot_timeout` is given up
    /// (exec takes over).
    pub fn in_place(&mut self, gen: u64, boot_timeout: Duration) -> bool {
        if self.never() {
            return true;
        }
        if let Some(t) = &self.current {
            if t.cfg_gen == gen {
                if !t.ready && t.started.elapsed() > boot_timeout {
                    tracing::warn!(
                        "the template process did not load the model within --boot-timeout"
                    );
                    self.retire();
                    self.off_gen = Some(gen);
                }
                return true;
            }
            self.retire();
            self.failures = 0;
        }
        false
    }

    /// Whether `pid` was a template stopped on purpose (forgotten now that it is reaped).
    pub fn reaped_old(&mut self, pid: u32) -> bool {
        match self.old.iter().position(|p| *p == pid) {
            Some(i) => {
                self.old.swap_remove(i);
                true
            }
            None => false,
        }
    }

    /// The current template, when `pid` is its.
    pub fn take_if(&mut self, pid: u32) -> Option<Template> {
        self.current.take_if(|t| t.pid == pid)
    }

    /// Stops the current template (killed; reaped later).
    pub fn retire(&mut self) {
        if let Some(t) = self.current.take() {
            let _ = kill(Pid::from_raw(t.pid as i32), Signal::SIGKILL);
            self.old.push(t.pid);
        }
    }

    /// Kills every template and reaps the ones stopped before.
    pub fn kill_all(&mut self) {
        self.retire();
        for pid in std::mem::take(&mut self.old) {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
            let _ = waitpid(Pid::from_raw(pid as i32), None);
        }
    }

    /// The descriptor to poll while the current template loads.
    pub fn loading_fd(&self) -> Option<BorrowedFd<'_>> {
        self.current.as_ref().filter(|t| !t.ready).map(Template::fd)
    }

    /// The current template's boot times and host memory, the moment it says it is
    /// ready, with its pid and how long it took.
    pub fn poll_ready(&mut self) -> Option<(u32, Duration, BootTimes, Option<ReadyMemory>)> {
        let t = self.current.as_mut()?;
        let (boot, memory) = t.poll_ready()?;
        Some((t.pid, t.started.elapsed(), boot, memory))
    }

    /// Whether the template of configuration `gen` is still loading.
    pub fn loading(&self, gen: u64) -> bool {
        self.current
            .as_ref()
            .is_some_and(|t| !t.ready && t.cfg_gen == gen)
    }
}

impl Supervisor {
    /// The template `t` exited.
    pub(super) fn template_exited(&mut self, t: Template, code: Option<i32>, sig: Option<Signal>) {
        if self.stopping.is_some() {
            return;
        }
        let status = code.map_or_else(|| format!("signal {sig:?}"), |c| format!("exit status {c}"));
        match self.templates.died(t.ready, t.cfg_gen, code) {
            Death::Restart => tracing::warn!(
                event = "template_failed",
                pid = t.pid,
                status,
                "the template process (pid {}) died ({status}); restarting it",
                t.pid
            ),
            Death::Exec => tracing::warn!(
                event = "template_failed",
                pid = t.pid,
                status,
                "the template process failed ({status}); workers are started by exec (about 0.3 s each) for this configuration"
            ),
            Death::Retry => tracing::warn!(
                event = "template_failed",
                pid = t.pid,
                status,
                "the template process failed before it was ready ({status}); retrying"
            ),
        }
    }

    /// Starts the template for the current configuration when there should be one.
    pub(super) fn ensure_template(&mut self) {
        let gen = self.reload.gen;
        if self.stopping.is_some() {
            return;
        }
        if self.templates.in_place(gen, self.cfg.limits.boot_timeout) {
            if self.templates.never() {
                self.no_template_measures();
            }
            return;
        }
        let all_on_gpus = self.plan.placement.iter().all(|p| p.gpu.is_some());
        if !self.templates.wanted(gen, all_on_gpus) {
            self.no_template_measures();
            return;
        }
        let Some(listener) = &self.listener else {
            return;
        };
        let config = worker_config(&self.cfg, &self.plan, 0, 0, 0);
        let board = self.board.as_ref().and_then(Board::fd);
        match Template::start(&self.cfg.workers.binary, &config, listener, board, gen) {
            Ok(t) => self.templates.current = Some(t),
            Err(e) => {
                tracing::warn!(
                    "cannot start the template process: {e}; workers are started by exec"
                );
                self.templates.off_gen = Some(gen);
            }
        }
    }

    /// Whether spawns should wait: the template for this configuration is still loading.
    pub(super) fn template_loading(&self, slot: u32) -> bool {
        let on_cpu = self
            .plan
            .placement
            .iter()
            .any(|p| p.slot == slot && p.gpu.is_none());
        on_cpu && self.templates.loading(self.reload.gen)
    }

    /// Starts a worker: forked from the template when it is ready, else by exec. Says which.
    pub(super) fn launch(
        &mut self,
        mut config: WorkerConfig,
    ) -> std::io::Result<(Launched, &'static str)> {
        // The key and TLS material this configuration accepted, never the files as they are
        // now (`crate::secrets`).
        let secrets = self.cfg.access.secrets.fd();
        config.secrets = secrets.is_some();
        for (flag, file, loads) in self.cfg.access.secrets.changed_key_files() {
            match loads {
                Ok(()) => tracing::warn!(
                    event = "key_file_changed",
                    flag,
                    file = %file.display(),
                    loads = true,
                    "{flag} {} changed on disk; workers keep the keys read before until a HUP reads it",
                    file.display()
                ),
                Err(e) => tracing::error!(
                    event = "key_file_changed",
                    flag,
                    file = %file.display(),
                    loads = false,
                    "{flag} changed on disk and does not load ({e}); workers keep the keys read before, and a HUP now would be refused"
                ),
            }
        }
        // GPU workers are exec'd: they load the model onto their GPU anyway, and their
        // environment (CUDA_VISIBLE_DEVICES) stays visible in /proc/<pid>/environ.
        let gen = self.reload.gen;
        let template = self
            .templates
            .current
            .as_mut()
            .filter(|t| t.ready && t.cfg_gen == gen && config.gpu.is_none());
        if let Some(t) = template {
            match t.spawn(&config, secrets) {
                Ok(l) => return Ok((l, "fork")),
                Err(e) => {
                    tracing::warn!(
                        "the template could not fork a worker ({e}); restarting it, exec meanwhile"
                    );
                    self.templates.retire();
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
            secrets,
        };
        launch(&self.cfg.workers.binary, &spec, listener).map(|l| (l, "exec"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_template_that_fails_twice_before_ready_gives_way_to_exec_for_its_configuration() {
        let mut t = Templates::default();
        assert!(t.wanted(0, false));
        assert!(
            !t.wanted(0, true),
            "every worker on a GPU: exec'd, no template"
        );
        assert_eq!(t.died(false, 0, Some(1)), Death::Retry);
        assert!(t.wanted(0, false));
        assert_eq!(t.died(false, 0, Some(1)), Death::Exec);
        assert!(!t.wanted(0, false));
        // The next configuration tries again.
        assert!(t.wanted(1, false));
    }

    #[test]
    fn a_ready_template_that_dies_is_restarted_and_an_unfit_one_is_not_retried() {
        let mut t = Templates::default();
        assert_eq!(t.died(true, 0, None), Death::Restart);
        assert!(t.wanted(0, false));
        assert_eq!(
            t.died(false, 0, Some(worker_exit::TEMPLATE_UNFIT)),
            Death::Exec
        );
        assert!(!t.wanted(0, false));
        t.disable();
        assert!(
            t.in_place(5, Duration::ZERO),
            "disabled: nothing ever to start"
        );
    }

    #[test]
    fn only_templates_stopped_on_purpose_are_forgotten_when_reaped() {
        let mut t = Templates {
            old: vec![7, 9],
            ..Templates::default()
        };
        assert!(t.reaped_old(9));
        assert!(!t.reaped_old(9));
        assert!(!t.reaped_old(8));
        assert_eq!(t.old, vec![7]);
        assert!(t.take_if(7).is_none());
    }
}
