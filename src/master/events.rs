//! What the master reports about its workers, as log events with a stable name (`event`) and
//! typed fields, so that operators (`--log-format json`) and the process tests read the
//! master's state instead of guessing it from message wording.
//!
//! | event | level | fields | when |
//! |---|---|---|---|
//! | `listening` | info | `addr`, `socket` (`bound`, `systemd`), `workers` | the socket is bound or was handed over (development mode: `workers` = 1) |
//! | `socket_activation` | info | `fd`, `name` | systemd handed over the listening socket (`LISTEN_FDS`) |
//! | `address_unused` | warn | `host`, `port` | `--host`/`--port` were given but systemd's socket is used |
//! | `metrics_listening` | info | `addr` | `--metrics-port` is bound (`/metrics` is served there) |
//! | `systemd_notify`, `systemd_notify_failed` | info, warn | `watchdog_ms`, `error` | `NOTIFY_SOCKET` is set; a message could not be sent (once) |
//! | `template_ready` | info | `pid`, `ms`, `warmup_ms` | the template process has loaded the model (and run its warm-up pass: 0 when the metadata declares no input shape) |
//! | `template_failed` | warn | `pid`, `status` | the template died |
//! | `worker_started` | debug | `slot`, `pid`, `generation`, `method` (`fork`, `exec`) | a worker process exists |
//! | `worker_ready` | info | `slot`, `pid`, `generation`, `device` (`cuda:0`, `cpu`, `cpu (simulated GPU)`), `ms`, `model_ms`, `warmup_ms` | it accepts connections |
//! | `no_cuda` | error | | a worker placed on a GPU came up without CUDA (or could not cap its allocator): the master exits 5 |
//! | `footprint_from_free_memory` | warn | `pid`, `gpu`, `mb` | NVML does not list the profiling worker's pid (container PID namespace): its footprint is the fall of the GPU's free memory |
//! | `worker_retiring` | debug | `slot`, `pid`, `reason`, `served`, `in_flight` | it stopped accepting |
//! | `worker_exited` | info, warn, error | `slot`, `pid`, `generation`, `phase`, `code` or `signal`, `served`, `reason`, `killed` | the master reaped it |
//! | `worker_killed` | warn | `pid`, `why` (`boot_timeout`, `heartbeat`, `graceful_timeout`, `stop_timeout`) | the master sent SIGKILL |
//! | `worker_waits` | warn | `slot`, `why` (`unplaced`, `gpu_room`, `gpu_memory`), `gpu` | a slot cannot start its worker yet (each reason once per 10 s) |
//! | `worker_placed` | warn | `slot`, `gpu`, `free_mb` | a slot beyond the plan got a GPU that now has room |
//! | `plan_warning` | warn | | the plan has something to say (no GPU seen, an override beyond what fits…) |
//! | `pool` | debug | `workers` (wanted), `ready`, `booting`, `retiring`, `in_flight` | any of these changed |
//! | `reload_started`, `reload_complete`, `reload_refused`, `reload_failed` | info, error | `error` (refused); `outcome` (`reloaded` or `rolled_back`), `metadata`, `model` (complete) | HUP |
//! | `ttin`, `ttou` / `ttin_refused`, `ttou_refused` | info / warn | `workers` | TTIN, TTOU |
//! | `stopping` | info | `how` (`graceful`, `quick`) | TERM, INT, QUIT |
//! | `signal_ignored` | warn | | USR1 or USR2 (gunicorn's log reopen and binary upgrade): nothing to do |
//!
//! `in_flight` in `pool` is the sum of what the workers' last heartbeats (and retiring
//! messages) said; it changes at heartbeat pace, not per request.

use super::slot::{Phase, WorkerState};

/// The pool as the master sees it; reported (`pool`) whenever it changes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pool {
    pub target: u32,
    pub ready: u32,
    pub booting: u32,
    pub retiring: u32,
    pub in_flight: u32,
}

impl Pool {
    pub fn of<'a>(target: u32, workers: impl IntoIterator<Item = &'a WorkerState>) -> Pool {
        let mut p = Pool {
            target,
            ..Pool::default()
        };
        for w in workers {
            match w.phase {
                Phase::Booting => p.booting += 1,
                Phase::Ready => p.ready += 1,
                Phase::Retiring => p.retiring += 1,
            }
            p.in_flight += w.in_flight;
        }
        p
    }

    pub fn report(&self) {
        tracing::debug!(
            event = "pool",
            workers = self.target,
            ready = self.ready,
            booting = self.booting,
            retiring = self.retiring,
            in_flight = self.in_flight,
            "{}/{} workers ready ({} booting, {} retiring, {} requests in flight)",
            self.ready,
            self.target,
            self.booting,
            self.retiring,
            self.in_flight
        );
    }
}

/// The name of a phase in events.
pub fn phase_name(p: Phase) -> &'static str {
    match p {
        Phase::Booting => "booting",
        Phase::Ready => "ready",
        Phase::Retiring => "retiring",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn pool_counts_phases_and_in_flight() {
        let now = Instant::now();
        let mut a = WorkerState::new(1, 0, 0, 0, None, now);
        let mut b = WorkerState::new(2, 1, 0, 0, None, now);
        let c = WorkerState::new(3, 2, 0, 0, None, now);
        a.phase = Phase::Ready;
        a.in_flight = 2;
        b.phase = Phase::Retiring;
        b.in_flight = 1;
        assert_eq!(
            Pool::of(3, [&a, &b, &c]),
            Pool {
                target: 3,
                ready: 1,
                booting: 1,
                retiring: 1,
                in_flight: 3
            }
        );
    }
}
