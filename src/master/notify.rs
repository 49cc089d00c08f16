//! The master's messages to systemd (`Type=notify`, `sd_notify(3)`), sent through the
//! `sd-notify` crate to `NOTIFY_SOCKET`; nothing is sent when that variable is unset.
//!
//! - `READY=1` (with `MAINPID`) once the planned workers are ready, and again when a reload
//!   is done;
//! - `STATUS=…` whenever the ready or planned worker count changes, or the master's phase
//!   (serving, reloading, stopping);
//! - `RELOADING=1` with `MONOTONIC_USEC` on HUP;
//! - `STOPPING=1` on TERM, INT or QUIT;
//! - `WATCHDOG=1` every half `WATCHDOG_USEC` from the supervisor loop itself, so a loop that
//!   hangs stops petting the watchdog; nothing when the variable is unset.
//!
//! Workers never notify: the master removes these variables from their environment.

use std::time::{Duration, Instant};

use sd_notify::NotifyState;

use super::events::Pool;

/// The variables that address the service manager; children do not inherit them.
pub const ENV: [&str; 3] = ["NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Starting,
    Serving,
    Reloading,
    Stopping,
}

pub struct Notifier {
    enabled: bool,
    phase: Phase,
    /// (ready, planned) as last sent in a STATUS line.
    sent: Option<(u32, u32)>,
    watchdog: Option<Duration>,
    last_watchdog: Option<Instant>,
    warned: bool,
}

impl Notifier {
    /// Reads `NOTIFY_SOCKET` and `WATCHDOG_USEC`/`WATCHDOG_PID` (the watchdog is on only
    /// when the PID, if given, is this process).
    pub fn from_env() -> Notifier {
        let enabled = std::env::var_os("NOTIFY_SOCKET").is_some();
        let watchdog = sd_notify::watchdog_enabled().filter(|d| enabled && !d.is_zero());
        if enabled {
            tracing::info!(
                event = "systemd_notify",
                watchdog_ms = watchdog.map(|d| d.as_millis() as u64),
                "systemd notify socket: readiness, status and reloads are reported{}",
                watchdog
                    .map(|d| format!("; watchdog every {:?}", d / 2))
                    .unwrap_or_default()
            );
        }
        Notifier {
            enabled,
            phase: Phase::Starting,
            sent: None,
            watchdog,
            last_watchdog: None,
            warned: false,
        }
    }

    fn send(&mut self, states: &[NotifyState]) {
        if !self.enabled {
            return;
        }
        if let Err(e) = sd_notify::notify(states) {
            if !self.warned {
                self.warned = true;
                tracing::warn!(
                    event = "systemd_notify_failed",
                    error = %e,
                    "cannot notify systemd through NOTIFY_SOCKET: {e}"
                );
            }
        }
    }

    /// The pool as the supervisor sees it now; sends STATUS when the counts changed, and
    /// READY once the planned workers are ready (at start, or after a reload).
    pub fn pool(&mut self, pool: &Pool) {
        if !self.enabled || self.phase == Phase::Stopping {
            return;
        }
        let counts = (pool.ready, pool.target);
        let ready_now = self.phase == Phase::Starting && pool.ready >= pool.target;
        if self.sent == Some(counts) && !ready_now {
            return;
        }
        self.sent = Some(counts);
        let status = self.status_line(pool.ready, pool.target);
        if ready_now {
            self.phase = Phase::Serving;
            let pid = std::process::id();
            self.send(&[
                NotifyState::Ready,
                NotifyState::MainPid(pid),
                NotifyState::Status(&status),
            ]);
        } else {
            self.send(&[NotifyState::Status(&status)]);
        }
    }

    fn status_line(&self, ready: u32, planned: u32) -> String {
        let what = match self.phase {
            Phase::Reloading => ", reloading",
            Phase::Stopping => ", stopping",
            _ => "",
        };
        format!("{ready}/{planned} workers ready{what}")
    }

    /// HUP: a reload starts (or supersedes the one under way).
    pub fn reloading(&mut self, pool: &Pool) {
        if !self.enabled || self.phase == Phase::Stopping {
            return;
        }
        self.phase = Phase::Reloading;
        let status = self.status_line(pool.ready, pool.target);
        match NotifyState::monotonic_usec_now() {
            Ok(now) => self.send(&[NotifyState::Reloading, now, NotifyState::Status(&status)]),
            Err(_) => self.send(&[NotifyState::Reloading, NotifyState::Status(&status)]),
        }
    }

    /// Every worker runs the new configuration: READY goes out with the next [`pool`]
    /// report once the planned workers are ready (as at start; a reload during the start
    /// sends the first READY this way).
    ///
    /// [`pool`]: Notifier::pool
    pub fn reload_done(&mut self) {
        if self.enabled && self.phase == Phase::Reloading {
            self.phase = Phase::Starting;
            self.sent = None;
        }
    }

    /// TERM, INT or QUIT.
    pub fn stopping(&mut self, pool: &Pool) {
        if !self.enabled || self.phase == Phase::Stopping {
            return;
        }
        self.phase = Phase::Stopping;
        let status = self.status_line(pool.ready, pool.target);
        self.send(&[NotifyState::Stopping, NotifyState::Status(&status)]);
    }

    /// Called once per supervisor loop: pets the watchdog every half `WATCHDOG_USEC`.
    pub fn tick(&mut self, now: Instant) {
        let Some(period) = self.watchdog else { return };
        if self
            .last_watchdog
            .is_none_or(|t| now.duration_since(t) >= period / 2)
        {
            self.last_watchdog = Some(now);
            self.send(&[NotifyState::Watchdog]);
        }
    }
}
