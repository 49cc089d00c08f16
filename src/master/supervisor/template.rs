//! The supervisor's side of the template process ([`crate::master::template::Template`]):
//! one per configuration generation while CPU workers are planned, restarted when it dies,
//! given up for exec after it failed [`TEMPLATE_TRIES`] times; and how a worker is
//! launched: forked from a ready template, else by exec.

use nix::sys::signal::Signal;

use super::Supervisor;
use crate::board::Board;
use crate::master::spawn::{launch, worker_config, Launched, WorkerSpec};
use crate::master::template::Template;
use crate::protocol::{worker_exit, WorkerConfig};

/// Templates that die before they are ready, per configuration, before exec takes over.
const TEMPLATE_TRIES: u32 = 2;

impl Supervisor {
    pub(super) fn template_exited(&mut self, code: Option<i32>, sig: Option<Signal>) {
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
    pub(super) fn ensure_template(&mut self) {
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

    pub(super) fn retire_template(&mut self) {
        if let Some(t) = self.template.take() {
            self.signal(t.pid, Signal::SIGKILL);
            self.old_templates.push(t.pid);
        }
    }

    /// Whether spawns should wait: the template for this configuration is still loading.
    pub(super) fn template_loading(&self, slot: u32) -> bool {
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

    /// Starts a worker: forked from the template when it is ready, else by exec. Says which.
    pub(super) fn launch(
        &mut self,
        mut config: WorkerConfig,
    ) -> std::io::Result<(Launched, &'static str)> {
        // The key and TLS material this configuration accepted, never the files as they are
        // now (`crate::secrets`).
        let secrets = self.cfg.secrets.fd();
        config.secrets = secrets.is_some();
        for (flag, file, loads) in self.cfg.secrets.changed_key_files() {
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
        let template = self
            .template
            .as_mut()
            .filter(|t| t.ready && t.cfg_gen == self.cfg_gen && config.gpu.is_none());
        if let Some(t) = template {
            match t.spawn(&config, secrets) {
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
            secrets,
        };
        launch(&self.cfg.worker_binary, &spec, listener).map(|l| (l, "exec"))
    }
}
