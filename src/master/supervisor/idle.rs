//! `--idle-release SECONDS`: a server whose workers on GPUs got no request for that long
//! retires them and gives its reservation in the GPU-memory ledger back; the master stays,
//! holding the listening socket. While released it polls that socket: a connection waiting
//! there (with `TCP_DEFER_ACCEPT`, one whose client has sent its request) re-admits the
//! server through the ledger — as many of its workers as the other servers' live
//! reservations and NVML's free memory leave room for, at least one; all are reserved at
//! once, one starts, and the others once it is ready (so that the request waits for one
//! boot, not for several sharing the CPUs) — and the connection stays in the kernel's
//! accept queue until that first worker takes it. When not even one
//! fits, the master takes the connection itself and answers `503` with `Retry-After`,
//! never starting a worker that would meet a CUDA out-of-memory error — at once, without
//! waiting on the client (`refuse.rs`).
//!
//! "No request" is what the workers report at each heartbeat (1 s): their `served` count
//! did not change, none had a request in flight or queued for its model, and the listen
//! queue was empty. Health checks on the serving port (`/healthz`, `/v2/health/*`) are not
//! model requests: they neither keep the server from releasing nor are counted as such —
//! but one arriving while released is a connection like any other, and re-admits.

use std::os::fd::{AsFd, AsRawFd};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use super::{refuse, Supervisor};
use crate::master::slot::Phase;

/// What the 503 of a re-admission without room asks a client to wait, in seconds: the
/// other servers renew (and shrink) their reservations at this pace.
pub(super) const RETRY_AFTER_S: u64 = crate::master::host::ledger::RENEW_EVERY.as_secs();
/// How often a want for room is written again while a request waits (`lend.rs`).
pub(super) const RENEW: Duration = crate::master::host::ledger::RENEW_EVERY;

/// Where `--idle-release` stands.
#[derive(Debug)]
pub(super) struct Idle {
    /// `--idle-release`; `None`: the server releases only to lend (`lend.rs`).
    after: Option<Duration>,
    /// When a request was last seen (or the server was last busy starting).
    last_request: Instant,
    /// The workers' `served` counts added up, at the last look.
    served: u64,
    /// While released: the workers to start again, and whether the reservation is back.
    released: Option<Released>,
    /// Re-admitted at this moment with this many workers reserved, until its first worker
    /// is ready: one starts first (the request waits for one boot, not for several sharing
    /// the CPUs), the others once it is ready.
    readmitted: Option<(Instant, u32)>,
}

#[derive(Debug, Clone, Copy)]
struct Released {
    workers: u32,
    since: Instant,
    /// All its workers have exited: the reservation holds nothing.
    given_back: bool,
}

impl Idle {
    pub fn new(after: Option<Duration>, now: Instant) -> Idle {
        Idle {
            after,
            last_request: now,
            served: 0,
            released: None,
            readmitted: None,
        }
    }

    /// When a request was last seen (or the server was last busy).
    pub fn last_request(&self) -> Instant {
        self.last_request
    }

    /// The workers' `served` counts added up, at the last look.
    pub fn served(&self) -> u64 {
        self.served
    }

    /// Whether the server has released its workers (then the master polls the socket).
    pub fn released(&self) -> bool {
        self.released.is_some()
    }

    /// Whether the server is busy now, given the workers' figures: a request served since
    /// the last look (`served` changed), one in flight or queued, one in the listen queue.
    fn busy(&mut self, served: u64, working: bool, now: Instant) {
        if served != self.served || working {
            self.last_request = now;
        }
        self.served = served;
    }
}

impl Supervisor {
    /// `--idle-release`, and lending (`lend.rs`: an idle server releases to lend), only
    /// for a plan with workers on GPUs (said once otherwise, for `--idle-release`).
    pub(super) fn idle_from_config(&mut self) {
        let after = self.cfg.gpu.idle_release;
        let lends = self.reservation.is_some() && self.lend.lends();
        if after.is_none() && !lends {
            return;
        }
        if !self.plan.placement.iter().any(|p| p.gpu.is_some()) {
            let Some(after) = after else {
                return;
            };
            tracing::warn!(
                event = "idle_release_off",
                "--idle-release {:?} does nothing here: no worker is planned on a GPU, and only GPU memory is given back",
                after
            );
            return;
        }
        self.idle = Some(Idle::new(after, Instant::now()));
        if let Some(m) = &self.metrics {
            m.idle_state(Some(false));
        }
    }

    /// One turn of `--idle-release`: release after the idle time; while released, keep the
    /// give-up rule quiet, note when the reservation is back, and re-admit on a connection.
    pub(super) fn idle_turn(&mut self, now: Instant) {
        let Some(idle) = self.idle.as_mut() else {
            return;
        };
        if self.stopping.is_some() {
            return;
        }
        if let Some(r) = idle.released {
            // No worker is wanted: none ready is no failure (`decide`'s give-up rule).
            self.boots.seen_ready(now);
            if !r.given_back && self.workers.is_empty() {
                self.idle_given_back();
                self.lent_given();
            }
            if self.connection_waits() {
                self.readmit(now);
            } else {
                // The client went away while it waited for room.
                self.stop_waiting();
            }
            return;
        }
        if let Some((at, workers)) = idle.readmitted {
            if self.workers.iter().any(|w| w.state.phase == Phase::Ready) {
                let secs = now.duration_since(at).as_secs_f64();
                idle.readmitted = None;
                self.target = workers;
                self.lend.reloaded(secs * 1e3);
                tracing::info!(
                    event = "idle_readmitted",
                    ms = secs * 1e3,
                    "re-admitted: a worker is ready {:.0} ms after the request that woke the server",
                    secs * 1e3
                );
                if let Some(m) = &self.metrics {
                    m.readmitted(secs);
                }
            }
        }
        let served = self.workers.iter().map(|w| w.state.served).sum();
        let working = self
            .workers
            .iter()
            .any(|w| w.state.in_flight > 0 || w.state.queued > 0 || w.state.phase != Phase::Ready);
        let fd = self.listener.as_ref().map(|l| l.as_raw_fd());
        let queued = fd
            .and_then(crate::metrics::listen_queue::read)
            .is_some_and(|b| b.waiting > 0);
        // A reload under way, or one worker held while its host memory is measured.
        let pending = self.reload.under_way || self.host.hold(self.target) != self.target;
        idle.busy(served, working || queued || pending, now);
        if idle
            .after
            .is_some_and(|a| now.duration_since(idle.last_request) >= a)
        {
            self.idle_release(now);
            return;
        }
        self.lend_turn(now);
    }

    /// Retires every worker (the target goes to 0; `decide` retires them gracefully).
    pub(super) fn idle_release(&mut self, now: Instant) {
        let Some(idle) = self.idle.as_mut() else {
            return;
        };
        let workers = self.target;
        idle.released = Some(Released {
            workers,
            since: now,
            given_back: false,
        });
        self.target = 0;
        let idle_s = now.duration_since(idle.last_request).as_secs_f64();
        tracing::info!(
            event = "idle_release",
            workers,
            idle_s,
            "no request for {idle_s:.1} s: retiring the {workers} workers and giving the reservation back; the next request starts them again"
        );
        if let Some(m) = &self.metrics {
            m.idle_state(Some(true));
        }
    }

    /// The released workers have all exited: the reservation is back in the ledger.
    fn idle_given_back(&mut self) {
        let Some(r) = self.idle.as_mut().and_then(|i| i.released.as_mut()) else {
            return;
        };
        r.given_back = true;
        let ms = r.since.elapsed().as_secs_f64() * 1e3;
        tracing::info!(
            event = "idle_released",
            ms,
            "released: every worker has exited {ms:.0} ms after the release began; this server reserves nothing in the ledger until the next request"
        );
    }

    /// How many of the plan's slots the ledger is reserved for now: while released, none
    /// (the workers still exiting are counted as live workers, in their own slots, until
    /// they are gone: `Supervisor::live_reserved`); while re-admitted, all those admitted,
    /// the first of which is starting.
    pub(super) fn reserved_workers(&self) -> u32 {
        let Some(idle) = self.idle.as_ref() else {
            return self.target;
        };
        match (idle.released, idle.readmitted) {
            (Some(_), _) => 0,
            (None, Some((_, n))) => n.max(self.target),
            (None, None) => self.target,
        }
    }

    /// Whether the server has released its workers for being idle.
    pub(super) fn idle_released(&self) -> bool {
        self.idle.as_ref().is_some_and(Idle::released)
    }

    /// Whether `--idle-release` sets the target now: released, or re-admitted with its
    /// first worker still starting.
    pub(super) fn idle_owns_target(&self) -> bool {
        self.idle
            .as_ref()
            .is_some_and(|i| i.released.is_some() || i.readmitted.is_some())
    }

    /// TTIN and TTOU while released or re-admitting: ignored (said); the next request
    /// re-admits the workers released, as many as the ledger has room for.
    pub(super) fn idle_ignores_ttin_ttou(&self) {
        tracing::warn!(
            event = "ttin_refused",
            workers = 0,
            "TTIN/TTOU ignored: this server has released its workers for being idle (--idle-release), or is starting them again; send it again once they serve"
        );
    }

    /// Whether a connection waits in the listening socket's accept queue.
    fn connection_waits(&self) -> bool {
        let Some(l) = &self.listener else {
            return false;
        };
        let mut fds = [PollFd::new(l.as_fd(), PollFlags::POLLIN)];
        poll(&mut fds, PollTimeout::ZERO).is_ok_and(|n| n > 0)
    }

    /// A request arrived while released: start as many workers as the ledger has room
    /// for, or answer this connection 503 when it has none.
    fn readmit(&mut self, now: Instant) {
        let Some(r) = self.idle.as_ref().and_then(|i| i.released) else {
            return;
        };
        let reserve = self.cfg.gpu.gpu_reserve_mb;
        let probe = self.gpus.as_ref();
        let free = |g: u32| probe.and_then(|p| p.free_bytes(g).ok()).map(|b| b >> 20);
        let n = match &mut self.reservation {
            Some(res) => res.admit(&self.plan, r.workers, reserve, free),
            None => {
                crate::master::host::reservation::fitting(&self.plan, r.workers, reserve, |g| {
                    free(g.index)
                })
            }
        };
        if n == 0 {
            if self.wait_for_room(now) {
                return;
            }
            let refused = self.refuse_waiting();
            if refused == 0 {
                return;
            }
            tracing::warn!(
                event = "idle_readmission",
                outcome = "no_room",
                workers = 0,
                connections = refused,
                "a request arrived, but the GPUs have no room for one worker now (the other servers' reservations in the ledger, or NVML's free memory): {refused} connections answered 503 with Retry-After: {RETRY_AFTER_S}"
            );
            if let Some(m) = &self.metrics {
                for _ in 0..refused {
                    m.readmission("no_room");
                }
            }
            return;
        }
        self.room_found(now);
        tracing::info!(
            event = "idle_readmission",
            outcome = "admitted",
            workers = n,
            "a request arrived: {n} of the {} workers released reserved again (the ledger has room for {n}); one starts now and the request waits in the listen queue for it, the others start once it is ready",
            r.workers
        );
        if let Some(m) = &self.metrics {
            m.readmission("admitted");
            m.idle_state(Some(false));
        }
        if let Some(idle) = self.idle.as_mut() {
            idle.released = None;
            idle.readmitted = Some((now, n));
            idle.last_request = now;
        }
        self.target = 1;
    }

    /// Answers the connections waiting (as many as one turn takes) 503 with `Retry-After`
    /// (plain HTTP/1.1: with `--tls` they are closed unanswered), never waiting on a client
    /// (`refuse.rs`).
    fn refuse_waiting(&mut self) -> usize {
        let Some(l) = &self.listener else {
            return 0;
        };
        refuse::refuse_waiting(l, self.cfg.access.tls.is_some(), answer_503().as_bytes())
    }
}

/// The 503 of a re-admission without room.
fn answer_503() -> String {
    let body = format!(
        "{{\"error\": \"this server released its GPU memory for being idle (--idle-release) and the GPUs have no room to start a worker again now; retry in {RETRY_AFTER_S} s\", \"type\": \"idle_no_room\"}}"
    );
    format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {}\r\nRetry-After: {RETRY_AFTER_S}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_or_work_in_hand_keeps_the_server_busy() {
        let t0 = Instant::now();
        let mut idle = Idle::new(Some(Duration::from_secs(10)), t0);
        let t1 = t0 + Duration::from_secs(3);
        idle.busy(0, false, t1);
        assert_eq!(idle.last_request, t0, "nothing served, nothing in hand");
        idle.busy(4, false, t1);
        assert_eq!(idle.last_request, t1, "served grew");
        let t2 = t1 + Duration::from_secs(3);
        idle.busy(4, true, t2);
        assert_eq!(idle.last_request, t2, "a request in flight");
        let t3 = t2 + Duration::from_secs(3);
        idle.busy(4, false, t3);
        assert_eq!(idle.last_request, t2);
        idle.busy(1, false, t3);
        assert_eq!(idle.last_request, t3, "a worker replaced: the sum changed");
    }
}
