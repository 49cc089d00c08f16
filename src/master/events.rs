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
//! | `plan_warning` | warn | | the plan has something to say (no GPU seen, an override beyond what fits…) |
//! | `mps_detected` | info | `pipe_directory` | `--mps auto` found the MPS control daemon: workers are MPS clients (planned as on a shared GPU, limited per client, retired together after a fatal CUDA error) |
//! | `mps_fault` | error | `gpu`, `pid`, `workers` | under MPS a worker ended with a fatal CUDA error (serving or booting), which MPS delivers to every client of that GPU: its other workers are asked to retire, and no new one starts on any GPU of that MPS daemon until they are gone |
//! | `mps_not_detected` | info | `pipe_directory` | `--mps auto` found no MPS control daemon, and something is at its path (a socket of another kind, one nobody listens on, one this user may not reach): the reason, and the workers are plain CUDA processes (nothing there at all: the same event at debug) |
//! | `mps_daemon_lost` | error | `pipe_directory` | the MPS control daemon found at start is gone (looked for every 2 minutes, and at once when a worker on an MPS GPU fails): no worker starts on an exclusive-process GPU until it is back |
//! | `mps_daemon_back` | info | `pipe_directory` | the MPS control daemon is there again: workers start again |
//! | `memory_profiling` | info | `pid`, `gpu`, `mps_limit_mb` | `--profile-memory`: one worker is started to measure its GPU footprint (the profiling worker has no slot; under MPS its per-client limit is the GPU's whole usable memory) |
//! | `memory_profiled` | info | `source` (`profiled`, `remembered`), `gpu`, `measured_mb`, `planned_mb`, `declared_typ_mb`, `declared_min_mb`, `workers`, `estimate_workers` | the plan is made from a measured (or `--footprint-file`) footprint |
//! | `memory_profile_failed` | warn | `measured_mb`, `planned_mb`, `declared_typ_mb` (when it measured) | the measurement failed, or fits no GPU: the plan uses `est_gpu_mem_typ` as declared |
//! | `memory_profile_skipped` | warn | | `--profile-memory on`, but no worker is planned on a GPU |
//! | `footprint_from_free_memory` | warn | `pid`, `gpu`, `mb` | NVML does not list the profiling worker's pid (container PID namespace): its footprint is the fall of the GPU's free memory |
//! | `footprint_file_error` | warn | | `--footprint-file` could not be read or written (once) |
//! | `footprint_file_detached` | info | | a reload changed the model: `--footprint-file` is no longer updated |
//! | `template_ready` | info | `pid`, `ms`, `warmup_ms` | the template process has loaded the model (and run its warm-up pass: 0 when the metadata declares no input shape) |
//! | `host_memory_planned` | info | `room_mb`, `per_worker_mb`, `bound`, `workers`, `bounded` (the bound lowered the count), `source` (the cgroup's limit file, or `MemAvailable`; with the measured worker's memory when one was) | the first template was ready: the host-memory bound from its warm-up's peak; or, when nothing was measured at start, from the first worker's own figures (`master::plan::host`, `master::supervisor::host`) |
//! | `host_memory_unmeasured` | info | | no warm-up pass was measured at start (none declared, or no template): one worker serves until its own figures are in (unless the worker count is an override), or, with no host-memory figure at all, the bound is not applied |
//! | `ledger_others` | info | `gpu`, `reserved_mb`, `servers` | other servers of the host reserved memory on this GPU in the GPU-memory ledger: the plan counts it as used (`master::host::reservation`) |
//! | `ledger_reserved` | info | `reserved_mb`, `dir` | this server's reservation in the ledger was written (at start, and when its workers on GPUs change) |
//! | `ledger_unavailable` | warn | | the ledger's directory is missing and cannot be made (nobody can be reserving there): this server plans alone. A ledger that is there but cannot be used is exit 2 |
//! | `ledger_world_writable` | warn | | the ledger's directory is writable by every user (a sticky directory of root's or this user's): any local user can delay starts and claim memory in it (`master::host::ledger`) |
//! | `ledger_wait` | warn | `holder` (its pid, 0 when unseen) | a start found the ledger's lock busy: it waits up to 10 s, then exits 2 naming the holder |
//! | `ledger_busy` | warn | `holder` | a re-admission after `--idle-release` could not take the lock within 100 ms: no worker re-admitted this time (answered 503) |
//! | `ledger_shrunk` | warn | `workers`, `planned` | other servers reserved memory while this one profiled: fewer workers than planned fit now |
//! | `ledger_entry_dropped` | warn | `file` | a file of the ledger counts for nothing: not an entry, expiring beyond one lease, or reserving more than the device has (once per file and reason) |
//! | `ledger_unreadable` | warn | | while serving, the ledger could not be read: the last reading stands in for one lease |
//! | `ledger_write_failed` | warn | `lease_left_s` | this server's reservation could not be written (tried again at its next renewal); its lease lapses in `lease_left_s` |
//! | `ledger_grown` | info | `gpu`, `room_mb` | TTIN with the plan's GPUs full: a GPU the other servers' reservations had made smaller has room for one more worker now (a neighbour stopped or shrank) |
//! | `idle_release_off` | warn | | `--idle-release` on a plan with no worker on a GPU: it does nothing (`master::supervisor::idle`) |
//! | `idle_release` | info | `workers`, `idle_s` | no model request for `--idle-release`: every worker is asked to retire (`fewer_workers`) |
//! | `idle_released` | info | `ms` | the released workers have all exited: this server reserves nothing in the ledger |
//! | `lent` | info | `to`, `to_id`, `workers`, `short_mb` | a neighbour that lacks room named this idle server in its want: every worker is asked to retire, and the room goes to it (`supervisor::lend`) |
//! | `room_asked` | info | `short_mb`, `lenders` | this server lacks room for one worker (at start, for a request while it holds none, or for a TTIN): it asks `lenders` idle neighbours through the ledger |
//! | `room_lent` | info | `ms`, `outcome` (`given`, `timeout`) | at start: the neighbours asked gave their room, or did not within 60 s (the plan takes what there is) |
//! | `room_wait` | info, warn | `outcome` (`given`, `deadline`), `waited_s` | a request that waited for room: room found (a worker starts), or its deadline would pass first (answered 503 with `Retry-After`) |
//! | `idle_readmission` | info, warn | `outcome` (`admitted`, `no_room`), `workers` | a connection arrived while released: `workers` reserved again (one starts now, the rest once it is ready); or none fits, and the master answered it 503 with `Retry-After` |
//! | `idle_readmitted` | info | `ms` | the first worker of a re-admission is ready, `ms` after the master saw the request |
//! | `trace_export` | info | `endpoint`, `service_name`, `sampler` | the workers export their spans over OTLP/HTTP (the `OTEL_*` variables; `crate::otel`) |
//! | `trace_export_setting_ignored` | warn | | an `OTEL_*` value the standard makes a warning (an unknown sampler, a bad ratio or timeout): the default is taken |
//! | `host_memory_refused` | error | | not even one worker fits in the memory the server may use: the master exits 2 |
//! | `host_memory_exceeded` | warn | `slot`, `pid`, `own_mb`, `planned_mb`, `capacity` | a worker reported more own host memory than the plan assumed per worker (once): TTIN is refused past `capacity` |
//! | `oom_score_adj` | info, warn | `master`, `workers` | at start: the `oom_score_adj` workers take, above the master's and the template's (warn: the master's is 1000 already, workers cannot be above it) |
//! | `template_failed` | warn | `pid`, `status` | the template died |
//! | `worker_started` | debug | `slot`, `pid`, `generation`, `method` (`fork`, `exec`) | a worker process exists |
//! | `worker_ready` | info | `slot`, `pid`, `generation`, `device` (`cuda:0`, `cpu`, `cpu (simulated GPU)`), `ms`, `model_ms`, `warmup_ms` | it accepts connections |
//! | `no_cuda` | error | | a worker placed on a GPU came up without CUDA: the master exits 5 (a cap that cannot be set is a failed load instead: worker exit 3) |
//! | `worker_retiring` | debug | `slot`, `pid`, `reason`, `served`, `in_flight` | it stopped accepting (the worker's own message: `reason` is why it retires) |
//! | `worker_retire_asked` | info | `slot`, `pid`, `generation`, `why` ([`RetireAsk`](super::slot::RetireAsk): `fewer_workers`, `stopping`, `quick_stop`, `reload_replaced`, `reload_no_room`, `mps_fault`), `signal` (`SIGTERM`: retire gracefully; `SIGQUIT`: exit now) | the master asked a worker to go |
//! | `worker_memory_recycled` | info | `slot`, `pid`, `generation`, `own_mb`, `limit_mb`, `served` | a worker's own host memory passed `--max-worker-memory-mb` after a request: it retires (`worker_retiring`, `host_memory`), no request fails |
//! | `worker_oom_killed` | error | `slot`, `pid`, `generation`, `phase`, `own_mb` (its last report), `served`, `counted_in` (where the kernel's OOM kills were counted) | the kernel's OOM killer took a worker (a SIGKILL the master did not send while the OOM-kill count rose): replaced after its slot's back-off |
//! | `worker_killed` | warn | `slot`, `pid`, `generation`, `why` ([`KillReason`](super::slot::KillReason): `boot_timeout`, `heartbeat`, `graceful_timeout`, `stop_timeout`, `superseded`) | the master sent SIGKILL |
//! | `worker_exited` | info, warn, error | `slot`, `pid`, `generation`, `phase`, `code` or `signal`, `served`, `reason`, `killed` | the master reaped it |
//! | `worker_waits` | warn | `slot`, `why` (`unplaced`, `gpu_room`, `gpu_memory`), `gpu` | a slot cannot start its worker yet (each reason once per 10 s) |
//! | `worker_placed` | warn | `slot`, `gpu`, `free_mb` | a slot beyond the plan got a GPU that now has room |
//! | `pool` | debug | `workers` (wanted), `ready`, `booting`, `retiring`, `in_flight` | any of these changed |
//! | `footprint_observed` | debug | `observed_mb`, `planned_mb` | the highest GPU footprint seen of a serving worker grew |
//! | `footprint_without_context` | warn | `slot`, `pid`, `gpu`, `mb` | NVML lists no memory for a serving worker (container PID namespace): its footprint, context included, is taken from its GPU's free memory (or its allocator's peak plus the plan's context figure) (once) |
//! | `footprint_exceeded` | warn | `observed_mb`, `planned_mb`, `capacity`, `workers`, `adapt`, `slots` (each slot's mark) | a serving worker passed the footprint the plan assumed (once): TTIN is refused from then on |
//! | `workers_adapted` | warn | `workers`, `capacity`, `observed_mb`, `planned_mb` | `--adapt-workers` lowered the worker count by one (the retirement follows: `worker_retire_asked`, `fewer_workers`) |
//! | `reload_started`, `reload_superseded`, `reload_complete`, `reload_refused`, `reload_failed` | info, error | `error` (refused); `outcome` (`reloaded` or `rolled_back`), `metadata`, `model` (complete) | HUP; `reload_superseded`: a HUP during a reload |
//! | `ttin`, `ttou` / `ttin_refused`, `ttou_refused` | info / warn | `workers` | TTIN, TTOU |
//! | `stopping` | info | `how` (`graceful`, `quick`) | TERM, INT, QUIT |
//! | `key_file_changed` | warn, error | `flag`, `file`, `loads` | as it starts a worker, the master saw a key file changed since it was read (at start or the last accepted HUP), once per change: the workers keep the keys read then until a HUP reads the file (`loads` = false: as it is now, it would be refused) |
//! | `tls_reloaded`, `tls_reload_failed` | info, error | `cert`; `error` | `--tls-cert`: the certificate files changed and were read again for new connections (logged by whoever serves TLS: each worker, and the master for `--metrics-port`); or they no longer load, and the previous certificate stays |
//! | `signal_ignored` | warn | | USR1 or USR2 (gunicorn's log reopen and binary upgrade): nothing to do |
//! | `log_lines_dropped` | warn | `dropped`, `access_dropped` | stderr takes lines again after lines were dropped (a reader that stalled): how many log and access-log lines this process (the master, a worker, the template) dropped since its last such line; at most one a second (`src/logging/queue.rs`) |
//!
//! Why a worker went: it retired by itself (`worker_retiring`, its `reason`), the master asked
//! it to (`worker_retire_asked`, `why`) or killed it (`worker_killed`, `why`); its
//! `worker_exited` repeats `reason` and `killed`. The reasons the master acts on are defined
//! in `slot.rs`, beside the worker state they end.
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

    /// The event names in the first column of the table above.
    fn table() -> Vec<String> {
        let mut names = Vec::new();
        for line in include_str!("events.rs").lines() {
            let Some(row) = line.strip_prefix("//! | `") else {
                continue;
            };
            let first = row.split(" |").next().unwrap_or_default();
            names.extend(
                first
                    .split('`')
                    .skip_while(|s| s.is_empty())
                    .step_by(2)
                    .map(str::to_string),
            );
        }
        names
    }

    /// Every event name logged (`event` set to a string literal) in the crate's sources (`src/`), with the file it is in.
    fn logged() -> Vec<(String, String)> {
        fn walk(dir: &std::path::Path, out: &mut Vec<(String, String)>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    walk(&path, out);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let text = std::fs::read_to_string(&path).unwrap();
                    let pattern = concat!("event", " = \"");
                    for (i, _) in text.match_indices(pattern) {
                        let rest = &text[i + pattern.len()..];
                        let name = &rest[..rest.find('"').unwrap()];
                        out.push((name.to_string(), path.display().to_string()));
                    }
                }
            }
        }
        let mut out = Vec::new();
        walk(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            &mut out,
        );
        out
    }

    #[test]
    fn every_event_logged_is_in_the_table_and_every_row_is_logged() {
        let table = table();
        let logged = logged();
        assert!(table.len() >= 40, "{table:?}");
        assert!(logged.len() >= table.len(), "{logged:?}");
        let missing: Vec<_> = logged
            .iter()
            .filter(|(name, _)| !table.contains(name))
            .collect();
        assert!(
            missing.is_empty(),
            "logged but not in the table of src/master/events.rs: {missing:?}"
        );
        let stale: Vec<_> = table
            .iter()
            .filter(|name| !logged.iter().any(|(n, _)| n == *name))
            .collect();
        assert!(
            stale.is_empty(),
            "in the table of src/master/events.rs but never logged: {stale:?}"
        );
    }

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
